#!/usr/bin/env bash
# bench/plot-scaling.sh: bench/run-scaling.sh's CSVs -> PNG plots next to them (gnuplot), `make plot-scaling`:
#   scaling-speedup.png   strong and weak speedup against ideal, the core count and the Amdahl fit; efficiency
#   scaling-split.png     where rank 0's training time goes, per rank count (compute, exposed comm, data)
#   scaling-link.png      images/s of 2 ranks: shared memory, TCP between namespaces, capped TCP; and bucket sizes
#
#   bench/plot-scaling.sh [DIR]     (default bench/figures)
set -euo pipefail
dir=${1:-bench/figures}
command -v gnuplot >/dev/null 2>&1 || { echo "plot-scaling: gnuplot not found. HINT: apt-get install gnuplot-nox (make deps)" >&2; exit 1; }
[ -s "$dir/scaling-strong.csv" ] || { echo "plot-scaling: no $dir/scaling-strong.csv: run make bench-scaling first" >&2; exit 1; }
terminal=png
gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1 && terminal=pngcairo
loaded=""
grep -q 'LOADED MACHINE' bench/results-scaling.md 2>/dev/null && loaded=" -- LOADED MACHINE, noisy (bench/results-scaling.md)"
cores=$(awk -F, 'NR > 1 { c = $7 } END { print c }' "$dir/scaling-speedup.csv")

gnuplot <<GP
set terminal $terminal size 1200,450
set datafile separator ','
set datafile columnheaders
set grid
set output '$dir/scaling-speedup.png'
set multiplot layout 1,2 title 'DDP on CPU ranks$loaded'
set title 'speedup (images/s relative to 1 rank)'
set xlabel 'ranks'
set logscale x 2
set xtics (1, 2, 4, 8, 16)
set xrange [0.9:10]
set key top left
plot '$dir/scaling-speedup.csv' using 1:1 with lines dashtype 2 title 'ideal', \
     '' using 1:7 with lines lw 2 title 'cores ($cores): the ceiling here', \
     '' using 1:6 with lines title 'Amdahl fit (within the cores)', \
     '' using 1:2 with linespoints pt 7 title 'strong (global batch fixed)', \
     '' using 1:4 with linespoints pt 5 title 'weak (batch per rank fixed)'
set title 'parallel efficiency (speedup / ranks)'
set yrange [0:130]
set format y '%.0f%%'
set key top right
plot '$dir/scaling-speedup.csv' using 1:(100*\$3) with linespoints pt 7 title 'strong', \
     '' using 1:(100*\$5) with linespoints pt 5 title 'weak'
unset multiplot

set output '$dir/scaling-split.png'
unset logscale x
set xtics auto
set autoscale x
set format y '%g'
set yrange [0:*]
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set key outside bottom center horizontal
set multiplot layout 1,2 title 'where rank 0''s training time goes$loaded'
set title 'strong scaling: seconds per epoch'
set xlabel 'ranks'
set ylabel 'seconds'
plot '$dir/scaling-strong.csv' using 5:xtic(1) title 'compute', '' using 6 title 'exposed communication', '' using 7 title 'data'
set title 'weak scaling: seconds per epoch'
plot '$dir/scaling-weak.csv' using 5:xtic(1) title 'compute', '' using 6 title 'exposed communication', '' using 7 title 'data'
unset multiplot
GP
echo "plot-scaling: wrote $dir/scaling-speedup.png $dir/scaling-split.png"

if [ -s "$dir/scaling-link.csv" ]; then
  cols=1 bucket_plot="" csvs=("$dir/scaling-link.csv")
  if [ -s "$dir/scaling-bucket.csv" ]; then
    cols=2
    bucket_plot="set title 'gradient bucket size (--bucket-mb), capped TCP'
plot '$dir/scaling-bucket.csv' using 5:xtic(1) title 'compute', '' using 6 title 'exposed communication', '' using 7 title 'data'"
    csvs+=("$dir/scaling-bucket.csv")
  fi
  # One y range for both panels, above the tallest stack (compute + communication + data): gnuplot's own
  # autoscale stops at the first column's range and cut the 7 s bars of the bucket panel at their top.
  ymax=$(awk -F, 'FNR > 1 { t = $5 + $6 + $7; if (t > m) m = t } END { printf "%.1f", m * 1.15 }' "${csvs[@]}")
  gnuplot <<GP
set terminal $terminal size 1200,450
set datafile separator ','
set datafile columnheaders
set grid
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set yrange [0:$ymax]
set output '$dir/scaling-link.png'
set xtics rotate by -25
set multiplot layout 1,$cols title 'the interconnect, 2 ranks$loaded'
set title 'seconds per epoch by link (TCP: two network namespaces)'
set ylabel 'seconds'
set key outside bottom center horizontal
plot '$dir/scaling-link.csv' using 5:xtic(1) title 'compute', '' using 6 title 'exposed communication', '' using 7 title 'data'
$bucket_plot
unset multiplot
GP
  echo "plot-scaling: wrote $dir/scaling-link.png"
fi
