#!/usr/bin/env bash
# bench/pipeline-bubble.sh: lesson 08's pipeline bubble, measured. One stage per rank (scripts/launch.sh), each
# (schedule, P, M) timed over STEPS steps of one batch (`train --bench`, after 2 untimed steps); each rank counts
# the seconds it waits in pg_recv / pg_send_wait against the step's; the mean over ranks is idle_measured, next
# to (P-1)/(M+P-1). Writes CSV, one row per run:
#
#   schedule,P,M,batch,step_ms,idle_measured,idle_formula,peak_inflight
#
# to bench/results-pipeline.csv (OUT=...), and the machine, its load (uptime before and after) and the command
# to bench/results-pipeline.txt. bench/plot_pipeline.py draws the CSV (make plot-pipeline).
#
#   bench/pipeline-bubble.sh                      P = 2, M = 1 2 4 8 16, GPipe and 1F1B; P = 4 when the machine
#                                                 has 4 cores (else with P4=1, oversubscribed: mark it so)
#   STEPS=10 BATCH=256 MODEL=tiny REPEAT=3 P4=1 bench/pipeline-bubble.sh      (the defaults, but P4)
#
# Each configuration runs REPEAT times and the run with the median step time is kept: on a shared machine a
# single run is at the mercy of whatever else runs (the text file records the load).
#
# With more ranks than cores, ranks share cores: a rank that waits yields its core (kit/dist.c polls with
# sched_yield, then sleeps), but the time it waits then includes other ranks' compute: the idle fraction of an
# oversubscribed run is NOT the pipeline's bubble. The text file says when that was the case.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
train=$BUILD/solutions/08-pipeline/train
out=${OUT:-bench/results-pipeline.csv}
info=${out%.csv}.txt
steps=${STEPS:-10}
batch=${BATCH:-256}
repeat=${REPEAT:-3}
model=${MODEL:-tiny}
schedules=${SCHEDULES:-gpipe 1f1b}
[ -x "$train" ] || make --no-print-directory "$train" >/dev/null
cores=$(nproc 2>/dev/null || echo 1)

{
  echo "# bench/pipeline-bubble.sh, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine: $(uname -m), $cores cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')"
  echo "load before: $(uptime)"
  echo "runs: $train --dataset synthetic --model $model --batch-size $batch --balance time --bench $steps (median of $repeat by step time)"
} >"$info"

echo "schedule,P,M,batch,step_ms,idle_measured,idle_formula,peak_inflight" >"$out"
one() {  # P M schedule -> the CSV row of one run
  local line
  line=$(KIT_PROGRESS=plain scripts/launch.sh "$1" "$train" --dataset synthetic --model "$model" --batch-size "$batch" \
         --balance time --stages "$1" --micro-batches "$2" --schedule "$3" --bench "$steps" 2>&1 | grep '^bench:' || true)
  [ -n "$line" ] || { echo "pipeline-bubble: P=$1 M=$2 $3 printed no bench line" >&2; return 1; }
  echo "$line" | sed -E 's/^bench: schedule=([^ ]+) P=([^ ]+) M=([^ ]+) batch=([^ ]+) step_ms=([^ ]+) idle_measured=([^ ]+) idle_formula=([^ ]+) peak_inflight=([^ ]+)$/\1,\2,\3,\4,\5,\6,\7,\8/'
}
run() {  # P M schedule: REPEAT runs, the median by step time appended to the CSV
  local rows="" i
  for ((i = 0; i < repeat; i++)); do rows+="$(one "$@")"$'\n'; done
  local row
  row=$(printf '%s' "$rows" | sort -t, -k5,5g | sed -n "$(( (repeat + 1) / 2 ))p")
  echo "$row" >>"$out"
  echo "  $row"
}
for s in $schedules; do
  for m in 1 2 4 8 16; do run 2 "$m" "$s"; done
done
if [ "$cores" -ge 4 ] || [ "${P4:-0}" = 1 ]; then
  [ "$cores" -lt 4 ] && echo "P = 4 on $cores cores: OVERSUBSCRIBED (ranks share cores; idle is not the bubble)" >>"$info"
  for s in $schedules; do
    for m in 1 4 16; do run 4 "$m" "$s"; done
  done
fi
echo "load after: $(uptime)" >>"$info"
echo "wrote $out and $info"
