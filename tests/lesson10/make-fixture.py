#!/usr/bin/env python3
"""tests/lesson10/make-fixture.py: lesson 10's PyTorch references (tests/lesson10/test_lesson10.c reads them).

    python3 tests/lesson10/make-fixture.py            # rewrite tests/lesson10/fixtures/ (deterministic)
    python3 tests/lesson10/make-fixture.py --check    # regenerate in memory and compare with the committed files,
                                                      # and check the test's float formulas on all 65536 patterns

What PyTorch computes here (CPU, no GPU needed):
  rounding.bin  float32 -> bfloat16 and float32 -> float16 (Tensor.to), on inputs chosen at the boundaries that
                the rules of round-to-nearest-even decide: for every float32 exponent, mantissas just below, at and
                just above a tie (even and odd kept bit), the carry into the next exponent, both signs; around
                fp16's largest finite value (65504, the tie 65520), its smallest normal (2^-14) and subnormals down
                to the tie at 2^-25; infinities and NaNs (also NaNs whose payload lies only in the bits rounding
                drops); and seeded random patterns. Format: magic "L10ROUND", uint32 count, then count records
                {uint32 float bits, uint16 bf16 bits, uint16 fp16 bits}, little-endian.
  scaler.txt    torch.amp.GradScaler("cpu")'s scale after each step of a fixed pattern of steps whose gradient
                holds an inf, with growth_interval 3 (init 65536, growth 2, backoff 0.5): what scaler_update must
                reproduce. One line per step: step, 1 if its gradient was infinite, the scale after update().

The test itself needs neither Python nor PyTorch. `make torch-check-lesson10` runs --check; without torch it
prints one line saying why and succeeds.
"""
import argparse
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
MAGIC = b"L10ROUND"

SCALER_INIT, SCALER_INTERVAL = 65536.0, 3
# 1: the step's gradient has an inf. Runs of good steps longer and shorter than the interval, skips in a row,
# a skip right after a growth, and growth back after backing off.
SCALER_PATTERN = [0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
                  1, 0, 0, 0, 0]


def rounding_inputs():
    """float32 bit patterns (ints), without duplicates, in a fixed order."""
    xs = []
    # bf16 keeps the top 16 bits: the dropped half is 16 bits; the kept mantissa's last bit decides ties.
    for sign in (0, 1):
        for e in range(256):
            for hi in (0x00, 0x01, 0x7E, 0x7F):          # kept mantissa bits: even, odd, and the carry's all-ones
                for lo in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
                    xs.append(sign << 31 | e << 23 | hi << 16 | lo)
    # fp16: normal exponents 2^-14 .. 2^15 keep 10 of the 23 mantissa bits (13 dropped); below 2^-14 fewer.
    for sign in (0, 1):
        for e in range(127 - 26, 127 + 17):
            for hi in (0x000, 0x001, 0x3FE, 0x3FF):
                for lo in (0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF):
                    xs.append(sign << 31 | e << 23 | hi << 13 | lo)
            # subnormal results: the rounding position moves up by one bit per exponent below -14
            shift = 13 + max(0, (127 - 14) - e)
            if shift < 24:
                for m in (1 << shift) - 1, 1 << (shift - 1), (1 << (shift - 1)) + 1, (1 << (shift - 1)) - 1, \
                         (3 << (shift - 1)) & 0x7FFFFF, ((3 << (shift - 1)) + 1) & 0x7FFFFF:
                    xs.append(sign << 31 | e << 23 | (m & 0x7FFFFF))
    named = [65504.0, 65519.0, 65519.99609375, 65520.0, 65520.00390625, 65536.0, 2.0 ** -14, 2.0 ** -24,
             2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -26, 1.5 * 2.0 ** -24, 2.5 * 2.0 ** -24, 1.0, 3.0e38,
             3.3895313892515355e38, 3.4028234663852886e38, 1e-45, 1.17549435e-38]
    for v in named:
        for s in (1.0, -1.0):
            xs.append(struct.unpack("<I", struct.pack("<f", s * v))[0])
    # inf, the quiet NaN, NaNs with a payload only in the low bits (rounding must not carry them into inf)
    xs += [0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7F801000, 0x7F808000,
           0x7FFFFFFF, 0xFFFFFFFF, 0x00000000, 0x80000000]
    # seeded random patterns: any bits, and any bits in fp16's range
    state = 20251126
    for i in range(3000):
        state = (state * 6364136223846793005 + 1442695040888963407) & (2 ** 64 - 1)
        r = state >> 32
        if i % 2:
            e = 127 - 26 + (r >> 23) % 43
            r = (r & 0x807FFFFF) | e << 23
        xs.append(r)
    seen, out = set(), []
    for x in xs:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def rounding_bytes(torch):
    xs = rounding_inputs()
    import numpy as np
    f = torch.from_numpy(np.array(xs, dtype=np.uint32).view(np.float32).copy())
    b = f.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    h = f.to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    out = bytearray(MAGIC + struct.pack("<I", len(xs)))
    for x, bb, hh in zip(xs, b.tolist(), h.tolist()):
        out += struct.pack("<IHH", x, bb, hh)
    return bytes(out)


