#!/usr/bin/env bash
# bench/inference.sh: lesson 06's inference against PyTorch eager on the SAME weights, on the CPU, in one run:
# batch-1 latency (p50, p99) and batch-256 throughput. `make bench-inference` runs it -> bench/results-inference.md.
#
#   bench/inference.sh INFER_PROGRAM LESSON04_PROGRAM [OUT.md]
#
# Weights: lesson 04's program trains 2 steps (--stop-at 2) of each model and saves them (the values do not change
# the time). The kit: the lesson 06 solution with --latency; PyTorch: bench/torch_infer.py, loading the same file
# through tools/ckpt_read.py. ROUNDS (default 3) alternating runs (kit, PyTorch, kit, ...) so that other work on the
# machine lands on both; the table has the median of the rounds. The same thread count on both sides (THREADS,
# default: the cores); MODELS=resnet9 (comma-separated) runs only those rows. The share of the machine that other
# work took while each side ran is recorded (bench/cpu_share.py); above 10 % the report says LOADED in bold.
set -euo pipefail
infer=${1:?usage: $0 INFER_PROGRAM LESSON04_PROGRAM [OUT.md]}
train04=${2:?usage: $0 INFER_PROGRAM LESSON04_PROGRAM [OUT.md]}
out=${3:-bench/results-inference.md}
cd "$(dirname "$0")/.."
if ! python3 -c 'import torch, numpy' 2>/dev/null; then
  echo "bench-inference: PyTorch (and numpy) not found for python3: pip install torch (the bench needs it; the kit never does)" >&2
  exit 1
fi
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-3}
export OMP_NUM_THREADS=$threads
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# measured LABEL CMD...: runs CMD and records how much of the machine other work took meanwhile.
measured() { local label=$1; shift; python3 bench/cpu_share.py --log "$work/shares" --label "$label" -- "$@"; }

# model dataset data-dir
models=("resnet9 synthetic datasets/data")
[ -d /usr/share/datasets/fashion-mnist ] && models+=("fmnist fashion-mnist /usr/share/datasets/fashion-mnist")
if [ -n "${MODELS:-}" ]; then  # MODELS=resnet9: only those (a longer run of one row)
  keep=(); for spec in "${models[@]}"; do [[ " ${MODELS//,/ } " == *" ${spec%% *} "* ]] && keep+=("$spec"); done
  models=("${keep[@]}")
fi

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rows=()
for spec in "${models[@]}"; do
  read -r model dataset dir <<<"$spec"
  ck=$work/$model.ckpt
  "$train04" --dataset "$dataset" --data-dir "$dir" --model "$model" --batch-size 16 --stop-at 2 --checkpoint "$ck" \
    >"$work/train.log" 2>&1 || { tail -n 5 "$work/train.log" >&2; exit 1; }
  declare -a kp50=() kp99=() kips=() tp50=() tp99=() tips=()
  for r in $(seq 1 "$rounds"); do
    k=$(measured "kit $model" "$infer" --dataset "$dataset" --data-dir "$dir" --model "$model" --checkpoint "$ck" --device cpu --latency | grep '^bench: ')
    t=$(measured "PyTorch $model" python3 bench/torch_infer.py "$ck" --threads "$threads" | grep '^bench: ')
    kp50+=("$(field p50_ms "$k")"); kp99+=("$(field p99_ms "$k")"); kips+=("$(field images_per_s "$k")")
    tp50+=("$(field p50_ms "$t")"); tp99+=("$(field p99_ms "$t")"); tips+=("$(field images_per_s "$t")")
    echo "round $r $model: kit   $k" >&2
    echo "round $r $model: torch $t" >&2
    torch_version=$(field torch "$t")
  done
  best() { printf '%s\n' "$@" | sort -g | head -n 1; }
  row=$(printf '| %s | %.3f / %.3f | %.3f / %.3f | %.2fx | %.3f / %.3f | %.0f | %.0f | %.2fx |' "$model" \
    "$(median "${kp50[@]}")" "$(median "${kp99[@]}")" "$(median "${tp50[@]}")" "$(median "${tp99[@]}")" \
    "$(python3 -c "print($(median "${tp50[@]}") / $(median "${kp50[@]}"))")" \
    "$(best "${kp50[@]}")" "$(best "${tp50[@]}")" \
    "$(median "${kips[@]}")" "$(median "${tips[@]}")" \
    "$(python3 -c "print($(median "${kips[@]}") / $(median "${tips[@]}"))")")
  rows+=("$row")
done
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p')
{
  echo "# Inference on the CPU: the kit (lesson 06) against PyTorch eager, the same weights"
  echo
  echo "Written by \`make bench-inference\` ($(date -u +%Y-%m-%d)). Machine: **${cpu:-unknown}**, $(nproc) cores; $threads threads"
  echo "on both sides (the kit: OpenMP + OpenBLAS; PyTorch $torch_version: \`torch.set_num_threads($threads)\`, eval mode,"
  echo "\`torch.inference_mode()\`)."
  echo
  python3 bench/cpu_share.py --report "$work/shares" --remeasure "make bench-inference"
  echo
  echo "Latency: one image at a time, from the input in host memory to the class on the host, $((200)) runs after 20"
  echo "warm-up; throughput: back-to-back batches of 256 for at least 2 s. Median of $rounds alternating rounds"
  echo "(kit, PyTorch, kit, ...); the best p50 of the rounds is the least disturbed one. Speed-up columns: above 1"
  echo "means the kit is faster."
  echo
  echo "| model | kit batch 1 p50 / p99 (ms) | PyTorch batch 1 p50 / p99 (ms) | kit speed-up, p50 | best p50 of the rounds, kit / PyTorch (ms) | kit images/s, batch 256 | PyTorch images/s | kit / PyTorch |"
  echo "|-------|---------------------------:|-------------------------------:|------------------:|-------------------------------------------:|------------------------:|-----------------:|--------------:|"
  printf '%s\n' "${rows[@]}"
} >"$out"
cat "$out"
