#!/usr/bin/env bash
# tests/lesson04/outputs-tests.sh: invariant 13 on lesson 04's program (and on lessons 05 and 07, whose programs
# are lesson 04's run_program_with: their outputs-tests.sh run this one on their own program). One class each:
#   1. another run's work is never replaced: a fresh run (another --seed) onto another run's --checkpoint FILE,
#      a --resume (of a run stopped at step 10) into a --checkpoint-dir that holds another run's checkpoint of
#      step 39, which the resumed run would write over at its epoch's end, a --checkpoint that is no
#      checkpoint at all, --metrics onto a checkpoint: each refused, the files untouched; --overwrite replaces
#      a file (and only when given);
#   2. before the first step, agreed on every rank: the same refusal on 2 ranks, every rank out with no step;
#   3. a run that never recovers ends non-zero: --lr 100 (a NaN loss) stops every rank, exit 1, and the last
#      good checkpoint survives.
#
#   tests/lesson04/outputs-tests.sh TEST_BINARY TRAIN_BINARY [CKPT_COMPARE] [LESSON]
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
# shellcheck source=SCRIPTDIR/../outputs-lib.sh
. "$(dirname "$0")/../outputs-lib.sh"
extras_begin "${4:-04}" "$@"
verdict_prefix="${verdict_prefix}outputs: "
run() {  # NP LOG ARGS...: the program on NP ranks; its exit status
  local np=$1 log=$2
  shift 2
  timeout --kill-after=5 120 scripts/launch.sh "$np" "$train" --dataset synthetic --model tiny --width 8 --epochs 1 \
    --batch-size 128 --timeout 20 "$@" >"$log" 2>&1
}

# ---- 1. another run's work
run 1 "$work/a.log" --checkpoint "$work/a.ckpt" || { bad "the first run (--checkpoint) failed"; show "$work/a.log"; extras_end; }
run 1 "$work/b.log" --seed 2 --checkpoint-dir "$work/b" || { bad "the run into --checkpoint-dir failed"; show "$work/b.log"; extras_end; }
run 1 "$work/m.log" --epochs 2 --stop-at 10 --checkpoint "$work/mid.ckpt" || { bad "the run stopped at step 10 failed"; show "$work/m.log"; extras_end; }
a=$(sum "$work/a.ckpt") b=$(sum "$work/b")
run 1 "$work/c1.log" --seed 2 --checkpoint "$work/a.ckpt"
refused_early "a fresh run (--seed 2) onto another run's --checkpoint" "$work/c1.log" $? "--checkpoint .*another run.*seed 1"
untouched "... that run's checkpoint" "$work/a.ckpt" "$a"
run 1 "$work/c2.log" --checkpoint "$work/a.ckpt"
refused_early "a fresh run with the same options onto --checkpoint" "$work/c2.log" $? "--checkpoint .*another run"
grep -q -- "--resume .*continues" "$work/c2.log" && ok "... the refusal names --resume" || bad "... the refusal does not name --resume"
run 1 "$work/c3.log" --epochs 2 --resume "$work/mid.ckpt" --checkpoint-dir "$work/b"  # it would save step 39 there
refused_early "--resume into a --checkpoint-dir of another run" "$work/c3.log" $? "--checkpoint-dir .*another run"
untouched "... that run's folder" "$work/b" "$b"
echo "notes" >"$work/notes.txt"
run 1 "$work/c4.log" --checkpoint "$work/notes.txt"
refused_early "--checkpoint onto a file that is no checkpoint" "$work/c4.log" $? "not a checkpoint"
[ "$(cat "$work/notes.txt")" = notes ] && ok "... the file is untouched" || bad "... the file CHANGED"
run 1 "$work/c5.log" --metrics "$work/a.ckpt"
refused_early "--metrics onto a checkpoint" "$work/c5.log" $? "--metrics .*is a checkpoint"
untouched "... the checkpoint" "$work/a.ckpt" "$a"
if run 1 "$work/c6.log" --seed 2 --checkpoint "$work/a.ckpt" --overwrite && [ "$(sum "$work/a.ckpt")" != "$a" ]; then
  ok "--overwrite replaces another run's --checkpoint"
else bad "--overwrite did not replace the file"; show "$work/c6.log"; fi

# ---- 2. rank 0's verdict, before the first step, on every rank
a=$(sum "$work/a.ckpt")
run 2 "$work/d1.log" --checkpoint "$work/a.ckpt"
refused_early "2 ranks, a fresh run onto another run's --checkpoint" "$work/d1.log" $? "--checkpoint .*another run"
[ "$(grep -c '^error:' "$work/d1.log")" = 1 ] && ok "... one error line (rank 0's), every rank out" ||
  bad "... $(grep -c '^error:' "$work/d1.log") error lines (expected rank 0's alone)"
untouched "... the checkpoint" "$work/a.ckpt" "$a"

# ---- 3. a run that never recovers
run 2 "$work/n.log" --epochs 2 --lr 100 --checkpoint-dir "$work/n"
rc=$?
if [ $rc -ne 0 ] && grep -q "NaN or Inf" "$work/n.log"; then ok "--lr 100 on 2 ranks: stopped on the NaN, exit $rc"
else bad "--lr 100 on 2 ranks: exit $rc, no NaN stop"; show "$work/n.log"; fi
extras_end
