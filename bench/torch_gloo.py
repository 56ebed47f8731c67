#!/usr/bin/env python3
"""bench/torch_gloo.py: the kit's all-reduces against gloo's (torch.distributed, CPU tensors, 2 processes).

    python3 bench/torch_gloo.py --against allreduce --kit-bin build/bench/bench_allreduce --out SECTION.md
    python3 bench/torch_gloo.py --against ring --kit-bin build/bench/ring_allreduce --out SECTION.md
                                [--sizes 1M,4M,16M,64M] [--rounds 3] [--share-log LOG] [--quick]

--against allreduce: the kit's process group on the MPI backend (bench_allreduce: shared memory between the
ranks of one machine, Open MPI's default) against gloo's all_reduce (TCP over loopback: gloo has no
shared-memory transport), its 2 ranks started as bench/torch_launch.py does (in the caller's session, as
mpirun's ranks are). --against ring: lesson 07's ring over TCP sockets (ring_allreduce, 127.0.0.1) against
gloo over the same loopback (GLOO_SOCKET_IFNAME=lo). Both sides time the same way: float32 buffers of each
size, a few calls to warm up, then as many calls as fill about 0.2 s (0.3 s for the ring, as its own bench
does), and the slowest rank's mean time per call. Each round runs the kit's job and gloo's back to back (the
order swapped every round), so a burst of other work lands on both; the ratio is the median of the per-round
ratios. busbw = bytes / time x 2 (n - 1) / n, the nccl-tests definition (n = 2: bytes / time).

Writes a Markdown section (the caller, bench/run-allreduce.sh or bench/run-ring.sh, puts it in its report);
--share-log appends bench/cpu_share.py's record of each job to the caller's log.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_bytes(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def label(b):
    return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB"


# ---------------------------------------------------------------- the gloo worker (one per rank)

def worker(a):
    import torch
    import torch.distributed as dist
    from torch_launch import init_from_env  # bench/torch_launch.py
    torch.set_num_threads(1)
    rank, world = init_from_env()

    def slowest(x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def timed(buf, iters):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        return slowest((time.perf_counter() - t0) / iters)

    for nbytes in [parse_bytes(s) for s in a.sizes.split(",")]:
        buf = torch.zeros(nbytes // 4, dtype=torch.float32)  # zeros: the sums stay finite
        t = timed(buf, 3)  # warm-up: connections, pages; then the count that fills about `seconds`
        iters = min(a.max_iters, max(a.min_iters, int(a.seconds / max(t, 1e-7))))
        t = timed(buf, iters)
        if rank == 0:
            print(json.dumps({"impl": "gloo", "bytes": nbytes, "iters": iters, "time_s": t,
                              "busbw": nbytes / t * 2 * (world - 1) / world / 1e9}), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------- the driver

def run_job(cmd, env, job_label, shares, world=0):
    """Runs one job (world > 0: `cmd` as that many gloo ranks, bench/torch_launch.py); returns rank 0's stdout."""
    import cpu_share  # bench/cpu_share.py
    from torch_launch import launch
    share = cpu_share.CpuShare()
    if world:
        rc, out, err = launch(cmd, world, env)
    else:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        rc, out, err = p.returncode, p.stdout, p.stderr
    shares.append(share.stop(job_label))
    if rc != 0:
        sys.stderr.write(out[-3000:] + err[-3000:])
        raise SystemExit(f"torch_gloo.py: {job_label} failed (exit {rc}): {' '.join(cmd)}")
    return out


def kit_rows(a, out, sizes):
    """busbw per size from the kit's Markdown table: bench_allreduce's 5th column, ring_allreduce's 4th."""
    col = 5 if a.against == "allreduce" else 4
    want = {label(b): b for b in sizes}
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= col and cells[0] in want:
            rows[want[cells[0]]] = float(cells[col - 1])
    missing = [label(b) for b in sizes if b not in rows]
    if missing:
        sys.stderr.write(out[-3000:])
        raise SystemExit(f"torch_gloo.py: the kit's table has no row for {', '.join(missing)}")
    return rows


def kit_cmd(a, sizes):
    if a.against == "allreduce":
        return [os.path.join(ROOT, "scripts/launch.sh"), "2", a.kit_bin, "--backend", "mpi", "--device", "cpu",
                "--min", str(min(sizes)), "--max", str(max(sizes)), "--factor", "4", "--seconds", str(a.seconds)]
    return [os.path.join(ROOT, "scripts/launch.sh"), "2", a.kit_bin, str(max(sizes) / (1 << 20))]


def gloo_cmd(a):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--sizes", a.sizes, "--seconds", str(a.seconds)]
    if a.against == "ring":  # ring_allreduce.c's own bounds: 3 to 200 calls
        cmd += ["--min-iters", "3", "--max-iters", "200"]
    return cmd


