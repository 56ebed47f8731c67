#!/usr/bin/env python3
"""bench/precision_runs.py: lesson 10's program (solutions/10-precision) trained under each precision and each
large-batch rule on Fashion-MNIST; what the emulation shows about accuracy, measured.

    python3 bench/precision_runs.py accuracy [--epochs 3] [--np 2] ...   -> bench/results-precision.md (+ .csv)
    python3 bench/precision_runs.py batch [--epochs 2] [--batches 64,...,4096] [--rules fixed,linear,warmup] ...
                                                                          -> bench/results-batch.md + .csv
    python3 bench/precision_runs.py plot [--csv bench/results-batch.csv] [--png bench/figures/batch.png]

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="what", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--train", default=TRAIN, help="lesson 10's program (default: the solution's build)")
    common.add_argument("--np", type=int, default=2, help="ranks (scripts/launch.sh)")
    common.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    common.add_argument("--data-dir", default=os.environ.get("FASHION_DIR", FASHION))
    common.add_argument("--model", default="", help="default: the dataset's (fmnist for Fashion-MNIST)")
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
    p3 = sub.add_parser("plot")
    p3.add_argument("--csv", default=os.path.join(HERE, "results-batch.csv"))
    p3.add_argument("--png", default=os.path.join(HERE, "figures", "batch.png"))
    a = ap.parse_args()
    if a.what == "plot":
        return plot(a)
    a.extra = a.extra.split()
    if not os.access(a.train, os.X_OK):
        print(f"precision_runs: skipped: {os.path.relpath(a.train, ROOT)} is not built (make "
              f"build/solutions/10-precision/train; lesson 10 needs Open MPI)")
        return 0
    if not a.quick and not os.path.isdir(a.data_dir):
        raise SystemExit(f"precision_runs: no Fashion-MNIST in {a.data_dir} (apt-get install dataset-fashion-mnist, "
                         f"or --data-dir / FASHION_DIR)")
    return accuracy(a) if a.what == "accuracy" else batch(a)


if __name__ == "__main__":
    sys.exit(main())
