#!/usr/bin/env python3
"""bench/conv_roofline.py: how fast can the kit's GPU convolutions (im2col + cuBLAS, kit/cuda/conv.cu) make a
ResNet-9 training step at best, by arithmetic alone: the bytes its kernels must move through HBM and the GEMMs'
floating-point work, each at the GPU's ceiling, against PyTorch's measured step (bench/results-gpu.md).

    python3 bench/conv_roofline.py [--batch 512] [--bandwidth-tb 4.8 3.5] [--out FILE]

Nothing here runs on a GPU: it is the lower bound a profile is read against, and it says which goal of issue 34 the
im2col path can reach at all.

What is counted, per conv layer and image (3x3, pad 1, stride 1; the layer shapes of tools/torch_models.py's
resnet9, width 64, 32x32 inputs), in bytes of the storage each path uses (float32: 4 everywhere; bf16 with 16-bit
activation storage, model_store_activations: 2 for the columns, the activations and their gradients, 4 for the
GEMMs' float32 results):
  forward   im2col writes the columns (C*9 x P*Q) and the GEMM reads them; the GEMM writes its float32 result,
            which conv_output_kernel reads and writes out as the layer's output; the input is read once
  backward  the output gradient gathered into the GEMM's layout (read, write); im2col again (write, read by the dW
            GEMM); the dx GEMM writes float32 dcols (as many as the columns) and col2im reads them and
            reads-and-writes dx (the first layer computes no dx)
Not counted: batch norm, ReLU, pooling and the residual adds (a few passes over the activations, far smaller), the
weights (reused across the batch), and caches (every tensor here is far larger than L2). Both ceilings at once
assume memory and arithmetic overlap perfectly; the kit's kernels run one after another, so the sum of the two
times is the fairer bound.
"""
import argparse
import datetime
import shlex
import sys

import cpu_share  # bench/cpu_share.py: the machine's name

# (in channels, input size, out channels, computes dx): ResNet-9's convolutions (results-gpu.md's table).
RESNET9 = [(3, 32, 64, False), (64, 32, 128, True), (128, 16, 128, True), (128, 16, 128, True),
           (128, 16, 256, True), (256, 8, 512, True), (512, 4, 512, True), (512, 4, 512, True)]

# Ceilings: the measured ones from bench/results-gpu.md (cuBLAS on 8192^3, H200, 2026-11-26); bf16 dense tensor
# cores from NVIDIA's H200 datasheet (989 TFLOP/s without sparsity), HBM3e 4.8 TB/s from the same.
GEMM_TFLOPS = {"fp32": 51.3, "tf32": 419.5, "bf16": 989.0}
# cuBLAS on each layer's forward GEMM shape at 128 images (torch.matmul, H200, bench/results-lowp-h200.md), TFLOP/s,
# in RESNET9's order: what these shapes really get (the first layer, K = 27, is far below any ceiling).
MEASURED_TFLOPS = {"fp32": [18, 48, 47, 47, 47, 47, 45, 45], "tf32": [20, 190, 190, 190, 264, 304, 201, 201],
                   "bf16": [24, 363, 360, 360, 582, 654, 422, 422]}
# PyTorch's measured steps (bench/results-gpu.md, batch 512): the goal each kit path is set against.
TORCH_IMAGES_PER_S = {"fp32": (16736, "PyTorch eager float32, TF32 off"),
                      "tf32": (39316, "PyTorch's default, TF32 convolutions"),
                      "bf16": (88921, "PyTorch channels_last + bf16 autocast")}


