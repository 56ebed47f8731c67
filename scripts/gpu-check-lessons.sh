#!/usr/bin/env bash
# scripts/gpu-check-lessons.sh: one lesson program on the GPU, checked against the same run on the CPU (the
# `lessons` step of scripts/gpu-check.sh; every call is one line of its summary).
#
#   scripts/gpu-check-lessons.sh compare START PROGRAM ARGS... [-- GPU_ARGS...]
#       START: `1` one process, no launcher; `mpi:N` scripts/launch.sh N; `store:N` N processes started from a
#       rendezvous store (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, as torchrun starts them: lesson 07);
#       `torchrun:N` the real torchrun --standalone with N workers (lesson 07 joins its agent's store; skipped,
#       saying so, when python3 cannot import torch).
#       Runs PROGRAM ARGS --device cpu, then PROGRAM ARGS --device cuda GPU_ARGS (e.g. --backend nccl), and
#       compares the two `final:` lines.
#   scripts/gpu-check-lessons.sh infer TRAIN04 TRAIN06 DIR
#       lesson 04's program writes a checkpoint on the GPU (1 rank, NCCL), lesson 06's program evaluates it
#       on the GPU and on the CPU: each must reproduce the training run's own last evaluation.
#
# Tolerances, as tests/emu-lessons.sh derives them for the same runs (one epoch of a tiny net on the synthetic
# set): the GPU and the CPU sum in different orders, a one-step difference of ~1e-6 that an epoch's 39 steps
# amplify to ~1e-4 in the parameters; 0.01 on the mean training loss and 1 point of test accuracy sit ~100x
# above that and far below what a real mistake does (a missing all-reduce or a stale replica moves the loss
# by 0.1 or more). One GPU serves every rank here: 2 ranks share it, which NCCL refuses (one communicator,
# one device per rank), so multi-rank runs take the MPI backend (or the socket backend under a store start)
# and NCCL is checked on 1 rank, as lesson 03's README says.
set -u
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=SCRIPTDIR/../tests/extras-lib.sh
. tests/extras-lib.sh  # rank0_port: the port rank 0's store serves on (MASTER_PORT=0: any free port)

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

# start HOW PROGRAM ARGS...: runs the program the way HOW says; rank 0's output on stdout.
start() {
  local how=$1; shift
  case $how in
    1) "$@" ;;
    mpi:*) scripts/launch.sh "${how#mpi:}" "$@" ;;
    store:*)
      # Rank 0 first, on a port of the system's choosing (MASTER_PORT=0), the others once it has said which:
      # no port is picked free and bound later (other jobs share the machine).
      local n=${how#store:} port=0 r pids=() rc=0 logs
      logs=$(mktemp -d)
      for ((r = 0; r < n; r++)); do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port KIT_RUN_ID="gpu-check-$$" \
          "$@" >"$logs/$r.log" 2>&1 &
        pids+=($!)
        if [ $r = 0 ] && ! port=$(rank0_port "$logs/0.log" "${pids[0]}"); then
          echo "gpu-check-lessons: rank 0 never said the port of its store:"; cat "$logs/0.log"
          rc=1; break
        fi
      done
      for p in "${pids[@]}"; do wait "$p" || rc=1; done
      cat "$logs/0.log"
      for ((r = 1; r < n; r++)); do [ $rc = 0 ] || sed "s/^/[rank $r] /" "$logs/$r.log"; done
      rm -rf "$logs"
      return $rc ;;
    torchrun:*) torchrun --no-python --standalone --nproc-per-node "${how#torchrun:}" "$@" 2>&1 | grep -v '^W[0-9]\{4\}' ;;
    *) echo "gpu-check-lessons: START is 1, mpi:N, store:N or torchrun:N, not '$how'" >&2; return 2 ;;
  esac
}

