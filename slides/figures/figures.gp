# slides/figures/figures.gp: the measured plots of the slide decks, drawn from bench/figures/*.csv
# (numbers copied from the bench/ and lesson result files each CSV names). Run from the repository root:
#   gnuplot slides/figures/figures.gp        (or: make slide-figures)
# The PNGs are committed, so `make slides` needs no gnuplot.
set terminal pngcairo size 900,420 font "DejaVu Sans,13" linewidth 1.5
set datafile separator ","
set grid ytics lc rgb "#dddddd"
set border 3
set tics nomirror
set key top left box opaque

# ---- lesson 01: test accuracy per epoch, Fashion-MNIST on the CPU
set output "slides/figures/fmnist-accuracy.png"
set title "Lesson 01 reference, Fashion-MNIST, 2-core CPU (8 epochs, 21 min)"
set xlabel "epoch"
set ylabel "test accuracy (%)"
set xrange [0.5:8.5]
set yrange [85:93]
set xtics 1
plot "bench/figures/fmnist-accuracy.csv" using 1:2 with linespoints pt 7 ps 1.3 lc rgb "#1f5fa8" title "measured", \
     "" using 1:2:(sprintf("%.2f", $2)) with labels offset 0,1.1 notitle

# ---- lesson 02: images/s and the master's share against the number of replicas
reset
set terminal pngcairo size 900,420 font "DejaVu Sans,13" linewidth 1.5
set datafile separator ","
set grid ytics lc rgb "#dddddd"
set border 11
set tics nomirror
set output "slides/figures/dp-devices.png"
set title "Lesson 02 reference on 2 shared CPU cores (global batch 128)"
set xlabel "replicas (--devices)"
set ylabel "images/s"
set y2label "master's share of the step (%)"
set xrange [0.5:4.5]
set xtics (1, 2, 4)
set yrange [0:4000]
set y2range [0:1.4286]
set y2tics 0.2
set key top left box opaque
plot "bench/figures/dp-devices.csv" using 1:2 with linespoints pt 7 ps 1.3 lc rgb "#1f5fa8" title "synthetic, tiny-bn: images/s", \
     "" using 1:4 with linespoints pt 5 ps 1.3 lc rgb "#d9822b" title "Fashion-MNIST, fmnist: images/s", \
     "" using 1:6 axes x1y2 with linespoints pt 9 ps 1.5 dt 2 lc rgb "#b22222" title "Fashion-MNIST: master share (right axis)"

# ---- lesson 03: all-reduce bus bandwidth against the message size
reset
set terminal pngcairo size 900,420 font "DejaVu Sans,13" linewidth 1.5
set datafile separator ","
set grid lc rgb "#dddddd"
set border 3
set tics nomirror
set output "slides/figures/allreduce-busbw.png"
set title "All-reduce, 2 MPI ranks on a busy 2-core CPU (make bench-allreduce)"
set xlabel "message size"
set ylabel "bus bandwidth (GB/s)"
set logscale x 2
set xrange [700:1.1e8]
set yrange [0:6.6]
set xtics ("1 KB" 1024, "16 KB" 16384, "256 KB" 262144, "4 MB" 4194304, "64 MB" 67108864)
set key at graph 0.42,0.98 box opaque
set arrow from 241832,0 to 241832,6.3 nohead dt 3 lc rgb "#555555"
set label "fmnist gradients\n(242 KB)" at 260000,6.0 left font ",11"
set arrow from 26.3e6,0 to 26.3e6,6.3 nohead dt 3 lc rgb "#555555"
set label "ResNet-9\n(26.3 MB)" at 28e6,6.0 left font ",11"
plot "bench/figures/allreduce-mpi-2ranks.csv" using 1:2 with linespoints pt 7 lc rgb "#1f5fa8" title "the kit (pg\\_allreduce)", \
     "" using 1:3 with linespoints pt 5 dt 2 lc rgb "#888888" title "plain MPI\\_Allreduce"

# ---- lesson 03: rank 0's time split, flat vs bucketed
reset
set terminal pngcairo size 900,420 font "DejaVu Sans,13" linewidth 1.5
set datafile separator ","
set grid ytics lc rgb "#dddddd"
set border 3
set tics nomirror
set output "slides/figures/ddp-split.png"
set title "Lesson 03 reference, fmnist model, 2 epochs, CPU + MPI: rank 0's time"
set ylabel "seconds"
set xlabel "ranks: gradient all-reduce"
set yrange [0:13]
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.6
set key top right box opaque
plot "bench/figures/ddp-split.csv" using 2:xtic(1) lc rgb "#1f5fa8" title "compute (backward overlap included)", \
     "" using 3 lc rgb "#b22222" title "exposed all-reduce wait", \
     "" using 0:($2+$3):(sprintf("%d img/s", $4)) with labels offset 0,1 notitle

# ---- lesson 01: what the classic bugs do to the test accuracy
reset
set terminal pngcairo size 1000,380 font "DejaVu Sans,13" linewidth 1.5
set datafile separator ","
set grid ytics lc rgb "#dddddd"
set border 3
set tics nomirror
set termoption noenhanced
set style histogram clustered gap 1
set output "slides/figures/lesson01-bugs.png"
set title "Lesson 01, one bug planted, synthetic set, 2 epochs: test accuracy"
set ylabel "test accuracy (%)"
set yrange [0:115]
set style data histograms
set style fill solid 0.85 border -1
set boxwidth 0.6
set xtics scale 0 font ",13"
unset key
plot "bench/figures/lesson01-bugs.csv" using 2:xtic(1) lc rgb "#1f5fa8", \
     "" using 0:2:(sprintf("%.0f %%", $2)) with labels offset 0,0.8