def step_bytes_and_flops(batch, gemm_bytes, act_bytes, rates):
    """(bytes of the columns' traffic, bytes of everything else counted, GEMM floating-point operations, seconds of
    GEMMs at the per-layer rates) per step."""
    cols_b = rest_b = flops = seconds = 0
    for (c, hw, k, has_dx), rate in zip(RESNET9, rates):
        pq, crr = hw * hw, c * 9
        cols, out, inp = crr * pq, k * pq, c * hw * hw
        gemms = 3 if has_dx else 2  # forward, dW, and dx
        flops += 2 * crr * k * pq * gemms
        seconds += 2 * crr * k * pq * gemms * batch / (rate * 1e12)
        # forward: im2col write + GEMM read; the float32 GEMM result written, read, and the output written
        cols_b += cols * gemm_bytes * 2
        rest_b += out * (4 + 4 + act_bytes) + inp * act_bytes
        # backward: dy gathered (read, written in the GEMM's type), read by the dW GEMM (and the dx GEMM);
        # im2col again (written, read); dcols (float32) written and read; dx read and written; x read
        rest_b += out * (act_bytes + gemm_bytes) + out * gemm_bytes * (2 if has_dx else 1) + inp * act_bytes
        cols_b += cols * gemm_bytes * 2
        if has_dx:
            cols_b += cols * 4 * 2
            rest_b += inp * act_bytes * 2
    return cols_b * batch, rest_b * batch, flops * batch, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--bandwidth-tb", type=float, nargs="+", default=[4.8, 3.5],
                    help="HBM bandwidths to read the bytes at, TB/s (the datasheet's, and a kernel's usual share)")
    ap.add_argument("--out", help="write the table there too (markdown)")
    a = ap.parse_args()
    L = [f"| path | columns GB | other GB | GEMM TFLOP | GEMM ms at the ceiling | GEMM ms at the shapes' measured rates | "
         + " | ".join(f"bytes ms at {bw:g} TB/s" for bw in a.bandwidth_tb)
         + " | best step ms | likely step ms | PyTorch step ms | kit / PyTorch: best (likely) |",
         "|---|---:|---:|---:|---:|---:|" + "---:|" * len(a.bandwidth_tb) + "---:|---:|---:|---:|"]
    # The last row: bf16 with no columns in memory (an implicit-GEMM convolution builds each tile of the columns in
    # shared memory from the input, as cuDNN and CUTLASS do): what the columns' round trips cost, by difference.
    paths = [("fp32", 4, 4, True), ("tf32", 4, 4, True), ("bf16", 2, 2, True), ("bf16", 2, 2, False)]
    ratios = []  # (best, likely) per path
    for name, g, act, with_cols in paths:
        cols_b, rest_b, flops, measured_s = step_bytes_and_flops(a.batch, g, act, MEASURED_TFLOPS[name])
        cols_b = cols_b if with_cols else 0
        gemm_ms = flops / (GEMM_TFLOPS[name] * 1e12) * 1e3
        bytes_ms = [(cols_b + rest_b) / (bw * 1e12) * 1e3 for bw in a.bandwidth_tb]
        best, likely = gemm_ms + bytes_ms[0], measured_s * 1e3 + bytes_ms[-1]
        torch_ips, torch_what = TORCH_IMAGES_PER_S[name]
        torch_ms = a.batch / torch_ips * 1e3
        label = name if with_cols else f"{name}, implicit GEMM (no columns in memory)"
        ratios.append((torch_ms / best, torch_ms / likely))
        L.append(f"| {label} | {cols_b / 1e9:.1f} | {rest_b / 1e9:.1f} | {flops / 1e12:.3f} | {gemm_ms:.2f} | "
                 f"{measured_s * 1e3:.2f} | " + " | ".join(f"{m:.2f}" for m in bytes_ms)
                 + f" | {best:.2f} | {likely:.2f} | {torch_ms:.2f} ({torch_what}) | **{torch_ms / best:.2f}x** "
                 f"({torch_ms / likely:.2f}x) |")
    L += ["", f"Batch {a.batch}, ResNet-9 width 64; GEMM ceilings {', '.join(f'{k} {v:g}' for k, v in GEMM_TFLOPS.items())} "
          "TFLOP/s. `best step`: the GEMMs at the ceiling plus the bytes at the first bandwidth (the kernels run one "
          f"after another); `likely step`: the GEMMs at their shapes' measured rates plus the bytes at "
          f"{a.bandwidth_tb[-1]:g} TB/s. BN, ReLU, pooling and the adds are left out of both: a step can only be "
          "slower."]
    model, cores = cpu_share.cpu_model()
    (f_best, f_lik), (t_best, t_lik), (b_best, b_lik), (i_best, i_lik) = ratios
    head = ["# The GPU convolutions' best case, by arithmetic (not measured)", "",
            f"`python3 bench/conv_roofline.py {shlex.join(sys.argv[1:])}` ({datetime.date.today()}; computed on {model}, "
            f"{cores} cores: arithmetic, nothing ran on a GPU). The bytes the kit's im2col + cuBLAS convolutions "
            "(kit/cuda/conv.cu) move per ResNet-9 training step and their GEMMs' work, at an H200's limits, against "
            "PyTorch's measured step on that H200 (bench/results-gpu.md). What is counted and why: the script's "
            "docstring.", ""]
    L += ["", f"**What it says.** With the columns written to memory and read back (six trips of C x 9 x P x Q values "
          "per layer and image: im2col's columns written and read in the forward and again in the backward, the "
          f"float32 dcols written and read), the kit's step at every limit at once is {f_best:.2f}x PyTorch's in fp32, "
          f"{t_best:.2f}x in TF32 and {b_best:.2f}x in bf16; at the rates cuBLAS measured on these shapes, with the "
          f"bytes at {a.bandwidth_tb[-1]:g} TB/s, {f_lik:.2f}x, {t_lik:.2f}x and {b_lik:.2f}x. Without the columns in "
          "memory (an implicit-GEMM convolution builds each tile of them in shared memory from the input, as cuDNN "
          f"and CUTLASS do), bf16 would be {i_best:.2f}x ({i_lik:.2f}x). The bf16 goal of issue 34 (>= 1.0x) needs "
          "that; fp32 and TF32 are within reach of the im2col path only with its GEMMs near their ceilings and its "
          "kernels near bandwidth, which the next GPU profile measures (bench/GPU.md)."]
    text = "\n".join(head + L) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
