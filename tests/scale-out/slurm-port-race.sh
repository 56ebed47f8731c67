#!/usr/bin/env bash
# tests/scale-out/slurm-port-race.sh: another process takes the local Slurm controller's port after
# scripts/slurm/local-cluster.sh chose it and before slurmctld binds it (what any other job on the machine can
# do); the start must retry on other ports and come up, not fail. Made deterministic: the holder binds the
# ports the script will choose (its formula: 20000 + (cksum of the folder) % 2000 * 10) without listening, so
# the script's probe (a connect) finds them free and slurmctld's bind finds them taken. Skips without root or Slurm.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
skip() { echo "skip scale-out slurm port race: $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root to start slurmd"
for c in slurmctld slurmd sinfo python3; do command -v "$c" >/dev/null 2>&1 || skip "$c is not installed"; done

dir=$(mktemp -d /tmp/kit-slurm-race.XXXXXX)
holder_out=$dir.holder
base=$((20000 + ($(cksum <<< "$dir" | cut -d' ' -f1) % 2000) * 10))
python3 - "$base" >"$holder_out" 2>&1 <<'PY' &
import socket, sys, time
base, held = int(sys.argv[1]), []
for port in range(base, base + 3):  # the controller's port and the two nodes': bound, never listening
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
        held.append(s)
    except OSError:
        pass
print("took", base, flush=True)
time.sleep(60)
PY
holder=$!
for _ in $(seq 100); do grep -q took "$holder_out" 2>/dev/null && break; sleep 0.05; done
out=$(timeout --kill-after=5 150 scripts/slurm/local-cluster.sh start "$dir" 2 2>&1)
rc=$?
scripts/slurm/local-cluster.sh stop "$dir" >/dev/null 2>&1
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
took=$(sed -n 's/^took //p' "$holder_out")
rm -rf "$dir" "$holder_out"
if [ -z "$took" ]; then
  echo "FAIL scale-out slurm port race: the holder could not take the chosen port first (the test did not happen)"
  exit 1
fi
if [ $rc -ne 0 ] || ! grep -q "retrying on the next ports" <<<"$out" || ! grep -q "node(s) up" <<<"$out"; then
  echo "FAIL scale-out slurm port race: port $took taken before slurmctld bound it; the start said:"
  printf '%s\n' "$out" | tail -n 8
  exit 1
fi
echo "ok   scale-out slurm port race: port $took taken between choice and bind: the start retried on other ports and came up"
