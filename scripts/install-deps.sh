#!/usr/bin/env bash
# scripts/install-deps.sh: installs the Debian packages the kit needs, only those that are missing.
#
#   scripts/install-deps.sh            build, test, MPI, data and plotting packages
#   scripts/install-deps.sh --slides   also pandoc + LaTeX for `make slides`
#   scripts/install-deps.sh --slurm    also Slurm (slurmctld, slurmd, client): lesson 07's local cluster and tests
#   scripts/install-deps.sh --check    only say what is missing (exit 1 when something is)
#
# Uses apt-get (noninteractive), through sudo when not root. CUDA and NCCL do not come from apt:
# the script only says whether nvcc was found.
set -euo pipefail

packages=(
  build-essential clang libomp-dev libopenblas-dev libopenmpi-dev openmpi-bin libcmocka-dev
  zlib1g-dev libpng-dev python3 python3-numpy gnuplot-nox dataset-fashion-mnist curl ca-certificates
  bubblewrap  # tests/grade.py's sandbox: code under test sees the kit read-only, in its own PID namespace
  libclang-rt-dev  # clang's libFuzzer and sanitizer runtimes: make fuzz, and the fuzz smoke run in make test
  libdnnl-dev  # oneDNN: the CPU's real bf16 GEMMs (kit/cpu_bf16.c) where it has AMX or AVX512-BF16
)
slides_packages=(pandoc texlive-latex-recommended texlive-pictures lmodern poppler-utils)  # poppler-utils: pdftotext, make slides checks the PDF text
slurm_packages=(slurmctld slurmd slurm-client)

check_only=0
for arg in "$@"; do
  case "$arg" in
    --slides) packages+=("${slides_packages[@]}") ;;
    --slurm) packages+=("${slurm_packages[@]}") ;;
    --check) check_only=1 ;;
    -h|--help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

# True when the package (or, for gnuplot-nox, any gnuplot build) is installed.
installed() {
  local status
  status=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] && return 0
  # gnuplot-qt / gnuplot-x11 give the same `gnuplot` command; do not add a second build.
  [ "$1" = gnuplot-nox ] && command -v gnuplot >/dev/null 2>&1 && return 0
  return 1
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: this is not a Debian/Ubuntu system (no dpkg). Install by hand: ${packages[*]}" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done

say_cuda() {
  local nvcc
  nvcc=$(command -v nvcc 2>/dev/null || true)
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  if [ -n "$nvcc" ]; then
    echo "install-deps: CUDA: nvcc found at $nvcc (the GPU backend will be built)"
  else
    echo "install-deps: CUDA: nvcc not found; the kit builds CPU-only." \
         "For the GPU backend install the CUDA toolkit (+ NCCL) from NVIDIA; it is not an apt package here."
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: nothing is missing (${#packages[@]} packages checked)"
  say_cuda
  exit 0
fi

echo "install-deps: missing: ${missing[*]}"
if [ $check_only -eq 1 ]; then
  say_cuda
  exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "install-deps: not root and no sudo. As root, run:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-deps: installing: ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${#missing[@]} package(s)"
say_cuda
