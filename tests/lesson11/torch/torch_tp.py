#!/usr/bin/env python3
"""tests/lesson11/torch/torch_tp.py: lesson 11's tensor parallelism against PyTorch's, on the same net.

    python3 tests/lesson11/torch/torch_tp.py BUILD/tests/lesson11/torch/tp_export       (make test-lesson11-torch)

The kit's resnet9 (width 8) trains STEPS SGD steps from one start on the same synthetic batches, eight ways:

  kit    one process           tp_export --tp 0 (the kit's plain Model)
  kit    TP=2                  lesson 11's solution on 2 MPI ranks: both residual blocks split
  kit    2 x 2 grid            lesson 11's solution on 4 MPI ranks: tensor groups of 2 x 2 data replicas
  torch  one process           tools/torch_models.py's resnet9 (nn.Conv2d): the ground truth
  torch  TP=2, 2 x 2 grid      PyTorch's tensor parallelism on gloo, 2 and 4 processes, in two styles (below)

Every run's parameters and BN running statistics must equal torch's one process within the bound derived at
TOLERANCE, and each kit TP run those of each torch TP run of the same shape. torch's runs are in float64: the kit's
float32 is then compared with the exact numbers (TOLERANCE says why it matters).

What torch's side is, and why. torch.distributed.tensor.parallel's ColwiseParallel and RowwiseParallel shard
nn.Linear and nn.Embedding only (torch/distributed/tensor/parallel/style.py: "currently only support nn.Linear
and nn.Embedding"; on an nn.Conv2d they raise NotImplementedError), and DTensor's convolution rules shard the
batch or the last spatial dimension, never the channels. Hence two styles, each in the same processes:

"linear": the styles themselves. A 3x3 convolution IS a Linear layer applied to every pixel's 3x3 patch (im2col:
the kit's own path to GEMM), so each block's two convs are written as F.unfold + nn.Linear(9 C, C, bias=False),
whose weight is the conv's (C, C, 3, 3) reshaped to (C, 9 C), and parallelize_module shards them unchanged:

  conv1  ColwiseParallel()   weight Shard(0): this rank's C/T output channels; input Replicate, output this rank's
                             channels (Shard(-1)). Its input's gradient comes back Partial and DTensor all-reduces
                             it: Megatron's f.
  BN1    this rank's C/T channels (an nn.BatchNorm2d of C/T channels: per channel, nothing to exchange)
  conv2  RowwiseParallel()   weight Shard(1): columns [t 9C/T, (t+1) 9C/T) are input channels [t C/T, (t+1) C/T)
                             (unfold orders a patch channel-major, as the kit's filters are); its input is this
                             rank's unfolded channels (Shard(-1)); its output Partial -> Replicate: g's all-reduce.
  BN2, ReLU, the add, and every layer outside the blocks: ordinary modules, the same on every rank.

  Its f sums the gradient of the unfolded input: 9 x the floats of the kit's, which sums the gradient of the
  block's input (the same sums, folded after instead of before).

"conv": the weights as DTensors, conv1's Shard(0) (output channels) and conv2's Shard(1) (input channels), F.conv2d
on the local shards, and f and g as DTensor placements: the block's input enters as a Replicate DTensor whose
local gradient is declared Partial (from_local's backward all-reduces it: f), and conv2's local result is a Partial
DTensor redistributed to Replicate (g). The kit's all-reduces, on the same tensors.

The data dimension (the 2 x 2 grid: a DeviceMesh (dp, tp) over 4 ranks, tensor groups of consecutive ranks as the
kit's tp_grid makes them) averages every gradient over the mesh's dp group with all_reduce, and its BN statistics
are those of the global batch, as the kit's tp_create arranges. torch's nn.SyncBatchNorm refuses CPU tensors and
its kernels (batch_norm_stats & co.) are CUDA-only, so SyncBN here is lesson 05's arithmetic (one all-reduce of
[sum x, sum x^2, count] forward, one of [sum dy, sum dy x_hat] backward) in an autograd Function: written here, not
PyTorch's.

Processes start with torch.multiprocessing on a gloo group whose rendezvous is a file (no port chosen here).
Needs numpy and torch; exit 0 = passed or skipped (saying why), 1 = failed.
"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # tests/lesson11/torch -> the repository
sys.path.insert(0, os.path.join(ROOT, "tools"))

STEPS, BATCH, WIDTH, SIZE, CLASSES = 3, 16, 8, 32, 10
LR, MOMENTUM, WEIGHT_DECAY, SEED = 0.05, 0.9, 5e-4, 7  # tp_export's SgdConfig: Nesterov, decay on weights only
EPS, BN_MOMENTUM = 1e-5, 0.1
DTYPE = None  # torch's runs: torch.float64 (set in main, where torch is imported)

STYLES = {"linear": "ColwiseParallel/RowwiseParallel", "conv": "DTensor shards + F.conv2d"}
# (name, tensor ranks, data replicas); (0, 1): one process
SHAPES = [("one process", 0, 1), ("TP=2", 2, 1), ("2x2 grid", 2, 2)]

# TOLERANCE. torch's runs compute in float64 (unit roundoff U64 = 2^-53): beside the kit's float32 (U32 = 2^-24)
# they are exact, so a kit run's error against them is its own rounding alone. Per tensor, |got - want| <=
#   K_MOVE u max|want - init|  +  STEPS u max|want|
# The second term: each step stores the parameter rounded to its precision (u |p|). The first: a gradient's
# rounding error as a fraction of its size. Its sums run over up to M = N H W = 16 x 32 x 32 = 16384 terms (a conv's
# weight gradient), erring by ~sqrt(M) u = 128 u of their terms' scale when the roundings are independent; BN's
# backward (dy - E[dy] - x_hat E[dy x_hat]) cancels, ~10x; about 20 layers compound that, ~5x: ~6e3 u of the
# gradient. Three steps blend their gradients through the momentum, and the error fed back through the changed
# weights (lr x curvature x error) is second order: ~6e3 u of the move. K_MOVE = 2e4 (1.2e-3 of the move in
# float32) leaves a margin of 3 over that estimate, which is itself pessimistic (measured: the kit's runs stay
# within 3e-2 of the bound, their worst tensor a BN scale, where the storage term dominates). The kit sums BN's
# channel statistics and gradient sums in double (kit/ops_cpu.c); a float32 accumulation of those sums cancels far
# worse (PyTorch's float32 CPU batch norm misses the first BN's bias move by 1e-2 of it, 2e5 U32, measured),
# which is why torch's side runs in float64. torch's TP runs against its one process: the same bound in U64.
# A wrong split misses some tensor's move by about its size: planted in a copy of solutions/11-tensor/tp.c, f's
# backward all-reduce left out, g's backward all-reducing too, the skip path's gradient added before f's sum, the
# data group's average skipping the blocks or summing, each fails here at 680 to 3300 x the bound (0.8 to 4 x
# the move); on torch's side (f's Partial left out, RowwiseParallel's output left Partial, SyncBN's backward
# all-reduce left out) at ~1e11 x.
K_MOVE = 2e4
U32, U64 = 2.0 ** -24, 2.0 ** -53


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


# ---------------------------------------------------------------------------------------------- the kit's runs

def run_kit(export, out, tp, world):
    os.makedirs(out)
    cmd = [export, "--out", out, "--tp", str(tp), "--steps", str(STEPS), "--batch", str(BATCH),
           "--width", str(WIDTH), "--size", str(SIZE), "--lr", str(LR), "--seed", str(SEED)]
    if tp:
        cmd = [os.path.join(ROOT, "scripts", "launch.sh"), str(world)] + cmd
    # Under SANITIZE=1: ASan and UBSan on, the leak check off, as tests/run-dist-tests.sh has it (Open MPI keeps
    # memory until exit in plugins it has already unloaded: no suppression can name them)
    env = dict(os.environ, ASAN_OPTIONS=":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"])))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    if run.returncode != 0:
        fail(f"{' '.join(cmd)} exited {run.returncode}:\n{run.stdout}{run.stderr}")
    lines = [l for l in run.stdout.splitlines() if l.startswith("tp_export:")]
    print(f"  kit   {lines[-1][len('tp_export: '):] if lines else ''}")


def kit_tensors(path):
    """A kit checkpoint's parameters and BN running statistics: {kit name: float64 array}."""
    from ckpt_read import read_checkpoint
    ck = read_checkpoint(path)
    out = {n: a.astype("float64") for n, a in ck["params"].items()}
    out.update({n: a.astype("float64") for n, a in ck["buffers"].items()})
    return out, ck


