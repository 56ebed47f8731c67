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
# runs last. Per dataset: $tmp/D.bars (x, mean %, kind 0 plain / 1 SyncBN / 2 one process), $tmp/D.dots
# (x, one seed's %), $tmp/D.tics (gnuplot xtics), $tmp/D.title.
awk -F, -v dir="$tmp" '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  {
    d = $col["dataset"]; bn = $col["bn"]; pr = $col["per_rank"] + 0; w = $col["world"]
    if (!(d in seen)) { seen[d] = 1; order[++nd] = d; model[d] = $col["model"] " w" $col["width"] }
    k = d SUBSEP bn SUBSEP pr
    sum[k] += 100 * $col["test_acc"]; n[k]++; acc[k, n[k]] = 100 * $col["test_acc"]
    world[k] = w; steps[d] = $col["steps"]; gb[d] = $col["global_batch"]
    if (bn != "one-process" && !((d, pr) in have)) { have[d, pr] = 1; np[d]++; prs[d, np[d]] = pr }
    seeds[d, $col["seed"]] = 1
  }
  END {
    for (t = 1; t <= nd; t++) {
      d = order[t]; base = dir "/" d
      for (i = 1; i <= np[d]; i++) for (j = i + 1; j <= np[d]; j++)  # per_rank values, ascending
        if (prs[d, j] < prs[d, i]) { s = prs[d, i]; prs[d, i] = prs[d, j]; prs[d, j] = s }
      tics = ""; x = 0
      for (i = 1; i <= np[d]; i++) {
        pr = prs[d, i]; x = i - 1
        for (b = 0; b < 2; b++) {
          bn = b ? "syncbn" : "plain"; k = d SUBSEP bn SUBSEP pr
          if (!(k in n)) continue
          xb = x + (b ? 0.2 : -0.2)
          printf "%g %.4f %d\n", xb, sum[k] / n[k], b > base ".bars"
          for (s = 1; s <= n[k]; s++) printf "%g %.4f\n", xb, acc[k, s] > base ".dots"
          wr = world[k]
        }
        tics = tics (tics ? ", " : "") sprintf("\"%d rank%s\\nx %d image%s\" %d", wr, wr > 1 ? "s" : "", pr, pr > 1 ? "s" : "", x)
      }
      k = d SUBSEP "one-process" SUBSEP gb[d]
      if (k in n) {
        x = np[d]
        printf "%g %.4f 2\n", x, sum[k] / n[k] > base ".bars"
        for (s = 1; s <= n[k]; s++) printf "%g %.4f\n", x, acc[k, s] > base ".dots"
        tics = tics (tics ? ", " : "") sprintf("\"1 process\\nx %d images\" %d", gb[d], x)
      }
      ns = 0; for (key in seeds) { split(key, p, SUBSEP); if (p[1] == d) ns++ }
      print tics > base ".tics"
      printf "%s: %s, global batch %d, %d steps, %d seed%s\n", d, model[d], gb[d], steps[d], ns, (ns > 1 ? "s" : "") > (base ".title")
      print d > dir "/datasets"
    }
  }' "$csv"

mapfile -t datasets < "$tmp/datasets"
n=${#datasets[@]}
{
  echo "set terminal $terminal size $((560 * n)),520 font 'DejaVu Sans,11'"
  echo "set output '$png'"
  echo "set style fill solid 0.55 border -1"
  echo "set boxwidth 0.36"
  echo "set grid ytics lc rgb '#dddddd'"
  echo "set ylabel 'test accuracy (%), eval mode'"
  echo "set yrange [0:135]"
  echo "set ytics 0,20,100"
  echo "set key top center horizontal maxrows 2 width 1 samplen 2"
  echo "set bmargin 4"
  echo "set multiplot layout 1,$n title 'Plain BN vs SyncBN at 1-2 images per rank: the gap is in the BN statistics (bench/results-syncbn.md)'"
  for d in "${datasets[@]}"; do
    f="$tmp/$d"
    echo "set title '$(cat "$f.title")'"
    echo "set xtics ($(cat "$f.tics"))"
    echo "set xrange [-0.6:$(awk '{ if ($1 > m) m = $1 } END { print m + 0.6 }' "$f.bars")]"
    echo "plot '$f.bars' using 1:(\$3 == 0 ? \$2 : 1/0) with boxes lc rgb '#c0392b' title 'plain BN (lesson 04)', \\"
    echo "     '' using 1:(\$3 == 1 ? \$2 : 1/0) with boxes lc rgb '#1f5fa8' title 'SyncBN (lesson 05)', \\"
    echo "     '' using 1:(\$3 == 2 ? \$2 : 1/0) with boxes lc rgb '#888888' title 'one process, global batch', \\"
    echo "     '' using 1:2:(sprintf('%.1f', \$2)) with labels offset 0,0.8 font ',10' notitle, \\"
    echo "     '$f.dots' using 1:2 with points pt 7 ps 0.8 lc rgb 'black' title 'one seed'"
  done
  echo "unset multiplot"
} | gnuplot
echo "plot-syncbn: wrote $png"
