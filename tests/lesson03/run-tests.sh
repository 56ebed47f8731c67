#!/usr/bin/env bash
# tests/lesson03/run-tests.sh: lesson 03's checks beyond `make grade-solutions` (which runs the autograder on
# GRADE_NP ranks, one test per process): the whole autograder of the SOLUTION on the other world sizes (more
# ranks than cores run oversubscribed), then the killed-rank test of the real program.
#
#   tests/lesson03/run-tests.sh BUILD/grade-solutions/test_lesson03 BUILD/solutions/03-ddp/train
#
# LESSON03_WORLDS="1 3 4" chooses the world sizes.
set -u
tests=${1:?usage: $0 TEST_BINARY TRAIN_BINARY}
train=${2:?usage: $0 TEST_BINARY TRAIN_BINARY}
cd "$(dirname "$0")/../.."
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's own allocations (see run-dist-tests.sh)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
count=$("$tests" --list | wc -l)  # every test of the binary must pass
for np in ${LESSON03_WORLDS:-1 3 4}; do
  start=$(date +%s)
  timeout --kill-after=5 120 scripts/launch.sh "$np" "$tests" >"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q "PASSED.*\\b$count test" "$log"; then
    echo "ok   lesson 03 autograder on the solution, world $np ($(( $(date +%s) - start )) s): $(grep -m1 '^DDP on' "$log")"
  else
    echo "!! FAIL: lesson 03 autograder on the solution, world $np (exit $rc)"
    grep -E 'FAILED|ERROR|error|differ|drift' "$log" | sort -u | head -n 20 | sed 's/^/   | /'
    failed=1
  fi
done
tests/lesson03/kill-rank.sh "$train" || failed=1
[ $failed -eq 0 ] && echo "lesson 03: all extra tests passed"
exit $failed
