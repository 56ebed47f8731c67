#!/usr/bin/env python3
"""bench/torch_autocast.py: PyTorch's mixed precision on the kit's own networks, the speed and memory lesson 10's
emulation does not give: images/s and peak memory of a training step, float32 against autocast.

    python3 bench/torch_autocast.py --out bench/results-autocast.md [--device cpu|cuda|both] [--rounds 2]
                                    [--models fmnist,resnet9] [--batch fmnist=128,resnet9=32] [--steps ...]
                                    [--threads T] [--quick]

Modes: on the CPU fp32 and bf16 (`torch.autocast("cpu", dtype=torch.bfloat16)`); on a GPU fp32, tf32 (fp32 with
TF32 tensor-core matmuls and convolutions), bf16 autocast, fp16 autocast + `torch.cuda.amp.GradScaler` (the
lesson's dynamic loss scaling). The networks are tools/torch_models.py (the kit's layer tables), the step is
bench/torch_cpu.py's (forward, mean cross-entropy, backward, SGD momentum 0.9 Nesterov, weight decay 5e-4 on
conv/linear weights): the fp32 master weights stay fp32 in every mode, as autocast keeps them.

Every (model, mode) runs in a fresh process of its own (peak memory is per process): warm-up steps, then timed
steps; the rounds run the modes in an order rotated each round, so a burst of other work lands on every mode;
the table gives the median round and the speed ratio to fp32 of the same round. Memory: on the CPU the
process's peak resident memory (VmHWM) less its peak after `import torch` and building the model (both shown),
on a GPU `torch.cuda.max_memory_allocated()` over the timed steps. The other-work share of each run
(bench/cpu_share.py) goes to the report.

A CPU without AVX-512 BF16 / AMX (lscpu's flags avx512_bf16, amx_bf16; the line on top of the report) has no
bf16 arithmetic: PyTorch then converts and computes in fp32 or falls back to slow reference kernels, so bf16
autocast is SLOWER there; the report says which this machine is.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import cpu_share  # bench/cpu_share.py: the share of the machine other work took during each part

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

MODELS = {"resnet9": (3, 32, 32), "fmnist": (1, 28, 28), "tiny": (3, 32, 32), "tiny-bn": (3, 32, 32)}
CPU_MODES = ["fp32", "bf16"]
GPU_MODES = ["fp32", "tf32", "bf16", "fp16"]
# Small enough for 2 cores: bf16 without hardware support runs at a fraction of fp32 speed on the CPU.
CPU_BATCH = {"fmnist": 128, "resnet9": 32}
CPU_STEPS = {"fmnist": 6, "resnet9": 2}
GPU_BATCH = {"fmnist": 512, "resnet9": 512}
GPU_STEPS = {"fmnist": 50, "resnet9": 20}


def peak_rss():
    """Peak resident memory of this process (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def cpu_flags():
    """The bf16-related instruction sets this CPU has, from /proc/cpuinfo's flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    want = ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16"]
    return [f for f in want if f in flags]


def child(a):
    """--child: one (model, mode) on one device; prints one JSON line."""
    import torch
    import torch.nn as nn
    from torch_models import build
    torch.set_num_threads(a.threads)
    dev, mode, name = a.device, a.mode, a.model
    shape = MODELS[name]
    torch.manual_seed(0)
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        torch.backends.cudnn.benchmark = True
    model = build(name, in_c=shape[0], size=shape[1]).to(dev)
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}],
                          lr=0.01, momentum=0.9, nesterov=True)
    x = (torch.rand(a.batch, *shape) * 2 - 1).to(dev)
    y = (torch.arange(a.batch) % 10).to(dev)
    loss_fn = nn.CrossEntropyLoss()
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    scaler = torch.amp.GradScaler(dev) if mode == "fp16" else None  # the CPU has one too (bench/precision_runs.py)
    base_rss = peak_rss()

    def step():
        opt.zero_grad(set_to_none=False)
        if low is None:
            loss = loss_fn(model(x), y)
        else:
            with torch.autocast(dev, dtype=low):
                loss = loss_fn(model(x), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for _ in range(a.warmup):
        step()
    sync()
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    row = {"torch": torch.__version__, "model": name, "mode": mode, "device": dev, "batch": a.batch, "threads": a.threads,
           "images_per_s": a.batch / dt, "ms_per_step": 1e3 * dt, "loss": loss.item()}
    if dev == "cuda":
        row["peak_bytes"] = torch.cuda.max_memory_allocated()
        row["gpu"] = torch.cuda.get_device_name()
    else:
        row["peak_bytes"] = peak_rss() - base_rss
        row["base_rss"] = base_rss
        row["peak_rss"] = peak_rss()
    print(json.dumps(row))


def gemm_shapes(images, max_square, sets):
    """bench/gemm_shapes.h's table (the C benchmarks' shapes): [(name, m, n, k)]."""
    import re
    with open(os.path.join(HERE, "gemm_shapes.h")) as f:
        rows = re.findall(r'\{"([^"]+)", (\d+), (\d+), (\d+)\}', f.read())
    out = []
    for name, m, k, npi in rows:
        m, k, npi = int(m), int(k), int(npi)
        if name.split()[0] in sets and (npi or m <= max_square):
            out.append((name, m, npi * images if npi else m, k))
    return out


def gemm_table(a, dev):
    """torch.matmul in fp32, bf16 and fp16 (fp32 accumulation inside the library) on the C benchmarks' shapes:
    PyTorch's own low-precision GEMM on this device (its bundled oneDNN or a fallback on a CPU)."""
    import torch
    torch.set_num_threads(a.threads)
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    images = 1 if a.quick else (8 if dev == "cpu" else 128)
    shapes = gemm_shapes(images, 256 if a.quick else (2048 if dev == "cpu" else 4096), a.gemm_sets.split(","))
    L = [f"| shape | M x N x K | fp32 ms (GFLOP/s) | bf16 ms (GFLOP/s) | fp16 ms (GFLOP/s) | bf16 / fp32 speed |",
         "|---|---|---:|---:|---:|---:|"]
    for name, m, n, k in shapes:
        gen = torch.Generator().manual_seed(0)
        A = (torch.rand(m, k, generator=gen) * 2 - 1).to(dev)
        B = (torch.rand(k, n, generator=gen) * 2 - 1).to(dev)
        cells, ms = [], {}
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            x, y = A.to(dt), B.to(dt)
            t0 = time.perf_counter()
            x @ y
            sync()
            first = time.perf_counter() - t0
            reps, t0 = 0, time.perf_counter()
            # A kind slower than 2 s a call (a CPU's fallback kernel) is timed by its first call alone.
            while first < 2.0 and (reps < 3 or time.perf_counter() - t0 < (0.0 if a.quick else 0.3)):
                x @ y
                reps += 1
            sync()
            dt_s = (time.perf_counter() - t0) / reps if reps else first
            ms[dt] = 1e3 * dt_s
            cells.append(f"{ms[dt]:.2f} ({2 * m * n * k / dt_s * 1e-9:.1f})")
        L.append(f"| {name} | {m} x {n} x {k} | " + " | ".join(cells) +
                 f" | **{ms[torch.float32] / ms[torch.bfloat16]:.2f}x** |")
        print(f"torch_autocast: gemm {dev} {name}: " + ", ".join(cells), file=sys.stderr)
    return L


