#!/usr/bin/env python3
"""bench/tp_bench.py: lesson 11 (tensor parallelism) measured on the kit (`make bench-tp`), beside the arithmetic
and beside lesson 09's ZeRO-3.

    python3 bench/tp_bench.py --train build/solutions/11-tensor/train --zero-train build/solutions/09-zero/train
        [--sections traffic,memory,budget,speed] [--md bench/results-tp.md] [--quick] [--plot]

Every number comes from the lesson programs themselves, run under scripts/launch.sh (mpirun; more ranks than
cores: oversubscribed, which bytes and memory do not care about; `--bind-to none` for every run, so that every
rank sizes its conv scratch for the same number of cores):

  traffic  step 1's bytes per rank handed to each group's collectives (pg_traffic), as lesson 11's program prints
           them with its own arithmetic (tp_expected_traffic), and this script's arithmetic from the ResNet-9
           table (below): TP = 1, 2, 4 and the 2 x 2 grid (+ data parallelism on 2 ranks). All three must be
           equal, or the script fails.
  memory   every rank's memory by part after step 1 (the kit's allocation counters, `--memory`) for TP = 1, 2, 4
           at a fixed batch per replica and a few ResNet-9 widths, beside lesson 09's ZeRO-3 (`--zero 3
           --memory`) on 2 and 4 ranks at the same batch per rank. The model states (params, grads, momentum)
           are checked against the arithmetic to the printed kB, and TP's activations against TP = 1's minus
           what the split saves inside the blocks (a1, a2, their gradient and BN1's statistics: 1/T of them).
  budget   the largest ResNet-9 width whose measured peak fits a per-rank budget, for TP = 1, 2, 4 and ZeRO-3 on
           2 and 4 ranks: a quadratic through the memory section's widths predicts it, then measured runs walk
           to the last width that fits and the first that does not (both are in the table).
  speed    images/s of TP = 1, 2, 4 and the grid against data parallelism on as many ranks, at the same global
           batch, a few widths (CPU: the cores are shared by the ranks; 4 ranks on 2 cores are oversubscribed).

The arithmetic (ResNet-9 of width W on 32 x 32 images, kit/model.c's table): replicated layers 378 W^2 + 137 W +
10 parameters (the stem, the convs between the blocks, their BNs, the classifier); two residual blocks, of
c = 2W channels at 16 x 16 and c = 8W at 4 x 4, whose slices hold 2 (c/T) c 9 + 2 c/T + 2 c parameters per rank.
Per step, a tensor group's f and g all-reduce 2 n c h w floats per block (n: images per replica); a data group
(D > 1) averages the rank's parameters and syncs every BN's statistics (2 all-reduces of 2 ch + 1 doubles).
"""
import argparse
import csv
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import cpu_share  # noqa: E402  (bench/cpu_share.py)

F = 4
MiB = 2**20
PARTS = ("params", "grads", "optimizer", "activations", "comm", "other")


# ---------------------------------------------------------------- the arithmetic

def blocks(W):
    """ResNet-9's two residual blocks: (c, h, w)."""
    return [(2 * W, 16, 16), (8 * W, 4, 4)]


def replicated_params(W):
    return 378 * W * W + 137 * W + 10


def replicated_bn_channels(W):
    return W + 2 * W + 4 * W + 8 * W  # the BNs outside the blocks


