"""tools/ckpt_torch.py: a kit checkpoint's tensors into a PyTorch model of the same architecture.

    from ckpt_read import read_checkpoint
    from ckpt_torch import load_into
    load_into(model, read_checkpoint("model.ckpt"))   # raises ValueError when the layers do not line up

The kit names a tensor by its layer's index and kind ("03.conv.weight", "04.bn.running_mean"); PyTorch by its
module path ("3.weight", "7.f.0.weight"). The mapping is by position: the k-th of the kit's conv/BN/linear
layers goes into the k-th nn.Conv2d/BatchNorm2d/Linear of `model.modules()`, with no name to translate.
Used by tests/test_ckpt_torch.py (which checks the logits it gives) and bench/torch_infer.py. Needs PyTorch;
the kit itself never does.
"""
import torch
import torch.nn as nn

KINDS = {"conv": nn.Conv2d, "bn": nn.BatchNorm2d, "linear": nn.Linear}


def kit_layers(ck):
    """The kit's parameterised layers in order: [(index, kind)] from names "NN.kind.what"."""
    return sorted({(int(n.split(".")[0]), n.split(".")[1]) for n in ck["params"]})


def load_into(model, ck):
    """Copies ck's parameters and BN running statistics into `model`, layer by layer, in place."""
    mods = [m for m in model.modules() if isinstance(m, tuple(KINDS.values()))]
    layers = kit_layers(ck)
    if len(mods) != len(layers):
        raise ValueError(f"{len(layers)} kit layers with parameters, {len(mods)} in the PyTorch model")
    P, B = ck["params"], ck["buffers"]
    with torch.no_grad():
        for (i, kind), mod in zip(layers, mods):
            if not isinstance(mod, KINDS[kind]):
                raise ValueError(f"kit layer {i:02d}.{kind} lines up with PyTorch's {type(mod).__name__}")
            pre = f"{i:02d}.{kind}."
            mod.weight.copy_(torch.from_numpy(P[pre + "weight"]))
            if mod.bias is not None:
                mod.bias.copy_(torch.from_numpy(P[pre + "bias"]))
            if kind == "bn":
                mod.running_mean.copy_(torch.from_numpy(B[pre + "running_mean"]))
                mod.running_var.copy_(torch.from_numpy(B[pre + "running_var"]))
    return model
