#!/usr/bin/env bash
# tests/check-setup/run.sh (`make test-check-setup`, part of `make test`): scripts/check-setup.sh on
# imitations of other machines, built from this one by taking things away:
#
#   - a PATH that is a copy of this one without some commands (mpirun, mpicc, nvidia-smi, nvcc, the Slurm
#     daemons and clients, ip);
#   - a compiler wrapper that fails to link one library, as a compiler without libopenblas-dev (or libpng-dev)
#     does ("cannot find -lopenblas"), and passes everything else to the real compiler;
#   - CHECK_SETUP_CUDA_HOME and CHECK_SETUP_PCI_DIR pointing at empty folders: no toolkit, no NVIDIA card;
#   - a fake nvidia-smi that answers like a driver with one GPU.
#
# Each case checks the status lines, the fix line and the exit status (0 only when lesson 01 can run).
# shellcheck disable=SC2016  # the backquotes in the patterns are literal
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
script=$root/scripts/check-setup.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# bin_without DIR NAME...: DIR gets a link to every command on PATH except NAME...
bin_without() {
  local dir=$1 d f
  shift
  mkdir -p "$dir"
  IFS=: read -r -a dirs <<< "$PATH"
  for d in "${dirs[@]}"; do
    [ -d "$d" ] || continue
    for f in "$d"/*; do
      [ -x "$f" ] && [ ! -e "$dir/${f##*/}" ] && ln -s "$f" "$dir/${f##*/}"
    done
  done
  for f in "$@"; do rm -f "$dir/$f"; done
}

# run NAME EXPECTED_RC ENV...: runs check-setup with the environment given; keeps the output in $tmp/NAME.out
run() {
  local name=$1 want=$2
  shift 2
  env "$@" "$script" > "$tmp/$name.out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL $name: exit $rc, expected $want"; sed 's/^/     | /' "$tmp/$name.out"; fails=$((fails + 1))
  fi
}

# expect NAME REGEX WHAT: the output of case NAME has a line matching REGEX
expect() {
  if ! grep -Eq -- "$2" "$tmp/$1.out"; then
    echo "FAIL $1: $3 (no line matches /$2/)"; sed 's/^/     | /' "$tmp/$1.out"; fails=$((fails + 1))
  fi
}
refute() {
  if grep -Eq -- "$2" "$tmp/$1.out"; then
    echo "FAIL $1: $3 (a line matches /$2/)"; grep -E -- "$2" "$tmp/$1.out" | sed 's/^/     | /'; fails=$((fails + 1))
  fi
}

empty=$tmp/empty
mkdir -p "$empty"
no_gpu=(CHECK_SETUP_CUDA_HOME="$empty" CHECK_SETUP_PCI_DIR="$empty")
real_cc=$(command -v "${CC:-gcc}")
sudo_prefix=$([ "$(id -u)" -ne 0 ] && echo "sudo ")

# ---- 1. no GPU (no nvidia-smi, no nvcc, no NVIDIA card), everything else as on this machine
bin_without "$tmp/nogpu" nvidia-smi nvcc
run no-gpu 0 PATH="$tmp/nogpu" CC="$real_cc" "${no_gpu[@]}"
expect no-gpu '^  OK +OpenBLAS' "OpenBLAS is installed here"
expect no-gpu '^  WARN +GPU +no NVIDIA GPU here' "a machine without a GPU is a WARN, not an error"
expect no-gpu '^  WARN +CUDA toolkit +no nvcc' "no toolkit without a GPU is a WARN"
refute no-gpu '^  MISSING' "nothing is missing on a CPU machine with the packages installed"
expect no-gpu '^  ready +01 ' "lesson 01 runs"
expect no-gpu 'lesson 01 can run here' "the verdict"
expect no-gpu '^  OK +libpng' "libpng is installed here (scripts/install-deps.sh)"
expect no-gpu '^  ready +06 inference' "lesson 06 runs"
expect no-gpu '^  ready +03 DDP, 04 checkpoints, 05 SyncBN' "lessons 03-05 run (Open MPI works here)"
expect no-gpu '^  ready +07 scale-out' "lesson 07's exercise runs"
expect no-gpu '^  ready +08 pipeline: .*one stage per rank' "lesson 08 runs in full"
expect no-gpu '^  ready +09 ZeRO / FSDP: ' "lesson 09 runs in full"
expect no-gpu '^  ready +10 mixed precision: ' "lesson 10 runs in full"
expect no-gpu '^  ready +11 tensor parallelism: ' "lesson 11 runs in full"
refute no-gpu 'not in the kit yet|planned' "every lesson is in the kit"
if [ "$(id -u)" -eq 0 ]; then
  expect no-gpu '`mpirun --allow-run-as-root .*-np 2` works' "as root, mpirun is launched (and works) with --allow-run-as-root"
