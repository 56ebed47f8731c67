#!/usr/bin/env bash
# tests/lesson05/run-tests.sh: lesson 05's checks beyond `make grade-solutions` (which runs the autograder on
# GRADE_NP ranks, one test per process): the whole autograder of the SOLUTION on 1 and 3 ranks (more ranks than
# cores run oversubscribed: scripts/launch.sh), then the program itself on 3 ranks for one epoch.
#
#   tests/lesson05/run-tests.sh BUILD/grade-solutions/test_lesson05 BUILD/solutions/05-syncbn/train
#
# LESSON05_WORLDS="1 3" chooses the world sizes (the default). World 2 and world 4 ran here too (2 + 11 s
# of this script's 26 s at load average 4, 8 + 42 s of 96 s at ~17) and proved nothing the others do not: world 2 is
# grade-solutions' world (the same tests, there one per process); the tests branch only on world == 1 (no peer
# to reduce with) and world > 1, and compare every result (forward, input and parameter gradients, running
# stats) with BN over the global batch, so a missing or doubled all-reduce, a count not summed across ranks or
# a biased variance differs on 3 ranks as on 4. World 3 is also the uneven one (odd, oversubscribed on 2 cores).
set -u
tests=${1:?usage: $0 TEST_BINARY TRAIN_BINARY}
train=${2:?usage: $0 TEST_BINARY TRAIN_BINARY}
cd "$(dirname "$0")/../.."
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's own allocations (see run-dist-tests.sh)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
count=$("$tests" --list | wc -l)  # every test of the binary must pass
for np in ${LESSON05_WORLDS:-1 3}; do
  start=$(date +%s)
  timeout --kill-after=5 180 scripts/launch.sh "$np" "$tests" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "PASSED.*\\b$count test" "$log"; then
    echo "ok   lesson 05 autograder on the solution, world $np ($(( $(date +%s) - start )) s): $(grep -m1 '^DDP + SyncBN on' "$log" | cut -c1-150)"
  else
    echo "!! FAIL: lesson 05 autograder on the solution, world $np (exit $rc)"
    grep -E 'FAILED|ERROR|error|differ|off by' "$log" | sort -u | head -n 20 | sed 's/^/   | /'
    failed=1
  fi
done
# The program: 3 ranks (an odd world), one epoch, and its report of what SyncBN cost (2 BN layers in tiny-bn: 4
# all-reduces per step).
if timeout --kill-after=5 120 scripts/launch.sh 3 "$train" --epochs 1 --batch-size 96 >"$log" 2>&1 &&
   grep -q '^syncbn: 4.0 all-reduces per step' "$log" && grep -q '^final:' "$log"; then
  echo "ok   lesson 05 program on 3 ranks: $(grep -m1 '^syncbn:' "$log" | cut -c1-110)"
else
  echo "!! FAIL: lesson 05 program on 3 ranks"
  tail -n 15 "$log" | sed 's/^/   | /'
  failed=1
fi
[ $failed -eq 0 ] && echo "lesson 05: all extra tests passed"
exit $failed
