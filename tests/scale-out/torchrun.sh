#!/usr/bin/env bash
# tests/scale-out/torchrun.sh: lesson 07's program under the real torchrun (PyTorch's launcher), skipped with
# its reason when torch is not installed.
#   1. three rendezvous: --standalone, --rdzv-backend c10d with the endpoint's port 0 (the store binds a free
#      port itself and torchrun hands it to the workers), and the static one (--master-port): each ends with
#      mpirun -np 2's final line (bar its timing fields and the backend's name)
#   2. the kit's keys in torchrun's agent store are where the kit says (a PyTorch client reads them back)
#   3. --max-restarts 1 with rank 1 killed at a random step: the group restarts, resumes from lesson 04's last
#      checkpoint and ends with the same parameters, bit for bit, as an uninterrupted run
#
#   tests/scale-out/torchrun.sh PROGRAM CKPT_COMPARE     (build/solutions/07-scale-out/train build/tests/ckpt_compare)
set -u
cd "$(dirname "$0")/../.." || exit 1
program=$(realpath "${1:?usage: $0 PROGRAM CKPT_COMPARE}")
compare=$(realpath "${2:?usage: $0 PROGRAM CKPT_COMPARE}")
ok() { echo "ok   torchrun: $*"; }
bad() { echo "!! FAIL: torchrun: $*"; failed=1; }
failed=0
if ! python3 -c 'import torch' >/dev/null 2>&1; then
  echo "skip torchrun: python3 cannot import torch (pip install torch to run lesson 07 under the real torchrun)"
  exit 0
fi
if ! command -v torchrun >/dev/null 2>&1; then
  echo "skip torchrun: torch is installed but its torchrun command is not on PATH"
  exit 0
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
export PYTHONWARNINGS=ignore OMP_NUM_THREADS=1
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT KIT_RUN_ID KIT_SOCKET_IFNAME KIT_NODE_NAME
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ARGS=(--dataset synthetic --model tiny --epochs 2 --bucket-mb 0 --seed 5)
# The final line without what a run's speed or its backend changes.
final() { grep -m1 '^final:' "$1" | sed -E 's/ (images_per_s|seconds|backend)=[^ ]*//g'; }

timeout --kill-after=5 120 scripts/launch.sh 2 "$program" "${ARGS[@]}" >"$work/mpi.out" 2>&1
want=$(final "$work/mpi.out")
[ -n "$want" ] || { bad "mpirun -np 2 gave no final line:"; tail -n 5 "$work/mpi.out" | sed 's/^/   | /'; exit 1; }

# check FILE WHAT: torchrun's output in $work/FILE.out, its status in $rc
check() {
  local file=$1 name=$2 got
  got=$(final "$work/$file.out")
  if [ "$rc" -eq 0 ] && [ "$got" = "$want" ] && grep -q 'backend=socket' "$work/$file.out" &&
     grep -q '^launch: rendezvous store' "$work/$file.out"; then
    ok "$name: the same final line as mpirun -np 2 ($got)"
  else
    bad "$name: exit $rc, final line '${got:-none}', mpirun's '$want':"
    grep -Ev '^(epoch|W[0-9]{4})' "$work/$file.out" | tail -n 8 | sed 's/^/   | /'
  fi
}
TR=(timeout --kill-after=5 180 torchrun --no-python --nnodes 1 --nproc-per-node 2)

"${TR[@]}" --standalone "$program" "${ARGS[@]}" >"$work/standalone.out" 2>&1; rc=$?
check standalone standalone
"${TR[@]}" --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:0 --rdzv-id "kit-$$" "$program" "${ARGS[@]}" \
  >"$work/c10d.out" 2>&1; rc=$?
check c10d "c10d (rendezvous endpoint port 0)"
# The static rendezvous takes the port it is told and hands that number on (given 0, it binds a free port but
# tells the workers 0: the program refuses it), so the port is a guess here: torchrun binds it, and when
# another process holds it (EADDRINUSE) the run is repeated on another.
for attempt in 1 2 3; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
  "${TR[@]}" --rdzv-backend static --master-addr 127.0.0.1 --master-port "$port" --node-rank 0 "$program" \
    "${ARGS[@]}" >"$work/static.out" 2>&1; rc=$?
  grep -qiE 'EADDRINUSE|address already in use' "$work/static.out" || break
  echo "     static: port $port was taken meanwhile (attempt $attempt), another one"
done
check static "static (--master-port $port)"
"${TR[@]}" --rdzv-backend static --master-addr 127.0.0.1 --master-port 0 --node-rank 0 "$program" "${ARGS[@]}" \
  >"$work/static0.out" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q 'MASTER_PORT=0: torchrun bound a free port' "$work/static0.out"; then
  ok "static --master-port 0: refused with the reason (torchrun passes 0 on to the workers)"
else bad "static --master-port 0: exit $rc without the reason"; fi

