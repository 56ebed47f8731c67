#!/usr/bin/env bash
# tests/emu-lessons.sh: the CUDA path of the lesson PROGRAMS, end to end, in the CUDA emulator (make EMU=1).
#
#   tests/emu-lessons.sh CPU_BUILD EMU_BUILD
#
# tests/test_cuda.c checks every op on the CUDA path against the CPU, one call at a time; this checks what
# those tests cannot see: that each lesson's program drives the CUDA backend correctly over a whole epoch
# (replicas on two emulated GPUs in lesson 02, the MPI backend staging device buffers in lesson 03; lesson 01's
# program is the single-device part of both, and its kernel has a test of its own in test-emu; lesson 06's
# inference from a checkpoint; lesson 08's pipeline in one process with stage 0 on the CPU and stage 1 on the
# emulated GPU, the activations and their gradients copied across the cut between the two, at the end; lesson
# 09's ZeRO stage 3 with recomputation on 1 and 2 ranks, and lesson 10's fp16 + bf16 all-reduce + accumulation on
# 2 ranks, for 15 steps: see their own paragraphs below; lesson 10's bf16 through the CPU's oneDNN GEMMs against
# its emulation; lesson 10's peak memory with bf16 storage against fp32; lesson 11's tensor parallelism on 2 ranks).
# Each run trains the tiny net for one epoch on the synthetic set with --device cuda-emu and with --device cpu,
# and the two `final:` lines must agree. The two paths sum in different orders (cuBLAS's column-major GEMM on
# OpenBLAS, the kernels' reductions), so they are not bit-identical: the one-step error is ~1e-6 and the
# 39 steps of an epoch amplify it to ~1e-4 in the parameters (bench/ddp_drift.c measures this drift). The
# tolerances, 0.01 on the epoch's mean loss and 1 point of test accuracy, sit ~100x above that, and far below
# what a real mistake does (a missing gradient reduce or a stale replica moves the loss by 0.1 or more).
set -u
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0  # Open MPI's own allocations (run-dist-tests.sh)
cpu=${1:?usage: $0 CPU_BUILD EMU_BUILD}
emu=${2:?usage: $0 CPU_BUILD EMU_BUILD}
cd "$(dirname "$0")/.."
args=(--model tiny --epochs 1)
status=0

# field NAME LINE: the value of NAME=... in a `final:` line.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

# check LABEL CPU_COMMAND... -- EMU_COMMAND...
check() {
  local label=$1; shift
  local -a cpu_cmd=() emu_cmd=()
  while [ "$1" != "--" ]; do cpu_cmd+=("$1"); shift; done
  shift; emu_cmd=("$@")
  local want got start secs
  want=$("${cpu_cmd[@]}" 2>&1 | grep '^final:')
  start=$(date +%s)
  got=$("${emu_cmd[@]}" 2>&1 | grep '^final:')
  secs=$(( $(date +%s) - start ))
  if [ -z "$want" ] || [ -z "$got" ]; then
    echo "FAIL $label: no final: line (cpu: '${want:-none}', cuda-emu: '${got:-none}')"; return 1
  fi
  if awk -v a="$(field train_loss "$want")" -v b="$(field train_loss "$got")" \
         -v c="$(field test_acc "$want")" -v d="$(field test_acc "$got")" \
         'BEGIN { dl = a - b; da = c - d; exit !(dl < 0.01 && -dl < 0.01 && da < 0.01 && -da < 0.01) }'; then
    echo "ok   $label (${secs} s in the emulator): train_loss $(field train_loss "$got") vs $(field train_loss "$want") on the CPU, test_acc $(field test_acc "$got") vs $(field test_acc "$want")"
  else
    echo "FAIL $label: the CUDA path (emulated) and the CPU path disagree beyond rounding:"
    echo "     cpu:      $want"; echo "     cuda-emu: $got"; return 1
  fi
}

# Lessons 02 and 03 run side by side: the emulator runs every kernel on ONE host thread (kit/cuda/README.md), so
# lesson 02's process (its two emulated GPUs take turns) leaves the second core idle for its whole 40 s, which
# lesson 03's two ranks use (measured on 2 cores: 41 s + 30 s one after the other). Each check compares its own
# program's two paths, so running beside the other changes their speed, not their numbers.
out=$(mktemp -d)
check "lesson 02 on two emulated GPUs" \
  "$cpu/solutions/02-data-parallel/train" --device cpu --devices 2 "${args[@]}" -- \
  env KIT_EMU_GPUS=2 "$emu/solutions/02-data-parallel/train" --device cuda-emu --devices 2 "${args[@]}" \
  >"$out/02" 2>&1 &
