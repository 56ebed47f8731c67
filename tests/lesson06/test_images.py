#!/usr/bin/env python3
"""Lesson 06's image reader (solutions/06-inference/image.c) against files made by other encoders.

    tests/lesson06/test_images.py BUILD/tests/lesson06/image_probe

Every file is written here, at test time, into a temporary folder: by PIL (Pillow) when it is installed, and
by a small PNG writer below (zlib + struct: chunks written by hand, for what PIL cannot write: a gAMA chunk,
16-bit colour, 1/2/4-bit gray, a gray palette with tRNS, an 8000 x 8000 header). What the kit's reader must
give: the bytes the file stores, as PIL gives them to a PyTorch model (see the comment above read_png in
image.c for the rules, 16-bit included). Without PIL the comparisons with PIL are skipped, saying so; the
expected values of the hand-written files are computed here either way.
"""
import os
import resource
import struct
import subprocess
import sys
import tempfile
import warnings
import zlib

warnings.simplefilter("ignore", UserWarning)  # PIL on a palette with tRNS: advice, not a problem here
try:
    from PIL import Image
except ImportError:  # the comparisons with PIL are skipped, saying so
    Image = None

PROBE = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else sys.exit("usage: test_images.py IMAGE_PROBE")
failed = 0


def ok(msg):
    print(f"ok   lesson 06 images: {msg}")


def bad(msg):
    global failed
    failed = 1
    print(f"!! FAIL: lesson 06 images: {msg}")


def skip(msg):
    print(f"skip lesson 06 images: {msg}")


# ---------------------------------------------------------------- a PNG writer that is not the kit's
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def pack_row(samples, depth):
    """One scanline's samples (ints) at a bit depth of 1, 2, 4, 8 or 16, big-endian, filter type 0."""
    if depth == 16:
        return b"\0" + b"".join(struct.pack(">H", v) for v in samples)
    if depth == 8:
        return b"\0" + bytes(samples)
    per = 8 // depth
    out = bytearray()
    for i in range(0, len(samples), per):
        byte = 0
        for j, v in enumerate(samples[i:i + per]):
            byte |= v << (8 - depth * (j + 1))
        out.append(byte)
    return b"\0" + bytes(out)


def write_png(path, w, h, color_type, depth, rows, extra=()):
    """rows: h lists of samples (w * channels each); extra: (kind, data) chunks placed before IDAT."""
    raw = b"".join(pack_row(r, depth) for r in rows)
    body = chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0))
    body += b"".join(chunk(k, d) for k, d in extra)
    body += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + body)


