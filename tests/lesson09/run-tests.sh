#!/usr/bin/env bash
# tests/lesson09/run-tests.sh: lesson 09's checks beyond the autograder (`make test-lesson09`), on the SOLUTION:
#   - the whole autograder on other world sizes (LESSON09_WORLDS, default "1": 1 alone, without mpirun; the
#     grade itself runs on 3, whose split covers 2 and 1). LESSON09_WORLDS="1 4" adds an even, oversubscribed
#     world of 4: 218 s more at load average ~15 on 2 cores, so it is not in `make test`;
#   - the program on 3 ranks at every stage: stage 1 trains exactly stage 0's numbers (the parameters' CRC-32,
#     gathered from the units, is printed at the end), stages 2-3 the same final line within a tolerance, and
#     --recompute exactly the numbers without it (BN included: tiny-bn);
#   - the program on 1, 2 and 3 ranks (stage 3, BN-free `tiny`, the same global batch): the same final line within
#     a tolerance: a world changes only the order of some float32 sums;
#   - --memory prints the table by part; a bad --zero or --units stops at once with the rule;
#   - the sharded checkpoint: tests/lesson09/ckpt-tests.sh (round trip, reshard, kill -9, corruption);
#   - with a GPU: stage 3 on it (one rank). Without one it says so and skips (the path is compiled).
#
#   tests/lesson09/run-tests.sh BUILD/grade-solutions/test_lesson09 BUILD/solutions/09-zero/train [BUILD/tests/ckpt_compare]
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 09 "$@"
export KIT_PROGRESS=plain
log=$work/run.log
# 48 images a step: 16 per rank on 3, 24 on 2; 104 steps of the synthetic set.
args=(--dataset synthetic --epochs 1 --batch-size 48)

# The autograder runs a process group per rank for all its tests: a generous timeout, since on a loaded machine
# one rank may compute alone for long.
KIT_PG_TIMEOUT=60 solution_on_worlds "$tests" "${LESSON09_WORLDS:-1}" 900 '^stage 1'

# run NP ARGS...: the program on NP ranks (1: without mpirun) with the common arguments, its output in $log.
run() {
  local np=$1; shift
  if [ "$np" = 1 ]; then timeout 300 "$train" "${args[@]}" "$@" >"$log" 2>&1
  else timeout 300 scripts/launch.sh "$np" "$train" "${args[@]}" "$@" >"$log" 2>&1; fi
}

# "TRAIN_LOSS CRC" of one run (NP then the options), or the reason it failed (status 1).
result_of() {
  run "$@"
  local rc=$?
  [ $rc -eq 0 ] || { echo "exit $rc: $(grep -m1 -E 'error|HINT' "$log")"; return 1; }
  [ "$(grep -c '^final:' "$log")" = 1 ] || { echo "$(grep -c '^final:' "$log") final lines (one rank must report)"; return 1; }
  local loss crc
  loss=$(grep '^final:' "$log" | grep -oE 'train_loss=[0-9.]+' | cut -d= -f2)
  crc=$(grep -m1 -oE 'crc32=[0-9a-f]+' "$log" | cut -d= -f2)
  if [ -z "$loss" ] || [ -z "$crc" ]; then echo "no train_loss or no crc32 line"; return 1; fi
  echo "$loss $crc"
}

# close A B: the final train losses A and B (4 decimals as printed) agree within 1e-3 of A. The runs compared do
# the same arithmetic but for the order of some float32 sums (a reduce-scatter's against an all-reduce's, a
# rank's share of the batch): a relative 1e-7 per step, which 104 steps of SGD leave orders of magnitude below
# 1e-3 (measured: equal as printed); a wrong step (a summed gradient, a stale shard) changes the loss in the
# first digits.
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * a) }'; }

# ---- stages 0-3 on 3 ranks (tiny-bn)
declare -A loss crc
for z in 0 1 2 3; do
  if out=$(result_of 3 --model tiny-bn --zero "$z"); then read -r loss[$z] crc[$z] <<<"$out"
  else bad "--zero $z on 3 ranks: $out"; show "$log"; loss[$z]=; fi