# ---------------------------------------------------------------------------------------------- torch's side

def load_batches(d):
    import numpy as np
    import torch
    x = np.fromfile(os.path.join(d, "x.f32"), np.float32).reshape(STEPS * BATCH, 3, SIZE, SIZE)
    y = np.fromfile(os.path.join(d, "y.i32"), np.int32).astype(np.int64)
    return torch.from_numpy(x).to(DTYPE), torch.from_numpy(y)


def plain_model(init_ckpt):
    """tools/torch_models.py's resnet9 with the kit's initial weights (tools/ckpt_torch.py: by layer order)."""
    from ckpt_read import read_checkpoint
    from ckpt_torch import load_into
    from torch_models import resnet9
    model = resnet9(w=WIDTH, classes=CLASSES)
    load_into(model, read_checkpoint(init_ckpt))
    return model.to(DTYPE)


def kit_named(model, ck):
    """model's conv/BN/linear tensors under the kit's names (the reverse of ckpt_torch.load_into's mapping)."""
    from ckpt_torch import KINDS, kit_layers
    mods = [m for m in model.modules() if isinstance(m, tuple(KINDS.values()))]
    if len(mods) != len(kit_layers(ck)):
        fail(f"{len(kit_layers(ck))} kit layers with parameters, {len(mods)} in the PyTorch model")
    out = {}
    for (i, kind), mod in zip(kit_layers(ck), mods):
        pre = f"{i:02d}.{kind}."
        out[pre + "weight"] = mod.weight.detach().double().numpy().copy()
        if mod.bias is not None:
            out[pre + "bias"] = mod.bias.detach().double().numpy().copy()
        if kind == "bn":
            out[pre + "running_mean"] = mod.running_mean.double().numpy().copy()
            out[pre + "running_var"] = mod.running_var.double().numpy().copy()
    return out


