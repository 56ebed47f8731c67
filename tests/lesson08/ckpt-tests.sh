#!/usr/bin/env bash
# tests/lesson08/ckpt-tests.sh: a pipeline's checkpoint (pipe_ckpt.c), on the SOLUTION's program; called by
# run-tests.sh:
#   a. 2 epochs on 2 ranks (2 stages, tiny-bn: BN statistics gathered too) and on 4 (2 stages x 2 replicas, the
#      BN-free tiny: each replica keeps its own BN statistics), saved as one lesson-04 file: lesson 06's program
#      evaluates it in one process and counts exactly the training run's last test accuracy;
#   b. epoch 1's checkpoint of the 4-rank run resumed (--resume) for epoch 2 on the same grid (2 x 2) = its 2
#      epochs straight: the two final checkpoints hold the same tensors bit for bit (tests/ckpt_compare.c), and
#      are the same bytes (cmp: the run state too);
#   a+b in one process (3 stages, every stage in the program): the same two checks;
#   a'. with PyTorch: the 2-stage file loads into tools/torch_models.py's tiny-bn through tools/ckpt_torch.py;
#   c. refusals, each an "error:" line and a non-zero exit: a checkpoint of another --width, a truncated one,
#      another --lr (another run), --save-every (saves are at epoch ends).
#
#   tests/lesson08/ckpt-tests.sh BUILD/grade-solutions/test_lesson08 BUILD/solutions/08-pipeline/train
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 08 "$@"
export KIT_PROGRESS=plain
build=$(dirname "$(dirname "$(dirname "$train")")")
infer=$build/solutions/06-inference/train
compare=$build/tests/ckpt_compare
field() { sed -n "s/^final: .*$1=\([^ ]*\).*/\1/p" "$2" | tail -n 1; }  # field NAME LOG
common=(--dataset synthetic --width 8 --batch-size 64 --micro-batches 4 --timeout 30)

# run NP LOG ARGS...: lesson 08's program on NP ranks.
run() {
  local np=$1 log=$2
  shift 2
  timeout --kill-after=5 240 scripts/launch.sh "$np" "$train" "${common[@]}" "$@" >"$log" 2>&1
}

# ---- a: lesson 06 reproduces the training run's accuracy. The 4-rank run keeps both epochs' files for b.
for case in "2 tiny-bn 0.01" "4 tiny 0.01"; do
  read -r np model lr <<<"$case"
  if [ "$np" = 2 ]; then save=(--checkpoint "$work/a2.ckpt"); else save=(--checkpoint-dir "$work/dir4" --keep 2); fi
  if ! run "$np" "$work/a$np.log" --model "$model" --lr "$lr" --stages 2 --epochs 2 "${save[@]}"; then
    bad "$np ranks, $model: training with ${save[0]} failed"; show "$work/a$np.log"; continue
  fi
  ck=$work/a2.ckpt
  [ "$np" = 4 ] && ck=$(ls "$work/dir4"/ckpt-*.ckpt | tail -n 1)
  acc=$(field test_acc "$work/a$np.log")
  want=$(python3 -c "print(round($acc * 1000))")
  if [ ! -x "$infer" ]; then
    echo "skip lesson 08: lesson 06's program $infer is not built (it needs libpng): checkpoint of $np ranks unchecked"
  elif timeout 120 "$infer" --dataset synthetic --model "$model" --width 8 --checkpoint "$ck" >"$work/i.log" 2>&1 &&
       [ "$(field correct "$work/i.log")" = "$want" ] && [ "$(field reproduced "$work/i.log")" = yes ]; then
    ok "checkpoint of $np ranks ($model, 2 stages x $((np / 2)) replica(s)): lesson 06 counts $want correct, as the training (test_acc $acc)"
  else
    bad "checkpoint of $np ranks ($model): lesson 06 must count $want correct (test_acc $acc)"; show "$work/i.log"
  fi
done

# ---- a (PyTorch): the 2-stage file goes into tools/torch_models.py's tiny-bn through tools/ckpt_torch.py, layer by
# layer, as lesson 04's files do (what that mapping computes is checked against the kit by tests/test_ckpt_torch.py)
if [ -s "$work/a2.ckpt" ]; then
  if ! python3 -c 'import torch' 2>/dev/null; then
    echo "skip lesson 08: the checkpoint into PyTorch: torch is not installed (pip install torch)"
  elif out=$(python3 - "$work/a2.ckpt" 2>&1 <<'PY'
import sys
sys.path.insert(0, "tools")
import torch
from ckpt_read import read_checkpoint
from ckpt_torch import load_into
from torch_models import build
ck = read_checkpoint(sys.argv[1])
model = build("tiny-bn", w=8)
load_into(model, ck)
sd = model.state_dict()
n = sum(int(v.numel()) for k, v in sd.items() if not k.endswith("num_batches_tracked"))
want = sum(int(a.size) for g in ("params", "buffers") for a in ck[g].values())
assert n == want, f"PyTorch's tiny-bn holds {n} floats, the checkpoint {want}"
print(f"{len(ck['params'])} parameter tensors, {n} floats")
PY
  ); then ok "the 2-stage checkpoint loads into PyTorch's tiny-bn (tools/ckpt_torch.py): $out"
  else bad "the 2-stage checkpoint does not load into PyTorch: $out"; fi
fi

