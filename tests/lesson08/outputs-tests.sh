#!/usr/bin/env bash
# tests/lesson08/outputs-tests.sh: invariant 13 on lesson 08's program. One class each:
#   1. another run's work is never replaced: a fresh run (--seed 2) onto another run's --checkpoint FILE, and a
#      --resume (of a run's epoch 1) into a --checkpoint-dir holding another run's checkpoints of the same steps:
#      refused, the files untouched;
#   2. before the first step, agreed on every rank: that refusal on 2 ranks (one stage each), one error line;
#   3. the run says what it did: --micro-batches 8 with a batch of 4 is refused with the largest valid value (4)
#      on one process and on 2 ranks (it ran 4 and printed 8); a lesson-04 checkpoint saved after an epoch's
#      last batch is refused as that, not as "the middle of epoch 1"; a run that never recovers (--lr 100: a NaN
#      loss) stops every rank and ends non-zero.
#
#   tests/lesson08/outputs-tests.sh TEST_BINARY TRAIN_BINARY [CKPT_COMPARE]
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
# shellcheck source=SCRIPTDIR/../outputs-lib.sh
. "$(dirname "$0")/../outputs-lib.sh"
extras_begin 08 "$@"
verdict_prefix="${verdict_prefix}outputs: "
opts=(--dataset synthetic --model tiny --width 8 --batch-size 128 --timeout 20)
run() {  # NP LOG ARGS...
  local np=$1 log=$2
  shift 2
  timeout --kill-after=5 120 scripts/launch.sh "$np" "$train" "${opts[@]}" "$@" >"$log" 2>&1
}

# ---- 1. another run's work
run 1 "$work/a.log" --epochs 1 --checkpoint "$work/a.ckpt" || { bad "the first run failed"; show "$work/a.log"; extras_end; }
run 1 "$work/m.log" --epochs 2 --checkpoint-dir "$work/m" || { bad "the run of 2 epochs failed"; show "$work/m.log"; extras_end; }
run 1 "$work/b.log" --epochs 2 --seed 2 --checkpoint-dir "$work/b" || { bad "the --seed 2 run failed"; show "$work/b.log"; extras_end; }
a=$(sum "$work/a.ckpt") b=$(sum "$work/b")
run 1 "$work/c1.log" --epochs 1 --seed 2 --checkpoint "$work/a.ckpt"
refused_early "a fresh run (--seed 2) onto another run's --checkpoint" "$work/c1.log" $? "--checkpoint .*another run.*seed 1"
untouched "... that run's checkpoint" "$work/a.ckpt" "$a"
run 1 "$work/c2.log" --epochs 2 --resume "$work/m/ckpt-00000039.ckpt" --checkpoint-dir "$work/b"
refused_early "--resume into a --checkpoint-dir of another run (it would save step 78 there)" "$work/c2.log" $? \
  "--checkpoint-dir .*another run"
untouched "... that run's folder" "$work/b" "$b"

# ---- 2. before the first step, on every rank
run 2 "$work/d.log" --epochs 1 --seed 2 --checkpoint "$work/a.ckpt"
refused_early "2 ranks, a fresh run onto another run's --checkpoint" "$work/d.log" $? "--checkpoint .*another run"
[ "$(grep -c '^error:' "$work/d.log")" = 1 ] && ok "... one error line (rank 0's), every rank out" ||
  bad "... $(grep -c '^error:' "$work/d.log") error lines (expected rank 0's alone)"
untouched "... the checkpoint" "$work/a.ckpt" "$a"

# ---- 3. what the run says is what it does
for np in 1 2; do
  run "$np" "$work/mb$np.log" --epochs 1 --batch-size 4 --micro-batches 8
  refused_early "$np rank(s), --micro-batches 8 with a batch of 4" "$work/mb$np.log" $? "--micro-batches 8.*4 image"
  grep -q -- "HINT: --micro-batches 4 " "$work/mb$np.log" && ok "... it names --micro-batches 4, the largest that runs" ||
    bad "... no --micro-batches 4 in the refusal"
done
for np in 1 2; do  # a run that never recovers (--lr 100: a NaN loss) ends non-zero, nothing saved over the last epoch
  run "$np" "$work/n$np.log" --model tiny --width 16 --epochs 1 --lr 100 --checkpoint "$work/n$np.ckpt"
  rc=$?
  if [ $rc -ne 0 ] && grep -q "error: the loss is NaN or Inf" "$work/n$np.log" && [ ! -e "$work/n$np.ckpt" ]; then
    ok "$np rank(s), --lr 100: every rank stopped on the NaN, exit $rc"
  else bad "$np rank(s), --lr 100: exit $rc, not stopped on the NaN"; show "$work/n$np.log"; fi
done
train04=$(dirname "$(dirname "$train")")/04-checkpoint/train
if [ -x "$train04" ]; then
  timeout --kill-after=5 120 scripts/launch.sh 1 "$train04" "${opts[@]}" --epochs 2 --stop-at 39 \
    --checkpoint "$work/last.ckpt" >"$work/l4.log" 2>&1 || { bad "lesson 04's run to step 39 failed"; show "$work/l4.log"; }
  run 1 "$work/l.log" --epochs 2 --resume "$work/last.ckpt"
  rc=$?
  if [ $rc -ne 0 ] && grep -q "after the last batch of epoch 1 (batch 39 of 39)" "$work/l.log" &&
     ! grep -q "middle of epoch" "$work/l.log"; then
    ok "a checkpoint of an epoch's last batch, before its evaluation: $(grep -m1 -o 'saved after.*evaluation' "$work/l.log")"
  else bad "a checkpoint of an epoch's last batch: exit $rc, not said as it is"; show "$work/l.log"; fi
else
  echo "skip ${verdict_prefix}a lesson-04 checkpoint of an epoch's last batch: $train04 not built"
fi
extras_end
