#!/usr/bin/env bash
# tests/lesson08/run-tests.sh: lesson 08's checks beyond the autograder (`make test-lesson08`), on the SOLUTION's
# program:
#   - the same training (synthetic data, BN-free `tiny`, 1 epoch) in one process, on 2 ranks (2 stages) and on
#     4 ranks (2 stages x 2 replicas, 1F1B): the final train loss and test accuracy are equal as printed (the
#     arithmetic is the same but for the order of some float32 sums: far below the 4 printed digits);
#   - 3 ranks for 2 stages stop at once with a message naming the rule;
#   - with a GPU: one stage per rank on it (2 ranks share it through --backend mpi; NCCL with 2 GPUs or more).
#     Without one it says so and skips: the CUDA emulator of this kit has no NCCL and no second device.
#
#   tests/lesson08/run-tests.sh BUILD/grade-solutions/test_lesson08 BUILD/solutions/08-pipeline/train
set -u
train=${2:?usage: $0 TEST_BINARY TRAIN_BINARY}
cd "$(dirname "$0")/../.."
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's own allocations (see run-dist-tests.sh)
export KIT_PROGRESS=plain
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0
args=(--dataset synthetic --model tiny --epochs 1 --batch-size 64 --micro-batches 4)

# The final line's train_loss and test_acc of one run: NP then the extra options.
final_of() {
  local np=$1; shift
  if [ "$np" = 1 ]; then timeout 300 "$train" "${args[@]}" "$@" >"$log" 2>&1
  else timeout 300 scripts/launch.sh "$np" "$train" "${args[@]}" "$@" >"$log" 2>&1; fi
  local rc=$?
  [ $rc -eq 0 ] || { echo "exit $rc: $(grep -m1 -E 'error|HINT' "$log")"; return 1; }
  [ "$(grep -c '^final:' "$log")" = 1 ] || { echo "$(grep -c '^final:' "$log") final lines (one rank must report)"; return 1; }
  grep '^final:' "$log" | grep -oE 'train_loss=[0-9.]+ test_acc=[0-9.]+'
}

one=$(final_of 1 --stages 2) || { echo "!! FAIL: one process: $one"; exit 1; }
for run in "2 --stages 2" "4 --stages 2 --schedule 1f1b"; do
  read -r -a a <<<"$run"
  got=$(final_of "${a[@]}")
  if [ $? -eq 0 ] && [ "$got" = "$one" ]; then
    echo "ok   lesson 08 program on ${a[0]} ranks (${a[*]:1}) = one process: $got"
  else
    echo "!! FAIL: lesson 08 program on ${a[0]} ranks (${a[*]:1}): $got, one process: $one"
    failed=1
  fi
done

# A world that is not pipes of --stages: stopped before any work, with the rule.
timeout 120 scripts/launch.sh 3 "$train" "${args[@]}" --stages 2 >"$log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "must be a multiple of --stages" "$log"; then
  echo "ok   3 ranks for 2 stages: exit $rc, $(grep -m1 -o 'cannot be cut into pipes.*' "$log")"
else
  echo "!! FAIL: 3 ranks for 2 stages: exit $rc without the rule"; failed=1
fi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -gt 0 ]; then
  got=$(final_of 2 --stages 2 --device cuda --backend mpi)
  if [ $? -eq 0 ] && grep -q "stage 1 of replica 0 on GPU" "$log"; then echo "ok   2 stages on GPU (MPI backend): $got"
  else echo "!! FAIL: 2 stages on GPU (MPI backend): $got"; failed=1; fi
  if [ "$gpus" -ge 2 ]; then
    got=$(final_of 2 --stages 2 --device cuda --backend nccl)
    if [ $? -eq 0 ]; then echo "ok   2 stages on 2 GPUs (NCCL): $got"; else echo "!! FAIL: 2 stages, NCCL: $got"; failed=1; fi
  fi
else
  echo "skip a stage per GPU: no GPU here (and the kit's CUDA emulator has no NCCL); the path is compiled only"
fi
tests/lesson08/ckpt-tests.sh "$@" || failed=1  # a pipeline saved as one lesson-04 checkpoint
[ $failed -eq 0 ] && echo "lesson 08: all extra tests passed"
exit $failed
