#!/usr/bin/env bash
# scripts/check-setup.sh (`make check-setup`): what this machine has and lacks for each lesson.
# Attendees run it before the workshop day; it changes nothing.
#
#   scripts/check-setup.sh [--help]
#
# One line per item: OK, MISSING (a lesson cannot run without it) or WARN (it runs, with a caveat, or an
# optional part is absent), and under a line that is not OK the one command that fixes it. At the end, one
# line per lesson. Exit status: 0 when lesson 01 can run here (build, train on the CPU, `make grade`),
# 1 when it cannot, 2 for a bad option.
#
# Environment (the same variables the build reads; tests/check-setup/ uses them to imitate other machines):
#   CC                     the C compiler to probe (default gcc, as mk/config.mk)
#   CUDA_ARCH              the GPU architectures the build targets (default "80 90", as mk/config.mk)
#   CHECK_SETUP_CUDA_HOME  where to look for the CUDA toolkit when nvcc is not on PATH (default /usr/local/cuda)
#   CHECK_SETUP_PCI_DIR    the PCI device list, to tell "no NVIDIA GPU" from "no driver" (default /sys/bus/pci/devices)
#   FASHION_DIR, DATA_DIR  where the datasets are looked for (as datasets/get-data.sh)
# shellcheck disable=SC2086,SC2046  # compiler flag lists are split into words on purpose
set -uo pipefail

case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 0 ;;
  *) echo "check-setup: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cuda_arch=${CUDA_ARCH:-80 90}
cuda_home_default=${CHECK_SETUP_CUDA_HOME:-/usr/local/cuda}
pci_dir=${CHECK_SETUP_PCI_DIR:-/sys/bus/pci/devices}
fashion_dir=${FASHION_DIR:-/usr/share/datasets/fashion-mnist}
data_dir=${DATA_DIR:-$root/datasets/data}

# apt commands are printed with sudo unless we are root: the line can be pasted as it is.
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo "
apt_fix() { echo "${sudo}apt-get install -y $*"; }

n_missing=0
declare -A have   # item -> 1 when OK or WARN (usable), for the per-lesson summary

# report STATUS ITEM DETAIL [FIX]
report() {
  printf '  %-8s %-17s %s\n' "$1" "$2" "$3"
  [ -n "${4:-}" ] && printf '  %-8s %-17s fix: %s\n' "" "" "$4"
  case "$1" in
    OK|WARN) have[$2]=1 ;;
    MISSING) n_missing=$((n_missing + 1)) ;;
  esac
  return 0
}

# try_link HEADERS BODY FLAGS...: builds and links a tiny program; true when it links.
try_link() {
  local headers=$1 body=$2
  shift 2
  printf '%b\nint main(void){%s;return 0;}\n' "$headers" "$body" |
    "$cc" -x c - -o /dev/null "$@" >/dev/null 2>&1
}

# The lessons (first-last) and those that start ranks (NEEDS := mpi), read from the lesson folders.
lesson_nums=$(cd "$root/solutions" 2>/dev/null && ls -d [0-9][0-9]-*/ 2>/dev/null | cut -c1-2)
mpi_lessons=$(for n in $lesson_nums; do grep -qs '^NEEDS *:=.*\bmpi\b' "$root"/solutions/"$n"-*/lesson.mk && printf '%s ' "$n"; done)
mpi_lessons=${mpi_lessons% }
all_lessons="$(echo $lesson_nums | cut -d' ' -f1)-$(echo $lesson_nums | awk '{print $NF}')"
echo "check-setup: what this machine has for the workshop (lessons $all_lessons)"
echo "machine:"

# ---------------------------------------------------------------- machine
cores=$(nproc 2>/dev/null || echo 1)
mem_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || echo 0)
mem_gib=$(awk -v k="${mem_kb:-0}" 'BEGIN {printf "%.1f", k / 1048576}')
disk_gib=$(df -Pk "$root" 2>/dev/null | awk 'NR == 2 {printf "%.1f", $4 / 1048576}')
if [ "$cores" -ge 2 ]; then
  report OK cores "$cores (lesson 03 runs 2 ranks by default, 4 in its maintainer checks)"
else
  report WARN cores "1: everything runs, slowly; MPI needs --oversubscribe for 2 ranks (scripts/launch.sh adds it)"
