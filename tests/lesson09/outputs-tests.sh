#!/usr/bin/env bash
# tests/lesson09/outputs-tests.sh: invariant 13 on lesson 09's program (2 ranks, --zero 1 or 2). One class each:
#   1. another run's work is never replaced: --consolidate onto another run's file (another --seed), and a
#      --resume of a set into a --checkpoint-dir that holds another run's set of the same step: refused, the
#      files untouched;
#   2. every output checked before the first step, the message naming the flag passed: --consolidate into a
#      missing folder, --consolidate naming a folder (it named --checkpoint and --checkpoint-dir);
#   3. a run that never recovers ends non-zero (--lr 100: NaN, every rank stopped, nothing saved); SIGTERM to a
#      rank saves a set at the next step, as lesson 04 does (a preemption loses at most one step), exit 0.
#
#   tests/lesson09/outputs-tests.sh TEST_BINARY TRAIN_BINARY [CKPT_COMPARE]
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
# shellcheck source=SCRIPTDIR/../outputs-lib.sh
. "$(dirname "$0")/../outputs-lib.sh"
extras_begin 09 "$@"
verdict_prefix="${verdict_prefix}outputs: "
opts=(--dataset synthetic --model tiny --width 8 --batch-size 96 --timeout 20 --zero 1)
run() {  # LOG ARGS...: 2 ranks
  local log=$1
  shift
  timeout --kill-after=5 120 scripts/launch.sh 2 "$train" "${opts[@]}" "$@" >"$log" 2>&1
}

# ---- 1. another run's work
run "$work/a.log" --epochs 1 --checkpoint-dir "$work/a" --consolidate "$work/a.ckpt" ||
  { bad "the first run failed"; show "$work/a.log"; extras_end; }
run "$work/b.log" --epochs 2 --seed 2 --checkpoint-dir "$work/b" --save-every 5 --stop-at 10 ||
  { bad "the --seed 2 run to step 10 failed"; show "$work/b.log"; extras_end; }
a=$(sum "$work/a.ckpt") sa=$(sum "$work/a")
run "$work/c1.log" --epochs 1 --seed 2 --checkpoint-dir "$work/c" --consolidate "$work/a.ckpt"
refused_early "--consolidate onto another run's file" "$work/c1.log" $? "--consolidate .*another run.*seed 1"
untouched "... that file" "$work/a.ckpt" "$a"
run "$work/c2.log" --epochs 2 --seed 2 --resume "$work/b/step-00000010" --checkpoint-dir "$work/a"
refused_early "--resume of a set into a --checkpoint-dir of another run (it would save step 52 there)" "$work/c2.log" $? \
  "--checkpoint-dir .*another run"
untouched "... that run's sets" "$work/a" "$sa"

# ---- 2. before the first step, naming the flag passed
run "$work/d1.log" --epochs 1 --consolidate "$work/missing/x.ckpt"
refused_early "--consolidate into a missing folder" "$work/d1.log" $? "--consolidate .*does not exist"
mkdir -p "$work/adir"
run "$work/d2.log" --epochs 1 --consolidate "$work/adir"
refused_early "--consolidate naming a folder" "$work/d2.log" $? "--consolidate .*is a folder"
grep -E '^error:' "$work/d1.log" "$work/d2.log" | grep -qE -- "--checkpoint( |-dir|')" &&
  bad "... an error names --checkpoint or --checkpoint-dir, flags never passed" || ok "... no error names a flag not passed"

# ---- 3. a run that never recovers; SIGTERM
run "$work/n.log" --epochs 2 --lr 100 --checkpoint-dir "$work/n"
rc=$?
if [ $rc -ne 0 ] && grep -q "NaN or Inf" "$work/n.log" && ! grep -q "^consolidated" "$work/n.log"; then
  ok "--lr 100: stopped on the NaN, exit $rc"
else bad "--lr 100: exit $rc, no NaN stop"; show "$work/n.log"; fi
scripts/launch.sh 2 "$train" "${opts[@]}" --zero 2 --epochs 3 --checkpoint-dir "$work/s" >"$work/s.log" 2>&1 &
term_after_epoch1 $! "$work/s.log" "$train"
stop=$(sed -n 's/^stopped after step \([0-9]*\) by SIGTERM.*/\1/p' "$work/s.log")
newest=$(ls -d "$work/s"/step-* 2>/dev/null | tail -n 1)
if [ $rc -eq 0 ] && [ -n "$stop" ] && [ -n "$newest" ] && [ "$((10#${newest##*step-}))" = "$stop" ] &&
   [ -s "$newest/manifest" ]; then
  ok "SIGTERM to one rank: a set at the next step (step $stop), exit 0"
else bad "SIGTERM to one rank: exit $rc, stop step '${stop}', newest set '${newest##*/}'"; show "$work/s.log"; fi
extras_end