def section(a, sizes, kit, gloo):
    name = "The kit's MPI backend" if a.against == "allreduce" else "Lesson 07's socket ring"
    L = ["", f"## {name} against gloo (torch.distributed, CPU tensors, 2 processes)", ""]
    if a.against == "allreduce":
        L += ["The kit: `pg_allreduce_sum` on the MPI backend (bench_allreduce, mpirun --bind-to none: Open MPI's "
              "shared memory between the ranks). gloo: `dist.all_reduce` on CPU tensors, 2 ranks (bench/torch_launch.py), over "
              "TCP on loopback (gloo has no shared-memory transport)."]
    else:
        L += ["Lesson 07's ring (solutions/07-scale-out/ring.c over kit/sock.c, TCP to 127.0.0.1) against gloo's "
              "all_reduce over TCP on the same loopback (GLOO_SOCKET_IFNAME=lo), 2 processes each."]
    L += [f"{a.rounds} round{'s' if a.rounds > 1 else ''}, the kit's job and gloo's back to back (the order swapped "
          "every round); busbw in GB/s (2 ranks: bytes / time), median and best of the rounds; the ratio is the "
          "median of the per-round ratios (range in brackets).", "",
          "| size | kit busbw (median, best) | gloo busbw (median, best) | kit / gloo: median (range) |",
          "|-----:|------------------------:|--------------------------:|---------------------------:|"]
    worst = None
    for b in sizes:
        k, g = [r[b] for r in kit], [r[b] for r in gloo]
        ratios = [x / y for x, y in zip(k, g)]
        m = statistics.median(ratios)
        worst = m if worst is None else min(worst, m)
        L.append(f"| {label(b)} | {statistics.median(k):.3f}, {max(k):.3f} | {statistics.median(g):.3f}, {max(g):.3f} "
                 f"| **{m:.2f}x** ({min(ratios):.2f} - {max(ratios):.2f}) |")
    return L, worst


def driver(a):
    sizes = [parse_bytes(s) for s in a.sizes.split(",")]
    env = dict(os.environ, OMP_NUM_THREADS="1", LAUNCH_ARGS="--bind-to none", GLOO_SOCKET_IFNAME="lo")
    shares, kit, gloo = [], [], []
    for rnd in range(a.rounds):
        jobs = [("kit", kit_cmd(a, sizes), 0), ("gloo", gloo_cmd(a), 2)]
        for impl, cmd, ranks in (jobs if rnd % 2 == 0 else jobs[::-1]):
            out = run_job(cmd, env, f"{a.against} round {rnd + 1} {impl}", shares, ranks)
            if impl == "kit":
                kit.append(kit_rows(a, out, sizes))
            else:
                rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
                gloo.append({r["bytes"]: r["busbw"] for r in rows})
            print(f"{a.against} round {rnd + 1} {impl}: " + ", ".join(
                f"{label(b)} {(kit[-1] if impl == 'kit' else gloo[-1])[b]:.2f}" for b in sizes) + " GB/s",
                file=sys.stderr)
    L, worst = section(a, sizes, kit, gloo)
    if a.quick:
        L[3:3] = ["> **QUICK MODE (`--quick`): a smoke run of the harness; the figures mean nothing.**", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(L) + "\n")
    if a.share_log:
        with open(a.share_log, "a") as f:
            for s in shares:
                f.write(json.dumps(s) + "\n")
    print(f"{a.against} against gloo: the lowest median ratio kit / gloo is {worst:.2f}x; wrote {a.out}", file=sys.stderr)


def main():
    sys.path.insert(0, HERE)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", choices=["allreduce", "ring"], help="which kit all-reduce gloo meets")
    ap.add_argument("--kit-bin")
    ap.add_argument("--out")
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=None, help="time per size per job (0.2; ring 0.3)")
    ap.add_argument("--share-log", help="append each job's cpu_share record to this file")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 MB only, 1 round, 0.02 s per size")
    ap.add_argument("--worker", action="store_true", help="(internal) one gloo rank (bench/torch_launch.py)")
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--max-iters", type=int, default=2000)
    a = ap.parse_args()
    if a.seconds is None:
        a.seconds = 0.3 if a.against == "ring" else 0.2
    if a.worker:
        worker(a)
        return
    if not (a.against and a.kit_bin and a.out):
        ap.error("--against, --kit-bin and --out are needed")
    if a.quick:
        a.sizes, a.rounds, a.seconds = ("1M" if a.against == "allreduce" else "1M"), 1, 0.02
    driver(a)


if __name__ == "__main__":
    main()
