"""tools/torch_models.py: the kit's architectures (kit/model.c's ARCHS) rebuilt in PyTorch, for every bench and tool.

    import sys; sys.path.insert(0, "tools")
    from torch_models import build
    model = build("resnet9", w=8, classes=10, in_c=3, size=32)

Same layers, widths, kernel sizes and padding as the kit; a conv has a bias only when no BN follows it. The
conv/BN/linear modules come in the kit's layer order, so tools/ckpt_torch.py loads a kit checkpoint into them by
position. Used by bench/torch_cpu.py, bench/torch_gpu.py, bench/torch_infer.py and tests/test_ckpt_torch.py.
Needs PyTorch; the kit itself never does.
"""
import torch.nn as nn


def conv_block(cin, cout, bn=True, inplace=False):
    """kit: add_conv(..., bias = !bn), then BN, then ReLU. inplace: the ReLU overwrites (the GPU bench's choice)."""
    layers = [nn.Conv2d(cin, cout, 3, padding=1, bias=not bn)]
    if bn:
        layers.append(nn.BatchNorm2d(cout))
    layers.append(nn.ReLU(inplace=inplace))
    return layers


class Residual(nn.Module):
    """x + block(block(x)), as kit/model.c residual()."""

    def __init__(self, c, inplace=False):
        super().__init__()
        self.f = nn.Sequential(*conv_block(c, c, inplace=inplace), *conv_block(c, c, inplace=inplace))

    def forward(self, x):
        return x + self.f(x)


def resnet9(w=64, classes=10, in_c=3, size=32, inplace=False):
    """Global average pooling at the end: any input size."""
    def block(cin, cout):
        return conv_block(cin, cout, inplace=inplace)
    return nn.Sequential(
        *block(in_c, w),                                      # prep
        *block(w, 2 * w), nn.MaxPool2d(2),                    # stage 1
        Residual(2 * w, inplace),
        *block(2 * w, 4 * w), nn.MaxPool2d(2),                # stage 2
        *block(4 * w, 8 * w), nn.MaxPool2d(2),                # stage 3
        Residual(8 * w, inplace),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8 * w, classes))


def fmnist(w=32, classes=10, in_c=1, size=28, inplace=False):
    """2 x (conv 3x3 without bias + BN + ReLU + max-pool), then a linear layer with bias."""
    return nn.Sequential(
        *conv_block(in_c, w, inplace=inplace), nn.MaxPool2d(2),
        *conv_block(w, 2 * w, inplace=inplace), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * w * (size // 4) ** 2, classes))


def tiny_bn(w=16, classes=10, in_c=3, size=32, inplace=False):
    """kit/model.c build_tiny_common with BN: two conv-BN-ReLU-pool blocks (w/2, w channels), global average pool."""
    return nn.Sequential(*conv_block(in_c, w // 2, inplace=inplace), nn.MaxPool2d(2),
                         *conv_block(w // 2, w, inplace=inplace), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w, classes))


def tiny(w=16, classes=10, in_c=3, size=32, inplace=False):
    """kit/model.c build_tiny: tiny_bn without BN (so its convs have a bias)."""
    return nn.Sequential(*conv_block(in_c, w // 2, bn=False, inplace=inplace), nn.MaxPool2d(2),
                         *conv_block(w // 2, w, bn=False, inplace=inplace), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w, classes))


# name -> (builder, the kit's default width)
ARCHS = {"resnet9": (resnet9, 64), "fmnist": (fmnist, 32), "tiny-bn": (tiny_bn, 16), "tiny": (tiny, 16)}


def build(name, w=0, classes=10, in_c=3, size=32, inplace=False):
    """The kit's `name` for inputs (in_c, size, size); w 0: the kit's default width. KeyError on another name."""
    make, default_w = ARCHS[name]
    return make(w=w or default_w, classes=classes, in_c=in_c, size=size, inplace=inplace)
