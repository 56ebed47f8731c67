#!/usr/bin/env python3
"""bench/torch_cpu.py: PyTorch on the CPU running the kit's own architectures, for bench/results-cpu.md.

The networks (tools/torch_models.py) replicate kit/model.c's layer tables exactly: same layers, widths,
kernel sizes, padding, bias only where no BN follows, no bias in BN-preceded convs; same batch, same
thread count, same step (forward, mean cross-entropy, backward, SGD momentum 0.9 + Nesterov +
weight decay 5e-4). PyTorch is used for measurement only; the kit never depends on it.

    python3 bench/torch_cpu.py --kit-bin build/bench/bench_cpu --out bench/results-cpu.md
                               [--pairs resnet9=6,fmnist=20] [--batch B] [--threads T]

It runs the kit's benchmark binary (bench_cpu --serve MODEL, one training step per request) and PyTorch
in ONE run, alternating single steps (kit, PyTorch, kit, ...), so a burst of other work on the machine
lands on both sides; the ratio reported is the median of the per-pair ratios. Then it adds the kit's
conv-layer GFLOP/s against OpenBLAS's sgemm ceiling and writes the table with the machine's description.

Memory: peak resident memory (VmHWM) of a training run, each side in a fresh process of its own per
model (`bench_cpu --what memory`, and this script with --rss MODEL), after 1 warm-up and 2 training steps.
PyTorch's figure includes the interpreter and `import torch` (reported apart); the kit's the libraries it
links (OpenBLAS, and cuBLAS when built with CUDA), with its own buffers broken down by class.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import cpu_share  # bench/cpu_share.py: the share of the machine other work took during each part

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from torch_models import build  # noqa: E402  tools/torch_models.py: the kit's architectures in PyTorch


# The input of each model in this bench: (C, H, W).
MODELS = {"resnet9": (3, 32, 32), "fmnist": (1, 28, 28)}


def torch_step_fn(name, batch):
    """The PyTorch training step for `name` at `batch`, ready to call (one step = what the kit does)."""
    shape = MODELS[name]
    torch.manual_seed(0)
    model = build(name, in_c=shape[0], size=shape[1])
    # weight decay on conv/linear weights only, as the kit (model.h: TensorView.decay)
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}],
                          lr=0.01, momentum=0.9, nesterov=True)
    x = torch.rand(batch, *shape) * 2 - 1
    y = torch.arange(batch) % 10
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


def bench_train(name, batch, steps, warmup):
    """PyTorch alone: images/s over `steps` steps after `warmup`."""
    step = torch_step_fn(name, batch)
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = (time.perf_counter() - t0) / steps
    return {"kind": "train", "impl": "torch", "model": name, "batch": batch, "threads": torch.get_num_threads(),
            "images_per_s": batch / dt, "ms_per_step": dt * 1e3}


def peak_rss():
    """This process's peak resident memory in bytes: VmHWM, the high-water mark of its address space (not
    ru_maxrss, which Linux carries over from the parent across fork + exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def rss_child(name, batch):
    """--rss MODEL: this process's peak RSS (bytes) after `import torch` and after training, as one JSON line."""
    import_rss = peak_rss()
    step = torch_step_fn(name, batch)
    for _ in range(3):  # the warm-up step and 2 more, as bench_cpu --what memory
        step()
    peak = peak_rss()
    print(json.dumps({"kind": "memory", "impl": "torch", "model": name, "batch": batch, "peak_rss": peak,
                      "import_rss": import_rss}))


