#!/usr/bin/env bash
# tests/lesson10/outputs-tests.sh: invariant 13 on lesson 10's program. One class each:
#   1. another run's work is never replaced: --save-params onto another run's file (another --seed) is refused,
#      the file untouched; --overwrite replaces it;
#   2. every output checked before the first step, agreed on every rank: --save-params into a missing folder
#      and naming a folder, on 2 ranks (it failed after the whole training);
#   3. a run that never recovers ends non-zero and says so when it happens: --lr 100 in fp32 and in bf16 (a NaN
#      or Inf gradient at a loss scale of 1, which no scale explains) and in fp16 (its last epoch's loss NaN);
#      nothing saved.
#
#   tests/lesson10/outputs-tests.sh TEST_BINARY TRAIN_BINARY [CKPT_COMPARE]
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
# shellcheck source=SCRIPTDIR/../outputs-lib.sh
. "$(dirname "$0")/../outputs-lib.sh"
extras_begin 10 "$@"
verdict_prefix="${verdict_prefix}outputs: "
opts=(--dataset synthetic --model tiny --width 8 --batch-size 128 --epochs 1 --timeout 20)
run() {  # NP LOG ARGS...
  local np=$1 log=$2
  shift 2
  timeout --kill-after=5 120 scripts/launch.sh "$np" "$train" "${opts[@]}" "$@" >"$log" 2>&1
}

# ---- 1. another run's work
run 1 "$work/a.log" --save-params "$work/a.ckpt" || { bad "the first run failed"; show "$work/a.log"; extras_end; }
a=$(sum "$work/a.ckpt")
run 1 "$work/c1.log" --seed 2 --save-params "$work/a.ckpt"
refused_early "--save-params onto another run's file" "$work/c1.log" $? "--save-params .*another run.*seed 1"
untouched "... that file" "$work/a.ckpt" "$a"
if run 1 "$work/c2.log" --seed 2 --save-params "$work/a.ckpt" --overwrite && [ "$(sum "$work/a.ckpt")" != "$a" ]; then
  ok "--overwrite replaces it"
else bad "--save-params --overwrite did not replace the file"; show "$work/c2.log"; fi

# ---- 2. before the first step, on every rank
run 2 "$work/d1.log" --save-params "$work/missing/p.ckpt"
refused_early "2 ranks, --save-params into a missing folder" "$work/d1.log" $? "--save-params .*does not exist"
[ "$(grep -c '^error:' "$work/d1.log")" = 1 ] && ok "... one error line (rank 0's), every rank out" ||
  bad "... $(grep -c '^error:' "$work/d1.log") error lines (expected rank 0's alone)"
mkdir -p "$work/adir"
run 2 "$work/d2.log" --save-params "$work/adir"
refused_early "2 ranks, --save-params naming a folder" "$work/d2.log" $? "--save-params .*is a folder"

# ---- 3. a run that never recovers
for p in fp32 bf16 fp16; do
  run 1 "$work/n$p.log" --width 16 --precision "$p" --lr 100 --save-params "$work/n$p.ckpt"  # width 8 stays finite
  rc=$?
  if [ $rc -ne 0 ] && grep -q "error: the run diverged and never recovers" "$work/n$p.log" && [ ! -e "$work/n$p.ckpt" ]; then
    ok "--lr 100 in $p: exit $rc: $(grep -m1 -o 'never recovers: [^;]*' "$work/n$p.log")"
  else bad "--lr 100 in $p: exit $rc, not stopped as a run that never recovers"; show "$work/n$p.log"; fi
done
extras_end
