# Plots of a specsample-bench run (scripts/bench.sh calls this):
#   gnuplot -e "dir='docs/benchmarks'; label='shakespeare-draft → shakespeare-target'" benchmarks/plot.gp
# reads dir/speedup.dat and dir/acceptance.dat (one index block per temperature, first line a
# column header) and writes dir/speedup.png and dir/acceptance.png.
if (!exists("dir")) dir = "docs/benchmarks"
if (!exists("label")) label = ""
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
  set terminal pngcairo size 1120,600 enhanced font ",11"
} else {
  set terminal png size 1120,600
}
set key outside right top box
set xtics 1
set grid
set key autotitle columnheader

set output dir."/speedup.png"
set title "Speculative vs autoregressive: measured (paired median, min–max) and predicted speedup\n".label
set xlabel "K (draft tokens per round)"
set ylabel "speedup (autoregressive time / speculative time)"
set offsets 0.3, 0.3, 0, 0
set yrange [0:*]
plot 1 with lines dt 3 lc rgb "gray40" title "break-even", \
     for [i=0:*] dir."/speedup.dat" index i using 1:2:3:4 with yerrorlines lw 2 pt 7 lc i+1 title columnheader(2), \
     for [i=0:*] dir."/speedup.dat" index i using 1:5 with lines dt 2 lw 2 lc i+1 title columnheader(5), \
     for [i=0:*] dir."/speedup.dat" index i using 1:6 with lines dt 3 lw 1 lc i+1 title columnheader(6)

set output dir."/acceptance.png"
set title "P(draft i accepted | drafts 1..i−1 accepted), at the largest K\n".label
set xlabel "draft position i"
set ylabel "acceptance probability"
set yrange [0:1]
plot for [i=0:*] dir."/acceptance.dat" index i using 1:2 with linespoints lw 2 pt 7 lc i+1 title columnheader(2), \
     for [i=0:*] dir."/acceptance.dat" index i using 1:3 with lines dt 2 lc i+1 title columnheader(3)
