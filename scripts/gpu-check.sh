#!/usr/bin/env bash
# scripts/gpu-check.sh: everything that needs a GPU, in steps that fit the device machine's limits.
#
#   scripts/gpu-check.sh [STEP...]          (default: every step, in this order)
#
#   build      make all (with CUDA; CUDA_ARCH set to the GPU's own compute capability)
#   fastpath   run it FIRST (after build): the real low-precision GEMMs. make test-cuda (every CUDA op against the
#              CPU, and tests/test_cuda.c's real-vs-emulated tests: bf16/fp16 cublasGemmEx against round_lowp +
#              float32 within the derived bound, TF32 against truncated inputs, a bf16 training step, 16-bit
#              activations and gradients against float32 storage), lesson 10 on ResNet-9 (batch 512, one epoch of
#              the synthetic set) in fp32, bf16 and fp16 + the loss scaler (its first lines name the path, its
#              final line peak_mib), then the speed table: bench/torch_gpu.py --fast, the kit's fp32 / --tf32 /
#              bf16 / fp16 GEMMs (with and without 2-byte activations) beside PyTorch fp32 (TF32 off), its TF32 default and
#              channels_last + bf16 autocast, ResNet-9 width 64, batch 512 -> LOGDIR/results-fastpath.md; ~3 min
#   cpu        make test-kit: the CPU unit tests (proves the bundle's OpenBLAS/cmocka/zlib on this machine)
#   parity     make test-cuda: every CUDA op against the CPU op
#   sanitize   test_cuda under compute-sanitizer memcheck, racecheck, synccheck (one log each)
#   dist       make test-dist (MPI world 1-4, + NCCL with a GPU); lesson 03 with 1 NCCL rank and with
#              2 MPI ranks sharing the GPU; make bench-allreduce (MPI + NCCL)
#   lessons    make grade-solutions; lesson 01 (fmnist-sized net and resnet9), lesson 02 with 2 replicas;
#              lessons 04, 05, 07 on the GPU against the same run on the CPU (scripts/gpu-check-lessons.sh):
#              1 rank on NCCL, 2 ranks sharing the one GPU on the MPI backend (NCCL refuses two ranks on one
#              device), lesson 07 also started from a rendezvous store (1 rank NCCL, 2 ranks socket backend);
#              lesson 06 on a checkpoint lesson 04 wrote on the GPU, evaluated on the GPU and on the CPU;
#              lesson 08's pipeline in one process (stage 0 on the CPU, stage 1 on the GPU) and on 2 ranks
#              (MPI point-to-point), lessons 09-11 on 1 NCCL rank and 2 MPI ranks, all against the CPU
#   tests      make test-lesson03 ... test-lesson07: every lesson's multi-rank checks (CPU, the bundle's Open
#              MPI, lesson 07's store and sockets) on this machine; needs no GPU
#   fashion    lesson 01's reference schedule on Fashion-MNIST on the GPU: accuracy and seconds
#   bench      make bench-gpu: ResNet-9 training images/s beside PyTorch, and the copy to the device
#              overlapped with compute (kit/loader.c) or not, beside PyTorch copying or prefetching;
#              lesson 03 (1 rank) with the overlap and with KIT_OVERLAP=0: the time split and images/s;
#              lesson 06's latency and throughput on the GPU (ResNet-9; `make bench-inference` is CPU-only)
#   profile    the float32 step per kit kernel and per conv layer against the SGEMM ceiling
#              (build/bench/bench_profile -> LOGDIR/results-profile-gpu.md), then lesson 10's bf16 step per
#              kernel and its conv layers on cuDNN in NCHW against NHWC (--precision bf16 ->
#              LOGDIR/results-profile-bf16-gpu.md); with Nsight Systems installed,
#              the same under `nsys profile --stats=true` (every kernel, cuBLAS's too); about two minutes
#   trace      lesson 03's timeline on the GPU (--trace, 2 ranks sharing it, small buckets), checked as make
#              test-trace checks the CPU's (tools/trace_check.py: valid, nested, an all-reduce begun inside
#              backward); with Nsight Systems installed, the same program under nsys: the kit's phases as NVTX
#              ranges over its kernels (nsys's NVTX summary must name backward); about a minute
#   precision  lesson 10's speed side: cuBLAS bf16 / fp16 tensor-core GEMMs against sgemm and TF32
#              (bench/gemm_lowp.cu) and PyTorch autocast on the kit's nets, fp32 / tf32 / bf16 / fp16 + GradScaler
#              (bench/torch_autocast.py --device cuda); about a minute
#   cpubf16    needs no GPU, but the GPU machines' host CPUs have AMX: the CPU's real bf16 GEMMs (kit/cpu_bf16.h,
#              oneDNN from the bundle) against the emulation (build/tests/test_cpu_bf16: it says which kernel ran),
#              then lesson 10's speed and memory on the CPU by precision against PyTorch's CPU autocast, with the
#              bf16 path on and off (bench/precision_runs.py speed --device cpu -> LOGDIR/results-precision-speed-cpu.md),
#              then oneDNN's bf16 GEMM against OpenBLAS's SGEMM on the kit's shapes (bench/gemm_lowp_cpu --quick ->
#              LOGDIR/results-lowp-cpu.md), then ResNet-9's conv layers with float32 and with bf16 GEMMs
#              (bench/bench_cpu --gemm -> LOGDIR/results-conv-bf16-cpu.txt); about four minutes on 16 cores
#   cpufp32    needs no GPU: the host's Intel Xeon has AVX-512, where issue 34's item 7 says the kit's float32 lead
#              over PyTorch shrinks: training against PyTorch (bench/torch_cpu.py, make bench-cpu's comparison with
#              fewer step pairs -> LOGDIR/results-cpu-host.md), then lesson 03's DDP against PyTorch DDP, one round
#              (bench/torch_ddp.py -> LOGDIR/results-ddp-host.md); about four minutes on 16 cores
#
# Uses gpu-bundle/ (scripts/gpu-bundle.sh) when it is there: the GPU machines lack the kit's Debian
# packages. Each step's output goes to LOGDIR/<step>.log (LOGDIR below) and a one-line verdict to
# LOGDIR/summary.txt; a failing step does not stop the others. Without a GPU the GPU steps
# say "SKIP (no GPU here)" and the others still run.
#
# Environment: GPU_CHECK_BUDGET seconds for this whole call (default 560: the device allows 600 per
# command; a step that cannot start with 30 s left is skipped, and each is cut at what is left),
# GPU_CHECK_CAP_SCALE (default 1: each step's own time cap is set for the device's 16 cores; the selftest on
# 2 slow cores multiplies them), GPU_CHECK_LOGDIR (default results/gpu-check), GPU_BUNDLE_DIR (default
# gpu-bundle), OUT (when set, the device tool's folder: summary.txt and gpu-check-<steps>.tar.gz of every
# log are copied there after every step, so they come back even from a call cut at its limit).
# Exit status: 0 every step passed; 1 a step failed; 2 usage; 3 nothing failed but GPU steps were
# skipped because there is no GPU here.
set -u
cd "$(dirname "$0")/.."
# A fresh tree has no tests/__pycache__: the first `import grade` of a grading supervisor would write one while a
# test runs, and the grader's guard then reports the kit's files changed (the test ERRORs). Nothing here needs
# the cache.
export PYTHONDONTWRITEBYTECODE=1
all_steps=(build fastpath cpu parity sanitize dist lessons tests fashion bench precision)
steps=("$@")
all_steps+=(profile trace cpubf16 cpufp32)  # profile_step, trace_step and the CPU's own steps below
[ ${#steps[@]} -eq 0 ] && steps=("${all_steps[@]}")
for s in "${steps[@]}"; do
  case " ${all_steps[*]} " in *" $s "*) ;; *)
    echo "usage: $0 [STEP...]   steps: ${all_steps[*]} (see the top of this file)" >&2; exit 2 ;;
  esac
