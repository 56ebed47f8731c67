#!/usr/bin/env bash
# bench/run-syncbn.sh: plain BN (lesson 04's program) against SyncBN (lesson 05's) with the same options, at
# small per-rank batches; one line per run with the final test accuracy, the `syncbn:` report and the load
# average. bench/results-syncbn.md says what was measured with it and on what machine.
#
#   bench/run-syncbn.sh [OPTIONS] [DATASET] [EPOCHS] [GLOBAL_BATCH] [WORLDS] [SEEDS] [-- TRAIN_OPTIONS...]
#   bench/run-syncbn.sh fashion-mnist 1 64 "8 16" "1 2"      (the defaults)
#   bench/run-syncbn.sh --model resnet9 --width 16 --reference --csv bench/figures/syncbn-gap.csv \
#       synthetic 1 8 "8 4" "1 2 3" -- --warmup-epochs 0   (the gap of bench/results-syncbn.md)
#
# OPTIONS
#   --model NAME, --width N  the net (default: the dataset's; the gap needs small maps: resnet9)
#   --stop-at N              stop every run after N steps (--stop-at of lesson 04) and evaluate the checkpoint it
#                            saves with lesson 06's program: the test set in eval mode (running statistics), as
#                            the end of an epoch would; a stopped run prints no train loss (the CSV leaves it empty)
#   --reference              also run ONE process on the global batch (lesson 04's program: plain BN over all the
#                            images of the step, which is what SyncBN computes on any number of ranks)
#   --csv FILE               append one row per run to FILE (header first when FILE is new); make plot-syncbn
#                            draws bench/figures/syncbn-gap.csv
# TRAIN_OPTIONS after -- go to every training run as they are (e.g. --warmup-epochs 0 --lr 0.02).
#
# Needs build/solutions/04-checkpoint/train and build/solutions/05-syncbn/train (make all), and with --stop-at
# build/solutions/06-inference/train. More ranks than cores run oversubscribed (scripts/launch.sh): accuracies
# do not depend on it (every run is deterministic), times do.
set -u
cd "$(dirname "$0")/.." || exit 1
model="" width="" stop_at=0 reference=0 csv=""
usage="usage: $0 [--model NAME] [--width N] [--stop-at N] [--reference] [--csv FILE] [DATASET] [EPOCHS] [GLOBAL_BATCH] [WORLDS] [SEEDS] [-- TRAIN_OPTIONS]"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=${2:?$usage}; shift 2;;
    --width) width=${2:?$usage}; shift 2;;
    --stop-at) stop_at=${2:?$usage}; shift 2;;
    --reference) reference=1; shift;;
    --csv) csv=${2:?$usage}; shift 2;;
    -h|--help) echo "$usage"; exit 0;;
    --*) echo "$0: unknown option $1 (training options go after --)" >&2; echo "$usage" >&2; exit 2;;
    *) break;;
  esac
done
positional=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do positional+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
train_extra=("$@")
dataset=${positional[0]:-fashion-mnist} epochs=${positional[1]:-1} batch=${positional[2]:-64}
worlds=${positional[3]:-8 16} seeds=${positional[4]:-1 2}
[[ "$stop_at" =~ ^[0-9]+$ ]] || { echo "$0: --stop-at needs a number of steps, got '$stop_at'" >&2; exit 2; }
data_dir=${DATA_DIR:-/usr/share/datasets/fashion-mnist}
programs="04-checkpoint 05-syncbn"
[ "$stop_at" -gt 0 ] && programs+=" 06-inference"
for p in $programs; do
  [ -x "build/solutions/$p/train" ] || { echo "build/solutions/$p/train missing: make all" >&2; exit 1; }
done
net=()
[ -n "$model" ] && net+=(--model "$model")
[ -n "$width" ] && net+=(--width "$width")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -n "$csv" ] && [ ! -s "$csv" ]; then
  mkdir -p "$(dirname "$csv")"
  echo "dataset,model,width,global_batch,world,per_rank,bn,seed,steps,test_acc,train_loss,seconds,load" > "$csv"
fi

run() {  # world seed program
  local world=$1 seed=$2 prog=$3 out stop=() ck="$tmp/run.ckpt"
  [ "$stop_at" -gt 0 ] && stop=(--stop-at "$stop_at" --checkpoint "$ck")
  rm -f "$ck"
  local t0=$SECONDS
  out=$(scripts/launch.sh "$world" "build/solutions/$prog/train" --dataset "$dataset" --data-dir "$data_dir" \
        "${net[@]}" --batch-size "$batch" --epochs "$epochs" --seed "$seed" "${stop[@]}" "${train_extra[@]}" 2>&1)
  local rc=$? seconds=$((SECONDS - t0)) final sync acc loss steps
  sync=$(echo "$out" | grep '^syncbn:' | cut -c9-)
  if [ "$stop_at" -gt 0 ]; then
    # --stop-at skips the end-of-epoch evaluation: lesson 06 evaluates the saved weights and running statistics.
    [ $rc -eq 0 ] && [ -s "$ck" ] &&
      final=$(build/solutions/06-inference/train --dataset "$dataset" --data-dir "$data_dir" "${net[@]}" \
              --checkpoint "$ck" 2>&1 | grep '^final:')
    steps=$stop_at
  else
    final=$(echo "$out" | grep '^final:')
    steps=$(echo "$out" | sed -n 's/.* \([0-9]*\) steps per epoch$/\1/p' | head -n 1)
    steps=$((${steps:-0} * epochs))
  fi
  acc=$(echo "${final:-}" | grep -o 'test_acc=[0-9.]*' | cut -d= -f2)
  loss=$(echo "${final:-}" | grep -o 'train_loss=[0-9.]*' | cut -d= -f2)
  if [ -z "$acc" ]; then echo "run failed: world $world seed $seed $prog:"; echo "$out" | tail -n 5; return; fi
  local bn=plain
  [ "$prog" = 05-syncbn ] && bn=syncbn
  [ "$world" -eq 1 ] && bn=one-process
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  printf '%s world=%s per_rank=%s seed=%s %-13s | test_acc=%s train_loss=%s steps=%s seconds=%s | %s | load %s\n' \
         "$dataset" "$world" $((batch / world)) "$seed" "$prog" "$acc" "${loss:--}" "$steps" "$seconds" \
         "${sync:-plain BN}" "$load"
  [ -n "$csv" ] && echo "$dataset,${model:-default},${width:-default},$batch,$world,$((batch / world)),$bn,$seed,$steps,$acc,$loss,$seconds,$load" >> "$csv"
}
echo "# $(date -u '+%F %T') UTC, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for seed in $seeds; do
  [ "$reference" -eq 1 ] && run 1 "$seed" 04-checkpoint
  for world in $worlds; do
    for prog in 04-checkpoint 05-syncbn; do run "$world" "$seed" "$prog"; done
  done
done
