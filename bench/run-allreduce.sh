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
# measured LABEL CMD...: runs CMD and records how much of the machine other work took meanwhile (bench/cpu_share.py).
measured() { local label=$1; shift; python3 bench/cpu_share.py --log "$sharelog" --label "$label" -- "$@"; }

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
tmp=$(mktemp)
body=$(mktemp)
sharelog=$(mktemp)
trap 'rm -f "$tmp" "$body" "$sharelog"' EXIT
{
  echo "# All-reduce bandwidth of the kit's process group"
  echo
  echo "Produced by \`make bench-allreduce\` (bench/bench_allreduce.c) on $(date -u '+%Y-%m-%d %H:%M UTC')."
  echo
  echo "- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM"
  echo "- $(mpirun --version 2>/dev/null | head -n1)"
  echo "- GPUs: ${gpus}$( [ "$gpus" -gt 0 ] && nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | sed 's/^ */ x/' | tr '\n' ' ')"
  echo
  echo "time: the slowest rank's mean per all-reduce; algbw = bytes / time; busbw = algbw * 2(n-1)/n"
  echo "(the nccl-tests definitions: busbw is what each rank's link carries, comparable to its hardware speed)."
} >"$tmp"
{
  echo
  echo "## MPI backend, $np ranks, host buffers"
  echo
  echo "The last two columns are plain Open MPI on the same buffers: blocking MPI_Allreduce, and MPI_Iallreduce"
  echo "+ MPI_Wait. Up to 4 MB, busbw vs the last column is the cost of the kit's timeout-watching poll loop; above,"
  echo "the kit hands MPI its buffer in 4 MB pieces, one after the other, which keeps Open MPI's scratch and sums in"
  echo "the caches (kit/README.md, \"The all-reduce algorithm\"): there it beats both plain calls. The last two"
  echo "columns differ by Open MPI's algorithms (pg_init selects libnbc's ring for the non-blocking one on 2 ranks; see below)."
  measured "$np ranks, sizes" scripts/launch.sh "$np" "$bin" --backend mpi --device cpu --raw | grep -v '^process group'
} >"$body"
# libnbc's algorithm for the kit's MPI_Iallreduce: the ring (pg_init selects it on 2 ranks) vs the binomial tree that is
# libnbc's default for in-place buffers, Rabenseifner's reduce-scatter + all-gather and recursive doubling (the
# environment variable wins over pg_init's choice). ALGO_NPS="2 4 8": rank counts compared.
{
  rows=""
  for n in ${ALGO_NPS:-2 4 8}; do
    for alg in 2:binomial 1:ring 3:rabenseifner 4:recursive_doubling; do
      rows+=$(OMPI_MCA_coll_libnbc_iallreduce_algorithm=${alg%%:*} measured "$n ranks ${alg#*:}" \
                scripts/launch.sh "$n" "$bin" --backend mpi --device cpu \
                --raw --min 64K --max 16M --seconds 0.3 |
              awk -F'|' -v n="$n" -v a="${alg#*:}" '$2 ~ /^ (64 KB|1 MB|4 MB|16 MB) $/ {
                printf "| %d | %s | %s | %s | %s |\n", n, $2, a, $6, $7 }')$'\n'
    done
  done
  echo
  echo "## MPI backend: libnbc's algorithms for the kit's non-blocking all-reduce"
  echo
  echo "OMPI_MCA_coll_libnbc_iallreduce_algorithm=2 (binomial tree), 1 (ring), 3 (Rabenseifner: reduce-scatter by"
  echo "recursive halving + all-gather by recursive doubling) or 4 (recursive doubling), each run 64 KB..16 MB,"
  echo "busbw in GB/s. Traffic per rank for n bytes on N ranks: ring and Rabenseifner 2n(N-1)/N, binomial tree and"
  echo "recursive doubling n log2(N) (the whole buffer at every level)."
  echo "The kit uses the ring on 2 ranks only (pg_init in kit/dist.c: from 3 ranks on, the ring's order of additions"
  echo "depends on the buffer's length, so bucketed gradients would differ in their last bits from flat ones)."
  echo "More ranks than cores are oversubscribed: the rank counts above the core count show the curve's shape only."
  echo
  echo "| ranks | size | libnbc algorithm | kit busbw | blocking MPI_Allreduce busbw |"
  echo "|------:|-----:|:-----------------|----------:|-----------------------------:|"
  printf '%s' "$rows"
} >>"$body"
# Against gloo, PyTorch's CPU backend, at 1, 4, 16 and 64 MB on 2 processes: bench/torch_gloo.py runs the kit's job
# and gloo's alternately (GLOO_ARGS="--rounds 5" for a steadier run) and appends its jobs to the share log.
gloo=$(mktemp)
if python3 -c "import torch" 2>/dev/null; then
  python3 bench/torch_gloo.py --against allreduce --kit-bin "$bin" --out "$gloo" --share-log "$sharelog" ${GLOO_ARGS:-}
  cat "$gloo" >>"$body"
else
  printf '\n## Against gloo\n\nSkipped: no PyTorch in python3 (pip install torch).\n' >>"$body"
fi
rm -f "$gloo"
if [ "$gpus" -gt 0 ]; then
  {
    echo
    echo "## NCCL backend, $gpus ranks (one per GPU), device buffers"
    launch "$gpus" "$bin" --backend nccl --device cuda | grep -v '^process group'
  } >>"$body" || echo "(NCCL run failed; see above)" >>"$body"
fi
# The share of the machine other work took goes on top, with the LOADED mark when it was too much.
{ echo; python3 bench/cpu_share.py --report "$sharelog" --remeasure "make bench-allreduce"; cat "$body"; } >>"$tmp"
mv "$tmp" "$out"
trap - EXIT
cat "$out"
