#!/usr/bin/env bash
# Runs bench_allreduce and writes its tables, with a description of the machine, to a Markdown file.
# Usage: bench/run-allreduce.sh BUILD/bench/bench_allreduce OUT.md
#   MPI backend on NP ranks (default 2), with plain MPI_Allreduce alongside for comparison;
#   NCCL on one rank per GPU as well when a GPU is usable.
set -euo pipefail
bin=$1
out=$2
np=${NP:-2}

# scripts/launch.sh adds --allow-run-as-root / --oversubscribe when needed (LAUNCH_ARGS: extra options).
launch() { scripts/launch.sh "$@"; }

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
{
  echo "# All-reduce bandwidth of the kit's process group"
  echo
  echo "Produced by \`make bench-allreduce\` (bench/bench_allreduce.c) on $(date -u '+%Y-%m-%d %H:%M UTC')."
  echo
  echo "- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM"
  echo "- $(mpirun --version 2>/dev/null | head -n1)"
  echo "- GPUs: ${gpus}$( [ "$gpus" -gt 0 ] && nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | sed 's/^ */ x/' | tr '\n' ' ')"
  echo "- load average when it started: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "time: the slowest rank's mean per all-reduce; algbw = bytes / time; busbw = algbw * 2(n-1)/n"
  echo "(the nccl-tests definitions: busbw is what each rank's link carries, comparable to its hardware speed)."
  echo
  echo "## MPI backend, $np ranks, host buffers"
  echo
  echo "The last two columns are plain Open MPI on the same buffers: blocking MPI_Allreduce, and MPI_Iallreduce"
  echo "+ MPI_Wait. busbw vs the last column is the cost of the kit's timeout-watching poll loop; the last two"
  echo "columns differ by Open MPI's algorithms (the non-blocking in-place all-reduce is a binomial tree)."
  if awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v c="$(nproc)" 'BEGIN { exit !(l > c) }'; then
    echo
    echo "**The machine was busy (load average above its core count) while this ran: ranks lost their cores"
    echo "to other processes, so these numbers are noisy lower bounds. Rerun on a quiet machine.**"
  fi
  launch "$np" "$bin" --backend mpi --device cpu --raw | grep -v '^process group'
} >"$tmp"
if [ "$gpus" -gt 0 ]; then
  {
    echo
    echo "## NCCL backend, $gpus ranks (one per GPU), device buffers"
    launch "$gpus" "$bin" --backend nccl --device cuda | grep -v '^process group'
  } >>"$tmp" || echo "(NCCL run failed; see above)" >>"$tmp"
fi
mv "$tmp" "$out"
trap - EXIT
cat "$out"
