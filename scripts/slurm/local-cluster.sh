#!/usr/bin/env bash
# scripts/slurm/local-cluster.sh: a real Slurm (Debian's slurmctld + slurmd) on this one machine, for trying and
# testing the kit's batch scripts: one controller and NODES slurmd daemons, each pretending to be a node.
#
#   scripts/slurm/local-cluster.sh start DIR [NODES]   start (default 2 nodes); prints the SLURM_CONF to export
#   scripts/slurm/local-cluster.sh stop DIR            stop the daemons started from DIR
#
# Every node is the same host: slurmd -N NAME, a port of its own (NodeName=... Port=...), spool, pid and log
# files under DIR. Authentication: auth/none + cred/none (Slurm 22.05 still ships them): nothing to secure on a
# cluster that only root on this host can reach, and no munge daemon or key to set up. A real cluster uses
# munge; nothing in the batch scripts depends on which. Needs root (slurmd starts jobs as their user).
# Exit 1 with a reason when Slurm is not installed or a daemon does not come up (the tests skip on that).
set -euo pipefail

usage="usage: $0 start DIR [NODES] | stop DIR"
cmd=${1:-}; dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then echo "$usage" >&2; exit 2; fi

stop_cluster() {
  local f pid
  for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  done
  # slurmd keeps no pid file of its steps: wait for the daemons to go, so the ports are free for the next start.
  for _ in $(seq 50); do
    local alive=0
    for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
      [ -f "$f" ] || continue
      pid=$(cat "$f" 2>/dev/null || true)
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  rm -f "$dir"/slurmd-*.pid "$dir"/slurmctld.pid
}

if [ "$cmd" = stop ]; then
  stop_cluster
  exit 0
fi
[ "$cmd" = start ] || { echo "$usage" >&2; exit 2; }
nodes=${3:-2}
[[ "$nodes" =~ ^[1-8]$ ]] || { echo "local-cluster: NODES must be 1..8" >&2; exit 2; }

for d in slurmctld slurmd srun sbatch scontrol; do
  command -v "$d" >/dev/null 2>&1 || {
    echo "local-cluster: $d not found. HINT: scripts/install-deps.sh --slurm (Debian: slurmctld slurmd slurm-client)" >&2
    exit 1
  }
done
[ "$(id -u)" -eq 0 ] || { echo "local-cluster: needs root (slurmd runs jobs as their user)" >&2; exit 1; }

mkdir -p "$dir/spool" "$dir/state" "$dir/log"
dir=$(cd "$dir" && pwd)
stop_cluster   # a previous run from the same DIR

# Ports: the controller's and one per node, from a range chosen by the folder so two clusters (two test runs
# at once) rarely meet; a taken port is skipped. A port found free can still be taken before its daemon binds
# it (Slurm's daemons cannot bind port 0 and say which they got), so a start that finds a port in use is
# retried on the next ports (start_cluster below).
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
choose_ports() {  # FIRST: fills ports[] with nodes + 1 free ports from FIRST on
  local p=$1
  ports=()
  while [ ${#ports[@]} -lt $((nodes + 1)) ]; do
    port_free "$p" && ports+=("$p")
    p=$((p + 1))
  done
}
base=$((20000 + ($(cksum <<< "$dir" | cut -d' ' -f1) % 2000) * 10))

# Every "node" is the same host with the same hostname, so Open MPI's shared-memory files of two nodes' local
# rank 0 would get the same name (vader_segment.HOST.JOB.LOCALRANK) and trample each other (a segfault). A
# TaskProlog (its "export" lines go into each task's environment) gives each node a folder of its own. A real
# cluster has distinct hostnames and needs none of this.
cat > "$dir/task-prolog.sh" <<PROLOG
#!/bin/sh
d=$dir/tmp/\$SLURMD_NODENAME/ompi
mkdir -p "\$d"
echo "export OMPI_MCA_btl_vader_backing_directory=\$d"
PROLOG
chmod +x "$dir/task-prolog.sh"

cpus=$(nproc)
conf="$dir/slurm.conf"
write_conf() {
{
  echo "# written by scripts/slurm/local-cluster.sh: $nodes node(s) on $(hostname), all on 127.0.0.1"
  echo "ClusterName=kitlocal"
  echo "SlurmctldHost=localhost"
  echo "SlurmctldPort=${ports[0]}"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/none"
  echo "CredType=cred/none"
  echo "MpiDefault=none"
  echo "TaskProlog=$dir/task-prolog.sh"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "ReturnToService=2"
  echo "JobRequeue=1"
  # How long between SIGTERM and SIGKILL when a job is cancelled or reaches its time limit.
  echo "KillWait=30"
  echo "StateSaveLocation=$dir/state"
  echo "SlurmdSpoolDir=$dir/spool/%n"
  # Per node: PMIx puts its per-step folders under TmpFS, and two slurmd on one host would collide in /tmp.
  echo "TmpFS=$dir/tmp/%n"
  echo "SlurmctldPidFile=$dir/slurmctld.pid"
  echo "SlurmdPidFile=$dir/slurmd-%n.pid"
  echo "SlurmctldLogFile=$dir/log/slurmctld.log"
  echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
  echo "SlurmctldTimeout=30"
  echo "SlurmdTimeout=30"
  echo "InactiveLimit=0"
  echo "MinJobAge=300"
  for i in $(seq "$nodes"); do
    # CPUs: each "node" claims every core of the host: oversubscribed by design, like the MPI runs here.
    echo "NodeName=n$i NodeHostname=n$i NodeAddr=127.0.0.1 Port=${ports[$i]} CPUs=$cpus RealMemory=1000 State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} > "$conf"
}

export SLURM_CONF=$conf
fail() {
  echo "local-cluster: $1" >&2
  tail -n 5 "$dir"/log/*.log >&2 2>/dev/null || true
  stop_cluster
  exit 1
}
# 0: up; 1: failed; 2: a daemon found its port taken (by another job since choose_ports looked).
port_taken() { grep -qi "address already in use" "$dir"/log/* 2>/dev/null; }
start_daemons() {
  rm -f "$dir"/log/*
  slurmctld -f "$conf" -i >"$dir/log/slurmctld.out" 2>&1 || { port_taken && return 2; return 1; }
  for i in $(seq "$nodes"); do
    mkdir -p "$dir/spool/n$i" "$dir/tmp/n$i"
    slurmd -f "$conf" -N "n$i" >"$dir/log/slurmd-n$i.out" 2>&1 || { port_taken && return 2; return 1; }
  done
  # Up when every node is idle (slurmd registered with the controller).
  for _ in $(seq 100); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    [ "$idle" -ge "$nodes" ] && return 0
    port_taken && return 2
    sleep 0.2
  done
  port_taken && return 2
  return 1
}
for attempt in 1 2 3 4 5; do
  choose_ports "$base"
  write_conf
  rc=0
  start_daemons || rc=$?
  [ $rc -eq 0 ] && break
  if [ $rc -ne 2 ] || [ "$attempt" -eq 5 ]; then
    fail "the daemons did not start (sinfo: $(sinfo -h -N 2>&1 | tr '\n' ' '))"
  fi
  echo "local-cluster: a port was taken before its daemon bound it (attempt $attempt): retrying on the next ports" >&2
  stop_cluster
  base=$((ports[nodes] + 1))
done
echo "local-cluster: $nodes node(s) up: export SLURM_CONF=$conf"
