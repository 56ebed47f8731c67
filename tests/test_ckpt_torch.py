#!/usr/bin/env python3
"""tests/test_ckpt_torch.py: the checkpoint is an interchange format, not a memory dump.

    python3 tests/test_ckpt_torch.py BUILD/tests/ckpt_torch_export

1. The C program trains the kit's resnet9 (width 8) a few steps, saves model.ckpt, and writes its own eval-mode
   logits on 500 synthetic test images.
2. tools/ckpt_read.py (numpy only) reads the file; a copy with one flipped byte in a tensor is refused.
3. The tensors go into tools/torch_models.py's resnet9 through tools/ckpt_torch.py, by layer order (the kit says
   "03.conv.weight", PyTorch "3.weight" or "7.f.0.weight": the mapping is by position among conv/BN/linear
   layers, with no wrapper prefix to strip), and PyTorch in eval mode must give the kit's logits and the same
   accuracy.

Needs numpy (python3-numpy); the PyTorch part is skipped, saying so, when torch is not installed
(Debian: python3-torch; it is never installed by the kit's scripts). Exit 0 = passed or skipped, 1 = failed.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import numpy as np  # noqa: E402

from ckpt_read import CheckpointError, decode, read_checkpoint  # noqa: E402

N, CLASSES = 500, 10


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run([sys.argv[1], out], capture_output=True, text=True)
        if run.returncode != 0:
            fail(f"{sys.argv[1]} exited {run.returncode}: {run.stderr.strip()}")
        print(run.stdout.strip())
        path = os.path.join(out, "model.ckpt")
        ck = read_checkpoint(path)
        h = ck["header"]
        if (h["model"], h["width"], h["step"], h["dataset"]) != ("resnet9", 8, 40, "synthetic"):
            fail(f"header fields read back wrong: {h}")
        print(f"numpy reader: {len(ck['params'])} params, {len(ck['momentum'])} momentum, "
              f"{len(ck['buffers'])} buffers, step {h['step']}")

        # One flipped byte in the last tensor must be refused, naming it.
        data = bytearray(open(path, "rb").read())
        data[-17] ^= 0x10  # the last data byte, just before the 16-byte trailer
        try:
            decode(bytes(data))
            fail("a corrupt tensor was accepted by tools/ckpt_read.py")
        except CheckpointError as e:
            if "CRC mismatch" not in str(e):
                fail(f"corrupt file refused for the wrong reason: {e}")
            print(f"numpy reader refuses a flipped byte: {e}")

        x = np.fromfile(os.path.join(out, "x.f32"), np.float32).reshape(N, 3, 32, 32)
        y = np.fromfile(os.path.join(out, "y.i32"), np.int32)
        kit_logits = np.fromfile(os.path.join(out, "logits.f32"), np.float32).reshape(N, CLASSES)

        try:
            import torch
            from ckpt_torch import load_into
            from torch_models import resnet9
        except ImportError as e:
            print(f"SKIP: PyTorch part: {e} (Debian: apt install python3-torch; or pip install torch)")
            return 0

        model = resnet9(w=8, classes=CLASSES)
        try:
            load_into(model, ck)
        except ValueError as e:
            fail(str(e))
        model.eval()
        with torch.no_grad():
            torch.set_num_threads(1)
            logits = model(torch.from_numpy(x)).numpy()

        # Tolerance: both compute in float32 (rounding 6e-8 relative per operation). A dot product of K <= 576
        # terms errs by about sqrt(K) * 6e-8 ~ 1.5e-6 of its scale; nine conv/BN layers, each BN dividing by a
        # running std that can be ~0.1, grow that to ~1e-4 of the logits' scale at worst. 1e-3 of the scale
        # leaves a 10x margin and is still far below any difference a wrong or misplaced tensor makes (O(1)).
        scale = max(1.0, float(np.abs(kit_logits).max()))
        err = float(np.abs(logits - kit_logits).max()) / scale
        print(f"PyTorch vs kit logits: max |difference| / scale = {err:.2e} (scale {scale:.2f})")
        if not err <= 1e-3:
            fail(f"PyTorch's logits differ from the kit's by {err:.2e} of their scale (tolerance 1e-3)")
        kit_correct = int((kit_logits.argmax(1) == y).sum())
        torch_correct = int((logits.argmax(1) == y).sum())
        # Equal predictions except where the kit's top two logits are closer than the tolerance (a true tie).
        top2 = np.sort(kit_logits, 1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2e-3 * scale
        if (kit_logits.argmax(1) != logits.argmax(1))[clear].any():
            fail("PyTorch predicts another class than the kit on an image where the kit's margin is clear")
        print(f"accuracy: kit {kit_correct}/{N}, PyTorch {torch_correct}/{N}")
        if kit_correct != torch_correct and clear.all():
            fail("the accuracies differ")
    print("PASS: tests/test_ckpt_torch.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
