#!/usr/bin/env bash
# scripts/plot-metrics.sh: turns per-epoch metrics CSV files (kit/log.h metrics_append) into PNG curves.
#
#   scripts/plot-metrics.sh results/run-cifar10.csv [more.csv ...]   -> results/run-cifar10.png, ...
#
# The first column is the x axis (epoch). Columns whose name contains "loss" go in the left panel,
# those containing "acc" in the right one, in percent as the program prints them; other columns
# (throughput, lr) are not plotted.
# A confusion matrix written by lesson 06 (--confusion FILE, header "true\predicted,...") becomes a heat map.
set -euo pipefail

usage="usage: $0 METRICS.csv [...]   (train with --metrics FILE to get one; make run writes results/run-*.csv)"
case "${1:-}" in
  -h|--help) echo "$usage"; exit 0;;
  "") echo "$usage" >&2; exit 2;;
esac
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plot-metrics: gnuplot not found. HINT: apt-get install gnuplot-nox (or run make deps)" >&2
  exit 1
fi
# pngcairo draws smoother lines; plain png (libgd) is the fallback every gnuplot build has.
terminal=png
gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1 && terminal=pngcairo

# "plot" clauses for the columns whose header matches a word, e.g. 'using 1:2 title "train loss"'.
# SCALE multiplies the values: 100 turns the CSV's accuracy fractions into the percent the program prints.
clauses() {  # header word scale
  local header=$1 word=$2 scale=$3 out="" i=0 name
  IFS=, read -r -a names <<< "$header"
  for name in "${names[@]}"; do
    i=$((i + 1))
    [ $i -eq 1 ] && continue
    if [[ "$name" == *"$word"* ]]; then
      out+="${out:+, }data using 1:(\$$i*$scale) with linespoints pt 7 title \"${name//_/ }\""
    fi
  done
  echo "$out"
}

# "LO:HI" around the values of the columns matching WORD (times SCALE), 8 % of their span beyond each end,
# clipped to [FLOOR:CEIL]: the y range follows the data, so a change of a few percent is visible.
yrange() {  # csv header word scale floor ceil
  awk -F, -v header="$2" -v word="$3" -v s="$4" -v floor="$5" -v ceil="$6" '
    BEGIN { n = split(header, h, ","); lo = 1e300; hi = -1e300 }
    NR > 1 { for (i = 2; i <= n; i++) if (index(h[i], word)) { v = $i * s; if (v < lo) lo = v; if (v > hi) hi = v } }
    END { m = (hi - lo) * 0.08; if (m == 0) m = (hi != 0 ? 0.05 * (hi < 0 ? -hi : hi) : 1)
          lo -= m; hi += m; if (floor != "" && lo < floor) lo = floor; if (ceil != "" && hi > ceil) hi = ceil
          printf "%g:%g", lo, hi }' "$1"
}

# 100 when every *acc* column holds fractions (kit/train.c writes 0.8659 for the 86.59 % it prints), else 1.
acc_scale() {  # csv header
  awk -F, -v header="$2" 'BEGIN { n = split(header, h, ","); big = 0 }
    NR > 1 { for (i = 2; i <= n; i++) if (h[i] ~ /acc/ && $i + 0 > 1) big = 1 }
    END { print big ? 1 : 100 }' "$1"
}

# plot_confusion CSV CLASSES: rows = true class, columns = predicted class, one cell per pair.
plot_confusion() {
  local csv=$1 k=$2 png="${1%.csv}.png"
  {
    echo "set terminal $terminal size 700,600"
    echo "set output '$png'"
    echo "set datafile separator ','"
    echo "set title '$(basename "$csv"): rows true class, columns predicted'"
    echo "set xlabel 'predicted class'; set ylabel 'true class'"
    echo "set xrange [-0.5:$k-0.5]; set yrange [$k-0.5:-0.5]"
    echo "set xtics 1; set ytics 1; set palette defined (0 'white', 1 '#1f4e99')"
    echo "plot '$csv' matrix rowheaders columnheaders using 1:2:3 with image notitle, \\"
    [ "$k" -le 20 ] && echo "     '' matrix rowheaders columnheaders using 1:2:(sprintf('%d', \$3)) with labels notitle" \
                    || echo "     1/0 notitle"
  } | gnuplot
  echo "plot-metrics: wrote $png"
}

for csv in "$@"; do
  if [ ! -s "$csv" ]; then
    echo "plot-metrics: $csv is missing or empty" >&2
    exit 1
  fi
  header=$(head -n 1 "$csv" | tr -d '\r')
  rows=$(($(wc -l < "$csv") - 1))
  # Lesson 06's confusion matrix (--confusion FILE): header "true\predicted,0,1,...": a heat map, counts printed.
  if [[ "$header" == 'true\predicted,'* ]]; then
    plot_confusion "$csv" "$rows"
    continue
  fi
  if [ "$rows" -lt 1 ]; then
    echo "plot-metrics: $csv has a header but no rows yet" >&2
    exit 1
  fi
  scale=$(acc_scale "$csv" "$header")
  loss=$(clauses "$header" loss 1)
  acc=$(clauses "$header" acc "$scale")
  if [ -z "$loss$acc" ]; then
    echo "plot-metrics: $csv has no column named *loss* or *acc* (header: $header)" >&2
    exit 1
  fi
  png="${csv%.csv}.png"
  xname=$(cut -d, -f1 <<< "$header")
  {
    echo "set terminal $terminal size 1200,450"
    echo "set output '$png'"
    echo "set datafile separator ','"
    echo "data = '$csv'"
    echo "set key autotitle columnhead"
    echo "set grid"
    echo "set xlabel '$xname'"
    # Whole epochs: one tick each up to 20 rows, gnuplot's spacing (as integers) beyond.
    if [ "$rows" -le 20 ]; then echo "set xtics 1"; fi
    echo "set format x '%.0f'"
    echo "set xrange [$(awk -F, 'NR == 2 { a = $1 } NR > 1 { b = $1 } END { printf "%g:%g", a - 0.3, b + 0.3 }' "$csv")]"
    echo "set multiplot layout 1,2 title '$(basename "$csv") ($rows rows)'"
    if [ -n "$loss" ]; then
      echo "set title 'loss'"
      echo "set ylabel 'loss (cross-entropy)'"
      echo "set yrange [$(yrange "$csv" "$header" loss 1 0 '')]"
      echo "plot $loss"
    fi
    if [ -n "$acc" ]; then
      echo "set title 'accuracy'"
      echo "set ylabel 'accuracy (%)'"
      echo "set yrange [$(yrange "$csv" "$header" acc "$scale" 0 101)]"
      echo "set key bottom right"
      echo "plot $acc"
    fi
    echo "unset multiplot"
  } | gnuplot
  echo "plot-metrics: wrote $png"
done
