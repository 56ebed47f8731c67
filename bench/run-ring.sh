#!/usr/bin/env bash
# Runs bench/ring_allreduce (lesson 07's ring over TCP sockets vs MPI_Allreduce) and writes its tables, with a
# description of the machine and its load, to a Markdown file.
# Usage: bench/run-ring.sh BUILD/bench/ring_allreduce OUT.md      (NP="2 4": the world sizes; MAX_MB=16)
set -euo pipefail
bin=$1
out=$2
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)
busy() { awk -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN { exit !(l > 1.5) }'; }
{
  echo "# Lesson 07: a ring all-reduce over TCP sockets against MPI_Allreduce"
  echo
  echo "Produced by \`make bench-ring\` (bench/ring_allreduce.c, the ring of solutions/07-scale-out/ring.c) on"
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), all ranks on one machine."
  echo
  echo "- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM"
  echo "- $(mpirun --version 2>/dev/null | head -n1)"
  echo
  echo "time: the slowest rank's mean per all-reduce; busbw = bytes / time * 2(n-1)/n (the nccl-tests definition)."
  echo "The ring always goes through the kernel's TCP stack (loopback here). Open MPI on one machine uses shared"
  echo "memory by default (first table of each size): the fair comparison for the ring is the second table, where"
  echo "\`OMPI_MCA_btl=tcp,self\` makes MPI use TCP over loopback too."
} >"$tmp"
for np in ${NP:-2 4}; do
  for transport in default tcp; do
    load_before=$(cut -d' ' -f1-3 /proc/loadavg)
    {
      echo
      echo "## $np ranks, MPI over $( [ $transport = tcp ] && echo 'TCP (btl tcp,self)' || echo 'its default (shared memory)')"
      echo
      echo "load average before: $load_before"
      busy && { echo; echo "**The machine was busy (load average above 1.5): ranks lost their cores to other processes;"
                echo "these numbers are noisy lower bounds. Rerun on a quiet machine.**"; }
      echo
    } >>"$tmp"
    if [ $transport = tcp ]; then OMPI_MCA_btl=tcp,self scripts/launch.sh "$np" "$bin" "${MAX_MB:-16}" >>"$tmp"
    else scripts/launch.sh "$np" "$bin" "${MAX_MB:-16}" >>"$tmp"; fi
    echo >>"$tmp"
    echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$tmp"
  done
done
mv "$tmp" "$out"
trap - EXIT
cat "$out"
