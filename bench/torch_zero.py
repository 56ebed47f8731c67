#!/usr/bin/env python3
"""bench/torch_zero.py: lesson 09's peers in PyTorch on this machine (CPU, gloo): what each rank holds, and speed.

    python3 bench/torch_zero.py [--models resnet9,fmnist] [--worlds 2,1,4] [--impls ddp,zero1,...]
                                [--csv bench/results-zero-torch.csv] [--md bench/results-zero-torch.md] [--quick]

Implementations (--impls), each on N ranks started by bench/torch_launch.py (torchrun's environment, the
caller's session, a file store: as bench/torch_ddp.py runs PyTorch's side):

  ddp           DistributedDataParallel + SGD: every rank holds everything (lesson 09's stage 0)
  zero1         DDP + torch.distributed.optim.ZeroRedundancyOptimizer(SGD): momentum sharded (stage 1). It
                shards by whole tensors (greedy by size), not by flat slices: per-rank bytes are uneven.
  fsdp1-grad    torch.distributed.fsdp.FullyShardedDataParallel, SHARD_GRAD_OP (stage 2)
  fsdp1-full    the same, FULL_SHARD (stage 3). FSDP1 refuses the CPU by default ("FSDP needs a non-CPU
                accelerator device, but no accelerator device is detected"); device_id=torch.device("cpu")
                makes it run on the CPU with gloo, which is what this bench passes.
  fsdp2-grad    FSDP2 `fully_shard(..., reshard_after_forward=False)` (stage 2's memory in forward: parameters
                stay gathered from forward to backward)
  fsdp2-full    `fully_shard` (reshard_after_forward=True: stage 3)

The FSDP units are the kit's default units (lesson 09): every child of the model's Sequential that has
parameters (each conv, each BN, each residual block, the linear layer) is wrapped on its own, then the root.
The models are tools/torch_models.py's copies of the kit's table: resnet9 on 3x32x32, fmnist on 1x28x28, 10
classes; random images (bytes normalised as the kit's loader does) and labels; SGD lr 0.05, momentum 0.9, weight
decay 5e-4 on conv/linear weights (bench/torch_ddp.py's settings); one thread per rank (cores / 2: 2 ranks fill
this machine's 2 cores; world 4 is OVERSUBSCRIBED and marked so).

Per rank, measured: the bytes of tensors it holds after the last timed step's backward (parameters as the rank
holds them: a DTensor's local shard, FSDP1's flat parameter shard; BN buffers counted with the parameters, as
the kit does, 4 bytes per element, num_batches_tracked included: one element per BN layer that the kit lacks), its gradients at that moment, its optimizer state after the step (the sum of the tensors in
optimizer.state; ZeroRedundancyOptimizer: its local optimizer's), each the largest over the ranks; peak RSS
(VmHWM of /proc/self/status) and its growth over the RSS before the model was built (interpreter, torch and
gloo excluded); images/s = all ranks' images over rank 0's time for the timed steps after the warm-up.

CSV columns: those of bench/zero_memory.py (model, width, local_batch, units, stage, world, part, when, bytes,
source=torch) + impl, images_per_s, oversubscribed. part: params | grads | optimizer (when=held: tensors held
per rank, the largest rank) | peak_rss | rss_growth (when=peak).
"""
import argparse
import csv
import datetime
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STAGE = {"ddp": 0, "zero1": 1, "fsdp1-grad": 2, "fsdp1-full": 3, "fsdp2-grad": 2, "fsdp2-full": 3}
INPUTS = {"resnet9": (3, 32, 32), "fmnist": (1, 28, 28), "tiny-bn": (3, 32, 32), "tiny": (3, 32, 32)}
DEFAULT_WIDTH = {"resnet9": 64, "fmnist": 32, "tiny-bn": 16, "tiny": 16}
COLUMNS = ("model", "width", "local_batch", "units", "stage", "world", "part", "when", "bytes", "source", "impl",
           "images_per_s", "oversubscribed")


