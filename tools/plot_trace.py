#!/usr/bin/env python3
"""Draws a --trace timeline (kit/trace.h) as a PNG with gnuplot: one row per rank for its main thread's phases
(forward, backward, optimizer step, data wait, waits, blocking collectives, evaluation, checkpoint saves) and one
row under it for what that rank has in flight (the async spans: bucket all-reduces, reduce-scatters, sends).

    tools/plot_trace.py FILE [--out FILE.png] [--from S --to S | --steps N [--first-step K]] [--title T]

--from/--to: seconds from the trace's first event. --steps N: N steps of rank 0 ("step K" spans), starting at
step K (default: the middle of the run), which is what a picture of a lesson wants (a whole epoch is too dense).
make plot-trace TRACE=FILE runs it. Python 3 standard library and gnuplot (pngcairo, else png).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

# (label, colour) per phase, in the legend's order; phase_of() maps a span to one.
PHASES = [
    ("forward", "#4e79a7"),
    ("backward", "#59a14f"),
    ("optimizer step", "#b07aa1"),
    ("data wait", "#bab0ac"),
    ("collective (blocking)", "#f28e2b"),
    ("wait for communication", "#e15759"),
    ("in flight (async)", "#edc948"),
    ("evaluate", "#76b7b2"),
    ("checkpoint", "#9c755f"),
]
COLOUR = dict(PHASES)


def phase_of(e):
    name, cat, ph = e["name"], e.get("cat", ""), e["ph"]
    if ph == "b":
        return "in flight (async)"
    if name in ("optimizer step", "data wait", "evaluate"):
        return name
    if name.startswith("forward") or name.startswith("backward"):  # a lesson's "forward unit 3", "backward micro-batch 2"
        return name.split()[0]
    if name.startswith("step ") or name == "trace flush":
        return None  # the step is the frame the phases sit in; the tracer's own flushes are not the program's
    return {"comm": "collective (blocking)", "wait": "wait for communication", "io": "checkpoint",
            "eval": "evaluate", "data": "data wait", "compute": "forward"}.get(cat)


def spans(events):
    """(pid, row 0 main / 1 async, start, end, phase, depth) of every span, async pairs joined."""
    out, open_ = [], {}
    for e in sorted((e for e in events if e["ph"] in ("X", "b", "e")), key=lambda e: e["ts"]):
        if e["ph"] == "X":
            p = phase_of(e)
            if p:
                out.append([e["pid"], 0, e["ts"], e["ts"] + e["dur"], p, 0])
        elif e["ph"] == "b":
            open_[(e["pid"], e.get("cat"), e.get("id"))] = e
        else:
            b = open_.pop((e["pid"], e.get("cat"), e.get("id")), None)
            if b:
                out.append([b["pid"], 1, b["ts"], e["ts"], "in flight (async)", 0])
    # Depth on the main row: a span inside another is drawn over it, a little thinner.
    for pid in {s[0] for s in out}:
        stack = []
        for s in sorted((s for s in out if s[0] == pid and s[1] == 0), key=lambda s: (s[2], -s[3])):
            while stack and stack[-1] <= s[2]:
                stack.pop()
            s[5] = len(stack)
            stack.append(s[3])
    return out


def window(events, a):
    t0 = min(e["ts"] for e in events if "ts" in e and e["ph"] != "M")
    t1 = max(e["ts"] + e.get("dur", 0) for e in events if "ts" in e and e["ph"] != "M")
    if a.steps:
        steps = sorted((e for e in events if e["ph"] == "X" and e["pid"] == 0 and e["name"].startswith("step ")),
                       key=lambda e: e["ts"])
        if not steps:
            sys.exit("plot_trace: --steps: rank 0 has no 'step N' spans in this file")
        k = a.first_step if a.first_step is not None else max(0, len(steps) // 2 - a.steps // 2)
        k = min(k, len(steps) - 1)
        last = steps[min(k + a.steps, len(steps)) - 1]
        # from a little before the first step's start to the last step's end, so that its data wait shows
        lo, hi = steps[k]["ts"], last["ts"] + last["dur"]
        pad = 0.03 * (hi - lo)
        return lo - pad, hi + pad
    lo = t0 + (a.from_s or 0.0) * 1e6
    hi = t0 + a.to_s * 1e6 if a.to_s is not None else t1
    return lo, hi


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--out")
    ap.add_argument("--from", dest="from_s", type=float)
    ap.add_argument("--to", dest="to_s", type=float)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--first-step", type=int)
    ap.add_argument("--title")
    ap.add_argument("--width", type=int, default=1400)
    a = ap.parse_args()
    if not shutil.which("gnuplot"):
        sys.exit("plot_trace: gnuplot not found (apt-get install gnuplot)")
    with open(a.file) as f:
        events = json.load(f)["traceEvents"]
    lo, hi = window(events, a)
    ranks = sorted({e["pid"] for e in events})
    out = a.out or os.path.splitext(a.file)[0] + ".png"
    rows = {}  # (pid, row) -> y: rank 0 at the top
    for i, pid in enumerate(ranks):
        base = (len(ranks) - 1 - i) * 3
        rows[(pid, 0)], rows[(pid, 1)] = base + 1.6, base + 0.6
    with tempfile.TemporaryDirectory() as tmp:
        data, inflight = os.path.join(tmp, "spans.dat"), os.path.join(tmp, "inflight.dat")
        with open(data, "w") as fmain, open(inflight, "w") as fasync:
            for pid, row, s, e, phase, depth in sorted(spans(events), key=lambda s: s[5]):
                if e < lo or s > hi:
                    continue
                f = fasync if row == 1 else fmain  # in flight: with borders, so that one bucket ends where the next begins
                s, e = max(s, lo), min(e, hi)
                x0, x1 = (s - lo) / 1e3, (e - lo) / 1e3  # ms from the window's start
                half = 0.4 - 0.08 * min(depth, 3)
                f.write(f"{(x0 + x1) / 2:.4f} {rows[(pid, row)]} {(x1 - x0) / 2:.4f} {half:.3f} "
                        f"{int(COLOUR[phase][1:], 16)}\n")
        ytics = ", ".join(f'"rank {pid}" {rows[(pid, 0)]}, "in flight" {rows[(pid, 1)]}' for pid in ranks)
        keys = "".join(f', keyentry with boxes fs solid fc rgb "{c}" title "{p}"' for p, c in PHASES)
        title = a.title or os.path.basename(a.file)
        height = 140 + 110 * len(ranks)
        script = f"""
set terminal pngcairo size {a.width},{height} font ",10" noenhanced
set output "{out}"
set title "{title}"
set xlabel "ms from the window's start (rank 0's clock)"
set xrange [0:{(hi - lo) / 1e3:.4f}]
set yrange [-0.3:{3 * len(ranks) - 0.5}]
set ytics ({ytics})
set grid xtics
set key outside right top vertical
set style fill solid 1.0 noborder
plot "{data}" using 1:2:3:4:5 with boxxyerror fc rgb variable notitle, \\
     "{inflight}" using 1:2:3:4:5 with boxxyerror fc rgb variable fs solid 1.0 border lc rgb "#555555" notitle{keys}
"""
        gp = os.path.join(tmp, "plot.gp")
        with open(gp, "w") as f:
            f.write(script)
        r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
        if r.returncode != 0 and "pngcairo" in r.stderr:
            with open(gp, "w") as f:
                f.write(script.replace("pngcairo", "png"))
            r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"plot_trace: gnuplot failed:\n{r.stderr}")
    print(f"plot_trace: {out} ({len(ranks)} ranks, {(hi - lo) / 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
