#!/usr/bin/env bash
# tests/lesson10/run-tests.sh: lesson 10's checks beyond the autograder (`make test-lesson10`), on the SOLUTION:
#   - the whole autograder on other world sizes (LESSON10_WORLDS, default "1 2": one rank without mpirun, and an
#     even world; the grade itself runs on 3, an odd world whose ring has uneven chunks and shows a sum rounded
#     twice, and its split covers 2 and 1 again);
#   - the PyTorch references (tests/lesson10/make-fixture.py --check): regenerated and compared with the committed
#     fixtures where torch imports; skipped, saying why, where it does not;
#   - the program: --precision fp32 (master fp32, all-reduce fp32, --accumulate 1) gives lesson 03's final line
#     (train_loss, test_acc) exactly, on 2 ranks;
#   - --accumulate K on W ranks takes the step of W x K ranks: 2 ranks x 2 micro-batches, 4 ranks x 1 and 1 rank x 4
#     at the same --batch-size, two steps (--stop-at 2), the master weights compared (tests/ckpt_compare), on the
#     BN-free tiny (why not tiny-bn: below);
#   - fp16 with dynamic loss scaling trains (the loss falls below chance) and reports its scale and skips;
#   - bad options (a local batch that does not split into --accumulate, an unknown format) stop at once with a
#     message naming the option.
#
#   tests/lesson10/run-tests.sh BUILD/grade-solutions/test_lesson10 BUILD/solutions/10-precision/train BUILD/tests/ckpt_compare
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 10 "$@"
export KIT_PROGRESS=plain
log=$work/run.log
ddp03=$(dirname "$train")/../03-ddp/train
args=(--dataset synthetic --epochs 1 --batch-size 32)

KIT_PG_TIMEOUT=60 solution_on_worlds "$tests" "${LESSON10_WORLDS:-1 2}" 600 '^bf16 all-reduce'

# ---- the PyTorch references
if out=$(timeout --kill-after=5 300 python3 tests/lesson10/make-fixture.py --check 2>&1); then
  case "$out" in *skipped*) echo "skip ${verdict_prefix}$out";; *) ok "$out";; esac
else bad "$out"; fi

# run NP PROGRAM ARGS...: PROGRAM on NP ranks (1: without mpirun) with the common arguments, its output in $log.
run() {
  local np=$1 prog=$2; shift 2
  if [ "$np" = 1 ]; then timeout 300 "$prog" "${args[@]}" "$@" >"$log" 2>&1
  else timeout 300 scripts/launch.sh "$np" "$prog" "${args[@]}" "$@" >"$log" 2>&1; fi
}
# the value of KEY= on the final line of $log
final_field() { grep '^final:' "$log" | grep -oE "(^| )$1=[^ ]+" | cut -d= -f2; }

# ---- --precision fp32 is lesson 03
if [ -x "$ddp03" ]; then
  if run 2 "$ddp03" --model tiny-bn; then
    want="$(final_field train_loss) $(final_field test_acc)"
    if run 2 "$train" --model tiny-bn --precision fp32 --master fp32 --allreduce fp32 --accumulate 1; then
      got="$(final_field train_loss) $(final_field test_acc)"
      if [ "$got" = "$want" ] && [ -n "${want// /}" ]; then ok "--precision fp32 on 2 ranks: lesson 03's final line (train_loss test_acc: $got)"
      else bad "--precision fp32 on 2 ranks: train_loss test_acc '$got', lesson 03's '$want' (the policy must round nothing)"; fi
    else bad "--precision fp32 on 2 ranks: exit status $?"; show "$log"; fi
  else bad "lesson 03's program on 2 ranks: exit status $?"; show "$log"; fi
else
  echo "skip ${verdict_prefix}fp32 against lesson 03: $ddp03 not built"
fi

