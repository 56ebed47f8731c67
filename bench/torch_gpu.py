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
"""
import argparse
import datetime
import json
import shlex
import subprocess
import sys
import time


def kit_results(binary, batch, steps):
    out = subprocess.run([binary, "--batch", str(batch), "--steps", str(steps)], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader",
                              "-i", "0"], check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
        return out
    except (OSError, subprocess.CalledProcessError):
        return "unknown (nvidia-smi failed)"


def build_resnet9(nn, width=64, classes=10):
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True))

    class Residual(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.body = nn.Sequential(block(c, c), block(c, c))

        def forward(self, x):
            return x + self.body(x)

    w = width
    return nn.Sequential(
        block(3, w),                                        # prep
        block(w, 2 * w), nn.MaxPool2d(2), Residual(2 * w),  # stage 1
        block(2 * w, 4 * w), nn.MaxPool2d(2),               # stage 2
        block(4 * w, 8 * w), nn.MaxPool2d(2), Residual(8 * w),  # stage 3
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, classes))


def torch_throughput(torch, batch, steps, mode):
    """Images/s of training steps; mode: fp32 | fp32-tf32 | bf16-cl."""
    nn = torch.nn
    torch.backends.cudnn.benchmark = True
    tf32 = mode != "fp32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.manual_seed(1)
    dev = torch.device("cuda", 0)
    model = build_resnet9(nn).to(dev)
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


def write_markdown(path, kit, rows, command, gpu):
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
        f"| kit, float32 (im2col + cuBLAS SGEMM) | {k32:.0f} | 1.00 |",
        f"| kit, TF32 GEMMs (KIT_TF32=1) | {kit['train_images_per_s_tf32']:.0f} | "
        f"{k32 / kit['train_images_per_s_tf32']:.2f} |",
    ]
    for name, ips in rows:
        lines.append(f"| {name} | {ips:.0f} | {k32 / ips:.2f} |")
    flop = kit["train_flop_per_image"]
    lines += [
        "",
        f"A training step costs about {flop / 1e9:.2f} GFLOP per image (3 x the forward's 2 x MACs), so the "
        f"kit's float32 run sustains {k32 * flop / 1e12:.1f} TFLOP/s overall.",
        "",
        "## Conv layers against the GEMM ceiling",
        "",
        f"cuBLAS SGEMM on 8192^3 on this GPU: **{kit['sgemm_tflops_fp32']:.1f} TFLOP/s** in float32, "
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
    lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", required=True, help="path of the bench_gpu binary")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="bench/results-gpu.md")
    args = ap.parse_args()
    command = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)

    kit = kit_results(args.kit, args.batch, args.steps)
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
    write_markdown(args.out, kit, rows, command, gpu_name())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
