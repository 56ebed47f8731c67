#!/usr/bin/env bash
# tests/lesson04/run-tests.sh: lesson 04's checks beyond `make grade-solutions` (which runs the autograder on
# GRADE_NP ranks): the solution's autograder on worlds 1 and 4 (the tests' batches divide by both), then the real program:
#   1. SIGTERM to ONE rank mid-run: every rank saves and the job exits 0 saying how to resume; the resumed run
#      ends with the uninterrupted run's checkpoint, bit for bit (BN net, 2 ranks);
#   2. elastic resume 2 -> 1 and 4 -> 2 (BN-free net): equal to the uninterrupted run within lesson 03's
#      DDP-vs-one-process tolerance;
#   3. bad resumes: a corrupt file, a truncated newest file under --resume auto, another --batch-size.
#
#   tests/lesson04/run-tests.sh BUILD/grade-solutions/test_lesson04 BUILD/solutions/04-checkpoint/train BUILD/tests/ckpt_compare
#
# LESSON04_WORLDS="1 4" chooses the autograder's world sizes.
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 04 "$@"
: "${compare:?usage: $0 TEST_BINARY TRAIN_BINARY CKPT_COMPARE}"

# ---- the autograder of the solution on other world sizes
solution_on_worlds "$tests" "${LESSON04_WORLDS:-1 4}" 300

# run NP OUT ARGS...: the program on NP ranks, output in OUT; returns its exit status.
run() {
  local np=$1 out=$2
  shift 2
  timeout --kill-after=5 180 scripts/launch.sh "$np" "$train" --dataset synthetic --timeout 20 "$@" >"$out" 2>&1
}

# ---- 1. SIGTERM to one rank, exit 0, resume, bit for bit
bn="--model tiny-bn --epochs 3 --batch-size 64"
if run 2 "$work/ref.log" $bn --checkpoint-dir "$work/ref"; then
  scripts/launch.sh 2 "$train" --dataset synthetic --timeout 20 $bn --checkpoint-dir "$work/sig" >"$work/sig.log" 2>&1 &
  term_after_epoch1 $! "$work/sig.log" "$train"
  if [ -z "$victim" ] || [ $rc -ne 0 ] || ! grep -q '^resume with the same command and: --resume auto' "$work/sig.log"; then
    bad "SIGTERM to one rank: expected exit 0 and a line saying how to resume (exit $rc, victim '${victim}')"
    show "$work/sig.log"
  else
    step=$(sed -n 's/^stopped after step \([0-9]*\) .*/\1/p' "$work/sig.log")
    ok "SIGTERM to rank 1 of 2: every rank saved after step $step, exit 0"
    if run 2 "$work/res.log" $bn --checkpoint-dir "$work/sig" --resume auto && grep -q "resumed_from=$step" "$work/res.log"; then
      last=$(ls "$work/ref" | tail -n 1)
      same_model "resumed from step $step: the final checkpoint against the uninterrupted run's ($last)" \
        "$work/ref/$last" "$work/sig/$last"
    else
      bad "the resume after SIGTERM failed, or its final line lacks resumed_from=$step"
      show "$work/res.log"
    fi
  fi
else
  bad "the uninterrupted BN run failed"
  show "$work/ref.log"
fi

# ---- 2. elastic resume: saved on W1 ranks at step 32, finished on W2 (38 steps in all), against W1 uninterrupted.
# Tolerance 1e-6 of the largest parameter, lesson 03's test_ddp_equals_single_process: the state at step 32 is
# the W1 run's exactly (it is the file); the 6 steps after it sum the same gradients in another order (per rank,
# then across ranks), which changes the float32 rounding and nothing else. Bit-exactness is impossible for the
# same reason. A BN-free net: with plain BN each rank normalises over its own local batch, so another world
# size is another computation (lesson 05's SyncBN removes that).
tiny="--model tiny --epochs 2 --batch-size 256"
for pair in "2 1" "4 2"; do
  set -- $pair
  from=$1 to=$2
  if run "$from" "$work/u$from.log" $tiny --checkpoint-dir "$work/u$from" &&
     run "$from" "$work/e$from.log" $tiny --checkpoint-dir "$work/e$from$to" --stop-at 32 &&
     run "$to" "$work/e$to.log" $tiny --checkpoint-dir "$work/e$from$to" --resume auto; then
    last=$(ls "$work/u$from" | tail -n 1)
    same_model "elastic resume $from -> $to ranks at step 32" "$work/u$from/$last" "$work/e$from$to/$last" 1e-6
  else
    bad "elastic resume $from -> $to ranks: a run failed"
    show "$work/e$to.log"
  fi
done

