#!/usr/bin/env python3
"""bench/torch_pipeline.py: PyTorch's own pipeline schedules (torch.distributed.pipelining: ScheduleGPipe,
Schedule1F1B) on the kit's lesson 08 network and cut, two processes on the CPU (gloo), as the peer of lesson
08's multi-process pipeline (bench/pipeline-bubble.sh writes the kit's side, bench/results-pipeline.csv).

    python3 bench/torch_pipeline.py [--model tiny] [--width 0] [--cuts N] [--batch 64]
                                    [--micro 1,2,4,8,16] [--schedules gpipe,1f1b] [--steps 10] [--warmup 2]
                                    [--rounds 3]
                                    [--threads 1] [--out bench/results-pipeline-torch.csv]

Prints CSV rows `peer,schedule,P,M,batch,step_ms,images_per_s` (peer=torch) and, with --out, writes them there
too (what `make plot-pipeline` draws next to the kit's rows).

The same network as the kit (tools/torch_models.py rebuilds kit/model.c's layer tables) and the same batch as
bench/pipeline-bubble.sh (tiny, 64 images), cut at the same layer: --cuts N is the kit layer where stage 1
begins, as the lesson's program prints it (`stage 1: layers  N..`). By default it is the kit's cut by parameter
count (--balance params), computed here the way pipe_balance does; bench/pipeline-bubble.sh cuts by measured
time (--balance time), which depends on the machine: pass the cut its runs printed for the very same split.

The same step: the batch split into M micro-batches (BN statistics per micro-batch, as the kit's stages keep
them), mean cross-entropy over the batch, SGD with momentum 0.9 and weight decay 5e-4 on conv/linear weights,
one update per stage. A measurement is the mean over --steps steps of both processes together (a barrier before
and after), after --warmup steps; --rounds rounds measure every (M, schedule) in turn and each row is the median
of its rounds (a burst of other work on the machine then lands on every configuration alike). Each process gets
--threads threads (default 1: one core per stage, as each kit rank).

PyTorch is used for measurement only; the kit never depends on it. Without torch this prints one line saying so
and exits 0. The two processes meet through a file in a private temporary folder (no TCP port is chosen here).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
except ImportError:
    print("torch_pipeline: skipped: PyTorch is not installed in python3 (pip install torch)")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from torch_models import Residual, build  # noqa: E402  tools/torch_models.py: the kit's architectures in PyTorch

IMAGE = (3, 32, 32)  # the synthetic dataset's images, as lesson 08's default run
CLASSES = 10
PROCESSES = 2


def kit_layers(module):
    """How many of the kit's layers a top-level module of tools/torch_models.py stands for: a residual block is
    conv-BN-ReLU twice and the add (7); Flatten is part of the kit's pooling or linear layer (0); the rest, 1."""
    if isinstance(module, Residual):
        return 7
    if isinstance(module, nn.Flatten):
        return 0
    return 1


def kit_param_cut(model):
    """The kit's cut of `model` into 2 stages by parameter count (pipe_balance with BALANCE_PARAMS): the kit
    layer c, among those it may cut before, that makes the larger stage's parameter count smallest; the first
    such c on a tie, as its dynamic programming keeps the first minimum."""
    total = sum(p.numel() for p in model.parameters())
    best, cut, layer, before = None, None, 0, 0
    for m in model:
        if 0 < layer and kit_layers(m) > 0:
            worst = max(before, total - before)
            if best is None or worst < best:
                best, cut = worst, layer
        layer += kit_layers(m)
        before += sum(p.numel() for p in m.parameters())
    return cut


def split_modules(model, cuts):
    """The model's top-level modules in stages that begin at the kit layer indices `cuts`; SystemExit when a cut
    falls inside a residual block (the kit allows no cut there either) or past the end."""
    modules, starts, layer = list(model), [], 0
    for m in modules:
        starts.append(layer)
        layer += kit_layers(m)
    bounds = [0]
    for c in cuts:
        if c not in starts or c <= 0 or c >= layer:
            raise SystemExit(f"torch_pipeline: --cuts {c}: not a layer where the kit can cut this model "
                             f"(cut points: {sorted(set(s for s in starts if 0 < s < layer))})")
        # the first module that starts at layer c (a Flatten shares its start with the next module)
        bounds.append(starts.index(c))
    bounds.append(len(modules))
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise SystemExit("torch_pipeline: --cuts must increase, one stage per process")
    return [nn.Sequential(*modules[a:b]) for a, b in zip(bounds, bounds[1:])]


def sgd(module):
    """The kit's SGD: momentum 0.9, weight decay on conv/linear weights only (model.h: TensorView.decay)."""
    decay = [p for p in module.parameters() if p.dim() > 1]
    rest = [p for p in module.parameters() if p.dim() <= 1]
    return torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}],
                           lr=0.05, momentum=0.9)


