#!/usr/bin/env bash
# bench/run-scaling.sh: the scaling study of lesson 07 (bench/SCALING.md explains it). Runs a DDP training
# program on 1, 2, 4, 8 ranks and writes CSV tables to bench/figures/scaling-*.csv and a summary with the machine,
# the share of the machine other work took during each run (bench/cpu_share.py) and an Amdahl fit to bench/results-scaling.md; bench/plot-scaling.sh draws the PNGs.
#
#   bench/run-scaling.sh [PROGRAM]        (make bench-scaling; default: lesson 03's solution)
#
# Parts (each one CSV):
#   strong   the same global batch (SCALING_BATCH, default 256) over N ranks: speedup and efficiency
#   weak     the same batch per rank (SCALING_BATCH / 8 = 32) over N ranks: the global batch grows with N
#   bucket   gradient bucket size (--bucket-mb) at 2 ranks on 2 hosts over a capped link: overlap or not
#   link     2 ranks: shared memory on one host, then TCP between two network namespaces, plain and capped
# Every run: images/s (the program's final line) and the time split it prints (compute, exposed communication =
# waiting for the gradient all-reduce after backward, data = waiting for the loader), OMP_NUM_THREADS=1 so
# that a rank is one core. The namespace parts need root and are skipped otherwise (said in the summary).
#
# Knobs: SCALING_NPS ("1 2 4 8"), SCALING_ARGS (default "--model fmnist --epochs 1": 60k parameters, 5000
# synthetic images), SCALING_BUCKETS ("0 0.01 0.05 25"), SCALING_RATES (Mbit/s caps, "1000 100 10"),
# SCALING_BUCKET_RATE (the cap of the bucket part, 10), SCALING_PARTS ("strong weak bucket link"),
# SCALING_OUT (folder for the CSVs, bench/figures), SCALING_MD (bench/results-scaling.md).
set -euo pipefail
cd "$(dirname "$0")/.."
program=$(realpath "${1:-build/solutions/03-ddp/train}")
[ -x "$program" ] || { echo "run-scaling: $program not built (make)" >&2; exit 1; }
nps=${SCALING_NPS:-1 2 4 8}
batch=${SCALING_BATCH:-256}
read -r -a base <<< "${SCALING_ARGS:---model fmnist --epochs 1}"
base=(--device cpu --dataset synthetic --timeout 60 "${base[@]}")
buckets=${SCALING_BUCKETS:-0 0.01 0.05 25}
rates=${SCALING_RATES:-1000 100 10}
bucket_rate=${SCALING_BUCKET_RATE:-10}
parts=${SCALING_PARTS:-strong weak bucket link}
out=${SCALING_OUT:-bench/figures}
md=${SCALING_MD:-bench/results-scaling.md}
cores=$(nproc)
export OMP_NUM_THREADS=1 KIT_PROGRESS=plain
mkdir -p "$out"
work=$(mktemp -d)
ns=""
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  [ -n "$ns" ] && scripts/netns-cluster.sh down "$ns"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

started=$(date -u '+%Y-%m-%d %H:%M UTC')

# measure LOG: "images_per_s,total_s,compute_s,comm_s,data_s" from the program's summary lines:
#   ddp: rank 0 computed for X s and waited Y s (P%) ...    Y = exposed communication
#   time: T s training, of which D s (Q%) waiting for data and C s computing   (C includes Y)
measure() {
  local log=$1 ips t d y
  ips=$(sed -n 's/^final: .*images_per_s=\([0-9.]*\).*/\1/p' "$log")
  t=$(sed -n 's/^time: \([0-9.]*\) s training, of which \([0-9.]*\) s.*/\1/p' "$log")
  d=$(sed -n 's/^time: \([0-9.]*\) s training, of which \([0-9.]*\) s.*/\2/p' "$log")
  y=$(sed -n 's/^ddp: rank 0 computed for [0-9.]* s and waited \([0-9.]*\) s.*/\1/p' "$log")
  if [ -z "$ips" ] || [ -z "$t" ] || [ -z "$y" ]; then
    echo "run-scaling: no final/time/ddp lines in the output:" >&2
    tail -n 8 "$log" >&2
    return 1
  fi
  sed -n 's/^model .*: [0-9]* layers, \([0-9]*\) parameters.*/\1/p' "$log" > "$work/params"
  awk -v i="$ips" -v t="$t" -v d="$d" -v y="$y" 'BEGIN { c = t - d - y; if (c < 0) c = 0;
    printf "%s,%s,%.1f,%s,%s\n", i, t, c, y, d }'
}

