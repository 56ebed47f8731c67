#!/usr/bin/env bash
# tests/lesson05/run-tests.sh: lesson 05's checks beyond `make grade-solutions` (which runs the autograder on
# GRADE_NP ranks, one test per process): the whole autograder of the SOLUTION on 1 and 3 ranks (more ranks than
# cores run oversubscribed: scripts/launch.sh), then the program itself on 3 ranks for one epoch.
#
#   tests/lesson05/run-tests.sh BUILD/grade-solutions/test_lesson05 BUILD/solutions/05-syncbn/train
#
# LESSON05_WORLDS="1 3" chooses the world sizes (the default). World 2 and world 4 ran here too (2 + 11 s
# of this script's 26 s at load average 4, 8 + 42 s of 96 s at ~17) and proved nothing the others do not: world 2 is
# grade-solutions' world (the same tests, there one per process); the tests branch only on world == 1 (no peer
# to reduce with) and world > 1, and compare every result (forward, input and parameter gradients, running
# stats) with BN over the global batch, so a missing or doubled all-reduce, a count not summed across ranks or
# a biased variance differs on 3 ranks as on 4. World 3 is also the uneven one (odd, oversubscribed on 2 cores).
#
# Then the program keeps the last, short batch of the epoch (--keep-last-batch: PyTorch's drop_last=False) on
# 3 ranks (the shards padded), and on 4 ranks against 1 process: 5000 images in global batches of 1024 make 4
# full steps and a short one of 904 (226 per rank); SyncBN on 4 ranks trains what one process with plain BN
# trains on the same images, within 1e-6 of the largest parameter (lesson 04's elastic tolerance: the same
# sums in another order, nothing else), the short last step included.
#
#   tests/lesson05/run-tests.sh BUILD/grade-solutions/test_lesson05 BUILD/solutions/05-syncbn/train BUILD/tests/ckpt_compare
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 05 "$@"
: "${compare:?usage: $0 TEST_BINARY TRAIN_BINARY CKPT_COMPARE}"
log=$work/log
solution_on_worlds "$tests" "${LESSON05_WORLDS:-1 3}" 180 '^DDP \+ SyncBN on'
# The program: 3 ranks (an odd world), one epoch with its short last batch (5000 images padded to 5001: 1667 per
# rank, 52 batches of 32 and one of 3), and its report of what SyncBN cost (2 BN layers in tiny-bn: 4
# all-reduces per step).
if timeout --kill-after=5 120 scripts/launch.sh 3 "$train" --epochs 1 --batch-size 96 --keep-last-batch >"$log" 2>&1 &&
   grep -q '^syncbn: 4.0 all-reduces per step' "$log" && grep -q '53 steps per epoch' "$log" && grep -q '^final:' "$log"; then
  ok "the program on 3 ranks: $(grep -m1 '^syncbn:' "$log" | cut -c1-110)"
else
  bad "the program on 3 ranks"
  tail -n 15 "$log" | sed 's/^/   | /'
fi
# SyncBN on 4 ranks with a short last step = one process, plain BN, on the same images.
short="--dataset synthetic --model tiny-bn --epochs 1 --batch-size 1024 --warmup-epochs 0 --keep-last-batch --timeout 20"
if timeout --kill-after=5 120 scripts/launch.sh 4 "$train" $short --checkpoint-dir "$work/w4" >"$work/w4.log" 2>&1 &&
   timeout --kill-after=5 120 scripts/launch.sh 1 "$train" $short --checkpoint-dir "$work/w1" >"$work/w1.log" 2>&1 &&
   grep -q '5 steps per epoch' "$work/w4.log" && grep -q '5 steps per epoch' "$work/w1.log"; then
  same_model "4 ranks with SyncBN, last step 904 images (226 per rank), vs 1 process with BN" \
    "$work/w1/ckpt-00000005.ckpt" "$work/w4/ckpt-00000005.ckpt" 1e-6
else
  bad "the --keep-last-batch runs (4 ranks, 1 rank) failed or did not make 5 steps"
  tail -n 8 "$work/w4.log" "$work/w1.log" | sed 's/^/   | /'
fi
# ---- invariant 13: outputs (another run's files, before the first step, a run that never recovers)
tests/lesson05/outputs-tests.sh "$tests" "$train" "${compare:-}" || bad "outputs (tests/lesson05/outputs-tests.sh, above)"
extras_end
