#!/usr/bin/env bash
# Runs bench/ring_allreduce (lesson 07's ring over TCP sockets vs MPI_Allreduce; then vs gloo over TCP, through
# bench/torch_gloo.py, when PyTorch is there) and writes its tables, with a
# description of the machine and of the other work that ran meanwhile (bench/cpu_share.py), to a Markdown file.
# Usage: bench/run-ring.sh BUILD/bench/ring_allreduce OUT.md      (NP="2 4": the world sizes; MAX_MB=16)
set -euo pipefail
bin=$1
out=$2
tmp=$(mktemp)
body=$(mktemp)
sharelog=$(mktemp)
trap 'rm -f "$tmp" "$body" "$sharelog"' EXIT
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)
# measured LABEL CMD...: runs CMD and records how much of the machine other work took meanwhile.
measured() { local label=$1; shift; python3 bench/cpu_share.py --log "$sharelog" --label "$label" -- "$@"; }
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
    {
      echo
      echo "## $np ranks, MPI over $( [ $transport = tcp ] && echo 'TCP (btl tcp,self)' || echo 'its default (shared memory)')"
      echo
    } >>"$body"
    if [ $transport = tcp ]; then
      OMPI_MCA_btl=tcp,self measured "$np ranks, MPI over TCP" scripts/launch.sh "$np" "$bin" "${MAX_MB:-16}" >>"$body"
    else measured "$np ranks, MPI over shared memory" scripts/launch.sh "$np" "$bin" "${MAX_MB:-16}" >>"$body"; fi
  done
done
# Against gloo over TCP, 1 to 64 MB on 2 processes: bench/torch_gloo.py runs the ring's job and gloo's alternately
# (GLOO_ARGS="--rounds 5" for a steadier run) and appends its jobs to the share log.
gloo=$(mktemp)
if python3 -c "import torch" 2>/dev/null; then
  python3 bench/torch_gloo.py --against ring --kit-bin "$bin" --out "$gloo" --share-log "$sharelog" ${GLOO_ARGS:-}
  cat "$gloo" >>"$body"
else
  printf '\n## Against gloo\n\nSkipped: no PyTorch in python3 (pip install torch).\n' >>"$body"
fi
rm -f "$gloo"
# The share of the machine other work took goes on top, with the LOADED mark when it was too much.
{ echo; python3 bench/cpu_share.py --report "$sharelog" --remeasure "make bench-ring"; cat "$body"; } >>"$tmp"
mv "$tmp" "$out"
trap - EXIT
cat "$out"