def run_one(rank, a, stage_module, schedule_cls, M):
    """One (schedule, M) measurement on this rank; returns the mean step time in seconds (both ranks agree)."""
    from torch.distributed.pipelining import PipelineStage
    device = torch.device("cpu")
    stage = PipelineStage(stage_module, rank, PROCESSES, device)
    loss_fn = nn.CrossEntropyLoss()  # per micro-batch mean; the schedule divides the gradients by M (scale_grads)
    schedule = schedule_cls(stage, n_microbatches=M, loss_fn=loss_fn)
    opt = sgd(stage_module)
    g = torch.Generator().manual_seed(7)
    x = torch.rand(a.batch, *IMAGE, generator=g) * 2 - 1
    y = torch.randint(0, CLASSES, (a.batch,), generator=g)

    def step():
        opt.zero_grad(set_to_none=False)
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        opt.step()

    for _ in range(a.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dist.barrier()
    return (time.perf_counter() - t0) / a.steps


def worker(rank, a, init_file, rows_file):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=PROCESSES)
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    # Rounds over every (M, schedule) in turn, so a burst of other work on the machine lands on all of them
    # alike; each row is the median of its rounds.
    times, refused = {}, set()
    for _ in range(a.rounds):
        for M in a.micro:
            for name in a.schedules:
                if (name, M) in refused:
                    continue
                torch.manual_seed(0)  # both ranks build the same whole model, then keep their own stage
                net = build(a.model, w=a.width, classes=CLASSES, in_c=IMAGE[0], size=IMAGE[1])
                try:
                    seconds = run_one(rank, a, split_modules(net, a.cuts)[rank], classes[name], M)
                except (ValueError, RuntimeError) as e:  # a schedule that refuses this M (both ranks raise alike)
                    refused.add((name, M))
                    if rank == 0:
                        print(f"torch_pipeline: {name} with M={M} not measured: {str(e).splitlines()[0]}",
                              file=sys.stderr)
                    continue
                times.setdefault((name, M), []).append(seconds)
    rows = []
    for name in a.schedules:
        for M in a.micro:
            if (name, M) in times:
                seconds = statistics.median(times[(name, M)])
                rows.append(f"torch,{name},{PROCESSES},{M},{a.batch},{1000 * seconds:.3f},{a.batch / seconds:.1f}")
                if rank == 0:
                    print(rows[-1], flush=True)
    if rank == 0:
        with open(rows_file, "w") as f:
            f.write("\n".join(rows) + ("\n" if rows else ""))
    dist.destroy_process_group()


def int_list(text):
    return [int(v) for v in text.split(",") if v]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "tiny-bn", "resnet9"])
    ap.add_argument("--width", type=int, default=0, help="base channels (0: the model's default, as the kit)")
    ap.add_argument("--cuts", type=int_list, default=None,
                    help="kit layer where stage 1 begins, as the lesson's program prints it (`stage 1: layers "
                         "N..`); default: the kit's cut by parameter count")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--micro", type=int_list, default=[1, 2, 4, 8, 16])
    ap.add_argument("--schedules", type=lambda t: t.split(","), default=["gpipe", "1f1b"])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before each measurement")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per (schedule, M), the median reported")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="also write the rows (with a header) to this CSV")
    a = ap.parse_args()
    if a.cuts is None:
        a.cuts = [kit_param_cut(build(a.model, w=a.width, classes=CLASSES, in_c=IMAGE[0], size=IMAGE[1]))]
    if len(a.cuts) != PROCESSES - 1:
        ap.error(f"--cuts: {PROCESSES - 1} cut(s) for {PROCESSES} processes")
    if any(s not in ("gpipe", "1f1b") for s in a.schedules):
        ap.error("--schedules: gpipe and/or 1f1b")
    if any(M < 1 or a.batch % M for M in a.micro):
        ap.error("--micro: each M >= 1 and dividing --batch (equal micro-batches, as torch splits them)")
    if a.steps < 1 or a.warmup < 0 or a.threads < 1 or a.rounds < 1:
        ap.error("--steps >= 1, --warmup >= 0, --threads >= 1, --rounds >= 1")
    split_modules(build(a.model, w=a.width, classes=CLASSES, in_c=IMAGE[0], size=IMAGE[1]), a.cuts)  # check early
    print("peer,schedule,P,M,batch,step_ms,images_per_s", flush=True)
    with tempfile.TemporaryDirectory(prefix="torch_pipeline.") as tmp:
        rows_file = os.path.join(tmp, "rows.csv")
        mp.spawn(worker, args=(a, os.path.join(tmp, "init"), rows_file), nprocs=PROCESSES, join=True)
        rows = open(rows_file).read() if os.path.exists(rows_file) else ""
    if a.out:
        with open(a.out, "w") as f:
            f.write("peer,schedule,P,M,batch,step_ms,images_per_s\n" + rows)


if __name__ == "__main__":
    main()
