#!/usr/bin/env python3
"""bench/precision_runs.py: lesson 10's program (solutions/10-precision) trained under each precision and each
large-batch rule on Fashion-MNIST; what the emulation shows about accuracy, measured.

    python3 bench/precision_runs.py speed [--rounds 1] [--model resnet9] [--batch 64] [--device auto]
                                                                          -> bench/results-precision-speed.md
    python3 bench/precision_runs.py accuracy [--epochs 3] [--np 2] ...   -> bench/results-precision.md (+ .csv)
    python3 bench/precision_runs.py batch [--epochs 2] [--batches 64,...,4096] [--rules fixed,linear,warmup] ...
                                                                          -> bench/results-batch.md + .csv
    python3 bench/precision_runs.py plot [--csv bench/results-batch.csv] [--png bench/figures/batch.png]

speed (`make bench-precision` runs it first): the kit's own speed and memory by precision against PyTorch's on
the same machine, in one run. Rows fp32, TF32 (`--tf32`; the kit refuses it on a CPU, and the row shows the
refusal the program prints), bf16, fp16 with dynamic loss scaling. Per row: lesson 10's program on synthetic data
(1 rank, ResNet-9, batch 64 on the CPU, 512 on a GPU), images/s from the durations of its steps in its --trace
after warm-up steps, its `precision path:` line; then bench/torch_autocast.py's child on the same net, batch and
optimizer under autocast of that precision; the two alternate row by row, and a second round (--rounds) runs the
rows in reverse. Peak memory is each process's peak RSS (wait4's ru_maxrss), the same measure for both. The CPU
always; a GPU too when nvidia-smi lists one (--device auto). Without PyTorch the PyTorch columns read "not
installed" and the kit's rows still come.

accuracy: one run per row, same seed, model, data, epochs and global batch: fp32; bf16; fp16 with --loss-scale
none (fp16's gradient underflow share: the `underflow=` of the final line); fp16 with dynamic loss scaling; bf16
with --master bf16 (the updates that vanish); bf16 with the bf16 all-reduce. Test accuracy, the last epoch's
train loss, the loss scale, skipped steps, the underflow share, per row.

batch: the global batch from 64 to 4096 under each learning-rate rule, the same epochs for every run (so a
larger batch takes fewer steps, as in a fixed compute budget):
  fixed    --lr-rule fixed  --warmup-epochs 0   the base --lr at every batch
  linear   --lr-rule linear --warmup-epochs 0   lr x batch / --lr-ref-batch (Goyal et al. 2017)
  warmup   --lr-rule linear --warmup-epochs W   the same peak, reached linearly over W epochs
A global batch is ranks x local batch; a local batch above --max-micro samples is run as --accumulate K
micro-batches (K the smallest power of two that fits), so 2 ranks reach 4096 on little memory. Accuracy
against global batch per rule -> results-batch.md, every run's line -> results-batch.csv; `make plot-batch`
draws figures/batch.png from the CSV (gnuplot).

Device: --device cpu (default) or cuda (2 ranks share one GPU on the MPI backend: --backend mpi is added, NCCL
refuses two ranks on one device). Each run's other-work share (bench/cpu_share.py) goes to the report. --quick:
a tiny synthetic run per row (the harness, `make test-precision-bench`), nothing measured.
"""
import argparse
import csv
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import cpu_share  # bench/cpu_share.py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(ROOT, "build", "solutions", "10-precision", "train")
FASHION = "/usr/share/datasets/fashion-mnist"

ACCURACY_ROWS = [  # (label, options)
    ("fp32", ["--precision", "fp32"]),
    ("bf16", ["--precision", "bf16"]),
    ("fp16, no loss scaling", ["--precision", "fp16", "--loss-scale", "none"]),
    ("fp16, dynamic loss scaling", ["--precision", "fp16", "--loss-scale", "dynamic"]),
    ("bf16, bf16 master weights", ["--precision", "bf16", "--master", "bf16"]),
    ("bf16, bf16 all-reduce", ["--precision", "bf16", "--allreduce", "bf16"]),
]
RULES = {"fixed": ("fixed", 0), "linear": ("linear", 0), "warmup": ("linear", None)}  # None: --warmup-epochs W


def final_fields(text):
    """The `final:` line's key=value pairs (rank 0's), or None when the run printed none."""
    lines = [ln for ln in text.splitlines() if ln.startswith("final:")]
    if not lines:
        return None
    return dict(kv.split("=", 1) for kv in lines[-1].split()[1:] if "=" in kv)


