#!/usr/bin/env python3
"""Loads a --trace timeline in Perfetto's own engine (trace processor) and checks, in SQL over its slices, that an
async span named ASYNC... begins inside a slice named BLOCK on the same rank (lesson 03: a bucket's all-reduce
starts during backward).

    tools/trace_perfetto.py FILE --overlap 'all-reduce bucket' backward [--no-overlap A B]

The `perfetto` package on PyPI is Python only: at first use its TraceProcessor downloads a native
trace_processor_shell from Google's servers (no PyPI package ships the binary). Where that cannot happen (no
network but the package registries), point TRACE_PROCESSOR_SHELL at a trace_processor_shell you have (from
https://get.perfetto.dev/trace_processor, or a Perfetto build), or put it on PATH. Without the package or the
binary this prints one line saying which is missing and exits 0 (skipped); tools/trace_check.py checks the same
claims with python3's json meanwhile.
"""
import argparse
import os
import shutil
import sys


def find_shell():
    for p in (os.environ.get("TRACE_PROCESSOR_SHELL"), shutil.which("trace_processor_shell"),
              shutil.which("trace_processor"),
              os.path.expanduser("~/.local/share/perfetto/prebuilts/trace_processor_shell")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


# Async spans land on process-scoped tracks, the phases on thread tracks: both carry the process (the rank).
QUERY = """
INCLUDE PERFETTO MODULE slices.with_context;
SELECT COUNT(*) AS n
FROM process_slice a JOIN thread_slice b ON a.upid = b.upid
WHERE a.name GLOB '{prefix}*' AND b.name = '{block}' AND a.ts >= b.ts AND a.ts < b.ts + b.dur
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--overlap", nargs=2, action="append", default=[])
    ap.add_argument("--no-overlap", nargs=2, action="append", default=[])
    a = ap.parse_args()
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except ImportError:
        print("trace_perfetto: skipped: the perfetto package is not installed (pip install perfetto)")
        return 0
    shell = find_shell()
    if shell is None:
        print("trace_perfetto: skipped: no trace_processor_shell (the perfetto package downloads it at first use, "
              "from outside PyPI; set TRACE_PROCESSOR_SHELL): tools/trace_check.py checked the file instead")
        return 0
    tp = TraceProcessor(trace=a.file, config=TraceProcessorConfig(bin_path=shell))
    failures = []
    try:
        n_slices = next(iter(tp.query("SELECT COUNT(*) AS n FROM slice"))).n
        if n_slices == 0:
            failures.append("Perfetto found no slices")
        for claims, want in ((a.overlap, True), (a.no_overlap, False)):
            for prefix, block in claims:
                n = next(iter(tp.query(QUERY.format(prefix=prefix, block=block)))).n
                if (n > 0) != want:
                    failures.append(f"{n} async slices '{prefix}*' begin inside '{block}' slices (expected "
                                    f"{'some' if want else 'none'})")
    finally:
        tp.close()
    for f in failures:
        print(f"trace_perfetto: {a.file}: {f}")
    if not failures:
        print(f"trace_perfetto: {a.file}: ok in Perfetto's trace processor ({n_slices} slices)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