def sgd(model):
    """The kit's SGD: weight decay on conv and linear weights (ndim > 1), none on biases and BN."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim > 1], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]
    # foreach=False: one tensor at a time, DTensor and plain tensors alike
    return torch.optim.SGD(groups, lr=LR, momentum=MOMENTUM, nesterov=True, foreach=False)


def train_plain(d, init_ckpt):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    x, y = load_batches(d)
    model = plain_model(init_ckpt)
    model.train()
    opt = sgd(model)
    for s in range(STEPS):
        rows = slice(s * BATCH, (s + 1) * BATCH)
        opt.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
    return model


def make_sync_bn():
    """SyncBN over a process group (the data dimension): lesson 05's two all-reduces, statistics in float64 as the
    kit's. A class made on demand: torch is imported only where it is installed."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    class SyncBNFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, running_mean, running_var, group):
            C = x.shape[1]
            xd = x.double()
            stats = torch.cat([xd.sum((0, 2, 3)), (xd * xd).sum((0, 2, 3)),
                               torch.tensor([x.numel() / C], dtype=torch.float64)])
            dist.all_reduce(stats, group=group)
            count = stats[2 * C]
            mean = stats[:C] / count
            var = (stats[C:2 * C] / count - mean * mean).clamp_min(0.0)  # biased: what normalises
            invstd = (1.0 / torch.sqrt(var + EPS)).to(x.dtype)
            with torch.no_grad():
                running_mean.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * mean.to(x.dtype))
                running_var.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * (var * count / (count - 1)).to(x.dtype))
            x_hat = (x - mean.to(x.dtype)[None, :, None, None]) * invstd[None, :, None, None]
            ctx.save_for_backward(x_hat, invstd, weight)
            ctx.group, ctx.count = group, float(count)
            return x_hat * weight[None, :, None, None] + bias[None, :, None, None]

        @staticmethod
        def backward(ctx, dy):
            x_hat, invstd, weight = ctx.saved_tensors
            C = dy.shape[1]
            sum_dy, sum_dy_xhat = dy.sum((0, 2, 3)), (dy * x_hat).sum((0, 2, 3))
            sums = torch.cat([sum_dy, sum_dy_xhat])
            dist.all_reduce(sums, group=ctx.group)
            g_dy, g_dy_xhat = sums[:C] / ctx.count, sums[C:] / ctx.count
            dx = (weight * invstd)[None, :, None, None] * (
                dy - g_dy[None, :, None, None] - x_hat * g_dy_xhat[None, :, None, None])
            # dgamma, dbeta: this replica's sums; the data dimension's gradient average makes them the mean's
            return dx, sum_dy_xhat, sum_dy, None, None, None

    class SyncBN(nn.BatchNorm2d):
        def __init__(self, bn, group):
            super().__init__(bn.num_features, eps=EPS, momentum=BN_MOMENTUM, dtype=DTYPE)
            self.load_state_dict(bn.state_dict())
            self.group = group

        def forward(self, x):
            if not self.training:
                return super().forward(x)
            return SyncBNFunction.apply(x, self.weight, self.bias, self.running_mean, self.running_var, self.group)

    return SyncBN


