#!/usr/bin/env bash
# tests/lesson06/run-tests.sh: lesson 06's checks beyond `make grade-solutions` (whose autograder makes its own
# checkpoint in-process): the real programs, end to end.
#   1. checkpoints written by lesson 04's program on 1 rank and on 2 ranks (the CPU, MPI backend; one epoch at a low
#      learning rate, so that the model still gets a third or more of the test set wrong): lesson 06's
#      program reproduces each run's final test accuracy exactly (the same correct count), and says so on its
#      final line: the 1-rank checkpoint with evaluation batches of 64, 1, 7 and 333 (short last batches of 40,
#      -, 6 and 1), the 2-rank one with batches of 7;
#   2. a checkpoint saved mid-epoch (--stop-at) has no reference, and the program says so instead of comparing;
#   3. refusals, each a clear "error:" line and exit status 1 (never a crash): a truncated checkpoint, another
#      --width, another --dataset (when Fashion-MNIST is installed), a gray PNG, a PNG of another size, a raw file
#      of another size, a directory as --image, --confusion to a directory or a missing folder (before any work);
#      the per-class report names the classes; a colour PNG of the right size is classified with a top-5;
#   4. the image reader against files written by PIL and by hand (tests/lesson06/test_images.py: gamma chunks,
#      16 bits, palettes, alpha, an 8000 x 8000 header).
#
#   tests/lesson06/run-tests.sh BUILD/grade-solutions/test_lesson06 BUILD/solutions/06-inference/train
#
# Lesson 04's program is BUILD/solutions/04-checkpoint/train (built by make test-lesson06 when Open MPI is found;
# without it parts 1-2 are skipped, saying so).
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 06 "$@"
infer=$train
train04=$(dirname "$(dirname "$infer")")/04-checkpoint/train
model="--dataset synthetic --model tiny-bn --width 8"
field() { sed -n "s/^final: .*$1=\([^ ]*\).*/\1/p" "$2" | tail -n 1; }  # field NAME LOG

# infer LOG ARGS...: lesson 06's program; returns its exit status.
infer() {
  local out=$1
  shift
  timeout --kill-after=5 120 "$infer" "$@" >"$out" 2>&1
}

# ---- 1 + 2: checkpoints of lesson 04's program
if [ ! -x "$train04" ]; then
  echo "skip lesson 06: checkpoints of lesson 04's program: $train04 not built (Open MPI: make deps)"
else
  for np in 1 2; do
    ck=$work/np$np.ckpt
    if ! timeout --kill-after=5 180 scripts/launch.sh "$np" "$train04" $model --epochs 1 --lr 0.03 --batch-size 64 \
         --timeout 20 --checkpoint "$ck" >"$work/train$np.log" 2>&1; then
      bad "lesson 04's program on $np rank(s) did not finish"; show "$work/train$np.log"; continue
    fi
    acc=$(field test_acc "$work/train$np.log")
    want=$(python3 -c "print(round($acc * 1000))")
    # Every batch size on one checkpoint only: inference is one process whatever the training's world, and the
    # file holds the same weights and running stats either way, so the short-last-batch cases are about the
    # evaluation loop and the 1-rank checkpoint catches their bugs; the 2-rank one proves that a checkpoint of
    # several ranks (its eval sharded across them in training) reproduces too, with a short last batch (7).
    # (All four ran on both before: 3 more runs of lesson 06's program for no other bug caught.)
    batches="64 1 7 333"
    [ "$np" = 2 ] && batches=7
    for b in $batches; do
      if infer "$work/infer.log" $model --checkpoint "$ck" --batch-size "$b" && \
         [ "$(field correct "$work/infer.log")" = "$want" ] && [ "$(field reproduced "$work/infer.log")" = yes ]; then
        ok "checkpoint of $np rank(s) (test_acc $acc): $want correct with evaluation batches of $b"
      else
        bad "checkpoint of $np rank(s): want $want correct (test_acc $acc), batch $b"; show "$work/infer.log"
      fi
    done
  done
  timeout --kill-after=5 180 scripts/launch.sh 2 "$train04" $model --epochs 2 --batch-size 64 --timeout 20 \
    --checkpoint "$work/mid.ckpt" --stop-at 100 >"$work/mid.log" 2>&1
  if infer "$work/infer.log" $model --checkpoint "$work/mid.ckpt" && [ "$(field reproduced "$work/infer.log")" = n/a ] \
     && grep -q '^reference: none' "$work/infer.log"; then
    ok "a checkpoint saved mid-epoch (step 100): no reference claimed"
  else
    bad "a checkpoint saved mid-epoch must say it has no reference"; show "$work/infer.log"
  fi
fi

# ---- 3: refusals and one image, through the program (a checkpoint of the kit's API: the autograder's own way)
ck=$work/np1.ckpt
if [ ! -s "$ck" ]; then
  echo "skip lesson 06: refusals through the program: no checkpoint (lesson 04's program is needed to write one)"
