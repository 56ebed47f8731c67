#!/usr/bin/env bash
# The timelines of lessons 01, 02 and 04-11 (make test-trace, after lesson 03's run-lesson03.sh): each lesson's
# program on 2 ranks (01, 02 and 06: one process), one short epoch of the synthetic set, with --trace. Every merged
# file must be what Perfetto reads (tools/trace_check.py: valid JSON, nesting, async pairs, every rank named) and
# show the lesson's own spans:
#   01, 02  every step, a "data wait" before each (kit/loader.c), the evaluation, the loader's batches on its track;
#   04  a checkpoint save;
#   06  (one process, lesson 04's checkpoint) the load, the evaluation, and the loader's batches on its track;
#   08  M forward and M backward micro-batch spans per step on each stage (M = --micro-batches), and each
#       rank's idle share on the timeline (its "recv ..." and "wait: send" spans over its "step N" spans) equal to
#       the one the program prints, within 1 point: the spans and the program's counters time the same intervals
#       with their own clock reads (microseconds apart), and the print rounds to 0.01 ms;
#   09  ZeRO-3: every "all-gather unit u" inside the window of unit u's forward or backward, on the same track
#       (a parameter is gathered for its unit's compute, never for the whole model);
#   08's and 09's claims are also checked in SQL (tools/trace_perfetto.py: Perfetto's trace processor, or where it
#   cannot run the same queries on its sqlite3 stand-in), each against a planted wrong value that must fail;
#   10  the steps, the gradient all-reduce of each, one forward and one backward micro-batch span per step;
#   11  each block's tensor all-reduce inside the block's span: g in its forward, f in its backward.
#
# Usage: tests/trace/run-lessons.sh BUILD    (BUILD/solutions/NN-*/train)
set -u
build=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's plugins (tests/run-dist-tests.sh)
failed=0
steps=8  # --stop-at: a few steps are enough to see each thing, and keep make test short
run() {  # LESSON ARGS...: trains with --trace $dir/LESSON.json; 1 when the program fails
  local lesson=$1
  shift
  if ! timeout --kill-after=5 300 scripts/launch.sh 2 "$build/solutions/$lesson/train" --dataset synthetic \
       --epochs 1 --batch-size 64 --trace "$dir/$lesson.json" "$@" >"$dir/$lesson.log" 2>&1; then
    echo "!! lesson $lesson with --trace $* failed:"; tail -20 "$dir/$lesson.log"; return 1
  fi
}
# check FILE ARGS...: tools/trace_check.py's checks, then the file loaded by Perfetto's own engine where it can run
# (tools/trace_perfetto.py: it says why when it skips).
check() {
  python3 tools/trace_check.py --ranks 2 "$@" || failed=1
  python3 tools/trace_perfetto.py "$1" || failed=1
}

# micro_spans FILE M RULE: on each rank, exactly M "backward micro-batch" spans per "step N" span, and M forward ones
# per step, RULE "exactly" or "at-least" (a lesson whose evaluation also runs micro-batch forwards).
micro_spans() {
  python3 - "$@" <<'PY' || failed=1
import json, sys
path, m, rule = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ev = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
for r in (0, 1):
    steps = sum(1 for e in ev if e["pid"] == r and e["name"].startswith("step "))
    fw = sum(1 for e in ev if e["pid"] == r and e["name"].startswith("forward micro-batch"))
    bw = sum(1 for e in ev if e["pid"] == r and e["name"].startswith("backward micro-batch"))
    print(f"rank {r}: {steps} steps, {fw} forward and {bw} backward micro-batch spans")
    fw_ok = fw == m * steps if rule == "exactly" else fw >= m * steps
    if steps == 0 or bw != m * steps or not fw_ok:
        sys.exit(f"!! rank {r}: expected {m} backward micro-batch span(s) per step and {rule} {m} forward")
PY
}

