#!/usr/bin/env bash
# tests/lesson08/run-tests.sh: lesson 08's checks beyond the autograder (`make test-lesson08`), on the SOLUTION's
# program:
#   - the same training (synthetic data, BN-free `tiny`, 1 epoch) in one process, on 2 ranks (2 stages) and on
#     4 ranks (2 stages x 2 replicas, 1F1B): the final train loss and test accuracy are equal as printed (the
#     arithmetic is the same but for the order of some float32 sums: far below the 4 printed digits);
#   - the activations a stage holds (one view per micro-batch in flight): M on every stage under GPipe, P - s
#     on stage s under 1F1B (2 ranks, 2 stages, 4 micro-batches);
#   - 3 ranks for 2 stages stop at once with a message naming the rule;
#   - with a GPU: one stage per rank on it (2 ranks share it through --backend mpi; NCCL with 2 GPUs or more).
#     Without one it says so and skips: the CUDA emulator of this kit has no NCCL and no second device.
#
#   tests/lesson08/run-tests.sh BUILD/grade-solutions/test_lesson08 BUILD/solutions/08-pipeline/train
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 08 "$@"
export KIT_PROGRESS=plain
log=$work/run.log
args=(--dataset synthetic --model tiny --epochs 1 --batch-size 64 --micro-batches 4)

# run NP ARGS...: the program on NP ranks (1: without mpirun) with the common arguments, its output in $log.
run() {
  local np=$1; shift
  if [ "$np" = 1 ]; then timeout 300 "$train" "${args[@]}" "$@" >"$log" 2>&1
  else timeout 300 scripts/launch.sh "$np" "$train" "${args[@]}" "$@" >"$log" 2>&1; fi
}

# The final line's train_loss and test_acc of one run: NP then the extra options.
final_of() {
  run "$@"
  local rc=$?
  [ $rc -eq 0 ] || { echo "exit $rc: $(grep -m1 -E 'error|HINT' "$log")"; return 1; }
  [ "$(grep -c '^final:' "$log")" = 1 ] || { echo "$(grep -c '^final:' "$log") final lines (one rank must report)"; return 1; }
  grep '^final:' "$log" | grep -oE 'train_loss=[0-9.]+ test_acc=[0-9.]+'
}

if ! one=$(final_of 1 --stages 2); then bad "one process: $one"; show "$log"; extras_end; fi
for run in "2 --stages 2" "4 --stages 2 --schedule 1f1b"; do
  read -r -a a <<<"$run"
  if got=$(final_of "${a[@]}") && [ "$got" = "$one" ]; then
    ok "program on ${a[0]} ranks (${a[*]:1}) = one process: $got"
  else
    bad "program on ${a[0]} ranks (${a[*]:1}): $got, one process: $one"
  fi
done

# The micro-batches each rank's stage held at once ("activations held: rank 0 N micro-batch(es) ..."): GPipe
# keeps all M until the backward passes, 1F1B at most P - s.
for want in "gpipe 4 4" "1f1b 2 1"; do
  read -r sched h0 h1 <<<"$want"
  run 2 --stages 2 --schedule "$sched"
  got=$(grep -m1 '^activations held:' "$log" | grep -oE 'rank [0-9]+ [0-9]+ micro' | awk '{print $3}' | xargs)
  if [ "$got" = "$h0 $h1" ]; then ok "$sched, 2 stages, M = 4: the stages held $got micro-batches"
  else bad "$sched, 2 stages, M = 4: the stages held '${got}' micro-batches, not $h0 $h1"; show "$log"; fi
done

# A world that is not pipes of --stages: stopped before any work, with the rule.
timeout 120 scripts/launch.sh 3 "$train" "${args[@]}" --stages 2 >"$log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "must be a multiple of --stages" "$log"; then
  ok "3 ranks for 2 stages: exit $rc, $(grep -m1 -o 'cannot be cut into pipes.*' "$log")"
else
  bad "3 ranks for 2 stages: exit $rc without the rule"; show "$log"
fi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -gt 0 ]; then
  got=$(final_of 2 --stages 2 --device cuda --backend mpi)
  if [ $? -eq 0 ] && grep -q "stage 1 of replica 0 on GPU" "$log"; then ok "2 stages on GPU (MPI backend): $got"
  else bad "2 stages on GPU (MPI backend): $got"; show "$log"; fi
  if [ "$gpus" -ge 2 ]; then
    if got=$(final_of 2 --stages 2 --device cuda --backend nccl); then ok "2 stages on 2 GPUs (NCCL): $got"
    else bad "2 stages, NCCL: $got"; show "$log"; fi
  fi
else
  echo "skip ${verdict_prefix}a stage per GPU: no GPU here (and the kit's CUDA emulator has no NCCL); the path is compiled only"
fi
# a pipeline saved as one lesson-04 checkpoint (its own verdict lines)
tests/lesson08/ckpt-tests.sh "$@" || bad "checkpoints of a pipeline (tests/lesson08/ckpt-tests.sh, above)"
tests/lesson08/outputs-tests.sh "$tests" "$train" "${compare:-}" || bad "outputs: invariant 13 (tests/lesson08/outputs-tests.sh, above)"
extras_end
