#!/usr/bin/env python3
"""bench/plot_pipeline.py: lesson 08's pipeline schedules against M, `make plot-pipeline`.

    python3 bench/plot_pipeline.py --simulator build/bench/pipeline_simulate
        [--csv bench/results-pipeline.csv] [--torch bench/results-pipeline-torch.csv]
        [--png bench/figures/pipeline-bubble.png]

Reads the kit's measurements (--csv: schedule,P,M,batch,step_ms,idle_measured,idle_formula,peak_inflight, from
bench/pipeline-bubble.sh), the simulator's curve (--simulator: bench/pipeline_simulate's CSV for every P in the
measurements, t_b = 2 t_f, no hop time) and PyTorch's rows if that file exists (--torch: bench/torch_pipeline.py
--out), and draws three panels against M: the idle fraction with the (P-1)/(M+P-1) line, the peak number of
micro-batches whose activations a stage keeps, and the step time (kit and PyTorch). matplotlib draws the PNG
when python3 has it, else gnuplot when it is installed; the same numbers are always printed as a table.

Python 3 standard library only (matplotlib optional).
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile

KIT_COLUMNS = ["schedule", "P", "M", "batch", "step_ms", "idle_measured", "idle_formula", "peak_inflight"]
COLOURS = {"gpipe": "#d35400", "1f1b": "#1f5fa8"}
TORCH_COLUMNS = ["peer", "schedule", "P", "M", "batch", "step_ms", "images_per_s"]


def read_csv(path, columns, what):
    """The rows of a CSV with (at least) these columns; SystemExit naming the file and what is missing."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"plot-pipeline: {path} has no rows ({what})")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise SystemExit(f"plot-pipeline: {path}: no column {', '.join(missing)} (expected {','.join(columns)})")
    for r in rows:
        try:
            r["P"], r["M"] = int(r["P"]), int(r["M"])
            for c in columns:
                if c not in ("schedule", "peer", "P", "M"):
                    r[c] = float(r[c])
        except ValueError as e:
            raise SystemExit(f"plot-pipeline: {path}: a row that is not numbers where expected: {r} ({e})")
    return rows


def simulate(binary, P, max_m):
    """The simulator's rows for P stages and M = 1..max_m."""
    out = subprocess.run([binary, "--stages", str(P), "--max-micro", str(max_m)], check=True,
                         capture_output=True, text=True).stdout
    rows = list(csv.DictReader(out.splitlines()))
    for r in rows:
        r["P"], r["M"], r["peak_inflight"] = int(r["P"]), int(r["M"]), int(r["peak_inflight"])
        r["idle_sim"], r["idle_formula"] = float(r["idle_sim"]), float(r["idle_formula"])
    return rows


def series(rows, key, schedule, P, value):
    """(M, value) points of one schedule and P, sorted by M."""
    return sorted((r["M"], r[value]) for r in rows if r[key] == schedule and r["P"] == P)


def print_table(kit, sim, torch_rows):
    print(f"{'schedule':8} {'P':>2} {'M':>3} | {'idle meas.':>10} {'simulated':>9} {'(P-1)/(M+P-1)':>13} | "
          f"{'peak meas.':>10} {'sim.':>4} | {'step ms':>8} {'torch ms':>8}")
    sim_at = {(r["schedule"], r["P"], r["M"]): r for r in sim}
    torch_at = {(r["schedule"], r["P"], r["M"]): r for r in torch_rows}
    for r in sorted(kit, key=lambda r: (r["schedule"], r["P"], r["M"])):
        s, t = sim_at.get((r["schedule"], r["P"], r["M"])), torch_at.get((r["schedule"], r["P"], r["M"]))
        print(f"{r['schedule']:8} {r['P']:>2} {r['M']:>3} | {r['idle_measured']:>10.3f} "
              f"{s['idle_sim'] if s else float('nan'):>9.3f} {(r['P'] - 1) / (r['M'] + r['P'] - 1):>13.3f} | "
              f"{r['peak_inflight']:>10.0f} {s['peak_inflight'] if s else '-':>4} | {r['step_ms']:>8.2f} "
              f"{t['step_ms'] if t else float('nan'):>8.2f}")