def tp_residual_classes():
    """The two ways torch's side splits a block: {style: class}."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class TPBlock(nn.Module):
        """What both styles share: BN1 on this rank's channels, BN2 whole, the gather."""

        def __init__(self, res, tp_mesh, make_bn):
            super().__init__()
            _, bn1, _, _, bn2, _ = res.f
            c = bn2.num_features
            T, t = tp_mesh.size(), tp_mesh.get_local_rank()
            self.mesh, self.c, self.k, self.group = tp_mesh, c, c // T, tp_mesh.get_group()
            # BN1: this rank's channels [t k, (t + 1) k) of the whole BN1
            local = nn.BatchNorm2d(self.k, eps=EPS, momentum=BN_MOMENTUM, dtype=DTYPE)
            with torch.no_grad():
                for name in ("weight", "bias", "running_mean", "running_var"):
                    getattr(local, name).copy_(getattr(bn1, name)[t * self.k:(t + 1) * self.k])
            self.bn1, self.bn2 = make_bn(local), make_bn(bn2)

        def gather_into(self, res):
            """The whole block into res (a Residual of the plain model): collective over the tensor group."""
            conv1, bn1, _, conv2, bn2, _ = res.f
            w1, w2 = self.whole_weights()
            with torch.no_grad():
                conv1.weight.copy_(w1.reshape(self.c, self.c, 3, 3))
                conv2.weight.copy_(w2.reshape(self.c, self.c, 3, 3))
                for name in ("weight", "bias", "running_mean", "running_var"):
                    part = getattr(self.bn1, name).detach().contiguous()
                    parts = [torch.empty_like(part) for _ in range(dist.get_world_size(self.group))]
                    dist.all_gather(parts, part, group=self.group)
                    getattr(bn1, name).copy_(torch.cat(parts))
                    getattr(bn2, name).copy_(getattr(self.bn2, name).detach())

    class LinearStyle(TPBlock):
        """ColwiseParallel / RowwiseParallel on the convs written as im2col + nn.Linear (the header)."""

        def __init__(self, res, tp_mesh, make_bn):
            super().__init__(res, tp_mesh, make_bn)
            conv1, _, _, conv2, _, _ = res.f
            c = self.c
            self.conv1 = nn.Linear(9 * c, c, bias=False, dtype=DTYPE)
            self.conv2 = nn.Linear(9 * c, c, bias=False, dtype=DTYPE)
            with torch.no_grad():
                self.conv1.weight.copy_(conv1.weight.reshape(c, 9 * c))
                self.conv2.weight.copy_(conv2.weight.reshape(c, 9 * c))
            parallelize_module(self, tp_mesh, {"conv1": ColwiseParallel(), "conv2": RowwiseParallel()})

        def forward(self, x):
            n, c, h, w = x.shape
            cols = F.unfold(x, 3, padding=1).transpose(1, 2)                # (N, HW, 9C) the patches
            a1 = self.conv1(cols).transpose(1, 2).reshape(n, self.k, h, w)  # (N, k, H, W) this rank's channels
            a2 = F.relu(self.bn1(a1))
            cols2 = F.unfold(a2, 3, padding=1).transpose(1, 2)              # (N, HW, 9k) this rank's rows of conv2
            z = self.conv2(cols2).transpose(1, 2).reshape(n, c, h, w)        # (N, C, H, W) summed over the group (g)
            return x + F.relu(self.bn2(z))

        def whole_weights(self):
            return self.conv1.weight.full_tensor(), self.conv2.weight.full_tensor()

    class ConvStyle(TPBlock):
        """The conv weights as DTensors (Shard(0): output channels, Shard(1): input channels), F.conv2d on the
        local shards, f and g as DTensor placements: the kit's all-reduces, on the same tensors."""

        def __init__(self, res, tp_mesh, make_bn):
            super().__init__(res, tp_mesh, make_bn)
            conv1, _, _, conv2, _, _ = res.f
            self.w1 = nn.Parameter(distribute_tensor(conv1.weight.detach().clone(), tp_mesh, [Shard(0)]))
            self.w2 = nn.Parameter(distribute_tensor(conv2.weight.detach().clone(), tp_mesh, [Shard(1)]))

        def forward(self, x):
            # f: x is the same on every rank (Replicate); the gradient of this rank's use of it is only its
            # channels' share (Partial), which from_local's backward all-reduces
            xf = DTensor.from_local(x, self.mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])
            a1 = F.conv2d(xf, self.w1.to_local(), padding=1)                # (N, k, H, W) this rank's channels
            a2 = F.relu(self.bn1(a1))
            part = F.conv2d(a2, self.w2.to_local(), padding=1)              # (N, C, H, W) this rank's share
            # g: the shares are a Partial sum; Replicate all-reduces it (its backward passes the gradient on)
            z = DTensor.from_local(part, self.mesh, [Partial()], run_check=False).redistribute(
                self.mesh, [Replicate()]).to_local()
            return x + F.relu(self.bn2(z))

        def whole_weights(self):
            return self.w1.full_tensor(), self.w2.full_tensor()

    return {"linear": LinearStyle, "conv": ConvStyle}