done

budget=${GPU_CHECK_BUDGET:-560}
logdir=${GPU_CHECK_LOGDIR:-results/gpu-check}
mkdir -p "$logdir"
summary=$logdir/summary.txt
tag=$(IFS=-; echo "${steps[*]}")
failed=0
gpu_skipped=0

say() { echo "$*" | tee -a "$summary"; }
ship() {  # copies the summary and every log to $OUT (the device tool brings back at most 8 files)
  [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] || return 0
  cp "$summary" "$OUT/summary.txt"
  tar -czf "$OUT/gpu-check-$tag.tar.gz" -C "$(dirname "$logdir")" "$(basename "$logdir")" 2>/dev/null
}

{ echo; echo "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ): steps ${steps[*]} (budget ${budget} s)"; } >> "$summary"

# ---- the bundle (a bare GPU machine lacks OpenBLAS, cmocka, Open MPI, the data)
bundle_dir=${GPU_BUNDLE_DIR:-gpu-bundle}
if [ -d "$bundle_dir" ]; then
  . scripts/gpu-bundle-env.sh
  if gpu_bundle_env "$bundle_dir" > "$logdir/bundle.log" 2>&1; then
    tee -a "$summary" < "$logdir/bundle.log"
  else
    tee -a "$summary" < "$logdir/bundle.log"
    say "gpu-check: $bundle_dir/ is there but unusable (above); going on with the system's packages"
  fi
