#!/usr/bin/env bash
# scripts/gpu-bundle.sh: packs what a bare GPU machine lacks, so that scripts/gpu-check.sh can build and
# run every GPU check there (the device machines have nvcc, cuBLAS, NCCL, PyTorch, compute-sanitizer, but
# none of the kit's Debian packages, no apt and no network).
#
#   scripts/gpu-bundle.sh [DIR]        (default gpu-bundle/, ignored by git)
#
# What it builds (on a Debian 12 machine with apt, like the one the kit is developed on):
#   DIR/prefix.tar.xz   Debian 12's OpenBLAS (pthread), cmocka, zlib, libpng, Open MPI 4.1 (+ hwloc,
#                       libevent, PMIx + munge, libudev), oneDNN 2.6 (+ the OpenCL loader it links: the CPU's
#                       bf16 GEMMs, kit/cpu_bf16.c, on the GPU machine's AMX host CPU) and GNU make, unpacked with dpkg-deb -x into a private
#                       prefix (never into /), static libraries, docs and Fortran/Java/OpenSHMEM parts
#                       removed, and any plugin whose libraries are neither in the prefix nor in glibc/gcc's
#                       runtime removed too (Open MPI would only warn about it); and in prefix/nccl/ the CUDA
#                       toolkit's NCCL (nccl.h, libnccl.so.2) cut to the sm_90 kernels of the H100 and H200 by
#                       scripts/gpu-bundle-nccl.py (208 MiB -> 12 MiB in the archive), for a GPU image with no
#                       NCCL of its own (gpu-check.sh takes it last: the toolkit's, a pip wheel's, then this).
#                       xz, not gzip (20 MiB instead of 28): gpu-bundle-env.sh unpacks it with xz, or with
#                       python3's tarfile where a minimal image has no xz (the GPU image has PyTorch's python3).
#   DIR/fashion-mnist/  the four IDX .gz files of Debian's dataset-fashion-mnist
#   DIR/MANIFEST        package versions, the newest glibc symbol any file needs, sha256 of the files
# scripts/gpu-bundle-env.sh (sourced by scripts/gpu-check.sh) unpacks the prefix on the GPU machine and
# points the compiler, the linker, make's probes (mk/config.mk), mpicc/mpirun (OPAL_PREFIX) at it.
#
# Why Debian's libraries and a build ON the GPU machine, rather than the kit's binaries built here: nvcc
# there matches its driver, mk/config.mk finds CUDA, cuBLAS and NCCL where that image keeps them, and
# headers + shared libraries are all the build needs. Either way the GPU machine's glibc must be at
# least the newest symbol version in the bundle (2.36, libevent's arc4random; the MANIFEST says which).
#
# Ends by printing the size of what would travel (the tree + DIR) against the device's 64 MiB limit and
# the exact device `run` calls (bench/GPU.md explains the sequence).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
limit=$((64 * 1024 * 1024))
arch=x86_64-linux-gnu

packages=(
  libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
  libcmocka-dev libcmocka0
  zlib1g-dev zlib1g
  libpng-dev libpng16-16
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libmunge2 libudev1
  libdnnl-dev libdnnl2 ocl-icd-libopencl1
  make
)
fashion_pkg=dataset-fashion-mnist
fashion_sys=/usr/share/datasets/fashion-mnist
fashion_files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

die() { echo "gpu-bundle: $*" >&2; exit 1; }
if ! command -v patchelf >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "gpu-bundle: installing patchelf (it rewrites the libraries' search paths)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q patchelf >/dev/null
fi
for tool in apt-get dpkg-deb readelf objdump objcopy patchelf xz tar sha256sum python3; do
  command -v "$tool" >/dev/null || die "'$tool' not found (this script runs on Debian/Ubuntu with binutils)"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"

