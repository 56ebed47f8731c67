#!/usr/bin/env python3
"""tools/ckpt_read.py: reads a kit checkpoint (kit/ckpt.h, layout in kit/CHECKPOINT.md) with numpy alone.

    from ckpt_read import read_checkpoint
    ck = read_checkpoint("run/ckpt-00000780.ckpt")
    ck["header"]["step"], ck["params"]["03.conv.weight"].shape, ck["momentum"][...], ck["buffers"][...]

    python3 tools/ckpt_read.py FILE        prints the header and the tensor table

Every check of the C reader is made here too (magic, version, sizes, the CRC-32 of the header, the table, every
tensor and the whole file): a corrupt file raises CheckpointError naming what is wrong, never a partial dict.
"""
import struct
import sys
import zlib

import numpy as np

MAGIC = b"KITCKPT\0"
END_MAGIC = b"KITCKEND"
VERSION = 1
HEADER_BYTES = 240
ENTRY_BYTES = 96
TRAILER_BYTES = 16
GROUPS = ("params", "momentum", "buffers")
DTYPES = {0: np.dtype("<f4")}

# The header after magic, version and header size, in order (little-endian; s = NUL-padded string).
HEADER_FIELDS = [
    ("model", "24s"), ("width", "i"), ("in_c", "i"), ("in_h", "i"), ("in_w", "i"), ("classes", "i"),
    ("dataset", "32s"), ("world", "i"), ("global_batch", "i"), ("steps_per_epoch", "i"), ("epochs", "i"),
    ("epoch", "i"), ("batch_in_epoch", "i"), ("step", "q"), ("seed", "Q"),
    ("peak_lr", "f"), ("final_lr", "f"), ("warmup_steps", "i"), ("total_steps", "i"), ("decay", "i"),
    ("momentum", "f"), ("weight_decay", "f"), ("nesterov", "i"),
    ("loss_sum", "d"), ("correct", "q"), ("count", "q"), ("images", "q"), ("last_loss", "d"), ("test_acc", "d"),
    ("n_tensors", "I"), ("table_crc", "I"), ("data_offset", "Q"), ("data_bytes", "Q"),
]
HEADER_STRUCT = struct.Struct("<" + "".join(f for _, f in HEADER_FIELDS))
ENTRY_STRUCT = struct.Struct("<48sIII4iQQI")
assert 16 + HEADER_STRUCT.size + 4 == HEADER_BYTES and ENTRY_STRUCT.size == ENTRY_BYTES


class CheckpointError(ValueError):
    pass


def _cstr(b):
    if b"\0" not in b:
        raise CheckpointError("a name field is not NUL-terminated")
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def read_checkpoint(path):
    """Returns {"header": dict, "params": {name: array}, "momentum": {...}, "buffers": {...}}."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return decode(data)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None


def decode(data):
    n = len(data)
    if n < 16:
        raise CheckpointError(f"truncated: {n} bytes, not even a header")
    if data[:8] != MAGIC:
        raise CheckpointError("wrong magic: this is not a kit checkpoint")
    version, header_bytes = struct.unpack_from("<II", data, 8)
    if version != VERSION:
        raise CheckpointError(f"format version {version}; this reader reads version {VERSION}")
    if header_bytes != HEADER_BYTES or n < HEADER_BYTES:
        raise CheckpointError(f"truncated in the header ({n} bytes)" if n < HEADER_BYTES else "bad header size")
    (crc,) = struct.unpack_from("<I", data, HEADER_BYTES - 4)
    if zlib.crc32(data[:HEADER_BYTES - 4]) != crc:
        raise CheckpointError("header CRC mismatch: the header is corrupt")
    values = HEADER_STRUCT.unpack_from(data, 16)
    header = {}
    for (name, fmt), v in zip(HEADER_FIELDS, values):
        header[name] = _cstr(v) if fmt.endswith("s") else v
    header["version"] = version
    nt, off, nbytes = header["n_tensors"], header["data_offset"], header["data_bytes"]
    table_end = HEADER_BYTES + nt * ENTRY_BYTES
    total = off + nbytes + TRAILER_BYTES
    if off < table_end or off % 64 or off - table_end >= 64:
        raise CheckpointError("header: inconsistent layout")
    if n < total:
        raise CheckpointError(f"truncated: {n} bytes, the header says {total}")
    if n > total:
        raise CheckpointError(f"{n} bytes, the header says {total}: trailing bytes after the trailer")
    if zlib.crc32(data[HEADER_BYTES:table_end]) != header["table_crc"]:
        raise CheckpointError("tensor table CRC mismatch: the table is corrupt")
    trailer = total - TRAILER_BYTES
    if data[trailer:trailer + 8] != END_MAGIC:
        raise CheckpointError("trailer: wrong end magic")
    out = {"header": header, **{g: {} for g in GROUPS}}
    for i in range(nt):
        name, group, dtype, ndim, *rest = ENTRY_STRUCT.unpack_from(data, HEADER_BYTES + i * ENTRY_BYTES)
        shape, t_off, t_bytes, t_crc = rest[:4], rest[4], rest[5], rest[6]
        name = _cstr(name)
        if group >= len(GROUPS) or dtype not in DTYPES or not 1 <= ndim <= 4:
            raise CheckpointError(f"tensor table entry {i} ({name}): bad group, dtype or rank")
        shape = tuple(shape[:ndim])
        if min(shape) <= 0 or int(np.prod(shape)) * 4 != t_bytes or t_off < off or t_off + t_bytes > off + nbytes:
            raise CheckpointError(f"tensor {name}: bad shape or bytes outside the data section")
        if zlib.crc32(data[t_off:t_off + t_bytes]) != t_crc:
            raise CheckpointError(f"tensor {name} ({GROUPS[group]}): CRC mismatch: its data is corrupt")
        out[GROUPS[group]][name] = np.frombuffer(data, DTYPES[dtype], t_bytes // 4, t_off).reshape(shape).copy()
    (crc,) = struct.unpack_from("<I", data, trailer + 8)
    if zlib.crc32(data[:trailer]) != crc:
        raise CheckpointError("file CRC mismatch (trailer)")
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        ck = read_checkpoint(sys.argv[1])
    except (OSError, CheckpointError) as e:
        print(f"ckpt_read: {e}", file=sys.stderr)
        return 1
    h = ck["header"]
    for k, v in h.items():
        print(f"{k:16s} {v}")
    for g in GROUPS:
        for name, a in ck[g].items():
            print(f"{g:9s} {name:28s} {str(a.shape):18s} mean {a.mean():+.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