def probe(path, c, h, w):
    """(channels, planar bytes) or ('error', message)."""
    out = subprocess.run([PROBE, path, str(c), str(h), str(w)], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    if out.returncode != 0:
        return "error", (lines[0] if lines else out.stderr.strip())
    cc, hh, ww = map(int, lines[0].split()[1:])
    assert (hh, ww) == (h, w), f"probe: {hh}x{ww}, asked for {h}x{w}"
    return cc, [int(v) for v in lines[1].split()] if len(lines) > 1 and lines[1] else []


def planar(pixels, c):
    """Interleaved (h * w pixels of c samples, or plain ints for c = 1) -> planar (c, h, w)."""
    if c == 1:
        return [p if isinstance(p, int) else p[0] for p in pixels]
    return [p[ch] for ch in range(c) for p in pixels]


def pil_pixels(img):
    get = getattr(img, "get_flattened_data", None) or img.getdata
    return list(get())


def expect(what, path, want_c, want, c_model=None, h=4, w=5):
    got_c, got = probe(path, c_model or want_c, h, w)
    if got_c == "error":
        bad(f"{what}: refused: {got}")
    elif got_c != want_c:
        bad(f"{what}: {got_c} channel(s), want {want_c}")
    elif got != want:
        diff = [(i, g, e) for i, (g, e) in enumerate(zip(got, want)) if g != e][:4]
        bad(f"{what}: other values than the file stores: (index, read, stored) {diff}")
    else:
        ok(f"{what}: {want_c} channel(s), the stored values ({min(want)}..{max(want)})")


W, H = 5, 4
GRAY8 = [[(x * 53 + y * 17 + 1) % 256 for x in range(W)] for y in range(H)]  # includes 1, 64, 128 below
GRAY8[0][:3] = [1, 64, 128]
RGB8 = [[(x * 41 + y * 29 + c * 97 + 1) % 256 for x in range(W) for c in range(3)] for y in range(H)]
RGB8[0][:3] = [1, 64, 128]


def planar_rows(rows, c):
    return [r[x * c + ch] for ch in range(c) for r in rows for x in range(len(r) // c)]


def main():
    d = tempfile.mkdtemp()
    try:
        run(d)
    finally:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
    print("lesson 06 images: every check passed" if not failed else "lesson 06 images: some checks FAILED")
    return failed


def run(d):
    p = lambda name: os.path.join(d, name)
    gama1 = [(b"gAMA", struct.pack(">I", 100000))]  # gamma 1.0: a linear-light file
    # ---- gamma: the stored values, whatever gAMA says (libpng's simplified reader converted them)
    write_png(p("gama-gray.png"), W, H, 0, 8, GRAY8, gama1)
    expect("8-bit gray with gAMA 1.0", p("gama-gray.png"), 1, planar_rows(GRAY8, 1))
    write_png(p("gama-rgb.png"), W, H, 2, 8, RGB8, gama1)
    expect("8-bit RGB with gAMA 1.0", p("gama-rgb.png"), 3, planar_rows(RGB8, 3))
    # ---- 16 bits: v * 257 gives v back; any value keeps its high byte (PIL's colour rule, torchvision's scaling)
    g16 = [[v * 257 for v in r] for r in GRAY8]
    write_png(p("gray16.png"), W, H, 0, 16, g16)
    expect("16-bit gray of an 8-bit picture (v * 257)", p("gray16.png"), 1, planar_rows(GRAY8, 1))
    odd16 = [[(x * 9973 + y * 31337 + 255) % 65536 for x in range(W)] for y in range(H)]
    write_png(p("gray16-odd.png"), W, H, 0, 16, odd16)
    expect("16-bit gray, any values: v >> 8", p("gray16-odd.png"), 1, [v >> 8 for v in planar_rows(odd16, 1)])
    rgb16 = [[(x * 7919 + y * 104729 + c * 4099) % 65536 for x in range(W) for c in range(3)] for y in range(H)]
    write_png(p("rgb16.png"), W, H, 2, 16, rgb16)
    expect("16-bit RGB: v >> 8", p("rgb16.png"), 3, [v >> 8 for v in planar_rows(rgb16, 3)])
    # ---- low-depth gray: bits repeated up to 0..255 (1 -> 255, 2 bits: x 85, 4 bits: x 17)
    for depth in (1, 2, 4):
        top = (1 << depth) - 1
        rows = [[(x + y * 3) % (top + 1) for x in range(W)] for y in range(H)]
        write_png(p(f"gray{depth}.png"), W, H, 0, depth, rows)
        expect(f"{depth}-bit gray", p(f"gray{depth}.png"), 1, [v * 255 // top for v in planar_rows(rows, 1)])
    # ---- palettes: all-gray entries make a gray image; colour entries a colour one; tRNS dropped
    gray_pal = b"".join(bytes((v, v, v)) for v in range(0, 256, 17))  # 16 gray entries
    idx = [[(x * 3 + y * 5) % 16 for x in range(W)] for y in range(H)]
    write_png(p("pal-gray.png"), W, H, 3, 8, idx, [(b"PLTE", gray_pal), (b"tRNS", bytes(range(0, 256, 17)))])
    expect("a palette of gray entries (with tRNS)", p("pal-gray.png"), 1, [v * 17 for v in planar_rows(idx, 1)],
           c_model=1)
    col_pal = b"".join(bytes((v, 255 - v, (v * 7) % 256)) for v in range(0, 256, 17))
    write_png(p("pal-colour.png"), W, H, 3, 8, idx, [(b"PLTE", col_pal)])
    want = [col_pal[i * 3 + ch] for ch in range(3) for r in idx for i in r]
    expect("a palette of colours", p("pal-colour.png"), 3, want)
    # ---- alpha: dropped (PIL's convert("RGB") / convert("L")), never composited
    rgba = [[v for x in range(W) for v in (RGB8[y][x * 3], RGB8[y][x * 3 + 1], RGB8[y][x * 3 + 2], (x * 60) % 256)]
            for y in range(H)]
    write_png(p("rgba.png"), W, H, 6, 8, rgba)
    expect("RGBA, alpha 0..240", p("rgba.png"), 3, planar_rows(RGB8, 3))
    # ---- size: the header decides, before any pixel is decoded
    big = 8000
    with open(p("big.png"), "wb") as f:
        z = zlib.compressobj(1)
        data = b"".join(z.compress(b"\0" * (big + 1)) for _ in range(big)) + z.flush()
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", big, big, 8, 0, 0, 0, 0))
                + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    write_png(p("small.png"), 28, 28, 0, 8, [[0] * 28] * 28)
    rss_small, out_small = rss_kb(p("small.png"))
    rss_big, out_big = rss_kb(p("big.png"))
    # One decoded 8000 x 8000 gray plane is 64000 KB (twice that with the planar copy); half of it is the bound.
    if "8000x8000" not in out_big or not out_big.startswith("error:"):
        bad(f"an 8000 x 8000 PNG for a 28 x 28 model: want a refusal naming 8000x8000, got {out_big[:150]!r}")
    elif rss_big > rss_small + 32000:
        bad(f"an 8000 x 8000 PNG: refused, but after using {rss_big} KB (a 28 x 28 one: {rss_small} KB): decoded first?")
    else:
        ok(f"an 8000 x 8000 PNG refused from its header ({rss_big} KB resident, a 28 x 28 image {rss_small} KB): "
           f"{out_big[:110]}")
    got_c, msg = probe(d, 1, 28, 28)
    if got_c == "error" and "directory" in msg and "9223372036854775807" not in msg:
        ok(f"a directory: {msg[:110]}")
    else:
        bad(f"a directory must be refused as one, got {msg!r:.150}")
    # ---- against PIL itself
    if Image is None:
        skip("the comparisons with PIL: Pillow is not installed (pip install pillow)")
        return
    compare_pil(d, p)


def rss_kb(path):
    """Peak resident KB of the probe reading path into a 28 x 28 gray image, and its first output line."""
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(r.stdout.splitlines()[0])")
    out = subprocess.run([sys.executable, "-c", code, PROBE, path, "1", "28", "28"], capture_output=True, text=True,
                         timeout=120).stdout.splitlines()
    return int(out[0]), out[1] if len(out) > 1 else ""


def compare_pil(d, p):
    """Files written by PIL, and the hand-written ones, read by PIL: the kit must give what PIL gives."""
    def same_as_pil(what, path, mode, c):
        img = Image.open(path)
        want = planar(pil_pixels(img.convert(mode)), c)
        expect(f"{what} (= PIL's convert({mode!r}))", path, c, want)

    im = Image.new("I;16", (W, H))
    im.putdata([v * 257 for r in GRAY8 for v in r])
    im.save(p("pil-gray16.png"))
    got = Image.open(p("pil-gray16.png"))
    want = [v >> 8 for v in pil_pixels(got)]
    expect(f"16-bit gray written by PIL (read by PIL as {got.mode!r}, >> 8)", p("pil-gray16.png"), 1, want)
    clipped = planar(pil_pixels(got.convert("L")), 1)
    print(f"note lesson 06 images: PIL's convert('L') of that 16-bit file gives {sorted(set(clipped))[:4]} "
          f"(it clips at 255), the stored picture is {want[:3]}...: the kit keeps the stored picture")
    pal = Image.new("P", (W, H))
    pal.putpalette([v for g in range(256) for v in (g, g, g)])
    pal.putdata([v for r in GRAY8 for v in r])
    pal.save(p("pil-pal-gray.png"))
    same_as_pil("a gray palette written by PIL", p("pil-pal-gray.png"), "L", 1)
    pal.putpalette([v for g in range(256) for v in (g, 255 - g, (g * 3) % 256)])
    pal.save(p("pil-pal-colour.png"))
    same_as_pil("a colour palette written by PIL", p("pil-pal-colour.png"), "RGB", 3)
    rgba = Image.new("RGBA", (W, H))
    rgba.putdata([(RGB8[y][x * 3], RGB8[y][x * 3 + 1], RGB8[y][x * 3 + 2], (x * 60 + y) % 256)
                  for y in range(H) for x in range(W)])
    rgba.save(p("pil-rgba.png"))
    same_as_pil("RGBA written by PIL", p("pil-rgba.png"), "RGB", 3)
    la = Image.new("LA", (W, H))
    la.putdata([(GRAY8[y][x], (x * 50) % 256) for y in range(H) for x in range(W)])
    la.save(p("pil-la.png"))
    same_as_pil("gray + alpha written by PIL", p("pil-la.png"), "L", 1)
    for name, mode, c in (("gama-gray.png", "L", 1), ("gama-rgb.png", "RGB", 3), ("rgb16.png", "RGB", 3),
                          ("gray1.png", "L", 1), ("gray2.png", "L", 1), ("gray4.png", "L", 1),
                          ("pal-gray.png", "L", 1), ("pal-colour.png", "RGB", 3), ("rgba.png", "RGB", 3)):
        same_as_pil(f"{name} read by PIL", p(name), mode, c)


if __name__ == "__main__":
    sys.exit(main())