def train_tp(style, model_class, init_ckpt, mesh, make_bn, d, rank, out):
    """One model of style `style` trained STEPS steps; rank 0 saves the gathered whole to out."""
    import numpy as np
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor
    from torch_models import Residual
    D, replica, dp_group = mesh.size(0), mesh.get_local_rank("dp"), mesh.get_group("dp")
    model = plain_model(init_ckpt)
    for i, m in enumerate(model):  # the blocks split; the BNs of the layers between them synced over dp
        if isinstance(m, Residual):
            model[i] = model_class(m, mesh["tp"], make_bn)
        elif isinstance(m, nn.BatchNorm2d):
            model[i] = make_bn(m)
    model.train()
    opt = sgd(model)
    x, y = load_batches(d)
    n = BATCH // D
    losses = []
    for s in range(STEPS):
        rows = slice(s * BATCH + replica * n, s * BATCH + (replica + 1) * n)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[rows]), y[rows])
        loss.backward()
        losses.append(loss.item())
        if D > 1:  # the data dimension: every gradient (local shard or replicated) averaged over the replicas
            for p in model.parameters():
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(g, group=dp_group)
                g.div_(D)
        opt.step()

    whole = plain_model(init_ckpt)
    for i, m in enumerate(model):
        if isinstance(m, model_class):
            m.gather_into(whole[i])
        else:
            whole[i].load_state_dict(m.state_dict())
    if rank == 0:
        from ckpt_read import read_checkpoint
        np.savez(out, **kit_named(whole, read_checkpoint(init_ckpt)))
        print(f"  torch {mesh.size(1)} tensor rank(s) x {D} data replica(s) on gloo, {style} style: losses "
              + " ".join(f"{v:.4f}" for v in losses))


