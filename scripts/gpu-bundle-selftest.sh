#!/usr/bin/env bash
# scripts/gpu-bundle-selftest.sh: proves gpu-bundle/ without a GPU, on a system that has NONE of the kit's
# Debian packages: a minimal Debian 12 root (debootstrap, once, ~400 MB in .gpu-selftest/root, ignored)
# with only gcc/g++/make/python3 (as the GPU image has), the CUDA toolkit mounted read-only WITHOUT its NCCL
# (an overlay hides it: the GPU image is assumed to have none), and a copy of the working tree plus gpu-bundle/
# (what the device tool would send). Inside it runs scripts/gpu-check.sh with a bare environment (env -i: no
# LD_LIBRARY_PATH, PATH of the root only, where no mpirun, mpicc or make's libraries are), then checks:
#   - the root has none of what the bundle replaces (no such package, no such library in ldconfig's cache,
#     no mpirun/mpicc on PATH);
#   - mk/config.mk found OpenBLAS, cmocka, zlib, libpng, oneDNN, Open MPI (the bundle's), CUDA+cuBLAS and NCCL (the
#     bundle's), and left no lesson out; every lesson's program and autograder was built;
#   - the build and the CPU steps (cpu, test-dist under the bundle's mpirun, grade, every lesson's
#     multi-rank checks: test-lesson03..07) PASS;
#   - every GPU step says "SKIP (no GPU here)" and gpu-check exits 3;
#   - ldd of every program built: each library resolves into the bundle, the CUDA toolkit or the
#     minimal root's own glibc/gcc runtime; none is "not found"; libnccl is the bundle's.
#
#   sudo scripts/gpu-bundle-selftest.sh [STEP...]   (default: every gpu-check step; 5 min on 2 quiet cores, 25 busy)
#   sudo SELFTEST_FAKE_GPU=1 scripts/gpu-bundle-selftest.sh [STEP...]
#       a fake nvidia-smi (an H100, compute capability 9.0) makes gpu-check.sh take its GPU path: the
#       build is for sm_90 only and every GPU step runs its real command, which must then fail the way
#       the kit fails without a GPU (exit 1, a message), never with a usage error (exit 2), a missing
#       command (126/127) or a time-out: this checks the commands' spelling and the step machinery.
#
# Root: debootstrap, chroot and mount need it. Network: the first run only (debootstrap, gpu-bundle.sh).
# Not part of `make test` (minutes). SELFTEST_CUDA (default /usr/local/cuda-13.0) is the toolkit to mount;
# SELFTEST_SUITE=trixie uses a Debian 13 root instead (newer glibc and gcc, as an Ubuntu 24.04 image has).
# SELFTEST_NCCL_WHEEL=1 offers the toolkit's NCCL as a pip wheel's nvidia/nccl folder (PyTorch's layout);
# SELFTEST_NCCL=toolkit leaves it in the toolkit. Either way gpu-check must take that one, not the bundle's.
set -euo pipefail
# All of it inside { }: bash reads the whole block before running it, so editing this file while a run
# is under way cannot derail that run.
{
cd "$(dirname "$0")/.."
repo=$(pwd)
suite=${SELFTEST_SUITE:-bookworm}   # trixie: glibc 2.41 and gcc 14, nearer an Ubuntu 24.04 image
root=$repo/.gpu-selftest/root$([ "$suite" = bookworm ] || echo "-$suite")
cuda=${SELFTEST_CUDA:-$(readlink -f /usr/local/cuda)}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build cpu parity sanitize dist lessons tests fashion bench)

