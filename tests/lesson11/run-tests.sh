#!/usr/bin/env bash
# tests/lesson11/run-tests.sh: lesson 11's checks beyond the autograder (`make test-lesson11`), on the SOLUTION's
# program (the autograder itself needs its 4 ranks: `make grade LESSON=11 SOLUTIONS=1` and grade-solutions run it):
#   - the same training (synthetic data, ResNet-9 at width 8, one epoch of 78 steps of 64 images) in one process,
#     on 2 ranks (--tp 2), on 4 (--tp 4) and on the 2 x 2 grid (4 ranks, --tp 2): the final train loss within
#     1e-3 of one process's and the same test accuracy (the arithmetic is the same but for the order of some
#     float32 sums); step 1's bytes per group, measured by pg_traffic, equal to the arithmetic (the program prints
#     both). A whole epoch, not --stop-at: the final line of an epoch cut short reports rank 0's own shard of it
#     (lesson 03's loop, trainlog_epoch_cut), which with 2 replicas is half the batch;
#   - --memory prints every rank's table by part, with the arithmetic of its parameters;
#   - a --tp that does not divide the world, or the blocks' channels, stops before any step, with a message
#     naming the rule and a non-zero exit status.
#
#   tests/lesson11/run-tests.sh BUILD/grade-solutions/test_lesson11 BUILD/solutions/11-tensor/train
set -u
# shellcheck source=SCRIPTDIR/../extras-lib.sh
. "$(dirname "$0")/../extras-lib.sh"
extras_begin 11 "$@"
export KIT_PROGRESS=plain
log=$work/run.log
args=(--dataset synthetic --width 8 --batch-size 64 --epochs 1)

# run NP ARGS...: the program on NP ranks (1: without mpirun) with the common arguments, its output in $log.
run() {
  local np=$1; shift
  if [ "$np" = 1 ]; then timeout 300 "$train" "${args[@]}" "$@" >"$log" 2>&1
  else timeout 300 scripts/launch.sh "$np" "$train" "${args[@]}" "$@" >"$log" 2>&1; fi
}

# "TRAIN_LOSS TEST_ACC" of one run (NP then the options), or the reason it failed (status 1). Also checks step 1's
# bytes line: measured equal to the arithmetic, for both groups.
loss_of() {
  run "$@"
  local rc=$?
  [ $rc -eq 0 ] || { echo "exit $rc: $(grep -m1 -E 'error|HINT' "$log")"; return 1; }
  [ "$(grep -c '^final:' "$log")" = 1 ] || { echo "$(grep -c '^final:' "$log") final lines (one rank must report)"; return 1; }
  local bytes
  bytes=$(grep -m1 '^tp: step 1 on rank 0:' "$log")
  if ! sed -E 's/.*tensor group ([0-9]+) bytes in ([0-9]+) all-reduces \(arithmetic ([0-9]+) in ([0-9]+)\), data group ([0-9]+) bytes in ([0-9]+) calls \(arithmetic ([0-9]+) in ([0-9]+)\).*/\1 \2 \3 \4 \5 \6 \7 \8/' <<<"$bytes" |
       awk 'NF == 8 && $1 == $3 && $2 == $4 && $5 == $7 && $6 == $8 { ok = 1 } END { exit !ok }'; then
    echo "step 1's bytes are not the arithmetic's: ${bytes:-no 'tp: step 1' line}"; return 1
  fi
  grep '^final:' "$log" | grep -oE 'train_loss=[0-9.]+ test_acc=[0-9.]+' | sed 's/[a-z_]*=//g'
}

# close A B: the final train losses A and B (4 decimals as printed) within 1e-3 of A. The runs compared do the same
# arithmetic but for the order of some float32 sums (conv2's partial sums added by the all-reduce, a replica's
# share of the batch): a relative 1e-6 per step (the autograder measures it), which 78 steps of SGD leave orders
# of magnitude below 1e-3 (measured: equal as printed); a wrong split or a missing all-reduce changes the loss in
# the first digits.
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * a) }'; }

# ---- one process, TP = 2, TP = 4 and the 2 x 2 grid: the same training
if ! out=$(loss_of 1); then bad "one process: $out"; show "$log"; extras_end; fi
read -r one acc <<<"$out"
ok "one process: final train_loss $one, test_acc $acc"
for case in "2 --tp 2" "4 --tp 4" "4 --tp 2"; do
  read -r -a a <<<"$case"
  label="${a[0]} ranks (${a[*]:1})"
  if out=$(loss_of "${a[@]}"); then
    read -r l t <<<"$out"
    shape=$(grep -m1 -oE '^tp: [0-9]+ tensor ranks? x [0-9]+ data replicas?' "$log" | cut -c5-)
    if close "$one" "$l" && [ "$t" = "$acc" ]; then
      ok "$label, $shape: final train_loss $l, test_acc $t = one process's (within 1e-3); step 1's bytes = the arithmetic"
    else
      bad "$label: final train_loss $l, test_acc $t; one process's $one, $acc"
    fi
  else
    bad "$label: $out"; show "$log"
  fi
done

# ---- the memory table: every rank's, after step 1
if run 4 --tp 2 --memory --stop-at 2 && [ "$(grep -c '^tp: memory of rank' "$log")" = 4 ] && grep -qE '^  params +[0-9.]+ / ' "$log" &&
   grep -q 'arithmetic: params' "$log"; then
  ok "--memory on the 2 x 2 grid: $(grep -m1 'arithmetic: params' "$log" | sed 's/^ *//' | cut -c1-110)"
else
  bad "--memory on the 2 x 2 grid: no table of every rank"; show "$log"
fi

# ---- a --tp the world or the blocks cannot take: stopped before any step, with the rule
for case in "3 --tp 2|cannot be cut into tensor groups" "3 --tp 3|tensor rank(s) can split" "1 --tp 2|cannot be cut into tensor groups"; do
  spec=${case%%|*} rule=${case#*|}
  read -r -a a <<<"$spec"
  run "${a[@]}"
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -qF -- "$rule" "$log" && ! grep -q '^tp: step 1' "$log"; then
    ok "${a[0]} rank(s) ${a[*]:1}: exit $rc, $(grep -m1 -F -- "$rule" "$log" | sed 's/^[^:]*error: //' | cut -c1-100)"
  else
    bad "${a[0]} rank(s) ${a[*]:1}: exit $rc without '$rule' before step 1"; show "$log"
  fi
done
extras_end
