#!/usr/bin/env bash
# bench/quick.sh BUILD: the benches against PyTorch's distributed training (bench/torch_ddp.py) and gloo's
# all-reduce (bench/torch_gloo.py, against the kit's MPI path and lesson 07's ring) in their --quick modes, into a
# temporary folder: the harness runs end to end and writes well-formed reports. Not a measurement (`make
# test-bench-quick`; the benches themselves: bench/README.md). Skipped, saying why, without PyTorch.
set -euo pipefail
build=${1:?usage: bench/quick.sh BUILD}
if ! python3 -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null; then
  echo "test-bench-quick: skipped: no PyTorch with gloo in python3 (pip install torch)"
  exit 0
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# expect FILE PATTERN: the report has the row the run must have produced.
expect() {
  grep -qE "$2" "$1" || { echo "test-bench-quick: $1 has no line matching '$2':" >&2; cat "$1" >&2; exit 1; }
}
python3 bench/torch_ddp.py --kit-bin "$build/bench/ddp_kit" --out "$out/ddp.md" --quick
expect "$out/ddp.md" '^\| tiny-bn \| 2 \| 2 x 1 \| [0-9.]+, [0-9.]+ \| [0-9.]+, [0-9.]+ \| \*\*[0-9.]+x\*\*'
python3 bench/torch_gloo.py --against allreduce --kit-bin "$build/bench/bench_allreduce" --out "$out/ar.md" --quick
expect "$out/ar.md" '^\| 1 MB \| [0-9.]+, [0-9.]+ \| [0-9.]+, [0-9.]+ \| \*\*[0-9.]+x\*\*'
python3 bench/torch_gloo.py --against ring --kit-bin "$build/bench/ring_allreduce" --out "$out/ring.md" --quick
expect "$out/ring.md" '^\| 1 MB \| [0-9.]+, [0-9.]+ \| [0-9.]+, [0-9.]+ \| \*\*[0-9.]+x\*\*'
echo "test-bench-quick: the DDP, all-reduce and ring comparisons with PyTorch ran and wrote their tables"
