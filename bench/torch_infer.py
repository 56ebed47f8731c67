#!/usr/bin/env python3
"""bench/torch_infer.py: PyTorch eager inference on the weights of a kit checkpoint (read by tools/ckpt_read.py).

    python3 bench/torch_infer.py CKPT [--threads N] [--runs 200] [--warmup 20] [--batch 256] [--seconds 2]

Prints one line like the kit's lesson 06 program (`bench: ... p50_ms=... p99_ms=... images_per_s=...`):
batch-1 latency (p50, p99 of `runs` forwards after `warmup`, from a host tensor to the arg-max class) and
batch-256 throughput (back-to-back batches for at least `seconds`), in eval mode under torch.inference_mode().
The network is kit/model.c's table rebuilt in PyTorch (bench/torch_cpu.py's resnet9 and fmnist, and tiny-bn here);
the tensors go in by layer order (tools/ckpt_torch.py), as tests/test_ckpt_torch.py checks. Only this bench needs PyTorch; the kit never does.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from ckpt_read import read_checkpoint  # noqa: E402
from ckpt_torch import load_into  # noqa: E402
from torch_cpu import conv_block, fmnist, resnet9  # noqa: E402


def tiny_bn(w=16, classes=10, in_c=3):
    """kit/model.c build_tiny_common with BN: two conv-BN-ReLU-pool blocks (w/2, w channels), global average pool."""
    return nn.Sequential(*conv_block(in_c, w // 2), nn.MaxPool2d(2), *conv_block(w // 2, w), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w, classes))


def build(ck):
    h = ck["header"]
    name, w, classes = h["model"], h["width"], h["classes"]
    if name == "resnet9":
        model = resnet9(w=w, classes=classes)
    elif name == "fmnist":
        model = fmnist(w=w, classes=classes)
    elif name == "tiny-bn":
        model = tiny_bn(w=w, classes=classes, in_c=h["in_c"])
    else:
        sys.exit(f"torch_infer: no PyTorch twin of the kit's {name} here")
    try:
        load_into(model, ck)
    except ValueError as e:
        sys.exit(f"torch_infer: {name}: {e}")
    return model.eval(), (h["in_c"], h["in_h"], h["in_w"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ck = read_checkpoint(a.ckpt)
    model, shape = build(ck)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((a.batch,) + shape, dtype=np.float32))
    times = []
    with torch.inference_mode():
        for i in range(a.warmup + a.runs):
            start = time.perf_counter()
            model(x[i % a.batch:i % a.batch + 1]).argmax(1).tolist()
            if i >= a.warmup:
                times.append(time.perf_counter() - start)
        times.sort()
        model(x).argmax(1)  # warm-up of the large batch
        batches, start = 0, time.perf_counter()
        while batches < 3 or time.perf_counter() - start < a.seconds:
            model(x).argmax(1).tolist()
            batches += 1
        elapsed = time.perf_counter() - start
    p50, p99 = times[len(times) // 2], times[(len(times) * 99) // 100]
    print(f"bench: device=cpu model={ck['header']['model']} p50_ms={1e3 * p50:.4f} p99_ms={1e3 * p99:.4f} "
          f"batch={a.batch} images_per_s={batches * a.batch / elapsed:.1f} torch={torch.__version__} threads={a.threads}")


if __name__ == "__main__":
    main()
