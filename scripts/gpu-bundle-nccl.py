#!/usr/bin/env python3
"""scripts/gpu-bundle-nccl.py: shrinks a copy of libnccl.so.2 for scripts/gpu-bundle.sh to the device code of
ONE GPU architecture, so that NCCL fits in the device tool's 64 MiB beside the rest of the bundle.

    scripts/gpu-bundle-nccl.py LIBNCCL_IN LIBNCCL_OUT [SM ...]      (default SM: 90, the H100 and H200)

Why: NCCL 2.28 for CUDA 13 is 208 MiB, and gzip or xz win almost nothing on it: 60 MB of `.nv_fatbin` (the
device-linked kernels for sm_75, 80, 90, 100, 110, 120 and PTX for compute_120, each entry already compressed
by nvcc) and 126 MB of `__nv_relfatbin` (the same kernels before device linking), the rest code and 30 MB of
debug sections. A GPU of compute capability 9.0 loads only the sm_90 entry of each fatbin of `.nv_fatbin`.

What it does, without moving one byte of the loaded image: `strip --strip-debug` first (objcopy, on the copy),
then every fatbin in the two sections is walked (header: magic 0xBA55ED50, version, header size, size of the
entries; each entry: kind 1 PTX / 2 ELF, header size, payload size, the SM at byte 28) and the PAYLOAD of each
entry is overwritten with zeros, except, in `.nv_fatbin`, the ELF entries for the SMs asked for. Every header
stays, so the runtime still reads the same fatbin structure and picks the same sm_90 entry. Zeros compress to
nothing: the archive grows by the linked sm_90 kernels (11.5 MB) and NCCL's code. `__nv_relfatbin` is zeroed
whole: its sm_90 part alone is 17.4 MB more, which the 64 MiB cannot hold.

What it cannot prove here (no GPU): that the CUDA runtime never reads the zeroed relocatable payloads when the
linked sm_90 entry is there (it needs them only to JIT-link for a GPU with no SASS of its own). The copy is
therefore the LAST choice of scripts/gpu-check.sh: the toolkit's NCCL, then a pip wheel's (PyTorch's
nvidia-nccl), then this one. Prints one line per section: entries kept / zeroed, bytes kept.
"""
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
KIND_ELF = 2


def sections(path):
    """{name: (file offset, size)} of the sections named like fatbins."""
    out = subprocess.check_output(["readelf", "-SW", path], text=True)
    found = {}
    for line in out.splitlines():
        if "]" not in line:
            continue
        parts = line.split("]", 1)[1].split()
        if len(parts) >= 5 and parts[0] in (".nv_fatbin", "__nv_relfatbin"):
            found[parts[0]] = (int(parts[3], 16), int(parts[4], 16))
    return found


def prune(data, start, size, keep_sms):
    """Zeroes the payload of every fatbin entry in data[start:start+size] that is not an ELF for keep_sms
    (all of them when keep_sms is empty)."""
    kept = zeroed = kept_bytes = fatbins = 0
    p, end = start, start + size
    while p + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, p)
        if magic != FATBIN_MAGIC:
            p += 8  # fatbins are 8-byte aligned; the padding between them is zeros
            continue
        fatbins += 1
        q, fat_end = p + header_size, p + header_size + fat_size
        if fat_end > end:
            sys.exit(f"gpu-bundle-nccl: a fatbin at {p:#x} runs past its section: not a layout this tool knows")
        while q + 32 <= fat_end:
            kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", data, q)
            if entry_header < 32 or q + entry_header + payload > fat_end:
                sys.exit(f"gpu-bundle-nccl: a fatbin entry at {q:#x} is not a layout this tool knows")
            sm = struct.unpack_from("<I", data, q + 28)[0]
            body = q + entry_header
            if kind == KIND_ELF and sm in keep_sms:
                kept += 1
                kept_bytes += payload
            else:
                data[body:body + payload] = bytes(payload)
                zeroed += 1
            q = body + payload
        p = fat_end
    return fatbins, kept, zeroed, kept_bytes


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    src, dst = sys.argv[1], sys.argv[2]
    keep_sms = {int(s) for s in sys.argv[3:]} or {90}
    subprocess.check_call(["objcopy", "--strip-debug", src, dst])
    found = sections(dst)
    if ".nv_fatbin" not in found:
        sys.exit(f"gpu-bundle-nccl: {src} has no .nv_fatbin section: not the NCCL this tool knows")
    with open(dst, "rb") as f:
        data = bytearray(f.read())
    for name, (start, size) in sorted(found.items()):
        fatbins, kept, zeroed, kept_bytes = prune(data, start, size, keep_sms if name == ".nv_fatbin" else set())
        # The linked kernels must still be there for the GPU asked for: none kept means nothing would run.
        if name == ".nv_fatbin" and kept == 0:
            sys.exit(f"gpu-bundle-nccl: no ELF for sm {sorted(keep_sms)} in .nv_fatbin: this NCCL cannot run there")
        print(f"gpu-bundle-nccl: {name}: {fatbins} fatbins, {kept} entries kept "
              f"({kept_bytes / 1e6:.1f} MB), {zeroed} zeroed")
    with open(dst, "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