def local_params(W, T):
    return replicated_params(W) + sum(2 * (c // T) * c * 9 + 2 * (c // T) + 2 * c for c, _, _ in blocks(W))


def whole_params(W):
    return local_params(W, 1)


def traffic(W, T, D, n):
    """Bytes and calls per rank per step, by group: (tensor bytes, tensor calls, data bytes, data calls)."""
    tb = sum(2 * n * c * h * w * F for c, h, w in blocks(W))
    tc = 2 * len(blocks(W))
    if D == 1:
        return tb, tc, 0, 0
    bn = [W, 2 * W, 4 * W, 8 * W] + [x for c, _, _ in blocks(W) for x in (c // T, c)]
    db = local_params(W, T) * F + sum(2 * (2 * ch + 1) * 8 for ch in bn)
    dc = (3 + len(blocks(W))) + 2 * len(bn)  # one gradient average per piece (3 stages, 2 blocks); BN fwd + bwd
    return tb, tc, db, dc


def states_arith(W, T):
    """Bytes per rank: params (with the BN running statistics of the pieces and of the whole model the loop
    prints its table from), grads, momentum."""
    P = local_params(W, T)
    bn_pieces = replicated_bn_channels(W) + sum(c // T + c for c, _, _ in blocks(W))
    bn_whole = replicated_bn_channels(W) + sum(2 * c for c, _, _ in blocks(W))
    return {"params": (P + 2 * bn_pieces + 2 * bn_whole) * F, "grads": P * F, "optimizer": P * F}


def act_saving(W, T, n):
    """What the split saves in activations against T = 1: a1, a2 and da (n, c/T, h, w) and BN1's saved mean and
    invstd (c/T each) of every block, for (c - c/T) channels."""
    return sum((3 * n * h * w + 2) * (c - c // T) * F for c, h, w in blocks(W))


# ---------------------------------------------------------------- running the programs

class Runner:
    def __init__(self, a):
        self.a, self.shares, self.runs, self.log = a, [], 0, []

    def launch(self, np_, argv, label=""):
        # mpirun on this machine (not srun), every line tagged with its rank: the ranks' tables interleave.
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // np_)), KIT_PROGRESS="plain",
                   LAUNCH_ARGS=(os.environ.get("LAUNCH_ARGS", "") + " --bind-to none --tag-output").strip())
        env.pop("SLURM_JOB_ID", None)
        cmd = [os.path.join(ROOT, "scripts", "launch.sh"), str(np_)] + argv
        share = cpu_share.CpuShare()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT)
        rec = share.stop(label)
        if label:
            self.shares.append(rec)
        self.runs += 1
        if p.returncode != 0:
            raise SystemExit(f"tp_bench.py: {' '.join(cmd)} failed (exit {p.returncode}):\n"
                             f"{p.stdout[-1500:]}\n{p.stderr[-2000:]}")
        self.log.append(" ".join(["scripts/launch.sh", str(np_)] + [os.path.relpath(x, ROOT) if x.startswith("/")
                                                                      else x for x in argv]))
        return split_ranks(p.stdout), rec

    def tp(self, np_, T, W, batch, steps=1, memory=True, label=""):
        argv = [self.a.train, "--dataset", "synthetic", "--model", "resnet9", "--width", str(W), "--batch-size",
                str(batch), "--tp", str(T), "--stop-at", str(steps)] + (["--memory"] if memory else [])
        out, rec = self.launch(np_, argv, label)
        r = parse_tp(out)
        r.update(impl="tp", world=np_, tp=T, dp=np_ // T, width=W, replica_batch=batch // (np_ // T),
                 other_share=rec["other_share"])
        return r

    def zero3(self, np_, W, local_batch, label=""):
        argv = [self.a.zero_train, "--dataset", "synthetic", "--model", "resnet9", "--width", str(W),
                "--batch-size", str(local_batch * np_), "--zero", "3", "--stop-at", "1", "--memory"]
        out, rec = self.launch(np_, argv, label)
        r = parse_zero(out)
        r.update(impl="zero3", world=np_, tp=1, dp=np_, width=W, replica_batch=local_batch,
                 other_share=rec["other_share"])
        return r


def split_ranks(stdout):
    """mpirun --tag-output's lines ([job,rank]<stdout>:text) -> {rank: text}; rank 0's text is also under 'main'."""
    by = {}
    for line in stdout.splitlines():
        m = re.match(r"\[\d+,(\d+)\]<stdout>:(.*)$", line)
        if m:
            by.setdefault(int(m.group(1)), []).append(m.group(2))
    out = {r: "\n".join(v) for r, v in by.items()}
    out["main"] = out.get(0, stdout)
    return out


TRAFFIC_RE = re.compile(r"tp: step 1 on rank (\d+): tensor group (\d+) bytes in (\d+) all-reduces \(arithmetic (\d+) "
                        r"in (\d+)\), data group (\d+) bytes in (\d+) calls \(arithmetic (\d+) in (\d+)\)")


def final_fields(out):
    for line in out.splitlines():
        if line.startswith("final: "):
            return dict(kv.split("=", 1) for kv in line[7:].split() if "=" in kv)
    raise SystemExit("tp_bench.py: no 'final:' line in the program's output:\n" + out[-2000:])


def parse_tp(streams):
    """Lesson 11's program: step 1's traffic line, every rank's memory table (MB = 1e6 bytes), the final line."""
    r = {"ranks": {}}
    out = streams["main"]
    m = TRAFFIC_RE.search(out)
    if m:
        v = [int(x) for x in m.groups()]
        r["traffic"] = dict(zip(("rank", "tb", "tc", "tb_prog", "tc_prog", "db", "dc", "db_prog", "dc_prog"), v))
    rank = None
    for line in "\n".join(v for k, v in streams.items() if k != "main").splitlines():
        mm = re.match(r"tp: memory of rank (\d+) ", line)
        if mm:
            rank = int(mm.group(1))
            r["ranks"][rank] = {}
            continue
        if rank is not None:
            mm = re.match(r"\s+(\w+)\s+([0-9.]+) /\s+([0-9.]+)$", line)
            if mm:
                r["ranks"][rank][mm.group(1)] = (round(float(mm.group(2)) * 1e6), round(float(mm.group(3)) * 1e6))
                if mm.group(1) == "total":
                    rank = None
    f = final_fields(out)
    r["images_per_s"] = float(f.get("images_per_s", 0))
    r["params_per_rank"] = int(f.get("params_per_rank", 0))
    return r


def parse_zero(streams):
    """Lesson 09's program: rank 0's table of every rank (kB or MB), live / peak per part, then peak total."""
    r = {"ranks": {}}
    out = streams["main"]
    lines = out.splitlines()
    for i, line in enumerate(lines):
        mm = re.match(r"memory \((kB|MB), per rank; zero=3, (\d+) units, world (\d+)\)", line)
        if not mm:
            continue
        unit = 1e3 if mm.group(1) == "kB" else 1e6
        W = int(mm.group(3))
        r["units"] = int(mm.group(2))
        for rk in range(W):
            r["ranks"][rk] = {}
        for row in lines[i + 2:i + 2 + len(PARTS) + 1]:
            f = row.split()
            if row.strip().startswith("peak total"):
                for rk in range(W):
                    v = round(float(f[2 + rk]) * unit)
                    r["ranks"][rk]["total"] = (v, v)
            elif f and f[0] in PARTS:
                for rk in range(W):
                    r["ranks"][rk][f[0]] = (round(float(f[1 + 2 * rk]) * unit), round(float(f[2 + 2 * rk]) * unit))
        break
    if not r["ranks"]:
        raise SystemExit("tp_bench.py: no memory table in lesson 09's output:\n" + out[-2000:])
    f = final_fields(out)
    r["peak_total"] = round(float(f["peak_mb"]) * 1e6)
    return r


def peak(r):
    """The most any rank held at once during step 1."""
    return max(v["total"][1] for v in r["ranks"].values())


def part_peaks(r):
    """Per part: the largest peak over the ranks (lesson 11's ranks are alike; ZeRO's last rank pads)."""
    return {p: max(v.get(p, (0, 0))[1] for v in r["ranks"].values()) for p in PARTS}


# ---------------------------------------------------------------- sections

def section_traffic(a, R, md, rows):
    W, B = a.traffic_width, a.batch
    md += ["## 1. Bytes per step per rank, by group (pg_traffic against the arithmetic)", "",
           f"ResNet-9 width {W}, global batch {B} (`--batch-size {B}`: {B} images per replica at D = 1, {B // 2} at "
           f"D = 2), step 1, rank 0 (every rank of a group hands the same bytes). Measured: the process group's "
           f"counters (pg_traffic: the buffers handed to the collectives); program: lesson 11's "
           f"tp_expected_traffic; script: this script's formula (the header of bench/tp_bench.py). The run fails "
           f"unless all three agree.", "",
           "| ranks | T x D | tensor group: bytes (calls) | data group: bytes (calls) | total per rank | program "
           "| script |",
           "|---:|---|---:|---:|---:|---|---|"]
    bad = []
    for np_, T in a.traffic_configs:
        D = np_ // T
        r = R.tp(np_, T, W, B, steps=1, memory=False)
        t = r["traffic"]
        tb, tc, db, dc = traffic(W, T, D, B // D)
        prog_ok = (t["tb"], t["tc"], t["db"], t["dc"]) == (t["tb_prog"], t["tc_prog"], t["db_prog"], t["dc_prog"])
        mine_ok = (t["tb"], t["tc"], t["db"], t["dc"]) == (tb, tc, db, dc)
        if not (prog_ok and mine_ok):
            bad.append(f"{np_} ranks, T={T}: measured {t}, script {tb, tc, db, dc}")
        md.append(f"| {np_} | {T} x {D} | {t['tb']:,} ({t['tc']}) | {t['db']:,} ({t['dc']}) | "
                  f"**{(t['tb'] + t['db']) / MiB:.2f} MiB** | {'equal' if prog_ok else 'DIFFERS'} | "
                  f"{'equal' if mine_ok else 'DIFFERS'} |")
        rows.append(dict(section="traffic", impl="tp", world=np_, tp=T, dp=D, width=W, replica_batch=B // D,
                         tensor_bytes=t["tb"], tensor_calls=t["tc"], data_bytes=t["db"], data_calls=t["dc"]))
        print(f"  traffic {np_} ranks T={T}: tensor {t['tb']} data {t['db']}", file=sys.stderr)
    md.append("")
    if bad:
        md.append("**MEASURED BYTES DIFFER FROM THE ARITHMETIC:** " + "; ".join(bad))
        a.failures.append("bytes differ from the arithmetic:\n  " + "\n  ".join(bad))
    tb1 = traffic(W, 2, 1, B)[0]
    md += [f"The tensor group's bytes do not depend on T: every rank all-reduces the whole block output, "
           f"2 n c h w floats per block ({tb1 / MiB:.2f} MiB at n = {B}; a ring all-reduce sends 2 (T - 1) / T of "
           f"it from each rank); "
           f"they grow with the batch, while data parallelism's grow with the parameters. At D = 2 the data group "
           f"moves the rank's own parameters (1/T of the blocks) and the BN statistics.", ""]


def check_states(r, W, T):
    """Model states measured against the arithmetic: equal to the printed kB (the table's resolution)."""
    got = {p: r["ranks"][0][p][0] for p in ("params", "grads", "optimizer")}
    want = states_arith(W, T)
    return all(abs(got[p] - want[p]) <= 500 for p in got), got, want  # printed to the kB: +-500 bytes


def section_memory(a, R, md, rows, mem_points):
    B = a.batch
    md += ["## 2. Peak memory per rank by part (the kit's counters), TP against ZeRO-3", "",
           f"{B} images per replica (TP: `--batch-size {B}` on T ranks; ZeRO-3: {B} per rank, lesson 09's default "
           f"units), step 1, MiB (2^20 bytes). The largest peak over the ranks; `other` in lesson 11 is the blocks' "
           f"conv "
           f"scratch (tp.c block_create: MEM_OTHER), which lesson 09 counts inside each unit's arena (activations). "
           f"states = params + grads + optimizer; arith: the model states by the header's arithmetic (params "
           f"with BN running statistics) and, for TP, activations = TP = 1's minus the split's saving.", "",
           "| width | run | ranks | params | grads | optimizer | activations | comm | other | **peak** | states: arith "
           "| activations: arith |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    bad = []
    for W in a.widths:
        act1 = None
        for T in (1, 2, 4):
            r = R.tp(T, T, W, B, label=f"memory w{W} tp{T}")
            pp = part_peaks(r)
            ok, got, want = check_states(r, W, T)
            act = r["ranks"][0]["activations"][0]
            if T == 1:
                act1 = act
            act_want = act1 - act_saving(W, T, B)
            act_ok = abs(act - act_want) <= 1000  # two printed values, each rounded to the kB
            if not ok or not act_ok:
                bad.append(f"width {W} T={T}: states {got} vs {want}; activations {act} vs {act_want}")
            mem_points.append(("tp", T, T, W, peak(r)))
            md.append(f"| {W} | TP = {T} | {T} | " + " | ".join(f"{pp[p] / MiB:.1f}" for p in PARTS) +
                      f" | **{peak(r) / MiB:.1f}** | {'equal' if ok else 'DIFFERS'} | "
                      f"{'equal' if act_ok else 'DIFFERS'} ({act_want / MiB:.1f}) |")
            rows.append(dict(section="memory", impl="tp", world=T, tp=T, dp=1, width=W, replica_batch=B,
                             peak_bytes=peak(r), **{p: pp[p] for p in PARTS}))
            print(f"  memory w{W} TP={T}: peak {peak(r) / MiB:.1f} MiB", file=sys.stderr)
        for np_, lb in a.zero_runs:
            r = R.zero3(np_, W, lb, label=f"memory w{W} zero3 x{np_} b{lb}")
            pp = part_peaks(r)
            mem_points.append((zero_key(lb, B), np_, 1, W, peak(r)))
            md.append(f"| {W} | ZeRO-3, {r['units']} units, {lb} per rank | {np_} | " +
                      " | ".join(f"{pp[p] / MiB:.1f}" for p in PARTS) + f" | **{peak(r) / MiB:.1f}** | lesson 09's | |")
            rows.append(dict(section="memory", impl=zero_key(lb, B), world=np_, tp=1, dp=np_, width=W,
                             replica_batch=lb, peak_bytes=peak(r), **{p: pp[p] for p in PARTS}))
            print(f"  memory w{W} ZeRO-3 x{np_} b{lb}: peak {peak(r) / MiB:.1f} MiB", file=sys.stderr)
    md.append("")
    if bad:
        md.append("**MEASURED MEMORY DIFFERS FROM THE ARITHMETIC:** " + "; ".join(bad))
        a.failures.append("memory differs from the arithmetic:\n  " + "\n  ".join(bad))


def zero_key(local_batch, batch):
    """ZeRO-3 at the replica batch of TP ('zero3'), or at TP's global batch spread over the ranks ('zero3-global')."""
    return "zero3" if local_batch == batch else "zero3-global"


def quad_fit(points):
    """y = a W^2 + b W + c through three (W, y) points (or a line through two)."""
    pts = sorted(points)[-3:]
    if len(pts) < 3:
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        s = (y1 - y0) / (x1 - x0) if x1 != x0 else 0
        return lambda w: y0 + s * (w - x0)
    (x0, y0), (x1, y1), (x2, y2) = pts
    d = (x0 - x1) * (x0 - x2) * (x1 - x2)
    A = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / d
    Bc = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / d
    C = (x1 * x2 * (x1 - x2) * y0 + x2 * x0 * (x2 - x0) * y1 + x0 * x1 * (x0 - x1) * y2) / d
    return lambda w: A * w * w + Bc * w + C


def section_budget(a, R, md, rows, mem_points):
    B = a.batch
    budgets = [int(float(x) * MiB) for x in a.budgets_mib.split(",") if x]
    md += ["## 3. The largest ResNet-9 width that fits a per-rank budget", "",
           f"{B} images per replica, peak of step 1 (as section 2). Widths keep the blocks' channels (2W, 8W) "
           f"divisible by T: even widths for TP (every width for ZeRO-3). A quadratic in W through section 2's "
           f"measured peaks predicts the width; then measured runs step from it until the last width that fits and "
           f"the next that does not are both measured (the `runs` column).", ""]
    confs = [("tp", T, T) for T in (1, 2, 4)] + [(zero_key(lb, B), n, 1) for n, lb in a.zero_runs]
    measured = {}
    for impl, np_, T, W, pk in mem_points:
        measured[(impl, np_, W)] = pk
    for budget in budgets:
        md += [f"### Budget {budget / MiB:.0f} MiB per rank", "",
               "| run | ranks | predicted width | **largest width that fits** (peak MiB) | next width (peak MiB) | "
               "params (M, whole model) | params per rank (M) | runs |",
               "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for impl, np_, T in confs:
            step = 2 if impl == "tp" else 1
            # The fit: section 2's widths (spread out; the probes of another budget sit too close together to
            # extrapolate from).
            pts = [(w, pk) for (i, n, w), pk in measured.items() if i == impl and n == np_ and w in a.widths]
            fit = quad_fit(pts)
            w = step
            while fit(w + step) <= budget and w < 4096:
                w += step
            pred = w

            def meas(width):
                key = (impl, np_, width)
                if key not in measured:
                    r = (R.tp(np_, T, width, B, label=f"budget {impl} x{np_}") if impl == "tp"
                         else R.zero3(np_, width, B if impl == "zero3" else B // np_, label=f"budget {impl} x{np_}"))
                    measured[key] = peak(r)
                    mem_points.append((impl, np_, T, width, measured[key]))
                    print(f"  budget {budget / MiB:.0f} {impl} x{np_} w{width}: {measured[key] / MiB:.1f} MiB",
                          file=sys.stderr)
                return measured[key]
            n0 = R.runs
            # From the prediction, steps that double until the budget is crossed, then bisection: lo fits, hi not.
            lo, hi, s = None, None, step
            if meas(pred) <= budget:
                lo = pred
                while meas(lo + s) <= budget:
                    lo, s = lo + s, 2 * s
                hi = lo + s
            else:
                hi = pred
                while hi - s >= step and meas(hi - s) > budget:
                    hi, s = hi - s, 2 * s
                lo = max(step, hi - s)
            while hi - lo > step:
                mid = lo + (hi - lo) // (2 * step) * step
                if meas(mid) <= budget:
                    lo = mid
                else:
                    hi = mid
            w = lo
            fits, nxt = w, w + step
            pf, pn = meas(fits), meas(nxt)
            name = (f"TP = {T}" if impl == "tp" else f"ZeRO-3, {B} per rank" if impl == "zero3"
                    else f"ZeRO-3, {B // np_} per rank (global {B})")
            md.append(f"| {name} | {np_} | {pred} | **{fits}** ({pf / MiB:.1f}) | {nxt} ({pn / MiB:.1f}) | "
                      f"{whole_params(fits) / 1e6:.2f} | "
                      f"{(local_params(fits, T) if impl == 'tp' else whole_params(fits) / np_) / 1e6:.2f} | "
                      f"{R.runs - n0} |")
            rows.append(dict(section="budget", impl=impl, world=np_, tp=T, dp=np_ // T, width=fits,
                             replica_batch=B if impl != "zero3-global" else B // np_,
                             peak_bytes=pf, budget_bytes=budget, predicted_width=pred))
        md.append("")


def trace_split(path, skip=1):
    """A merged --trace file (Chrome's format, one pid per rank) -> per rank: the mean step time after the first
    `skip` steps (set-up and first touch stay out), and the share of it in collectives (spans of category 'comm',
    which include the wait for the slower ranks)."""
    with open(path) as f:
        d = json.load(f)
    ev = d["traceEvents"] if isinstance(d, dict) else d
    out = {}
    for pid in sorted({e.get("pid") for e in ev if e.get("ph") == "X"}):
        steps = sorted((e["ts"], e["dur"]) for e in ev if e.get("pid") == pid and e.get("ph") == "X"
                       and re.fullmatch(r"step \d+", e.get("name", "")))[skip:]
        if not steps:
            continue
        t0, t1 = steps[0][0], steps[-1][0] + steps[-1][1]
        comm = sum(e["dur"] for e in ev if e.get("pid") == pid and e.get("ph") == "X" and e.get("cat") == "comm"
                   and t0 <= e["ts"] < t1)
        out[pid] = ((t1 - t0) / len(steps) / 1e6, comm / (t1 - t0))
    return out


def section_speed(a, R, md, rows):
    B = a.speed_batch
    md += ["## 4. Speed on this CPU: tensor against data parallelism", "",
           f"Global batch {B}, `--stop-at {a.speed_steps}` with `--trace`: the step time is rank 0's mean over steps "
           f"2-{a.speed_steps} from the timeline (step 1, with its first touches, left out); images/s = {B} / step "
           f"time. In collectives: the share of the step each rank spent in the process group's collectives (f and "
           f"g of the tensor group, the data group's average and BN sums), waits for the slower ranks included; "
           f"the mean over the ranks. OMP threads per rank = cores / ranks (at least 1); 4 ranks on "
           f"{os.cpu_count()} cores are oversubscribed, so each gets half a core or less.", "",
           "| width | run | ranks | T x D | step (s) | images/s | against 1 rank | in collectives |",
           "|---:|---|---:|---|---:|---:|---:|---:|"]
    for W in a.speed_widths:
        base = None
        for np_, T, name in ((1, 1, "one rank"), (2, 1, "data parallel"), (2, 2, "TP = 2"), (4, 1, "data parallel"),
                             (4, 2, "TP 2 x DP 2"), (4, 4, "TP = 4")):
            D = np_ // T
            tdir = tempfile.mkdtemp(prefix="tp_bench_trace.")
            try:
                argv = [a.train, "--dataset", "synthetic", "--model", "resnet9", "--width", str(W), "--batch-size",
                        str(B), "--tp", str(T), "--stop-at", str(a.speed_steps),
                        "--trace", os.path.join(tdir, "t.json")]
                streams, rec = R.launch(np_, argv, label=f"speed w{W} {np_}x{T}")
                split = trace_split(os.path.join(tdir, "t.json"))
            finally:
                shutil.rmtree(tdir, ignore_errors=True)
            step_s = split[0][0]
            comm = sum(c for _, c in split.values()) / len(split)
            ips = B / step_s
            if base is None:
                base = ips
            md.append(f"| {W} | {name} | {np_} | {T} x {D} | {step_s:.3f} | **{ips:.1f}** | {ips / base:.2f}x | "
                      f"{100 * comm:.0f} % |")
            rows.append(dict(section="speed", impl="tp", world=np_, tp=T, dp=D, width=W, replica_batch=B // D,
                             images_per_s=round(ips, 2), comm_share=round(comm, 4), other_share=rec["other_share"]))
            print(f"  speed w{W} {np_} ranks T={T}: {ips:.1f} images/s, {100 * comm:.0f} % in collectives",
                  file=sys.stderr)
    md.append("")


# ---------------------------------------------------------------- the plot

def plot(csv_path, png, budgets_mib):
    """Peak memory per rank against width, one line per run, and the budgets (those of the CSV's budget rows)."""
    pts, budgets, batch = {}, set(), ""
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            if row["section"] == "budget":
                budgets.add(int(row["budget_bytes"]) / MiB)
            if row["section"] not in ("memory", "budget_probe"):
                continue
            if row["impl"] == "tp":
                batch = row["replica_batch"]
            key = (f"TP = {row['tp']}" if row["impl"] == "tp" else
                   f"ZeRO-3, {row['world']} ranks, {row['replica_batch']} per rank")
            pts.setdefault(key, {})[int(row["width"])] = int(row["peak_bytes"]) / MiB
    if not pts:
        print("tp_bench.py: nothing to plot in " + csv_path, file=sys.stderr)
        return 1
    if not shutil.which("gnuplot"):
        print("tp_bench.py: no PNG: gnuplot is not installed (apt-get install gnuplot-nox)", file=sys.stderr)
        return 1
    data = png + ".dat"
    names = sorted(pts)
    with open(data, "w") as f:
        for name in names:
            f.write(f"# {name}\n")
            for w in sorted(pts[name]):
                f.write(f"{w} {pts[name][w]:.3f}\n")
            f.write("\n\n")
    terminal = "pngcairo" if subprocess.run(["gnuplot", "-e", "set terminal pngcairo"],
                                            capture_output=True).returncode == 0 else "png"
    L = [f"set terminal {terminal} size 900,560 font 'DejaVu Sans,10'", f"set output '{png}'",
         f"set title 'Lesson 11: peak memory per rank, ResNet-9, TP at {batch} images per replica "
         f"(kit counters, step 1)'",
         "set xlabel 'ResNet-9 width'", "set ylabel 'MiB per rank'", "set grid", "set key top left opaque box"]
    plots = [f"'{data}' index {i} using 1:2 with linespoints pt 7 title '{n}'" for i, n in enumerate(names)]
    plots += [f"{b} with lines dt 2 lw 2 lc rgb 'black' title 'budget {b:g} MiB'"
              for b in sorted(budgets or budgets_mib)]
    L.append("plot " + ", ".join(plots))
    p = subprocess.run(["gnuplot"], input="\n".join(L) + "\n", text=True, capture_output=True)
    os.unlink(data)
    if p.returncode != 0:
        raise SystemExit(f"tp_bench.py: gnuplot failed:\n{p.stderr}")
    print(f"wrote {png}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default=os.path.join(ROOT, "build/solutions/11-tensor/train"))
    ap.add_argument("--zero-train", default=os.path.join(ROOT, "build/solutions/09-zero/train"))
    ap.add_argument("--sections", default="traffic,memory,budget,speed")
    ap.add_argument("--batch", type=int, default=32, help="images per replica (sections 1-3)")
    ap.add_argument("--traffic-width", type=int, default=64)
    ap.add_argument("--widths", default="32,64,96,128", help="section 2's widths (even)")
    ap.add_argument("--zero-runs", default="2:32,4:32,4:8", help="ZeRO-3's ranks:images per rank (sections 2-3)")
    ap.add_argument("--budgets-mib", default="512,1024")
    ap.add_argument("--speed-widths", default="8,32,64")
    ap.add_argument("--speed-batch", type=int, default=32)
    ap.add_argument("--speed-steps", type=int, default=5)
    ap.add_argument("--md", default=os.path.join(HERE, "results-tp.md"))
    ap.add_argument("--csv", default=os.path.join(HERE, "results-tp.csv"))
    ap.add_argument("--png", default=os.path.join(HERE, "figures", "tp-memory.png"))
    ap.add_argument("--plot", action="store_true", help="draw --png from --csv (after the sections, or alone with "
                                                         "--sections '')")
    ap.add_argument("--quick", action="store_true", help="tiny widths and few runs: the harness only")
    a = ap.parse_args()
    if a.quick:
        a.traffic_width, a.widths, a.zero_runs, a.budgets_mib = 8, "8,12,16", "2:32,2:16", "45"
        a.speed_widths, a.speed_steps = "8", 2
    a.widths = [int(x) for x in a.widths.split(",") if x]
    a.zero_runs = [tuple(int(y) for y in x.split(":")) for x in a.zero_runs.split(",") if x]
    a.speed_widths = [int(x) for x in a.speed_widths.split(",") if x]
    a.traffic_configs = [(1, 1), (2, 2), (4, 4), (4, 2), (2, 1)]
    sections = [s for s in a.sections.split(",") if s]
    for prog in ([a.train] if sections else []) + ([a.zero_train] if {"memory", "budget"} & set(sections) else []):
        if not os.access(prog, os.X_OK):
            raise SystemExit(f"tp_bench.py: {prog} is not built (make {os.path.relpath(prog, ROOT)})")
    a.failures = []  # a measured figure against the arithmetic that differs: reported, and the exit status 1
    R = Runner(a)
    md, rows, mem_points = [], [], []
    share = cpu_share.CpuShare()
    if "traffic" in sections:
        section_traffic(a, R, md, rows)
    if "memory" in sections or "budget" in sections:
        section_memory(a, R, md, rows, mem_points)
    if "budget" in sections:
        n_before = len(mem_points)
        section_budget(a, R, md, rows, mem_points)
        for impl, np_, T, W, pk in mem_points[n_before:]:
            rows.append(dict(section="budget_probe", impl=impl, world=np_, tp=T, dp=np_ // T, width=W,
                             replica_batch=a.batch if impl != "zero3-global" else a.batch // np_, peak_bytes=pk))
    if "speed" in sections:
        section_speed(a, R, md, rows)
    whole = share.stop("the whole run")
    if sections:
        model, cores = cpu_share.cpu_model()
        now = datetime.datetime.now(datetime.timezone.utc)
        head = ["# Lesson 11: tensor parallelism, bytes, memory and speed per rank", "",
                f"Machine: {model}, {cores} cores; {now:%Y-%m-%d %H:%M} UTC; "
                f"`python3 bench/tp_bench.py {' '.join(sys.argv[1:])}` ({R.runs} program runs, "
                f"{whole['wall_s'] / 60:.1f} min). Bytes and memory do not depend on the load; images/s do."]
        head += [""] + cpu_share.report_lines(R.shares, "make bench-tp") + [""]
        with open(a.md, "w") as f:
            f.write("\n".join(head + md + ["## The commands", "", "Each run, as the script made it (OMP_NUM_THREADS = "
                                            "cores / ranks, LAUNCH_ARGS=--bind-to none):", "", "```"] +
                              sorted(set(R.log)) + ["```", ""]))
        cols = ["section", "impl", "world", "tp", "dp", "width", "replica_batch", "tensor_bytes", "tensor_calls",
                "data_bytes", "data_calls", "peak_bytes"] + list(PARTS) + ["budget_bytes", "predicted_width",
                                                                          "images_per_s", "comm_share", "other_share"]
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            for r in rows:
                w.writerow(r)
        print(f"wrote {a.md} and {a.csv}", file=sys.stderr)
    rc = plot(a.csv, a.png, [float(x) for x in a.budgets_mib.split(",") if x]) if a.plot else 0
    for f in a.failures:
        print("tp_bench.py: " + f, file=sys.stderr)
    return 1 if a.failures else rc


if __name__ == "__main__":
    sys.exit(main())