fi

# ---- the GPU, and the CUDA arch to build for (one arch: half the nvcc time of the default two)
has_gpu=0
# The device machines keep the driver's tools in /usr/local/nvidia/bin, which may not be on PATH.
if ! command -v nvidia-smi >/dev/null && [ -x /usr/local/nvidia/bin/nvidia-smi ]; then PATH=$PATH:/usr/local/nvidia/bin; fi
if nvidia-smi -L > "$logdir/nvidia-smi.txt" 2>&1 && grep -q '^GPU ' "$logdir/nvidia-smi.txt"; then
  has_gpu=1
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
  [ -n "$cc" ] && [ -z "${CUDA_ARCH:-}" ] && export CUDA_ARCH=$cc
  say "gpu-check: $(head -n 1 "$logdir/nvidia-smi.txt") (building for sm_${CUDA_ARCH:-80 90})"
else
  say "gpu-check: no GPU here (nvidia-smi -L: $(head -n 1 "$logdir/nvidia-smi.txt")); GPU steps will be skipped"
fi
jobs=$(nproc 2>/dev/null || echo 4)

# CUDA runtime, cuBLAS, NCCL: mk/config.mk looks next to nvcc and in the default paths. Where one is only
# in a pip wheel (PyTorch's nvidia-* packages ship lib*.so.N, no lib*.so and no toolkit layout), add that
# wheel's include and lib folders and a lib*.so link to the search paths. Not tried on a real image yet.
nvcc_bin=$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
cuda_home=$(cd "$(dirname "$nvcc_bin")/.." 2>/dev/null && pwd)
find_wheel_lib() {  # HEADER LIBSTEM: adds a pip wheel's copy of the library when the default build cannot link it
  local header=$1 stem=$2 inc libf dir links
  printf '#include <%s>\nint main(void){return 0;}\n' "$header" |
    ${CC:-gcc} -x c - -I"$cuda_home/include" -L"$cuda_home/lib64" -L"$cuda_home/lib" -l"$stem" -o /dev/null \
      >/dev/null 2>&1 && { say "gpu-check: $header and lib$stem: the toolkit's ($cuda_home)"; return 0; }
  for dir in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    inc=$(find "$dir/nvidia" -maxdepth 4 -name "$header" 2>/dev/null | head -n 1)
    libf=$(find "$dir/nvidia" -maxdepth 4 -name "lib$stem.so*" 2>/dev/null | sort | head -n 1)
    [ -n "$inc" ] && [ -n "$libf" ] || continue
    mkdir -p "$logdir/links" && ln -sfn "$libf" "$logdir/links/lib$stem.so"
    links=$(cd "$logdir/links" && pwd)
    export CPATH=${CPATH:+$CPATH:}$(dirname "$inc")
    export LIBRARY_PATH=$links${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(dirname "$libf")
    export LDFLAGS="${LDFLAGS:-} -Wl,-rpath,$(dirname "$libf")"
    say "gpu-check: $header and lib$stem taken from the pip wheel in $(dirname "$(dirname "$libf")")"
    return 0
  done
  say "gpu-check: $header / lib$stem: not found next to nvcc ($cuda_home) nor in a pip wheel"
  return 1
}
# The bundle's NCCL (scripts/gpu-bundle-nccl.py: the toolkit's, with kernels for one architecture only): the
# last choice, and only for a GPU of that architecture (the kit would build, and NCCL fail at its first launch).
use_bundle_nccl() {
  local d=${GPU_BUNDLE_NCCL:-} sm
  [ -n "$d" ] && [ -f "$d/lib/libnccl.so.2" ] && [ -f "$d/include/nccl.h" ] || return 1
  sm=$(cat "$d/SM" 2>/dev/null)
  if [ $has_gpu = 1 ] && [ "${cc:-}" != "$sm" ]; then
    say "gpu-check: the bundle's NCCL has kernels for sm_$sm only and this GPU is sm_${cc:-?}: building without NCCL"
    return 1
  fi
  export CPATH=${CPATH:+$CPATH:}$d/include
  export LIBRARY_PATH=${LIBRARY_PATH:+$LIBRARY_PATH:}$d/lib
  export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d/lib
  export LDFLAGS="${LDFLAGS:-} -Wl,-rpath,$d/lib"
  say "gpu-check: nccl.h and libnccl taken from the bundle ($d: NCCL cut to sm_$sm kernels)"
}
if [ -x "$nvcc_bin" ]; then
  find_wheel_lib cuda_runtime.h cudart
  find_wheel_lib cublas_v2.h cublas
  find_wheel_lib nccl.h nccl || use_bundle_nccl
fi
sanitizer=$(command -v compute-sanitizer 2>/dev/null ||
            ls "$cuda_home/bin/compute-sanitizer" "$cuda_home/compute-sanitizer/compute-sanitizer" 2>/dev/null | head -n 1)

# What this machine is: the first thing to read when a step fails.
{
  echo "== uname: $(uname -srm); cores $jobs; $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null)"
  echo "== glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null); os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "== nvidia-smi:"; cat "$logdir/nvidia-smi.txt"
  echo "== nvcc: $nvcc_bin"; "$nvcc_bin" --version 2>&1 | tail -n 2
  echo "== cc: $(${CC:-gcc} --version 2>&1 | head -n 1); make: $(command -v make) $(make --version 2>&1 | head -n 1)"
  echo "== compute-sanitizer: ${sanitizer:-none}"
  echo "== mpirun: $(command -v mpirun) $(mpirun --version 2>&1 | head -n 1)"
  echo "== python3: $(command -v python3) $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
  echo "== env: CPATH=${CPATH:-} LIBRARY_PATH=${LIBRARY_PATH:-} LDFLAGS=${LDFLAGS:-} OPAL_PREFIX=${OPAL_PREFIX:-}"
  echo "== mk/config.mk:"; make -n --no-print-directory kit 2>&1 | grep '^config:'
} > "$logdir/machine.log" 2>&1
grep '^config:' "$logdir/machine.log" | tee -a "$summary"
ship

t_start=$SECONDS
# run NAME NEEDS_GPU CAP_SECONDS COMMAND...: logs to LOGDIR/NAME.log; PASS/FAIL/SKIP + seconds to the summary
run() {
  local name=$1 needs_gpu=$2 cap=$3; shift 3
  local left=$((budget - (SECONDS - t_start))) verdict t0=$SECONDS rc
  cap=$((cap * ${GPU_CHECK_CAP_SCALE:-1}))
  if [ "$needs_gpu" = 1 ] && [ $has_gpu = 0 ]; then
    verdict="SKIP (no GPU here)"; gpu_skipped=1; : > "$logdir/$name.log"
  elif [ $left -lt 30 ]; then
    verdict="SKIP (budget: ${left} s left)"
  else
    [ "$cap" -gt $((left - 10)) ] && cap=$((left - 10))
    timeout --kill-after=10 "$cap" "$@" > "$logdir/$name.log" 2>&1
    rc=$?
    case $rc in
      0) verdict=PASS ;;
      124|137) verdict="FAIL (timed out at ${cap} s)"; failed=1 ;;
      *) verdict="FAIL (exit $rc)"; failed=1 ;;
    esac
  fi
  printf '%-16s %-24s %4d s   %s\n' "$name" "$verdict" $((SECONDS - t0)) "$*" | tee -a "$summary"
  grep -hE '^(time|final|bench):|^gpu-check-lessons: ' "$logdir/$name.log" 2>/dev/null | sed 's/^/                 /' | tee -a "$summary"
  ship
}

