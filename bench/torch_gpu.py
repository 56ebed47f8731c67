#!/usr/bin/env python3
"""bench/torch_gpu.py: the kit's ResNet-9 training speed on one GPU beside PyTorch's, in one run.

    python3 bench/torch_gpu.py --kit build/bench/bench_gpu [--batch 512] [--steps 20] [--out bench/results-gpu.md]

Runs the kit's benchmark (bench/bench_gpu.c: JSON on stdout), then the same network in PyTorch:
  - eager float32 (TF32 off for convolutions and matmuls: the same arithmetic as the kit's default),
  - eager float32 with PyTorch's default TF32 convolutions (what most users get),
  - eager channels_last + bf16 autocast (the fast path, for reference),
and writes a Markdown table with the ratios, the GPU's name from nvidia-smi and the command.

The network is kit/model.c's "resnet9" layer by layer (width 64): conv 3x3 (pad 1, no bias) + BN + ReLU
blocks; stages 64, 128 (+ max-pool, + residual of two blocks), 256 (+ max-pool), 512 (+ max-pool,
+ residual); global average pool; linear 512 -> 10 with bias. No ReLU after a residual add. Loss:
cross-entropy; optimiser: SGD, momentum 0.9, Nesterov, weight decay 5e-4 on conv/linear weights only.
Inputs are random tensors already on the GPU, for both (the data pipeline is not measured).

Then the data pipeline (bench_gpu's "pipeline": ResNet-9 and kit/model.c's "fmnist" net, same batch): the
kit trains from its loader with the copy of batch k+1 overlapping batch k's compute (kit/loader.c) and
without; PyTorch eager float32 trains from pinned host batches copied every step, synchronously
(`x.to(dev)`) and prefetched on a side stream with an event (the same design as the kit's). Both read the
step's loss and accuracy back to the host every step, as every lesson's loop does.
"""
import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time


def kit_results(binary, batch, steps, fast=False):
    extra = ["--pipeline-models", "", "--sgemm-n", "4096"] if fast else []
    out = subprocess.run([binary, "--batch", str(batch), "--steps", str(steps)] + extra, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader",
                              "-i", "0"], check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
        return out
    except (OSError, subprocess.CalledProcessError):
        return "unknown (nvidia-smi failed)"