echo "== lessons 01 and 02: one process, its steps, data waits, evaluation and the loader's batches"
for lesson in 01-single-gpu 02-data-parallel; do
  if timeout --kill-after=5 120 "$build/solutions/$lesson/train" --dataset synthetic --epochs 1 --batch-size 64 \
       --trace "$dir/$lesson.json" >"$dir/$lesson.log" 2>&1; then
    # The synthetic set's 5000 training images in batches of 64: steps 0-77 (the short last batch dropped) and 79
    # waits (one more sees the epoch's end); its 1000 test images: 16 batches, 17 waits.
    python3 tools/trace_check.py --ranks 1 "$dir/$lesson.json" --count "0:step 0:1" --count "0:step 77:1" \
      --count "0:step 78:0" --count "0:data wait:96" --count "0:evaluate:1" --min-count "0:load batch 0:1" || failed=1
    python3 tools/trace_perfetto.py "$dir/$lesson.json" || failed=1
  else echo "!! lesson $lesson with --trace failed:"; tail -20 "$dir/$lesson.log"; failed=1; fi
done

echo "== lesson 04: a checkpoint save on the timeline"
if run 04-checkpoint --checkpoint "$dir/c04.ckpt" --stop-at $steps; then
  check "$dir/04-checkpoint.json" --min-count 0:backward:$steps --min-count 1:backward:$steps
  grep -q '"name":"checkpoint' "$dir/04-checkpoint.json" || { echo "!! no checkpoint span in lesson 04's trace"; failed=1; }
else failed=1; fi

echo "== lesson 06: one process, the checkpoint load and the evaluation, the loader on its own track"
if timeout --kill-after=5 120 "$build/solutions/06-inference/train" --dataset synthetic --checkpoint "$dir/c04.ckpt" \
     --trace "$dir/06-inference.json" >"$dir/06-inference.log" 2>&1; then
  python3 tools/trace_check.py --ranks 1 "$dir/06-inference.json" --count "0:load checkpoint:1" \
    --count "0:evaluate the test split:1" --min-count "0:load batch 0:1" || failed=1
  python3 tools/trace_perfetto.py "$dir/06-inference.json" || failed=1
else echo "!! lesson 06 with --trace failed:"; tail -20 "$dir/06-inference.log"; failed=1; fi

echo "== lesson 08: M = 2 micro-batches each way per step, on each stage"
if run 08-pipeline --stages 2 --micro-batches 2; then
  check "$dir/08-pipeline.json"
  micro_spans "$dir/08-pipeline.json" 2 at-least  # forwards also run in evaluation (no backward there)
  python3 - "$dir/08-pipeline.json" "$dir/08-pipeline.log" <<'PY' || failed=1
import json, re, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
printed = {int(m[0]): float(m[2]) / float(m[1]) for m in
           re.findall(r"rank (\d+) \(stage.*?\): step ([\d.]+) = computing [\d.]+ \+ waiting ([\d.]+)",
                      open(sys.argv[2]).read())}
if sorted(printed) != [0, 1]:
    sys.exit("!! lesson 08 printed no per-rank 'step = computing + waiting' line for ranks 0 and 1")
for r in (0, 1):
    steps = [e for e in ev if e["pid"] == r and e["name"].startswith("step ")]
    def in_step(e):
        return any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in steps)
    wait = sum(e["dur"] for e in ev if e["pid"] == r and e["name"].startswith(("recv ", "wait: send")) and in_step(e))
    idle = wait / sum(s["dur"] for s in steps)
    print(f"rank {r}: idle {100 * idle:.1f} % on the timeline, {100 * printed[r]:.1f} % printed")
    if abs(idle - printed[r]) > 0.01:
        sys.exit(f"!! rank {r}: the timeline's idle share differs from the printed one by more than 1 point")