# ---- 2. the keys, read back by PyTorch's own TCPStore client from a store PyTorch serves
cat >"$work/peer.py" <<'EOF'
import subprocess, sys, os
from datetime import timedelta
import torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=timedelta(seconds=30))
env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port), WORLD_SIZE="2",
           TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="peer", TORCHELASTIC_RESTART_COUNT="0")
procs = [subprocess.Popen(sys.argv[1:], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) for r in range(2)]
outs = [p.communicate(timeout=120)[0] for p in procs]
if any(p.returncode for p in procs):
    sys.exit("the ranks failed:\n" + "\n".join(o[-800:] for o in outs))
host = server.get("kit/peer/0/host/1").rstrip(b"\0").decode()
joined = [int(server.get("kit/peer/0/__join/%d" % r)) for r in range(2)]
print("host/1=%s joins=%s" % (host, joined))
EOF
if out=$(timeout 150 python3 "$work/peer.py" "$program" "${ARGS[@]}" --epochs 1 2>&1) && grep -q 'joins=\[1, 1\]' <<<"$out"; then
  ok "a PyTorch TCPStore client reads the kit's keys under kit/<run id>/<restart>/ ($(tail -n1 <<<"$out"))"
else bad "the kit's keys in a PyTorch TCPStore: $(tail -n 6 <<<"$out")"; fi

# ---- 3. a worker killed at a random step; torchrun restarts the group, which resumes from the checkpoint
RESTART_ARGS=("${ARGS[@]}" --epochs 3 --save-every 5 --resume auto)
"${TR[@]}" --standalone "$program" "${RESTART_ARGS[@]}" --checkpoint-dir "$work/whole" >"$work/whole.out" 2>&1 \
  || bad "the uninterrupted run failed: $(tail -n 3 "$work/whole.out")"
steps=$(sed -n 's/.* \([0-9]*\) steps per epoch.*/\1/p' "$work/whole.out" | head -n1)
total=$(( ${steps:-39} * 3 ))
kill_after=$(( 5 + RANDOM % (total - 20) ))  # a step between the first save and the last few
# The workers are started through a wrapper that notes each one's pid (exec: the pid is the program's).
cat >"$work/worker.sh" <<EOF
#!/bin/sh
echo \$\$ >"$work/pid.\$RANK.\$TORCHELASTIC_RESTART_COUNT"
exec "$program" "\$@"
EOF
chmod +x "$work/worker.sh"
mkdir -p "$work/restarted"
( # the killer: once a checkpoint at or after step $kill_after is there, rank 1 of the first attempt dies
  for _ in $(seq 1200); do
    newest=$(find "$work/restarted" -name 'ckpt-*.ckpt' | sort | tail -n 1)
    step=$(basename "${newest:-ckpt-0.ckpt}" .ckpt); step=$((10#${step#ckpt-}))
    if [ "$step" -ge "$kill_after" ] && [ -s "$work/pid.1.0" ]; then
      kill -9 "$(cat "$work/pid.1.0")" && echo "$step" >"$work/killed.step"; exit 0
    fi
    sleep 0.05
  done ) &
killer=$!
"${TR[@]}" --standalone --max-restarts 1 "$work/worker.sh" "${RESTART_ARGS[@]}" --checkpoint-dir "$work/restarted" \
  >"$work/restarted.out" 2>&1; rc=$?
kill "$killer" 2>/dev/null; wait "$killer" 2>/dev/null
a=$(find "$work/whole" -name 'ckpt-*.ckpt' | sort | tail -n 1)
b=$(find "$work/restarted" -name 'ckpt-*.ckpt' | sort | tail -n 1)
resumed=$(grep -m1 '^final:' "$work/restarted.out" | sed -n 's/.*resumed_from=\([^ ]*\).*/\1/p')
if [ ! -e "$work/killed.step" ]; then
  bad "no worker was killed (the run ended before step $kill_after?)"
elif [ $rc -ne 0 ] || [ ! -e "$work/pid.1.1" ]; then
  bad "killed at step $(cat "$work/killed.step"): torchrun exit $rc, restarted: $([ -e "$work/pid.1.1" ] && echo yes || echo no)"
  grep -Ev '^(epoch|W[0-9]{4})' "$work/restarted.out" | tail -n 8 | sed 's/^/   | /'
elif [ "${resumed:-none}" = none ]; then
  bad "the restarted group did not resume from a checkpoint (final: resumed_from=${resumed:-?})"
elif [ "$(basename "$a")" = "$(basename "$b")" ] && "$compare" "$a" "$b" >"$work/cmp.out" 2>&1; then
  ok "rank 1 killed after step $(cat "$work/killed.step") (chosen: $kill_after of $total), torchrun restarted the group, it resumed from step $resumed: $(basename "$b") $(cat "$work/cmp.out") to the uninterrupted run's"
else
  bad "after the restart (resumed from step $resumed) the last checkpoint $(basename "$b") differs from the uninterrupted $(basename "$a"): $(cat "$work/cmp.out")"
fi
exit $failed
