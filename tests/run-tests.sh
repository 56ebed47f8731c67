#!/usr/bin/env bash
# Runs test binaries one after the other, each in its own process with a time limit,
# and reports which failed. Usage: tests/run-tests.sh BINARY...   (TEST_TIMEOUT=seconds, default 300)
set -u
timeout_s=${TEST_TIMEOUT:-300}
failed=()
for t in "$@"; do
  echo "== $t"
  timeout --kill-after=5 "$timeout_s" "$t"
  rc=$?
  if [ $rc -ne 0 ]; then
    [ $rc -eq 124 ] && echo "!! $t: timed out after ${timeout_s}s"
    failed+=("$t (exit $rc)")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all ${#} test binaries passed"
