#!/usr/bin/env bash
# tests/lesson07/run-tests.sh: lesson 07's checks beyond `make grade-solutions` (which runs the autograder on
# GRADE_NP ranks, one test per process):
#   1. the whole autograder of the SOLUTION on other world sizes than GRADE_NP's 3 (LESSON07_WORLDS, default "1 2")
#   2. the real program started both ways: mpirun -np 2, and 2 processes with RANK/WORLD_SIZE/MASTER_* (tcp
#      store) and with --init-method file://: every epoch line (losses, accuracies) must be the same text
#   3. every failure mode ends within its limit with a non-zero status, the reason and a HINT: the master
#      unreachable, the port in use, a wrong interface (KIT_SOCKET_IFNAME), a rank that never starts, a rank
#      killed during training
#
#   tests/lesson07/run-tests.sh BUILD/grade-solutions/test_lesson07 BUILD/solutions/07-scale-out/train
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 07 "$@"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
# Ports: tests here run beside other suites, so no port is picked "free" and bound later. Rank 0 is started
# with MASTER_PORT=0: it serves its store on a port the system gives it and prints which ("store: ... port N"),
# and the other ranks are started with that port (rank0_port, tests/extras-lib.sh). A port nobody may answer
# on, or one that is taken, is held by a helper that binds port 0 itself and reports it (hold_port).
# hold_port listen|bind NAME: a helper process binds port 0 (and listens, or only binds: a connection there is
# refused) for 120 s; prints the port. Its pid is in $work/NAME.pid.
hold_port() {
  python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("", 0))
if sys.argv[1] == "listen": s.listen()
print(s.getsockname()[1], flush=True); time.sleep(120)' "$1" >"$work/$2.port" &
  echo $! >"$work/$2.pid"; pids+=($!)
  local i
  for ((i = 0; i < 100; i++)); do [ -s "$work/$2.port" ] && break; sleep 0.1; done
  cat "$work/$2.port"
}
ARGS=(--dataset synthetic --model tiny --epochs 2 --bucket-mb 0 --seed 5)
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT KIT_SOCKET_IFNAME KIT_NODE_NAME

# ---- 1. the autograder on other world sizes; one rank skips the tests that need a peer (their reason is in the test)
solution_on_worlds "$tests" "${LESSON07_WORLDS:-1 2}" 300 '' 1

# ---- 2. the program, started three ways: the same training
epochs() { grep -E '^epoch [0-9]+:' "$1" | sed 's/ ([0-9.]* s, [0-9]* img\/s)//'; }
# Starts `world` ranks of the program in the background, torchrun-style; extra arguments go to every rank.
# Port 0: rank 0 first, the others once it has said its port (a file store has none: all at once).
store_start() {
  local world=$1 port=$2 tag=$3; shift 3
  local r
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port KIT_RUN_ID="l07-$tag-$$" \
      timeout --kill-after=5 120 "$train" "$@" >"$work/$tag.$r.out" 2>"$work/$tag.$r.err" &
    pids+=($!)
    if [ "$r" = 0 ] && [ "$port" = 0 ] && [[ " $* " != *" --init-method "* ]]; then
      port=$(rank0_port "$work/$tag.0.out" "$!") || { bad "$tag: rank 0 never said its port"; return; }
    fi
  done
}
timeout --kill-after=5 120 scripts/launch.sh 2 "$train" "${ARGS[@]}" >"$work/mpi.out" 2>&1 || bad "mpirun -np 2 failed"
store_start 2 0 tcp "${ARGS[@]}"
store_start 2 0 file "${ARGS[@]}" --init-method "file://$work/job.store"
wait
epochs "$work/mpi.out" >"$work/mpi.epochs"
for how in tcp file; do
  epochs "$work/$how.0.out" >"$work/$how.epochs"
  if [ -s "$work/mpi.epochs" ] && cmp -s "$work/mpi.epochs" "$work/$how.epochs" && grep -q 'backend=socket' "$work/$how.0.out"; then
    ok "the program started from the $how store trains as under mpirun ($(wc -l <"$work/mpi.epochs") epoch lines equal)"
  else
    bad "the program started from the $how store differs from mpirun"
    diff "$work/mpi.epochs" "$work/$how.epochs" | head -n 6 | sed 's/^/   | /'
    cat "$work/$how.0.err" "$work/$how.1.err" | head -n 6 | sed 's/^/   | /'
  fi
done
[ -e "$work/job.store" ] && bad "the file store $work/job.store was left behind"
if grep -q 'rank 1: node 0 .*local rank 1 of 2' "$work/tcp.0.out"; then ok "the mapping names rank 1's node and local rank"
else bad "no mapping line for rank 1 in the store start's output"; fi

# ---- 3. failure modes: each ends within `limit` seconds, non-zero, with the reason and a HINT
# expect NAME LIMIT PATTERN FILE: the exit status in $work/NAME.rc
expect() {
  local name=$1 limit=$2 pattern=$3 file=$4 rc took
  rc=$(cat "$work/$name.rc"); took=$(cat "$work/$name.s")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$took" -le "$limit" ] \
     && grep -Eq "$pattern" "$file" && grep -q 'HINT' "$file"; then
    ok "$name: exit $rc after $took s: $(grep -Em1 "$pattern" "$file" | cut -c1-150)"
  else
    bad "$name: exit $rc after $took s (limit $limit s), expected /$pattern/ and a HINT in:"
    head -n 8 "$file" | sed 's/^/   | /'
  fi
}
# run NAME RANK WORLD PORT [ENV=...] -- ARGS: one rank in the foreground, timed
run_rank() {
  local name=$1 rank=$2 world=$3 port=$4; shift 4
  local start; start=$(date +%s)
  env RANK="$rank" WORLD_SIZE="$world" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" KIT_RUN_ID="l07-$name-$$" "$@" \
    >"$work/$name.out" 2>"$work/$name.err" </dev/null
  echo $? >"$work/$name.rc"; echo $(( $(date +%s) - start )) >"$work/$name.s"
}

