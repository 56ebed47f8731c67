#!/usr/bin/env bash
# The timeline of a real run (make test-trace): lesson 03's program on 2 ranks, one epoch of the synthetic set,
# with --trace, checked for what the lesson claims:
#   --bucket-mb 0.001 (6 buckets of the toy net): a bucket's all-reduce starts while backward still computes, on
#                     each rank (an async "all-reduce bucket k" span begins inside a "backward" span);
#   --bucket-mb 0     (one flat all-reduce after backward): none does -- the same check fails on this run.
# Each file is read by tools/trace_check.py (python3's json: valid JSON, nesting, pairs, ranks named), then by
# Perfetto's trace processor where it can run (tools/trace_perfetto.py; it says why when it skips).
#
# Usage: tests/trace/run-lesson03.sh BUILD/solutions/03-ddp/train
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's plugins (tests/run-dist-tests.sh)
failed=0
run() {  # NAME ARGS...: trains with --trace $dir/NAME.json; 1 when the program fails
  local name=$1
  shift
  if ! timeout --kill-after=5 300 scripts/launch.sh 2 "$bin" --dataset synthetic --epochs 1 --batch-size 64 \
       --trace "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1; then
    echo "!! lesson 03 with --trace $* failed:"; tail -20 "$dir/$name.log"; return 1
  fi
  grep '^trace:' "$dir/$name.log"
}
check() { python3 tools/trace_check.py "$@" || failed=1; }

echo "== lesson 03, 2 ranks, buckets: an all-reduce starts during backward"
if run buckets --bucket-mb 0.001; then
  grep -q 'gradients: all-reduced in [2-9] buckets' "$dir/buckets.log" || { echo "!! expected several buckets"; failed=1; }
  check "$dir/buckets.json" --ranks 2 --overlap 'all-reduce bucket' backward --min-count 0:backward:10 \
    --min-count 1:backward:10 --min-count '0:optimizer step:10' --min-count 0:evaluate:1 --min-count '0:data wait:10'
  # on each rank: the claim is per rank
  for r in 0 1; do
    python3 - "$dir/buckets.json" "$r" <<'PY' || failed=1
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]; r = int(sys.argv[2])
bw = [e for e in ev if e["ph"] == "X" and e["pid"] == r and e["name"] == "backward"]
starts = [e["ts"] for e in ev if e["ph"] == "b" and e["pid"] == r and e["name"].startswith("all-reduce bucket")]
n = sum(1 for t in starts if any(x["ts"] <= t < x["ts"] + x["dur"] for x in bw))
print(f"rank {r}: {n} of {len(starts)} bucket all-reduces start inside backward")
sys.exit(0 if n > 0 else 1)
PY
  done
  python3 tools/trace_perfetto.py "$dir/buckets.json" --overlap 'all-reduce bucket' backward || failed=1
  python3 tools/trace_perfetto.py "$dir/buckets.json" --no-overlap 'all-reduce bucket' backward >/dev/null
  [ $? -eq 1 ] || { echo "!! the SQL --no-overlap check did not fail (exit 1) on the bucketed run"; failed=1; }
else
  failed=1
fi

echo "== lesson 03, 2 ranks, one flat all-reduce: nothing starts during backward (the check above can fail)"
if run flat --bucket-mb 0; then
  check "$dir/flat.json" --ranks 2 --no-overlap 'all-reduce' backward --min-count '0:all-reduce 1586 floats:10'
  if python3 tools/trace_check.py "$dir/flat.json" --overlap 'all-reduce' backward >/dev/null; then
    echo "!! the overlap check passed on the flat run: it cannot tell"; failed=1
  fi
else
  failed=1
fi
[ $failed -eq 0 ] && echo "test-trace: passed" || echo "test-trace: FAILED"
exit $failed