die() { echo "selftest: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mount)"
[ -x "$cuda/bin/nvcc" ] || die "no CUDA toolkit at $cuda (SELFTEST_CUDA=...)"

[ -f gpu-bundle/prefix.tar.xz ] || scripts/gpu-bundle.sh
if [ ! -x "$root/usr/bin/g++" ]; then
  command -v debootstrap >/dev/null || die "debootstrap not installed (apt-get install debootstrap)"
  echo "selftest: making a minimal Debian $suite root in $root (once)"
  mkdir -p "$root"
  debootstrap --variant=minbase --include=make,gcc,g++,libc6-dev,python3,procps \
    "$suite" "$root" http://deb.debian.org/debian > "$repo/.gpu-selftest/debootstrap-$suite.log" 2>&1 ||
    die "debootstrap failed (see .gpu-selftest/debootstrap-$suite.log)"
fi
# The point of the exercise: none of the packages the bundle replaces may be in the root.
present=$(chroot "$root" dpkg-query -W -f='${Package}\n' 2>/dev/null |
          grep -E '^(libopenblas|libcmocka|libopenmpi|openmpi|zlib1g-dev|libpng-dev|libhwloc|libevent|libpmix|libdnnl|dataset-fashion)' || true)
[ -z "$present" ] || die "the minimal root has packages the bundle should replace: $present"
present=$(chroot "$root" /sbin/ldconfig -p | grep -E 'lib(openblas|cmocka|mpi|open-rte|nccl|png16|hwloc|event|pmix|dnnl)' || true)
[ -z "$present" ] || die "the minimal root's libraries include what the bundle should bring: $present"
present=$(chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
          sh -c 'command -v mpirun mpicc mpiexec nvidia-smi' || true)
[ -z "$present" ] || [ "$present" = /usr/local/bin/nvidia-smi ] || die "the minimal root has commands the bundle should bring: $present"

mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
  if [ -n "${fake_wheel:-}" ]; then rm -rf "$fake_wheel"; fi   # after the umounts: never through a mount
}
trap cleanup EXIT
mnt() {  # mnt TARGET ARGS...: mount, remembered for cleanup
  local target=$1; shift
  [ -e "$target" ] || mkdir -p "$target"
  mount "$@" "$target"
  mounts+=("$target")
}
mnt "$root/proc" -t proc proc
mnt "$root/sys" -t sysfs sysfs
mnt "$root/dev" --bind /dev
mnt "$root/dev/shm" -t tmpfs tmpfs
mnt "$root/tmp" -t tmpfs tmpfs
nccl_mode=${SELFTEST_NCCL:-bundle}
[ "${SELFTEST_NCCL_WHEEL:-0}" = 1 ] && nccl_mode=wheel
wheel_mode=0; [ "$nccl_mode" = wheel ] && wheel_mode=1
case $nccl_mode in bundle|wheel|toolkit) ;; *) die "SELFTEST_NCCL is bundle, wheel or toolkit, not '$nccl_mode'" ;; esac
if [ "$nccl_mode" != toolkit ]; then
  # The toolkit is mounted through an overlay that hides its NCCL files (the upper layer takes the deletions;
  # the toolkit itself is never written).
  ov=$repo/.gpu-selftest/cuda-overlay
  rm -rf "$ov" && mkdir -p "$ov/up" "$ov/work"
  mnt "$root$cuda" -t overlay overlay -o "lowerdir=$cuda,upperdir=$ov/up,workdir=$ov/work"
  rm -rf "$root$cuda"/include/nccl* "$root$cuda"/lib/libnccl* "$root$cuda"/lib64/libnccl* \
         "$root$cuda"/targets/x86_64-linux/lib/libnccl*
fi
if [ "$wheel_mode" = 1 ]; then
  # NCCL only in a pip wheel, as PyTorch installs it (nvidia/nccl/{include,lib}, libnccl.so.2 and no
  # libnccl.so).
  site=$(chroot "$root" python3 -c 'import site; print(site.getsitepackages()[0])')
  wheel=$root$site/nvidia/nccl
  fake_wheel=$root$site/nvidia
  rm -rf "$fake_wheel" && mkdir -p "$wheel/include" "$wheel/lib"
  cp -a "$cuda"/include/nccl* "$wheel/include/"
  : > "$wheel/lib/libnccl.so.2"
  mnt "$wheel/lib/libnccl.so.2" --bind "$(readlink -f "$cuda/lib/libnccl.so.2")"
elif [ "$nccl_mode" = toolkit ]; then
  mnt "$root$cuda" --bind "$cuda"
  mount -o remount,bind,ro "$root$cuda"
fi
ln -sfn "$cuda" "$root/usr/local/cuda"