# ---- b: epoch 1's checkpoint of the 4-rank run, resumed on the same grid for epoch 2 = the 2 epochs straight
# (a run of --epochs 1 would be another run: its learning rate decays to 0 within one epoch)
first=$(ls "$work/dir4"/ckpt-*.ckpt 2>/dev/null | head -n 1)
straight=$(ls "$work/dir4"/ckpt-*.ckpt 2>/dev/null | tail -n 1)
if [ -z "$first" ] || [ "$first" = "$straight" ]; then
  bad "the 4-rank run did not leave a checkpoint per epoch in --checkpoint-dir"; ls "$work/dir4" 2>&1 | sed 's/^/   | /'
elif ! run 4 "$work/b.log" --model tiny --lr 0.01 --stages 2 --epochs 2 --checkpoint "$work/resumed.ckpt" \
       --resume "$first"; then
  bad "resume from $first on 4 ranks failed"; show "$work/b.log"
else
  if [ "$(grep -c '^epoch 1:' "$work/b.log")" = 0 ] && grep -q "^resumed from .*: step $(( 10#$(basename "$first" .ckpt | cut -d- -f2) ))," "$work/b.log"; then
    ok "resumed at $(grep -m1 -o 'step [0-9]*, epoch 2 of 2 next' "$work/b.log"), epoch 1 not trained again"
  else bad "the resumed run must say where it resumed and train epoch 2 only"; show "$work/b.log"; fi
  if [ -x "$compare" ]; then same_model "epoch 1 + resume for epoch 2 (2 x 2) vs 2 epochs straight" "$straight" "$work/resumed.ckpt"
  else echo "skip lesson 08: $compare not built: tensors not compared"; fi
  if cmp -s "$straight" "$work/resumed.ckpt"; then ok "epoch 1 + resume for epoch 2: the two checkpoint files are the same bytes"
  else bad "epoch 1 + resume for epoch 2: the checkpoint files differ ($(cmp "$straight" "$work/resumed.ckpt" | head -n 1))"; fi
fi

# ---- a + b in one process (every stage here, 3 stages): the same file, the same exact resume
one=(--dataset synthetic --model tiny-bn --width 8 --batch-size 64 --lr 0.01 --stages 3 --epochs 2)
if ! timeout 240 "$train" "${one[@]}" --checkpoint-dir "$work/one" --keep 2 >"$work/one.log" 2>&1 ||
   ! timeout 240 "$train" "${one[@]}" --checkpoint "$work/one-resumed.ckpt" \
       --resume "$(ls "$work/one"/ckpt-*.ckpt | head -n 1)" >"$work/one-resumed.log" 2>&1; then
  bad "one process, 3 stages: training or resuming with a checkpoint failed"; show "$work/one.log"; show "$work/one-resumed.log"
else
  last=$(ls "$work/one"/ckpt-*.ckpt | tail -n 1)
  want=$(python3 -c "print(round($(field test_acc "$work/one.log") * 1000))")
  if [ ! -x "$infer" ]; then echo "skip lesson 08: lesson 06's program not built: one-process checkpoint unchecked"
  elif timeout 120 "$infer" --dataset synthetic --model tiny-bn --width 8 --checkpoint "$last" >"$work/i.log" 2>&1 &&
       [ "$(field correct "$work/i.log")" = "$want" ] && [ "$(field reproduced "$work/i.log")" = yes ]; then
    ok "one process, 3 stages: lesson 06 counts $want correct, as the training"
  else bad "one process, 3 stages: lesson 06 must count $want correct"; show "$work/i.log"; fi
  if cmp -s "$last" "$work/one-resumed.ckpt"; then ok "one process, 3 stages: epoch 1 + resume = 2 epochs straight, the same bytes"
  else bad "one process, 3 stages: the resumed run's checkpoint differs from the straight run's"; fi
fi

# ---- c: refusals
refused() {  # WHAT LOG PATTERN: a non-zero exit (already known) with an error line matching PATTERN
  if grep -q "error:.*$3" "$2"; then ok "$1 refused: $(grep -m1 -o "error:.*$3.*" "$2" | cut -c1-140)"
  else bad "$1: no clear error matching '$3'"; show "$2"; fi
}
if run 2 "$work/c1.log" --model tiny-bn --width 16 --lr 0.01 --stages 2 --epochs 2 --resume "$work/a2.ckpt"; then
  bad "a checkpoint of --width 8 resumed with --width 16"
else refused "a checkpoint of --width 8 resumed with --width 16" "$work/c1.log" "width"; fi
head -c 500 "$work/a2.ckpt" >"$work/cut.ckpt"
if run 2 "$work/c2.log" --model tiny-bn --lr 0.01 --stages 2 --epochs 2 --resume "$work/cut.ckpt"; then
  bad "a truncated checkpoint was resumed"
else refused "a truncated checkpoint" "$work/c2.log" "cannot resume"; fi
if run 2 "$work/c3.log" --model tiny-bn --lr 0.02 --stages 2 --epochs 2 --resume "$work/a2.ckpt"; then
  bad "a checkpoint of --lr 0.01 resumed with --lr 0.02"
else refused "a checkpoint of another --lr" "$work/c3.log" "lr"; fi
if run 2 "$work/c4.log" --model tiny-bn --stages 2 --epochs 1 --checkpoint "$work/x.ckpt" --save-every 10; then
  bad "--save-every accepted (lesson 08 saves at epoch ends only)"
else refused "--save-every" "$work/c4.log" "save-every"; fi
extras_end