l02=$!
if [ -x "$cpu/solutions/03-ddp/train" ] && [ -x "$emu/solutions/03-ddp/train" ]; then
  check "lesson 03 on 2 ranks, MPI backend, emulated GPUs" \
    scripts/launch.sh 2 "$cpu/solutions/03-ddp/train" --device cpu "${args[@]}" -- \
    scripts/launch.sh 2 "$emu/solutions/03-ddp/train" --device cuda-emu "${args[@]}" >"$out/03" 2>&1 || status=1
fi
wait $l02 || status=1
cat "$out/02" "$out/03" 2>/dev/null
rm -rf "$out"
# Lesson 08: the same two stages, both on the CPU or split over the CPU and the emulated GPU (--stage-devices),
# beside lesson 06 as lesson 02 runs beside lesson 03 (the emulator takes one core). The same 39 steps, so the
# tolerances above hold; --width 8 quarters the emulated stage's convolution (~19 s of CPU instead of ~31 s) and
# only shortens its sums over channels (less rounding to amplify, not more).
l08=
if [ -x "$cpu/solutions/08-pipeline/train" ] && [ -x "$emu/solutions/08-pipeline/train" ]; then
  out08=$(mktemp)
  check "lesson 08 in one process, stage 0 on the CPU, stage 1 on an emulated GPU" \
    "$cpu/solutions/08-pipeline/train" --device cpu --stages 2 --width 8 "${args[@]}" -- \
    "$emu/solutions/08-pipeline/train" --stage-devices cpu,cuda-emu --stages 2 --width 8 "${args[@]}" >"$out08" 2>&1 &
  l08=$!
