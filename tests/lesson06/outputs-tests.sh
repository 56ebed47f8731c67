#!/usr/bin/env bash
# tests/lesson06/outputs-tests.sh: invariant 13 on lesson 06's program (inference: its one output is the
# --confusion CSV). A report never replaces a run's work: --confusion naming a checkpoint is refused before the
# evaluation, on the command line's flag, and the checkpoint is untouched; --overwrite allows it. (Lesson 06
# trains nothing: there is no run that never recovers.)
#
#   tests/lesson06/outputs-tests.sh TEST_BINARY TRAIN_BINARY   (lesson 04's program: beside it, in the build)
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
# shellcheck source=SCRIPTDIR/../outputs-lib.sh
. "$(dirname "$0")/../outputs-lib.sh"
extras_begin 06 "$@"
verdict_prefix="${verdict_prefix}outputs: "
train04=$(dirname "$(dirname "$train")")/04-checkpoint/train
opts=(--dataset synthetic --model tiny --width 8)
if ! timeout --kill-after=5 120 scripts/launch.sh 1 "$train04" "${opts[@]}" --epochs 1 --checkpoint "$work/a.ckpt" \
     >"$work/a.log" 2>&1; then
  bad "lesson 04's program did not write a checkpoint"; show "$work/a.log"; extras_end
fi
a=$(sum "$work/a.ckpt")
cp "$work/a.ckpt" "$work/b.ckpt"
timeout --kill-after=5 60 "$train" "${opts[@]}" --checkpoint "$work/a.ckpt" --confusion "$work/b.ckpt" >"$work/c.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -qE "error:.*--confusion .*is a checkpoint" "$work/c.log" && ! grep -qi "accuracy" "$work/c.log"; then
  ok "--confusion onto a checkpoint: refused before the evaluation: $(grep -m1 -o 'error:.*' "$work/c.log" | sed "s|$work/||g")"
else bad "--confusion onto a checkpoint: exit $rc, not refused before the evaluation"; show "$work/c.log"; fi
untouched "... the checkpoint" "$work/b.ckpt" "$a"
if timeout --kill-after=5 60 "$train" "${opts[@]}" --checkpoint "$work/a.ckpt" --confusion "$work/b.ckpt" --overwrite \
     >"$work/d.log" 2>&1 && head -c 4 "$work/b.ckpt" | grep -q true; then
  ok "--overwrite lets --confusion replace it (a CSV now)"
else bad "--confusion --overwrite did not write the CSV"; show "$work/d.log"; fi
extras_end
