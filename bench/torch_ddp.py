#!/usr/bin/env python3
"""bench/torch_ddp.py: lesson 03's DDP against PyTorch DistributedDataParallel (gloo) on the same machine.

    python3 bench/torch_ddp.py --kit-bin build/bench/ddp_kit --out bench/results-ddp-torch.md
                               [--models resnet9,fmnist] [--rounds 3] [--steps resnet9=8,fmnist=30] [--quick]

Both sides train the same architecture (tools/torch_models.py rebuilds kit/model.c's table) on 3x32x32 images of
10 classes (the kit's synthetic set; PyTorch: the same number of random images of the same shape, bytes
normalised per batch as the kit's loader does), with the same local batch, SGD (momentum 0.9, weight decay 5e-4
on conv/linear weights), 25 MB gradient buckets started during backward, BN buffers from rank 0 every step, and
the same threads per rank. A job is `warmup` steps then `steps` timed steps on every rank:

  kit      scripts/launch.sh N build/bench/ddp_kit ... (mpirun; lesson 03's solution, the MPI backend: shared
           memory between the ranks of one machine, Open MPI's default)
  PyTorch  N processes of bench/torch_ddp.py --worker, started as torchrun would (RANK, WORLD_SIZE, ...) but in
           the caller's session like mpirun's ranks (bench/torch_launch.py says why); DDP over gloo, TCP over
           loopback (gloo has no shared-memory transport)

Each round runs, for every model, the 2-rank jobs then the 1-rank jobs, kit and PyTorch back to back (the
order swapped every round), so a burst of other work lands on both; the ratio is the median of the per-round
ratios. Per job: images/s of all ranks together over the timed steps (loader, forward, backward, all-reduce,
SGD), the exposed communication per step (rank 0's wait for the gradient all-reduce after its backward has
finished: the kit's own Ddp.comm_seconds; PyTorch's own DDP timer, `backward_comm_time_end -
backward_compute_time_end` of `_get_ddp_logging_data()`, sampled every step), and the wall time from launch
to exit (start-up included: mpirun and MPI_Init, or the interpreter and `import torch`).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SYNTHETIC_TRAIN = 5000  # kit/data.h DATASET_SYNTHETIC_TRAIN: the images of one epoch


# ---------------------------------------------------------------- the PyTorch worker (one per rank)

def worker(a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from torch_models import build  # tools/torch_models.py: the kit's architectures in PyTorch

    from torch_launch import init_from_env  # bench/torch_launch.py
    torch.set_num_threads(a.threads)
    rank, world = init_from_env()
    if a.bind:
        os.sched_setaffinity(0, {int(os.environ.get("LOCAL_RANK", rank)) % os.cpu_count()})
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (SYNTHETIC_TRAIN, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (SYNTHETIC_TRAIN,), generator=g)
    data = TensorDataset(images, labels)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1, drop_last=True)
    loader = DataLoader(data, batch_size=a.local_batch, sampler=sampler, drop_last=True)
    if a.warmup + a.steps > len(loader):
        sys.exit(f"--warmup {a.warmup} + --steps {a.steps} is more than the {len(loader)} steps of one epoch")
    torch.manual_seed(1)
    model = build(a.model, in_c=3, size=32)
    ddp = DDP(model, bucket_cap_mb=a.bucket_mb)  # broadcast_buffers=True: rank 0's BN statistics every step
    ddp._set_ddp_runtime_logging_sample_rate(1)  # DDP's own timer on every step, not every 100th
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}],
                          lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    mean, std = torch.full((1, 3, 1, 1), 0.5), torch.full((1, 3, 1, 1), 0.25)
    ddp.train()
    batches = iter(loader)
    exposed = logging = 0.0
    ends = torch.zeros(a.steps, 2, dtype=torch.int64)  # per timed step: backward's end, the all-reduce's end (ns)
    t0 = None
    for step in range(a.warmup + a.steps):
        x, y = next(batches)
        x = x.float().div_(255.0).sub_(mean).div_(std)
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()  # DDP's reducer all-reduces the buckets as backward produces them
        t = time.perf_counter()
        d = ddp._get_ddp_logging_data()
        if step >= a.warmup:
            exposed += max(0, d["backward_comm_time_end"] - d["backward_compute_time_end"]) * 1e-9
            ends[step - a.warmup] = torch.tensor([d["backward_compute_time_end"], d["backward_comm_time_end"]])
        logging += time.perf_counter() - t  # reading the timer is not PyTorch's work: taken out below
        opt.step()
        if step == a.warmup - 1:
            t0, logging = time.perf_counter(), 0.0
    seconds = time.perf_counter() - t0 - logging
    # The wait counted from the SLOWEST rank's backward end instead of rank 0's own: DDP's timer reads one clock
    # for every process of a machine (c10::getTime, CLOCK_REALTIME), so rank 0's all-reduce end minus the latest
    # backward end is the communication nothing hid, without the wait for a slower rank.
    every = [torch.zeros_like(ends) for _ in range(world)]
    dist.all_gather(every, ends)
    slowest = torch.stack([e[:, 0] for e in every]).max(dim=0).values
    after_slowest = (every[0][:, 1] - slowest).clamp(min=0).sum().item() * 1e-9
    if rank == 0:
        print(json.dumps({"impl": "torch", "model": a.model, "world": world, "threads": torch.get_num_threads(),
                          "local_batch": a.local_batch, "steps": a.steps, "images": a.steps * a.local_batch * world,
                          "seconds": seconds, "exposed_comm_s": exposed, "exposed_after_slowest_s": after_slowest,
                          "logging_s": logging,
                          "n_params": sum(p.numel() for p in model.parameters()),
                          "buckets": d.get("bucket_sizes", ""), "backend": "gloo"}), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------- the driver

def run_job(cmd, env, label, shares, world=0):
    """Runs one job (world > 0: `cmd` as that many PyTorch ranks, bench/torch_launch.py); returns rank 0's JSON
    line with the launch-to-exit wall time added."""
    import cpu_share  # bench/cpu_share.py
    from torch_launch import launch
    share = cpu_share.CpuShare()
    t = time.monotonic()
    if world:
        rc, out, err = launch(cmd, world, env)
    else:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        rc, out, err = p.returncode, p.stdout, p.stderr
    wall = time.monotonic() - t
    shares.append(share.stop(label))
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or not rows:
        sys.stderr.write(out[-3000:] + err[-3000:])
        raise SystemExit(f"torch_ddp.py: {label} failed (exit {rc}): {' '.join(cmd)}")
    rows[-1]["wall_s"] = wall
    return rows[-1]


def kit_cmd(a, model, world, steps):
    return [os.path.join(ROOT, "scripts/launch.sh"), str(world), a.kit_bin, "--steps", str(steps), "--warmup",
            str(a.warmup), "--model", model, "--batch-size", str(a.local_batch * world), "--backend", "mpi",
            "--device", "cpu", "--bucket-mb", "25"]


def torch_cmd(a, model, steps):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--local-batch", str(a.local_batch), "--steps",
           str(steps), "--warmup", str(a.warmup), "--threads", str(a.threads), "--bucket-mb", "25"]
    return cmd + (["--bind"] if a.bind else [])


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def summarise(jobs, model, world):
    """The rounds of one (model, world): each side's medians and the per-round ratio kit / PyTorch."""
    k = [j for j in jobs if j["impl"] == "kit" and j["model"] == model and j["world"] == world]
    t = [j for j in jobs if j["impl"] == "torch" and j["model"] == model and j["world"] == world]
    ips = lambda j: j["images"] / j["seconds"]  # noqa: E731
    exp = lambda j: 1e3 * j["exposed_comm_s"] / j["steps"]  # noqa: E731
    net = lambda j: 1e3 * j["exposed_after_slowest_s"] / j["steps"]  # noqa: E731
    ratios = [ips(x) / ips(y) for x, y in zip(k, t)]
    return {"model": model, "world": world, "rounds": len(ratios), "local_batch": k[0]["local_batch"],
            "steps": k[0]["steps"], "kit_ips": med([ips(j) for j in k]), "kit_best": max(ips(j) for j in k),
            "torch_ips": med([ips(j) for j in t]), "torch_best": max(ips(j) for j in t), "ratio": med(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "kit_exposed_ms": med([exp(j) for j in k]),
            "torch_exposed_ms": med([exp(j) for j in t]),
            "kit_net_ms": med([net(j) for j in k]), "torch_net_ms": med([net(j) for j in t]),
            "kit_step_ms": med([1e3 * j["seconds"] / j["steps"] for j in k]),
            "torch_step_ms": med([1e3 * j["seconds"] / j["steps"] for j in t]),
            "kit_wall": med([j["wall_s"] for j in k]), "torch_wall": med([j["wall_s"] for j in t]),
            "kit_ips_rounds": [ips(j) for j in k], "torch_ips_rounds": [ips(j) for j in t],
            "n_params": k[0]["n_params"], "buckets": t[0].get("buckets", "")}


def machine():
    import cpu_share  # bench/cpu_share.py
    cpu, cores = cpu_share.cpu_model()
    mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()
    return cpu, cores, (mpi[0] if mpi else "mpirun: unknown")



def write_report(a, rows, shares, torch_version, remeasure):
    import cpu_share
    cpu, cores, mpi = machine()
    L = ["# Lesson 03's DDP against PyTorch DistributedDataParallel (CPU, same machine)", ""]
    L += cpu_share.report_lines(shares, remeasure) + [""]
    if a.quick:
        L += ["> **QUICK MODE (`--quick`): a smoke run of the harness, tiny steps; the figures mean nothing.**", ""]
    L += [f"Written by `{remeasure}` (bench/torch_ddp.py, bench/ddp_kit.c) on "
          f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. Machine: **{cpu}**, "
          f"{cores} cores; {mpi}; PyTorch {torch_version} (gloo).", "",
          f"Both sides: {a.threads} thread{'s' if a.threads > 1 else ''} per rank (the kit: OMP_NUM_THREADS, "
          "OpenBLAS single-threaded inside; PyTorch: `torch.set_num_threads`), so that 2 ranks fill the "
          f"{cores} cores without oversubscribing them (torchrun's own default for several processes is 1 thread); "
          f"ranks {'bound one to a core' if a.bind else 'not bound to cores (mpirun --bind-to none; torchrun never binds)'}, "
          "every rank of both sides in the bench's session (on a busy machine Linux's autogroup scheduling shares "
          "the cores out by session; torchrun would give each rank a session of its own, mpirun does not). "
          f"Local batch {a.local_batch} on every rank (1 rank: batch {a.local_batch}; 2 ranks: global batch "
          f"{2 * a.local_batch}), {a.warmup} warm-up step(s), then the timed steps; SGD momentum 0.9, weight decay "
          "5e-4 on weights; 25 MB buckets started during backward (DDP's default `bucket_cap_mb`, the kit's "
          "default `--bucket-mb`); rank 0's BN buffers broadcast every step on both sides. The kit's ranks "
          "talk over MPI (shared memory on one machine), PyTorch's over gloo (TCP over loopback).", "",
          "images/s: all ranks' images over rank 0's time for the timed steps. Exposed communication: rank 0's "
          "wait for the gradient all-reduce after its backward finished, per step (the kit: lesson 03's "
          "`Ddp.comm_seconds`; PyTorch: DDP's own timer, `backward_comm_time_end - backward_compute_time_end`); "
          "it includes waiting for a slower rank, so the second figure counts from the end of the slowest rank's "
          "backward instead (the same timestamps gathered from every rank: one clock on one machine). "
          "Launch to exit: the job's wall time, start-up included.", "",
          "| model | ranks | timed steps x rounds | kit images/s (median, best) | PyTorch images/s (median, best) | "
          "kit / PyTorch: median (range) | exposed comm per step, kit / PyTorch (ms): rank 0's wait; after the "
          "slowest rank's backward | step (ms), kit / PyTorch | launch to exit (s), kit / PyTorch |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        L.append(f"| {r['model']} | {r['world']} | {r['steps']} x {r['rounds']} | {r['kit_ips']:.1f}, "
                 f"{r['kit_best']:.1f} | {r['torch_ips']:.1f}, {r['torch_best']:.1f} | **{r['ratio']:.2f}x** "
                 f"({r['ratio_min']:.2f} - {r['ratio_max']:.2f}) | {r['kit_exposed_ms']:.1f} / "
                 f"{r['torch_exposed_ms']:.1f}; {r['kit_net_ms']:.1f} / {r['torch_net_ms']:.1f} | {r['kit_step_ms']:.0f} / {r['torch_step_ms']:.0f} | "
                 f"{r['kit_wall']:.1f} / {r['torch_wall']:.1f} |")
    L += ["", "Scaling 1 -> 2 ranks (images/s at 2 ranks over images/s at 1 rank, the same local batch and "
          "threads per rank: 2.00x is perfect):", "",
          "| model | gradient (MB) | kit 1 -> 2 ranks | PyTorch 1 -> 2 ranks |", "|---|---:|---:|---:|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        two = next((r for r in rows if r["model"] == model and r["world"] == 2), None)
        one = next((r for r in rows if r["model"] == model and r["world"] == 1), None)
        if two and one:
            L.append(f"| {model} | {4 * two['n_params'] / 2**20:.1f} | {two['kit_ips'] / one['kit_ips']:.2f}x | "
                     f"{two['torch_ips'] / one['torch_ips']:.2f}x |")
    L += ["", "Per round, images/s kit / PyTorch (the rounds alternate which side runs first):", ""]
    for r in rows:
        pairs = ", ".join(f"{k:.1f} / {t:.1f}" for k, t in zip(r["kit_ips_rounds"], r["torch_ips_rounds"]))
        L.append(f"- {r['model']}, {r['world']} rank{'s' if r['world'] > 1 else ''}: {pairs}")
    with open(a.out, "w") as f:
        f.write("\n".join(L) + "\n")


def driver(a):
    from importlib.metadata import version  # PyTorch's version without importing it here (seconds saved)
    worlds = (2, 1)
    if a.quick:  # one job a side: the 1-rank job runs the same code
        a.models, a.local_batch, a.warmup, a.rounds, a.steps, worlds = "tiny-bn", 16, 1, 1, "tiny-bn=2", (2,)
    steps = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in a.steps.split(","))
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), KIT_PROGRESS="plain",
               LAUNCH_ARGS=("--bind-to core" if a.bind else "--bind-to none"))
    env.pop("KIT_PG_TIMEOUT", None)
    jobs, shares = [], []
    models = a.models.split(",")
    for rnd in range(a.rounds):
        for model in models:
            for world in worlds:
                s = steps.get(model, 8)
                sides = [("kit", kit_cmd(a, model, world, s), 0), ("torch", torch_cmd(a, model, s), world)]
                for impl, cmd, ranks in (sides if rnd % 2 == 0 else sides[::-1]):
                    label = f"round {rnd + 1} {model} {world} rank{'s' if world > 1 else ''} {impl}"
                    j = run_job(cmd, env, label, shares, ranks)
                    print(f"{label}: {j['images'] / j['seconds']:.1f} images/s, exposed comm "
                          f"{1e3 * j['exposed_comm_s'] / j['steps']:.1f} ms/step ({1e3 * j['exposed_after_slowest_s'] / j['steps']:.1f} "
                          f"after the slowest rank's backward), launch to exit {j['wall_s']:.1f} s",
                          file=sys.stderr)
                    jobs.append(j)
    rows = [summarise(jobs, m, w) for m in models for w in worlds]
    remeasure = "make bench-ddp" + (f' BENCH_DDP_ARGS="{a.args_text}"' if a.args_text else "")
    write_report(a, rows, shares, version("torch"), remeasure)
    for r in rows:
        print(f"{r['model']} {r['world']} rank(s): kit {r['kit_ips']:.1f} images/s, PyTorch {r['torch_ips']:.1f}: "
              f"{r['ratio']:.2f}x ({r['ratio_min']:.2f} - {r['ratio_max']:.2f}); exposed comm "
              f"{r['kit_exposed_ms']:.1f} / {r['torch_exposed_ms']:.1f} ms per step", file=sys.stderr)
    print(f"wrote {a.out}", file=sys.stderr)


