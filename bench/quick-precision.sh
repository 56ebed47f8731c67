#!/usr/bin/env bash
# bench/quick-precision.sh BUILD: lesson 10's benchmarks in their quick modes, into a temporary folder
# (`make test-precision-bench`): each runs end to end and writes its table. Measures nothing. A part whose
# needs are missing (oneDNN, PyTorch, lesson 10's program) says "skipped" and why.
set -euo pipefail
build=${1:?usage: bench/quick-precision.sh BUILD}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
expect() {  # FILE PATTERN: the report has the row the run must have produced
  grep -qE "$2" "$1" || { echo "test-precision-bench: $1 has no line matching '$2':" >&2; cat "$1" >&2; exit 1; }
}
ran=()
if [ -x "$build/bench/gemm_lowp_cpu" ]; then
  "$build/bench/gemm_lowp_cpu" --quick --set fmnist > "$out/lowp.txt"
  expect "$out/lowp.txt" '^\| fmnist conv2 32->64 14x14 \| 64 x 196 x 288 \| [0-9.]+ \| [0-9.]+ \([0-9.]+\) \|'
  ran+=(gemm_lowp_cpu)
else
  echo "test-precision-bench: gemm_lowp_cpu skipped: oneDNN not found (apt-get install libdnnl-dev)"
fi
if python3 -c "import torch" 2>/dev/null; then
  python3 bench/torch_autocast.py --quick --device cpu --out "$out/autocast.md" 2>/dev/null
  expect "$out/autocast.md" '^\| fmnist \| 8 \| bf16 \| [0-9.]+ \| \*\*[0-9.]+x\*\* \|'
  ran+=(torch_autocast)
else
  echo "test-precision-bench: torch_autocast skipped: no PyTorch in python3"
fi
train=$build/solutions/10-precision/train
if [ -x "$train" ]; then
  python3 bench/precision_runs.py accuracy --quick --train "$train" --epochs 1 --out "$out/prec.md" 2>/dev/null
  expect "$out/prec.md" '^\| fp16, no loss scaling \| `[^`]*` \| \*\*[0-9.]+\*\* \|'
  python3 bench/precision_runs.py batch --quick --train "$train" --epochs 1 --batches 32 --max-micro 8 --rules warmup \
    --out "$out/batch.md" 2>/dev/null
  expect "$out/batch.md" '^\| 32 \| 2 x 16 \(2\) \| \*\*[0-9.]+\*\*'
  python3 bench/precision_runs.py plot --csv "$out/batch.csv" --png "$out/batch.png" >/dev/null
  # The speed table (kit against PyTorch): every row, the TF32 refusal the kit itself prints on the CPU, and
  # the PyTorch columns filled, or "not installed" where python3 has no PyTorch.
  python3 bench/precision_runs.py speed --quick --train "$train" --out "$out/speed.md" 2>/dev/null
  expect "$out/speed.md" '^\| tf32 \| refused: --tf32 needs a CUDA device'
  expect "$out/speed.md" '^\| fp32 \| [0-9.]+ \| 1.00x \| .* \| `float32 \(OpenBLAS SGEMM\)` \|$'
  if python3 -c "import torch" 2>/dev/null; then
    expect "$out/speed.md" '^\| fp16 \+ dynamic loss scaling \| [0-9.]+ \| [0-9.]+x \| [0-9.]+ \| [0-9.]+x \| \*\*[0-9.]+x\*\* \| [0-9]+ \| [0-9]+ \([0-9]+\) \| [0-9.]+x \| `[^`]+` \|$'
  fi
  # ... and with PyTorch hidden (python3 -S: no site-packages), the kit's rows alone, still a table.
  if ! python3 -S -c "import torch" 2>/dev/null; then
    python3 -S bench/precision_runs.py speed --quick --train "$train" --out "$out/speed-notorch.md" 2>/dev/null
    expect "$out/speed-notorch.md" '^\| fp16 \+ dynamic loss scaling \| [0-9.]+ \| [0-9.]+x \| not installed \| - \| - \| [0-9]+ \| - \| - \| `[^`]+` \|$'
  fi
  [ -s "$out/batch.png" ] || { echo "test-precision-bench: plot-batch drew no PNG" >&2; exit 1; }
  ran+=(precision_runs)
else
  echo "test-precision-bench: precision_runs skipped: $train is not built (lesson 10, Open MPI)"
fi
echo "test-precision-bench: ran ${ran[*]:-nothing}"