def run(a, args, label, shares):
    """Runs the lesson's program on a.np ranks with `args`; returns (final fields or None, output tail)."""
    cmd = [os.path.join(ROOT, "scripts", "launch.sh"), str(a.np), a.train] + data_args(a) + args + a.extra
    print(f"precision_runs: {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    share = cpu_share.CpuShare()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shares.append(share.stop(label))
    f = final_fields(p.stdout)
    if p.returncode != 0 or f is None:
        tail = "\n".join(p.stdout.splitlines()[-8:])
        print(f"precision_runs: {label}: exit {p.returncode}, no final line:\n{tail}", file=sys.stderr)
        return None, tail
    print(f"precision_runs: {label}: test_acc={f.get('test_acc')} train_loss={f.get('train_loss')} "
          f"underflow={f.get('underflow')} skipped={f.get('skipped')} ({f.get('seconds')} s)", file=sys.stderr)
    return f, ""


def data_args(a):
    d = ["--device", a.device, "--epochs", str(a.epochs), "--seed", str(a.seed)]
    if a.device == "cuda":
        d += ["--backend", "mpi"]
    if a.quick:
        return d + ["--dataset", "synthetic", "--model", "tiny"]
    return d + ["--dataset", "fashion-mnist", "--data-dir", a.data_dir] + (["--model", a.model] if a.model else [])


def header(a, what, shares):
    model, cores = cpu_share.cpu_model()
    L = [f"# Lesson 10: {what}", "",
         f"{datetime.date.today()}, `python3 bench/precision_runs.py {shlex.join(sys.argv[1:])}`: "
         f"{os.path.relpath(a.train, ROOT)} on {a.np} rank(s), --device {a.device}, "
         + ("synthetic data (--quick: the harness only, NOT a measurement)" if a.quick else
            f"Fashion-MNIST ({a.data_dir})") + f", {a.epochs} epoch(s), seed {a.seed}"
         + (f", extra options `{' '.join(a.extra)}`" if a.extra else "") + f"; machine: {model}, {cores} cores.", ""]
    L += cpu_share.report_lines(shares, f"python3 bench/precision_runs.py {shlex.join(sys.argv[1:])}")
    return L + ["", "Accuracy and loss do not depend on the machine's load (the same seed gives the same numbers); only "
                "the seconds do.", ""]


def pct(x):
    try:
        return f"{100 * float(x):.2f}"
    except (TypeError, ValueError):
        return "-"


def accuracy(a):
    shares, rows = [], []
    base = ["--batch-size", str(a.batch)] + (["--scale-window", str(a.scale_window)] if a.scale_window else [])
    # --quick: two rows (the harness, not the comparison)
    chosen = [ACCURACY_ROWS[0], ACCURACY_ROWS[2]] if a.quick else ACCURACY_ROWS
    if a.rows:
        chosen = [ACCURACY_ROWS[int(i)] for i in a.rows.split(",")]
    for label, opts in chosen:
        f, tail = run(a, base + opts, label, shares)
        rows.append((label, opts, f, tail))
    L = header(a, "test accuracy by precision", shares)
    L += [f"Global batch {a.batch}" + (f", --scale-window {a.scale_window}" if a.scale_window else "") +
          "; every row the same seed, so the same initial weights and data order. `underflow`: the share of the "
          "nonzero weight gradients (as the low-precision backward produced them, before unscaling) that "
          "rounded to 0, over the whole run; `skipped`: steps the loss scaler skipped on an inf/NaN gradient.", "",
          "| run | options | test accuracy % | final train loss | loss scale at the end | skipped steps | "
          "gradient underflow % | seconds |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, opts, f, tail in rows:
        if f is None:
            L.append(f"| {label} | `{' '.join(opts)}` | failed: {tail.splitlines()[-1] if tail else '?'} "
                     "| | | | | |")
            continue
        L.append(f"| {label} | `{' '.join(opts)}` | **{pct(f.get('test_acc'))}** | {f.get('train_loss', '-')} | "
                 f"{f.get('loss_scale', '-')} | {f.get('skipped', '-')} | {pct(f.get('underflow'))} | "
                 f"{f.get('seconds', '-')} |")
    write(a.out, L)
    with open(os.path.splitext(a.out)[0] + ".csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run", "options", "test_acc", "train_loss", "loss_scale", "skipped", "underflow", "seconds"])
        for label, opts, f, _ in rows:
            f = f or {}
            w.writerow([label, " ".join(opts)] + [f.get(k, "") for k in
                                                  ("test_acc", "train_loss", "loss_scale", "skipped", "underflow",
                                                   "seconds")])
    return 0 if all(f for _, _, f, _ in rows) else 1


def split_batch(global_batch, np_, max_micro):
    """(local batch, accumulate K): K the smallest power of two with local / K <= max_micro, or None."""
    if global_batch % np_:
        return None
    local, k = global_batch // np_, 1
    while local // k > max_micro and local % (2 * k) == 0:
        k *= 2
    return (local, k) if local // k <= max_micro and local % k == 0 else None


def batch(a):
    shares, rows = [], []
    rules = [r for r in a.rules.split(",") if r]
    for r in rules:
        if r not in RULES:
            raise SystemExit(f"precision_runs: --rules: unknown rule '{r}' (known: {', '.join(RULES)})")
    batches = [int(b) for b in a.batches.split(",") if b]
    for b in batches:
        sp = split_batch(b, a.np, a.max_micro)
        if sp is None:
            raise SystemExit(f"precision_runs: global batch {b} does not split over {a.np} ranks into micro-batches "
                             f"of at most {a.max_micro}")
        local, k = sp
        for rule in rules:
            lr_rule, warm = RULES[rule]
            warm = a.warmup_epochs if warm is None else warm
            opts = ["--batch-size", str(b), "--accumulate", str(k), "--lr-rule", lr_rule, "--lr", str(a.lr),
                    "--lr-ref-batch", str(a.lr_ref_batch), "--warmup-epochs", str(warm),
                    "--precision", a.precision]
            f, _ = run(a, opts, f"batch {b} {rule}", shares)
            lr = a.lr * b / a.lr_ref_batch if lr_rule == "linear" else a.lr
            rows.append({"rule": rule, "global_batch": b, "ranks": a.np, "local_batch": local, "accumulate": k,
                         "micro_batch": local // k, "lr": f"{lr:g}", "warmup_epochs": warm, "epochs": a.epochs,
                         "precision": a.precision, "test_acc": (f or {}).get("test_acc", ""),
                         "train_loss": (f or {}).get("train_loss", ""), "seconds": (f or {}).get("seconds", ""),
                         "status": "ok" if f else "failed"})
    csv_path = os.path.splitext(a.out)[0] + ".csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    L = header(a, "accuracy against global batch, by learning-rate rule", shares)
    L += [f"Base --lr {a.lr:g} at --lr-ref-batch {a.lr_ref_batch}; --precision {a.precision}; the same {a.epochs} "
          f"epoch(s) for every run; rules: fixed = --lr-rule fixed --warmup-epochs 0, linear = --lr-rule linear "
          f"--warmup-epochs 0, warmup = --lr-rule linear --warmup-epochs {a.warmup_epochs}. Micro-batches at most "
          f"{a.max_micro} samples (--accumulate). Test accuracy %, final train loss in brackets; every run's line "
          f"in {os.path.basename(csv_path)}.", "",
          "| global batch | ranks x local (accumulate) | " + " | ".join(f"{r} (lr)" for r in rules) + " |",
          "|---:|---|" + "---:|" * len(rules)]
    for b in batches:
        cells = []
        for r in rules:
            row = next(x for x in rows if x["global_batch"] == b and x["rule"] == r)
            cells.append(f"**{pct(row['test_acc'])}** ({row['train_loss'] or '-'}; lr {row['lr']})"
                         if row["status"] == "ok" else f"failed (lr {row['lr']})")
        first = next(x for x in rows if x["global_batch"] == b)
        L.append(f"| {b} | {a.np} x {first['local_batch']} ({first['accumulate']}) | " + " | ".join(cells) + " |")
    L += ["", "`make plot-batch` draws figures/batch.png (accuracy against global batch, one line per rule) from the CSV."]
    write(a.out, L)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def write(path, lines):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"precision_runs: wrote {path}", file=sys.stderr)


