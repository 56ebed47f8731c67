#!/usr/bin/env bash
# tests/lesson03/kill-rank.sh: a rank of lesson 03's real program killed in the middle of training must stop
# the whole job, with a non-zero exit status, within 30 seconds (never a hang).
#
#   tests/lesson03/kill-rank.sh BUILD/solutions/03-ddp/train
#
# Starts 2 ranks on the synthetic set, waits until the first epoch has finished (so the ranks are deep in the
# training loop's collectives), SIGKILLs the last rank, and times how long the launcher takes to exit.
# Exit status 0 when the job stopped in time and non-zero, 1 otherwise.
set -u
bin=${1:?usage: $0 PATH/TO/train}
limit=30
cd "$(dirname "$0")/../.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's own allocations (see run-dist-tests.sh)

# kill_case NAME: one run, one kill, one verdict (LAUNCH_ARGS passes launcher options through launch.sh).
kill_case() {
  local name=$1 launcher victim start rc secs why
  # --timeout 5: the survivors give up on the dead peer after 5 s even if the launcher did not kill them.
  scripts/launch.sh 2 "$bin" --model tiny --epochs 100 --timeout 5 >"$log" 2>&1 &
  launcher=$!   # launch.sh execs mpirun: this is mpirun's pid

  for _ in $(seq 1 600); do   # up to 60 s for start-up and one epoch
    grep -q '^epoch 1:' "$log" && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q '^epoch 1:' "$log"; then
    echo "kill-rank ($name): FAIL: the run did not finish its first epoch; its output:"; sed 's/^/   | /' "$log" | tail -n 20
    kill -9 "$launcher" 2>/dev/null
    return 1
  fi
  # The ranks are mpirun's children running the program; the last one started is the victim.
  victim=$(pgrep -P "$launcher" -f "$bin" | sort -n | tail -n 1)
  if [ -z "$victim" ]; then
    echo "kill-rank ($name): FAIL: no rank process found under mpirun (pid $launcher)"
    kill -9 "$launcher" 2>/dev/null
    return 1
  fi
  start=$(date +%s.%N)
  kill -9 "$victim"
  while kill -0 "$launcher" 2>/dev/null; do
    if awk -v a="$start" -v b="$(date +%s.%N)" -v l="$limit" 'BEGIN { exit !(b - a > l) }'; then
      echo "kill-rank ($name): FAIL: the job still runs ${limit} s after rank pid $victim was killed: it hangs"
      kill -9 "$launcher" 2>/dev/null
      sed 's/^/   | /' "$log" | tail -n 20
      return 1
    fi
    sleep 0.1
  done
  wait "$launcher"
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -eq 0 ]; then
    echo "kill-rank ($name): FAIL: the job exited 0 after a rank was killed"
    sed 's/^/   | /' "$log" | tail -n 20
    return 1
  fi
  why=$(grep -Eo -m1 'exited on signal 9.{0,20}|timed out after [0-9.]+ s' "$log" || echo "exit status $rc")
  echo "ok   kill-rank ($name): one of 2 ranks SIGKILLed after epoch 1: the job stopped in ${secs} s with status $rc ($why)"
}

failed=0
kill_case "mpirun stops the job" || failed=1
# Open MPI 4's mpirun kills the job itself when a rank dies. Without that (other launchers may not), the
# survivor must stop on its own: the process group's --timeout (5 s here) ends its wait for the dead peer.
if [ -z "${SLURM_JOB_ID:-}" ] && mpirun --version 2>/dev/null | grep -q 'Open MPI) 4'; then
  LAUNCH_ARGS="--mca orte_abort_on_non_zero_status 0" kill_case "the survivor times out" || failed=1
fi
exit $failed