def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def local_numel(t):
    """Elements this rank holds of t: a DTensor's local shard (FSDP2), else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return (to_local() if to_local else t).numel()


def wrap(model, impl, torch):
    """The model ready to train on this rank: (module to call, optimizer, units wrapped)."""
    decay_of = lambda p: p.dim() > 1  # noqa: E731  conv/linear weights (the kit's TensorView.decay)

    def groups(params):
        params = list(params)
        return [{"params": [p for p in params if decay_of(p)], "weight_decay": 5e-4},
                {"params": [p for p in params if not decay_of(p)], "weight_decay": 0.0}]

    units = [i for i, m in enumerate(model) if any(True for _ in m.parameters())]
    if impl in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model, bucket_cap_mb=25)
        if impl == "ddp":
            return ddp, torch.optim.SGD(groups(model.parameters()), lr=0.05, momentum=0.9), 1
        from torch.distributed.optim import ZeroRedundancyOptimizer
        # One parameter group: ZeroRedundancyOptimizer partitions each group; the decay split is kept by giving
        # the weights their decay through a second group added the same way.
        g = groups(model.parameters())
        opt = ZeroRedundancyOptimizer(g[0]["params"], optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9,
                                      weight_decay=5e-4)
        opt.add_param_group({"params": g[1]["params"], "weight_decay": 0.0})
        return ddp, opt, 1
    if impl.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        strategy = ShardingStrategy.FULL_SHARD if impl.endswith("full") else ShardingStrategy.SHARD_GRAD_OP
        cpu = torch.device("cpu")  # without it FSDP1 stops: it looks for an accelerator
        for i in units:
            model[i] = FSDP(model[i], sharding_strategy=strategy, device_id=cpu)
        root = FSDP(model, sharding_strategy=strategy, device_id=cpu)
        # Flat parameters mix weights and biases: weight decay cannot follow the views' ranges within a shard
        # here (the kit's zero_sgd_shard does), so it applies to every flat parameter of a unit that has a conv/linear weight (a small difference
        # in the update's arithmetic, none in memory or time).
        return root, torch.optim.SGD(root.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4), len(units)
    from torch.distributed.fsdp import fully_shard
    again = impl.endswith("full")
    for i in units:
        fully_shard(model[i], reshard_after_forward=again)
    fully_shard(model, reshard_after_forward=again)
    return model, torch.optim.SGD(groups(model.parameters()), lr=0.05, momentum=0.9), len(units)


def worker(a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as nnf
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from torch_models import build
    from torch_launch import init_from_env
    torch.set_num_threads(a.threads)
    rank, world = init_from_env()
    # The baseline after every import the bench needs (their code and data are not the model's memory).
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.optim  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    base_kb = rss_kb("VmRSS")
    c, h, w = INPUTS[a.model]
    torch.manual_seed(1)
    model = build(a.model, in_c=c, size=h)
    net, opt, n_units = wrap(model, a.impl, torch)
    g = torch.Generator().manual_seed(1 + rank)
    mean, std = torch.full((1, c, 1, 1), 0.5), torch.full((1, c, 1, 1), 0.25)
    batches = [(torch.randint(0, 256, (a.local_batch, c, h, w), generator=g).float().div_(255.0).sub_(mean).div_(std),
                torch.randint(0, 10, (a.local_batch,), generator=g)) for _ in range(2)]
    net.train()
    held = {}
    t0 = None
    for step in range(a.warmup + a.steps):
        x, y = batches[step % 2]
        opt.zero_grad(set_to_none=False)
        nnf.cross_entropy(net(x), y).backward()
        if step == a.warmup + a.steps - 1:  # what the rank holds at the end of backward (t0 already taken)
            params = list(net.parameters())
            held["params"] = 4 * (sum(local_numel(p) for p in params) + sum(b.numel() for b in net.buffers()))
            held["grads"] = 4 * sum(local_numel(p.grad) for p in params if p.grad is not None)
        opt.step()
        if step == a.warmup - 1:
            t0 = time.perf_counter()
    seconds = time.perf_counter() - t0
    state = opt.optim.state if a.impl == "zero1" else opt.state  # ZeroRedundancyOptimizer: its local optimizer
    held["optimizer"] = 4 * sum(local_numel(t) for s in state.values() for t in s.values() if torch.is_tensor(t)
                                and t.dim() > 0)
    mine = dict(held, peak_rss=1024 * rss_kb("VmHWM"), rss_growth=1024 * (rss_kb("VmHWM") - base_kb))
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        print(json.dumps({"impl": a.impl, "model": a.model, "world": world, "local_batch": a.local_batch,
                          "steps": a.steps, "seconds": seconds, "images": a.steps * a.local_batch * world,
                          "units": n_units, "per_rank": every, "torch": torch.__version__}), flush=True)
    # DDP's reducer (under ZeroRedundancyOptimizer) and FSDP keep threads and hooks on the process group: free them
    # while the group is alive, on every rank together. Left to the interpreter's exit, after the group is gone,
    # a thread still joinable is destroyed and the process aborts ("terminate called without an active
    # exception"), one run in three here.
    del net, opt, model
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- the driver



def run_job(a, model, impl, world, steps, shares):
    import cpu_share
    from torch_launch import launch
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--impl", impl, "--model", model,
           "--local-batch", str(a.local_batch[model]), "--steps", str(steps), "--warmup", str(a.warmup),
           "--threads", str(a.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    share = cpu_share.CpuShare()
    rc, out, err = launch(cmd, world, env, timeout_s=900)
    label = f"{model} {impl} {world} rank{'s' if world > 1 else ''}"
    shares.append(share.stop(label))
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if rc != 0 or not rows:
        reason = (err.strip().splitlines() or [f"exit {rc}"])[-1]
        print(f"{label}: FAILED: {reason}", file=sys.stderr)
        return {"impl": impl, "model": model, "world": world, "failed": reason}
    r = rows[-1]
    most = {k: max(p[k] for p in r["per_rank"]) / 2**20 for k in r["per_rank"][0]}
    print(f"{label}: {r['images'] / r['seconds']:.1f} images/s, " + ", ".join(f"{k} {v:.2f} MiB" for k, v in most.items()),
          file=sys.stderr)
    return r


def csv_rows(a, jobs):
    rows = []
    for j in jobs:
        if "failed" in j:
            continue
        ips = j["images"] / j["seconds"]
        for part in ("params", "grads", "optimizer", "peak_rss", "rss_growth"):
            rows.append({"model": j["model"], "width": DEFAULT_WIDTH[j["model"]], "local_batch": j["local_batch"],
                         "units": j["units"], "stage": STAGE[j["impl"]], "world": j["world"], "part": part,
                         "when": "held" if part in ("params", "grads", "optimizer") else "peak",
                         "bytes": max(p[part] for p in j["per_rank"]), "source": "torch", "impl": j["impl"],
                         "images_per_s": round(ips, 2), "oversubscribed": int(j["world"] > os.cpu_count() // a.threads)})
    return rows


def write_md(a, jobs, shares, remeasure):
    import cpu_share
    cpu, cores = cpu_share.cpu_model()
    torch_v = next((j["torch"] for j in jobs if "torch" in j), "?")
    L = ["# Lesson 09's peers in PyTorch (CPU, gloo): what a rank holds, and images/s", ""]
    L += cpu_share.report_lines(shares, remeasure) + [""]
    if a.quick:
        L += ["> **QUICK MODE (`--quick`): a smoke run of the harness; the figures mean nothing.**", ""]
    L += [f"Written by `{remeasure}` on {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}."
          f" Machine: **{cpu}**, {cores} cores; PyTorch {torch_v}, gloo; {a.threads} thread per rank; "
          f"{a.warmup} warm-up step(s), then the timed steps; local batch "
          + ", ".join(f"{m} {b}" for m, b in a.local_batch.items()) + ". bench/torch_zero.py's header says what "
          "each column measures. MiB per rank (the largest rank).", "",
          "| model | impl (stage) | ranks | params | grads | optimizer | params+grads+optimizer | peak RSS | RSS growth | "
          "images/s | timed steps |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for j in jobs:
        over = " (oversubscribed)" if j["world"] > os.cpu_count() // a.threads else ""
        if "failed" in j:
            L.append(f"| {j['model']} | {j['impl']} ({STAGE[j['impl']]}) | {j['world']}{over} | failed: "
                     f"{j['failed'][:120]} ||||||||")
            continue
        m = {k: max(p[k] for p in j["per_rank"]) / 2**20 for k in j["per_rank"][0]}
        L.append(f"| {j['model']} | {j['impl']} ({STAGE[j['impl']]}) | {j['world']}{over} | {m['params']:.2f} | "
                 f"{m['grads']:.2f} | {m['optimizer']:.2f} | {m['params'] + m['grads'] + m['optimizer']:.2f} | "
                 f"{m['peak_rss']:.0f} | {m['rss_growth']:.0f} | {j['images'] / j['seconds']:.1f} | {j['steps']} |")
    with open(a.md, "w") as f:
        f.write("\n".join(L) + "\n")


def driver(a):
    sys.path.insert(0, HERE)
    if a.quick:
        a.models, a.worlds, a.warmup, a.steps = "tiny-bn", "2", 1, "tiny-bn=1"
        a.local_batch = "tiny-bn=8"
    a.local_batch = dict(dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in a.local_batch.split(",")))
    steps = dict((kv.split("=")[0], int(kv.split("=")[1])) for kv in a.steps.split(","))
    jobs, shares = [], []
    for model in a.models.split(","):
        a.local_batch.setdefault(model, 16)
        for world in (int(x) for x in a.worlds.split(",")):
            for impl in (a.impls if world == 2 else a.impls_other or a.impls).split(","):
                jobs.append(run_job(a, model, impl, world, steps.get(model, 3), shares))
    with open(a.csv, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=COLUMNS)
        wr.writeheader()
        wr.writerows(csv_rows(a, jobs))
    remeasure = "python3 bench/torch_zero.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    write_md(a, jobs, shares, remeasure)
    print(f"wrote {a.csv} and {a.md}", file=sys.stderr)
    return 1 if any("failed" in j for j in jobs) and a.quick else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet9,fmnist")
    ap.add_argument("--worlds", default="2,1,4")
    ap.add_argument("--impls", default=",".join(STAGE))
    ap.add_argument("--impls-other", default="", help="the impls for worlds other than 2 (default: --impls)")
    ap.add_argument("--steps", default="resnet9=3,fmnist=10", help="timed steps per job, per model (default 3)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--local-batch", default="resnet9=16,fmnist=64", help="per model")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--csv", default=os.path.join(HERE, "results-zero-torch.csv"))
    ap.add_argument("--md", default=os.path.join(HERE, "results-zero-torch.md"))
    ap.add_argument("--quick", action="store_true", help="tiny-bn, 2 ranks, 1 step: the harness only")
    ap.add_argument("--worker", action="store_true", help="(internal) one rank (bench/torch_launch.py)")
    ap.add_argument("--impl", help="(--worker)")
    ap.add_argument("--model", help="(--worker)")
    a = ap.parse_args()
    if a.worker:
        a.steps, a.local_batch = int(a.steps), int(a.local_batch)
        sys.path.insert(0, HERE)
        worker(a)
        return 0
    for impl in (a.impls + "," + a.impls_other).strip(",").split(","):
        if impl not in STAGE:
            ap.error(f"unknown --impls {impl} (known: {', '.join(STAGE)})")
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
