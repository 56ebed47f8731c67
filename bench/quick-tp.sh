#!/usr/bin/env bash
# bench/quick-tp.sh TRAIN11 TRAIN09: bench/tp_bench.py in its quick mode, into a temporary folder (`make
# test-tp-bench`): tiny widths, every section, the plot. Its speed figures mean nothing; its bytes and model states
# do: the script fails when the measured bytes per group or the model states differ from the arithmetic.
set -euo pipefail
train=${1:?usage: bench/quick-tp.sh TRAIN11 TRAIN09}
zero=${2:?usage: bench/quick-tp.sh TRAIN11 TRAIN09}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 bench/tp_bench.py --quick --train "$train" --zero-train "$zero" --md "$out/tp.md" \
  --csv "$out/tp.csv" \
  --png "$out/tp.png" --plot 2>"$out/log" || { cat "$out/log" >&2; exit 1; }
expect() {  # PATTERN: the report has the row the run must have produced
  grep -qE "$1" "$out/tp.md" || { echo "test-tp-bench: no line matching '$1' in the report:" >&2; cat "$out/tp.md" >&2; exit 1; }
}
expect '^\| 4 \| 2 x 2 \| [0-9,]+ \(4\) \| [0-9,]+ \(21\) \| .* \| equal \| equal \|$'
expect '^\| 16 \| TP = 4 \| 4 \| .* \| equal \| equal \([0-9.]+\) \|$'
expect '^\| 16 \| ZeRO-3, 11 units, 32 per rank \| 2 \|'
expect '^\| TP = 2 \| 2 \| [0-9]+ \| \*\*[0-9]+\*\* \([0-9.]+\) \| [0-9]+ \([0-9.]+\) \|'
expect '^\| 8 \| TP 2 x DP 2 \| 4 \| 2 x 2 \| [0-9.]+ \| \*\*[0-9.]+\*\* \|'
[ -s "$out/tp.png" ] || { echo "test-tp-bench: no PNG drawn" >&2; exit 1; }
echo "test-tp-bench: bytes and model states equal to the arithmetic; every section and the plot written"