# ---- 3. bad resumes: clear errors, exit 1, never a hang, never a silent fresh start
f=$work/u2/$(ls "$work/u2" | tail -n 1)
cp "$f" "$work/flipped.ckpt"
printf '\x01' | dd of="$work/flipped.ckpt" bs=1 seek=5000 conv=notrunc status=none
run 2 "$work/bad.log" $tiny --resume "$work/flipped.ckpt"
rc=$?
if [ $rc -ne 0 ] && grep -q 'cannot resume: .*CRC mismatch' "$work/bad.log"; then
  ok "a corrupt --resume file is refused: $(grep -m1 -o 'CRC mismatch.*' "$work/bad.log" | cut -c1-120)"
else
  bad "a corrupt --resume file: expected exit 1 and a CRC message (exit $rc)"; show "$work/bad.log"
fi
run 2 "$work/bad.log" --model tiny --epochs 2 --batch-size 128 --resume "$f"
rc=$?
if [ $rc -ne 0 ] && grep -q 'trained with --batch-size 256' "$work/bad.log"; then
  ok "another --batch-size is refused, naming the option"
else
  bad "resume with another --batch-size: expected exit 1 naming --batch-size (exit $rc)"; show "$work/bad.log"
fi
newest=$(ls "$work/u2" | tail -n 1)
truncate -s 1000 "$work/u2/$newest"
run 1 "$work/auto.log" $tiny --checkpoint-dir "$work/u2" --resume auto
rc=$?
if [ $rc -eq 0 ] && grep -q 'skipping a corrupt checkpoint' "$work/auto.log" && grep -q 'resumed from' "$work/auto.log"; then
  ok "--resume auto skips a truncated newest file with a warning and resumes from the one before"
else
  bad "--resume auto with a truncated newest file (exit $rc)"; show "$work/auto.log"
fi

# ---- 4. output paths: every place a save will write is checked before the first step, and refused clearly
# (exit 1, one message naming the option, no training step run on any rank)
mkdir -p "$work/adir" "$work/keep"
: >"$work/afile"
quick="--model tiny --epochs 1 --batch-size 256"
refused() {  # refused WHAT EXPECT ARGS...: the run must exit non-zero before its first step, saying EXPECT
  local what=$1 expect=$2
  shift 2
  run 2 "$work/out.log" $quick "$@"
  local rc=$?
  if [ $rc -ne 0 ] && grep -q -- "$expect" "$work/out.log" && ! grep -qE '^epoch 1[:/]' "$work/out.log"; then
    ok "$what: refused before the first step: $(grep -m1 -o -- "$expect.*" "$work/out.log" | cut -c1-90)"
  else
    bad "$what: expected exit 1 before any step with a message saying '$expect' (exit $rc)"; show "$work/out.log"
  fi
}
refused "--checkpoint-dir in a missing folder" "cannot create the folder" --checkpoint-dir "$work/missing/run"
refused "--checkpoint-dir naming a file" "is not a folder" --checkpoint-dir "$work/afile"
refused "--checkpoint-dir in a folder nobody can write (/proc)" "cannot create the folder" --checkpoint-dir /proc/run
refused "--checkpoint in a missing folder" "does not exist" --checkpoint "$work/missing/x.ckpt"
refused "--checkpoint naming a folder" "is a folder" --checkpoint "$work/adir"
refused "--checkpoint in a folder nobody can write (/proc)" "cannot be written" --checkpoint /proc/x.ckpt
refused "--checkpoint-dir ''" "is empty" --checkpoint-dir ''
refused "--checkpoint ''" "is empty" --checkpoint ''
refused "--resume ''" "is empty" --resume ''
# A fresh run (no --resume) into a folder that holds another run's checkpoints: refused, the files untouched.
cp "$work/e21/"ckpt-*.ckpt "$work/keep/" 2>/dev/null
before=$(cd "$work/keep" && md5sum ckpt-*.ckpt 2>/dev/null)
if [ -n "$before" ]; then
  refused "a fresh run into another run's --checkpoint-dir" "holds the checkpoints of another run" --checkpoint-dir "$work/keep"
  [ "$(cd "$work/keep" && md5sum ckpt-*.ckpt)" = "$before" ] && ok "... and that run's checkpoints are untouched" ||
    bad "a refused fresh run changed the checkpoints of the folder"
else
  bad "no checkpoints of the elastic run to test a fresh run against"
fi

# ---- invariant 13: outputs (another run's files, before the first step, a run that never recovers)
tests/lesson04/outputs-tests.sh "$tests" "$train" "${compare:-}" || bad "outputs (tests/lesson04/outputs-tests.sh, above)"
extras_end
