#!/usr/bin/env python3
"""bench/zero_memory.py: lesson 09's per-rank memory, by part, from the arithmetic (the ZeRO paper's accounting
redone for fp32 SGD with momentum, with the kit's units and padding).

    python3 bench/zero_memory.py --probe build/bench/bench_zeromem [--models resnet9,fmnist] [--batch 64]
        [--worlds 1,2,4,8] [--budgets-mib 256,512] [--budget-batch 2]
        [--csv bench/results-zero-memory-arith.csv] [--md bench/results-zero-memory.md]

The ZeRO paper (Rajbhandari et al., 2020) counts model states per rank for Psi parameters: DDP holds all of
them, stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the parameters too. Its K = 12
bytes of optimizer state per parameter are Adam's in mixed precision; here, fp32 SGD with momentum: 4 bytes of
parameters, 4 of gradients and 4 of momentum per parameter, so DDP's 12 Psi bytes become 8 Psi + 4 Psi / W at
stage 1, 4 Psi + 8 Psi / W at stage 2, 12 Psi / W at stage 3. What this script adds to the closed form, as
lesson 09 builds it:

  units     the model is cut into units (one per layer with parameters, merged with the parameter-free layers
            after it, where a cut is allowed: never inside a residual block); shards are per unit.
  padding   unit u (n_u floats) is padded to W * shard_u, shard_u = ceil(n_u / W): each rank holds shard_u
            floats of each sharded part of each unit, padding included.
  windows   stage 2: a unit's full gradient exists from its backward until its reduce-scatter has ended. The
            kit overlaps that reduce-scatter with the previous unit's backward (the default; KIT_OVERLAP=0 ends
            it at once), so the peak holds the largest two ADJACENT units' full gradients besides the shards
            (without the overlap: the largest unit's); stage 3: a unit's full parameters exist inside its
            forward and backward windows, so the peak holds the largest unit's full parameters besides the
            shards, and its gradients follow stage 2's rule.
  buffers   BN's running statistics stay whole on every rank (they are not trained; a few KB), counted with
            the parameters, as the kit tags them.
  activations  what the kit allocates per unit for a local batch (bench/bench_zeromem.c: each unit is a kit
            stage model with an arena of its own: activations, their gradients, BN's saved statistics, conv/BN
            scratch, the unit's input and its gradient, labels, losses): the same at every stage and world.
  comm      stages 1-3: one scratch buffer of the largest padded unit (W * shard_u floats) for the collectives
            on a unit whose length does not divide by W; at stages 2-3 with the overlap, odd and even units take
            turns with one each (the largest padded odd unit's, the largest even one's), so that a reduce-scatter
            in flight keeps its own; stage 0 all-reduces in place (0 bytes). A lower bound:
            an implementation's staging buffers (MPI, NCCL) are not counted.

Each part is given at its PEAK during a step (when="peak") and between steps (when="between": stage 2 holds no
full gradient then, stage 3 no full parameters or gradients). The peaks coincide (the largest unit's backward),
so part peaks add up to the step's peak total.

CSV columns (the kit's measured rows, source=kit, and PyTorch's, source=torch, use the same ones):
  model, width, local_batch, units, stage (0 = DDP, 1-3 ZeRO), world, part (params | grads | optimizer |
  activations | comm | total), when (peak | between), bytes (per rank), source (arith | kit | torch).
"""
import argparse
import csv
import json
import os
import subprocess
import sys

F = 4  # bytes per float: fp32 everything
PARTS = ("params", "grads", "optimizer", "activations", "comm")
STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
CSV_COLUMNS = ("model", "width", "local_batch", "units", "stage", "world", "part", "when", "bytes", "source")
# The input each architecture is trained on in the workshop (lesson 01): CIFAR-10 and Fashion-MNIST.
INPUTS = {"resnet9": (3, 32, 32), "tiny": (3, 32, 32), "tiny-bn": (3, 32, 32), "fmnist": (1, 28, 28)}
DEFAULT_WIDTH = {"tiny": 16, "tiny-bn": 16, "fmnist": 32, "resnet9": 64}


# ---------------------------------------------------------------- the kit's layer table (kit/model.c), again