done
if [ -n "${loss[0]}" ] && [ -n "${loss[1]}" ]; then
  if [ "${crc[0]}" = "${crc[1]}" ]; then ok "3 ranks: stage 1 trained stage 0's parameters bit for bit (crc32 ${crc[1]})"
  else bad "3 ranks: stage 1's parameters (crc32 ${crc[1]}) are not stage 0's (${crc[0]}): the same all-reduce and update must give the same bits"; fi
fi
for z in 2 3; do
  if [ -z "${loss[0]}" ] || [ -z "${loss[$z]}" ]; then continue; fi
  if close "${loss[0]}" "${loss[$z]}"; then ok "3 ranks: stage $z's final train_loss ${loss[$z]} = stage 0's ${loss[0]} (within 1e-3)"
  else bad "3 ranks: stage $z's final train_loss ${loss[$z]}, stage 0's ${loss[0]}"; fi
done

# ---- recomputation: the same bits, BN running statistics included
if [ -n "${loss[3]}" ]; then
  if out=$(result_of 3 --model tiny-bn --zero 3 --recompute); then
    read -r l c <<<"$out"
    if [ "$c" = "${crc[3]}" ]; then ok "3 ranks, stage 3: --recompute trained the same parameters bit for bit (crc32 $c)"
    else bad "3 ranks, stage 3: --recompute gave crc32 $c, without it ${crc[3]}"; fi
  else bad "--zero 3 --recompute on 3 ranks: $out"; show "$log"; fi
fi

# ---- 1, 2 and 3 ranks: the same training (BN-free, the same global batch)
one=
for np in 1 2 3; do
  if out=$(result_of "$np" --model tiny --zero 3); then
    read -r l c <<<"$out"
    if [ -z "$one" ]; then one=$l; ok "stage 3 on 1 rank: final train_loss $l"
    elif close "$one" "$l"; then ok "stage 3 on $np ranks: final train_loss $l = one rank's $one (within 1e-3)"
    else bad "stage 3 on $np ranks: final train_loss $l, one rank's $one"; fi
  else bad "stage 3 on $np ranks: $out"; show "$log"; fi
done

# ---- the memory table (rank 0 prints every rank's row after the first step)
if run 3 --model tiny-bn --zero 3 --memory && grep -qE '^memory \((MB|kB), per rank; zero=3' "$log" && grep -qE '^  optimizer +[0-9.]+' "$log"; then
  ok "--memory on 3 ranks: $(grep -m1 -E '^  params [0-9.]+ (MB|kB)' "$log" | sed 's/^ *//')"
else
  bad "--memory on 3 ranks: no table"; show "$log"
fi

# ---- bad options: stopped before any work, with the rule
for opt in "--zero 4" "--units 0" "--units 33"; do
  read -r -a o <<<"$opt"
  run 1 --model tiny "${o[@]}"
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "${o[0]}" "$log"; then ok "$opt: exit $rc, $(grep -m1 -- "${o[0]}" "$log" | cut -c1-100)"
  else bad "$opt: exit $rc without a message naming ${o[0]}"; show "$log"; fi
done

# ---- the sharded checkpoint (its own verdict lines; tests/lesson09/ckpt-tests.sh comes with zero_ckpt.c)
if [ -f tests/lesson09/ckpt-tests.sh ]; then
  tests/lesson09/ckpt-tests.sh "$@" || bad "sharded checkpoints (tests/lesson09/ckpt-tests.sh, above)"
else
  echo "skip ${verdict_prefix}sharded checkpoints: tests/lesson09/ckpt-tests.sh is not in this tree"
fi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -gt 0 ]; then
  if out=$(result_of 1 --model tiny --zero 3 --device cuda); then
    read -r l c <<<"$out"
    if close "$one" "$l"; then ok "stage 3 on the GPU: final train_loss $l (the CPU's: $one)"
    else bad "stage 3 on the GPU: final train_loss $l, the CPU's $one"; fi
  else bad "stage 3 on the GPU: $out"; show "$log"; fi
else
  echo "skip ${verdict_prefix}stage 3 on a GPU: no GPU here; the path is compiled only"
fi
tests/lesson09/outputs-tests.sh "$tests" "$train" "${compare:-}" || bad "outputs: invariant 13 (tests/lesson09/outputs-tests.sh, above)"
extras_end