def build_twin(name):
    """tools/torch_models.py's `name` (the kit's architecture) for 3 x 32 x 32 inputs, ReLUs in place."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    from torch_models import build
    return build(name, in_c=3, size=32, inplace=True)


def torch_pipeline(torch, model_name, batch, steps, prefetch):
    """Images/s and ms/step, float32 (TF32 off), from pinned host batches: copied in the step, or prefetched."""
    nn = torch.nn
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1)
    dev = torch.device("cuda", 0)
    model = build_twin(model_name).to(dev)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=0.01, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    host = [(torch.randn(batch, 3, 32, 32).pin_memory(), (torch.arange(batch) % 10).pin_memory())
            for _ in range(4)]
    copy_stream = torch.cuda.Stream(dev)

    def fetch(i):
        hx, hy = host[i % len(host)]
        if not prefetch:
            return hx.to(dev), hy.to(dev), None
        with torch.cuda.stream(copy_stream):
            x, y = hx.to(dev, non_blocking=True), hy.to(dev, non_blocking=True)
        done = torch.cuda.Event()
        done.record(copy_stream)
        return x, y, done

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        (loss / batch).backward()
        opt.step()
        return loss.item(), (out.argmax(1) == y).sum().item()  # the metrics every lesson reads back

    nxt = fetch(0)
    t0 = 0.0
    for i in range(steps + 5):  # 5 warm-up steps
        if i == 5:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y, done = nxt
        if done is not None:
            torch.cuda.current_stream().wait_event(done)   # this batch's copy only
            x.record_stream(torch.cuda.current_stream())   # the caching allocator must not reuse it early
            y.record_stream(torch.cuda.current_stream())
            nxt = fetch(i + 1)                             # batch i+1 copies while batch i computes
        step(x, y)
        if done is None:
            nxt = fetch(i + 1)
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    return steps * batch / t, t / steps * 1e3


def torch_throughput(torch, batch, steps, mode):
    """Images/s of training steps; mode: fp32 | fp32-tf32 | bf16-cl."""
    nn = torch.nn
    torch.backends.cudnn.benchmark = True
    tf32 = mode != "fp32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.manual_seed(1)
    dev = torch.device("cuda", 0)
    model = build_twin("resnet9").to(dev)
    x = torch.randn(batch, 3, 32, 32, device=dev)
    y = torch.arange(batch, device=dev) % 10
    if mode == "bf16-cl":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=0.01, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=(mode == "bf16-cl")):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(5):  # warm-up: cudnn.benchmark picks its algorithms here
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - t0)


def pipeline_markdown(kit, torch_rows):
    """The data-pipeline section: kit with and without the overlap, PyTorch copying and prefetching."""
    lines = [
        "",
        "## The copy to the device, overlapped with compute",
        "",
        "Training from host batches, float32, loss and accuracy read back every step (as in the lessons). The "
        "kit: its loader (background thread: normalise, crop + flip into pinned memory), then "
        "`train_forward_backward` as lessons 03 on run it, with the copy of batch k+1 overlapping batch k "
        "(kit/loader.c) or synchronous in the step (`KIT_OVERLAP=0`). PyTorch: pinned host tensors made "
        "beforehand (no preparation cost, so no wait), copied in the step or prefetched on a side stream with "
        "an event. \"wait\": time the step waited for the loader thread; \"copy alone\": one batch's "
        "host-to-device copy from pinned memory, timed by itself.",
        "",
        "| model | implementation | images/s | ms/step | wait ms/step | copy alone ms | kit overlap / this |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for p in kit.get("pipeline", []):
        best = p["overlap"]["images_per_s"]
        rows = [("kit, copy in the step", p["no_overlap"]["images_per_s"], p["no_overlap"]["step_ms"],
                 f"{p['no_overlap']['wait_ms']:.2f}"),
                ("kit, copy overlapped", best, p["overlap"]["step_ms"], f"{p['overlap']['wait_ms']:.2f}")]
        rows += [(name, ips, ms, "-") for (model, name), (ips, ms) in torch_rows.items() if model == p["model"]]
        for name, ips, ms, wait in rows:
            lines.append(f"| {p['model']} | {name} | {ips:.0f} | {ms:.2f} | {wait} | {p['copy_ms']:.3f} | "
                         f"{best / ips:.2f} |")
    lines += [
        "",
        "What the overlap can win per step is at most the copy alone (it hides the copy, nothing else); the "
        "rest of a step is compute and the per-step read-back of the metrics.",
    ]
    return lines


def write_markdown(path, kit, rows, command, gpu, torch_pipe=None):
    k32 = kit["train_images_per_s_fp32"]
    lines = [
        "# GPU benchmark: the kit against PyTorch",
        "",
        f"- GPU: {gpu}",
        f"- model: {kit['model']} (width 64), batch {kit['batch']}, {kit['steps']} timed steps after warm-up, "
        f"data already on the GPU",
        f"- date: {datetime.date.today().isoformat()}",
        f"- command: `{command}`",
        "",
        "## Training throughput",
        "",
        "| implementation | images/s | kit fp32 / this |",
        "|---|---:|---:|",
        f"| kit, float32 (conv: {kit.get('conv_engine', 'im2col + cuBLAS SGEMM')}) | {k32:.0f} | 1.00 |",
        f"| kit, --tf32 (conv GEMMs on TF32 tensor cores, linear float32) | {kit['train_images_per_s_tf32']:.0f} | "
        f"{k32 / kit['train_images_per_s_tf32']:.2f} |",
    ]
    for key, name in [("bf16", "kit, bf16 GEMMs (cublasGemmEx, tensor cores; activations float32)"),
                      ("bf16_act16", "kit, bf16 GEMMs and bf16 activations (2 bytes: model_store_activations)"),
                      ("fp16", "kit, fp16 GEMMs (the same; the loss scaler not timed)"),
                      ("fp16_act16", "kit, fp16 GEMMs and fp16 activations"),
                      ("fp32_im2col", "kit, float32, conv on im2col + cuBLAS (the kit's own engine)"),
                      ("tf32_im2col", "kit, --tf32, conv on im2col + cuBLAS"),
                      ("bf16_act16_im2col", "kit, bf16 GEMMs and activations, conv on im2col + cuBLAS")]:
        if f"train_images_per_s_{key}" in kit:
            ips = kit[f"train_images_per_s_{key}"]
            lines.append(f"| {name} | {ips:.0f} | {k32 / ips:.2f} |")
    for name, ips in rows:
        lines.append(f"| {name} | {ips:.0f} | {k32 / ips:.2f} |")
    # The kit against PyTorch at the same arithmetic: the ratios the goals are stated in.
    torch_by_mode = {mode: ips for (name, ips), mode in zip(rows, ["fp32", "fp32-tf32", "bf16-cl"])}
    pairs = [("float32 (TF32 off)", "fp32", "fp32"), ("TF32 convolutions", "tf32", "fp32-tf32"),
             ("bf16 GEMMs, float32 activations (PyTorch: autocast + channels_last)", "bf16", "bf16-cl"),
             ("bf16 GEMMs and activations (PyTorch: autocast + channels_last)", "bf16_act16", "bf16-cl")]
    lines += ["", "| arithmetic | kit images/s | PyTorch images/s | kit / PyTorch |", "|---|---:|---:|---:|"]
    for label, kmode, tmode in pairs:
        k = kit.get(f"train_images_per_s_{kmode}")
        t = torch_by_mode.get(tmode)
        if k and t:
            lines.append(f"| {label} | {k:.0f} | {t:.0f} | {k / t:.2f} |")
    flop = kit["train_flop_per_image"]
    lines += [
        "",
        f"A training step costs about {flop / 1e9:.2f} GFLOP per image (3 x the forward's 2 x MACs), so the "
        f"kit's float32 run sustains {k32 * flop / 1e12:.1f} TFLOP/s overall.",
        "",
        "## Conv layers against the GEMM ceiling",
        "",
        f"cuBLAS SGEMM on {kit.get('sgemm_n', 8192)}^3 on this GPU: **{kit['sgemm_tflops_fp32']:.1f} TFLOP/s** in float32, "
        f"**{kit['sgemm_tflops_tf32']:.1f} TFLOP/s** in TF32. Each conv below is the kit's whole op "
        "(im2col + SGEMM + layout kernels), float32; backward computes dx and dw.",
        "",
        "| layer | input (C x H x W) | K | fwd ms | fwd TFLOP/s | % of SGEMM | bwd ms | bwd TFLOP/s | % of SGEMM |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ceil = kit["sgemm_tflops_fp32"]
    for c in kit["conv_layers"]:
        lines.append(f"| {c['layer']} | {c['c']} x {c['h']} x {c['w']} | {c['k']} | {c['fwd_ms']:.2f} | "
                     f"{c['fwd_tflops']:.1f} | {100 * c['fwd_tflops'] / ceil:.0f}% | {c['bwd_ms']:.2f} | "
                     f"{c['bwd_tflops']:.1f} | {100 * c['bwd_tflops'] / ceil:.0f}% |")
    lines += pipeline_markdown(kit, torch_pipe or {})
    lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", required=True, help="path of the bench_gpu binary")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="bench/results-gpu.md")
    ap.add_argument("--fast", action="store_true",
                    help="training rows only (no data-pipeline runs; SGEMM ceiling at 4096^3): gpu-check's fastpath")
    args = ap.parse_args()
    command = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)

    kit = kit_results(args.kit, args.batch, args.steps, args.fast)
    if "skipped" in kit:
        print(f"bench-gpu skipped: {kit['skipped']}")
        return 0
    try:
        import torch
    except ImportError:
        print("bench-gpu: PyTorch is not installed (pip install torch); the kit's numbers alone:")
        print(json.dumps(kit, indent=2))
        return 1
    if not torch.cuda.is_available():
        print("bench-gpu: this PyTorch has no CUDA support (a CPU-only wheel?); install a CUDA build of torch")
        return 1
    rows = []
    for name, mode in [("PyTorch eager, float32 (TF32 off)", "fp32"),
                       ("PyTorch eager, float32 with TF32 convs (PyTorch's default)", "fp32-tf32"),
                       ("PyTorch eager, channels_last + bf16 autocast", "bf16-cl")]:
        ips = torch_throughput(torch, args.batch, args.steps, mode)
        print(f"{name}: {ips:.0f} images/s", file=sys.stderr)
        rows.append((name, ips))
    torch_pipe = {}
    for p in kit.get("pipeline", []):
        for name, prefetch in [("PyTorch eager, copy in the step", False),
                               ("PyTorch eager, prefetch on a side stream", True)]:
            ips, ms = torch_pipeline(torch, p["model"], args.batch, args.steps, prefetch)
            print(f"{p['model']}: {name}: {ips:.0f} images/s", file=sys.stderr)
            torch_pipe[(p["model"], name)] = (ips, ms)
    write_markdown(args.out, kit, rows, command, gpu_name(), torch_pipe)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
