#!/usr/bin/env bash
# tests/lesson11/run-tests.sh: lesson 11's checks beyond the autograder (`make test-lesson11`), on the SOLUTION's
# program (the autograder itself needs its 4 ranks: `make grade LESSON=11 SOLUTIONS=1` and grade-solutions run it):
#   - the same training (synthetic data, ResNet-9 at width 8, a global batch of 32, 60 steps) in one process, on 2
#     ranks (--tp 2) and on 4 (--tp 4): the final train loss within 1e-3 of one process's (the arithmetic is the
#     same but for the order of some float32 sums); the 2 x 2 grid (4 ranks, --tp 2) within 1e-3 of data
#     parallelism alone on its 2 replicas (2 ranks, --tp 1); step 1's bytes per group, measured by pg_traffic,
#     equal to the arithmetic (the program prints both);
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
args=(--dataset synthetic --width 8 --batch-size 32 --stop-at 60)

# run NP ARGS...: the program on NP ranks (1: without mpirun) with the common arguments, its output in $log.
run() {
  local np=$1; shift
  if [ "$np" = 1 ]; then timeout 300 "$train" "${args[@]}" "$@" >"$log" 2>&1
  else timeout 300 scripts/launch.sh "$np" "$train" "${args[@]}" "$@" >"$log" 2>&1; fi
}

# The final train loss of one run (NP then the options), or the reason it failed (status 1). Also checks step 1's
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
  grep '^final:' "$log" | grep -oE 'train_loss=[0-9.]+' | cut -d= -f2
}

# close A B: the final train losses A and B (4 decimals as printed) within 1e-3 of A. The runs compared do the same
# arithmetic but for the order of some float32 sums (conv2's partial sums added by the all-reduce, a replica's
# share of the batch): a relative 1e-6 per step (the autograder measures it), which 60 steps of SGD leave orders
# of magnitude below 1e-3; a wrong split or a missing all-reduce changes the loss in the first digits.
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-3 * a) }'; }

# ---- one process, TP = 2, TP = 4: the same training
if ! one=$(loss_of 1); then bad "one process: $one"; show "$log"; extras_end; fi
ok "one process: final train_loss $one"
# compare REF_LABEL REF_LOSS NP ARGS...: the run's final loss within 1e-3 of REF_LOSS.
compare() {
  local ref_label=$1 ref=$2; shift 2
  local label="$1 ranks (${*:2})" got shape
  if got=$(loss_of "$@"); then
    shape=$(grep -m1 -oE '^tp: [0-9]+ tensor ranks? x [0-9]+ data replicas?' "$log" | cut -c5-)
    if close "$ref" "$got"; then ok "$label, $shape: final train_loss $got = $ref_label's $ref (within 1e-3); step 1's bytes = the arithmetic"
    else bad "$label: final train_loss $got, $ref_label's $ref"; fi
  else
    bad "$label: $got"; show "$log"
  fi
}
compare "one process" "$one" 2 --tp 2
compare "one process" "$one" 4 --tp 4
# ---- the 2 x 2 grid against data parallelism alone over the same 2 replicas (2 ranks, --tp 1): the same shards,
# the same SyncBN over the replicas, the blocks split or not. (Against one process the data-parallel run itself
# drifts by a few 1e-3 over 60 steps of ResNet-9 with BN, --tp 1 as much as --tp 2: not the tensor split's doing.)
if dp=$(loss_of 2 --tp 1); then
  ok "2 ranks (--tp 1), 1 tensor rank x 2 data replicas: final train_loss $dp"
  compare "data parallelism alone (2 replicas)" "$dp" 4 --tp 2
else
  bad "2 ranks (--tp 1): $dp"; show "$log"
fi

# ---- the memory table: every rank's, after step 1
if run 4 --tp 2 --memory && [ "$(grep -c '^tp: memory of rank' "$log")" = 4 ] && grep -qE '^  params +[0-9.]+ / ' "$log" &&
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
