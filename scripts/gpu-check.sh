#!/usr/bin/env bash
# scripts/gpu-check.sh: everything that needs a GPU, in one go, for a machine that has one.
#
#   scripts/gpu-check.sh [OUTDIR]      (default results/gpu-check)
#
# Builds with CUDA, runs the CUDA parity tests, the same under compute-sanitizer (memcheck, racecheck,
# synccheck), the process-group tests (they add GPU-buffer and NCCL runs when nvidia-smi lists a GPU),
# the three lessons on the GPU (lesson 02 with 2 replicas on GPU 0, lesson 03 with 1 NCCL rank and with
# 2 MPI ranks sharing the GPU), and the GPU benchmark. Each step's output goes to OUTDIR/<step>.log and a
# one-line verdict to OUTDIR/summary.txt; a failing step does not stop the others.
set -u
cd "$(dirname "$0")/.."
out=${1:-results/gpu-check}
mkdir -p "$out"
: > "$out/summary.txt"

if ! nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1; then
  echo "gpu-check: no GPU here (nvidia-smi -L failed); nothing to do" | tee -a "$out/summary.txt"
  exit 1
fi
jobs=$(nproc 2>/dev/null || echo 4)

step() {  # step NAME COMMAND...: runs it, logs it, records PASS/FAIL and the time
  local name=$1; shift
  local t0=$SECONDS
  if "$@" > "$out/$name.log" 2>&1; then verdict=PASS; else verdict="FAIL (exit $?)"; fi
  printf '%-22s %-12s %4d s   %s\n' "$name" "$verdict" $((SECONDS - t0)) "$*" | tee -a "$out/summary.txt"
}

train01=build/solutions/01-single-gpu/train
step build          make -j"$jobs" all
step test-cuda      make test-cuda
step memcheck       make test-cuda-memcheck
step test-dist      make test-dist
step grade          make grade SOLUTIONS=1
step lesson01-cuda  "$train01" --device cuda --epochs 3
step lesson01-r9    "$train01" --device cuda --model resnet9 --batch-size 512 --epochs 2
step lesson02-2x    build/solutions/02-data-parallel/train --device cuda --devices 2 --epochs 3
step lesson03-nccl  scripts/launch.sh 1 build/solutions/03-ddp/train --device cuda --backend nccl --epochs 3
step lesson03-mpi2  scripts/launch.sh 2 build/solutions/03-ddp/train --device cuda --backend mpi --epochs 3
step bench-gpu      make bench-gpu
step bench-allreduce make bench-allreduce
echo "gpu-check: summary in $out/summary.txt"
