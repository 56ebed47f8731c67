#!/usr/bin/env python3
"""bench/scaling_summary.py: the tables of bench/run-scaling.sh's CSVs as Markdown (stdout), with speedup,
efficiency, the Karp-Flatt serial fraction and an Amdahl fit; writes scaling-speedup.csv for the plots."""
import argparse
import csv
import os

from cpu_share import OTHER_LIMIT  # bench/cpu_share.py: above this share of the machine, a run was loaded


def read(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def amdahl(p, n):
    return 1.0 / ((1.0 - p) + p / n)


def fit_amdahl(points):
    """Least-squares p of S(N) = 1 / ((1 - p) + p / N) over (N, S) points; a grid of 10^4 steps is finer than
    the measurements' noise. None with fewer than two rank counts."""
    if len({n for n, _ in points}) < 2:
        return None
    best = min(range(10001), key=lambda i: sum((s - amdahl(i / 1e4, n)) ** 2 for n, s in points))
    return best / 1e4


def main():
    ap = argparse.ArgumentParser()
    for a in ("out-dir", "cores", "started", "program", "args",
              "batch", "params", "netns", "link-note", "cpu"):
        ap.add_argument("--" + a, default="")
    o = ap.parse_args()
    cores = int(o.cores)
    strong = read(os.path.join(o.out_dir, "scaling-strong.csv"))
    weak = read(os.path.join(o.out_dir, "scaling-weak.csv"))
    bucket = read(os.path.join(o.out_dir, "scaling-bucket.csv"))
    link = read(os.path.join(o.out_dir, "scaling-link.csv"))
    others = [float(r["other_pct"]) for t in (strong, weak, bucket, link) for r in t]
    busy = [o for o in others if o > 100 * OTHER_LIMIT]

    p = print
    p("# Scaling study (lesson 07)")
    p()
    p(f"Produced by `make bench-scaling` (bench/run-scaling.sh) on {o.started}; plots: `make plot-scaling`;")
    p("what the numbers mean: bench/SCALING.md.")
    p()
    p(f"- machine: {o.cpu or 'unknown CPU'}, {cores} cores, no GPU")
    p(f"- program: `{o.program} {o.args}`, OMP_NUM_THREADS=1 (one rank = one core)")
    p(f"- other work during each run (bench/cpu_share.py: the machine's busy time minus the ranks' own CPU time, "
      f"as a share of wall time x {cores} cores): {min(others, default=0):.1f} to {max(others, default=0):.1f} %")
    p(f"- network namespaces (the bucket and TCP parts): {o.netns}")
    if busy:
        p()
        p(f"**LOADED MACHINE: in {len(busy)} of {len(others)} runs other work took more than {100 * OTHER_LIMIT:.0f} % of "
          "the machine (column *other %*): it took cores from the ranks, so those numbers are noisy lower bounds and the")
        p("ratios between runs are unreliable. Rerun on a quiet machine: `make bench-scaling plot-scaling`.**")
    if cores < 8:
        p()
        p(f"Beyond {cores} ranks the ranks are **oversubscribed**: {cores} cores time-share 4 or 8 processes")
        p(f"(`--oversubscribe`), so no run can be faster than the {cores}-rank one; the 4- and 8-rank rows")
        p("measure the cost of more ranks (smaller local batches, more messages, context switches), not a speedup.")

    rows = []
    if strong:
        t1 = float(strong[0]["images_per_s"])
        n1 = int(strong[0]["ranks"])
        pts = []
        p()
        p(f"## Strong scaling: global batch {strong[0]['global_batch']}, split over N ranks")
        p()
        p("| ranks | images/s | speedup | efficiency | Karp-Flatt serial fraction | compute s | exposed comm s | data s | other % |")
        p("|---|---|---|---|---|---|---|---|---|")
        for r in strong:
            n = int(r["ranks"])
            s = float(r["images_per_s"]) / t1 * n1
            kf = (1 / s - 1 / n) / (1 - 1 / n) if n > 1 and s > 0 else float("nan")
            if n <= cores:
                pts.append((n, s))
            p(f"| {n} | {float(r['images_per_s']):.0f} | {s:.2f} | {s / n:.0%} | "
              f"{'-' if n == 1 else f'{kf:.2f}'} | {r['compute_s']} | {r['comm_s']} | {r['data_s']} | {r['other_pct']} |")
            rows.append([n, s, s / n])
        pf = fit_amdahl(pts)
        p()
        if pf is None:
            p("Amdahl fit: needs at least two rank counts within the cores.")
        else:
            lim = "infinite" if pf >= 1 else f"{1 / (1 - pf):.1f}x"
            p(f"Amdahl fit over the runs within the {cores} cores (N = {', '.join(str(n) for n, _ in pts)}): parallel "
              f"fraction p = {pf:.3f}, serial 1 - p = {1 - pf:.3f}: at most {lim} with any number of cores.")
            p("The Karp-Flatt column is the serial fraction each run implies; when it grows with N the loss is")
            p("not a fixed serial part but an overhead that grows with the ranks (communication, oversubscription).")
        with open(os.path.join(o.out_dir, "scaling-speedup.csv"), "w") as f:
            f.write("ranks,strong_speedup,strong_efficiency,weak_speedup,weak_efficiency,amdahl_speedup,core_bound\n")
            wk = {int(r["ranks"]): float(r["images_per_s"]) for r in weak}
            w1 = wk.get(1)
            for n, s, e in rows:
                ws = wk[n] / w1 if w1 and n in wk else float("nan")
                am = amdahl(pf, min(n, cores)) if pf is not None else float("nan")
                f.write(f"{n},{s:.4f},{e:.4f},{ws:.4f},{ws / n:.4f},{am:.4f},{min(n, cores)}\n")
    if weak:
        w1 = float(weak[0]["images_per_s"])
        p()
        p(f"## Weak scaling: {int(weak[0]['global_batch']) // int(weak[0]['ranks'])} images per rank, the global batch grows with N")
        p()
        p("| ranks | global batch | images/s | speedup | efficiency | compute s | exposed comm s | data s | other % |")
        p("|---|---|---|---|---|---|---|---|---|")
        for r in weak:
            n = int(r["ranks"])
            s = float(r["images_per_s"]) / w1
            p(f"| {n} | {r['global_batch']} | {float(r['images_per_s']):.0f} | {s:.2f} | {s / n:.0%} | "
              f"{r['compute_s']} | {r['comm_s']} | {r['data_s']} | {r['other_pct']} |")
    if bucket:
        p()
        p(f"## Gradient bucket size: 2 hosts x 1 rank, {bucket[0]['link']} ({o.link_note or 'shaped'})")
        p()
        p("`--bucket-mb 0`: one all-reduce of the whole gradient after backward; small buckets start while backward")
        mb = int(o.params or 0) * 4 / 1e6
        p(f"still runs (the model's gradient is {o.params} float32 = {mb:.2f} MB: a bucket of more than that is one")
        p("all-reduce, started when backward has produced the last gradient).")
        p()
        p("| --bucket-mb | images/s | compute s | exposed comm s | data s | other % |")
        p("|---|---|---|---|---|---|")
        for r in bucket:
            p(f"| {r['bucket_mb']} | {float(r['images_per_s']):.0f} | {r['compute_s']} | {r['comm_s']} | {r['data_s']} | {r['other_pct']} |")
    if link:
        p()
        p("## The interconnect: 2 ranks, shared memory vs TCP between two network namespaces")
        p()
        if o.link_note:
            p(f"Capped links: {o.link_note}. No added latency: this kernel lacks netem (tc's delay); "
              "bench/SCALING.md says what latency would do.")
            p()
        p("| link | images/s | vs shared memory | compute s | exposed comm s | data s | other % |")
        p("|---|---|---|---|---|---|---|")
        s0 = float(link[0]["images_per_s"])
        for r in link:
            p(f"| {r['link']} | {float(r['images_per_s']):.0f} | {float(r['images_per_s']) / s0:.2f} | "
              f"{r['compute_s']} | {r['comm_s']} | {r['data_s']} | {r['other_pct']} |")
    p()
    p("Times: rank 0's, from the program's summary lines (0.1 s resolution); exposed comm = waiting for the")
    p("gradient all-reduce after backward (what overlapped backward is inside compute); data = waiting for the loader.")


if __name__ == "__main__":
    main()