fi
# Lesson 09 at stage 3 with recomputation: every unit's parameters all-gathered into device memory for its
# forward and again for its backward, its activations released and recomputed, the gradients reduce-scattered
# into device shards (2 ranks: the MPI backend staging them), the shards updated on the device. Under the
# emulator a whole epoch of it costs ~40 s of CPU per run (im2col of the first convolution dominates, whatever
# --width), so the run stops after 15 of the 39 steps (--stop-at; --warmup-epochs 0 and --lr 0.2 so that the
# weights move from the first step), and stops before the epoch ends: its final: line has no epoch to report.
# What is compared instead, at step 15: the progress line's running train loss and accuracy with the
# tolerances above, and the whole model, consolidated from the ranks' shards (--consolidate), by
# tests/ckpt_compare.c: the largest parameter difference relative to the largest parameter, at most 1e-3.
# That is 10x the ~1e-4 a whole epoch of 39 steps drifts to (above): 15 steps drift less, but a rounding
# difference can flip a ReLU or a max-pool's choice for one image, which moves a few parameters by a step
# of their own (measured here: 1.4e-7 on 2 ranks, 2.9e-5 on 1 rank, the same for any emulator thread order).
# A mistake moves them far more: a 1 % change of the learning rate alone gives 7e-3.
z09_stop=15
z09=(--model tiny --width 8 --epochs 1 --warmup-epochs 0 --lr 0.2 --zero 3 --recompute --stop-at $z09_stop)
compare=$cpu/tests/ckpt_compare
# check_stopped LABEL CPU_COMMAND... -- EMU_COMMAND...   (each gets $save_opt FILE appended: the option that
# writes the whole model as a lesson 04 checkpoint)
save_opt=--consolidate
check_stopped() {
  local label=$1; shift
  local -a cpu_cmd=() emu_cmd=()
  while [ "$1" != "--" ]; do cpu_cmd+=("$1"); shift; done
  shift; emu_cmd=("$@")
  local dir want got start secs verdict
  dir=$(mktemp -d)
  want=$(KIT_PROGRESS=plain "${cpu_cmd[@]}" "$save_opt" "$dir/cpu.ckpt" 2>&1 | grep " step $z09_stop/")
  start=$(date +%s)
  got=$(KIT_PROGRESS=plain "${emu_cmd[@]}" "$save_opt" "$dir/emu.ckpt" 2>&1 | grep " step $z09_stop/")
  secs=$(( $(date +%s) - start ))
  if [ -z "$want" ] || [ -z "$got" ] || [ ! -s "$dir/cpu.ckpt" ] || [ ! -s "$dir/emu.ckpt" ]; then
    echo "FAIL $label: no progress line at step $z09_stop or no consolidated model (cpu: '${want:-none}', cuda-emu: '${got:-none}')"
    rm -rf "$dir"; return 1
  fi
  local lw la gw ga
  lw=$(sed 's/.* loss \([^ ]*\) acc \([^%]*\)%.*/\1/' <<<"$want"); la=$(sed 's/.* loss \([^ ]*\) acc \([^%]*\)%.*/\2/' <<<"$want")
  gw=$(sed 's/.* loss \([^ ]*\) acc \([^%]*\)%.*/\1/' <<<"$got"); ga=$(sed 's/.* loss \([^ ]*\) acc \([^%]*\)%.*/\2/' <<<"$got")
  verdict=$("$compare" "$dir/cpu.ckpt" "$dir/emu.ckpt" 1e-3 2>&1)
  local params_ok=$?
  rm -rf "$dir"
  if [ $params_ok -eq 0 ] && awk -v a="$lw" -v b="$gw" -v c="$la" -v d="$ga" \
       'BEGIN { dl = a - b; da = c - d; exit !(dl < 0.01 && -dl < 0.01 && da < 1 && -da < 1) }'; then
    echo "ok   $label (${secs} s ${second_where:-in the emulator}): at step $z09_stop train_loss $gw vs $lw ${first_where:-on the CPU}, train_acc $ga% vs $la%; parameters $verdict"
  else
    echo "FAIL $label: the two paths disagree beyond rounding at step $z09_stop:"
    echo "     first:  $want"; echo "     second: $got"; echo "     parameters: $verdict (tolerance 1e-3)"; return 1
  fi
}
l09=
if [ -x "$cpu/solutions/09-zero/train" ] && [ -x "$emu/solutions/09-zero/train" ] && [ -x "$compare" ]; then
  out09=$(mktemp)
  # One rank (no mpirun: the collectives on a world of 1) beside lesson 08 and 06, which leave a core idle
  # for most of lesson 08's run; 2 ranks after them, when both cores are free.
  check_stopped "lesson 09 on 1 rank, --zero 3 --recompute, an emulated GPU" \
    "$cpu/solutions/09-zero/train" --device cpu "${z09[@]}" -- \
    "$emu/solutions/09-zero/train" --device cuda-emu "${z09[@]}" >"$out09" 2>&1 &
  l09=$!
fi
# Lesson 06 (inference): a checkpoint of lesson 04's CPU program, evaluated on the emulated GPU and on the CPU.
# Eval-mode logits on the two paths differ by rounding (~1e-6 relative: one forward, no training steps to
# amplify it), so a prediction can only change where an image's top two logits are that close: the correct
# counts must agree within 2 images of 1000, and the CPU path must reproduce the training run exactly.
if [ -x "$cpu/solutions/04-checkpoint/train" ] && [ -x "$cpu/solutions/06-inference/train" ] && \
   [ -x "$emu/solutions/06-inference/train" ]; then
  ck=$(mktemp -d)
  inf=(--dataset synthetic --model tiny-bn --width 8 --checkpoint "$ck/l06.ckpt")
  if "$cpu/solutions/04-checkpoint/train" "${inf[@]:0:6}" --epochs 1 --lr 0.03 --batch-size 64 --checkpoint "$ck/l06.ckpt" \
       >/dev/null 2>&1; then
    want=$("$cpu/solutions/06-inference/train" "${inf[@]}" --device cpu 2>&1 | grep '^final:')
    start=$(date +%s)
    got=$("$emu/solutions/06-inference/train" "${inf[@]}" --device cuda-emu 2>&1 | grep '^final:')
    secs=$(( $(date +%s) - start ))
    a=$(field correct "$want"); b=$(field correct "$got")
    if [ -n "$a" ] && [ -n "$b" ] && [ "$(field reproduced "$want")" = yes ] && [ $((a - b)) -le 2 ] && [ $((b - a)) -le 2 ]; then
      echo "ok   lesson 06 inference on an emulated GPU (${secs} s): $b correct vs $a on the CPU (the training run: $(field reference "$want"))"
    else
      echo "FAIL lesson 06: the emulated GPU and the CPU disagree:"; echo "     cpu:      $want"; echo "     cuda-emu: $got"; status=1
    fi
  else
    echo "FAIL lesson 06: lesson 04's program could not write the checkpoint"; status=1
  fi
  rm -rf "$ck"
