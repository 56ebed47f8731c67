#!/usr/bin/env python3
"""bench/ab_cpu.py: two builds of the kit's bench_cpu, training step against training step.

    python3 bench/ab_cpu.py OLD_BIN NEW_BIN [--model resnet9] [--pairs 10] [--batch 128]

How each optimisation's gain was measured (bench/README.md): copy build/bench/bench_cpu aside before a
change, rebuild, and run both. Like torch_cpu.py it alternates single steps (old, new, old, ...) of two
`bench_cpu --serve` processes, so a burst of other work on a shared machine lands on both, and reports the
median of the per-pair speed ratios with their range and the load average before and after.
"""
import argparse
import os
import subprocess
import sys


def serve(binary, model, batch):
    p = subprocess.Popen([binary, "--serve", model, "--batch", str(batch), "--warmup", "1"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    ready = p.stdout.readline().split()
    if not ready or ready[0] != "ready":
        raise RuntimeError(f"{binary} --serve {model} did not start")
    return p


def step(p):
    p.stdin.write("step\n")
    p.stdin.flush()
    return float(p.stdout.readline())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--model", default="resnet9")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    old, new = serve(a.old, a.model, a.batch), serve(a.new, a.model, a.batch)
    t_old, t_new = [], []
    for _ in range(a.pairs):
        t_old.append(step(old))
        t_new.append(step(new))
    for p in (old, new):
        p.stdin.write("quit\n")
        p.stdin.close()
        if p.wait(timeout=60) != 0:
            raise RuntimeError("a bench_cpu --serve process failed")
    ratios = sorted(o / n for o, n in zip(t_old, t_new))
    med = ratios[len(ratios) // 2] if len(ratios) % 2 else 0.5 * (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2])
    t_old.sort(), t_new.sort()
    print(f"{a.model} batch {a.batch}, {a.pairs} pairs: old {a.batch / t_old[len(t_old) // 2]:.1f} images/s, "
          f"new {a.batch / t_new[len(t_new) // 2]:.1f} images/s (medians); new / old = {med:.3f}x "
          f"(range {ratios[0]:.3f} - {ratios[-1]:.3f}); load average {load0:.1f} / {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