def panels(kit, sim, torch_rows):
    """[(title, y label, [(label, style, colour, [(x, y)])])]: what each panel draws; style 'line' (the formula),
    'points' (measured) or 'dashed' (simulated, or PyTorch); one colour per schedule."""
    idle, peak, step = [], [], []
    for P in sorted({r["P"] for r in kit}):
        max_m = max(r["M"] for r in kit if r["P"] == P)
        formula = [(m, (P - 1) / (m + P - 1)) for m in range(1, max_m + 1)]
        idle.append((f"(P-1)/(M+P-1), P={P}", "line", "#000000", formula))
        for name in sorted({r["schedule"] for r in kit}):
            c = COLOURS.get(name, "#555555")
            idle.append((f"{name} measured, P={P}", "points", c, series(kit, "schedule", name, P, "idle_measured")))
            idle.append((f"{name} simulated, P={P}", "dashed", c, series(sim, "schedule", name, P, "idle_sim")))
            peak.append((f"{name} measured, P={P}", "points", c, series(kit, "schedule", name, P, "peak_inflight")))
            peak.append((f"{name} simulated (stage 0), P={P}", "dashed", c,
                         series(sim, "schedule", name, P, "peak_inflight")))
            step.append((f"kit {name}, P={P}", "points", c, series(kit, "schedule", name, P, "step_ms")))
            step.append((f"torch {name}, P={P}", "dashed", c, series(torch_rows, "schedule", name, P, "step_ms")))
    return [("idle fraction of a step", "idle fraction", idle),
            ("micro-batches whose activations a stage keeps", "peak in flight", peak),
            ("step time", "ms per step", [c for c in step if c[3]])]


def draw_matplotlib(plots, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(plots), figsize=(6 * len(plots), 4.5))
    for ax, (title, ylabel, curves) in zip(axes, plots):
        for label, style, colour, pts in curves:
            if not pts:
                continue
            xs, ys = zip(*pts)
            fmt = {"line": "-", "points": "o-", "dashed": "x--"}[style]
            ax.plot(xs, ys, fmt, color=colour, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batches M")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def draw_gnuplot(plots, png):
    terminal = "pngcairo" if subprocess.run(["gnuplot", "-e", "set terminal pngcairo"],
                                            capture_output=True).returncode == 0 else "png"
    with tempfile.TemporaryDirectory(prefix="plot_pipeline.") as tmp:
        lines = [f"set terminal {terminal} size {560 * len(plots)},460 font 'DejaVu Sans,10'", f"set output '{png}'",
                 f"set multiplot layout 1,{len(plots)}", "set logscale x 2", "set xlabel 'micro-batches M'",
                 "set grid lc rgb '#dddddd'", "set key top right font ',8'"]
        for i, (title, ylabel, curves) in enumerate(plots):
            clauses = []
            for j, (label, style, colour, pts) in enumerate(curves):
                if not pts:
                    continue
                data = os.path.join(tmp, f"{i}-{j}.dat")
                with open(data, "w") as f:
                    f.writelines(f"{x} {y}\n" for x, y in pts)
                how = {"line": "lines lw 2", "points": "linespoints pt 7",
                       "dashed": "linespoints dt 2 pt 2"}[style] + f" lc rgb '{colour}'"
                clauses.append(f"'{data}' using 1:2 with {how} title '{label}'")
            lines += [f"set title '{title}'", f"set ylabel '{ylabel}'", "plot " + ", ".join(clauses)]
        lines.append("unset multiplot")
        subprocess.run(["gnuplot"], input="\n".join(lines) + "\n", text=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--simulator", required=True, help="bench/pipeline_simulate (make builds it)")
    ap.add_argument("--csv", default="bench/results-pipeline.csv")
    ap.add_argument("--torch", default="bench/results-pipeline-torch.csv")
    ap.add_argument("--png", default="bench/figures/pipeline-bubble.png")
    a = ap.parse_args()
    if not os.path.exists(a.csv):
        raise SystemExit(f"plot-pipeline: no {a.csv}: run bench/pipeline-bubble.sh first (it writes the kit's "
                         "measurements)")
    kit = read_csv(a.csv, KIT_COLUMNS, "the kit's measurements")
    torch_rows = read_csv(a.torch, TORCH_COLUMNS, "PyTorch's rows") if os.path.exists(a.torch) else []
    sim = []
    for P in sorted({r["P"] for r in kit}):
        sim += simulate(a.simulator, P, max(r["M"] for r in kit if r["P"] == P))
    print_table(kit, sim, torch_rows)
    plots = panels(kit, sim, torch_rows)
    try:
        import matplotlib  # noqa: F401
        draw = draw_matplotlib
    except ImportError:
        draw = draw_gnuplot if shutil.which("gnuplot") else None
    if draw is None:
        print("plot-pipeline: no PNG: neither matplotlib (pip install matplotlib) nor gnuplot (apt-get install "
              "gnuplot-nox) is installed; the table above has the numbers")
        return
    os.makedirs(os.path.dirname(a.png) or ".", exist_ok=True)
    draw(plots, a.png)
    print(f"plot-pipeline: wrote {a.png}")


if __name__ == "__main__":
    sys.exit(main())
