#!/usr/bin/env python3
"""bench/zero_bench.py: lesson 09 measured on the kit (`make bench-zero`), beside the arithmetic.

    python3 bench/zero_bench.py --kit-bin build/bench/zero_kit --probe build/bench/bench_zeromem
        [--md bench/results-zero.md] [--csv bench/results-zero-memory-kit.csv] [--torch-csv CSV] [--quick]

Every kit number comes from bench/zero_kit.c (lesson 09's solution, zero.c, linked in) run under
scripts/launch.sh: the kit's allocation counters (mem_stats: every device_alloc, tagged by part) over one step,
the process group's traffic counters (pg_traffic) over the same step, and the mean of a few timed steps.
The arithmetic is bench/zero_memory.py's (imported: the same units, padding and windows, the kit's arena probed
by bench/bench_zeromem.c). Sections:

  1 memory   per rank by part, stages 0-3, worlds 1, 2, 4, 8 (more ranks than cores: oversubscribed, which
             memory does not care about), resnet9 and fmnist; measured / arithmetic per part
  2 budget   the largest resnet9 width whose MEASURED peak (peak_total over one step) fits a per-rank budget,
             per stage, world 4, beside the arithmetic's answer
  3 traffic  bytes per step per rank against DDP (pg_traffic: the buffers handed to the collectives; and the
             ring algorithms' count of what goes on each rank's wire, zero.c's), and step time on 2 ranks
  4 recompute  peak activation bytes and step time: no recomputation, sqrt(L) and L units recomputed
  5 peers    PyTorch's rows (bench/torch_zero.py's CSV, if given) beside the kit's at the same model and batch
  6 overlap  stage 2 with each unit's reduce-scatter overlapped with the previous unit's backward (the default)
             and without (KIT_OVERLAP=0): step time, exposed communication, and the gradients' peak it costs

The CSV (bench/zero_memory.py's columns, source=kit) is what `make plot-memory` draws on the arithmetic's bars;
extra columns: impl (kit), images_per_s, oversubscribed, as bench/torch_zero.py's.
"""
import argparse
import csv
import datetime
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import cpu_share  # noqa: E402  (bench/cpu_share.py)
import zero_memory as zm  # noqa: E402  (bench/zero_memory.py)

PARTS = ("params", "grads", "optimizer", "activations", "comm", "other")
COLUMNS = zm.CSV_COLUMNS + ("impl", "images_per_s", "oversubscribed")
MiB = 2**20
RECOMPUTE_NOTE = ("Cutting the model into units costs activation memory by itself: each unit is a kit stage model with its own arena (its conv scratch, its input and input-gradient copies), so the default 11 units hold about twice the activations of 1 unit. Recomputation then keeps only the boundaries plus one unit's arena; with few units that arena is large, with many the boundaries add up: which of sqrt(L) and L units holds less depends on the arenas' sizes (compare the two rows).")