train01=build/solutions/01-single-gpu/train
train02=build/solutions/02-data-parallel/train
train03=build/solutions/03-ddp/train
train04=build/solutions/04-checkpoint/train
train05=build/solutions/05-syncbn/train
train06=build/solutions/06-inference/train
train07=build/solutions/07-scale-out/train
train08=build/solutions/08-pipeline/train
train09=build/solutions/09-zero/train
train10=build/solutions/10-precision/train
train11=build/solutions/11-tensor/train
lessons=scripts/gpu-check-lessons.sh
tiny=(--model tiny --epochs 1)   # the runs tests/emu-lessons.sh compares, with its tolerances
r9w8=(--dataset synthetic --width 8 --batch-size 64 --epochs 1)   # lesson 11's (tests/lesson11/run-tests.sh)
# PyTorch runs with the LD_LIBRARY_PATH it had before the bundle (the kit's programs carry an RPATH).
orig_ld=${GPU_BUNDLE_ORIG_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}

# profile: where the float32 step spends its GPU time (bench/bench_profile.c), then Nsight Systems' own
# per-kernel summary of a shorter run where nsys is installed (cuBLAS's kernels by name, which the kit's events
# see only as the rest of the step).
profile_step() {
  local out="$logdir/results-profile-gpu.md"
  run profile 1 150 sh -c 'make build/bench/bench_profile && build/bench/bench_profile > "$0" && cat "$0"' "$out"
  run profile-bf16 1 90 sh -c 'build/bench/bench_profile --precision bf16 > "$0" && cat "$0"' "$logdir/results-profile-bf16-gpu.md"
  if command -v nsys >/dev/null 2>&1; then
    run profile-nsys 1 180 nsys profile --stats=true --force-overwrite true -o "$logdir/kit-profile" \
      build/bench/bench_profile --steps 3
  else
    say "profile-nsys     SKIP (nsys not found: Nsight Systems is not installed here)"
  fi
}