def plot(a):
    with open(a.csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("status") == "ok" and r.get("test_acc")]
    if not rows:
        raise SystemExit(f"plot-batch: no finished runs in {a.csv} (make bench-batch writes it)")
    if not shutil.which("gnuplot"):
        raise SystemExit("plot-batch: gnuplot is not installed (apt-get install gnuplot-nox); the CSV has the numbers")
    rules = list(dict.fromkeys(r["rule"] for r in rows))
    terminal = "pngcairo" if subprocess.run(["gnuplot", "-e", "set terminal pngcairo"],
                                            capture_output=True).returncode == 0 else "png"
    with tempfile.TemporaryDirectory() as d:
        plots = []
        for i, rule in enumerate(rules):
            path = os.path.join(d, f"{rule}.dat")
            with open(path, "w") as f:
                for r in sorted((r for r in rows if r["rule"] == rule), key=lambda r: int(r["global_batch"])):
                    f.write(f"{r['global_batch']} {100 * float(r['test_acc']):.3f}\n")
            plots.append(f"'{path}' using 1:2 with linespoints lw 2 pt {5 + 2 * i} title '{rule}'")
        e = rows[0]
        L = [f"set terminal {terminal} size 900,560 font 'DejaVu Sans,11'", f"set output '{a.png}'",
             f"set title 'Lesson 10: test accuracy against global batch ({e['epochs']} epoch(s), {e['ranks']} ranks, "
             f"{e['precision']})'", "set logscale x 2", "set xlabel 'global batch (ranks x local, --accumulate)'",
             "set ylabel 'test accuracy, %'", "set grid", "set key bottom left", "set format x '%g'",
             "plot " + ", ".join(plots)]
        os.makedirs(os.path.dirname(os.path.abspath(a.png)), exist_ok=True)
        p = subprocess.run(["gnuplot"], input="\n".join(L) + "\n", text=True, capture_output=True)
        if p.returncode != 0:
            raise SystemExit(f"plot-batch: gnuplot failed:\n{p.stderr}")
    print(f"plot-batch: wrote {a.png}")
    return 0