# The tree as the device tool sends it (tracked + untracked-not-ignored files) and the carried bundle.
echo "selftest: copying the working tree and gpu-bundle/ into the root"
rm -rf "$root/kit" && mkdir -p "$root/kit" "$root/kit-out"
git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -C "$root/kit" -xf -
cp -a gpu-bundle "$root/kit/gpu-bundle"
rm -rf "$root/kit-out"/*
fake=${SELFTEST_FAKE_GPU:-0}
rm -f "$root/usr/local/bin/nvidia-smi"
if [ "$fake" = 1 ]; then
  printf '%s\n' '#!/bin/sh' '# fake nvidia-smi of scripts/gpu-bundle-selftest.sh (SELFTEST_FAKE_GPU=1)' \
    'case "$*" in *compute_cap*) echo 9.0 ;; *) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-selftest-fake)" ;; esac' \
    > "$root/usr/local/bin/nvidia-smi"
  chmod +x "$root/usr/local/bin/nvidia-smi"
fi

set +e
# The device's 560 s budget is not what is tested here (2 slow cores): every step must run, none be cut.
# Nor are the steps' own caps, set for 16 cores: 2 busy ones take several times as long (oversubscribed ranks).
chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb OUT=/kit-out GPU_CHECK_BUDGET="${SELFTEST_BUDGET:-7200}" \
  GPU_CHECK_CAP_SCALE="${SELFTEST_CAP_SCALE:-4}" \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  bash -c "cd /kit && scripts/gpu-check.sh ${steps[*]}"
rc=$?
set -e
summary=$root/kit/results/gpu-check/summary.txt
echo
echo "selftest: gpu-check exited $rc; \$OUT has: $(ls "$root/kit-out" | tr '\n' ' ')"

errors=()
for item in OpenBLAS cmocka zlib libpng 'Open MPI' CUDA+cuBLAS NCCL oneDNN; do
  grep -q "^config: $item *yes" "$summary" || errors+=("config.mk did not find $item")
done
grep '^config: lesson .* left out' "$summary" && errors+=("mk/lessons.mk left a lesson out (above)")
case $nccl_mode in
  bundle) want_nccl='^gpu-check: nccl.h and libnccl taken from the bundle' ;;
  wheel) want_nccl='^gpu-check: nccl.h and libnccl taken from the pip wheel' ;;
  toolkit) want_nccl="^gpu-check: nccl.h and libnccl: the toolkit's" ;;
esac
grep -q "$want_nccl" "$summary" || errors+=("NCCL was not taken from the $nccl_mode")
# Every lesson's program and autograder: what the GPU steps run must exist once `build` has passed.
if grep -q '^build  *PASS' "$summary"; then
  for l in $(cd "$root/kit/solutions" && ls -d [0-9][0-9]-*); do
    [ -x "$root/kit/build/solutions/$l/train" ] || errors+=("build/solutions/$l/train was not built")
    [ ! -f "$root/kit/tests/lesson${l%%-*}/test_lesson${l%%-*}.c" ] || [ -x "$root/kit/build/grade-solutions/test_lesson${l%%-*}" ] ||
      errors+=("the autograder of lesson ${l%%-*} was not built")
  done
fi
grep -q '^config: Open MPI *yes (/kit/gpu-bundle/' "$summary" || errors+=("mpicc is not the bundle's")
grep -q '^gpu-bundle-env: using /kit/gpu-bundle' "$summary" || errors+=("gpu-check did not use the bundle")
passes() { grep -q "^$1  *PASS" "$summary" || errors+=("$1 did not pass"); }
for s in "${steps[@]}"; do
  case $s in
    build) passes build ;;
    cpu) passes test-kit ;;
    lessons) passes grade ;;
    tests) for n in 03 04 05 06 07; do passes "test-lesson$n"; done ;;
    dist) [ "$fake" = 1 ] || passes test-dist ;;  # with a fake GPU it adds NCCL runs, which must fail
    cpubf16) passes cpu-bf16-test; passes cpu-bf16-speed; passes cpu-bf16-gemm ;;
  esac
done
if [ "$fake" = 1 ]; then
  rm -f "$root/usr/local/bin/nvidia-smi"
  # GPU steps fail for want of a real GPU (test-cuda alone passes: it skips itself without a device).
  want=0; grep -q -E '^[a-z0-9-]+ +FAIL' "$summary" && want=1
  [ $rc = $want ] || errors+=("with a fake GPU gpu-check should exit $want, not $rc")
  grep -q '(building for sm_90)' "$summary" || errors+=("CUDA_ARCH was not taken from the GPU's compute capability")
  # make exits 2 when a recipe fails: only the kit's own programs (and sh) must never exit 2 (usage).
  bad=$(grep -E '^[a-z0-9-]+ +(FAIL \(exit (126|127)\)|FAIL \(timed out|SKIP)' "$summary" || true)
  bad+=$(grep -E '^[a-z0-9-]+ +FAIL \(exit 2\)' "$summary" | grep -v ' s   make ' || true)
  [ -z "$bad" ] || errors+=("steps that failed for the wrong reason: $bad")
  logs=$root/kit/results/gpu-check
  usage=$(cd "$logs" && grep -l -i -E 'usage:|unknown option|unrecognized option|invalid option|command not found' *.log || true)
  [ -z "$usage" ] || errors+=("a command was misspelt or missing (see these logs): $usage")
  # Each GPU step that failed must have failed for want of a GPU (or of compute-sanitizer, which a
  # CUDA toolkit without it lacks), with the kit's message.
  while read -r name _; do
    grep -q -E 'no usable GPU|compute-sanitizer not found' "$logs/$name.log" ||
      errors+=("$name failed without saying 'no usable GPU': $(tail -n 2 "$logs/$name.log" | tr '\n' ' ')")
  done < <(grep -E '^[a-z0-9-]+ +FAIL' "$summary")
else
  [ $rc = 3 ] || errors+=("gpu-check should exit 3 (no failure, GPU steps skipped), not $rc")
  grep -E '^[a-z0-9-]+ +FAIL' "$summary" && errors+=("a step failed (above)")
  for s in "${steps[@]}"; do
    case $s in parity|sanitize|fashion|bench)
      grep -q 'SKIP (no GPU here)' "$summary" || errors+=("$s was not skipped for lack of a GPU") ;;
    esac
  done
fi

# Every library of every program built resolves into the bundle, the CUDA toolkit or the root's libc/gcc.
echo "selftest: ldd of every program in build/"
progs=$(cd "$root/kit" && find build -type f -perm -u+x | sort)
[ -n "$progs" ] || errors+=("no program was built")
ldd_out=$(chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin bash -c \
  "cd /kit && for p in $(echo $progs); do echo \"== \$p\"; ldd \$p; done" 2>&1)
echo "$ldd_out" > "$repo/.gpu-selftest/ldd-$suite.txt"
case $nccl_mode in
  wheel) grep -q 'libnccl.so.2 => /usr/.*/nvidia/nccl/lib/libnccl.so.2' <<< "$ldd_out" || errors+=("libnccl.so.2 does not resolve into the wheel") ;;
  bundle) grep -q 'libnccl.so.2 => /kit/gpu-bundle/prefix/nccl/lib/libnccl.so.2' <<< "$ldd_out" || errors+=("libnccl.so.2 does not resolve into the bundle") ;;