class Runner:
    def __init__(self, kit_bin):
        self.kit_bin, self.shares, self.runs, self.memo = kit_bin, [], 0, {}

    def run(self, world, model, width, batch, stage, units=0, recompute=False, steps=0, label="", overlap=True):
        cmd = [os.path.join(ROOT, "scripts", "launch.sh"), str(world), self.kit_bin, "--model", model,
               "--width", str(width), "--batch", str(batch), "--zero", str(stage), "--units", str(units),
               "--steps", str(steps)] + (["--recompute"] if recompute else [])
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // min(world, os.cpu_count() or 2))),
                   KIT_OVERLAP="1" if overlap else "0")
        share = cpu_share.CpuShare()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if label:
            self.shares.append(share.stop(label))
        self.runs += 1
        rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        if p.returncode != 0 or not rows:
            raise SystemExit(f"zero_bench.py: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
        r = rows[-1]
        if overlap:
            self.memo[(world, model, width, batch, stage, units, recompute, steps)] = r
        print(f"  world {world} {model} w{r['width']} b{batch} zero {stage} units {r['units']}"
              f"{' recompute' if recompute else ''}: peak {r['peak_total'] / MiB:.2f} MiB"
              + (f", {r['step_s'] * 1e3:.0f} ms/step" if steps else ""), file=sys.stderr)
        return r


def kit_rows(r, oversub):
    """One measured run -> CSV rows (source=kit): when=peak (during step 1) and when=between (live after it)."""
    out = []
    ips = r["world"] * r["local_batch"] / r["step_s"] if r["steps"] else ""
    for when, key in (("peak", "peak"), ("between", "live")):
        for part in PARTS + ("total",):
            b = r["peak_total"] if (part, when) == ("total", "peak") else (
                sum(r[key].values()) if part == "total" else r[key][part])
            out.append({"model": r["model"], "width": r["width"], "local_batch": r["local_batch"],
                        "units": r["units"], "stage": r["stage"], "world": r["world"], "part": part, "when": when,
                        "bytes": int(b), "source": "kit", "impl": "kit" + ("+recompute" if r["recompute"] else ""),
                        "images_per_s": round(ips, 2) if ips else "", "oversubscribed": int(oversub)})
    return out


# ---------------------------------------------------------------- 1: memory by part

def section_memory(a, R, probe, csv_rows):
    L = ["## 1. Per-rank memory by part, measured (the kit's allocation counters) beside the arithmetic", "",
         "MiB per rank, the largest rank, at the PEAK of one step (mem_stats after mem_stats_reset_peak just "
         "before it). `kit` is measured, `arith` bench/zero_memory.py's prediction; `k/a` their ratio for the "
         "whole peak. Worlds above the " + str(os.cpu_count()) + " cores are OVERSUBSCRIBED (memory does not "
         "care). `other` is what the kit tags MEM_OTHER (the loader's staged batches on a GPU): nothing of "
         "zero.c's, whose update takes the weight decay from the views' ranges, with no per-float mask.", ""]
    for model, batch in a.models:
        width = zm.DEFAULT_WIDTH[model]
        arows, units, cuts = zm.rows_for(model, width, batch, a.worlds, probe)
        arith = {(r["stage"], r["world"], r["part"], r["when"]): r["bytes"] for r in arows}
        L += [f"### {model} (width {width}, local batch {batch}, {len(units)} units)", "",
              "| stage | world | params kit / arith | grads kit / arith | optimizer kit / arith | activations "
              "kit / arith | comm kit / arith | other kit | **peak kit / arith** | k/a | between steps kit / arith |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for stage in range(4):
            for world in a.worlds:
                r = R.run(world, model, width, batch, stage)
                oversub = world > os.cpu_count()
                csv_rows += kit_rows(r, oversub)
                cells = [f"{r['peak'][p] / MiB:.2f} / {arith[(stage, world, p, 'peak')] / MiB:.2f}"
                         for p in zm.PARTS]
                ap = arith[(stage, world, "total", "peak")]
                between = sum(r["live"].values())
                L.append(f"| {zm.STAGE_NAMES[stage]} | {world}{' (over)' if oversub else ''} | " + " | ".join(cells)
                         + f" | {r['peak']['other'] / MiB:.2f} | **{r['peak_total'] / MiB:.2f} / {ap / MiB:.2f}** | "
                         f"{r['peak_total'] / ap:.3f} | {between / MiB:.2f} / "
                         f"{arith[(stage, world, 'total', 'between')] / MiB:.2f} |")
        L.append("")
    L += ["Where kit and arithmetic differ (the parts are exact otherwise): `comm`: zero.c allocates its "
          "collective scratch (the largest unit's padded length) at every stage and world, even where no unit "
          "needs padding or the stage all-reduces in place (DDP), and at stages 1-3 a shard-sized `shard_work` "
          "besides; the arithmetic counts the scratch only where a unit's length does not divide by the world. "
          "This is the implementation's, not the method's: a few MiB at "
          "width 64. `activations` at worlds 1-2 (below the arithmetic): the kit sizes each unit's conv scratch "
          "for the cores the process may use (omp_get_num_procs): mpirun binds each of 1-2 ranks to one core, "
          "so the scratch is planned for 1 thread; with more ranks than cores it binds none (2 cores visible), "
          "as in bench_zeromem's probe run outside mpirun, and kit and arithmetic agree "
          "but for zero.c's own input buffer (the local batch's images), which the arithmetic does not count.", ""]
    return L


# ---------------------------------------------------------------- 2: the largest width per budget

def measured_largest(R, stage, world, budget, batch, start, w_max=1024):
    """The largest width whose measured peak fits, searched from the arithmetic's answer outwards."""
    memo = {}

    def peak(w):
        if w not in memo:
            memo[w] = R.run(world, "resnet9", w, batch, stage)["peak_total"]
        return memo[w]

    w = max(1, start)
    if peak(w) <= budget:  # walk up by doubling steps until it does not fit
        good, step = w, 2
        bad = min(w_max + 1, w + step)
        while bad <= w_max and peak(bad) <= budget:
            good, step = bad, step * 2
            bad = min(w_max + 1, good + step)
    else:  # walk down
        bad, step = w, 2
        good = max(0, w - step)
        while good > 0 and peak(good) > budget:
            bad, step = good, step * 2
            good = max(0, bad - step)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if peak(mid) <= budget else (good, mid)
    return good, (peak(good) if good else 0), len(memo)


def section_budget(a, R, probe):
    L = ["## 2. The largest resnet9 that fits a per-rank budget, measured", "",
         f"World {a.budget_world}, local batch {a.budget_batch}; the width grows until the MEASURED peak of one "
         "step (mem_stats' peak_total, every part) exceeds the budget; beside it bench/zero_memory.py's answer "
         "for the same budget (its arithmetic with the kit's arena). Parameters grow as width^2.", "",
         "| budget (MiB) | stage | arith: width (M params, peak MiB) | **kit measured: width (M params, peak MiB)** "
         "| runs |", "|---:|---|---:|---:|---:|"]
    out = []
    for budget_mib in a.budgets:
        budget = budget_mib * MiB
        for stage in range(4):
            wa, pa = zm.largest_width("resnet9", stage, a.budget_world, budget, a.budget_batch, probe)
            wk, pk, n = measured_largest(R, stage, a.budget_world, budget, a.budget_batch, wa)
            pa_n = sum(u["params"] for u in zm.units_of(zm.layer_table("resnet9", wa), zm.default_cuts(zm.layer_table("resnet9", wa))))
            pk_n = sum(u["params"] for u in zm.units_of(zm.layer_table("resnet9", wk), zm.default_cuts(zm.layer_table("resnet9", wk))))
            L.append(f"| {budget_mib} | {zm.STAGE_NAMES[stage]} | {wa} ({pa_n / 1e6:.2f}, {pa / MiB:.1f}) | "
                     f"**{wk} ({pk_n / 1e6:.2f}, {pk / MiB:.1f})** | {n} |")
            out.append((budget_mib, stage, wa, wk))
    L += ["", "The measured answer sits below the arithmetic's because the kit's peak also holds zero.c's "
          "collective scratch (the largest unit's padded length at every stage: that unit is 72 % of resnet9's "
          "parameters, about 30 MiB near width 80) and at stages 1-3 `shard_work` (section "
          "1's gaps). The activations dominate at this batch (the per-unit arenas, their conv scratch above "
          "all), which is why sharding the model states buys a few widths, not a multiple: section 4's "
          "recomputation is the other half of the story.", ""]
    return L


# ---------------------------------------------------------------- 3: bytes and time per step

def ring_arith(stage, world, n, padded):
    """Bytes on each rank's wire per step by the ring algorithms: all-reduce 2 (W-1)/W of its buffer,
    reduce-scatter and all-gather (W-1)/W each. Stage 1 here all-reduces the grads then all-gathers the params."""
    f = (world - 1) / world * 4
    return {0: 2 * f * n, 1: 2 * f * n + f * padded, 2: 2 * f * padded, 3: 3 * f * padded}[stage]


def section_traffic(a, R, csv_rows):
    L = ["## 3. Bytes per step per rank against DDP, and step time", "",
         "`handed`: the bytes lesson 09's step gave the process group's collectives on rank 0 (pg_traffic: each "
         "call's input buffer, including the BN buffers' broadcast); `ring`: what the ring algorithms put on each "
         "rank's wire for the same calls (zero.c's count); `arith`: the ring count from the closed form "
         "(all-reduce 2(W-1)/W, reduce-scatter and all-gather (W-1)/W of the padded buffer each). Stage 1 here "
         "all-reduces the gradients and all-gathers the parameters: 1.5x DDP's wire bytes (ZeRO's paper "
         "reduce-scatters instead, which is stage 2's 1x); stage 3 gathers the parameters twice (forward and "
         "backward): 1.5x. Memory runs of section 1, resnet9 width 64 (bytes do not depend on the batch).", "",
         "| stage | world | handed MB | ring MB | arith ring MB | ring / DDP | calls |", "|---|---:|---:|---:|---:|---:|---:|"]
    for world in [w for w in a.worlds if w > 1]:
        base = None
        for stage in range(4):
            r = a.memo_runs[("resnet9", stage, world)]
            n = r["n_params"]
            padded = sum(world * zm.shard(u["params"], world) for u in a.units_resnet9)
            base = base or r["ring_bytes_per_step"]
            L.append(f"| {zm.STAGE_NAMES[stage]} | {world} | {r['coll_bytes_per_step'] / 1e6:.2f} | "
                     f"{r['ring_bytes_per_step'] / 1e6:.2f} | {ring_arith(stage, world, n, padded) / 1e6:.2f} | "
                     f"{r['ring_bytes_per_step'] / base:.2f} | {r['coll_calls_per_step']} |")
    L += ["", f"Step time, 2 ranks, resnet9 width {a.time_width}, local batch {a.time_batch}, {a.time_steps} timed "
          "steps after the measured one (mean, rank 0, barrier to barrier; compute and comm: zero.c's split). "
          "The machine is shared: see the other-work line at the top.", "",
          "| stage | ms / step | compute ms | comm ms | images/s | handed MB / step |", "|---|---:|---:|---:|---:|---:|"]
    for stage in range(4):
        r = R.run(2, "resnet9", a.time_width, a.time_batch, stage, steps=a.time_steps, label=f"time zero {stage}")
        csv_rows += kit_rows(r, False)
        L.append(f"| {zm.STAGE_NAMES[stage]} | {r['step_s'] * 1e3:.0f} | {r['compute_s'] * 1e3:.0f} | "
                 f"{r['comm_s'] * 1e3:.0f} | {2 * a.time_batch / r['step_s']:.1f} | "
                 f"{r['coll_bytes_per_step'] / 1e6:.2f} |")
    return L + [""]


# ---------------------------------------------------------------- 4: recomputation

def section_recompute(a, R):
    L_units = len(a.units_time)
    root = max(1, round(math.sqrt(L_units)))
    L = ["## 4. Recomputation: activation memory against time", "",
         f"1 rank, stage 0, resnet9 width {a.time_width}, local batch {a.time_batch}, {a.time_steps} timed steps. "
         f"L = {L_units} units (the default cut: one per layer with parameters; a residual block cannot be cut). "
         "`activations peak` is MEM_ACTS's peak over one step: with recomputation every unit's arena is "
         "released after its forward (only its output is kept, in a boundary buffer tagged MEM_ACTS too) and "
         "brought back for its backward, so the peak is the boundaries plus the largest unit's arena.", "",
         "| run | units | activations peak MiB | total peak MiB | ms / step | vs no recompute |",
         "|---|---:|---:|---:|---:|---:|"]
    base = None
    for name, units, rec in (("no recomputation", L_units, False), ("no recomputation, 1 unit", 1, False),
                             (f"recompute, sqrt(L) = {root} units", root, True),
                             (f"recompute, L = {L_units} units", L_units, True)):
        r = R.run(1, "resnet9", a.time_width, a.time_batch, 0, units=units, recompute=rec, steps=a.time_steps,
                  label=f"recompute {units} {int(rec)}")
        base = base or r
        L.append(f"| {name} | {r['units']} | {r['peak']['activations'] / MiB:.2f} | {r['peak_total'] / MiB:.2f} | "
                 f"{r['step_s'] * 1e3:.0f} | {r['step_s'] / base['step_s']:.2f}x time, "
                 f"{r['peak']['activations'] / base['peak']['activations']:.2f}x acts |")
    return L + ["", RECOMPUTE_NOTE, ""]


# ---------------------------------------------------------------- 5: PyTorch beside

def section_peers(a, R, csv_rows):
    L = ["## 5. Against PyTorch on the same machine (gloo, CPU), world 2", ""]
    if not a.torch_csv or not os.path.exists(a.torch_csv):
        return L + ["No PyTorch rows: run `python3 bench/torch_zero.py --worlds 2 --csv CSV` and pass "
                    "`--torch-csv CSV`.", ""]
    with open(a.torch_csv, newline="") as f:
        trows = [r for r in csv.DictReader(f) if r["world"] == "2"]
    L += [f"PyTorch: {a.torch_csv} (bench/torch_zero.py; MiB per rank, the largest rank: tensors held after "
          "backward, peak RSS = VmHWM of the whole process, interpreter and torch included). Kit: bench/zero_kit.c "
          "at the same model, width and local batch, 2 ranks, one thread each: the counters' parts at the step's "
          "peak, and VmHWM. images/s: both sides' timed steps on this shared machine.", "",
          "| model | batch | impl | stage | params | grads | optimizer | peak RSS | images/s |",
          "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    seen = {}
    for r in trows:
        seen.setdefault((r["model"], int(r["local_batch"]), r["impl"], int(r["stage"])), {})[r["part"]] = r
    for (model, batch, impl, stage), parts in sorted(seen.items(), key=lambda k: (k[0][0], k[0][3], k[0][2])):
        g = lambda p: float(parts[p]["bytes"]) / MiB if p in parts else float("nan")  # noqa: E731
        ips = next(iter(parts.values()))["images_per_s"]
        L.append(f"| {model} | {batch} | torch {impl} | {stage} | {g('params'):.2f} | {g('grads'):.2f} | "
                 f"{g('optimizer'):.2f} | {g('peak_rss'):.1f} | {ips} |")
    for model, batch in sorted({(k[0], k[1]) for k in seen}):
        for stage in range(4):
            r = R.run(2, model, zm.DEFAULT_WIDTH[model], batch, stage, steps=a.peer_steps,
                      label=f"peer {model} zero {stage}")
            csv_rows += kit_rows(r, False)
            L.append(f"| {model} | {batch} | **kit** zero {stage} | {stage} | {r['peak']['params'] / MiB:.2f} | "
                     f"{r['peak']['grads'] / MiB:.2f} | {r['peak']['optimizer'] / MiB:.2f} | "
                     f"{r['peak_rss'] / MiB:.1f} | {2 * batch / r['step_s']:.1f} |")
    L += ["", "PyTorch's params/grads/optimizer are the tensors held after backward (its grads then are the full "
          "ones for DDP/ZeRO-1, a shard for FSDP); the kit's are the step's peaks (stage 2-3: shard + one unit's "
          "window). ZeroRedundancyOptimizer shards whole tensors (uneven), the kit and FSDP flat slices.", ""]
    return L


# ---------------------------------------------------------------- 6: the overlap of stage 2's reduce-scatter

def section_overlap(a, R):
    L = ["## 6. Stage 2: the reduce-scatter overlapped with backward, against memory", "",
         "Stage 2 starts unit u's gradient reduce-scatter when unit u's backward ends and waits for it after unit "
         "u-1's backward, which runs meanwhile (`overlap`), or waits at once (`KIT_OVERLAP=0`). `exposed comm`: "
         "zero.c's comm_seconds, the time the step spent in collectives' starts and waits (what the overlap can "
         "hide; stage 2's parameter all-gathers after backward are in it either way); `compute`: the rest of the "
         "step. `grads peak`: MEM_GRADS's peak over one step, the price of the overlap (two adjacent units' full "
         "gradients at once instead of one), and `comm peak` MEM_COMM's (a second padded scratch where a unit's "
         "length does not divide by the world). "
         f"{a.overlap_steps} timed steps per run, {a.overlap_repeats} runs of each, on and off alternating; the "
         "fastest run of each is shown (rank 0, barrier to barrier). Worlds above the cores are OVERSUBSCRIBED: "
         "a rank then also waits for a peer that is not running.", "",
         "| model (width, local batch, units) | world | overlap | ms / step | compute ms | exposed comm ms | "
         "grads peak MiB | comm peak MiB |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for spec in a.overlap_models:
        model, width, batch = spec
        for world in a.overlap_worlds:
            best = {}
            for k in range(a.overlap_repeats):
                for ov in (True, False):
                    r = R.run(world, model, width, batch, 2, steps=a.overlap_steps, overlap=ov,
                              label=f"overlap {model} w{world} {'on' if ov else 'off'} {k + 1}")
                    if ov not in best or r["step_s"] < best[ov]["step_s"]:
                        best[ov] = r
            for ov in (True, False):
                r = best[ov]
                over = " (over)" if world > (os.cpu_count() or 2) else ""
                L.append(f"| {model} ({r['width']}, {batch}, {r['units']}) | {world}{over} | "
                         f"{'on' if r['overlap'] else 'off (KIT_OVERLAP=0)'} | {r['step_s'] * 1e3:.1f} | "
                         f"{r['compute_s'] * 1e3:.1f} | {r['comm_s'] * 1e3:.1f} | {r['peak']['grads'] / MiB:.3f} | "
                         f"{r['peak']['comm'] / MiB:.3f} |")
    return L + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kit-bin", required=True, help="build/bench/zero_kit")
    ap.add_argument("--probe", required=True, help="build/bench/bench_zeromem")
    ap.add_argument("--models", default="resnet9=8,fmnist=64", help="model=local batch, for section 1")
    ap.add_argument("--worlds", default="1,2,4,8")
    ap.add_argument("--budgets-mib", default="256")
    ap.add_argument("--budget-world", type=int, default=4)
    ap.add_argument("--budget-batch", type=int, default=2)
    ap.add_argument("--time-width", type=int, default=16)
    ap.add_argument("--time-batch", type=int, default=16)
    ap.add_argument("--time-steps", type=int, default=3)
    ap.add_argument("--peer-steps", type=int, default=3)
    ap.add_argument("--torch-csv", help="bench/torch_zero.py's CSV (world 2 rows are shown)")
    ap.add_argument("--overlap-models", default="tiny:0:32,fmnist:0:64,resnet9:16:16",
                    help="section 6: model:width:local batch (width 0: the model's default)")
    ap.add_argument("--overlap-worlds", default="2,3")
    ap.add_argument("--overlap-steps", type=int, default=5)
    ap.add_argument("--overlap-repeats", type=int, default=2)
    ap.add_argument("--sections", default="1,2,3,4,5,6")
    ap.add_argument("--md", default=os.path.join(HERE, "results-zero.md"))
    ap.add_argument("--csv", default=os.path.join(HERE, "results-zero-memory-kit.csv"))
    ap.add_argument("--append", action="store_true", help="add the sections to an existing --md and --csv "
                    "(e.g. section 5 once PyTorch's rows exist)")
    ap.add_argument("--quick", action="store_true", help="fmnist only, worlds 1-2, small: the harness only")
    a = ap.parse_args()
    if a.quick:
        a.models, a.worlds, a.budgets_mib, a.time_width, a.time_batch, a.time_steps = "fmnist=8", "1,2", "", 8, 4, 1
        a.sections = "1,3,4,6"
        a.overlap_models, a.overlap_worlds, a.overlap_steps, a.overlap_repeats = "fmnist:0:8", "2", 1, 1
    a.models = [(m.split("=")[0], int(m.split("=")[1])) for m in a.models.split(",")]
    a.worlds = [int(w) for w in a.worlds.split(",")]
    a.overlap_models = [(m, int(w), int(b)) for m, w, b in (x.split(":") for x in a.overlap_models.split(","))]
    a.overlap_worlds = [int(w) for w in a.overlap_worlds.split(",")]
    a.budgets = [int(b) for b in a.budgets_mib.split(",") if b]
    sections = set(a.sections.split(","))
    probe = zm.Probe(a.probe)
    R = Runner(os.path.abspath(a.kit_bin))
    layers = zm.layer_table("resnet9", a.time_width)
    a.units_time = zm.units_of(layers, zm.default_cuts(layers))
    layers = zm.layer_table("resnet9", zm.DEFAULT_WIDTH["resnet9"])
    a.units_resnet9 = zm.units_of(layers, zm.default_cuts(layers))
    csv_rows, parts = [], {}
    share = cpu_share.CpuShare()
    if "1" in sections:
        parts[1] = section_memory(a, R, probe, csv_rows)
        R.shares.append(share.stop("memory runs (section 1)"))
    if "3" in sections:  # the bytes of section 1's resnet9 runs (they do not depend on the batch), or new ones
        a.memo_runs = {}
        w64 = zm.DEFAULT_WIDTH["resnet9"]
        for stage in range(4):
            for world in [w for w in a.worlds if w > 1]:
                hit = [r for k, r in R.memo.items() if k[:3] == (world, "resnet9", w64) and k[4] == stage]
                a.memo_runs[("resnet9", stage, world)] = hit[0] if hit else R.run(world, "resnet9", w64, 1, stage)
        parts[3] = section_traffic(a, R, csv_rows)
    if "4" in sections:
        parts[4] = section_recompute(a, R)
    if "2" in sections and a.budgets:
        share = cpu_share.CpuShare()
        parts[2] = section_budget(a, R, probe)
        R.shares.append(share.stop("budget search (section 2)"))
    if "5" in sections:
        parts[5] = section_peers(a, R, csv_rows)
    if "6" in sections:
        parts[6] = section_overlap(a, R)
    body = [line for k in sorted(parts) for line in parts[k]]
    cpu, cores = cpu_share.cpu_model()
    cmd = "make bench-zero" + (" BENCH_ZERO_ARGS=--quick" if a.quick else "")
    L = ["# Lesson 09 measured on the kit: memory by part, the largest model per budget, bytes, time, "
         "recomputation, PyTorch beside, stage 2's overlap", ""]
    L += cpu_share.report_lines(R.shares, cmd) + [""]
    if a.quick:
        L += ["> **QUICK MODE (`--quick`): a smoke run of the harness; the figures mean little.**", ""]
    L += [f"Written by `{cmd}` on {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. "
          f"Machine: **{cpu}**, {cores} cores; {R.runs} runs of bench/zero_kit.c (lesson 09's zero.c) under "
          "scripts/launch.sh, one OpenMP thread per rank where ranks fill the cores. Memory is counted by the kit "
          "(every device_alloc, by part: load cannot change it); times are under the load stated above. "
          f"MiB = 2^20 bytes, MB = 10^6. CSV: {os.path.relpath(a.csv, ROOT)} (source=kit; `make plot-memory` "
          "draws it on the arithmetic's bars).", ""]
    if a.append:
        L = cpu_share.report_lines(R.shares, cmd + f" (sections {a.sections})") + [""]
    with open(a.md, "a" if a.append else "w") as f:
        f.write("\n".join(L + body) + "\n")
    with open(a.csv, "a" if a.append else "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if not a.append:
            w.writeheader()
        w.writerows(csv_rows)
    print(f"wrote {a.md} and {a.csv}", file=sys.stderr)


if __name__ == "__main__":
    main()