# ---- --accumulate K on W ranks = W x K ranks. One global batch of 32 is split into 4 micro-batches of 8 every
# way; the runs differ only in the order of the float32 sums of those 4 gradients (at most 4 roundings, 2^-24
# relative each, of sums no larger than the sum of |g|) and of the all-reduce, moved by lr = 0.05 over 2 steps:
# around 1e-8 of the largest weight. 1e-6 leaves that a hundred times; a wrong accumulation (a gradient K times
# too large, one micro-batch's only) moves the weights by a share of lr |g|, 1e-3 of the largest weight or more.
# Measured: 1.5e-8. BN-free only: the runs take the same micro-batches (micro-batch k of rank r takes every K-th
# of its samples from the k-th: what rank r + kW of the larger world takes), so a BN model's weights agree as
# well, but its running statistics do not (a rank running K micro-batches updates them K times a step) and
# --save-params writes them. The autograder's test_accumulate_equals_world compares the weights of tiny-bn.
if [ -n "$compare" ]; then
  for model in tiny; do
    ref=
    for cfg in "4 1" "2 2" "1 4"; do
      read -r np k <<<"$cfg"
      out=$work/acc-$model-$np-$k.ckpt
      if run "$np" "$train" --model "$model" --lr 0.05 --accumulate "$k" --stop-at 2 --save-params "$out" && [ -s "$out" ]; then
        if [ -z "$ref" ]; then ref=$out; ok "$model: $np ranks x --accumulate $k: 2 steps saved"
        else same_model "$model: $np rank(s) x --accumulate $k = 4 ranks x 1 after 2 steps" "$ref" "$out" 1e-6; fi
      else bad "$model: $np rank(s) x --accumulate $k: exit status $?"; show "$log"; fi
    done
  done
else
  echo "skip ${verdict_prefix}accumulation against more ranks: no ckpt_compare given"
fi

# ---- a run stopped inside its first epoch (--stop-at) reports the steps it trained: the final line's train_loss
# is their mean loss (a fresh 10-class model starts near ln 10 = 2.30, so above 1 after 3 steps), its images/s
# their speed; both were 0 when only a finished epoch counted
if run 1 "$train" --model tiny --stop-at 3; then
  loss=$(final_field train_loss); speed=$(final_field images_per_s)
  if awk -v l="$loss" -v s="$speed" 'BEGIN { exit !(l != "" && l > 1.0 && l < 5.0 && s > 0) }'; then
    ok "--stop-at 3 inside epoch 1: final train_loss $loss, images_per_s $speed"
  else bad "--stop-at 3 inside epoch 1: final train_loss '$loss', images_per_s '$speed' (want the 3 steps' mean loss, about 2.3, and their speed)"; show "$log"; fi
else bad "--stop-at 3: exit status $?"; show "$log"; fi

# ---- fp16 with dynamic loss scaling trains
if run 2 "$train" --model tiny --precision fp16 --loss-scale dynamic --scale-window 20; then
  loss=$(final_field train_loss)
  if awk -v l="$loss" 'BEGIN { exit !(l != "" && l < 2.0) }'; then
    ok "fp16, dynamic loss scale: train_loss $loss (chance: 2.30), loss_scale=$(final_field loss_scale) skipped=$(final_field skipped) underflow=$(final_field underflow)"
  else bad "fp16, dynamic loss scale: train_loss '$loss' did not fall below 2.0 (chance 2.30)"; show "$log"; fi
else bad "fp16, dynamic loss scale: exit status $?"; show "$log"; fi

# ---- bad options: stopped before any work, with the rule
for opt in "--accumulate 3" "--precision fp8" "--master fp16" "--accumulate 0"; do
  read -r -a o <<<"$opt"
  run 2 "$train" --model tiny "${o[@]}"
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "${o[0]}" "$log"; then ok "$opt: exit $rc, $(grep -m1 -- "${o[0]}" "$log" | cut -c1-110)"
  else bad "$opt: exit $rc without a message naming ${o[0]}"; show "$log"; fi
done
# ---- invariant 13: outputs (another run's files, before the first step, a run that never recovers)
tests/lesson10/outputs-tests.sh "$tests" "$train" "${compare:-}" || bad "outputs (tests/lesson10/outputs-tests.sh, above)"
extras_end