# ---------------------------------------------------------------- speed: the kit against PyTorch, one run

# (row, the kit's options, PyTorch autocast's mode in bench/torch_autocast.py's child). TF32 is offered on every
# device: the kit's own refusal on a CPU is what its row shows.
SPEED_ROWS = [("fp32", ["--precision", "fp32"], "fp32"),
              ("tf32", ["--precision", "fp32", "--tf32"], "tf32"),
              ("bf16", ["--precision", "bf16"], "bf16"),
              ("fp16 + dynamic loss scaling", ["--precision", "fp16", "--loss-scale", "dynamic"], "fp16")]
# Timed steps: the kit's cost a second or two each on 2 cores, PyTorch's emulated bf16 about 45 s (its fallback
# kernels), so the kit takes more of them (steps of one run vary by 10-30 % on a quiet 2-core machine).
SPEED_DEFAULTS = {"cpu": {"batch": 64, "kit_steps": 6, "steps": 2, "warmup": 1},
                  "cuda": {"batch": 512, "kit_steps": 20, "steps": 20, "warmup": 3}}
SYNTHETIC_TRAIN = 5000  # images in the kit's synthetic training split (kit/data.c): the epochs a run needs
# Where the kit's CPU bf16 row ran its real path (oneDNN's bf16 GEMMs: AMX, AVX512-BF16), the same options with that
# path switched off (KIT_CPU_BF16=0, kit/cpu_bf16.h) run right after it: the emulation beside the real thing, on one
# machine, in one run (the before and after of the CPU's bf16 GEMMs).
BF16_OFF = ("bf16, emulated (KIT_CPU_BF16=0)", ["--precision", "bf16"], {"KIT_CPU_BF16": "0"})