esac
if grep -q 'not found' <<< "$ldd_out"; then
  errors+=("unresolved libraries: $(grep 'not found' <<< "$ldd_out" | sort -u | tr -s ' \t' ' ' | tr '\n' ';')")
fi
stray=$(grep '=> /' <<< "$ldd_out" | awk '{print $3}' | sort -u |
        grep -vE "^/kit/gpu-bundle/prefix/|^/usr/local/cuda[-0-9.]*/|^/usr/(local/)?lib/python3[.0-9]*/dist-packages/nvidia/|^/lib/x86_64-linux-gnu/lib(c|m|gcc_s|stdc\+\+|gomp|z|dl|pthread|rt)\.so" || true)
[ -z "$stray" ] || errors+=("libraries from outside the bundle/CUDA/glibc: $stray")
echo "selftest: $(grep -c . <<< "$progs") programs; libraries they load, by origin:"
grep '=> /' <<< "$ldd_out" | awk '{print $3}' | sort -u | sed -E \
  -e "s#^/kit/gpu-bundle/prefix/.*/#  bundle  #" -e "s#^/usr/local/cuda[-0-9.]*/.*/#  cuda    #" -e 's#^/usr/.*/nvidia/.*/#  wheel  #' -e 's#^/lib/.*/#  system  #' |
  sort | awk '{a[$1] = a[$1] " " $2} END {for (k in a) print "  " k ":" a[k]}'

if [ ${#errors[@]} -ne 0 ]; then
  printf 'selftest: FAIL: %s\n' "${errors[@]}"
  exit 1
fi
if [ "$fake" = 1 ]; then
  echo "selftest: PASS (fake GPU): the bundle builds the kit for sm_90; every GPU step ran its command and failed only for want of a real GPU"
else
  echo "selftest: PASS: the bundle builds and runs the kit on a root without its packages; GPU steps stop at 'no GPU here'"
fi
exit 0
}
