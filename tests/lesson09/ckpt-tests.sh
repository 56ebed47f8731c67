#!/usr/bin/env bash
# tests/lesson09/ckpt-tests.sh: the sharded checkpoint (solutions/09-zero/zero_ckpt.c), on the SOLUTION's
# program; called by run-tests.sh:
#   a. round trip, same world: 3 ranks, --zero 3 (uneven shards), tiny-bn, 2 epochs, a set per epoch; epoch 1's
#      set resumed on 3 ranks for epoch 2 = the 2 epochs straight: every shard file and the manifest are the same
#      bytes, and so are the two consolidated files (--consolidate);
#   a (stages 0-2): the same round trip on 2 ranks cut into 2 units, where the parameters are whole on every rank;
#   a'. lesson 06's program evaluates the consolidated file in one process and counts exactly the training run's
#      last test accuracy;
#   b. reshard 3 -> 2 -> 1 (BN-free tiny, 3 epochs, --zero 3 -> 1 -> 0): the finished 3-rank set loaded onto 2
#      ranks and onto 1 holds the same model bit for bit (consolidated right after the load, nothing trained);
#      a run saved on 3 ranks 6 steps before its end, continued on 2 ranks for 3 steps, then on 1 rank to the end,
#      ends within 1e-6 of the largest parameter of the 3-rank run (lesson 04's elastic tolerance: the same
#      gradients summed in another order for those 6 steps, which changes the float32 rounding and nothing else);
#   c. kill -9 drill: rank 1 dies after writing its shard of epoch 2's set, before the manifest; the folder holds
#      epoch 1's set (valid) and a step folder without a manifest; --resume auto skips the unfinished one with a
#      warning, resumes from epoch 1 and ends with the bytes of the straight run (a);
#   c'. kill -9 of rank 1 at a random moment of a run that saves after every step: --resume auto resumes from
#      whatever set is valid and ends with the straight run's model, bit for bit;
#   d. a corrupted shard (one byte flipped): --resume of that set is refused with an error naming the file;
#      --resume auto skips it with a warning naming the file and resumes from the set before;
#   e. refusals, each an "error:" line and a non-zero exit: --checkpoint FILE (sets only), a fresh run into a
#      folder holding another run's sets, another --lr, another --width.
#
#   tests/lesson09/ckpt-tests.sh BUILD/grade-solutions/test_lesson09 BUILD/solutions/09-zero/train BUILD/tests/ckpt_compare
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 09 "$@"
export KIT_PROGRESS=plain
build=$(dirname "$(dirname "$(dirname "$train")")")
infer=$build/solutions/06-inference/train
[ -n "$compare" ] || compare=$build/tests/ckpt_compare
field() { sed -n "s/^final: .*$1=\([^ ]*\).*/\1/p" "$2" | tail -n 1; }  # field NAME LOG
sets() { ls -d "$1"/step-* 2>/dev/null; }                                # the step folders of DIR, oldest first
step_of() { local b; b=$(basename "$1"); echo $((10#${b#step-})); }       # DIR/step-00000040 -> 40
common=(--dataset synthetic --width 8 --batch-size 96 --timeout 30)

# run NP LOG ARGS...: lesson 09's program on NP ranks, its output in LOG; returns its exit status.
run() {
  local np=$1 log=$2
  shift 2
  timeout --kill-after=5 240 scripts/launch.sh "$np" "$train" "${common[@]}" "$@" >"$log" 2>&1
}
# same_files WHAT DIR_A DIR_B: every file of set A has the same bytes in set B, and B has no other file.
same_files() {
  local what=$1 a=$2 b=$3 f diff=""
  for f in "$a"/*; do cmp -s "$f" "$b/$(basename "$f")" || diff="$diff $(basename "$f")"; done
  [ "$(ls "$a" | wc -l)" = "$(ls "$b" | wc -l)" ] || diff="$diff (not the same files)"
  if [ -z "$diff" ] && [ -n "$(ls "$a")" ]; then ok "$what: the $(ls "$a" | wc -l) files of the set are the same bytes"
  else bad "$what: the sets differ:${diff:- empty}"; ls -l "$a" "$b" 2>&1 | sed 's/^/   | /'; fi
}

# ---- a: round trip on the same world, bit for bit
bn=(--model tiny-bn --lr 0.02 --epochs 2 --zero 3)
if ! run 3 "$work/a.log" "${bn[@]}" --checkpoint-dir "$work/a" --keep 2 --consolidate "$work/a.ckpt"; then
  bad "3 ranks, --zero 3: training with --checkpoint-dir failed"; show "$work/a.log"; extras_end
fi
mapfile -t a_sets < <(sets "$work/a")
if [ "${#a_sets[@]}" != 2 ] || [ ! -s "${a_sets[1]}/manifest" ]; then
  bad "3 ranks: expected a set per epoch in --checkpoint-dir, found: ${a_sets[*]}"; extras_end
fi
ok "3 ranks, --zero 3: $(ls "${a_sets[1]}" | xargs) in $(basename "${a_sets[1]}")"
first=${a_sets[0]} straight=${a_sets[1]}
if run 3 "$work/b.log" "${bn[@]}" --checkpoint-dir "$work/b" --resume "$first" --consolidate "$work/b.ckpt" &&
   grep -q "^resumed from $first: step $(step_of "$first")" "$work/b.log" && ! grep -q '^epoch 1:' "$work/b.log"; then
  ok "resumed from $(basename "$first") on 3 ranks: epoch 1 not trained again"
  same_files "epoch 1 + resume for epoch 2 vs 2 epochs straight" "$straight" "$work/b/$(basename "$straight")"
  if cmp -s "$work/a.ckpt" "$work/b.ckpt"; then ok "... and the two consolidated files are the same bytes"
  else bad "the consolidated files of the straight and the resumed run differ"; fi
else
  bad "resume from $first on 3 ranks failed, or trained epoch 1 again"; show "$work/b.log"
fi

# ---- a, the other stages: 2 ranks, 2 units; where the state lives differs (full parameters, momentum shards),
# the round trip must not
for zero in 0 1 2; do
  st=(--model tiny-bn --lr 0.02 --epochs 2 --zero "$zero" --units 2)
  if run 2 "$work/z$zero.log" "${st[@]}" --checkpoint-dir "$work/z$zero" --keep 2 &&
     e1=$(sets "$work/z$zero" | head -n 1) && e2=$(sets "$work/z$zero" | tail -n 1) && [ "$e1" != "$e2" ] &&
     run 2 "$work/y$zero.log" "${st[@]}" --checkpoint-dir "$work/y$zero" --resume "$e1"; then
    same_files "--zero $zero, 2 ranks, 2 units: epoch 1 + resume vs straight" "$e2" "$work/y$zero/$(basename "$e2")"
  else bad "--zero $zero on 2 ranks: training or resuming failed"; show "$work/z$zero.log" 4; show "$work/y$zero.log"; fi
done

# ---- a': lesson 06 counts the training run's last accuracy on the consolidated file
acc=$(field test_acc "$work/a.log")
if [ ! -x "$infer" ]; then
  echo "skip lesson 09: lesson 06's program $infer is not built (it needs libpng): the consolidated file unchecked"
elif timeout 120 "$infer" --dataset synthetic --model tiny-bn --width 8 --checkpoint "$work/a.ckpt" >"$work/i.log" 2>&1 &&
     [ "$(field reproduced "$work/i.log")" = yes ] &&
     [ "$(field correct "$work/i.log")" = "$(python3 -c "print(round($acc * $(field count "$work/i.log")))")" ]; then
  ok "consolidated (3 ranks, --zero 3): lesson 06 counts $(field correct "$work/i.log") correct of $(field count "$work/i.log"), as the training (test_acc $acc)"
else
  bad "consolidated file: lesson 06 must count the training's test_acc $acc exactly"; show "$work/i.log"
fi

# ---- b: reshard 3 -> 2 -> 1
tiny=(--model tiny --lr 0.02 --epochs 3)
if ! run 3 "$work/s.log" "${tiny[@]}" --zero 3 --checkpoint-dir "$work/s" --keep 3 --consolidate "$work/s.ckpt"; then
  bad "reshard: the 3-rank run failed"; show "$work/s.log"; extras_end
fi
last=$(sets "$work/s" | tail -n 1)
total=$(step_of "$last")
for to in "2 1" "1 0"; do  # the finished set loaded on fewer ranks: nothing left to train, consolidated at once
  read -r np zero <<<"$to"
  if run "$np" "$work/l$np.log" "${tiny[@]}" --zero "$zero" --resume "$last" --consolidate "$work/l$np.ckpt" &&
     grep -q '^resumed from' "$work/l$np.log"; then
    same_model "the 3-rank set (--zero 3) loaded onto $np rank(s) (--zero $zero)" "$work/s.ckpt" "$work/l$np.ckpt"
  else bad "the 3-rank set loaded onto $np rank(s) failed"; show "$work/l$np.log"; fi
done
if run 3 "$work/r3.log" "${tiny[@]}" --zero 3 --checkpoint-dir "$work/r" --stop-at $((total - 6)) &&
   run 2 "$work/r2.log" "${tiny[@]}" --zero 1 --checkpoint-dir "$work/r" --resume auto --stop-at $((total - 3)) &&
   run 1 "$work/r1.log" "${tiny[@]}" --zero 0 --checkpoint-dir "$work/r" --resume auto --consolidate "$work/r.ckpt"; then
  if grep -q "saved by 3 ranks, now 2" "$work/r2.log" && grep -q "saved by 2 ranks, now 1" "$work/r1.log"; then
    ok "saved on 3 ranks at step $((total - 6)), continued on 2 to step $((total - 3)), then on 1 to step $total"
  else bad "the resumed runs must say which world saved the set"; show "$work/r2.log" 4; show "$work/r1.log" 4; fi
  same_model "3 -> 2 -> 1 ranks (6 steps resharded) vs 3 ranks straight" "$work/s.ckpt" "$work/r.ckpt" 1e-6
else
  bad "reshard 3 -> 2 -> 1: a run failed"; show "$work/r3.log" 4; show "$work/r2.log" 4; show "$work/r1.log"
fi

# ---- c: kill -9 of rank 1 in the middle of epoch 2's save (its shard written, the manifest not yet)
ZERO_CKPT_DRILL_KILL_RANK=1 ZERO_CKPT_DRILL_KILL_STEP=$(step_of "$straight") \
  run 3 "$work/k.log" "${bn[@]}" --checkpoint-dir "$work/k" --keep 2
rc=$?
if [ $rc -eq 0 ] || [ -e "$work/k/$(basename "$straight")/manifest" ] || [ ! -s "$work/k/$(basename "$first")/manifest" ]; then
  bad "kill -9 drill: expected a dead job, epoch 1's set and a folder without manifest (exit $rc)"
  ls -R "$work/k" 2>&1 | sed 's/^/   | /'
else
  ok "kill -9 of rank 1 during the save of step $(step_of "$straight"): exit $rc, $(ls "$work/k/$(basename "$straight")" | wc -l) shard(s) there, no manifest"
  if run 3 "$work/k2.log" "${bn[@]}" --checkpoint-dir "$work/k" --keep 2 --resume auto &&
     grep -q "warning: skipping .*$(basename "$straight"): no manifest" "$work/k2.log" &&
     grep -q "^resumed from .*$(basename "$first")" "$work/k2.log"; then
    ok "--resume auto skipped the unfinished set and resumed from $(basename "$first")"
    same_files "after the kill: resumed vs straight" "$straight" "$work/k/$(basename "$straight")"
  else bad "--resume auto after the kill"; show "$work/k2.log"; fi
fi

# ---- c': kill -9 of rank 1 at a random moment while a set is saved after every step (--save-every 1): whatever
# it hit (a step, a shard, the manifest, a prune), --resume auto finds a valid set and the run ends with the
# straight run's model bit for bit (a mid-epoch set resumes exactly: lesson 04's position and random state)
scripts/launch.sh 3 "$train" "${common[@]}" "${bn[@]}" --checkpoint-dir "$work/k3" --keep 2 --save-every 1 >"$work/k3.log" 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do  # until two sets exist: saves are under way
  [ "$(sets "$work/k3" | wc -l)" -ge 2 ] && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.05
done
sleep "0.$((RANDOM % 5))"  # a random moment among the saves
victim=$(pgrep -P "$launcher" -f "$train" | sort -n | sed -n 2p)
[ -n "$victim" ] && kill -9 "$victim"
wait "$launcher"
rc=$?
if [ -z "$victim" ] || [ $rc -eq 0 ]; then
  bad "kill -9 at a random moment: the job ended before the kill (exit $rc, victim '${victim}')"; show "$work/k3.log"
elif run 3 "$work/k4.log" "${bn[@]}" --checkpoint-dir "$work/k3" --keep 2 --resume auto --consolidate "$work/k3.ckpt" &&
     grep -q '^resumed from' "$work/k4.log"; then
  ok "kill -9 of rank 1 at a random moment (exit $rc): $(grep -m1 -o 'resumed from .*: step [0-9]*' "$work/k4.log" | sed "s|$work/||")"
  same_model "... resumed to the end vs the straight run" "$work/a.ckpt" "$work/k3.ckpt"
else
  bad "kill -9 at a random moment: --resume auto did not resume and finish"; show "$work/k4.log"
fi

# ---- d: one byte flipped in a shard of the newest set
cp -r "$work/a" "$work/d"
victim=$work/d/$(basename "$straight")/shard-1-of-3.ckpt
printf '\x01' | dd of="$victim" bs=1 seek=300 conv=notrunc status=none
if run 3 "$work/d1.log" "${bn[@]}" --resume "$work/d/$(basename "$straight")"; then
  bad "a set with a corrupted shard was resumed"
elif grep -q "error:.*shard-1-of-3.ckpt.*corrupt" "$work/d1.log"; then
  ok "a corrupted shard refused: $(grep -m1 -o 'error:.*' "$work/d1.log" | sed "s|$work/||g" | cut -c1-150)"
else bad "a corrupted shard: no error naming the file"; show "$work/d1.log"; fi
if run 3 "$work/d2.log" "${bn[@]}" --checkpoint-dir "$work/d" --resume auto &&
   grep -q "warning: skipping a corrupt set: .*shard-1-of-3.ckpt" "$work/d2.log" &&
   grep -q "^resumed from .*$(basename "$first")" "$work/d2.log"; then
  ok "--resume auto skipped the corrupted set (naming the shard) and resumed from $(basename "$first")"
else bad "--resume auto with a corrupted newest set"; show "$work/d2.log"; fi

# ---- e: refusals
refused() {  # WHAT LOG PATTERN: a non-zero exit (already known) with an error line matching PATTERN
  if grep -q "error:.*$3" "$2"; then ok "$1 refused: $(grep -m1 -o "error:.*$3.*" "$2" | sed "s|$work/||g" | cut -c1-140)"
  else bad "$1: no clear error matching '$3'"; show "$2"; fi
}
if run 3 "$work/e1.log" "${bn[@]}" --checkpoint "$work/x.ckpt"; then bad "--checkpoint FILE accepted"
else refused "--checkpoint FILE" "$work/e1.log" "sharded"; fi
if run 3 "$work/e2.log" "${bn[@]}" --checkpoint-dir "$work/a"; then bad "a fresh run into another run's sets"
else refused "a fresh run into another run's --checkpoint-dir" "$work/e2.log" "holds the sets of another run"; fi
if run 3 "$work/e3.log" --model tiny-bn --lr 0.03 --epochs 2 --zero 3 --resume "$first"; then bad "another --lr resumed"
else refused "a set of --lr 0.02 resumed with --lr 0.03" "$work/e3.log" "lr"; fi
if run 3 "$work/e4.log" "${bn[@]}" --width 16 --resume "$first"; then bad "another --width resumed"
else refused "a set of --width 8 resumed with --width 16" "$work/e4.log" "width"; fi
extras_end
