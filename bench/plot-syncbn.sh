#!/usr/bin/env bash
# bench/plot-syncbn.sh: bench/run-syncbn.sh's CSV -> a PNG next to it (gnuplot), `make plot-syncbn`: the test
# accuracy of plain BN, SyncBN and one process on the global batch, one panel per dataset, one pair of bars
# per number of images per rank (the mean over the seeds), each seed a dot.
#
#   bench/plot-syncbn.sh [CSV]     (default bench/figures/syncbn-gap.csv -> bench/figures/syncbn-gap.png)
set -euo pipefail
csv=${1:-bench/figures/syncbn-gap.csv}
png="${csv%.csv}.png"
command -v gnuplot >/dev/null 2>&1 || { echo "plot-syncbn: gnuplot not found. HINT: apt-get install gnuplot-nox (make deps)" >&2; exit 1; }
[ -s "$csv" ] || { echo "plot-syncbn: no $csv: run bench/run-syncbn.sh --csv $csv first (bench/results-syncbn.md)" >&2; exit 1; }
terminal=png
gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1 && terminal=pngcairo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One group of bars per images-per-rank value (fewest first), plain BN left and SyncBN right; the one-process
# runs last. Per dataset D: $tmp/D.bars (x, mean test accuracy %, kind 0 plain / 1 SyncBN / 2 one process, mean
# train loss), $tmp/D.dots (x, one seed's accuracy %, its train loss), $tmp/D.tics (gnuplot xtics),
# $tmp/D.title. A run stopped by --stop-at has no train loss: NaN, which gnuplot leaves out.
awk -F, -v dir="$tmp" '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  {
    d = $col["dataset"]; bn = $col["bn"]; pr = $col["per_rank"] + 0; w = $col["world"]
    if (!(d in seen)) { seen[d] = 1; order[++nd] = d; model[d] = $col["model"] " w" $col["width"] }
    k = d SUBSEP bn SUBSEP pr
    n[k]++; acc[k, n[k]] = 100 * $col["test_acc"]; sum[k] += acc[k, n[k]]
    loss[k, n[k]] = $col["train_loss"] == "" ? "NaN" : $col["train_loss"] + 0
    if ($col["train_loss"] == "") noloss[k] = 1; else lsum[k] += $col["train_loss"]
    world[k] = w; steps[d] = $col["steps"]; gb[d] = $col["global_batch"]
    if (bn != "one-process" && !((d, pr) in have)) { have[d, pr] = 1; np[d]++; prs[d, np[d]] = pr }
    if (!((d, $col["seed"]) in seeds)) { seeds[d, $col["seed"]] = 1; ns[d]++ }
  }
  function emit(k, x, kind, base,   s) {
    printf "%g %.4f %d %s\n", x, sum[k] / n[k], kind, (k in noloss) ? "NaN" : sprintf("%.4f", lsum[k] / n[k]) > (base ".bars")
    for (s = 1; s <= n[k]; s++) printf "%g %.4f %s\n", x, acc[k, s], loss[k, s] > (base ".dots")
  }
  END {
    for (t = 1; t <= nd; t++) {
      d = order[t]; base = dir "/" d
      for (i = 1; i <= np[d]; i++) for (j = i + 1; j <= np[d]; j++)  # per_rank values, ascending
        if (prs[d, j] < prs[d, i]) { s = prs[d, i]; prs[d, i] = prs[d, j]; prs[d, j] = s }
      tics = ""
      for (i = 1; i <= np[d]; i++) {
        pr = prs[d, i]; x = i - 1
        for (b = 0; b < 2; b++) {
          k = d SUBSEP (b ? "syncbn" : "plain") SUBSEP pr
          if (!(k in n)) continue
          emit(k, x + (b ? 0.2 : -0.2), b, base)
          wr = world[k]
        }
        tics = tics (tics ? ", " : "") sprintf("\"%d rank%s\\nx %d image%s\" %d", wr, wr > 1 ? "s" : "", pr, pr > 1 ? "s" : "", x)
      }
      k = d SUBSEP "one-process" SUBSEP gb[d]
      if (k in n) {
        emit(k, np[d], 2, base)
        tics = tics (tics ? ", " : "") sprintf("\"1 process\\nx %d images\" %d", gb[d], np[d])
      }
      print tics > (base ".tics")
      printf "%s: %s, global batch %d, %d steps, %d seed%s\n", d, model[d], gb[d], steps[d], ns[d], (ns[d] > 1 ? "s" : "") > (base ".title")
      print d > (dir "/datasets")
    }
  }' "$csv"

mapfile -t datasets < "$tmp/datasets"
n=${#datasets[@]}
# plot_panel D COLUMN: the bars (mean over the seeds) and the dots (one per seed) of one measure.
plot_panel() {
  local f="$tmp/$1" c=$2
  echo "plot '$f.bars' using 1:(\$3 == 0 ? \$$c : 1/0) with boxes lc rgb '#c0392b' title 'plain BN (lesson 04)', \\"
  echo "     '' using 1:(\$3 == 1 ? \$$c : 1/0) with boxes lc rgb '#1f5fa8' title 'SyncBN (lesson 05)', \\"
  echo "     '' using 1:(\$3 == 2 ? \$$c : 1/0) with boxes lc rgb '#888888' title 'one process, global batch', \\"
  echo "     '' using 1:$c:(sprintf('%.${3}f', \$$c)) with labels offset 0,0.8 font ',10' notitle, \\"
  echo "     '$f.dots' using 1:$((c == 2 ? 2 : 3)) with points pt 7 ps 0.8 lc rgb 'black' title 'one seed'"
}
{
  echo "set terminal $terminal size $((560 * n)),900 font 'DejaVu Sans,11'"
  echo "set output '$png'"
  echo "set style fill solid 0.55 border -1"
  echo "set boxwidth 0.36"
  echo "set grid ytics lc rgb '#dddddd'"
  echo "set bmargin 4"
  echo "set multiplot layout 2,$n columnsfirst"
  for d in "${datasets[@]}"; do
    f="$tmp/$d"
    echo "set title '$(cat "$f.title")'"
    echo "set xtics ($(cat "$f.tics"))"
    echo "set xrange [-0.6:$(awk '{ if ($1 > m) m = $1 } END { print m + 0.6 }' "$f.bars")]"
    echo "set key outside top center horizontal samplen 1.5 width -1 font ',10'"
    echo "set ylabel 'test accuracy (%), eval mode'"
    echo "set yrange [0:112]; set ytics 0,20,100"
    plot_panel "$d" 2 1
    echo "set title 'train loss over the run (lower is better)'"
    echo "set ylabel 'train loss'; unset key"
    if awk '$4 != "NaN" { found = 1 } END { exit !found }' "$f.bars"; then
      echo "set yrange [0:*]; set ytics autofreq"
      echo "set offsets 0, 0, graph 0.1, 0"
      plot_panel "$d" 4 3
      echo "set offsets 0, 0, 0, 0"
    else
      echo "set yrange [0:1]; unset ytics"
      echo "set label 1 'no train loss: runs stopped by --stop-at' at graph 0.5, 0.5 center"
      echo "plot 1/0 notitle"
      echo "unset label 1"
    fi
  done
  echo "unset multiplot"
} | gnuplot
echo "plot-syncbn: wrote $png"