compare() {
  local how=$1; shift
  local -a common=() gpu=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do common+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; gpu=("$@"); }
  local cpu_out gpu_out want got
  if [[ $how == torchrun:* ]] && ! python3 -c 'import torch' >/dev/null 2>&1; then
    echo "gpu-check-lessons: skipped: python3 cannot import torch, so there is no torchrun to start $how"; return 0
  fi
  echo "== CPU: $how ${common[*]} --device cpu"
  cpu_out=$(start "$how" "${common[@]}" --device cpu 2>&1); echo "$cpu_out"
  echo "== GPU: $how ${common[*]} --device cuda ${gpu[*]}"
  gpu_out=$(start "$how" "${common[@]}" --device cuda "${gpu[@]}" 2>&1); echo "$gpu_out"
  want=$(grep -m1 '^final:' <<<"$cpu_out"); got=$(grep -m1 '^final:' <<<"$gpu_out")
  if [ -z "$want" ] || [ -z "$got" ]; then
    echo "gpu-check-lessons: no final: line (cpu: '${want:-none}', cuda: '${got:-none}')"; return 1
  fi
  if awk -v a="$(field train_loss "$want")" -v b="$(field train_loss "$got")" \
         -v c="$(field test_acc "$want")" -v d="$(field test_acc "$got")" \
         'BEGIN { dl = a - b; da = c - d; exit !(dl < 0.01 && -dl < 0.01 && da < 0.01 && -da < 0.01) }'; then
    echo "gpu-check-lessons: the GPU run agrees with the CPU run (train_loss within 0.01, test_acc within 1 point)"
  else
    echo "gpu-check-lessons: the GPU and the CPU disagree beyond rounding"; return 1
  fi
}

# Lesson 06 on a GPU checkpoint. Eval-mode logits on the two devices differ by rounding (~1e-6 relative, one
# forward pass), so only an image whose top two logits are that close can change its prediction: within 2
# images of 1000 of the training run's count (tests/emu-lessons.sh, the same bound).
infer() {
  local train04=$1 train06=$2 dir=$3 dev out ref got status=0
  local -a net=(--dataset synthetic --model tiny-bn --width 8)
  mkdir -p "$dir"
  rm -f "$dir/l06.ckpt"  # a fresh run never replaces a checkpoint (invariant 13): this check's own, from a past run
  echo "== lesson 04 on the GPU (1 rank, NCCL) writes $dir/l06.ckpt"
  start mpi:1 "$train04" "${net[@]}" --epochs 1 --lr 0.03 --batch-size 64 --device cuda --backend nccl \
    --checkpoint "$dir/l06.ckpt" 2>&1
  [ -s "$dir/l06.ckpt" ] || { echo "gpu-check-lessons: lesson 04's program wrote no checkpoint on the GPU"; return 1; }
  for dev in cuda cpu; do
    echo "== lesson 06 on $dev"
    out=$("$train06" "${net[@]}" --checkpoint "$dir/l06.ckpt" --device "$dev" 2>&1); echo "$out"
    got=$(grep -m1 '^final:' <<<"$out")
    ref=$(field reference "$got"); got=$(field correct "$got")
    if [ -n "$ref" ] && [ -n "$got" ] && [ $((ref - got)) -le 2 ] && [ $((got - ref)) -le 2 ]; then
      echo "gpu-check-lessons: lesson 06 on $dev: $got correct, the GPU training run had $ref"
    else
      echo "gpu-check-lessons: lesson 06 on $dev does not reproduce the GPU training run (correct '${got:-?}', reference '${ref:-?}')"
      status=1
    fi
  done
  return $status
}

case ${1:-} in
  compare) shift; [ $# -ge 2 ] || { echo "usage: $0 compare START PROGRAM ARGS... [-- GPU_ARGS...]" >&2; exit 2; }; compare "$@" ;;
  infer) shift; [ $# -eq 3 ] || { echo "usage: $0 infer TRAIN04 TRAIN06 DIR" >&2; exit 2; }; infer "$@" ;;
  *) echo "usage: $0 compare START PROGRAM ARGS... [-- GPU_ARGS...] | infer TRAIN04 TRAIN06 DIR" >&2; exit 2 ;;
esac
