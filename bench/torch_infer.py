#!/usr/bin/env python3
"""bench/torch_infer.py: PyTorch eager inference on the weights of a kit checkpoint (read by tools/ckpt_read.py).

    python3 bench/torch_infer.py CKPT [--threads N] [--runs 200] [--warmup 20] [--batch 256] [--seconds 2]

Prints one line like the kit's lesson 06 program (`bench: ... p50_ms=... p99_ms=... images_per_s=...`):
batch-1 latency (p50, p99 of `runs` forwards after `warmup`, from a host tensor to the arg-max class) and
batch-256 throughput (back-to-back batches for at least `seconds`), in eval mode under torch.inference_mode().
The network is kit/model.c's table rebuilt in PyTorch (tools/torch_models.py);
the tensors go in by layer order (tools/ckpt_torch.py), as tests/test_ckpt_torch.py checks. Only this bench needs PyTorch; the kit never does.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ckpt_read import read_checkpoint  # noqa: E402
from ckpt_torch import load_into  # noqa: E402
from torch_models import ARCHS, build as build_twin  # noqa: E402


def build(ck):
    h = ck["header"]
    name, w, classes = h["model"], h["width"], h["classes"]
    if name not in ARCHS:
        sys.exit(f"torch_infer: no PyTorch twin of the kit's {name} (tools/torch_models.py)")
    model = build_twin(name, w=w, classes=classes, in_c=h["in_c"], size=h["in_h"])
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
          f"min_ms={1e3 * times[0]:.4f} "
          f"batch={a.batch} images_per_s={batches * a.batch / elapsed:.1f} torch={torch.__version__} threads={a.threads}")


if __name__ == "__main__":
    main()
