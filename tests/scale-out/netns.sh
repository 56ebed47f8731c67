#!/usr/bin/env bash
# tests/scale-out/netns.sh: two hosts for real on one machine (scripts/netns-cluster.sh: two network
# namespaces joined by a veth pair), 2 hosts x 2 ranks with MPI over TCP (mpirun's rsh agent enters the other
# namespace), against the same program on one host x 4 ranks: the same final numbers, and -- for a program with
# checkpoints -- the same final checkpoint bit for bit. Also checks that the gradients really crossed the cable.
# Skipped, saying why, when namespaces cannot be made (not root, a container without CAP_SYS_ADMIN).
#
#   tests/scale-out/netns.sh PROGRAM [CKPT_COMPARE]
#     PROGRAM        a kit training program (lesson 03's, 04's, ...); with --checkpoint and CKPT_COMPARE given,
#                    the checkpoints are compared too
# SCALEOUT_ENV_PROGRAM=path (+ SCALEOUT_ENV_ARGS): also start that program without mpirun, 2 processes per host
# with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR = host a, MASTER_PORT), and compare.
set -u
program=$(realpath "${1:?usage: $0 PROGRAM [CKPT_COMPARE]}")
compare=${2:+$(realpath "$2")}
cd "$(dirname "$0")/../.." || exit 1
ok() { echo "ok   scale-out netns: $*"; }
bad() { echo "!! FAIL: scale-out netns: $*"; failed=1; }
show() { grep -vE '^epoch [0-9]+/[0-9]+ step' "$1" | tail -n "${2:-12}" | sed 's/^/   | /'; }
failed=0
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's own allocations (run-dist-tests.sh)

if ! why=$(scripts/netns-cluster.sh check 2>&1); then
  echo "skip scale-out netns: ${why#netns-cluster: }"
  exit 0
fi
name=kt$(($$ % 1000000))
work=$(mktemp -d)
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  scripts/netns-cluster.sh down "$name"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
scripts/netns-cluster.sh up "$name" >"$work/up.log" 2>&1 || { bad "could not create the namespaces"; cat "$work/up.log"; exit 1; }

args=(--device cpu --dataset synthetic --model tiny-bn --epochs 1 --batch-size 64 --timeout 20)
use_ckpt=0
if [ -n "$compare" ] && "$program" --help 2>&1 | grep -q -- '--checkpoint FILE'; then use_ckpt=1; fi
# final LOG: the numbers of the program's last line, without the timing (which varies from run to run).
final() { sed -n 's/^final: \(.*\)$/\1/p' "$1" | tr ' ' '\n' | grep -E '^(train_loss|test_acc|ranks|epochs)=' | tr '\n' ' '; }
rx_bytes() { ip -n "$name-b" -s -j link show "$name-vb" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'; }

# ---- one host, 4 ranks (inside host a: shared memory between the ranks)
one=(); [ $use_ckpt = 1 ] && one=(--checkpoint "$work/one.ckpt")
timeout --kill-after=5 180 scripts/netns-cluster.sh exec "$name-a" scripts/launch.sh 4 "$program" "${args[@]}" "${one[@]}" \
  >"$work/one.log" 2>&1
rc1=$?
# ---- two hosts x 2 ranks (TCP over the veth pair between them)
two=(); [ $use_ckpt = 1 ] && two=(--checkpoint "$work/two.ckpt")
rx0=$(rx_bytes)
timeout --kill-after=5 180 scripts/netns-cluster.sh mpirun "$name" 2 "$program" "${args[@]}" "${two[@]}" >"$work/two.log" 2>&1
rc2=$?
rx=$(( $(rx_bytes) - rx0 ))

if [ $rc1 -ne 0 ] || ! grep -q '^final: .*ranks=4' "$work/one.log"; then
  bad "one host x 4 ranks failed (exit $rc1)"; show "$work/one.log"
elif [ $rc2 -ne 0 ] || ! grep -q '^final: .*ranks=4' "$work/two.log"; then
  bad "2 hosts x 2 ranks failed (exit $rc2)"; show "$work/two.log"
else
  # The gradient all-reduce must have crossed the cable: each step moves at least half the gradient buffer from
  # host a to host b (whatever the algorithm, b's two ranks need a's contribution to every element: at least
  # the elements b does not reduce itself, half of them in a ring's reduce-scatter of 4 ranks split 2 + 2).
  params=$(sed -n 's/^model .*: [0-9]* layers, \([0-9]*\) parameters.*/\1/p' "$work/two.log")
  steps=$(sed -n 's/^data: .*; \([0-9]*\) steps per epoch.*/\1/p' "$work/two.log")
  need=$(( ${steps:-0} * ${params:-0} * 4 / 2 ))
  if [ "$need" -le 0 ] || [ "$rx" -lt "$need" ]; then
    bad "only $rx bytes reached host b over the cable; the all-reduce of $steps steps x $params parameters needs >= $need"
  else
    ok "2 hosts x 2 ranks over TCP: $rx bytes crossed the veth pair (>= $need: $steps steps x $params float32 / 2)"
  fi
  if [ "$(final "$work/one.log")" = "$(final "$work/two.log")" ]; then
    ok "the same final numbers as one host x 4 ranks: $(final "$work/two.log")"
  else
    bad "final numbers differ: one host '$(final "$work/one.log")', two hosts '$(final "$work/two.log")'"
  fi
  if [ $use_ckpt = 1 ]; then
    if "$compare" "$work/one.ckpt" "$work/two.ckpt" >"$work/cmp" 2>&1 && grep -q identical "$work/cmp"; then
      ok "the final checkpoint equals one host's bit for bit"
    else
      bad "the final checkpoints differ: $(cat "$work/cmp")"
    fi
  fi
fi

# ---- (optional) the torchrun-style start: 2 processes per host, rank 0's store on host a
if [ -n "${SCALEOUT_ENV_PROGRAM:-}" ]; then
  envp=$(realpath "$SCALEOUT_ENV_PROGRAM")
  read -r -a eargs <<< "${SCALEOUT_ENV_ARGS:-}"
  master=$(scripts/netns-cluster.sh addr "$name-a")
  pids=()
  for r in 0 1 2 3; do
    host=$name-a; [ $r -ge 2 ] && host=$name-b
    RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 MASTER_ADDR=$master MASTER_PORT=29511 \
      timeout --kill-after=5 180 scripts/netns-cluster.sh exec "$host" "$envp" "${args[@]}" "${eargs[@]}" \
      >"$work/env$r.log" 2>&1 &
    pids+=($!)
  done
  rcs=""
  for p in "${pids[@]}"; do wait "$p"; rcs+="$? "; done
  if [ "$rcs" = "0 0 0 0 " ] && [ "$(final "$work/env0.log")" = "$(final "$work/one.log")" ]; then
    ok "torchrun-style start across the hosts (no mpirun): the same final numbers"
  else
    bad "torchrun-style start: exit statuses $rcs, final '$(final "$work/env0.log")' vs '$(final "$work/one.log")'"
    show "$work/env0.log"
  fi
fi
exit $failed