def scaler_text(torch):
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALER_INIT, growth_factor=2.0, backoff_factor=0.5,
                                  growth_interval=SCALER_INTERVAL)
    lines = ["# torch.amp.GradScaler('cpu', init_scale=%g, growth_factor=2, backoff_factor=0.5, growth_interval=%d)"
             % (SCALER_INIT, SCALER_INTERVAL), "# step inf scale_after_update",
             "init %g interval %d" % (SCALER_INIT, SCALER_INTERVAL)]
    for step, inf in enumerate(SCALER_PATTERN):
        opt.zero_grad()
        loss = (p * (float("inf") if inf else 1.0)).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        lines.append("%d %d %.9g" % (step, inf, scaler.get_scale()))
    return "\n".join(lines) + "\n"


def check_formulas(torch):
    """The test's exact formulas for bf16 -> float (bits << 16) and fp16 -> float (sign, exponent, mantissa) on all
    65536 patterns, against PyTorch's conversions. Returns a list of problems."""
    import numpy as np
    pat = np.arange(65536, dtype=np.uint32)
    tb = torch.from_numpy(pat.astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    th = torch.from_numpy(pat.astype(np.uint16).view(np.int16).copy()).view(torch.float16).float().numpy()
    fb = (pat << 16).astype(np.uint32).view(np.float32)
    e, m = (pat >> 10) & 0x1F, pat & 0x3FF
    fh = np.where(e == 0, np.ldexp(m.astype(np.float64), -24),
                  np.where(e == 31, np.where(m == 0, np.inf, np.nan), np.ldexp((m + 1024).astype(np.float64), e.astype(np.int64) - 25)))
    fh = np.copysign(fh, np.where(pat & 0x8000, -1.0, 1.0)).astype(np.float32)
    problems = []
    for name, ref, mine in (("bf16", tb, fb), ("fp16", th, fh)):
        same = (ref.view(np.uint32) == mine.view(np.uint32)) | (np.isnan(ref) & np.isnan(mine) &
                                                                 (np.signbit(ref) == np.signbit(mine)))
        if not same.all():
            i = int(np.argmin(same))
            problems.append("%s pattern 0x%04x: torch %r, the test's formula %r" % (name, i, ref[i], mine[i]))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    args = ap.parse_args()
    try:
        import torch
        import numpy  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any failed import: say why and skip)
        print("torch-check lesson 10: skipped: PyTorch or numpy does not import here (%s)" % str(e).splitlines()[0])
        return 0
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        print("torch-check lesson 10: skipped: torch %s has no torch.amp.GradScaler('cpu') (2.3 or newer)"
              % torch.__version__)
        return 0
    files = {"rounding.bin": rounding_bytes(torch), "scaler.txt": scaler_text(torch).encode()}
    if not args.check:
        os.makedirs(OUT, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(data)
            print("wrote %s (%d bytes)" % (os.path.relpath(os.path.join(OUT, name)), len(data)))
        return 0
    bad = check_formulas(torch)
    for name, data in files.items():
        path = os.path.join(OUT, name)
        try:
            with open(path, "rb") as f:
                old = f.read()
        except OSError as e:
            bad.append("%s: %s" % (path, e))
            continue
        if old != data:
            bad.append("%s differs from what torch %s computes now (regenerate: python3 %s)"
                       % (os.path.relpath(path), torch.__version__, os.path.relpath(__file__)))
    if bad:
        for b in bad:
            print("torch-check lesson 10: FAIL: " + b)
        return 1
    n = struct.unpack("<I", files["rounding.bin"][8:12])[0]
    print("torch-check lesson 10: ok: torch %s gives the committed %d rounding cases and %d scaler steps; the test's "
          "bf16/fp16 -> float formulas equal torch's on all 65536 patterns" % (torch.__version__, n, len(SCALER_PATTERN)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