# An --init-method the program does not know: refused at once on any start (mpirun's too), never ignored.
for im in foo://x ''; do
  start=$(date +%s)
  timeout 60 "$train" "${ARGS[@]}" --init-method "$im" >"$work/init_method.out" 2>"$work/init_method.err" </dev/null
  echo $? >"$work/init_method.rc"; echo $(( $(date +%s) - start )) >"$work/init_method.s"
  expect init_method 10 "init-method '$im' is not a store this program knows" "$work/init_method.err"
done

# The master unreachable: rank 1 alone; the port is held (bound, not listening) by a helper: connections refused.
port=$(hold_port bind unreachable)
run_rank unreachable 1 2 "$port" timeout 60 "$train" "${ARGS[@]}" --timeout 3
kill "$(cat "$work/unreachable.pid")" 2>/dev/null
expect unreachable 10 'cannot reach the store .*(refused|timeout)' "$work/unreachable.err"

# The port in use: something else listens on MASTER_PORT when rank 0 starts.
port=$(hold_port listen in_use)
run_rank port_in_use 0 2 "$port" timeout 60 "$train" "${ARGS[@]}" --timeout 3
kill "$(cat "$work/in_use.pid")" 2>/dev/null
expect port_in_use 10 "port $port is already in use" "$work/port_in_use.err"

# A rank that never starts: rank 0 of 2 alone.
run_rank missing_rank 0 2 0 timeout 60 "$train" "${ARGS[@]}" --timeout 3
expect missing_rank 10 'rank 1 never joined the store' "$work/missing_rank.err"

# A wrong interface: rank 0 is told to publish the address of an interface this host does not have; rank 1
# joins once rank 0 has said its port.
( port=$(rank0_port "$work/wrong_if.out") || exit 9
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port KIT_RUN_ID="l07-wrong_if-$$" KIT_SOCKET_IFNAME=nosuch0 \
    exec timeout 60 "$train" "${ARGS[@]}" --timeout 3 >"$work/wrong_if1.out" 2>"$work/wrong_if1.err" ) &
other=$!; pids+=("$other")
run_rank wrong_if 0 2 0 env KIT_SOCKET_IFNAME=nosuch0 timeout 60 "$train" "${ARGS[@]}" --timeout 3
expect wrong_if 10 'KIT_SOCKET_IFNAME=nosuch0: no such interface' "$work/wrong_if.err"
wait $other; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'lost the store' "$work/wrong_if1.err"; then ok "wrong_if: rank 1 stopped too (exit $rc): the store is gone"
else bad "wrong_if: rank 1 exit $rc:"; head -n 4 "$work/wrong_if1.err" | sed 's/^/   | /'; fi

# A rank killed during training: rank 0 stops within the timeout, naming it.
# The limit counts from the kill, not from the start: the time to the first epoch is training, which a loaded
# machine stretches without bound (1.1 s here when quiet, 10-12 s at load 16, the 42 s that once failed a 40 s
# limit counted from the start at load 15-30), while the time after the kill is what the program promises:
# rank 0 ends within its --timeout (5 s: the longest it waits for a peer that neither answers nor closes; a
# killed peer's socket closes at once), measured 0.05 s quiet and 0.9-1.3 s at load 16 with the test at the
# same priority as the load. 20 s = that 5 s + 15 s for a starved scheduler (more than 10x the loaded figure).
# A hang before the kill still fails: rank 0 runs under `timeout 120` (exit 124), and one that ends before its
# first epoch leaves no kill time.
killed_limit=20
# Rank 1 starts once rank 0 has said its port (a subshell that execs the program: its pid is the program's,
# no wrapper that would survive the kill). The killer waits for rank 0's first epoch line (or its end: then
# there is nothing to time) and notes when it kills; run_rank writes killed.rc when rank 0 has ended.
( port=$(rank0_port "$work/killed.out") || exit 9
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port KIT_RUN_ID="l07-killed-$$" \
    exec "$train" "${ARGS[@]}" --epochs 50 --timeout 5 >"$work/killed1.out" 2>&1 ) &
victim=$!; pids+=("$victim"); disown "$victim"  # its death by kill -9 is expected: no job notice
( until grep -q '^epoch 1:' "$work/killed.out" 2>/dev/null || [ -e "$work/killed.rc" ]; do sleep 0.1; done
  [ -e "$work/killed.rc" ] || date +%s >"$work/killed.at"
  kill -9 $victim ) 2>/dev/null &
run_rank killed 0 2 0 timeout 120 "$train" "${ARGS[@]}" --epochs 50 --timeout 5
ended=$(date +%s)
wait 2>/dev/null
if [ -e "$work/killed.at" ]; then
  echo $(( ended - $(cat "$work/killed.at") )) >"$work/killed.s"
  expect killed $killed_limit 'with rank 1 failed: .*(closed|gone)' "$work/killed.err"
else
  bad "killed: rank 0 ended (exit $(cat "$work/killed.rc")) before its first epoch, so no rank was killed:"
  head -n 8 "$work/killed.err" | sed 's/^/   | /'
fi

# ---- invariant 13: outputs (another run's files, before the first step, a run that never recovers)
tests/lesson07/outputs-tests.sh "$tests" "$train" "${compare:-}" || bad "outputs (tests/lesson07/outputs-tests.sh, above)"
extras_end
