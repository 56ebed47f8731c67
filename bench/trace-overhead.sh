#!/usr/bin/env bash
# The cost of --trace: lesson 03 on 2 ranks (synthetic set, the toy net, 6 gradient buckets: the most events per
# second of compute of the lesson's runs), with and without --trace, alternating so that a change of the
# machine's load falls on both. Prints one line per run and the medians; bench/results-trace.md has a result.
#
#   bench/trace-overhead.sh BUILD/solutions/03-ddp/train [ROUNDS] [EXTRA ARGS...]
set -eu
bin=$1
rounds=${2:-5}
shift $(( $# >= 2 ? 2 : 1 ))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--dataset synthetic --epochs 2 --bucket-mb 0.001 "$@")
echo "command: scripts/launch.sh 2 $bin ${args[*]} [--trace FILE]"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "load before: $(uptime | sed 's/.*load average/load average/')"
off=() on=()
for r in $(seq 1 "$rounds"); do
  for mode in off on; do
    extra=()
    [ $mode = on ] && extra=(--trace "$dir/t.json")
    line=$(scripts/launch.sh 2 "$bin" "${args[@]}" "${extra[@]}" | grep '^final:')
    ips=$(sed 's/.*images_per_s=\([0-9]*\).*/\1/' <<< "$line")
    echo "round $r trace=$mode images_per_s=$ips"
    if [ $mode = on ]; then on+=("$ips"); else off+=("$ips"); fi
  done
done
echo "load after: $(uptime | sed 's/.*load average/load average/')"
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
off = [float(x) for x in sys.argv[1].split()]
on = [float(x) for x in sys.argv[2].split()]
mo, mn = statistics.median(off), statistics.median(on)
print(f"median images/s: off {mo:.0f}, on {mn:.0f}: tracing costs {100 * (mo - mn) / mo:+.1f} % "
      f"(run-to-run spread off {min(off):.0f}-{max(off):.0f}, on {min(on):.0f}-{max(on):.0f})")
PY