# ---- 1. the .deb files: apt-get download (no root needed), else apt's own cache
get_debs() {  # PACKAGE...
  local p
  (cd "$work/debs" && apt-get download -q "$@" >"$work/apt.log" 2>&1) && return 0
  echo "gpu-bundle: apt-get download failed (offline?); looking in /var/cache/apt/archives" >&2
  for p in "$@"; do
    ls /var/cache/apt/archives/"${p}"_*.deb >/dev/null 2>&1 ||
      die "no .deb for $p (apt-get download said: $(tail -n 1 "$work/apt.log"))"
    cp /var/cache/apt/archives/"${p}"_*.deb "$work/debs/"
  done
}
echo "gpu-bundle: fetching ${#packages[@]} Debian packages"
get_debs "${packages[@]}"
for d in "$work"/debs/*.deb; do dpkg-deb -x "$d" "$work/root"; done

# ---- 2. prune what the kit never uses (and what would be dead weight on 64 MiB)
r=$work/root
L=$r/usr/lib/$arch
# zlib ships in /lib (usrmerge): one library folder, relative links only, so the prefix can move.
if [ -d "$r/lib/$arch" ]; then mv "$r/lib/$arch"/* "$L"/; rm -rf "$r/lib"; fi
while IFS= read -r link; do
  ln -sfn "$(basename "$(readlink "$link")")" "$link"
done < <(find "$r" -type l -lname '/*')
find "$r" -name '*.a' -delete
rm -rf "$r/usr/share/doc" "$r/usr/share/man" "$r/usr/share/info" "$r/usr/share/locale" "$r/usr/share/lintian" \
       "$r/usr/share/doc-base" "$r/usr/lib/$arch/fortran" "$r/usr/lib/$arch/openblas-pthread/cmake"
rm -f "$L"/libmpi_mpifh* "$L"/libmpi_usempi* "$L"/libmpi_java* "$L"/liboshmem* "$L"/libmpi_cxx* \
      "$L"/openmpi/lib/libmpi_mpifh* "$L"/openmpi/lib/libmpi_usempi* "$L"/openmpi/lib/libmpi_java* \
      "$L"/openmpi/lib/liboshmem* "$L"/openmpi/lib/libmpi_cxx* "$L"/openblas-pthread/liblapack*
# The kit calls CBLAS only: LAPACK (7 MB) goes; so do the MPI Fortran/Java/C++/OpenSHMEM bindings.

# Libraries a GPU machine's image surely has (glibc and gcc's runtime: nvcc needs g++); everything else
# an ELF file needs must be inside the prefix, or the file goes.
base_libs=" libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 ld-linux-x86-64.so.2 \
libgcc_s.so.1 libstdc++.so.6 libgomp.so.1 "
elf_files() { find "$r" -type f -print0 | while IFS= read -r -d '' f; do
  if [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ]; then printf '%s\n' "$f"; fi; done; }
prune_unresolved() {  # removes ELF files that need a library neither in the prefix nor in base_libs
  local changed=1 f lib
  while [ $changed = 1 ]; do
    changed=0
    local have=" $(find "$r" \( -type f -o -type l \) -name '*.so*' -printf '%f ') "
    while IFS= read -r f; do
      for lib in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        case "$base_libs$have" in *" $lib "*) ;; *)
          echo "  pruned ${f#"$r"/} (needs $lib)"; rm -f "$f"; changed=1; break ;;
        esac
      done
    done < <(elf_files)
    find "$r" -xtype l -delete   # links to what was pruned
  done
}
echo "gpu-bundle: removing plugins whose libraries are missing"
prune_unresolved > "$work/pruned.txt"
echo "gpu-bundle: $(wc -l < "$work/pruned.txt") files pruned (InfiniBand, UCX, OFI, PSM, netlink and OpenSHMEM plugins; list in MANIFEST)"

# Every ELF file finds its libraries inside the prefix wherever it lands, with no LD_LIBRARY_PATH: its
# search path becomes its old one moved under the prefix, plus the prefix's library folder, all relative
# to the file itself ($ORIGIN). Without it libmpi's RUNPATH (/usr/lib/.../openmpi/lib) would hide the
# program's RPATH from libmpi's own dependencies (libopen-rte, hwloc, libevent).
relocate_runpaths() {
  local f d old e new rel
  while IFS= read -r f; do
    d=$(dirname "$f")
    old=$(patchelf --print-rpath "$f" 2>/dev/null) || continue
    new=""
    IFS=: read -r -a entries <<< "$old"
    for e in "${entries[@]}" "/usr/lib/$arch"; do
      case $e in
        /*) rel=$(realpath -m --relative-to="$d" "$r$e"); e="\$ORIGIN/$rel" ;;
        '') continue ;;
      esac
      case ":$new:" in *":$e:"*) ;; *) new=${new:+$new:}$e ;; esac
    done
    patchelf --set-rpath "$new" "$f"
  done < <(elf_files)
}
relocate_runpaths

# Commands: mpicc/mpirun as Debian's alternatives would name them; make in a folder of its own, which
# gpu-bundle-env.sh puts LAST on PATH (only a machine without make uses it).
(cd "$r/usr/bin" && for t in mpicc mpirun mpiexec; do ln -sfn "$t.openmpi" "$t"; done)
# mpirun and mpiexec are scripts that set the bundle's Open MPI and PMIx paths themselves (what gpu-bundle-env.sh
# exports), computed from where they lie: a program that clears OMPI_* and PMIX_* before starting a nested
# mpirun (lesson 03's autograder does, to forget the launcher it runs under) still gets a working one.
for t in mpirun mpiexec; do
  rm -f "$r/usr/bin/$t"
  cat > "$r/usr/bin/$t" <<'WRAP'
#!/bin/sh
# gpu-bundle (scripts/gpu-bundle.sh): Open MPI's launcher with the bundle's paths, whatever the caller's environment.
bin=$(cd "$(dirname "$0")" && pwd)
usr=${bin%/bin}
export OPAL_PREFIX="$usr"
export PMIX_MCA_mca_base_component_path="$usr/lib/x86_64-linux-gnu/pmix2/lib/pmix"
# Open MPI will not start without an ssh/rsh agent, even for ranks on this machine alone (never called for them).
if [ -z "${OMPI_MCA_plm_rsh_agent:-}" ] && ! command -v ssh >/dev/null 2>&1 && ! command -v rsh >/dev/null 2>&1; then
  export OMPI_MCA_plm_rsh_agent=false
fi
exec "$bin/mpirun.openmpi" "$@"
WRAP
  chmod 755 "$r/usr/bin/$t"
done
mkdir -p "$r/fallback-bin" && mv "$r/usr/bin/make" "$r/fallback-bin/make" && rm -f "$r/usr/bin/gmake"

# ---- 2b. NCCL: the CUDA toolkit's (the one the kit builds against here), cut to the GPU machines' sm_90.
# Added after the runpaths are rewritten: patchelf never touches it (its fatbins stay where the runtime
# expects them), and it needs nothing beyond glibc and gcc's runtime.
nvcc_bin=$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
cuda_home=$(cd "$(dirname "$nvcc_bin")/.." 2>/dev/null && pwd) || die "no CUDA toolkit here (nvcc), so no NCCL to bundle"
nccl_lib=$(ls "$cuda_home"/lib64/libnccl.so.2 "$cuda_home"/lib/libnccl.so.2 "$cuda_home"/targets/x86_64-linux/lib/libnccl.so.2 \
             2>/dev/null | head -n 1 || true)
[ -n "$nccl_lib" ] && [ -f "$cuda_home/include/nccl.h" ] || die "no NCCL in the CUDA toolkit at $cuda_home (libnccl.so.2 + nccl.h)"
mkdir -p "$r/nccl/include" "$r/nccl/lib"
cp "$cuda_home/include/nccl.h" "$r/nccl/include/"
echo "gpu-bundle: NCCL $(sed -n 's/^#define NCCL_VERSION_CODE *//p' "$cuda_home/include/nccl.h") from $nccl_lib, cut to sm_${GPU_BUNDLE_NCCL_SM:-90}"
python3 scripts/gpu-bundle-nccl.py "$(readlink -f "$nccl_lib")" "$r/nccl/lib/libnccl.so.2" ${GPU_BUNDLE_NCCL_SM:-90} | tee "$work/nccl.txt"
ln -sfn libnccl.so.2 "$r/nccl/lib/libnccl.so"
echo "${GPU_BUNDLE_NCCL_SM:-90}" > "$r/nccl/SM"

