# scripts/gpu-bundle-env.sh: sourced, not run. Makes a gpu-bundle/ (scripts/gpu-bundle.sh) usable here:
# unpacks its prefix once, then points the compiler, the linker, mk/config.mk's probes, the built
# programs and Open MPI at it.
#
#   . scripts/gpu-bundle-env.sh && gpu_bundle_env [DIR]      (DIR default gpu-bundle; returns 1 with a
#                                                             message when the bundle cannot be used)
# Exports:
#   CPATH, LIBRARY_PATH   gcc's own search paths: every gcc call (make's probes, nvcc's host compiler,
#                         mpicc) finds <cblas.h>, <cmocka.h>, <zlib.h>, -lopenblas, -lcmocka, -lz, no
#                         pkg-config needed (the GPU image may have none).
#   LDFLAGS               an RPATH into the bundle (make appends its own LDFLAGS): the kit's programs find
#                         their libraries without LD_LIBRARY_PATH, e.g. when PyTorch's bench starts them.
#                         --disable-new-dtags: RPATH, not RUNPATH, so libmpi's own dependencies are found too.
#   LD_LIBRARY_PATH       for mpirun/mpicc themselves and make's link probes; GPU_BUNDLE_ORIG_LD_LIBRARY_PATH
#                         keeps the value before, for programs (python3 + PyTorch) that should not see ours.
#   OPAL_PREFIX           Open MPI looks for its plugins, help texts and wrapper data under the bundle;
#   PMIX_MCA_mca_base_component_path   and so does PMIx for its plugins.
#   PATH                  mpicc, mpirun first; the bundle's make last (only used where there is none).
#   PKG_CONFIG_PATH       the bundle's .pc files (rewritten to the unpacked place), for a pkg-config there.
#   FASHION_DIR           the Fashion-MNIST files (datasets/get-data.sh and gpu-check.sh read it).
#   GPU_BUNDLE_NCCL       the bundle's NCCL (include/, lib/, SM: the one architecture it still has kernels for).
#                         NOT put on any search path here: gpu-check.sh adds it only where the toolkit and
#                         the pip wheels have no NCCL, since a whole NCCL is always the better choice.
#   OMPI_MCA_plm_rsh_agent=false   when there is no ssh: Open MPI's mpirun will not start without one.

gpu_bundle_env() {
  local dir=${1:-gpu-bundle}
  if [ ! -f "$dir/prefix.tar.xz" ]; then
    echo "gpu-bundle-env: no $dir/prefix.tar.xz (scripts/gpu-bundle.sh makes it; carry it to the GPU machine)" >&2
    return 1
  fi
  dir=$(cd "$dir" && pwd)
  local root=$dir/prefix
  if [ ! -f "$root/.unpacked" ] || [ "$dir/prefix.tar.xz" -nt "$root/.unpacked" ]; then
    # tar calls xz; a minimal image may have none, and then python3's tarfile (lzma is in the standard library)
    # does it. The archive holds only relative links ('tar' filter: permissions kept, nothing outside root).
    rm -rf "$root" && mkdir -p "$root" && if command -v xz >/dev/null; then tar -C "$root" -xJf "$dir/prefix.tar.xz"; else
      python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' "$dir/prefix.tar.xz" "$root"
    fi || { echo "gpu-bundle-env: could not unpack $dir/prefix.tar.xz (with $(command -v xz || echo "python3's tarfile"))" >&2
            return 1; }
    # Debian's .pc files name /usr: rewrite them to where the prefix now is.
    find "$root" -name '*.pc' -exec sed -i -e "s#=/usr\\([/ ]\\|\$\\)#=$root/usr\\1#" \
      -e "s#-I/usr/#-I$root/usr/#g" -e "s#-L/usr/#-L$root/usr/#g" {} +
    touch "$root/.unpacked"
  fi

  # The bundle's libraries ask for glibc symbols up to GLIBC_NEEDED: an older glibc cannot load them.
  local need have
  need=$(cat "$root/GLIBC_NEEDED" 2>/dev/null || echo 0)
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
    echo "gpu-bundle-env: this glibc is $have but the bundle needs >= $need (see $dir/MANIFEST:" \
         "Open MPI's libevent needs it; OpenBLAS, cmocka, zlib need <= 2.34). HINT: make the bundle on an" \
         "older Debian (e.g. a debootstrap of bullseye) or build those libraries here" >&2
    return 1
  fi

  local usr=$root/usr
  local lib=$usr/lib/x86_64-linux-gnu
  local libs=$lib:$lib/openblas-pthread
  export GPU_BUNDLE=$dir
  export GPU_BUNDLE_LIBS=$libs
  export GPU_BUNDLE_ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
  export PATH=$usr/bin:$PATH:$root/fallback-bin
  export CPATH=$usr/include:$usr/include/x86_64-linux-gnu/openblas-pthread${CPATH:+:$CPATH}
  export LIBRARY_PATH=$libs${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LDFLAGS="-Wl,--disable-new-dtags -Wl,-rpath,$libs${LDFLAGS:+ $LDFLAGS}"
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PKG_CONFIG_PATH=$lib/pkgconfig:$lib/openblas-pthread/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export OPAL_PREFIX=$usr
  export PMIX_MCA_mca_base_component_path=$lib/pmix2/lib/pmix
  export FASHION_DIR=$dir/fashion-mnist
  export GPU_BUNDLE_NCCL=$root/nccl
  # Open MPI's launcher refuses to start, even for ranks on this machine alone, when it finds no ssh/rsh
  # (a bare image has none); it never calls the agent for local ranks, so any command will do.
  if ! command -v ssh >/dev/null && ! command -v rsh >/dev/null && [ -z "${OMPI_MCA_plm_rsh_agent:-}" ]; then
    export OMPI_MCA_plm_rsh_agent=false
  fi
  echo "gpu-bundle-env: using $dir (glibc ${have:-?}, needs >= $need)"
}
