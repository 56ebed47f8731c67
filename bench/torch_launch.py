"""bench/torch_launch.py: starts N PyTorch ranks for the benches against PyTorch (torch_ddp.py, torch_gloo.py).

    from torch_launch import launch, init_from_env
    out = launch([sys.executable, script, "--worker", ...], world=2, env=env)   # the driver: rank 0's stdout
    init_from_env()                                                           # each worker: the gloo group

What torchrun would do for one machine, minus its agent, with one difference that matters to a benchmark:
torchrun starts every rank in a session of its own, and Linux's autogroup scheduling
(/proc/sys/kernel/sched_autogroup_enabled) gives each session an equal share of a busy machine, so on a shared
machine a PyTorch job would get one share per rank where mpirun's ranks, which stay in mpirun's session, get one
between them. Here every rank stays in the caller's session, as mpirun's do. The ranks meet through a file store
(`file://` in a fresh temporary folder): no port is chosen and bound later; gloo's own sockets bind port 0.
"""
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time


def die_with_parent():
    """In each rank, before exec: SIGTERM when the launching process dies, so a killed bench leaves no rank
    waiting for its peers (prctl PR_SET_PDEATHSIG, Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def launch(cmd, world, env, timeout_s=1800):
    """Runs `cmd` as ranks 0..world-1 (RANK, WORLD_SIZE, LOCAL_RANK, BENCH_TORCH_INIT in the environment) and
    returns (exit status, rank 0's stdout, every rank's stderr). A rank that fails stops the others."""
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as d:
        procs = []
        for r in range(world):
            e = dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                     BENCH_TORCH_INIT=f"file://{d}/store")
            with open(os.path.join(d, f"out{r}"), "w") as o, open(os.path.join(d, f"err{r}"), "w") as er:
                procs.append(subprocess.Popen(cmd, env=e, stdout=o, stderr=er, preexec_fn=die_with_parent))
        deadline, rc = time.monotonic() + timeout_s, 0
        try:
            while True:  # until all have exited, or one failed (the others would wait for it until the timeout)
                codes = [p.poll() for p in procs]
                rc = next((c for c in codes if c), 0)
                if rc or all(c is not None for c in codes):
                    break
                if time.monotonic() > deadline:
                    rc = 124
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        read = lambda name: open(os.path.join(d, name)).read()  # noqa: E731
        return rc, read("out0"), "".join(read(f"err{r}") for r in range(world))


def init_from_env():
    """The worker's side: the gloo process group of launch()'s ranks. Returns (rank, world)."""
    import torch.distributed as dist
    if "BENCH_TORCH_INIT" not in os.environ:
        sys.exit("a --worker runs under bench/torch_launch.py's launch() (BENCH_TORCH_INIT is not set)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ["BENCH_TORCH_INIT"], rank=rank, world_size=world)
    return rank, world
