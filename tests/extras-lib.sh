# shellcheck shell=bash
# tests/extras-lib.sh: what the lessons' extra checks (tests/lessonNN/run-tests.sh) and
# scripts/gpu-check-lessons.sh share. Sourced:
#
#   . "$(dirname "$0")/../extras-lib.sh"; extras_begin 03 "$@"      (a run-tests.sh)
#
#   extras_begin NN ARGS...     the start of every run-tests.sh: ARGS (TEST_BINARY TRAIN_BINARY [CKPT_COMPARE])
#                               in $tests, $train, $compare; the repository root as the working folder;
#                               "lesson NN: " before every verdict; a scratch folder $work, removed at exit
#   ok MESSAGE, bad MESSAGE     one verdict line each, after $verdict_prefix; bad sets failed=1
#   show LOG [N]                the last N (12) lines of LOG that are not progress lines, indented under a verdict
#   same_model WHAT A B [TOL]   ok when checkpoints A and B hold the same model, bit for bit or within TOL
#   extras_end                  the closing line; exits with $failed
#   solution_on_worlds TESTS WORLDS LIMIT_S [SUMMARY_REGEX [SKIPS_OK]]
#                               the solution's whole autograder on each world size of WORLDS
#   rank0_port LOG [PID]        the port rank 0's store serves on (a start with MASTER_PORT=0)

# Open MPI keeps memory until exit in plugins it has already unloaded: no leak report for its allocations
# (the kit's own buffers are leak-checked by its single-process tests).
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0

failed=0
ok() { echo "ok   ${verdict_prefix:-}$*"; }
bad() { echo "!! FAIL: ${verdict_prefix:-}$*"; failed=1; }
show() { grep -vE '^epoch [0-9]+/[0-9]+ step' "$1" | tail -n "${2:-12}" | sed 's/^/   | /'; }
extras_end() {
  if [ "$failed" -eq 0 ]; then echo "${verdict_prefix:-}all extra tests passed"
  else echo "${verdict_prefix:-}some checks FAILED"; fi
  exit "$failed"
}

# same_model WHAT A B [TOL]: the verdict on two checkpoints ($compare: tests/ckpt_compare.c): the same model bit
# for bit, or (TOL) within TOL of the largest parameter; the comparison's own words go on the verdict line.
same_model() {
  local what=$1 a=$2 b=$3 tol=${4:-} out
  if out=$("$compare" "$a" "$b" ${tol:+"$tol"} 2>&1) && { [ -n "$tol" ] || grep -q identical <<<"$out"; }; then
    ok "$what: $out"
  else
    bad "$what: not the same model (${tol:-bit for bit}): $out"
  fi
}

extras_begin() {
  verdict_prefix="lesson $1: "
  tests=${2:?usage: $0 TEST_BINARY TRAIN_BINARY [CKPT_COMPARE]}
  train=${3:?usage: $0 TEST_BINARY TRAIN_BINARY [CKPT_COMPARE]}
  compare=${4:-}
  cd "$(dirname "$0")/../.." || exit 2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
}

# solution_on_worlds TESTS WORLDS LIMIT_S [SUMMARY_REGEX [SKIPS_OK]]: runs the autograder binary TESTS whole on
# each world size of WORLDS (more ranks than cores run oversubscribed: scripts/launch.sh), each within LIMIT_S
# seconds. Every test must pass; with SKIPS_OK=1 a test may skip instead (one that needs a peer, on 1 rank),
# none may fail. The first line matching SUMMARY_REGEX goes on the ok line.
solution_on_worlds() {
  local tests=$1 worlds=$2 limit=$3 summary=${4:-} skips_ok=${5:-0}
  local log np start rc count passed
  log=$(mktemp)
  count=$("$tests" --list | wc -l)
  for np in $worlds; do
    start=$(date +%s)
    timeout --kill-after=5 "$limit" scripts/launch.sh "$np" "$tests" >"$log" 2>&1
    rc=$?
    passed=no
    if [ $rc -eq 0 ] && ! grep -q "FAILED" "$log"; then
      if grep -q "PASSED.*\\b$count test" "$log" || { [ "$skips_ok" = 1 ] && grep -q "PASSED" "$log"; }; then
        passed=yes
      fi
    fi
    if [ $passed = yes ]; then
      ok "autograder on the solution, world $np ($(( $(date +%s) - start )) s)${summary:+: $(grep -m1 -E "$summary" "$log" | cut -c1-150)}"
    else
      bad "autograder on the solution, world $np (exit $rc)"
      grep -E 'FAILED|ERROR|error|differ|drift|off by' "$log" | sort -u | head -n 20 | sed 's/^/   | /'
    fi
  done
  rm -f "$log"
}

# rank0_port LOG [PID]: waits (30 s, or until PID ends) for rank 0's output LOG to name the port of its store
# (started with MASTER_PORT=0: a port the system gives it, so that no port is picked free and bound later while
# other jobs share the machine); prints it. Status 1 when it never does.
rank0_port() {
  local i p
  for ((i = 0; i < 300; i++)); do
    p=$(sed -n 's/^store: rank 0 serves the store on port \([0-9]*\).*/\1/p' "$1" 2>/dev/null | head -n1)
    [ -n "$p" ] && { echo "$p"; return 0; }
    [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null && return 1  # rank 0 ended without serving
    sleep 0.1
  done
  return 1
}

# term_after_epoch1 LAUNCHER LOG BIN: once LOG shows that epoch 1 ended (the ranks are deep in training), SIGTERM
# the newest rank running BIN that the launcher (a background scripts/launch.sh) started, as a preemption would;
# then waits for the launcher. Sets victim (the rank's pid, empty when none was found) and rc (the launcher's exit).
term_after_epoch1() {
  local launcher=$1 log=$2 bin=$3
  for _ in $(seq 1 600); do
    grep -q '^epoch 1:' "$log" && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  victim=$(pgrep -P "$launcher" -f "$bin" | sort -n | tail -n 1)
  [ -n "$victim" ] && kill -TERM "$victim"
  wait "$launcher"
  rc=$?
}