# ---- 3. what glibc the GPU machine needs: the newest GLIBC_x.y symbol version any file asks for
glibc_need=$(elf_files | while IFS= read -r f; do objdump -T "$f" 2>/dev/null; done |
             grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -n 1 | sed 's/GLIBC_//')
glibc_who=$(elf_files | while IFS= read -r f; do
              if objdump -T "$f" 2>/dev/null | grep "GLIBC_${glibc_need}[^.0-9]" >/dev/null; then echo "${f#"$r"/}"; fi
            done | tr '\n' ' ')
echo "$glibc_need" > "$r/GLIBC_NEEDED"

# ---- 4. the archive, the data, the manifest
rm -rf "$out"
mkdir -p "$out/fashion-mnist"
echo "gpu-bundle: compressing the prefix ($(du -sh "$r" | cut -f1) unpacked) with xz (about a minute)"
tar -C "$r" -cf - . | xz -9 -T2 > "$out/prefix.tar.xz"

fashion_src=$fashion_sys
if ! (cd "$fashion_sys" 2>/dev/null && ls "${fashion_files[@]}" >/dev/null 2>&1); then
  echo "gpu-bundle: $fashion_sys not installed; downloading $fashion_pkg"
  get_debs "$fashion_pkg"
  mkdir -p "$work/fashion" && dpkg-deb -x "$work"/debs/${fashion_pkg}_*.deb "$work/fashion"
  fashion_src=$work/fashion$fashion_sys