# trace: what make test-trace checks on the CPU, on the GPU; then NVTX under Nsight Systems where it is installed
# (nsys announces itself to the program through NVTX_INJECTION64_PATH, kit/trace.c, and profiles the launcher's
# children too).
trace_step() {
  local json="$logdir/trace-l03-gpu.json"
  run trace-l03 1 90 sh -c 'scripts/launch.sh 2 "$0" --device cuda --backend mpi --dataset synthetic --epochs 1 \
    --batch-size 64 --bucket-mb 0.001 --trace "$1" && python3 tools/trace_check.py "$1" --ranks 2 \
    --overlap "all-reduce bucket" backward --min-count 0:backward:10' "$train03" "$json"
  if command -v nsys >/dev/null 2>&1; then
    run trace-nvtx 1 150 sh -c 'nsys profile --trace=cuda,nvtx --stats=true --force-overwrite true -o "$0/l03-nvtx" \
      scripts/launch.sh 1 "$1" --device cuda --backend nccl --dataset synthetic --epochs 1 > "$0/l03-nvtx.txt" 2>&1
      rc=$?; cat "$0/l03-nvtx.txt"; [ $rc = 0 ] && grep -q "backward" "$0/l03-nvtx.txt"' "$logdir" "$train03"
  else
    say "trace-nvtx       SKIP (nsys not found: Nsight Systems is not installed here)"
  fi
}