else
  head -c 300 "$ck" >"$work/cut.ckpt"
  python3 - "$work" <<'PY'
import struct, sys, zlib
def png(path, w, h, channels):
    kind = {1: 0, 3: 2}[channels]
    rows = b"".join(b"\0" + bytes((x * 7 + y * 3 + c * 50) % 256 for x in range(w) for c in range(channels)) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, kind, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
d = sys.argv[1]
png(d + "/rgb.png", 32, 32, 3); png(d + "/gray.png", 32, 32, 1); png(d + "/small.png", 16, 16, 3)
open(d + "/one-channel.raw", "wb").write(bytes(1024))
PY
  refuse() {  # refuse WHAT PATTERN ARGS...
    local what=$1 pattern=$2
    shift 2
    infer "$work/refuse.log" "$@"
    local rc=$?
    if [ $rc -eq 1 ] && grep -q '^error: ' "$work/refuse.log" && grep -qi -- "$pattern" "$work/refuse.log" && \
       ! grep -q 9223372036854775807 "$work/refuse.log"; then
      ok "refused $what: $(grep -m1 '^error: ' "$work/refuse.log" | cut -c1-150)"
    else
      bad "$what: want exit 1 and an error naming '$pattern', got exit $rc"; show "$work/refuse.log"
    fi
  }
  refuse "a truncated checkpoint" "truncated" $model --checkpoint "$work/cut.ckpt"
  refuse "another --width" "width 8" --dataset synthetic --model tiny-bn --width 16 --checkpoint "$ck"
  if [ -d /usr/share/datasets/fashion-mnist ]; then
    refuse "another --dataset" "pass --dataset synthetic" --dataset fashion-mnist --data-dir /usr/share/datasets/fashion-mnist \
      --model tiny-bn --width 8 --checkpoint "$ck"
  else
    echo "skip lesson 06: another --dataset: Fashion-MNIST is not installed (dataset-fashion-mnist)"
  fi
  refuse "a gray PNG for a colour model" "1 channel" $model --checkpoint "$ck" --image "$work/gray.png"
  refuse "a 16x16 PNG for a 32x32 model" "16x16" $model --checkpoint "$ck" --image "$work/small.png"
  refuse "a raw file of one channel" "size of a one-channel image" $model --checkpoint "$ck" --image "$work/one-channel.raw"
  refuse "--image of a directory" "$work: a directory, not an image file" $model --checkpoint "$ck" --image "$work"
  # --confusion is checked before anything is loaded or evaluated: no checkpoint line, no evaluation line.
  refuse "--confusion to a directory" "confusion $work: a directory" $model --checkpoint "$ck" --confusion "$work"
  refuse "--confusion in a missing folder" "cannot write there: No such file" $model --checkpoint "$ck" \
    --confusion "$work/no/such/folder/confusion.csv"
  if grep -q '^checkpoint: \|^evaluation: ' "$work/refuse.log"; then
    bad "--confusion to a bad path must be refused before the work starts"; show "$work/refuse.log"
  fi
  # The class names come from the kit's dataset table: the synthetic set's classes are patterns.
  if infer "$work/names.log" $model --checkpoint "$ck" --confusion "$work/confusion.csv" && \
     grep -q '^    3 pattern 3 ' "$work/names.log" && [ "$(wc -l <"$work/confusion.csv")" = 11 ]; then
    ok "per-class lines name the dataset's classes (pattern 0..9), the confusion CSV has 1 + 10 rows"
  else
    bad "per-class lines must name the classes and --confusion write the CSV"; show "$work/names.log" 14
  fi
  if infer "$work/img.log" $model --checkpoint "$ck" --image "$work/rgb.png" && \
     [ "$(grep -cE '^  [1-5]\. ' "$work/img.log")" = 5 ] && grep -q '^predict: ' "$work/img.log"; then
    ok "a 32x32 colour PNG: $(grep '^predict: ' "$work/img.log")"
  else
    bad "a 32x32 colour PNG must be classified with a top-5"; show "$work/img.log"
  fi
fi
# ---- 4: the image reader against files of other encoders (PIL, and PNG chunks written by hand)
probe=$(dirname "$(dirname "$(dirname "$infer")")")/tests/lesson06/image_probe
if [ ! -x "$probe" ]; then
  echo "skip lesson 06: the image reader against PIL: $probe not built (libpng: make deps)"
elif ! python3 tests/lesson06/test_images.py "$probe"; then
  failed=1
fi
# ---- invariant 13: --confusion never replaces a checkpoint
tests/lesson06/outputs-tests.sh "$tests" "$train" "${compare:-}" || bad "outputs (tests/lesson06/outputs-tests.sh, above)"
extras_end