else
  expect no-gpu '^  OK +Open MPI .*`mpirun -np 2` works' "mpirun works"
fi

# ---- 2. packages missing: no Open MPI on PATH, and a compiler that cannot link OpenBLAS
bin_without "$tmp/nompi" nvidia-smi nvcc mpirun mpicc mpiexec
# cc_without NAME LIB: $tmp/cc-without-NAME, a compiler that cannot link -lLIB (nor -lLIB16 etc.: pkg-config's
# name for libpng is -lpng16)
cc_without() {
  cat > "$tmp/cc-without-$1" <<EOF
#!/usr/bin/env bash
for a in "\$@"; do
  case "\$a" in -l$2|-l$2[0-9]*) echo "/usr/bin/ld: cannot find \$a: No such file or directory" >&2; exit 1 ;; esac
done
exec "$real_cc" "\$@"
EOF
  chmod +x "$tmp/cc-without-$1"
}
cc_without openblas openblas
run no-openblas 1 PATH="$tmp/nompi" CC="$tmp/cc-without-openblas" "${no_gpu[@]}"
expect no-openblas '^  MISSING +OpenBLAS' "OpenBLAS is reported missing"
expect no-openblas "fix: ${sudo_prefix}apt-get install -y libopenblas-dev\$" "with the one command that installs it"
expect no-openblas '^  MISSING +Open MPI +no mpirun' "Open MPI is reported missing"
expect no-openblas "fix: ${sudo_prefix}apt-get install -y openmpi-bin libopenmpi-dev\$" "with the command that installs it"
expect no-openblas '^  OK +zlib' "the other libraries are still found"
expect no-openblas '^  NOT +01-11' "no lesson can run"
expect no-openblas 'lesson 01 cannot run here yet' "the verdict"

# Open MPI missing alone does not stop lesson 01: exit 0, lesson 03 not ready
run no-mpi 0 PATH="$tmp/nompi" CC="$real_cc" "${no_gpu[@]}"
expect no-mpi '^  MISSING +Open MPI' "Open MPI is reported missing"
expect no-mpi '^  ready +01 ' "lesson 01 runs"
expect no-mpi '^  NOT +03 DDP, 04 checkpoints, 05 SyncBN: need Open MPI' "lessons 03-05 do not"
expect no-mpi '^  NOT +07 scale-out: needs Open MPI' "nor lesson 07"
expect no-mpi '^  NOT +08 pipeline: needs Open MPI' "nor lesson 08"
expect no-mpi '^  NOT +09 ZeRO / FSDP: needs Open MPI' "nor lesson 09"
expect no-mpi '^  NOT +10 mixed precision: needs Open MPI' "nor lesson 10"
expect no-mpi '^  NOT +11 tensor parallelism: needs Open MPI' "nor lesson 11"
expect no-mpi '^  ready +06 inference: .*pass a --checkpoint made elsewhere' "lesson 06 runs, on a checkpoint from elsewhere"

# No libpng: lesson 06 only (exit 0: lesson 01 still runs)
cc_without png png
run no-png 0 PATH="$tmp/nogpu" CC="$tmp/cc-without-png" "${no_gpu[@]}"
expect no-png '^  MISSING +libpng' "libpng is reported missing"
expect no-png "fix: ${sudo_prefix}apt-get install -y libpng-dev\$" "with the command that installs it"
expect no-png '^  NOT +06 inference: needs libpng' "lesson 06 cannot be built"
expect no-png '^  ready +01 ' "lesson 01 runs"

# Lesson 07's optional parts: no Slurm commands, no `ip` (a WARN each, never a failure)
bin_without "$tmp/noslurm" nvidia-smi nvcc slurmctld slurmd srun sbatch scontrol ip
run no-slurm 0 PATH="$tmp/noslurm" CC="$real_cc" "${no_gpu[@]}"
expect no-slurm '^  WARN +Slurm +no slurmctld slurmd srun sbatch scontrol' "Slurm is reported absent"
expect no-slurm 'fix: scripts/install-deps.sh --slurm$' "with the script that installs it"
if [ "$(id -u)" -eq 0 ]; then
  expect no-slurm '^  WARN +root +root, but no ip:' "root without ip cannot make namespaces"
  expect no-slurm "fix: apt-get install -y iproute2 util-linux\$" "with the packages that give ip and unshare"