fi
if awk -v g="$mem_gib" 'BEGIN {exit !(g >= 2)}'; then
  report OK memory "$mem_gib GiB available"
else
  report WARN memory "$mem_gib GiB available: the autograder allows a test 4 GiB" "close other programs"
fi
if awk -v g="${disk_gib:-0}" 'BEGIN {exit !(g >= 3)}'; then
  report OK disk "$disk_gib GiB free here (build folders and CIFAR-10 take about 1 GiB)"
else
  report WARN disk "${disk_gib:-?} GiB free here: a build plus CIFAR-10 needs about 1 GiB" "make clean"
fi

# ---------------------------------------------------------------- toolchain and libraries (every lesson)
echo "every lesson (01 onwards):"
cc=${CC:-gcc}
if ! command -v "$cc" >/dev/null 2>&1; then
  for c in gcc cc clang; do command -v "$c" >/dev/null 2>&1 && { cc=$c; break; }; done
fi
if ! command -v "$cc" >/dev/null 2>&1; then
  report MISSING "C compiler" "no ${CC:-gcc}, cc or clang on PATH" "$(apt_fix build-essential)"
  cc=false
elif ! try_link '#include <omp.h>' 'return omp_get_max_threads() < 1' -fopenmp; then
  report MISSING "C compiler" "$cc cannot build OpenMP programs (-fopenmp)" \
    "$(apt_fix "$([[ $cc == *clang* ]] && echo libomp-dev || echo build-essential)")"
else
  report OK "C compiler" "$cc $("$cc" -dumpversion 2>/dev/null), with OpenMP"
fi

if command -v make >/dev/null 2>&1; then
  report OK make "$(make --version 2>/dev/null | head -n 1)"
else
  report MISSING make "not on PATH" "$(apt_fix make)"
fi

blas_flags=$(pkg-config --cflags --libs openblas 2>/dev/null || true)
if try_link '#include <cblas.h>' \
    'cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,0,0,0,0,0,0,0,0,0,0,0)' ${blas_flags:--lopenblas}; then
  report OK OpenBLAS "cblas.h and libopenblas link"
else
  report MISSING OpenBLAS "no cblas.h or libopenblas: the CPU matrix products (every convolution)" \
    "$(apt_fix libopenblas-dev)"
fi

if try_link '#include <zlib.h>' 'crc32(0,0,0)' -lz; then
  report OK zlib "zlib.h and libz link (gzip datasets, CRC-32)"
else
  report MISSING zlib "no zlib.h or libz: Fashion-MNIST is gzip, checkpoints use CRC-32" "$(apt_fix zlib1g-dev)"
fi

cmocka_flags=$(pkg-config --cflags --libs cmocka 2>/dev/null || true)
if try_link '#include <stdarg.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <setjmp.h>\n#include <cmocka.h>' \
    '_cmocka_run_group_tests(0,0,0,0,0)' ${cmocka_flags:--lcmocka}; then
  report OK cmocka "the test framework of the autograder (make grade)"
else
  report MISSING cmocka "no cmocka: \`make grade\` cannot build the autograder" "$(apt_fix libcmocka-dev)"
fi

if command -v python3 >/dev/null 2>&1; then
  report OK python3 "$(python3 --version 2>&1) (runs the grading driver)"
else
  report MISSING python3 "not on PATH: \`make grade\` runs tests/grade.py" "$(apt_fix python3)"
fi

# ---------------------------------------------------------------- data
if [ -s "$fashion_dir/train-images-idx3-ubyte.gz" ] && [ -s "$fashion_dir/t10k-labels-idx1-ubyte.gz" ]; then
  report OK Fashion-MNIST "in $fashion_dir (the CPU runs)"
else
  report WARN Fashion-MNIST "not in $fashion_dir: the synthetic set still works (no download)" \
    "$(apt_fix dataset-fashion-mnist)"
fi
cifar_ok=1
for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
  [ "$(stat -c %s "$data_dir/cifar-10-batches-bin/$f.bin" 2>/dev/null)" = 30730000 ] || cifar_ok=0
done
if [ $cifar_ok = 1 ]; then
  report OK CIFAR-10 "in $data_dir/cifar-10-batches-bin (the GPU runs)"