fi
if [ -n "$l08" ]; then
  wait "$l08" || status=1
  cat "$out08"; rm -f "$out08"
fi
if [ -n "$l09" ]; then
  wait "$l09" || status=1
  cat "$out09"; rm -f "$out09"
  check_stopped "lesson 09 on 2 ranks, --zero 3 --recompute, MPI backend, emulated GPUs" \
    scripts/launch.sh 2 "$cpu/solutions/09-zero/train" --device cpu "${z09[@]}" -- \
    scripts/launch.sh 2 "$emu/solutions/09-zero/train" --device cuda-emu "${z09[@]}" || status=1
fi
# Lesson 10 on 2 ranks: fp16 through the kit's rounding kernel at every layer (the model's round hook), the loss
# scaler's inf count on the device, 2 micro-batches accumulated, and the bf16 ring staged through the host; the
# same 15 steps and tolerances as lesson 09's (16-bit rounding can turn a last-bit difference of the two paths'
# sums into one 16-bit step of a value, 2^-11 of it: within the 1e-3 of the largest parameter), --save-params
# writing the fp32 master weights.
if [ -x "$cpu/solutions/10-precision/train" ] && [ -x "$emu/solutions/10-precision/train" ] && [ -x "$compare" ]; then
  z10=(--model tiny --width 8 --epochs 1 --warmup-epochs 0 --lr 0.2 --precision fp16 --allreduce bf16 --accumulate 2
       --stop-at $z09_stop)
  save_opt=--save-params check_stopped "lesson 10 on 2 ranks, fp16 + bf16 all-reduce + 2 micro-batches, emulated GPUs" \
    scripts/launch.sh 2 "$cpu/solutions/10-precision/train" --device cpu "${z10[@]}" -- \
    scripts/launch.sh 2 "$emu/solutions/10-precision/train" --device cuda-emu "${z10[@]}" || status=1
  # The CPU's real bf16 GEMMs (kit/cpu_bf16.h) in the program, on 1 rank: lesson 10 --precision bf16 with
  # KIT_CPU_BF16=fp32 (oneDNN's matmul on the same bf16 values in float32 containers: the path's every line but the
  # kernel's input type, on any CPU) against the emulation (round_lowp, then OpenBLAS), the same 15 steps and
  # tolerances (the two sum each GEMM in another order). First, the path line must name the stand-in.
  b10=(--model tiny --width 8 --epochs 1 --warmup-epochs 0 --lr 0.2 --precision bf16)
  if KIT_CPU_BF16=fp32 "$cpu/solutions/10-precision/train" --device cpu "${b10[@]}" --stop-at 1 2>&1 |
       grep -q '^precision path: float32 containers (KIT_CPU_BF16=fp32.*oneDNN bf16 GEMMs'; then
    save_opt=--save-params first_where="emulated" second_where="through oneDNN" \
      check_stopped "lesson 10 on 1 rank, bf16, the CPU's oneDNN bf16 GEMMs (KIT_CPU_BF16=fp32) against the emulation" \
      "$cpu/solutions/10-precision/train" --device cpu "${b10[@]}" --stop-at $z09_stop -- \
      env KIT_CPU_BF16=fp32 "$cpu/solutions/10-precision/train" --device cpu "${b10[@]}" --stop-at $z09_stop || status=1
  elif KIT_CPU_BF16=fp32 "$cpu/solutions/10-precision/train" --device cpu "${b10[@]}" --stop-at 1 2>&1 |
         grep -q '^precision path: emulated.*no oneDNN'; then
    echo "skip lesson 10's CPU bf16 GEMMs: this build has no oneDNN (make deps installs libdnnl-dev)"
  else
    echo "FAIL lesson 10 with KIT_CPU_BF16=fp32: its path line does not name the CPU's oneDNN bf16 GEMMs:"
    KIT_CPU_BF16=fp32 "$cpu/solutions/10-precision/train" --device cpu "${b10[@]}" --stop-at 1 2>&1 | grep '^precision path'
    status=1
  fi
  # The conv engine on the program's first lines (cuDNN, emulated here), and a bad KIT_CUDNN refused with the reason.
  head10=$("$emu/solutions/10-precision/train" --device cuda-emu "${b10[@]}" --stop-at 1 2>&1)
  bad10=$(KIT_CUDNN=yes "$emu/solutions/10-precision/train" --device cuda-emu "${b10[@]}" --stop-at 1 2>&1)
  bad10_rc=$?
  if grep -q "^conv engine: cuDNN's convolutions as the emulator computes them" <<<"$head10" && [ $bad10_rc -ne 0 ] &&
     grep -q 'KIT_CUDNN is 0 .* or 1 ' <<<"$bad10"; then
    echo "ok   lesson 10 on an emulated GPU says its conv engine (cuDNN); KIT_CUDNN=yes is refused (exit $bad10_rc)"
  else
    echo "FAIL lesson 10's conv engine line, or the refusal of KIT_CUDNN=yes (exit $bad10_rc):"
    grep '^conv engine' <<<"$head10"; tail -n 3 <<<"$bad10"
    status=1
  fi
  # What 16-bit storage buys on a GPU: the final line's peak_mib (kit/mem.h's count from the first step on) with bf16
  # against fp32, ResNet-9 at width 8, batch 64, one step. Its activations and their gradients are ~95 % of fp32's
  # peak here (the parameters, gradients and momentum of its 26 k weights are under 0.5 MiB; conv's work is one
  # cuDNN workspace), so bf16's 2-byte arena puts its peak near 0.55 of fp32's, and the bound is 2/3. A peak that
  # counts the float32 arena the model is first built with (before 2026-11-29), or a path that stores float32,
  # is ~1.0.
  m10=(--model resnet9 --width 8 --batch-size 64 --stop-at 1)
  p32=$(field peak_mib "$("$emu/solutions/10-precision/train" --device cuda-emu "${m10[@]}" --precision fp32 2>&1 | grep '^final:')")
  p16=$(field peak_mib "$("$emu/solutions/10-precision/train" --device cuda-emu "${m10[@]}" --precision bf16 2>&1 | grep '^final:')")
  if [ -n "$p32" ] && [ -n "$p16" ] && awk -v a="$p16" -v b="$p32" 'BEGIN { exit !(a < b * 2 / 3) }'; then
    echo "ok   lesson 10's peak memory on an emulated GPU: bf16 $p16 MiB against fp32 $p32 MiB (under 2/3)"
  else
    echo "FAIL lesson 10's peak memory on an emulated GPU: bf16 '${p16}' MiB against fp32 '${p32}' MiB (want under 2/3)"
    status=1
  fi
