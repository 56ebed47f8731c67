#!/usr/bin/env bash
# scripts/plot-metrics.sh: turns per-epoch metrics CSV files (kit/log.h metrics_append) into PNG curves.
#
#   scripts/plot-metrics.sh results/run-cifar10.csv [more.csv ...]   -> results/run-cifar10.png, ...
#
# The first column is the x axis (epoch). Columns whose name contains "loss" go in the left panel,
# those containing "acc" in the right one; other columns (throughput, lr) are not plotted.
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

# "plot" clauses for the columns whose header matches a word, e.g. 'using 1:2 title "train_loss"'.
clauses() {  # header word
  local header=$1 word=$2 out="" i=0 name
  IFS=, read -r -a names <<< "$header"
  for name in "${names[@]}"; do
    i=$((i + 1))
    [ $i -eq 1 ] && continue
    if [[ "$name" == *"$word"* ]]; then
      out+="${out:+, }data using 1:$i with linespoints title \"${name//_/ }\""
    fi
  done
  echo "$out"
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
  loss=$(clauses "$header" loss)
  acc=$(clauses "$header" acc)
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
    echo "set multiplot layout 1,2 title '$(basename "$csv") ($rows rows)'"
    if [ -n "$loss" ]; then
      echo "set title 'loss'"
      echo "plot $loss"
    fi
    if [ -n "$acc" ]; then
      echo "set title 'accuracy'"
      echo "set yrange [0:*]"
      echo "set key bottom right"
      echo "plot $acc"
    fi
    echo "unset multiplot"
  } | gnuplot
  echo "plot-metrics: wrote $png"
done
