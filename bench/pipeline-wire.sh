#!/usr/bin/env bash
# bench/pipeline-wire.sh: model parallel against data parallel, measured: the bytes each rank hands to the
# process group per training step (kit/dist.h, pg_traffic) in lesson 08's pipeline (activations forward, their
# gradients backward, across each cut) and in lesson 03's DDP (the gradient all-reduce, and the BN buffers'
# broadcast), for the same net and global batch on 2 ranks; and the activations a pipeline stage stores (its
# peak resident memory in a step, VmHWM) against M for GPipe and against the stage's place for 1F1B. Each
# measured number sits beside its arithmetic. Writes bench/results-pipeline-wire.md and
# bench/results-pipeline-memory.md (OUT_WIRE=..., OUT_MEM=...); the raw lines go to bench/results-pipeline-wire.txt.
#
#   bench/pipeline-wire.sh                         MODELS="tiny fmnist resnet9" BATCHES="32 128 512" (the defaults)
#
# Bytes do not depend on the machine or its load, only on the net, the cut and the batch: one run each. The cut
# is by parameter count (--balance params: the same cut on every run). Synthetic set (3 x 32 x 32 images).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
wire=$BUILD/bench/pipeline_wire
ddp=$BUILD/bench/ddp_kit
out_wire=${OUT_WIRE:-bench/results-pipeline-wire.md}
out_mem=${OUT_MEM:-bench/results-pipeline-memory.md}
raw=${out_wire%.md}.txt
models=${MODELS:-tiny fmnist resnet9}
batches=${BATCHES:-32 128 512}
make --no-print-directory "$wire" "$ddp" >/dev/null

{
  echo "# bench/pipeline-wire.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $(nproc) cores"
  for m in $models; do
    for b in $batches; do
      # Pipeline: 2 stages, GPipe with 4 micro-batches (the bytes do not depend on M or the schedule: each image
      # crosses each cut once each way, whatever the micro-batch it rides in).
      KIT_PROGRESS=plain scripts/launch.sh 2 "$wire" --model "$m" --batch-size "$b" --micro-batches 4 \
        --schedule gpipe --steps 2 2>&1 | grep '^wire:' | sort
      # DDP: 2 ranks, lesson 03's loop (bench/ddp_kit.c), 1 warm-up step and 2 counted.
      echo "ddp: batch=$b $(KIT_PROGRESS=plain scripts/launch.sh 2 "$ddp" --model "$m" --batch-size "$b" \
        --warmup 1 --steps 2 2>&1 | grep '^{')"
    done
  done
  # Memory: stored activations per stage. P = 2 against M for both schedules, and P = 4 (1F1B, M = 8; ranks may
  # share cores: memory does not care) for the stage's place in the pipe.
  for s in gpipe 1f1b; do
    for mb in 1 2 4 8 16; do
      KIT_PROGRESS=plain scripts/launch.sh 2 "$wire" --model resnet9 --batch-size 128 --micro-batches "$mb" \
        --schedule "$s" --steps 2 2>&1 | grep '^wire:' | sort
    done
  done
  for s in gpipe 1f1b; do
    KIT_PROGRESS=plain scripts/launch.sh 4 "$wire" --model resnet9 --batch-size 128 --micro-batches 8 \
      --schedule "$s" --steps 2 2>&1 | grep '^wire:' | sort
  done
} >"$raw"

python3 bench/pipeline_wire_report.py "$raw" "$out_wire" "$out_mem"
echo "wrote $out_wire, $out_mem (raw: $raw)"
