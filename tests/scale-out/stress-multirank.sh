#!/usr/bin/env bash
# tests/scale-out/stress-multirank.sh: the multi-rank extra tests of lessons 03, 04 and 07
# (tests/lessonNN/run-tests.sh: mpirun jobs, rendezvous stores, killed ranks) run 3 at a time, ROUNDS times,
# to show that they do not get in each other's way (ports, files, timing) on a loaded machine. Not part of
# `make test`: it takes minutes. Prints one line per run and the count of failures; exit 1 when any failed.
#
#   tests/scale-out/stress-multirank.sh BUILD [ROUNDS]        (make stress-multirank STRESS_ROUNDS=5)
set -u
cd "$(dirname "$0")/../.." || exit 1
build=${1:?usage: $0 BUILD [ROUNDS]}
rounds=${2:-5}
logs=$build/stress-multirank
rm -rf "$logs"; mkdir -p "$logs"
# suite NN: the command line of lesson NN's extra tests, as `make test-lessonNN` runs them
suite() {
  case $1 in
    03) echo "tests/lesson03/run-tests.sh $build/grade-solutions/test_lesson03 $build/solutions/03-ddp/train" ;;
    04) echo "tests/lesson04/run-tests.sh $build/grade-solutions/test_lesson04 $build/solutions/04-checkpoint/train $build/tests/ckpt_compare" ;;
    07) echo "tests/lesson07/run-tests.sh $build/grade-solutions/test_lesson07 $build/solutions/07-scale-out/train" ;;
  esac
}
failures=0 runs=0 start=$SECONDS
for ((round = 1; round <= rounds; round++)); do
  declare -A pid=()
  for n in 03 04 07; do
    # shellcheck disable=SC2046  # the command line is split on purpose (paths without spaces)
    nice $(suite $n) >"$logs/round$round-lesson$n.log" 2>&1 &
    pid[$n]=$!
  done
  for n in 03 04 07; do
    runs=$((runs + 1))
    if wait "${pid[$n]}"; then echo "ok   round $round lesson $n"
    else
      failures=$((failures + 1))
      echo "!! FAIL: round $round lesson $n ($logs/round$round-lesson$n.log):"
      grep -E 'FAIL|rror' "$logs/round$round-lesson$n.log" | head -n 5 | sed 's/^/   | /'
    fi
  done
  unset pid
done
echo "stress-multirank: $failures of $runs runs failed ($rounds rounds of lessons 03, 04, 07 side by side, $((SECONDS - start)) s; logs in $logs)"
[ "$failures" -eq 0 ]