def run_child(a, dev, name, mode, batch, steps, warmup):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--device", dev, "--model", name, "--mode", mode,
           "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup), "--threads", str(a.threads)]
    share = cpu_share.CpuShare()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    rec = share.stop(f"{dev} {name} {mode}")
    if out.returncode != 0:
        raise SystemExit(f"torch_autocast: {' '.join(cmd)} failed (exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1]), rec


def parse_map(text, default):
    m = dict(default)
    for part in filter(None, (text or "").split(",")):
        k, v = part.split("=")
        m[k] = int(v)
    return m


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def measure(a, dev, modes, batch, steps, warmup, shares):
    """rows[(model, mode)] = list of per-round results; ratio[(model, mode)] = per-round speed / fp32."""
    rows, ratio = {}, {}
    for name in a.models:
        for r in range(a.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            got = {}
            for mode in order:
                res, rec = run_child(a, dev, name, mode, batch[name], steps[name], warmup)
                shares.append(rec)
                got[mode] = res
                rows.setdefault((name, mode), []).append(res)
                print(f"torch_autocast: {dev} {name} {mode}: {res['images_per_s']:.1f} images/s, "
                      f"peak {res['peak_bytes'] / 2**20:.0f} MiB (other work {100 * rec['other_share']:.1f} %)",
                      file=sys.stderr)
            for mode in modes:
                ratio.setdefault((name, mode), []).append(got[mode]["images_per_s"] / got["fp32"]["images_per_s"])
    return rows, ratio


def table(dev, modes, rows, ratio, models):
    L = []
    if dev == "cpu":
        L += ["| model | batch | mode | images/s (median) | vs fp32 | step ms | peak RSS growth MiB (peak RSS; after "
              "import + model) | final loss |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    else:
        L += ["| model | batch | mode | images/s (median) | vs fp32 | step ms | peak allocated MiB | final loss |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name in models:
        for mode in modes:
            rs = rows[(name, mode)]
            ips = median([r["images_per_s"] for r in rs])
            mid = min(rs, key=lambda r: abs(r["images_per_s"] - ips))
            mem = f"{mid['peak_bytes'] / 2**20:.0f}"
            if dev == "cpu":
                mem += f" ({mid['peak_rss'] / 2**20:.0f}; {mid['base_rss'] / 2**20:.0f})"
            L.append(f"| {name} | {mid['batch']} | {mode} | {ips:.1f} | **{median(ratio[(name, mode)]):.2f}x** | "
                     f"{1e3 * mid['batch'] / ips:.1f} | {mem} | {mid['loss']:.3f} |")
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results-autocast.md")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "both"],
                    help="auto: cpu, and cuda too when a GPU is usable")
    ap.add_argument("--models", default="fmnist,resnet9")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", default="", help="e.g. fmnist=128,resnet9=32 (CPU) ; GPU defaults 512")
    ap.add_argument("--steps", default="", help="timed steps per model, e.g. fmnist=6,resnet9=2")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true", help="tiny batches, 1 step, 1 round: the harness only")
    ap.add_argument("--gemm", action="store_true",
                    help="instead of training: torch.matmul fp32 / bf16 / fp16 on bench/gemm_shapes.h's shapes")
    ap.add_argument("--gemm-sets", default="fmnist,resnet9,square")
    # the child's own arguments
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        a.batch, a.device = int(a.batch), a.device
        a.steps = int(a.steps)
        return child(a)
    a.models = [m for m in a.models.split(",") if m]
    for m in a.models:
        if m not in MODELS:
            ap.error(f"--models: unknown model '{m}' (known: {', '.join(MODELS)})")
    if a.device == "cpu":   # the parent need not import torch (seconds): the children report its version
        has_cuda = False
    else:
        import torch
        has_cuda = torch.cuda.is_available()
    devs = {"auto": ["cpu"] + (["cuda"] if has_cuda else []), "cpu": ["cpu"], "cuda": ["cuda"],
            "both": ["cpu", "cuda"]}[a.device]
    if "cuda" in devs and not has_cuda:
        raise SystemExit("torch_autocast: --device cuda: torch.cuda.is_available() is False (no GPU or no CUDA build)")
    if a.quick:   # fmnist alone, batch 8, 1 step: the harness in a few seconds (resnet9's bf16 step is the slow one)
        a.rounds, a.warmup, a.models = 1, 1, ["fmnist"]
    model_name, cores = cpu_share.cpu_model()
    flags = cpu_flags()
    hw_bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    L = [("# PyTorch's low-precision GEMM (torch.matmul) against fp32 on the C benchmarks' shapes" if a.gemm else
          "# PyTorch autocast on the kit's networks: fp32 against bf16 / fp16 training steps"), "",
         f"{datetime.date.today()}, `python3 bench/torch_autocast.py {' '.join(sys.argv[1:])}`; PyTorch "
         f"{{torch}}; CPU: {model_name}, {cores} cores, {a.threads} thread(s); bf16-related flags: "
         f"{', '.join(flags) or 'none'} -> "
         + ("the CPU multiplies bf16 in hardware." if hw_bf16 else
            "**no bf16 arithmetic on this CPU** (neither avx512_bf16 nor amx_bf16): PyTorch converts bf16 to fp32 "
            "or uses slow fallback kernels, so bf16 is a memory format here, not a speed-up."), ""]
    shares, sections, versions = [], [], []
    for dev in devs if a.gemm else []:
        import torch
        sections += [f"## torch.matmul on {'the CPU' if dev == 'cpu' else torch.cuda.get_device_name()}", ""]
        sections += gemm_table(a, dev) + [""]
        versions.append(torch.__version__)
    for dev in devs if not a.gemm else []:
        modes = CPU_MODES if dev == "cpu" else GPU_MODES
        batch = parse_map(a.batch, CPU_BATCH if dev == "cpu" else GPU_BATCH)
        steps = parse_map(a.steps, CPU_STEPS if dev == "cpu" else GPU_STEPS)
        if a.quick:
            batch = {m: 8 for m in MODELS}
            steps = {m: 1 for m in MODELS}
        # A GPU's first steps pick cuDNN's algorithms (benchmark mode) and fill the caching allocator.
        warmup = max(a.warmup, 3) if dev == "cuda" and not a.quick else a.warmup
        rows, ratio = measure(a, dev, modes, batch, steps, warmup, shares)
        versions += [r[0]["torch"] for r in rows.values()]
        title = "CPU" if dev == "cpu" else f"GPU: {rows[(a.models[0], 'fp32')][0]['gpu']}"
        sections += [f"## {title}", ""] + table(dev, modes, rows, ratio, a.models) + [""]
    L[2] = L[2].replace("{torch}", versions[0] if versions else "?")
    L += cpu_share.report_lines(shares, "make bench-autocast") + [""]
    L += sections
    L += [] if a.gemm else ["Each row: the median of the rounds' images/s; `vs fp32` the median of each round's ratio to the fp32 run "
          "of the same round; memory of the round nearest the median. Peak RSS growth = the process's peak resident "
          "memory after the steps less its peak after `import torch`, the model and the batch (activations, "
          "gradients, optimizer state, autocast's cast copies of the weights, the libraries' work buffers).", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(L))
    print(f"torch_autocast: wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
