#!/usr/bin/env bash
# bench/run-lowp.sh BUILD OUT [ARGS...]: `make bench-lowp`. Real low-precision GEMMs beside fp32 ones on this
# machine: the CPU part (BUILD/bench/gemm_lowp_cpu: oneDNN's bf16 matmul against OpenBLAS sgemm) and, when a GPU
# is usable and BUILD/bench/gemm_lowp was built, the GPU part (cuBLAS bf16 / fp16 tensor cores against sgemm and
# TF32). ARGS go to both programs (e.g. --set resnet9 --images 4). Each part's other-work share
# (bench/cpu_share.py) goes to OUT. A part whose library is missing is skipped with a one-line reason.
set -euo pipefail
build=${1:?usage: bench/run-lowp.sh BUILD OUT [ARGS...]}
out=${2:?usage: bench/run-lowp.sh BUILD OUT [ARGS...]}
shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -xE 'avx2|avx512f|avx512_bf16|amx_bf16|avx512_fp16' | tr '\n' ' ')
model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
{
  echo "# Real low-precision GEMMs against fp32 (lesson 10's emulation rounds; these kernels are the speed)"
  echo
  echo "$(date -u +%Y-%m-%d), \`make bench-lowp${*:+ LOWP_ARGS=\"$*\"}\`; CPU: ${model:-unknown}, $(nproc) cores;" \
       "bf16-related CPU flags: ${flags:-none}."
  echo
} > "$tmp/head.md"

# ---- CPU
if [ -x "$build/bench/gemm_lowp_cpu" ]; then
  python3 bench/cpu_share.py --log "$tmp/share.log" --label "CPU GEMMs" -- "$build/bench/gemm_lowp_cpu" "$@" > "$tmp/cpu.txt"
  cpu_part=$(cat "$tmp/cpu.txt")
else
  cpu_part="CPU: skipped: oneDNN was not found when the kit was built (apt-get install libdnnl-dev, then make bench-lowp)."
fi

# ---- GPU
if [ -x "$build/bench/gemm_lowp" ] && nvidia-smi -L >/dev/null 2>&1; then
  python3 bench/cpu_share.py --log "$tmp/share.log" --label "GPU GEMMs" -- "$build/bench/gemm_lowp" "$@" > "$tmp/gpu.txt"
  gpu_part=$(cat "$tmp/gpu.txt")
elif [ -x "$build/bench/gemm_lowp" ]; then
  gpu_part="GPU: not run: no usable GPU here (nvidia-smi -L fails); scripts/gpu-check.sh precision runs it on a GPU machine."
else
  gpu_part="GPU: not run: the kit was built without CUDA (no nvcc), so $build/bench/gemm_lowp does not exist."
fi

{
  cat "$tmp/head.md"
  [ -s "$tmp/share.log" ] && python3 bench/cpu_share.py --report "$tmp/share.log" --remeasure "make bench-lowp" && echo
  echo "## CPU"
  echo
  echo "$cpu_part"
  echo
  echo "## GPU"
  echo
  echo "$gpu_part"
  echo
} > "$out"
cat "$out"