# measured CMD...: runs CMD (output to $work/log) under bench/cpu_share.py, which appends the share of the machine
# that OTHER work took meanwhile to $work/shares (the load average cannot say: 8 ranks on 2 cores make it 8 alone).
measured() {
  # timeout inside: it signals the run itself (mpirun), not only the measuring wrapper
  python3 bench/cpu_share.py --log "$work/shares" -- timeout --kill-after=5 600 "$@" >"$work/log" 2>&1
}
# other_pct: the last run's share, in %
other_pct() { tail -n 1 "$work/shares" | python3 -c 'import json, sys; print(round(100 * json.load(sys.stdin)["other_share"], 1))'; }
# run_shm NP ARGS...: one host, NP ranks (shared memory between them)
run_shm() {
  local np=$1; shift
  measured scripts/launch.sh "$np" "$program" "${base[@]}" "$@" ||
    { echo "run-scaling: $np ranks failed:" >&2; tail -n 8 "$work/log" >&2; return 1; }
  echo "$(measure "$work/log"),$(other_pct)"
}
# run_tcp PER_HOST ARGS...: 2 hosts (namespaces) x PER_HOST ranks, TCP over the veth pair
run_tcp() {
  local per=$1; shift
  measured scripts/netns-cluster.sh mpirun "$ns" "$per" "$program" "${base[@]}" "$@" ||
    { echo "run-scaling: 2 hosts x $per ranks failed:" >&2; tail -n 8 "$work/log" >&2; return 1; }
  echo "$(measure "$work/log"),$(other_pct)"
}
# link_up [RATE]: (re)creates the two hosts, the cable capped at RATE Mbit/s when given
link_up() {
  [ -n "$ns" ] && scripts/netns-cluster.sh down "$ns"
  ns=ks$(($$ % 100000))
  scripts/netns-cluster.sh up "$ns" ${1:+--rate "$1"} >"$work/up.log" 2>&1 ||
    { echo "run-scaling: could not create the namespaces:" >&2; cat "$work/up.log" >&2; return 1; }
  grep -o 'link shaped: .*' "$work/up.log" || true
}

netns_ok=1
netns_why=$(scripts/netns-cluster.sh check 2>&1) || netns_ok=0
say() { echo "run-scaling: $*" >&2; }
header="images_per_s,total_s,compute_s,comm_s,data_s,other_pct"

# ---- strong scaling: global batch fixed
if [[ " $parts " == *" strong "* ]]; then
  echo "ranks,global_batch,$header" > "$out/scaling-strong.csv"
  for n in $nps; do
    say "strong: $n rank(s), global batch $batch"
    r=$(run_shm "$n" --batch-size "$batch")
    echo "$n,$batch,$r" >> "$out/scaling-strong.csv"
  done
fi
# ---- weak scaling: batch per rank fixed
if [[ " $parts " == *" weak "* ]]; then
  per=$((batch / 8))
  echo "ranks,global_batch,$header" > "$out/scaling-weak.csv"
  for n in $nps; do
    say "weak: $n rank(s) x $per images"
    r=$(run_shm "$n" --batch-size $((per * n)))
    echo "$n,$((per * n)),$r" >> "$out/scaling-weak.csv"
  done
fi
# ---- bucket size: 2 hosts x 1 rank over a capped link, where communication is worth hiding
if [[ " $parts " == *" bucket "* ]] && [ $netns_ok = 1 ]; then
  link_up "$bucket_rate" >/dev/null
  echo "bucket_mb,link,$header" > "$out/scaling-bucket.csv"
  for b in $buckets; do
    say "bucket: --bucket-mb $b, 2 hosts x 1 rank, TCP capped at $bucket_rate Mbit/s"
    r=$(run_tcp 1 --batch-size "$batch" --bucket-mb "$b")
    echo "$b,tcp-${bucket_rate}mbit,$r" >> "$out/scaling-bucket.csv"
  done
fi
# ---- the interconnect: 2 ranks, shared memory vs TCP between namespaces, plain and capped
link_note=""
if [[ " $parts " == *" link "* ]]; then
  echo "link,rate_mbit,$header" > "$out/scaling-link.csv"
  say "link: 2 ranks on one host (shared memory)"
  r=$(run_shm 2 --batch-size "$batch")
  echo "shm,0,$r" >> "$out/scaling-link.csv"
  if [ $netns_ok = 1 ]; then
    for rate in "" $rates; do
      shaped=$(link_up "$rate")
      [ -n "$shaped" ] && link_note=$shaped
      say "link: 2 hosts x 1 rank, TCP${rate:+ capped at $rate Mbit/s}"
      r=$(run_tcp 1 --batch-size "$batch")
      echo "tcp${rate:+-${rate}mbit},${rate:-0},$r" >> "$out/scaling-link.csv"
    done
  fi
fi
# ---- the summary
python3 bench/scaling_summary.py --out-dir "$out" --cores "$cores" --started "$started" --program "${program#"$PWD"/}" --args "${base[*]}" \
  --batch "$batch" --params "$(cat "$work/params" 2>/dev/null)" --netns "$([ $netns_ok = 1 ] && echo yes || echo "no: ${netns_why#netns-cluster: }")" \
  --link-note "$(sed 's/^link shaped: //; s/ rate [0-9]* Mbit\/s//' <<< "$link_note")" --cpu "$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)" > "$md"
echo "run-scaling: wrote $md and $out/scaling-*.csv; bench/plot-scaling.sh draws them (make plot-scaling)"