def tp_worker(rank, world, T, d, init_ckpt, store, out):
    """One process of torch's TP runs: rank `rank` of T x (world / T), each style in turn; out % style: rank 0's
    file of the gathered model."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    torch.set_num_threads(1)
    global DTYPE
    DTYPE = torch.float64
    # Every process is on this machine: gloo's connections on the loopback interface, whatever the host name
    # resolves to (a container's may resolve to nothing)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    D = world // T
    mesh = init_device_mesh("cpu", (D, T), mesh_dim_names=("dp", "tp"))  # tensor groups: consecutive ranks
    dp_group = mesh.get_group("dp")
    make_bn = (lambda bn: make_sync_bn()(bn, dp_group)) if D > 1 else (lambda bn: bn)
    for style, cls in tp_residual_classes().items():
        train_tp(style, cls, init_ckpt, mesh, make_bn, d, rank, out % style)
    dist.barrier()
    dist.destroy_process_group()


def run_torch_tp(d, init_ckpt, T, world, tmp):
    """{style: the gathered model's tensors under the kit's names}"""
    import numpy as np
    import torch.multiprocessing as mp
    out = os.path.join(tmp, f"torch-tp{T}-w{world}-%s.npz")
    store = os.path.join(tmp, f"store-tp{T}-w{world}")
    # fork: the children start with torch imported (a spawn imports it again in each, seconds apiece); the parent
    # has run no parallel region yet (one thread), so forking it is safe
    mp.start_processes(tp_worker, args=(world, T, d, init_ckpt, store, out), nprocs=world, join=True,
                       start_method="fork")
    runs = {}
    for style in STYLES:
        with np.load(out % style) as z:
            runs[style] = {k: z[k] for k in z.files}
    return runs


# ---------------------------------------------------------------------------------------------- the comparison

def compare(label, got, want, init, u):
    """got against want, tensor by tensor, within the bound of TOLERANCE for unit roundoff u: the worst ratio
    (<= 1 passes), and the worst error as a fraction of its tensor's move."""
    import numpy as np
    if set(got) != set(want):
        fail(f"{label}: tensors differ: {sorted(set(got) ^ set(want))}")
    worst, frac, at = 0.0, 0.0, ""
    for name in want:
        moved = float(np.abs(want[name] - init[name]).max())
        if moved == 0.0:
            fail(f"{label}: {name} did not move in {STEPS} steps: the comparison would say nothing about it")
        err = float(np.abs(got[name] - want[name]).max())
        bound = K_MOVE * u * moved + STEPS * u * float(np.abs(want[name]).max())
        if not err / bound <= worst:
            worst, frac, at = err / bound, err / moved, name
    print(f"  {label:58s} {worst:8.2e} of the bound ({at}: {frac:.1e} of its move) {'ok' if worst <= 1 else 'FAIL'}")
    return worst <= 1


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor.parallel import ColwiseParallel  # noqa: F401
    except ImportError as e:
        print(f"skipped: PyTorch not installed (pip install torch): {e}")
        return 0
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("skipped: numpy not installed (pip install numpy; Debian: python3-numpy)")
        return 0
    if not dist.is_available() or not dist.is_gloo_available():
        print("skipped: this PyTorch has no gloo backend (torch.distributed.is_gloo_available() is False)")
        return 0
    global DTYPE
    DTYPE = torch.float64
    start = time.time()
    print(f"lesson 11 vs PyTorch {torch.__version__}: resnet9 width {WIDTH}, {STEPS} SGD steps of {BATCH} "
          f"images {SIZE}x{SIZE}, lr {LR}")
    with tempfile.TemporaryDirectory() as tmp:
        kit = {}
        for name, tp, dp in SHAPES:
            d = os.path.join(tmp, f"kit-{tp}-{dp}")
            run_kit(sys.argv[1], d, tp, tp * dp)
            kit[name], ck = kit_tensors(os.path.join(d, "final.ckpt"))
        d0 = os.path.join(tmp, "kit-0-1")
        init_ckpt = os.path.join(d0, "init.ckpt")
        init, _ = kit_tensors(init_ckpt)
        for name, tp, dp in SHAPES[1:]:  # every run started from the same weights and saw the same images
            d = os.path.join(tmp, f"kit-{tp}-{dp}")
            for f in ("init.ckpt", "x.f32", "y.i32"):
                if open(os.path.join(d, f), "rb").read() != open(os.path.join(d0, f), "rb").read():
                    fail(f"the {name} run's {f} differs from the one-process run's")

        print(f"  kit runs: {time.time() - start:.1f} s")
        tor = {}
        for name, tp, dp in SHAPES[1:]:
            tor[name] = run_torch_tp(d0, init_ckpt, tp, tp * dp, tmp)
        print(f"  torch TP runs: {time.time() - start:.1f} s")
        ref = tor["one process"] = kit_named(train_plain(d0, init_ckpt), ck)
        print("  torch one process (nn.Conv2d): done")

        ok = True
        print(f"  worst error of each run against another, as a fraction of its bound (TOLERANCE):")
        for name, _, _ in SHAPES:
            ok &= compare(f"kit {name} vs torch one process", kit[name], ref, init, U32)
        for name, _, _ in SHAPES[1:]:
            for style, what in STYLES.items():
                ok &= compare(f"torch {name} ({what}) vs one process", tor[name][style], ref, init, U64)
                ok &= compare(f"kit {name} vs torch {name} ({what})", kit[name], tor[name][style], init, U32)
    print(f"  {time.time() - start:.1f} s")
    if not ok:
        fail("a run differs from another beyond the rounding bound (TOLERANCE): a tensor that a wrong split "
             "(a missing or doubled all-reduce, a shard in the wrong place) feeds a wrong gradient")
    print("PASS: tests/lesson11/torch/torch_tp.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