else
  report WARN CIFAR-10 "not in $data_dir: needed only for GPU runs; fetch it before the day (170 MB)" \
    "datasets/fetch.sh cifar10"
fi

# ---------------------------------------------------------------- MPI (lesson 03 onwards)
echo "lesson 03 onwards (Open MPI):"
mpicc_ok=0
if command -v mpicc >/dev/null 2>&1 &&
   try_link '#include <mpi.h>' 'MPI_Init(0,0)' $(mpicc --showme:compile 2>/dev/null) $(mpicc --showme:link 2>/dev/null); then
  mpicc_ok=1
fi
if ! command -v mpirun >/dev/null 2>&1 || [ $mpicc_ok = 0 ]; then
  report MISSING "Open MPI" "$(command -v mpirun >/dev/null 2>&1 || echo "no mpirun")$( [ $mpicc_ok = 0 ] && echo " no mpi.h/libmpi (mpicc)"): lessons ${mpi_lessons// /, } cannot start ranks" \
    "$(apt_fix openmpi-bin libopenmpi-dev)"
else
  version=$(mpirun --version 2>/dev/null | head -n 1)
  flags=()
  notes=()
  if [ "$(id -u)" -eq 0 ]; then
    flags+=(--allow-run-as-root)
    notes+=("running as root: mpirun needs --allow-run-as-root")
  fi
  # lesson 03 runs 2 ranks; its maintainer checks run up to 4; beyond the cores Open MPI wants --oversubscribe
  if [ "$cores" -lt 4 ]; then
    notes+=("$cores core(s): more than $cores ranks need --oversubscribe")
  fi
  [ "$cores" -lt 2 ] && flags+=(--oversubscribe)
  # A real launch: the only proof that mpirun works in this container / VM.
  log=$(timeout 60 mpirun "${flags[@]}" -np 2 true 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    notes+=("scripts/launch.sh adds these flags")
    report OK "Open MPI" "$version; \`mpirun ${flags[*]:+${flags[*]} }-np 2\` works"
    for n in "${notes[@]}"; do printf '  %-8s %-17s %s\n' "" "" "$n"; done
  else
    first=$(grep -v '^-*$' <<< "$log" | head -n 1)
    report WARN "Open MPI" "installed, but \`mpirun ${flags[*]:+${flags[*]} }-np 2 true\` failed (exit $rc): ${first:-no message}" \
      "LAUNCH_ARGS=\"--mca btl_vader_single_copy_mechanism none\" make lesson-03 NP=2   (containers; README: Troubleshooting)"
  fi
fi

# ---------------------------------------------------------------- libpng (lesson 06)
echo "lesson 06 (inference):"
png_flags=$(pkg-config --cflags --libs libpng 2>/dev/null || true)
if try_link '#include <png.h>' 'png_image i; png_image_free(&i)' ${png_flags:--lpng}; then
  report OK libpng "png.h and libpng link (lesson 06 reads PNG image files)"
else
  report MISSING libpng "no png.h or libpng: lesson 06 cannot be built" "$(apt_fix libpng-dev)"
fi

# ---------------------------------------------------------------- lesson 07's optional parts
# Its exercise (the store, the socket ring) needs nothing more than lesson 03; the local Slurm and the two
# namespace "hosts" need root and packages the default install leaves out. Nothing here is started.
echo "lesson 07, optional parts (the local Slurm, two hosts in network namespaces):"
slurm_missing=()   # (a WARN counts as usable in have[]: the summary below reads these lists instead)
for c in slurmctld slurmd srun sbatch scontrol; do
  command -v "$c" >/dev/null 2>&1 || slurm_missing+=("$c")
done
if [ ${#slurm_missing[@]} -eq 0 ]; then
  report OK Slurm "slurmctld, slurmd and the client commands (make slurm-up)"
else
  report WARN Slurm "no ${slurm_missing[*]}: \`make slurm-up\` and the Slurm part of \`make test-scaleout\` cannot run" \
    "scripts/install-deps.sh --slurm"
fi
ns_missing=()
for c in ip unshare; do command -v "$c" >/dev/null 2>&1 || ns_missing+=("$c"); done
is_root=$([ "$(id -u)" -eq 0 ] && echo 1 || echo 0)
if [ "$is_root" = 0 ]; then
  report WARN root "not root: the local Slurm (slurmd runs jobs as their user) and network namespaces need root" \
    "run those two demos as root (sudo -i), or watch them on the projector"
elif [ ${#ns_missing[@]} -gt 0 ]; then
  report WARN root "root, but no ${ns_missing[*]}: scripts/netns-cluster.sh cannot make namespaces" \
    "$(apt_fix iproute2 util-linux)"
else
  report OK root "root, with ip and unshare: make slurm-up and scripts/netns-cluster.sh can run (a container may still refuse namespaces)"
fi

# ---------------------------------------------------------------- GPU, driver, toolkit, NCCL
echo "GPU (optional: every lesson also runs on the CPU):"
nvidia_on_pci=0
for v in "$pci_dir"/*/vendor; do
  [ -r "$v" ] && [ "$(cat "$v" 2>/dev/null)" = 0x10de ] && nvidia_on_pci=1 && break
done

gpu_ok=0
driver_cuda=""
if command -v nvidia-smi >/dev/null 2>&1 && smi=$(nvidia-smi 2>&1); then
  driver_cuda=$(sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' <<< "$smi" | head -n 1)
  query=$(nvidia-smi --query-gpu=index,name,compute_cap,memory.free,memory.total,driver_version \
                     --format=csv,noheader,nounits 2>/dev/null)
  if [ -z "$query" ]; then
    report MISSING GPU "nvidia-smi runs but lists no GPU" "nvidia-smi -L"
  else
    gpu_ok=1
    n_gpus=$(grep -c . <<< "$query")
    while IFS=',' read -r idx name cap free total driver; do
      idx=${idx// /} cap=${cap// /} free=${free// /} total=${total// /} name=${name# } driver=${driver// /}
      detail="GPU $idx: $name, compute capability ${cap:-?}, $((free / 1024)) of $((total / 1024)) GiB free, driver $driver"
      # A build for sm_XY runs on compute capability X.Z with Z >= Y (same major): mk/config.mk builds
      # cubins only (no PTX), so a GPU outside CUDA_ARCH cannot launch the kit's kernels.
      covered=0
      if [[ $cap =~ ^([0-9]+)\.([0-9]+)$ ]]; then
        for a in $cuda_arch; do
          if [ "${a:0:${#a}-1}" = "${BASH_REMATCH[1]}" ] && [ "${a: -1}" -le "${BASH_REMATCH[2]}" ]; then covered=1; fi
        done
        arch=${BASH_REMATCH[1]}${BASH_REMATCH[2]}
      fi
      if [ $covered = 0 ]; then
        report MISSING GPU "$detail; the build targets sm_${cuda_arch// /, sm_} only, which cannot run on it" \
          "make clean && export CUDA_ARCH=\"${arch:-XY}\"   (then make run / make test as usual)"
      elif [ "${free:-0}" -lt 2048 ]; then
        report WARN GPU "$detail; under 2 GiB free: another process holds it" "nvidia-smi   (shows which process; stop it)"
      else
        report OK GPU "$detail"
      fi
    done <<< "$query"
    if [ "$n_gpus" -eq 1 ]; then
      printf '  %-8s %-17s %s\n' "" "" "1 GPU: lesson 02's replicas share it; lesson 03 with NCCL takes 1 rank (--backend mpi for more)"
    else
      printf '  %-8s %-17s %s\n' "" "" "$n_gpus GPUs: lesson 02 --devices $n_gpus, lesson 03 NP=$n_gpus with NCCL"
    fi
  fi
elif command -v nvidia-smi >/dev/null 2>&1; then
  report MISSING "GPU driver" "nvidia-smi fails: $(head -n 1 <<< "$smi")" \
    "${sudo}reboot   (after a driver install the kernel module loads at boot; else: ${sudo}ubuntu-drivers install)"
elif [ $nvidia_on_pci = 1 ]; then
  report MISSING "GPU driver" "an NVIDIA GPU is on the PCI bus but there is no driver (no nvidia-smi)" \
    "${sudo}ubuntu-drivers install && ${sudo}reboot   (Ubuntu; Debian: apt-get install nvidia-driver from non-free)"
else
  report WARN GPU "no NVIDIA GPU here: the lessons run on the CPU (--device auto says so), GPU tests run in the CUDA emulator"
fi

nvcc=$(command -v nvcc 2>/dev/null || true)
[ -z "$nvcc" ] && [ -x "$cuda_home_default/bin/nvcc" ] && nvcc=$cuda_home_default/bin/nvcc
toolkit_cuda=""
if [ -z "$nvcc" ]; then
  if [ $gpu_ok = 1 ] || [ $nvidia_on_pci = 1 ]; then
    report MISSING "CUDA toolkit" "no nvcc (PATH, $cuda_home_default): the kit builds CPU-only and ignores the GPU" \
      "${sudo}apt-get install -y cuda-toolkit   (from NVIDIA's CUDA apt repository: README, \"Cloud GPU trial\")"
  else
    report WARN "CUDA toolkit" "no nvcc: the kit builds CPU-only (all you need without a GPU)"
  fi
else
  toolkit_cuda=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -n 1)
  cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
  libdir=$(for d in lib64 lib targets/x86_64-linux/lib; do [ -d "$cuda_home/$d" ] && echo "$cuda_home/$d" && break; done)
  cuda_flags=(-I"$cuda_home/include" -L"${libdir:-$cuda_home/lib64}" -lcublas -lcudart)
  if try_link '#include <cuda_runtime.h>\n#include <cublas_v2.h>' 'cublasHandle_t h; cublasCreate(&h)' "${cuda_flags[@]}"; then
    report OK "CUDA toolkit" "nvcc $toolkit_cuda ($nvcc) with cuBLAS"
  else
    report MISSING "CUDA toolkit" "nvcc $toolkit_cuda found but cuBLAS does not link (cuda_runtime.h, cublas_v2.h, libcublas)" \
      "${sudo}apt-get install -y cuda-toolkit   (NVIDIA's repository; it includes cuBLAS)"
  fi
  if try_link '#include <nccl.h>' 'ncclComm_t c; ncclCommDestroy(c)' "${cuda_flags[@]}" -lnccl; then
    report OK NCCL "nccl.h and libnccl link (lesson 03's GPU backend)"
  elif [ $gpu_ok = 1 ]; then
    report MISSING NCCL "no nccl.h/libnccl: lesson 03 on GPUs falls back to --backend mpi" "$(apt_fix libnccl-dev)"
  else
    report WARN NCCL "no nccl.h/libnccl (needed only for lesson 03 on GPUs)" "$(apt_fix libnccl-dev)"
  fi
fi

# The driver says the newest CUDA it supports; a toolkit of a newer MAJOR version cannot run on it. A newer
# minor of the same major runs (CUDA's minor-version compatibility) as long as no PTX must be compiled.
if [ -n "$driver_cuda" ] && [ -n "$toolkit_cuda" ]; then
  dmaj=${driver_cuda%%.*} dmin=${driver_cuda#*.} tmaj=${toolkit_cuda%%.*} tmin=${toolkit_cuda#*.}
  dmin=${dmin%%.*} tmin=${tmin%%.*}
  if [ "$tmaj" -gt "$dmaj" ]; then
    report MISSING "driver vs toolkit" "the driver supports CUDA $driver_cuda, the toolkit is $toolkit_cuda: programs stop with \"CUDA driver version is insufficient\"" \
      "${sudo}ubuntu-drivers install && ${sudo}reboot   (a newer driver; or install a CUDA $dmaj.x toolkit)"
  elif [ "$tmaj" -eq "$dmaj" ] && [ "$tmin" -gt "$dmin" ]; then
    report WARN "driver vs toolkit" "driver CUDA $driver_cuda, toolkit $toolkit_cuda: runs (minor-version compatibility), newer driver preferred" \
      "${sudo}ubuntu-drivers install && ${sudo}reboot"
  else
    report OK "driver vs toolkit" "driver supports CUDA $driver_cuda, toolkit is $toolkit_cuda"
  fi
fi

# ---------------------------------------------------------------- instructors' extras
echo "slides and plots (instructors):"
if command -v pandoc >/dev/null 2>&1 && command -v pdflatex >/dev/null 2>&1; then
  report OK slides "pandoc and pdflatex (make slides)"
else
  report WARN slides "no pandoc or pdflatex: \`make slides\` cannot build the PDFs" "scripts/install-deps.sh --slides"
fi
if command -v gnuplot >/dev/null 2>&1; then
  report OK gnuplot "make plot (lesson 01's curves, lesson 06's confusion matrix, lesson 07's scaling figures)"
else
  report WARN gnuplot "no gnuplot: \`make plot\` and \`make bench-scaling\` cannot draw their figures" "$(apt_fix gnuplot-nox)"
fi

# ---------------------------------------------------------------- per lesson
base=1
for item in "C compiler" make OpenBLAS zlib cmocka python3; do [ -n "${have[$item]:-}" ] || base=0; done
mpi=$([ -n "${have[Open MPI]:-}" ] && echo 1 || echo 0)
gpu=$([ $gpu_ok = 1 ] && [ -n "${have[CUDA toolkit]:-}" ] && [ -n "${have[GPU]:-}" ] && echo 1 || echo 0)
where=$([ "$gpu" = 1 ] && echo "on the GPU and the CPU" || echo "on the CPU")
say() { printf '  %-8s %s\n' "$1" "$2"; }
echo "lessons:"
if [ $base = 1 ]; then
  say ready "01 single device, 02 DataParallel: build, run $where, make grade"
  if [ "$mpi" = 1 ]; then
    say ready "03 DDP, 04 checkpoints, 05 SyncBN: $where$([ "$gpu" = 1 ] && [ -z "${have[NCCL]:-}" ] && echo " (MPI backend: no NCCL)")"
  else
    say "NOT" "03 DDP, 04 checkpoints, 05 SyncBN: need Open MPI (above)"
  fi
  if [ -n "${have[libpng]:-}" ]; then
    # make lesson-06 without --checkpoint trains its demo checkpoint with lesson 04 on 2 ranks
    say ready "06 inference: $where$([ "$mpi" = 1 ] || echo "; without Open MPI, pass a --checkpoint made elsewhere")"
  else
    say "NOT" "06 inference: needs libpng (above)"
  fi
  if [ "$mpi" = 1 ]; then
    # the optional parts: Slurm needs its packages and root; the namespaces root, ip and unshare
    absent=""
    { [ ${#slurm_missing[@]} -eq 0 ] && [ "$is_root" = 1 ]; } || absent="the local Slurm"
    { [ "$is_root" = 1 ] && [ ${#ns_missing[@]} -eq 0 ]; } || absent="${absent:+$absent and }network namespaces"
    say ready "07 scale-out: the store, the ring, make grade${absent:+ (not here: $absent)}"
  else
    say "NOT" "07 scale-out: needs Open MPI (above)"
  fi
  if [ "$mpi" = 1 ]; then  # lesson 08 builds against MPI and grades on 4 ranks
    say ready "08 pipeline: the stages in one process, one stage per rank, the 2 x 2 grid, make grade"
  else
    say "NOT" "08 pipeline: needs Open MPI (above)"
  fi
  if [ "$mpi" = 1 ]; then  # lesson 09 builds against MPI and grades on 3 ranks (uneven shards)
    say ready "09 ZeRO / FSDP: stages 1-3, recomputation, sharded checkpoints, make grade"
  else
    say "NOT" "09 ZeRO / FSDP: needs Open MPI (above)"
  fi
  if [ "$mpi" = 1 ]; then  # lesson 10 builds against MPI and grades on 2 ranks
    say ready "10 mixed precision: bf16 / fp16 rounding, loss scaling, bf16 all-reduce, accumulation, make grade"
  else
    say "NOT" "10 mixed precision: needs Open MPI (above)"
  fi
  if [ "$mpi" = 1 ]; then  # lesson 11 builds against MPI and grades on 4 ranks (a tensor group of 4, a 2 x 2 grid)
    say ready "11 tensor parallelism: the column / row split, f and g, a block over 2 or 4 ranks, the tensor x data grid, make grade"
  else
    say "NOT" "11 tensor parallelism: needs Open MPI (above)"
  fi
else
  say "NOT" "$all_lessons: a MISSING item under \"every lesson\" above; fix it first (or: scripts/install-deps.sh)"
fi

if [ $n_missing -gt 0 ]; then
  echo "check-setup: $n_missing item(s) MISSING; scripts/install-deps.sh installs every apt package the kit needs"
fi
if [ $base = 1 ]; then
  echo "check-setup: lesson 01 can run here"
  exit 0
fi
echo "check-setup: lesson 01 cannot run here yet" >&2
exit 1