fi
for f in "${fashion_files[@]}"; do cp "$fashion_src/$f" "$out/fashion-mnist/$f"; done

{
  echo "# gpu-bundle made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME") by scripts/gpu-bundle.sh"
  echo "glibc needed: >= $glibc_need (by: $glibc_who)"
  echo "packages:"
  for d in "$work"/debs/*.deb; do echo "  $(dpkg-deb -f "$d" Package) $(dpkg-deb -f "$d" Version)"; done
  echo "nccl (prefix/nccl, from $nccl_lib):"; sed 's/^/  /' "$work/nccl.txt"
  echo "pruned:"; sed 's/^ */  /' "$work/pruned.txt"
  echo "sha256:"; (cd "$out" && sha256sum prefix.tar.xz fashion-mnist/* | sed 's/^/  /')
} > "$out/MANIFEST"

# ---- 5. size of what travels: git's tracked + untracked-not-ignored files, shared/, and the bundle
tree_bytes=0
if git rev-parse --git-dir >/dev/null 2>&1; then
  tree_bytes=$(git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
fi
[ -d shared ] && tree_bytes=$((tree_bytes + $(du -sb shared | cut -f1)))
bundle_bytes=$(du -sb "$out" | cut -f1)
total=$((tree_bytes + bundle_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo
echo "gpu-bundle: $out = $(mib "$bundle_bytes") (prefix.tar.xz $(mib "$(stat -c %s "$out/prefix.tar.xz")"), fashion-mnist $(mib "$(du -sb "$out/fashion-mnist" | cut -f1)"))"
echo "gpu-bundle: working tree that travels = $(mib "$tree_bytes"); together $(mib "$total") of the 64 MiB limit"
echo "gpu-bundle: the GPU machine needs glibc >= $glibc_need (Ubuntu 24.04 has 2.39, Debian 12 2.36)"
if [ "$total" -gt "$limit" ]; then
  die "over the device's 64 MiB limit: leave the data out (rm -r $out/fashion-mnist) or shrink the tree"
fi
cat <<EOF

The device calls (tool \`run\`, kind left out, timeout_s=600, carry=["$out"]); bench/GPU.md gives the expected
times and what to do with the results. Make call 2 at once after call 1 (the machine is then still warm).
  1. scripts/gpu-check.sh build cpu parity dist sanitize
  2. scripts/gpu-check.sh build lessons bench fashion
  3. only if status says budget_left_s >= 420, with N = budget_left_s - 180 (at most 560):
     GPU_CHECK_BUDGET=N scripts/gpu-check.sh build tests STEP...   (the steps skipped or failed above)
Then give_back. Each call returns \$OUT/summary.txt and \$OUT/gpu-check-<steps>.tar.gz (every log, the results).
EOF