def main():
    sys.path.insert(0, HERE)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kit-bin", help="build/bench/ddp_kit")
    ap.add_argument("--out", help="the Markdown report")
    ap.add_argument("--models", default="resnet9,fmnist")
    ap.add_argument("--steps", default="resnet9=8,fmnist=30", help="timed steps per job, per model (default 8)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="threads per rank, both sides (default: cores / 2)")
    ap.add_argument("--bind", action="store_true", help="bind each rank to one core, both sides")
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny-bn, 1 round, 2 steps (seconds)")
    ap.add_argument("--worker", action="store_true", help="(internal) one PyTorch rank (bench/torch_launch.py)")
    ap.add_argument("--model", help="(--worker) the model")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    a = ap.parse_args()
    if a.worker:
        a.steps = int(a.steps)  # the driver passes one number
        worker(a)
        return
    if not a.kit_bin or not a.out:
        ap.error("--kit-bin and --out are needed")
    if a.warmup < 1 or a.rounds < 1:
        ap.error("--warmup and --rounds must be at least 1 (the timed steps start after a warm-up step)")
    own = [x for i, x in enumerate(sys.argv[1:]) if x not in ("--kit-bin", "--out")
           and sys.argv[i] not in ("--kit-bin", "--out")]
    a.args_text = " ".join(own)  # what BENCH_DDP_ARGS held, for the report's re-measure command
    driver(a)


if __name__ == "__main__":
    main()
