#!/usr/bin/env bash
# tests/scale-out/torchrun-env.sh: scripts/slurm/torchrun-env.sh without a Slurm: the variables srun would set,
# set by hand, and the torchrun-style ones it must derive from them; host lists as Slurm writes them; and the
# errors for a missing or wrong variable. (tests/scale-out/slurm.sh checks the same under a real srun.)
set -u
cd "$(dirname "$0")/../.." || exit 1
env_sh=scripts/slurm/torchrun-env.sh
failed=0
ok() { echo "ok   scale-out torchrun-env: $*"; }
bad() { echo "!! FAIL: scale-out torchrun-env: $*"; failed=1; }

# expect_eq WHAT GOT WANT
expect_eq() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1: got '$2', expected '$3'"; fi; }

# The first host of a node list: prefix + the first number of the first range, its zero padding kept.
for case in "n1=n1" "n[1-2]=n1" "gpu-[007-008,012],cpu3=gpu-007" "a1,b[2-3]=a1" "rack2-n[10,12]=rack2-n10" \
            "node[5]=node5"; do
  list=${case%=*} want=${case##*=}
  expect_eq "first host of $list" "$("$env_sh" --first-host "$list")" "$want"
done

# A task of a 3-node job: 2 tasks on the first two nodes, 1 on the third (SLURM_TASKS_PER_NODE="2(x2),1");
# the node list starts with this machine's own name, which resolves, so MASTER_ADDR is that name.
host=localhost
slurm_env() {  # PROCID LOCALID NODEID
  env -u MASTER_ADDR -u MASTER_PORT SLURM_PROCID="$1" SLURM_LOCALID="$2" SLURM_NODEID="$3" SLURM_NTASKS=5 \
      SLURM_JOB_NODELIST="$host,other[2-3]" SLURM_TASKS_PER_NODE="2(x2),1" SLURM_JOB_ID=123456 "$env_sh" --print
}
expect_eq "rank 3 (node 1, local 1)" "$(slurm_env 3 1 1)" \
  "RANK=3 WORLD_SIZE=5 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 NODE_RANK=1 MASTER_ADDR=$host MASTER_PORT=23456"
expect_eq "rank 4 (node 2, alone there)" "$(slurm_env 4 0 2)" \
  "RANK=4 WORLD_SIZE=5 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 NODE_RANK=2 MASTER_ADDR=$host MASTER_PORT=23456"
# What the user set wins: MASTER_ADDR/MASTER_PORT exported before srun.
got=$(MASTER_ADDR=10.1.2.3 MASTER_PORT=29500 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=1 \
      SLURM_JOB_NODELIST=unresolvable-9 SLURM_JOB_ID=7 "$env_sh" --print)
expect_eq "MASTER_ADDR/MASTER_PORT given by the user are kept" "$got" \
  "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 NODE_RANK=0 MASTER_ADDR=10.1.2.3 MASTER_PORT=29500"
# shellcheck disable=SC2016  # $RANK expands in the program's shell, not here
# The program runs with the variables in its environment (exec, arguments passed on).
got=$(env -u MASTER_ADDR -u MASTER_PORT SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NODEID=0 SLURM_NTASKS=2 \
      SLURM_JOB_NODELIST=$host SLURM_JOB_ID=99 "$env_sh" sh -c 'echo "$RANK/$WORLD_SIZE $1"' sh arg1)
expect_eq "the program gets the variables and its arguments" "$got" "1/2 arg1"

# Errors: exit 2 and a message naming the problem, never a silently wrong rank.
expect_error() {  # WHAT PATTERN ENV...
  local what=$1 pattern=$2 out rc
  shift 2
  out=$(env -u MASTER_ADDR -u MASTER_PORT -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_LOCALID -u SLURM_NODEID \
        -u SLURM_JOB_NODELIST -u SLURM_JOB_ID "$@" "$env_sh" --print 2>&1)
  rc=$?
  if [ $rc -eq 2 ] && grep -q "$pattern" <<< "$out"; then ok "error: $what"; else bad "error: $what: exit $rc, '$out'"; fi
}
base=(SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_NODEID=0 "SLURM_JOB_NODELIST=$host" SLURM_JOB_ID=5)
expect_error "outside srun (no SLURM_PROCID)" "SLURM_PROCID is not set" "${base[@]}"
expect_error "a rank beyond the world" "not below SLURM_NTASKS" SLURM_PROCID=2 "${base[@]}"
expect_error "a rank that is not a number" "is not a number" SLURM_PROCID=x "${base[@]}"
expect_error "a first node nobody can resolve" "has no address" SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 \
  SLURM_NODEID=0 SLURM_JOB_NODELIST="no-such-host-[1-2]" SLURM_JOB_ID=5 SLURM_CONF=/nonexistent
exit $failed
