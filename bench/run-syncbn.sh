#!/usr/bin/env bash
# bench/run-syncbn.sh: plain BN (lesson 04's program) against SyncBN (lesson 05's) with the same options, at
# small per-rank batches; one line per run with the final test accuracy, the `syncbn:` report and the load
# average. bench/results-syncbn.md says what was measured with it and on what machine.
#
#   bench/run-syncbn.sh [DATASET] [EPOCHS] [GLOBAL_BATCH] [WORLDS] [SEEDS]
#   bench/run-syncbn.sh fashion-mnist 1 64 "8 16" "1 2"      (the defaults)
#
# Needs build/solutions/04-checkpoint/train and build/solutions/05-syncbn/train (make all). More ranks than
# cores run oversubscribed (scripts/launch.sh): accuracies do not depend on it, times do.
set -u
cd "$(dirname "$0")/.."
dataset=${1:-fashion-mnist} epochs=${2:-1} batch=${3:-64} worlds=${4:-8 16} seeds=${5:-1 2}
data_dir=${DATA_DIR:-/usr/share/datasets/fashion-mnist}
for p in 04-checkpoint 05-syncbn; do
  [ -x "build/solutions/$p/train" ] || { echo "build/solutions/$p/train missing: make all" >&2; exit 1; }
done
run() {  # world seed program
  local out
  out=$(scripts/launch.sh "$1" "build/solutions/$3/train" --dataset "$dataset" --data-dir "$data_dir" \
        --batch-size "$batch" --epochs "$epochs" --seed "$2" 2>&1)
  local final sync
  final=$(echo "$out" | grep '^final:' | grep -o 'test_acc=[0-9.]*\|train_loss=[0-9.]*\|seconds=[0-9.]*' | tr '\n' ' ')
  sync=$(echo "$out" | grep '^syncbn:' | cut -c9-)
  [ -n "$final" ] || { echo "run failed: world $1 seed $2 $3:"; echo "$out" | tail -n 5; return; }
  printf '%s world=%s per_rank=%s seed=%s %-13s | %s| %s | load %s\n' "$dataset" "$1" $((batch / $1)) "$2" "$3" \
         "$final" "${sync:-plain BN}" "$(cut -d' ' -f1 /proc/loadavg)"
}
echo "# $(date -u '+%F %T') UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for seed in $seeds; do
  for world in $worlds; do
    for prog in 04-checkpoint 05-syncbn; do run "$world" "$seed" "$prog"; done
  done
done
