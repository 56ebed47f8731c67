#!/usr/bin/env bash
# Runs the process group's tests (tests/mpi_dist.c) under mpirun: the collectives for world sizes 1..4
# (more ranks than cores run oversubscribed), then the failures that must stop the job fast with a
# message: a rank killed with SIGKILL, a rank that stalls or is stopped (the message names it), a rank
# that exits, replicas that differ,
# and NCCL asked for where it cannot run.
#
# Usage: tests/run-dist-tests.sh BUILD/tests/mpi_dist      (DIST_WORLDS="1 2 3 4" to choose sizes)
set -u
bin=$1
worlds=${DIST_WORLDS:-1 2 3 4}
limit=30          # seconds a failing job may take to stop (the tests use a 3 s collective timeout)
failed=()
# Under SANITIZE=1 ASan and UBSan stay on, but not the leak check: Open MPI keeps memory until exit in
# plugins it has already unloaded, so no suppression can name them. (The pure parts of the process
# group are leak-checked by tests/test_dist_plan.c.)
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# scripts/launch.sh adds --allow-run-as-root / --oversubscribe when needed (LAUNCH_ARGS: extra options).
launch() { scripts/launch.sh "$@"; }

# Open MPI 4's mpirun stops the job itself when a rank dies; this switch turns that off, to test that
# the survivors' own timeout stops them too (as it must under launchers that do not kill).
no_abort_flag() {
  if [ -z "${SLURM_JOB_ID:-}" ] && mpirun --version 2>/dev/null | grep -q 'Open MPI) 4'; then
    echo "--mca orte_abort_on_non_zero_status 0"
  fi
}

fail() { failed+=("$1"); echo "!! FAIL: $1"; sed 's/^/   | /' "$log" | tail -n 25; }

# must_pass NAME NP ARGS...
must_pass() {
  local name=$1 np=$2; shift 2
  timeout --kill-after=5 120 bash -c "$(declare -f launch); launch $np $*" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && grep -q "^PASS" "$log"; then
    echo "ok   $name: $(grep '^PASS' "$log")"
  else
    fail "$name (exit $rc)"
  fi
}

# must_fail NAME PATTERN NP ARGS...: non-zero exit within $limit s, and PATTERN in the output.
must_fail() {
  local name=$1 pattern=$2 np=$3; shift 3
  local start end rc
  start=$(date +%s.%N)
  timeout --kill-after=5 $((limit + 30)) bash -c "$(declare -f launch); launch $np $*" >"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  if [ $rc -eq 0 ]; then
    fail "$name: exited 0, expected a failure"
  elif awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s > l) }'; then
    fail "$name: took ${secs}s to stop (limit ${limit}s)"
  elif ! grep -Eq -- "$pattern" "$log"; then
    fail "$name: exit $rc in ${secs}s but no message matching /$pattern/"
  elif grep -q "UNEXPECTED" "$log"; then
    fail "$name: a rank went on as if nothing happened"
  else
    echo "ok   $name: exit $rc after ${secs}s: $(grep -Eo -m1 -- "$pattern.{0,60}" "$log")"
  fi
}

# One launch per world size runs the passing cases (mpirun start-up dominates their time).
for np in $worlds; do
  must_pass "collectives, buckets == flat, model hook, hash compare, traffic counts: world $np" "$np" "$bin" all
done
# A rank 1.5 s late (others send their arrival notes) is slow, not stalled: the job completes.
must_pass "3 ranks, one 1.5 s late at every all-reduce (timeout 10 s)" 3 "$bin" slow --timeout 10
# With a GPU: device buffers through MPI (staged via the host; 2 ranks may share a GPU) and NCCL
# (one rank per GPU).
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$gpus" -gt 0 ]; then
  must_pass "GPU buffers, MPI backend, world 2" 2 "$bin" all --device cuda --backend mpi
  must_pass "GPU buffers, NCCL backend, world $gpus" "$gpus" "$bin" all --device cuda --backend nccl
fi

must_fail "rank killed with SIGKILL" "exited on signal 9|timed out after" 2 "$bin" kill --timeout 3
na=$(no_abort_flag)
if [ -n "$na" ]; then
  LAUNCH_ARGS="$na" must_fail "rank killed, survivors time out themselves" \
    "all-reduce #[0-9]+ of [0-9]+ floats timed out after [0-9.]+ s .*rank 1 did not join it" 2 "$bin" kill --timeout 3
fi
# The survivors name the rank that never arrived (kit/dist.c's arrival notes).
must_fail "rank stalls (sleep)" "rank 0: all-reduce #[0-9]+ of [0-9]+ floats timed out after [0-9.]+ s \(limit 3 s\): rank 1 did not join it" \
  2 "$bin" stall --timeout 3
must_fail "3 ranks, one stalls" "all-reduce #[0-9]+ of [0-9]+ floats timed out after [0-9.]+ s \(limit 3 s\): rank 2 did not join it" \
  3 "$bin" stall --timeout 3
must_fail "3 ranks, one stopped (SIGSTOP)" "rank [01]: all-reduce #[0-9]+ of [0-9]+ floats timed out .*: rank 2 did not join it" \
  3 "$bin" sigstop --timeout 3
must_fail "rank exits with status 3" "exited with non-zero status|timed out after" 2 "$bin" exit --timeout 3
must_fail "replicas differ (pg_check_identical)" "test parameters \([0-9]+ floats\) differ across ranks" \
  2 "$bin" check-fail --timeout 3
# One rank more than there are GPUs: NCCL must be refused (without a GPU because the device is the CPU,
# with GPUs because two ranks share one), and the message must name the way out.
np=$((gpus < 1 ? 2 : gpus + 1))
must_fail "--backend nccl, $np ranks on $gpus GPU(s)" "backend nccl refused: .*Use --backend mpi" \
  $np "$bin" collectives --backend nccl --device auto
must_fail "bucket view marked twice" "view 'view3' was marked ready twice" 1 "$bin" mark-twice
must_fail "bucket range ends inside a view" "ends inside view .view4." 1 "$bin" mark-partial
must_fail "reduce-scatter in flight waited for twice" "pg_work_wait takes what pg_reduce_scatter_sum_start returned" \
  2 "$bin" work-twice --timeout 3
# Point-to-point mistakes (lesson 08's pipeline): each names the peer, the tag and the message.
must_fail "p2p: wrong size" "activation of micro-batch 4 \\(tag 4\\) from rank 1: the message holds 8 floats, this rank expects 7" \
  2 "$bin" p2p-size --timeout 3
must_fail "p2p: wrong tag" "receiving activation of micro-batch 4 \\(7 floats, tag 4\\) from rank 1: not done after .*a message with tag 5 from rank 1 is waiting instead" \
  2 "$bin" p2p-tag --timeout 3
must_fail "p2p: nothing sent" "rank 0: receiving activation of micro-batch 4 \\(7 floats, tag 4\\) from rank 1: not done after [0-9.]+ s \\(limit 3 s\\)" \
  2 "$bin" p2p-missing --timeout 3
must_fail "unknown backend" "unknown backend 'gloo'" 2 "$bin" collectives --backend gloo

if [ ${#failed[@]} -ne 0 ]; then
  echo "FAILED: ${#failed[@]} dist test(s):"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "all dist tests passed"