for s in "${steps[@]}"; do
  case $s in
    build)
      run build 0 420 make -j"$jobs" all
      # The GPU image's compiler may be newer than the team's and warn where ours does not: rather than
      # lose the whole call to -Werror, build again without it (the failed build's log says what warned).
      if ! grep -q '^build  *PASS' <(tail -n 1 "$summary"); then
        relaxed_nvcc="-O3 -std=c++17 -Ikit $(for a in ${CUDA_ARCH:-80 90}; do printf -- '-gencode arch=compute_%s,code=sm_%s ' "$a" "$a"; done)"
        run build-no-werror 0 420 make -k -j"$jobs" all WARN="-Wall -Wextra -Wno-unused-parameter" NVCCFLAGS="$relaxed_nvcc"
      fi ;;
    fastpath)
      run fastpath-numerics 1 180 make test-cuda
      for p in fp32 bf16 fp16; do
        run "fastpath-lesson10-$p" 1 90 scripts/launch.sh 1 "$train10" --device cuda --backend nccl --model resnet9 \
          --batch-size 512 --epochs 1 --precision "$p"
      done
      run fastpath-speed 1 240 sh -c 'make build/bench/bench_gpu && LD_LIBRARY_PATH="$1" python3 bench/torch_gpu.py --kit build/bench/bench_gpu --batch 512 --fast --out "$0/results-fastpath.md" && cat "$0/results-fastpath.md"' "$logdir" "$orig_ld"
      [ -n "${OUT:-}" ] && [ -f "$logdir/results-fastpath.md" ] && cp "$logdir/results-fastpath.md" "$OUT/" ;;
    cpu)      run test-kit 0 240 make test-kit ;;
    parity)   run test-cuda 1 180 make test-cuda ;;
    sanitize)
      for tool in memcheck racecheck synccheck; do
        if [ -z "$sanitizer" ] && [ $has_gpu = 1 ]; then
          run "$tool" 1 5 sh -c 'echo "compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 1'
        else
          run "$tool" 1 240 "${sanitizer:-compute-sanitizer}" --tool "$tool" --error-exitcode 1 build/tests/test_cuda
        fi
      done ;;
    dist)
      run test-dist 0 240 make test-dist
      run lesson03-nccl1 1 120 scripts/launch.sh 1 "$train03" --device cuda --backend nccl --epochs 3
      run lesson03-mpi2 1 120 scripts/launch.sh 2 "$train03" --device cuda --backend mpi --epochs 3
      run bench-allreduce 1 180 sh -c 'make bench-allreduce && cp bench/results-allreduce.md "$0/results-allreduce.md"' "$logdir" ;;
    lessons)
      run grade 0 300 make grade-solutions   # every lesson's autograder; exits 1 when a test does not pass
      run lesson01-cuda 1 120 "$train01" --device cuda --epochs 3
      run lesson01-r9 1 180 "$train01" --device cuda --model resnet9 --batch-size 512 --epochs 2
      run lesson02-2x 1 120 "$train02" --device cuda --devices 2 --epochs 3
      run lesson04-nccl1 1 60 $lessons compare mpi:1 "$train04" "${tiny[@]}" -- --backend nccl
      run lesson04-mpi2 1 60 $lessons compare mpi:2 "$train04" "${tiny[@]}" -- --backend mpi
      run lesson05-nccl1 1 60 $lessons compare mpi:1 "$train05" --model tiny-bn --epochs 1 -- --backend nccl
      run lesson05-mpi2 1 60 $lessons compare mpi:2 "$train05" --model tiny-bn --epochs 1 -- --backend mpi
      run lesson06-infer 1 60 $lessons infer "$train04" "$train06" "$logdir/lesson06"
      run lesson07-store1 1 60 $lessons compare store:1 "$train07" "${tiny[@]}" -- --backend nccl
      run lesson07-store2 1 60 $lessons compare store:2 "$train07" "${tiny[@]}"
      run lesson07-mpi2 1 60 $lessons compare mpi:2 "$train07" "${tiny[@]}" -- --backend mpi
      run lesson07-torchrun2 1 90 env LD_LIBRARY_PATH="$orig_ld" $lessons compare torchrun:2 "$train07" "${tiny[@]}"
      # Lesson 08: two stages in one process, stage 0 on the CPU and stage 1 on the GPU (the activations cross
      # the cut device -> host -> device), then one stage per rank (2 ranks sharing the GPU: point-to-point on the
      # MPI backend; NCCL's own send/recv ran in `dist`'s mpi_dist on 1 rank).
      run lesson08-1proc 1 60 $lessons compare 1 "$train08" "${tiny[@]}" --stages 2 --micro-batches 4 \
        -- --stage-devices cpu,cuda
      run lesson08-mpi2 1 60 $lessons compare mpi:2 "$train08" "${tiny[@]}" --stages 2 --micro-batches 4 -- --backend mpi
      # Lesson 09: stage 3 with recomputation (every collective of the lesson: reduce-scatter, all-gather of each
      # unit's window) on 1 NCCL rank, then on 2 MPI ranks sharing the GPU; both against the CPU run.
      run lesson09-nccl1 1 60 $lessons compare mpi:1 "$train09" "${tiny[@]}" --zero 3 --recompute -- --backend nccl
      run lesson09-mpi2 1 60 $lessons compare mpi:2 "$train09" "${tiny[@]}" --zero 3 --recompute -- --backend mpi
      # Lesson 10: bf16 through the kit's rounding kernels on 1 NCCL rank; fp16 with the loss scaler, the bf16 ring
      # (staged through the host) and accumulation on 2 MPI ranks sharing the GPU; both against the CPU run.
      run lesson10-nccl1 1 60 $lessons compare mpi:1 "$train10" "${tiny[@]}" --precision bf16 -- --backend nccl
      run lesson10-mpi2 1 60 $lessons compare mpi:2 "$train10" "${tiny[@]}" --precision fp16 --allreduce bf16 \
        --accumulate 2 -- --backend mpi
      # Lesson 11: the tensor-parallel blocks (f's and g's all-reduces over the tensor group) on 1 NCCL rank, then
      # split over 2 MPI ranks sharing the GPU (--tp 2); ResNet-9 at width 8, one epoch, as tests/lesson11 runs it.
      run lesson11-nccl1 1 60 $lessons compare mpi:1 "$train11" "${r9w8[@]}" -- --backend nccl
      run lesson11-mpi2 1 90 $lessons compare mpi:2 "$train11" "${r9w8[@]}" --tp 2 -- --backend mpi ;;
    tests)
      for n in 03 04 05 06 07; do run "test-lesson$n" 0 180 make "test-lesson$n"; done
      run test-torchrun 0 300 env LD_LIBRARY_PATH="$orig_ld" make test-torchrun ;;
    fashion)
      if [ -f "${FASHION_DIR:-/usr/share/datasets/fashion-mnist}/train-images-idx3-ubyte.gz" ]; then
        run fashion01 1 420 "$train01" --device cuda --dataset fashion-mnist \
          --data-dir "${FASHION_DIR:-/usr/share/datasets/fashion-mnist}" --metrics "$logdir/fashion01.csv"
      else  # the bundle's data left out to fit the 64 MiB (scripts/gpu-bundle.sh says when)
        say "fashion01        SKIP (no Fashion-MNIST in ${FASHION_DIR:-/usr/share/datasets/fashion-mnist})"
      fi ;;
    bench)
      run bench-gpu 1 420 env LD_LIBRARY_PATH="$orig_ld" sh -c 'make bench-gpu && cp bench/results-gpu.md "$0/results-gpu.md"' "$logdir"
      # The overlap in a lesson's own loop: compare the two `final:` lines (images_per_s) and `time:` lines.
      run overlap-l03 1 90 scripts/launch.sh 1 "$train03" --device cuda --backend mpi --epochs 2
      run no-overlap-l03 1 90 env KIT_OVERLAP=0 scripts/launch.sh 1 "$train03" --device cuda --backend mpi --epochs 2
      # Lesson 06 on the GPU: batch-1 latency and batch-256 throughput (weights from 2 steps: they do not change
      # the time), the kit's side of bench/inference.sh, whose PyTorch side runs on the CPU only.
      run infer-latency 1 90 sh -c '"$0" --dataset synthetic --model resnet9 --batch-size 16 --stop-at 2 --device cpu \
        --checkpoint "$2/r9.ckpt" >/dev/null && "$1" --dataset synthetic --model resnet9 --checkpoint "$2/r9.ckpt" --device cuda --latency' \
        "$train04" "$train06" "$logdir" ;;
    profile) profile_step ;;
    trace) trace_step ;;
    cpubf16)
      run cpu-bf16-test 0 60 sh -c 'make build/tests/test_cpu_bf16 && build/tests/test_cpu_bf16'
      run cpu-bf16-speed 0 300 env LD_LIBRARY_PATH="$orig_ld" python3 bench/precision_runs.py speed --device cpu \
        --train "$train10" --out "$logdir/results-precision-speed-cpu.md"
      run cpu-bf16-gemm 0 120 sh -c 'make build/bench/gemm_lowp_cpu && build/bench/gemm_lowp_cpu --quick > "$0" && cat "$0"' \
        "$logdir/results-lowp-cpu.md"
      # ResNet-9's conv layers and step at batch 64 with float32 GEMMs, then bf16 ones: each layer's time beside the
      # GEMM rates above says what im2col and the conversions cost around oneDNN's bf16 matmul.
      run cpu-bf16-conv 0 120 sh -c 'make build/bench/bench_cpu && for g in fp32 bf16; do build/bench/bench_cpu \
        --what train,conv --models resnet9 --batch 64 --steps 3 --gemm $g; done > "$0" 2>&1; cat "$0"' \
        "$logdir/results-conv-bf16-cpu.txt" ;;
    cpufp32)
      # make with the bundle's environment, PyTorch with the one it had before ($1: see orig_ld above).
      run cpu-fp32-train 0 180 sh -c 'make build/bench/bench_cpu && LD_LIBRARY_PATH="$1" python3 bench/torch_cpu.py \
        --kit-bin build/bench/bench_cpu --pairs resnet9=4,fmnist=10 --out "$0" && cat "$0"' \
        "$logdir/results-cpu-host.md" "$orig_ld"
      run cpu-fp32-ddp 0 180 sh -c 'make build/bench/ddp_kit && LD_LIBRARY_PATH="$1" python3 bench/torch_ddp.py \
        --kit-bin build/bench/ddp_kit --rounds 1 --out "$0" && cat "$0"' "$logdir/results-ddp-host.md" "$orig_ld" ;;
    precision)
      run gemm-lowp 1 90 sh -c 'make build/bench/gemm_lowp && build/bench/gemm_lowp > "$0/results-lowp-gpu.md" && cat "$0/results-lowp-gpu.md"' "$logdir"
      run autocast-cuda 1 150 env LD_LIBRARY_PATH="$orig_ld" python3 bench/torch_autocast.py --device cuda --rounds 1 \
        --out "$logdir/results-autocast-gpu.md" ;;
  esac
done

elapsed=$((SECONDS - t_start))
if [ $failed = 1 ]; then result="some step FAILED"; rc=1
elif [ $gpu_skipped = 1 ]; then result="no failure, but GPU steps were skipped (no GPU here)"; rc=3
else result="every step passed"; rc=0; fi
say "gpu-check: $result; ${elapsed} s; summary in $summary${OUT:+, logs in \$OUT/gpu-check-$tag.tar.gz}"
ship
exit $rc
