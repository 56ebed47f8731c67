#!/usr/bin/env bash
# tests/run-blas-kernels.sh: the numeric suites again under the OTHER OpenBLAS kernels this CPU can run, so a
# tolerance that only holds for one kernel's rounding fails here, on any machine, rather than on a learner's.
#
#   tests/run-blas-kernels.sh BUILD     (BUILD: the build folder, e.g. build or build-cpu)
#
# OpenBLAS picks its kernel by CPU (Haswell: AVX2 + FMA; SkylakeX / Cooperlake: AVX-512; Sandybridge: AVX
# without FMA) and OPENBLAS_CORETYPE overrides it. Each kernel sums in its own blocking and FMA pattern, so a
# tolerance derived from the arithmetic holds for all of them and one taken from a single run may not (lesson
# 03's old 1e-6 did so). `make test` has already run everything under the default kernel; this runs the
# suites that use BLAS (kit: ops, fixtures, model, train, cpu_bf16; the lesson autograders on the solutions) under
# each other kernel of KERNELS (default "Haswell SkylakeX Sandybridge") that the CPU supports.
set -u
build=${1:?usage: $0 BUILD_FOLDER}
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's own allocations (see run-dist-tests.sh)
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
supported() {
  case $1 in
    Haswell) has avx2 fma ;;
    SkylakeX) has avx512f avx512bw avx512dq avx512vl ;;
    Sandybridge) has avx ;;
    *) return 1 ;;
  esac
}
# OpenBLAS names its kernel when it loads (OPENBLAS_VERBOSE=2): any program linked with it says so. test_fixtures runs
# its tests in a fraction of a second (test_ops, which ran here before, takes 14 s a call on 2 cores).
core_of() { OPENBLAS_VERBOSE=2 OPENBLAS_CORETYPE=${1:-} "$build/tests/test_fixtures" 2>&1 | sed -n 's/^Core: //p' | tail -n 1; }
# The kernel `make test` ran under: the caller's OPENBLAS_CORETYPE when set (then the CPU's own is one of the others).
default=$(core_of "${OPENBLAS_CORETYPE:-}")
# The AVX-512 kernels of SkylakeX are also Cooperlake's and Sapphire Rapids' for float32.
case $default in Cooperlake|SapphireRapids) default_family=SkylakeX ;; *) default_family=$default ;; esac

kit_tests=()
for t in test_ops test_fixtures test_model test_train test_cpu_bf16; do [ -x "$build/tests/$t" ] && kit_tests+=("$build/tests/$t"); done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
ran=0
for k in ${KERNELS:-Haswell SkylakeX Sandybridge}; do
  if [ "$k" = "$default_family" ]; then echo "-- $k: the default kernel here (already tested)"; continue; fi
  if ! supported "$k"; then echo "-- $k: not supported by this CPU, skipped"; continue; fi
  got=$(core_of "$k")
  if [ "$got" != "$k" ]; then echo "-- $k: OpenBLAS did not take it (it runs '$got'), skipped"; continue; fi
  start=$(date +%s)
  export OPENBLAS_CORETYPE=$k
  bad=()
  for t in "${kit_tests[@]}"; do timeout --kill-after=5 300 "$t" >"$log" 2>&1 || { bad+=("$(basename "$t")"); grep -E 'error|FAILED' "$log" | head -n 5 | sed 's/^/   | /'; }; done
  for g in "$build"/grade-solutions/test_lesson*; do
    [ -x "$g" ] || continue
    name=$(basename "$g")
    # On its lesson's GRADE_NP ranks, as grade-solutions runs it: on one rank, lesson 05's SyncBN-vs-one-process
    # tests (and 04's and 07's multi-rank ones) have no peer, so their kernel-dependent tolerances went untested.
    np=$(sed -n 's/^GRADE_NP *:*= *\([0-9]*\).*/\1/p' solutions/"${name#test_lesson}"-*/lesson.mk 2>/dev/null | head -n 1)
    if [ "${np:-1}" -gt 1 ]; then
      LAUNCH_ARGS="-x OPENBLAS_CORETYPE" timeout --kill-after=5 300 scripts/launch.sh "$np" "$g" >"$log" 2>&1
    else
      timeout --kill-after=5 300 "$g" >"$log" 2>&1
    fi
    [ $? -eq 0 ] || { bad+=("$name"); grep -E 'error|FAILED|differs|drift' "$log" | sort -u | head -n 5 | sed 's/^/   | /'; }
  done
  unset OPENBLAS_CORETYPE
  ran=$((ran + 1))
  if [ ${#bad[@]} -eq 0 ]; then
    echo "ok   OPENBLAS_CORETYPE=$k: kit numeric tests and solution autograders pass ($(( $(date +%s) - start )) s)"
  else
    echo "!! FAIL OPENBLAS_CORETYPE=$k: ${bad[*]}"
    failed+=("$k: ${bad[*]}")
  fi
done
[ $ran -eq 0 ] && echo "-- no other OpenBLAS kernel runs on this CPU (default '$default'): nothing more to test"
if [ ${#failed[@]} -ne 0 ]; then
  printf 'FAILED under another OpenBLAS kernel: %s\n' "${failed[@]}"
  exit 1
fi
echo "blas kernels: default '$default' (tested by make test) + $ran other(s) passed"