PY
  # The same claim in SQL (Perfetto's engine, or its stand-in), which must also fail on a share 10 points off.
  shares=$(awk '/^ *rank [0-9]+ \(stage.*\): step [0-9.]+ = computing [0-9.]+ \+ waiting [0-9.]+/ {
                  for (i = 1; i <= NF; i++) { if ($i == "step") s = $(i + 1); if ($i == "waiting") w = $(i + 1) }
                  printf "%d:%.4f ", $2, w / s }' "$dir/08-pipeline.log")
  read -r -a claims <<<"$shares"
  python3 tools/trace_perfetto.py "$dir/08-pipeline.json" "${claims[@]/#/--idle-share=}" || failed=1
  off="${claims[0]%%:*}:$(awk -v s="${claims[0]#*:}" 'BEGIN { printf "%.4f", (s > 0.5 ? s - 0.1 : s + 0.1) }')"
  python3 tools/trace_perfetto.py "$dir/08-pipeline.json" --idle-share="$off" >/dev/null
  [ $? -eq 1 ] || { echo "!! the SQL idle-share check did not fail (exit 1) on a share 10 points off ($off)"; failed=1; }
else failed=1; fi

echo "== lesson 09: ZeRO-3's all-gathers inside their units' windows"
if run 09-zero --zero 3 --stop-at $steps; then
  check "$dir/09-zero.json"
  python3 - "$dir/09-zero.json" <<'PY' || failed=1
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
gathers = [e for e in ev if e["name"].startswith("all-gather unit ")]
windows = [e for e in ev if e["name"].startswith(("forward unit ", "backward unit "))]
def inside(g):
    u = g["name"].rsplit(" ", 1)[1]
    return any(w["pid"] == g["pid"] and w["tid"] == g["tid"] and w["name"].rsplit(" ", 1)[1] == u
               and w["ts"] <= g["ts"] and g["ts"] + g["dur"] <= w["ts"] + w["dur"] for w in windows)
out = [g for g in gathers if not inside(g)]
print(f"{len(gathers)} unit all-gathers, {len(out)} outside their unit's window")
sys.exit(1 if not gathers or out else 0)
PY
  # The same claim in SQL, which must fail when one all-gather is moved out of its unit's window (1 s earlier).
  python3 tools/trace_perfetto.py "$dir/09-zero.json" --gathers-in-unit-windows || failed=1
  python3 - "$dir/09-zero.json" "$dir/09-moved.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
g = next(e for e in d["traceEvents"] if e["ph"] == "X" and e["name"].startswith("all-gather unit "))
g["ts"] -= 1e6
json.dump(d, open(sys.argv[2], "w"))
PY
  python3 tools/trace_perfetto.py "$dir/09-moved.json" --gathers-in-unit-windows >/dev/null
  [ $? -eq 1 ] || { echo "!! the SQL all-gather check did not fail (exit 1) on a gather moved out of its window"; failed=1; }
else failed=1; fi

echo "== lesson 10: the steps and their gradient all-reduce (bf16)"
if run 10-precision --precision bf16 --stop-at $steps; then
  check "$dir/10-precision.json" --min-count "0:step 1:1" --min-count "1:step 1:1"
  grep -q '"name":"all-reduce ' "$dir/10-precision.json" || { echo "!! no all-reduce span in lesson 10's trace"; failed=1; }
  micro_spans "$dir/10-precision.json" 1 exactly  # --accumulate 1: one micro-batch per step, each way
else failed=1; fi

echo "== lesson 11: each block's tensor all-reduce inside its forward (g) and its backward (f)"
if run 11-tensor --model resnet9 --width 4 --tp 2 --stop-at $steps; then
  check "$dir/11-tensor.json"
  python3 - "$dir/11-tensor.json" <<'PY' || failed=1
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
for r in (0, 1):
    mine = [e for e in ev if e["pid"] == r]
    steps = sum(1 for e in mine if e["name"].startswith("step "))
    def inside(e, prefix):
        return any(w["name"].startswith(prefix) and w["tid"] == e["tid"] and w["ts"] <= e["ts"]
                   and e["ts"] + e["dur"] <= w["ts"] + w["dur"] for w in mine)
    reduces = [e for e in mine if e["name"].startswith("all-reduce ") and "floats" in e["name"]]
    fw = sum(1 for e in reduces if inside(e, "forward block"))
    bw = sum(1 for e in reduces if inside(e, "backward block"))
    print(f"rank {r}: {steps} steps; float all-reduces: {fw} in block forwards, {bw} in block backwards, "
          f"{len(reduces) - fw - bw} elsewhere")
    # ResNet-9 has 2 blocks: g once per block forward (training and evaluation), f once per block backward;
    # with one replica (2 ranks, --tp 2) no other float all-reduce exists.
    if steps == 0 or bw != 2 * steps or fw < 2 * steps or len(reduces) != fw + bw:
        sys.exit(f"!! rank {r}: expected 2 tensor all-reduces per step in block backwards, at least 2 in block "
                 "forwards, and none elsewhere")
PY
else failed=1; fi

[ $failed -eq 0 ] && echo "test-trace (lessons 01, 02, 04-11): passed" || echo "test-trace (lessons 01, 02, 04-11): FAILED"
exit $failed