def run_peak(cmd, env=None):
    """Runs cmd to its end; returns (exit code, stdout + stderr, peak resident memory of the process in bytes).
    The peak is wait4's ru_maxrss for that child: the largest of the process and the descendants it waited for,
    the same measure for the kit's program and for PyTorch's child."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = p.stdout.read()
    p.stdout.close()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return p.returncode, out, usage.ru_maxrss * 1024


def trace_step_seconds(path, warmup):
    """The durations (s) of the steps the program's --trace recorded ("step k" events), the first `warmup` left
    out: what a step costs once the libraries have started (threads, page faults, cuBLAS handles)."""
    with open(path) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    steps = [(int(e["name"].split()[1]), e["dur"] * 1e-6) for e in events
             if e.get("ph") == "X" and re.fullmatch(r"step \d+", e.get("name", "")) and e.get("pid", 0) == 0]
    return [d for k, d in sorted(steps) if k >= warmup]


def kit_speed(a, dev, opts, batch, steps, warmup, env=None):
    """Lesson 10's program for warmup + steps steps: {ips, peak, path}, or {why} when it did not train (a refusal:
    its exit 2 with an `error:` line, as --tf32 on a CPU; or a failure)."""
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        epochs = (warmup + steps) // max(1, SYNTHETIC_TRAIN // batch) + 1
        args = ["--device", dev, "--dataset", "synthetic", "--model", a.model, "--batch-size", str(batch),
                "--epochs", str(epochs), "--stop-at", str(warmup + steps), "--seed", str(a.seed),
                "--trace", trace] + opts + a.extra
        cmd = ([a.train] if a.np == 1 else [os.path.join(ROOT, "scripts", "launch.sh"), str(a.np), a.train]) + args
        print(f"precision_runs: speed: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        rc, out, peak = run_peak(cmd, dict(os.environ, KIT_PROGRESS="plain", **(env or {})))
        path = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("precision path:")),
                    None)
        if rc != 0:
            err = next((ln for ln in out.splitlines() if ln.startswith("error:")), None)
            if rc == 2 and err:  # the kit's refusal of bad input: its first sentence of why
                return {"why": "refused: " + err.removeprefix("error: ").split(". ")[0].rstrip("."), "path": path}
            last = (err or (out.strip().splitlines() or ["?"])[-1]).removeprefix("error: ")
            return {"why": f"failed (exit {rc}): {last}", "path": path}
        times = trace_step_seconds(trace, warmup) if os.path.exists(trace) else []
    if not times:
        return {"why": "no step events in the program's --trace", "path": path}
    # the final line's peak_mib: the most the kit's own allocations held at once (the GPU's memory on CUDA)
    alloc = re.search(r"peak_mib=([0-9.]+)", out)
    # --batch-size is the global batch: the images of one step over every rank
    return {"ips": batch / (sum(times) / len(times)), "peak": peak, "path": path, "steps": len(times),
            "alloc": float(alloc.group(1)) * 2**20 if alloc else None}


def torch_speed(a, dev, mode, batch, steps, warmup):
    """bench/torch_autocast.py's child (the same net from tools/torch_models.py, the same optimizer) in one
    process of its own: {ips, peak, base} or {missing} when python3 has no PyTorch."""
    cmd = [sys.executable] + (["-S"] if sys.flags.no_site else []) + [
        os.path.join(HERE, "torch_autocast.py"), "--child", "--device", dev, "--model", a.model, "--mode", mode,
        "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup), "--threads", str(a.threads)]
    print(f"precision_runs: speed: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    # On a GPU machine with the kit's bundle (scripts/gpu-bundle-env.sh), PyTorch gets the library path it had
    # before the bundle; the kit's program keeps the bundle's (its Open MPI finds its parts there).
    env = dict(os.environ)
    if "GPU_BUNDLE_ORIG_LD_LIBRARY_PATH" in env:
        env["LD_LIBRARY_PATH"] = env["GPU_BUNDLE_ORIG_LD_LIBRARY_PATH"]
    rc, out, peak = run_peak(cmd, env)
    if rc != 0:
        if re.search(r"(ModuleNotFoundError|ImportError).*torch", out):
            return {"missing": "not installed"}
        return {"missing": f"failed (exit {rc}): {out.strip().splitlines()[-1] if out.strip() else '?'}"}
    row = json.loads(out.strip().splitlines()[-1])
    return {"ips": row["images_per_s"], "peak": peak, "base": row.get("base_rss"), "torch": row["torch"],
            "cuda_peak": row["peak_bytes"] if dev == "cuda" else None}


def gpu_usable():
    """A GPU nvidia-smi lists (the kit's CUDA build is asked for by --device cuda; a failure there is its row's)."""
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None


def med(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def speed(a):
    from torch_autocast import cpu_flags  # bench/torch_autocast.py: the parent does not import torch
    import importlib.util
    has_torch = importlib.util.find_spec("torch") is not None
    gpu = gpu_usable() if a.device in ("auto", "cuda") else None
    if a.device == "cuda" and not gpu:
        raise SystemExit("precision_runs: speed --device cuda: nvidia-smi lists no GPU")
    devs = ["cpu"] + (["cuda"] if gpu else []) if a.device == "auto" else [a.device]
    shares, sections, kits = [], [], []
    flags = cpu_flags()
    hw = "avx512_bf16" in flags or "amx_bf16" in flags
    for dev in devs:
        cfg = dict(SPEED_DEFAULTS[dev])
        if a.batch:
            cfg["batch"] = a.batch
        if a.steps:
            cfg["steps"] = a.steps
        if a.kit_steps:
            cfg["kit_steps"] = a.kit_steps
        if a.quick:
            cfg = {"batch": 8, "kit_steps": 1, "steps": 1, "warmup": 1}
        batch, kit_steps, steps, warmup = cfg["batch"], cfg["kit_steps"], cfg["steps"], cfg["warmup"]
        kit, pt = {}, {}
        for r in range(a.rounds):
            # Kit and PyTorch alternate row by row; each round reverses the order, so a burst of other work
            # lands on both sides rather than on one precision.
            order = SPEED_ROWS if r % 2 == 0 else SPEED_ROWS[::-1]
            for label, opts, mode in order:
                share = cpu_share.CpuShare()
                k = kit_speed(a, dev, opts, batch, kit_steps, warmup)
                shares.append(share.stop(f"{dev} kit {label.split()[0]}"))
                kit.setdefault(label, []).append(k)
                if not has_torch:
                    pt.setdefault(label, []).append({"missing": "not installed"})
                elif mode == "tf32" and dev == "cpu":
                    pt.setdefault(label, []).append({"missing": "no TF32 on a CPU"})
                elif a.quick and mode == "bf16":  # seconds saved (an import of torch): fp16's autocast path covers it
                    pt.setdefault(label, []).append({"missing": "not run in --quick"})
                else:
                    share = cpu_share.CpuShare()
                    t = torch_speed(a, dev, mode, batch, steps, warmup)
                    shares.append(share.stop(f"{dev} PyTorch {mode}"))
                    pt.setdefault(label, []).append(t)
                    if t.get("missing") == "not installed":
                        has_torch = False
                print(f"precision_runs: speed {dev} {label}: kit {k.get('ips', k.get('why'))}, PyTorch "
                      f"{pt[label][-1].get('ips', pt[label][-1].get('missing'))}", file=sys.stderr, flush=True)
                if dev == "cpu" and mode == "bf16" and k.get("path") and not k["path"].startswith("emulated"):
                    off_label, off_opts, off_env = BF16_OFF
                    share = cpu_share.CpuShare()
                    kit.setdefault(off_label, []).append(kit_speed(a, dev, off_opts, batch, kit_steps, warmup, off_env))
                    shares.append(share.stop(f"{dev} kit bf16 emulated"))
                    pt.setdefault(off_label, []).append({"missing": "see the bf16 row"})
        sections += speed_table(a, dev, gpu, batch, (kit_steps, steps), warmup, kit, pt, hw)
        kits.append(kit)
    model, cores = cpu_share.cpu_model()
    cmd = f"python3 bench/precision_runs.py {shlex.join(sys.argv[1:])}"
    L = ["# Lesson 10: the kit's speed and memory by precision, against PyTorch autocast", "",
         f"{datetime.date.today()}, `{cmd}`" + (" (--quick: the harness only, NOT a measurement)" if a.quick else "")
         + f". Machine: {model}, {cores} cores; bf16-related CPU flags: {', '.join(flags) or 'none'} -> "
         + ("the CPU has bf16 instructions." if hw else "**no bf16 instructions** (neither avx512_bf16 nor "
            "amx_bf16): bf16 and fp16 run without hardware support here, in the kit (float32 rounded to the format) and in "
            "PyTorch (conversions and fallback kernels) alike.")
         + (f" GPU: {gpu}." if gpu else " No GPU (nvidia-smi lists none): CPU rows only."), ""]
    L += cpu_share.report_lines(shares, cmd) + [""]
    L += sections
    write(a.out, L)
    # A row the kit refused (TF32 on a CPU) is its answer; a row that failed is a failure of the run.
    failed = [label for rows in kits for label, ks in rows.items() if any(k.get("why", "").startswith("failed")
                                                                        for k in ks)]
    if failed:
        print(f"precision_runs: speed: the kit's program failed in row(s) {', '.join(failed)} (the report says how)",
              file=sys.stderr)
        return 1
    return 0


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def speed_table(a, dev, gpu, batch, steps, warmup, kit, pt, hw_bf16):
    """One device's table: per row the medians over the rounds, the ratios the medians of each round's."""
    kit_steps, steps = steps
    where = "CPU" if dev == "cpu" else f"GPU ({gpu})"
    mem = "peak RSS MiB" if dev == "cpu" else "peak GPU memory MiB"
    L = [f"## {where}: {a.model}, batch {batch}, {a.np} rank(s)", "",
         f"Lesson 10's program (`{os.path.relpath(a.train, ROOT)} --device {dev} --dataset synthetic --model "
         f"{a.model} --batch-size {batch} --stop-at {warmup + kit_steps} --trace FILE`, its options per row): images/s "
         f"from the program's own step times (the `step k` events of its --trace), the first {warmup} step(s) left "
         f"out, {kit_steps} timed. PyTorch: bench/torch_autocast.py's child, the same net (tools/torch_models.py), "
         f"batch and optimizer under autocast (fp16 with `torch.amp.GradScaler`), {warmup} warm-up step(s), "
         f"{steps} timed. Peak memory: each process's peak resident memory (wait4's ru_maxrss), taken the same "
         f"way for both; PyTorch's includes its libraries (in brackets: its peak after `import torch` and the model)."
         + (" On a GPU the memory columns are the device's instead: the kit's own allocations at their peak from "
            "its first step on (the `peak_mib` of its final line) against `torch.cuda.max_memory_allocated` after "
            "its warm-up. Both hold the convolutions' work space (the kit's conv work, PyTorch's cuDNN workspace "
            "from its caching allocator); neither holds the CUDA context." if dev == "cuda" else "")
         + (f" {a.rounds} round(s), kit and PyTorch alternating row by row; medians." if a.rounds > 1 else
            " One round, kit and PyTorch alternating row by row."), "",
         f"| precision | kit images/s | kit vs its fp32 | PyTorch images/s | PyTorch vs its fp32 | kit / PyTorch | "
         f"kit {mem} | PyTorch {mem} | kit / PyTorch memory | kit's `precision path:` line |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    kfp = [k.get("ips") for k in kit["fp32"]]
    pfp = [t.get("ips") for t in pt["fp32"]]
    for label in [row[0] for row in SPEED_ROWS] + [lab for lab in kit if lab == BF16_OFF[0]]:
        ks, ts = kit[label], pt[label]
        path = next((k["path"] for k in ks if k.get("path")), None)
        path = f"`{path}`" if path else "-"
        if all("why" in k for k in ks):
            kcells = [ks[0]["why"], "-"]
            kpeak = None
        else:
            kcells = [fmt(med([k.get("ips") for k in ks]), ".1f"),
                      fmt(med([k.get("ips") / f if k.get("ips") and f else None for k, f in zip(ks, kfp)]), ".2f") + "x"]
            kpeak = med([k.get("peak") if dev == "cpu" else k.get("alloc") for k in ks])
        if all("missing" in t for t in ts):
            pcells, ppeak, ratio, mratio, pmem = [ts[0]["missing"], "-"], None, "-", "-", "-"
        else:
            ppeak = med([t.get("peak") if dev == "cpu" else t.get("cuda_peak") for t in ts])
            base = med([t.get("base") for t in ts]) if dev == "cpu" else None
            pcells = [fmt(med([t.get("ips") for t in ts]), ".1f"),
                      fmt(med([t.get("ips") / f if t.get("ips") and f else None for t, f in zip(ts, pfp)]), ".2f") + "x"]
            ratio = fmt(med([k.get("ips") / t.get("ips") if k.get("ips") and t.get("ips") else None
                             for k, t in zip(ks, ts)]), ".2f") + "x"
            pmem = fmt(ppeak and ppeak / 2**20, '.0f') + (f" ({fmt(base and base / 2**20, '.0f')})" if base else "")
            mratio = fmt(kpeak / ppeak if kpeak and ppeak else None, ".2f") + "x"
        bold = (lambda c: "-" if c.startswith("-") else f"**{c}**")
        L.append(f"| {label} | {kcells[0]} | {kcells[1].replace('-x', '-')} | {pcells[0]} | "
                 f"{pcells[1].replace('-x', '-')} | {bold(ratio)} | {fmt(kpeak and kpeak / 2**20, '.0f')} | {pmem} | "
                 f"{mratio.replace('-x', '-')} | {path} |")
    mem_key = "peak" if dev == "cpu" else "alloc"
    return L + [""] + speed_notes(kit, pt, kfp, pfp, dev == "cpu" and not hw_bf16, mem_key) + [""]


def speed_notes(kit, pt, kfp, pfp, no_bf16_cpu, mem_key):
    """What the table says in words, read from its own numbers: which low-precision rows are slower than the same
    side's fp32 and why (the path), and whether the kit's memory moves with the precision."""
    def ratio(xs, base):
        return med([x.get("ips") / b if x.get("ips") and b else None for x, b in zip(xs, base)])
    N, slower = [], {}
    for label, _, _ in SPEED_ROWS[2:]:
        r = ratio(kit[label], kfp)
        path = next((k["path"] for k in kit[label] if k.get("path")), "") or ""
        if r is not None and r < 1 and path.startswith("emulated"):
            slower[label.split()[0]] = r
    if slower:
        N.append(f"**Here the kit's low precision is slower than its own fp32** "
                 f"({', '.join(f'{k} {r:.2f}x' for k, r in slower.items())} of its fp32 images/s): on this path it "
                 "is emulated, float32 GEMMs plus a rounding pass over every tensor the policy rounds"
                 + (" (fp16's conversion costs more than bf16's)" if slower.get("fp16", 1) < slower.get("bf16", 0)
                    else "") + ", and no 16-bit arithmetic anywhere. What it buys is the numerics (lesson 10), not "
                 "speed.")
    pslow = [f"{label.split()[0]} {r:.2f}x" for label, _, _ in SPEED_ROWS[2:]
             if (r := ratio(pt[label], pfp)) is not None and r < 1]
    if pslow and no_bf16_cpu:
        N.append(f"PyTorch's autocast is slower than its fp32 too ({', '.join(pslow)}): without bf16 instructions "
                 "it converts, or runs fallback kernels, so the kit / PyTorch ratio of those rows compares two "
                 "emulations, not hardware.")
    peaks = [med([k.get(mem_key) for k in kit[label]]) for label, _, _ in SPEED_ROWS]
    peaks = [p for p in peaks if p]
    if len(peaks) > 1 and max(peaks) <= 1.05 * min(peaks):
        lo, hi = f"{min(peaks) / 2**20:.0f}", f"{max(peaks) / 2**20:.0f}"
        N.append(f"The kit's peak memory does not move with the precision ({lo if lo == hi else lo + '-' + hi} "
                 f"MiB): on a CPU its low-precision values are float32 containers (lesson 10, "
                 "section 2).")
    return [" ".join(N)] if N else []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="what", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--train", default=TRAIN, help="lesson 10's program (default: the solution's build)")
    common.add_argument("--np", type=int, default=None, help="ranks (scripts/launch.sh; default 2, speed's 1)")
    common.add_argument("--device", default=None, choices=["cpu", "cuda", "auto"],
                        help="default cpu; speed's auto: the CPU, then a GPU when nvidia-smi lists one")
    common.add_argument("--data-dir", default=os.environ.get("FASHION_DIR", FASHION))
    common.add_argument("--model", default=None, help="default: the dataset's (fmnist for Fashion-MNIST); speed's "
                        "resnet9 (tiny with --quick)")
    common.add_argument("--epochs", type=int, default=3)
    common.add_argument("--seed", type=int, default=1)
    common.add_argument("--extra", default="", help="more options for every run, e.g. '--width 16'")
    common.add_argument("--quick", action="store_true", help="synthetic data, tiny model: the harness only")
    p1 = sub.add_parser("accuracy", parents=[common])
    p1.add_argument("--batch", type=int, default=128, help="global batch of every row")
    p1.add_argument("--scale-window", type=int, default=0, help="--scale-window for every row (0: the default)")
    p1.add_argument("--rows", default="", help="only these rows, by index (0-5), e.g. 3,4: to share a run out")
    p1.add_argument("--out", default=os.path.join(HERE, "results-precision.md"))
    p2 = sub.add_parser("batch", parents=[common])
    p2.add_argument("--batches", default="64,128,256,512,1024,2048,4096")
    p2.add_argument("--rules", default="fixed,linear,warmup")
    p2.add_argument("--lr", type=float, default=0.05, help="base learning rate (the kit's default)")
    p2.add_argument("--lr-ref-batch", type=int, default=128)
    p2.add_argument("--warmup-epochs", type=int, default=1, help="for the warmup rule")
    p2.add_argument("--max-micro", type=int, default=256, help="largest micro-batch; above: --accumulate")
    p2.add_argument("--precision", default="fp32")
    p2.add_argument("--out", default=os.path.join(HERE, "results-batch.md"))
    p4 = sub.add_parser("speed", parents=[common])
    p4.add_argument("--batch", type=int, default=0, help="default: 64 on the CPU, 512 on a GPU")
    p4.add_argument("--steps", type=int, default=0, help="PyTorch's timed steps (default: 2 on the CPU, 20 on a GPU)")
    p4.add_argument("--kit-steps", type=int, default=0, help="the kit's timed steps (default: 6 on the CPU, 20 on a GPU)")
    p4.add_argument("--rounds", type=int, default=1, help="rounds, kit and PyTorch alternating; medians")
    p4.add_argument("--threads", type=int, default=os.cpu_count(), help="PyTorch's intra-op threads")
    p4.add_argument("--out", default=os.path.join(HERE, "results-precision-speed.md"))
    p3 = sub.add_parser("plot")
    p3.add_argument("--csv", default=os.path.join(HERE, "results-batch.csv"))
    p3.add_argument("--png", default=os.path.join(HERE, "figures", "batch.png"))
    a = ap.parse_args()
    if a.what == "plot":
        return plot(a)
    a.extra = a.extra.split()
    speed_mode = a.what == "speed"  # the defaults differ: 1 rank, ResNet-9, every device there is
    a.np = a.np or (1 if speed_mode else 2)
    a.device = a.device or ("auto" if speed_mode else "cpu")
    a.model = a.model or ("tiny" if speed_mode and a.quick else "resnet9" if speed_mode else "")
    if not os.access(a.train, os.X_OK):
        print(f"precision_runs: skipped: {os.path.relpath(a.train, ROOT)} is not built (make "
              f"build/solutions/10-precision/train; lesson 10 needs Open MPI)")
        return 0
    if speed_mode:
        return speed(a)
    if a.device == "auto":
        a.device = "cpu"
    if not a.quick and not os.path.isdir(a.data_dir):
        raise SystemExit(f"precision_runs: no Fashion-MNIST in {a.data_dir} (apt-get install dataset-fashion-mnist, "
                         f"or --data-dir / FASHION_DIR)")
    return accuracy(a) if a.what == "accuracy" else batch(a)


if __name__ == "__main__":
    sys.exit(main())