class Table:
    """kit/model.c's build_* functions: layers as dicts {kind, in, in2, params, buffers, out: (c, h, w)}."""

    def __init__(self, in_shape):
        self.in_shape, self.layers = in_shape, []

    def shape(self, i):
        return self.in_shape if i < 0 else self.layers[i]["out"]

    def push(self, kind, i, out, params=0, buffers=0, in2=-2):
        self.layers.append({"kind": kind, "in": i, "in2": in2, "params": params, "buffers": buffers, "out": out})
        return len(self.layers) - 1

    def conv(self, i, k, bias):  # 3x3, stride 1, padding 1: the spatial size is kept
        c, h, w = self.shape(i)
        return self.push("conv", i, (k, h, w), params=k * c * 9 + (k if bias else 0))

    def simple(self, kind, i):
        c, h, w = self.shape(i)
        out = {"bn": (c, h, w), "relu": (c, h, w), "maxpool": (c, h // 2, w // 2), "avgpool": (c, 1, 1)}[kind]
        return self.push(kind, i, out, params=2 * c if kind == "bn" else 0, buffers=2 * c if kind == "bn" else 0)

    def block(self, i, k, bn=True):
        x = self.conv(i, k, bias=not bn)
        if bn:
            x = self.simple("bn", x)
        return self.simple("relu", x)

    def residual(self, i, c):
        y = self.block(self.block(i, c), c)
        return self.push("add", i, self.shape(i), in2=y)

    def linear(self, i, k):
        c, h, w = self.shape(i)
        return self.push("linear", i, (k, 1, 1), params=k * c * h * w + k)


def layer_table(model, width=0, in_shape=None, classes=10):
    w = width or DEFAULT_WIDTH[model]
    t = Table(tuple(in_shape or INPUTS[model]))
    if model in ("tiny", "tiny-bn"):
        bn = model == "tiny-bn"
        x = t.simple("maxpool", t.block(-1, w // 2, bn))
        x = t.simple("avgpool", t.simple("maxpool", t.block(x, w, bn)))
    elif model == "fmnist":
        x = t.simple("maxpool", t.block(-1, w))
        x = t.simple("maxpool", t.block(x, 2 * w))
    elif model == "resnet9":
        x = t.block(-1, w)
        x = t.residual(t.simple("maxpool", t.block(x, 2 * w)), 2 * w)
        x = t.simple("maxpool", t.block(x, 4 * w))
        x = t.residual(t.simple("maxpool", t.block(x, 8 * w)), 8 * w)
        x = t.simple("avgpool", x)
    else:
        raise SystemExit(f"zero_memory.py: unknown model {model!r} (known: {', '.join(DEFAULT_WIDTH)})")
    t.linear(x, classes)
    return t.layers


def cut_ok(layers, cut):
    """kit/model.c table_cut_ok: only layer cut-1's output crosses the cut."""
    if cut <= 0 or cut >= len(layers):
        return False
    for l in layers[cut:]:
        if (l["in"] < cut and l["in"] != cut - 1) or (l["kind"] == "add" and l["in2"] < cut and l["in2"] != cut - 1):
            return False
    return True


def default_cuts(layers):
    """Lesson 09's default units: a unit starts at each layer with parameters where a cut is allowed; the
    parameter-free layers after it (and a residual block's layers, which cannot be cut) join it."""
    cuts = [0]
    for i in range(1, len(layers)):
        if layers[i]["params"] and cut_ok(layers, i):
            cuts.append(i)
    return cuts + [len(layers)]


def units_of(layers, cuts):
    return [{"first": a, "last": b, "params": sum(l["params"] for l in layers[a:b]),
             "buffers": sum(l["buffers"] for l in layers[a:b])} for a, b in zip(cuts, cuts[1:])]


# ---------------------------------------------------------------- the kit's own numbers (bench/bench_zeromem.c)

class Probe:
    """Runs bench_zeromem; remembers each (model, width, batch)'s per-unit arena bytes and checks that the kit's
    per-unit parameter and buffer counts are this script's."""

    def __init__(self, path):
        self.path, self.memo, self.work = path, {}, {}

    def table(self, model, width, batch):
        out = self.run(model, width, batch, None)
        return [json.loads(line) for line in out.splitlines() if line.startswith('{"layer"')]

    def arena(self, model, width, batch, units):
        key = (model, width, batch)
        if key not in self.memo:
            cuts = [units[0]["first"]] + [u["last"] for u in units]
            rows = [json.loads(line) for line in self.run(model, width, batch, cuts).splitlines()
                    if line.startswith('{"unit"')]
            for u, r in zip(units, rows):
                if (u["params"], u["buffers"]) != (r["params"], r["buffers"]):
                    raise SystemExit(f"zero_memory.py: {model} width {width} unit [{u['first']}, {u['last']}): "
                                     f"this script counts {u['params']} params + {u['buffers']} buffers, the kit "
                                     f"{r['params']} + {r['buffers']}: the layer table here is out of date "
                                     "(kit/model.c changed?)")
            if len(rows) != len(units):
                raise SystemExit(f"zero_memory.py: {self.path} printed {len(rows)} units, expected {len(units)}")
            self.memo[key] = [r["arena_bytes"] for r in rows]
            self.work[key] = [r["work_bytes"] for r in rows]
        return self.memo[key]

    def run(self, model, width, batch, cuts):
        c, h, w = INPUTS[model]
        cmd = [self.path, "--model", model, "--width", str(width), "--in", f"{c},{h},{w}", "--batch", str(batch)]
        if cuts:
            cmd += ["--cuts", ",".join(map(str, cuts))]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"zero_memory.py: {' '.join(cmd)} failed:\n{p.stderr}")
        return p.stdout


# ---------------------------------------------------------------- the arithmetic

def shard(n, world):
    return -(-n // world)  # ceil(n / world)


def per_rank(stage, world, units, arena, overlap=True):
    """{when: {part: bytes}} for one rank. units: [{params, buffers}], arena: bytes of activations per unit.
    overlap: stages 2-3 reduce-scatter unit u's gradient during unit u-1's backward (the kit's default)."""
    n = [u["params"] for u in units]
    N, Nb = sum(n), sum(u["buffers"] for u in units)
    S = sum(shard(x, world) for x in n)             # the rank's shards of every unit, padding included
    big = max(n)                                    # the largest unit: the window's full params / grads
    pad = [world * shard(x, world) for x in n]
    scratch = max((p for p, x in zip(pad, n) if p != x), default=0)
    overlapped = overlap and stage >= 2 and len(n) > 1
    held = max(a + b for a, b in zip(n, n[1:])) if overlapped else big  # full gradients alive at once
    # with the overlap, odd and even units take turns with a scratch each, sized for the largest of its units
    scratch_rs = sum(max((p for p, x in list(zip(pad, n))[k::2] if p != x), default=0) for k in (0, 1)) \
        if overlapped else scratch
    acts = sum(arena)
    if stage == 0:
        peak = {"params": N + Nb, "grads": N, "optimizer": N, "comm": 0}
        between = dict(peak)
    elif stage == 1:
        peak = {"params": N + Nb, "grads": N, "optimizer": S, "comm": scratch}
        between = dict(peak)
    elif stage == 2:
        peak = {"params": N + Nb, "grads": S + held, "optimizer": S, "comm": scratch_rs}
        between = dict(peak, grads=S)
    elif stage == 3:
        peak = {"params": S + big + Nb, "grads": S + held, "optimizer": S, "comm": scratch_rs}
        between = dict(peak, params=S + Nb, grads=S)
    else:
        raise ValueError(stage)
    out = {}
    for when, d in (("peak", peak), ("between", between)):
        b = {p: F * d[p] for p in ("params", "grads", "optimizer", "comm")}
        b["activations"] = acts
        b["total"] = sum(b[p] for p in PARTS)
        out[when] = b
    return out


def zero_paper(stage, world, psi):
    """The closed form for fp32 SGD with momentum (no padding, no windows, no buffers): model states' bytes."""
    return {0: 12 * psi, 1: 8 * psi + 4 * psi / world, 2: 4 * psi + 8 * psi / world, 3: 12 * psi / world}[stage]


# ---------------------------------------------------------------- the largest width that fits

def states_only(stage, world, units):
    return per_rank(stage, world, units, [0] * len(units))["peak"]["total"]


def states_width(model, stage, world, budget, w_max=4096):
    """The largest width whose model states alone (no activations) fit `budget` bytes."""
    lo, hi = 0, w_max + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        layers = layer_table(model, mid)
        lo, hi = (mid, hi) if states_only(stage, world, units_of(layers, default_cuts(layers))) <= budget else (lo, mid)
    return lo


def largest_width(model, stage, world, budget, batch, probe, w_max=1024):
    """The largest width of `model` whose per-rank peak (states + the kit's activations at `batch`) fits
    `budget` bytes. The states alone are cheap and grow with the width: a binary search on them bounds the
    answer; the kit's arena (probed) then walks it down until the whole total fits. Returns (width, total)."""
    def units(w):
        layers = layer_table(model, w)
        return units_of(layers, default_cuts(layers))

    def total(w):
        u = units(w)
        return per_rank(stage, world, u, probe.arena(model, w, batch, u))["peak"]["total"]

    lo, hi = 0, w_max + 1  # states(lo) <= budget < states(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if states_only(stage, world, units(mid)) <= budget else (lo, mid)
    # The arena only adds: the answer is at most lo; a binary search on the whole total below it (probed).
    if lo == 0 or total(1) > budget:
        return 0, 0
    good, bad = 1, lo + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if total(mid) <= budget else (good, mid)
    return good, total(good)


# ---------------------------------------------------------------- output

def mib(b):
    return b / 2**20


def rows_for(model, width, batch, worlds, probe):
    layers = layer_table(model, width)
    if probe:
        kit = probe.table(model, width or DEFAULT_WIDTH[model], 1)
        mine = [(l["kind"], l["in"], l["params"], l["buffers"], tuple(l["out"])) for l in layers]
        theirs = [(l["kind"], l["in"], l["params"], l["buffers"], tuple(l["out"])) for l in kit]
        if mine != theirs:
            raise SystemExit(f"zero_memory.py: the layer table of {model} here differs from the kit's "
                             f"(bench_zeromem): {mine} against {theirs}")
    cuts = default_cuts(layers)
    units = units_of(layers, cuts)
    w = width or DEFAULT_WIDTH[model]
    arena = probe.arena(model, w, batch, units) if probe else [0] * len(units)
    rows = []
    for stage in range(4):
        for world in worlds:
            for when, parts in per_rank(stage, world, units, arena).items():
                for part in PARTS + ("total",):
                    rows.append({"model": model, "width": w, "local_batch": batch, "units": len(units),
                                 "stage": stage, "world": world, "part": part, "when": when,
                                 "bytes": parts[part], "source": "arith"})
    return rows, units, cuts


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        wr.writeheader()
        wr.writerows(rows)


def md_table(model, rows, units, cuts, worlds, probe):
    get = {(r["stage"], r["world"], r["part"], r["when"]): r["bytes"] for r in rows if r["model"] == model}
    psi = sum(u["params"] for u in units)
    biggest = max(units, key=lambda u: u["params"])
    r0 = next(r for r in rows if r["model"] == model)
    L = [f"### {model} (width {r0['width']}, {psi:,} parameters, local batch {r0['local_batch']})", "",
         f"{len(units)} units, cut before layers {cuts[1:-1]}; the largest, layers {biggest['first']}.."
         f"{biggest['last'] - 1}, holds {biggest['params']:,} parameters ({100 * biggest['params'] / psi:.0f} %): "
         "stage 3's window holds its full parameters and gradients.", ""]
    key = (model, r0["width"], r0["local_batch"])
    if probe and key in probe.work:
        work = sum(probe.work[key])
        L += [f"Activations are the kit's arenas of the {len(units)} unit models: {mib(work):.1f} MiB of them is "
              f"the conv/BN scratch (each unit's `work`, {work / (F * psi):.2f}x the parameters' bytes: "
              "what the unit's hungriest conv needs at this batch on this machine's cores, kit/model.c plan_layers), "
              "the same at every stage and world.", ""]
    L += [
         "| stage | world | params | grads | optimizer | activations | comm | **total (peak)** | between steps "
         "| model states | ZeRO paper's closed form |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for stage in range(4):
        for world in worlds:
            p = {part: get[(stage, world, part, "peak")] for part in PARTS + ("total",)}
            states = p["params"] + p["grads"] + p["optimizer"]
            L.append(f"| {STAGE_NAMES[stage]} | {world} | " + " | ".join(f"{mib(p[x]):.2f}" for x in PARTS)
                     + f" | **{mib(p['total']):.2f}** | {mib(get[(stage, world, 'total', 'between')]):.2f} | "
                     f"{mib(states):.2f} | {mib(zero_paper(stage, world, psi)):.2f} |")
    return L + [""]


BUDGET_COLUMNS = ("model", "local_batch", "budget_bytes", "stage", "world", "max_width", "params", "peak_bytes",
                  "source")


def budget_table(a, budgets, worlds, probe):
    """The largest width per budget, stage and world: Markdown lines; the rows go to --budget-csv."""
    model = a.budget_model
    L = [f"### The largest {model} width that fits a per-rank budget (local batch {a.budget_batch})", "",
         "Peak per rank: the model states by the arithmetic above plus the kit's activations for that width "
         f"(probed at every width tried). Default width {DEFAULT_WIDTH[model]}; parameters grow as width^2. In "
         "brackets: millions of parameters at that width; after the slash: the width if the activations cost "
         "nothing (model states alone), what the ZeRO stages act on.", "",
         "| budget (MiB) | world | " + " | ".join(STAGE_NAMES[s] + ": width (M params)" for s in range(4)) + " |",
         "|---:|---:|" + "---:|" * 4]
    rows = []
    for budget in budgets:
        for world in worlds:
            cells = []
            for stage in range(4):
                w, peak = largest_width(model, stage, world, budget * 2**20, a.budget_batch, probe)
                n = sum(l["params"] for l in layer_table(model, w)) if w else 0
                cells.append(f"{w} ({n / 1e6:.1f}) / {states_width(model, stage, world, budget * 2**20)}")
                rows.append({"model": model, "local_batch": a.budget_batch, "budget_bytes": int(budget * 2**20),
                             "stage": stage, "world": world, "max_width": w, "params": n, "peak_bytes": peak,
                             "source": "arith"})
            L.append(f"| {budget:g} | {world} | " + " | ".join(cells) + " |")
            print(f"budget {budget:g} MiB, world {world}: {cells}", file=sys.stderr)
    with open(a.budget_csv, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=BUDGET_COLUMNS)
        wr.writeheader()
        wr.writerows(rows)
    return L + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probe", help="build/bench/bench_zeromem (the kit's arena per unit); without it, "
                    "activations are left out (0) and the layer table is not checked against the kit")
    ap.add_argument("--models", default="resnet9,fmnist")
    ap.add_argument("--width", type=int, default=0, help="0: each model's default")
    ap.add_argument("--batch", type=int, default=64, help="local batch per rank")
    ap.add_argument("--worlds", default="1,2,4,8")
    ap.add_argument("--budgets-mib", default="256,512", help="per-rank budgets for the largest resnet9 width "
                    "('' to skip)")
    ap.add_argument("--budget-batch", type=int, default=2, help="local batch for the budget search")
    ap.add_argument("--budget-model", default="resnet9")
    ap.add_argument("--csv", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results-zero-memory-arith.csv"))
    ap.add_argument("--budget-csv", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "results-zero-memory-budget.csv"))
    ap.add_argument("--md", help="also write the Markdown tables here")
    a = ap.parse_args()
    worlds = [int(x) for x in a.worlds.split(",")]
    probe = Probe(a.probe) if a.probe else None
    rows, md = [], ["# Lesson 09: per-rank memory by part, from the arithmetic", "",
                    "`" + " ".join(["python3", "bench/zero_memory.py"] + sys.argv[1:]) + "` (MiB per rank; "
                    "fp32, SGD with momentum; bench/zero_memory.py's header says what each part counts).", ""]
    for model in a.models.split(","):
        r, units, cuts = rows_for(model, a.width, a.batch, worlds, probe)
        rows += r
        md += md_table(model, r, units, cuts, worlds, probe)
    if not probe:
        md += ["Activations: 0 here (run with `--probe build/bench/bench_zeromem` for the kit's arena).", ""]
    budgets = [float(x) for x in a.budgets_mib.split(",") if x]
    if budgets and probe:
        md += budget_table(a, budgets, worlds, probe)
    write_csv(a.csv, rows)
    if a.md:
        with open(a.md, "w") as f:
            f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