def bench_memory(kit_bin, name, batch, threads):
    """Peak RSS of training, the kit and PyTorch each in a fresh process (peak RSS is per process)."""
    kit = next(r for r in run_kit(kit_bin, ["--batch", str(batch), "--models", name, "--what", "memory"])
               if r["kind"] == "memory")
    out = subprocess.run([sys.executable, __file__, "--rss", name, "--batch", str(batch), "--threads", str(threads),
                          "--kit-bin", kit_bin, "--out", os.devnull], stdout=subprocess.PIPE, check=True, text=True)
    torch_row = json.loads(out.stdout.strip().splitlines()[-1])
    return {"model": name, "kit": kit, "torch": torch_row, "ratio": kit["peak_rss"] / torch_row["peak_rss"]}


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def bench_paired(kit_bin, name, batch, pairs):
    """Alternates single training steps: one of the kit (bench_cpu --serve), one of PyTorch, `pairs` times,
    after one warm-up step each. Each pair runs back to back, so both see (nearly) the same load."""
    kit = subprocess.Popen([kit_bin, "--serve", name, "--batch", str(batch), "--warmup", "1"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        ready = kit.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise RuntimeError(f"{kit_bin} --serve {name} did not start")
        step = torch_step_fn(name, batch)
        step()  # warm-up
        k_times, t_times = [], []
        for _ in range(pairs):
            kit.stdin.write("step\n")
            kit.stdin.flush()
            k_times.append(float(kit.stdout.readline()))
            t0 = time.perf_counter()
            step()
            t_times.append(time.perf_counter() - t0)
        kit.stdin.write("quit\n")
        kit.stdin.flush()
    finally:
        kit.stdin.close()
        if kit.wait(timeout=60) != 0:
            raise RuntimeError(f"{kit_bin} --serve {name} failed")
    ratios = [t / k for k, t in zip(k_times, t_times)]  # kit speed / PyTorch speed, per pair
    return {"model": name, "batch": batch, "threads": int(ready[1]), "pairs": pairs,
            "kit_ips": batch / median(k_times), "torch_ips": batch / median(t_times),
            "kit_best": batch / min(k_times), "torch_best": batch / min(t_times),
            "ratio": median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}




def run_kit(binary, args):
    """Runs bench_cpu and returns its JSON lines (its human-readable lines go to our stderr)."""
    out = subprocess.run([binary] + args, stdout=subprocess.PIPE, check=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def memory_lines(mems):
    MB = 1.0 / (1 << 20)
    L = ["", "## Peak memory of training", "",
         "Peak resident memory (`VmHWM` in /proc/self/status) after a warm-up and 2 training steps, each side in a fresh process. "
         "PyTorch's includes the interpreter and `import torch` (the part before the model is built, in brackets); "
         "the kit's includes the libraries it links (OpenBLAS; cuBLAS too in a CUDA build, loaded even for a CPU run).",
         "",
         "| model | kit peak RSS | PyTorch peak RSS (of which import) | kit / PyTorch |",
         "|-------|-------------:|-----------------------------------:|--------------:|"]
    for m in mems:
        L.append(f"| {m['model']} | {m['kit']['peak_rss'] * MB:.0f} MiB | {m['torch']['peak_rss'] * MB:.0f} MiB "
                 f"({m['torch']['import_rss'] * MB:.0f} MiB) | **{m['ratio']:.2f}x** |")
    L += ["", "The kit's peak by buffer class (kit/model.c allocates them once; `the rest` is code, libraries, "
          "OpenBLAS and OpenMP buffers and thread stacks, found by difference):", "",
          "| model | params | grads | momentum | activations saved for backward | their gradients | workspace | batch | the rest |",
          "|-------|-------:|------:|---------:|-------------------------------:|----------------:|----------:|------:|---------:|"]
    keys = ["params", "grads", "momentum", "activations", "act_grads", "workspace", "batch_bytes"]
    for m in mems:
        k = m["kit"]
        rest = k["peak_rss"] - sum(k[x] for x in keys)
        L.append(f"| {m['model']} | " + " | ".join(f"{k[x] * MB:.1f} MiB" for x in keys) + f" | {rest * MB:.1f} MiB |")
    return L


def write_report(path, rows, convs, layers, ceiling, threads, shares, mems):
    cpu, cores = cpu_share.cpu_model()
    L = ["# CPU training throughput: the kit against PyTorch", ""]
    L += cpu_share.report_lines(shares, "make bench-cpu") + [""]
    if cpu_share.loaded(shares):
        L += ["(The per-pair ratio is the least affected by other work; the peak-memory figures do not depend on it.)", ""]
    L += [
        f"Written by `make bench-cpu` ({datetime.date.today().isoformat()}). Machine: **{cpu}**, {cores} cores "
        f"(`lscpu`); {threads} threads on both sides (the kit: OpenMP, OpenBLAS single-threaded inside; "
        f"PyTorch {torch.__version__}: `torch.set_num_threads({threads})`, oneDNN convolutions).",
        "Other work on the machine would slow both sides; the steps alternate (kit, PyTorch, kit, ...) so that it lands on both, and the ratio is "
        "the median of the per-pair ratios.",
        "",
        "One step = forward, mean cross-entropy, backward, SGD (momentum 0.9, Nesterov, weight decay 5e-4 on "
        f"weights), batch {rows[0]['batch'] if rows else '?'}, the same architecture on both sides "
        "(bench/torch_cpu.py rebuilds kit/model.c's table).",
        "",
        "| model | step pairs | kit images/s (median, best) | PyTorch images/s (median, best) | kit / PyTorch: median (range) |",
        "|-------|-----------:|----------------------------:|--------------------------------:|------------------------------:|",
    ]
    for r in rows:
        L.append(f"| {r['model']} | {r['pairs']} | {r['kit_ips']:.1f}, {r['kit_best']:.1f} | "
                 f"{r['torch_ips']:.1f}, {r['torch_best']:.1f} | **{r['ratio']:.2f}x** "
                 f"({r['ratio_min']:.2f} - {r['ratio_max']:.2f}) |")
    L += ["", "## The convolutions against the GEMM ceiling", ""]
    if ceiling:
        # On a busy machine the all-threads run can come out below the 1-thread one: take the better.
        top = max(ceiling["gflops"], ceiling["gflops_1"])
        top_best = max(ceiling.get("gflops_best", top), ceiling.get("gflops_1_best", top))
        L.append(f"OpenBLAS sgemm, {ceiling['n']}x{ceiling['n']}x{ceiling['n']}, the median of "
                 f"{ceiling.get('runs', 3)} runs: {ceiling['gflops_1']:.1f} GFLOP/s on "
                 f"1 thread, {ceiling['gflops']:.1f} GFLOP/s on {ceiling['threads']} threads; the ceiling below is "
                 f"the better of the two, **{top:.1f} GFLOP/s** (the best single run: {top_best:.1f}). Each conv layer "
                 "is timed the same way, as the median of its rounds (forward + backward; at least 0.5 s of them), "
                 "so both sides of the ratio are the same statistic; the last column compares best with best. "
                 "The conv layers' FLOPs are their GEMMs' "
                 "(2 per multiply-add; forward, weight gradient, input gradient except for the first layer), "
                 "measured by running each of the model's conv layers alone at the same batch. The 3x3 layers "
                 "that run Winograd F(2x2,3x3) (kit/winograd.c) do fewer multiplies than that count: for them "
                 "it is an effective rate, which can exceed the ceiling (KIT_WINOGRAD=0 measures im2col alone).")
        L += ["", "| model | conv layers fwd+bwd (ms per step) | their GFLOP/s | of the ceiling | best of the best |",
              "|-------|---------------------------------:|--------------:|---------------:|-----------------:|"]
        for c in convs:
            L.append(f"| {c['model']} | {c['ms']:.1f} | {c['gflops']:.1f} | {100 * c['gflops'] / top:.0f}% | "
                     f"{100 * c.get('gflops_best', c['gflops']) / top_best:.0f}% |")
        if layers:
            L += ["", "Layer by layer (the same runs): a layer with few input channels has a GEMM with a short inner "
                  "dimension (C x 3 x 3: 9 for one channel): 9 multiply-adds per output it writes, where a 64-channel "
                  "layer does 576, so it runs at the speed of memory, not of the multipliers, and takes a larger "
                  "share of the time than of the FLOPs. The passes (forward, weight gradient, input gradient) are "
                  "each the median of their own timings, so they need not add up to the round's median exactly.", "",
                  "| model | layer | channels in -> out | map | ms per step | of which fwd / wgrad / dgrad | GFLOP/s | of the ceiling | share of the model's conv FLOPs |",
                  "|-------|------:|-------------------:|----:|------------:|------:|--------:|---------------:|------:|"]
            for c in convs:
                mine = [x for x in layers if x["model"] == c["model"]]
                total = sum(x["gflops"] * x["ms"] for x in mine)
                for x in mine:
                    passes = " / ".join(f"{x[k]:.1f}" for k in ("ms_fwd", "ms_wgrad", "ms_dgrad")) if "ms_fwd" in x else "-"
                    L.append(f"| {x['model']} | {x['layer']} | {x['c']} -> {x['k']} | {x['h']}x{x['w']} | {x['ms']:.1f} | "
                             f"{passes} | {x['gflops']:.1f} | {100 * x['gflops'] / top:.0f}% | "
                             f"{100 * x['gflops'] * x['ms'] / total:.0f}% |")
    L += memory_lines(mems)
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kit-bin", required=True, help="the kit's bench_cpu binary")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="resnet9,fmnist")
    ap.add_argument("--pairs", default="resnet9=6,fmnist=20", help="step pairs per model")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rss", metavar="MODEL", help="(internal) print the peak RSS of training MODEL and exit")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.rss:
        rss_child(a.rss, a.batch)
        return
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # the kit's thread count, the same as PyTorch's
    pairs = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in a.pairs.split(","))
    shares = []
    rows = []
    for model in a.models.split(","):
        share = cpu_share.CpuShare()
        r = bench_paired(a.kit_bin, model, a.batch, pairs.get(model, 6))
        print(f"{model:8s} batch {a.batch}: kit {r['kit_ips']:.1f} images/s, PyTorch {r['torch_ips']:.1f} images/s "
              f"(medians of {r['pairs']} alternating steps); kit / PyTorch = {r['ratio']:.2f}x "
              f"(range {r['ratio_min']:.2f} - {r['ratio_max']:.2f})", file=sys.stderr)
        rows.append(r)
        shares.append(share.stop(f"{model} pairs"))
    share = cpu_share.CpuShare()
    out = run_kit(a.kit_bin, ["--batch", str(a.batch), "--steps", "1", "--models", a.models, "--what", "ceiling,conv"])
    shares.append(share.stop("ceiling and conv layers"))
    ceiling = next((r for r in out if r["kind"] == "ceiling"), None)
    convs = [r for r in out if r["kind"] == "conv"]
    layers = [r for r in out if r["kind"] == "conv_layer"]
    mems = []
    for model in a.models.split(","):
        m = bench_memory(a.kit_bin, model, a.batch, a.threads)
        MB = 1.0 / (1 << 20)
        print(f"{model:8s} batch {a.batch}: peak RSS kit {m['kit']['peak_rss'] * MB:.0f} MiB, PyTorch "
              f"{m['torch']['peak_rss'] * MB:.0f} MiB; kit / PyTorch = {m['ratio']:.2f}x", file=sys.stderr)
        mems.append(m)
    write_report(a.out, rows, convs, layers, ceiling, a.threads, shares, mems)
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
