#!/usr/bin/env bash
# scripts/slurm/torchrun-env.sh: runs PROGRAM with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT) derived from what srun gives each task (SLURM_PROCID,
# SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST, SLURM_JOB_ID): the MPI-free way to start a
# job, as `torchrun` or PyTorch's `init_method="env://"` expect it.
#
#   srun --mpi=none scripts/slurm/torchrun-env.sh PROGRAM [ARGS...]
#   scripts/slurm/torchrun-env.sh --print          only print the derived variables (what the tests check)
#   scripts/slurm/torchrun-env.sh --first-host LIST   print the first host of a Slurm host list
#
# MASTER_ADDR: the first host of the job's node list, as an address (Slurm's NodeAddr when the name does not
# resolve, e.g. the nodes of scripts/slurm/local-cluster.sh). MASTER_PORT: 20000 + the job id modulo 10000, so
# two jobs sharing a node do not take the same port. Variables already set (MASTER_PORT=... srun ...) are kept.
set -euo pipefail

die() { echo "torchrun-env: $*" >&2; exit 2; }

# The first host of a Slurm host list: "n1", "n[1-2]", "gpu-[007-008,012],cpu3" -> n1, n1, gpu-007.
# (scontrol show hostnames does the same, but needs Slurm's configuration; this needs nothing.)
first_host() {
  local list=$1 head prefix inside
  head=${list%%,*}                      # up to the first comma: "gpu-[007-008" or "n1"
  if [[ "$list" == *"["* ]] && [[ "${list%%\[*}" != *","* ]]; then
    prefix=${list%%\[*}                 # the first entry has a bracket: "gpu-"
    inside=${list#*\[}                  # "007-008,012],cpu3"
    inside=${inside%%[-,\]]*}           # "007": the first number, its zero padding kept
    echo "$prefix$inside"
  else
    echo "$head"
  fi
}

# The tasks on node NODEID from SLURM_TASKS_PER_NODE ("2(x3),1": 2 on nodes 0-2, 1 on node 3).
tasks_on_node() {
  local spec=$1 node=$2 part count reps n=0
  IFS=, read -r -a parts <<< "$spec"
  for part in "${parts[@]}"; do
    count=${part%%(*}
    reps=1
    [[ "$part" == *"(x"* ]] && { reps=${part#*(x}; reps=${reps%)}; }
    if [ "$node" -lt $((n + reps)) ]; then echo "$count"; return; fi
    n=$((n + reps))
  done
  die "node $node is beyond SLURM_TASKS_PER_NODE=$spec"
}

if [ "${1:-}" = --first-host ]; then
  first_host "${2:?--first-host LIST}"
  exit 0
fi
for v in SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NODEID SLURM_JOB_NODELIST SLURM_JOB_ID; do
  [ -n "${!v:-}" ] || die "$v is not set: run this under srun, inside a Slurm job (HINT: srun --mpi=none $0 PROGRAM)"
done
for v in SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NODEID SLURM_JOB_ID; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v='${!v}' is not a number"
done
[ "$SLURM_PROCID" -lt "$SLURM_NTASKS" ] || die "SLURM_PROCID=$SLURM_PROCID is not below SLURM_NTASKS=$SLURM_NTASKS"

export RANK=$SLURM_PROCID
export WORLD_SIZE=$SLURM_NTASKS
export LOCAL_RANK=$SLURM_LOCALID
export NODE_RANK=$SLURM_NODEID
# The step's own layout first (srun -n inside a bigger allocation), else the job's.
export LOCAL_WORLD_SIZE
LOCAL_WORLD_SIZE=$(tasks_on_node "${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-$SLURM_NTASKS}}" "$SLURM_NODEID")

if [ -z "${MASTER_ADDR:-}" ]; then
  host=$(first_host "${SLURM_STEP_NODELIST:-$SLURM_JOB_NODELIST}")
  addr=$host
  if ! getent hosts "$host" >/dev/null 2>&1 && command -v scontrol >/dev/null 2>&1; then
    addr=$(scontrol show node "$host" 2>/dev/null | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p' | head -n 1 || true)
  fi
  if [ -z "$addr" ] || { [ "$addr" = "$host" ] && ! getent hosts "$host" >/dev/null 2>&1; }; then
    die "the first node '$host' has no address: neither DNS nor scontrol knows it (HINT: set MASTER_ADDR)"
  fi
  MASTER_ADDR=$addr
fi
export MASTER_ADDR
export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 10000))}
# The kit's node map groups ranks by host name; Slurm's node name is the better key where several slurmd
# "nodes" share one host (make slurm-up), and equal to it everywhere else. An explicit KIT_NODE_NAME wins.
if [ -z "${KIT_NODE_NAME:-}" ] && [ -n "${SLURMD_NODENAME:-}" ]; then
  export KIT_NODE_NAME=$SLURMD_NODENAME
fi

if [ "${1:-}" = --print ]; then
  echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE" \
       "NODE_RANK=$NODE_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
  exit 0
fi
[ $# -ge 1 ] || die "usage: $0 PROGRAM [ARGS...] | --print"
exec "$@"
