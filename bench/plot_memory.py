#!/usr/bin/env python3
"""bench/plot_memory.py: lesson 09's per-rank memory by part -> bench/figures/zero-memory.png (`make plot-memory`).

    python3 bench/plot_memory.py [--model resnet9] [--png bench/figures/zero-memory.png] [CSV ...]

CSVs (default: bench/results-zero-memory-arith.csv, and bench/results-zero-memory-kit.csv and
bench/results-zero-torch.csv when they exist) in bench/zero_memory.py's columns: model, width, local_batch,
units, stage, world, part, when, bytes, source (arith | kit | torch); other columns are ignored.

Two panels, one bar per (stage, world), grouped by stage: left, the model states (params, grads, optimizer,
comm) stacked by part; right, the whole peak with the activations. source=arith draws the bars (when=peak);
source=kit and source=torch draw a marker each at the sum of their params + grads + optimizer (+ comm) (left)
and of every part (right, kit only: PyTorch's activations are not counted by part), so the measurement sits on
the arithmetic's bar. gnuplot draws it (matplotlib is not installed here); the numbers are printed as well.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PARTS = ("params", "grads", "optimizer", "comm", "activations")
STATES = ("params", "grads", "optimizer", "comm")
NEEDED = ("model", "stage", "world", "part", "when", "bytes", "source")
STAGE_NAMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "comm": "#8172b3",
          "activations": "#c8c8c8"}


def read(paths):
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            r = csv.DictReader(f)
            missing = [c for c in NEEDED if c not in (r.fieldnames or [])]
            if missing:
                raise SystemExit(f"plot_memory.py: {path} lacks the column(s) {', '.join(missing)} "
                                 f"(bench/zero_memory.py's header defines them)")
            rows += list(r)
    return rows


def bars(rows, model):
    """{(stage, world): {part: bytes}} from source=arith, when=peak; and the worlds, sorted."""
    out = {}
    for r in rows:
        if r["source"] == "arith" and r["model"] == model and r["when"] == "peak" and r["part"] in PARTS:
            out.setdefault((int(r["stage"]), int(r["world"])), {})[r["part"]] = float(r["bytes"])
    return out


def marks(rows, model, source, parts):
    """{(stage, world): the largest sum of `parts` over the source's rows (per impl / when)}."""
    sums = {}
    for r in rows:
        if r["source"] == source and r["model"] == model and r["part"] in parts:
            key = (int(r["stage"]), int(r["world"]), r.get("impl", ""), r["when"])
            sums[key] = sums.get(key, 0.0) + float(r["bytes"])
    out = {}
    for (s, w, _, _), v in sums.items():
        out[(s, w)] = max(out.get((s, w), 0.0), v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet9")
    ap.add_argument("--png", default=os.path.join(HERE, "figures", "zero-memory.png"))
    ap.add_argument("csv", nargs="*")
    a = ap.parse_args()
    paths = a.csv or [p for p in (os.path.join(HERE, n) for n in ("results-zero-memory-arith.csv",
                      "results-zero-memory-kit.csv", "results-zero-torch.csv")) if os.path.exists(p)]
    if not paths:
        raise SystemExit("plot_memory.py: no CSV: run python3 bench/zero_memory.py first")
    rows = read(paths)
    b = bars(rows, a.model)
    if not b:
        raise SystemExit(f"plot_memory.py: no source=arith rows for {a.model} in {', '.join(paths)}")
    worlds = sorted({w for _, w in b})
    stages = sorted({s for s, _ in b})
    extra = {src: (marks(rows, a.model, src, STATES), marks(rows, a.model, src, PARTS) if src == "kit" else {})
             for src in ("kit", "torch")}
    r0 = next(r for r in rows if r["source"] == "arith" and r["model"] == a.model)
    title = f"{a.model} (width {r0.get('width', '?')}, local batch {r0.get('local_batch', '?')}): per-rank peak, MiB"
    print(f"{title}\nstage   world  " + "  ".join(f"{p:>11}" for p in PARTS) + "  states(kit/torch)")
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "bars.dat")
        states_max = total_max = 0.0
        centres = []  # (x of a stage's group centre, its name): labelled under the world tics
        with open(data, "w") as f:
            x = 0
            for s in stages:
                centres.append((x + (len(worlds) - 1) / 2, STAGE_NAMES[s]))
                for w in worlds:
                    p = b.get((s, w), {})
                    vals = [p.get(part, 0.0) / 2**20 for part in PARTS]
                    ks, ts = extra["kit"][0].get((s, w)), extra["torch"][0].get((s, w))
                    kt = extra["kit"][1].get((s, w))
                    cols = [f"{v:.4f}" for v in vals] + [f"{v / 2**20:.4f}" if v is not None else "NaN"
                                                         for v in (ks, ts, kt)]
                    f.write(f"{x} \"W={w}\" " + " ".join(cols) + "\n")
                    states_max = max(states_max, sum(vals[:4]), (ks or 0) / 2**20, (ts or 0) / 2**20)
                    total_max = max(total_max, sum(vals), (kt or 0) / 2**20)
                    print(f"{STAGE_NAMES[s]:7} {w:5}  " + "  ".join(f"{v:11.2f}" for v in vals) +
                          f"  {ks / 2**20 if ks else float('nan'):.2f}/{ts / 2**20 if ts else float('nan'):.2f}")
                    x += 1
                x += 1
                f.write("\n")
        if not shutil.which("gnuplot"):
            print("plot-memory: no PNG: gnuplot is not installed (apt-get install gnuplot-nox); the table above "
                  "has the numbers", file=sys.stderr)
            return 1
        terminal = "pngcairo" if subprocess.run(["gnuplot", "-e", "set terminal pngcairo"],
                                                capture_output=True).returncode == 0 else "png"
        # Stacked bars as boxes: each part's box runs from the sum of the parts below it to that sum plus itself.
        def stack(parts, col0):
            cmds = []
            for i in reversed(range(len(parts))):
                top = "+".join(f"${col0 + j}" for j in range(i + 1))
                cmds.append(f"'{data}' using 1:({top}):xtic(2) with boxes fc rgb '{COLORS[parts[i]]}' "
                            f"title '{parts[i]}'")
            return cmds
        L = [f"set terminal {terminal} size 1400,520 font 'DejaVu Sans,10'", f"set output '{a.png}'",
             "set multiplot layout 1,2 title '" + title.replace("'", "") + "'",
             "set style fill solid 0.9 border rgb 'black'", "set boxwidth 0.8", "set grid ytics",
             "set ylabel 'MiB per rank'", "set xtics rotate by 0 font ',8'", "set key top left horizontal",
             "set bmargin 4"]
        L += [f"set label '{name}' at first {cx}, graph -0.09 center font ',10'" for cx, name in centres]
        L += [f"set yrange [0:{1.25 * states_max:.3f}]", "set title 'model states (params, grads, optimizer, comm)'"]
        # columns: 1 x, 2 label, 3.. params grads optimizer comm activations, 8 kit states, 9 torch states, 10 kit all
        # A series with no point at all stops gnuplot ("all points undefined"): only those with data.
        have = {src: bool(extra[src][0]) for src in extra}
        marks_l = ([f"'{data}' using 1:8 with points pt 7 ps 1.3 lc rgb 'red' title 'kit (measured)'"] * have["kit"] +
                   [f"'{data}' using 1:9 with points pt 9 ps 1.5 lc rgb 'black' title 'PyTorch (held tensors)'"] *
                   have["torch"])
        L.append("plot " + ", ".join(stack(list(STATES), 3) + marks_l))
        L.append(f"set yrange [0:{1.25 * total_max:.3f}]")
        L.append("set title 'peak total: + activations (the kit arenas of the units)'")
        L.append("plot " + ", ".join(stack(list(PARTS), 3) + [
            f"'{data}' using 1:10 with points pt 7 ps 1.3 lc rgb 'red' title 'kit (measured)'"] * bool(extra["kit"][1])))
        L.append("unset multiplot")
        os.makedirs(os.path.dirname(os.path.abspath(a.png)), exist_ok=True)
        p = subprocess.run(["gnuplot"], input="\n".join(L) + "\n", text=True, capture_output=True)
        if p.returncode != 0:
            raise SystemExit(f"plot_memory.py: gnuplot failed:\n{p.stderr}")
    print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
