#!/usr/bin/env bash
# scripts/netns-cluster.sh: two "hosts" on this one machine, for real: two network namespaces, each with its own
# hostname, loopback, /etc/hosts and one end of a veth pair (a virtual cable), 10.231.N.1 <-> 10.231.N.2.
# MPI between them goes over TCP through that cable only, exactly as between two machines; the traffic never
# leaves the namespaces. Optionally the cable gets a latency and a bandwidth cap (tc), to see what a slow
# network does to training.
#
#   scripts/netns-cluster.sh up NAME [--delay MS] [--rate MBIT]   create NAME-a and NAME-b (hosts NAME-a, NAME-b)
#   scripts/netns-cluster.sh down NAME                             delete them (also after a crash)
#   scripts/netns-cluster.sh exec NAME-a|NAME-b CMD...             run CMD "on that host"
#   scripts/netns-cluster.sh mpirun NAME NP_PER_HOST PROGRAM ARGS  PROGRAM on 2 x NP_PER_HOST ranks, host a's
#                                                                  ranks first (mpirun runs on host a)
#   scripts/netns-cluster.sh addr NAME-a|NAME-b                    print that host's address on the cable
#   scripts/netns-cluster.sh check                                 exit 0 when namespaces can be made here
#
# NAME: letters/digits, at most 8 (interface names are limited to 15 characters). Root only. Latency needs
# the kernel's netem qdisc (sch_netem); when it is missing, --delay is an error and --rate uses tbf.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "netns-cluster: $*" >&2; exit 1; }
usage() { sed -n '8,14s/^# \{0,1\}//p' "$0" >&2; exit 2; }

check() {
  [ "$(id -u)" -eq 0 ] || { echo "not root: network namespaces need root (CAP_SYS_ADMIN + CAP_NET_ADMIN)"; return 1; }
  command -v ip >/dev/null 2>&1 || { echo "no 'ip' command (Debian: iproute2)"; return 1; }
  command -v unshare >/dev/null 2>&1 || { echo "no 'unshare' command (Debian: util-linux)"; return 1; }
  local probe="kitprobe$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then echo "this system refuses 'ip netns add': $err"; return 1; fi
  ip netns del "$probe"
}

# The subnet of a cluster, from its name: two clusters (two test runs) at once do not share addresses.
subnet() { echo "10.231.$(( $(cksum <<< "$1" | cut -d' ' -f1) % 250 + 1 ))"; }

down() {
  local name=$1 h
  for h in a b; do
    ip netns del "$name-$h" 2>/dev/null || true   # deleting a namespace deletes its veth end, and so the pair
    rm -rf "/etc/netns/$name-$h"
  done
}

up() {
  local name=$1 delay="" rate="" net h q
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --delay) delay=${2:?--delay MS}; shift 2 ;;
      --rate) rate=${2:?--rate MBIT}; shift 2 ;;
      *) usage ;;
    esac
  done
  [[ "$name" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "NAME '$name': a lowercase letter then up to 7 letters/digits"
  local why
  why=$(check) || die "$why"
  down "$name"
  net=$(subnet "$name")
  ip netns add "$name-a"
  ip netns add "$name-b"
  ip link add "$name-va" netns "$name-a" type veth peer name "$name-vb" netns "$name-b"
  for h in a b; do
    local i=1; [ $h = b ] && i=2
    ip -n "$name-$h" link set lo up
    ip -n "$name-$h" addr add "$net.$i/24" dev "$name-v$h"
    ip -n "$name-$h" link set "$name-v$h" up
    # `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts: each host knows both names.
    mkdir -p "/etc/netns/$name-$h"
    { echo "127.0.0.1 localhost"; echo "$net.1 $name-a"; echo "$net.2 $name-b"; } > "/etc/netns/$name-$h/hosts"
    echo "$name-$h" > "/etc/netns/$name-$h/hostname"
  done
  if [ -n "$delay$rate" ]; then
    for h in a b; do
      if ip netns exec "$name-$h" tc qdisc add dev "$name-v$h" root netem ${delay:+delay "${delay}ms"} \
           ${rate:+rate "${rate}mbit"} 2>/dev/null; then
        q="netem${delay:+ delay ${delay} ms}${rate:+ rate ${rate} Mbit/s}"
      elif [ -z "$delay" ]; then
        # tbf: a token bucket; burst must hold at least one jiffy's worth of bytes at the rate (and an MTU).
        ip netns exec "$name-$h" tc qdisc add dev "$name-v$h" root tbf rate "${rate}mbit" \
          burst "$(( rate * 1000000 / 8 / 100 > 16000 ? rate * 1000000 / 8 / 100 : 16000 ))" latency 100ms
        q="tbf rate $rate Mbit/s (no netem in this kernel)"
      else
        down "$name"
        die "--delay needs the netem qdisc, which this kernel lacks (sch_netem); --rate alone works (tbf)"
      fi
    done
    echo "netns-cluster: link shaped: $q, each direction"
  fi
  echo "netns-cluster: up: $name-a ($net.1) <-> $name-b ($net.2)"
}

# Runs CMD in host H's network namespace, under its hostname (a UTS namespace of its own): Open MPI names its
# shared-memory files after the hostname, and two "hosts" named alike would share them.
host_exec() {
  local ns=$1
  shift
  [ -e "/run/netns/$ns" ] || die "no such host '$ns' (scripts/netns-cluster.sh up NAME first)"
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
  exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

run_mpirun() {
  local name=$1 per=$2 net
  shift 2
  [[ "$per" =~ ^[1-9][0-9]*$ ]] || die "NP_PER_HOST '$per' is not a positive number"
  net=$(subnet "$name")
  local hostfile
  hostfile=$(mktemp "/tmp/netns-$name.XXXXXX")
  printf '%s slots=%s\n' "$name-a" "$per" "$name-b" "$per" > "$hostfile"
  # The rsh agent starts Open MPI's daemon on host b by entering its namespace (instead of ssh).
  # TCP only on the cable's subnet, for MPI's messages (btl) and its control channel (oob).
  local args=(mpirun -np $((2 * per)) --hostfile "$hostfile" --map-by slot
    --mca plm_rsh_agent "$here/netns-rsh.sh" --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24")
  [ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
  [ $((2 * per)) -gt "$(nproc)" ] && args+=(--oversubscribe)
  local extra=()
  read -r -a extra <<< "${MPIRUN_ARGS:-}"   # more mpirun options, e.g. MPIRUN_ARGS="--bind-to none"
  set +e
  (host_exec "$name-a" "${args[@]}" "${extra[@]}" "$@")
  local rc=$?
  rm -f "$hostfile"
  return $rc
}

case "${1:-}" in
  check) why=$(check) || { echo "netns-cluster: $why"; exit 1; }; echo "netns-cluster: network namespaces work here" ;;
  up) [ $# -ge 2 ] || usage; shift; up "$@" ;;
  down) [ $# -eq 2 ] || usage; down "$2" ;;
  addr) [[ "${2:-}" =~ ^(.*)-([ab])$ ]] || usage
        echo "$(subnet "${BASH_REMATCH[1]}").$([ "${BASH_REMATCH[2]}" = a ] && echo 1 || echo 2)" ;;
  exec) [ $# -ge 3 ] || usage; shift; host_exec "$@" ;;
  mpirun) [ $# -ge 4 ] || usage; shift; run_mpirun "$@" ;;
  *) usage ;;
esac