else
  expect no-slurm '^  WARN +root +not root' "namespaces and the local Slurm need root"
fi
expect no-slurm '^  ready +07 scale-out: .*\(not here: the local Slurm and network namespaces\)' "lesson 07 runs without them"
refute no-slurm '^  MISSING' "optional parts are never MISSING"

# ---- 3. a GPU the default build cannot run on (compute capability 7.5 vs CUDA_ARCH "80 90"), and a driver
#         older than the toolkit (driver CUDA 12.2, toolkit 13.0)
mkdir -p "$tmp/fakegpu/bin"
cat > "$tmp/fakegpu/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *--query-gpu=*) echo "${FAKE_GPU:-0, Tesla T4, 7.5, 15000, 15360, 535.54.03}" ;;
  "") echo "| NVIDIA-SMI 535.54.03    Driver Version: 535.54.03    CUDA Version: 12.2     |" ;;
  *) exit 1 ;;
esac
EOF
cat > "$tmp/fakegpu/bin/nvcc" <<'EOF'
#!/usr/bin/env bash
echo "Cuda compilation tools, release 13.0, V13.0.48"
EOF
chmod +x "$tmp/fakegpu/bin/nvidia-smi" "$tmp/fakegpu/bin/nvcc"
run old-gpu 0 PATH="$tmp/fakegpu/bin:$tmp/nogpu" CC="$real_cc" "${no_gpu[@]}" CUDA_ARCH="80 90"
expect old-gpu '^  MISSING +GPU +GPU 0: Tesla T4, compute capability 7.5, 14 of 15 GiB free' "the GPU line, parsed"
expect old-gpu 'fix: make clean && export CUDA_ARCH="75"' "the architecture to build for"
expect old-gpu '^  MISSING +driver vs toolkit +the driver supports CUDA 12.2, the toolkit is 13.0' "driver too old for the toolkit"
expect old-gpu '^  ready +01 ' "lesson 01 still runs (on the CPU)"
# The same card with CUDA_ARCH=75 and a matching driver: accepted. sm_86 does NOT cover 8.0 (newer minor only).
run t4-ok 0 PATH="$tmp/fakegpu/bin:$tmp/nogpu" CC="$real_cc" "${no_gpu[@]}" CUDA_ARCH="75"
expect t4-ok '^  OK +GPU +GPU 0: Tesla T4' "CUDA_ARCH=75 covers compute capability 7.5"
run t4-86 0 PATH="$tmp/fakegpu/bin:$tmp/nogpu" CC="$real_cc" "${no_gpu[@]}" CUDA_ARCH="86"
expect t4-86 '^  MISSING +GPU' "sm_86 cannot run on 7.5"
run a10-80 0 PATH="$tmp/fakegpu/bin:$tmp/nogpu" CC="$real_cc" "${no_gpu[@]}" CUDA_ARCH="80 90" \
  FAKE_GPU="0, NVIDIA A10G, 8.6, 22000, 23028, 535.54.03"
expect a10-80 '^  OK +GPU +GPU 0: NVIDIA A10G, compute capability 8.6' "an sm_80 build runs on 8.6 (same major, newer minor)"
run a100-86 0 PATH="$tmp/fakegpu/bin:$tmp/nogpu" CC="$real_cc" "${no_gpu[@]}" CUDA_ARCH="86" \
  FAKE_GPU="0, NVIDIA A100-SXM4-40GB, 8.0, 1000, 40960, 535.54.03"
expect a100-86 '^  MISSING +GPU +GPU 0: NVIDIA A100' "an sm_86 build does not run on 8.0"
run busy 0 PATH="$tmp/fakegpu/bin:$tmp/nogpu" CC="$real_cc" "${no_gpu[@]}" CUDA_ARCH="80" \
  FAKE_GPU="0, NVIDIA A100-SXM4-40GB, 8.0, 1000, 40960, 535.54.03"
expect busy '^  WARN +GPU .*under 2 GiB free' "a GPU whose memory another process holds"

# ---- 4. a bad option
if "$script" --no-such-option >/dev/null 2>&1; [ $? -ne 2 ]; then
  echo "FAIL bad-option: an unknown option must exit 2"; fails=$((fails + 1))
fi

if [ $fails -gt 0 ]; then
  echo "test-check-setup: $fails check(s) failed"
  exit 1
fi
echo "test-check-setup: all cases passed (no GPU, missing OpenBLAS + Open MPI, missing Open MPI, missing libpng, no Slurm, GPU outside CUDA_ARCH, old driver)"