fi
# Lesson 11 on 2 ranks, --tp 2: every residual block split over the two emulated GPUs, its partial outputs and input
# gradients all-reduced in the tensor group (the MPI backend staging device buffers through the host). ResNet-9 at
# width 8 (the blocks need channels the ranks divide), 9 steps at a learning rate of 0.2 from the first step, so
# that the weights move: the mean train loss of those steps is about 2.1 where the first step's is 2.73, and a wrong
# gradient or a missed all-reduce moves it far beyond the 0.01 above. test_acc is 0 on both sides: a run cut by --stop-at
# before its epoch ends evaluates nothing.
if [ -x "$cpu/solutions/11-tensor/train" ] && [ -x "$emu/solutions/11-tensor/train" ]; then
  t11=(--dataset synthetic --width 8 --batch-size 64 --epochs 1 --warmup-epochs 0 --lr 0.2 --tp 2 --stop-at 9)
  check "lesson 11 on 2 ranks, --tp 2, MPI backend, emulated GPUs" \
    scripts/launch.sh 2 "$cpu/solutions/11-tensor/train" --device cpu "${t11[@]}" -- \
    scripts/launch.sh 2 "$emu/solutions/11-tensor/train" --device cuda-emu "${t11[@]}" || status=1
fi
exit $status
