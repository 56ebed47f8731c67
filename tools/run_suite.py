#!/usr/bin/env python3
"""Runs a list of make targets in order, saying first what it will run and about how long, then a progress line
per target; stops at the first failure. `make test` and `make test-quick` are this.

    tools/run_suite.py --name "make test" --make make --times tests/suite-times.tsv --record build/suite-times.tsv T1 T2 ...

The estimates come from --times: one line per target, `target<TAB>seconds`, measured by an earlier run of this
script (it writes what it measured to --record; copy that file over --times to update the figures) and a
comment line saying on what machine. A target without a figure says so.
"""
import argparse
import os
import pathlib
import subprocess
import sys
import time


def read_times(path):
    times, notes = {}, []
    if path and path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                notes.append(line.lstrip("# ").strip())
            elif line.strip():
                name, sec = line.split("\t")[:2]
                times[name] = float(sec)
    return times, notes


def about(sec):
    if sec is None:
        return "time not measured"
    if sec < 60:
        return f"about {max(5, round(sec / 5) * 5):.0f} s"
    return f"about {sec / 60:.0f} min" if sec >= 90 else "about 1 min"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--make", default="make")
    ap.add_argument("--times", type=pathlib.Path)
    ap.add_argument("--record", type=pathlib.Path)
    ap.add_argument("--parallel", action="append", default=[], metavar="TARGET",
                    help="run this target with -j<cores> (the build) when make itself had no -j")
    ap.add_argument("targets", nargs="+")
    args = ap.parse_args()
    times, notes = read_times(args.times)
    first = os.environ.get("MAKEFLAGS", "").split(" ")[0]
    if "n" in first and not first.startswith("-"):  # make -n: the steps print their commands; nothing to time
        args.record = None
    known = [times[t] for t in args.targets if t in times]
    unknown = [t for t in args.targets if t not in times]
    n = len(args.targets)
    print(f"{args.name}: {n} steps, {about(sum(known)) if known else 'time not measured'} in all"
          + (f" plus {len(unknown)} step(s) not measured" if unknown and known else "")
          + (f" (figures from {args.times}: {notes[0]})" if notes else ""))
    width = max(len(t) for t in args.targets)
    for i, t in enumerate(args.targets, 1):
        print(f"  {i:>2}. {t:<{width}}  {about(times.get(t))}")
    sys.stdout.flush()
    measured = []
    start = time.monotonic()
    for i, t in enumerate(args.targets, 1):
        print(f"[{i}/{n}] {t} ({about(times.get(t))})", flush=True)
        t0 = time.monotonic()
        cmd = [args.make, "--no-print-directory", t]
        flags = os.environ.get("MAKEFLAGS", "")
        if t in args.parallel and "-j" not in flags and "--jobserver" not in flags:
            cmd.append(f"-j{os.cpu_count()}")  # the build on every core, unless make was given its own -j
        rc = subprocess.call(cmd, close_fds=False)  # close_fds: make's jobserver is open file descriptors
        sec = time.monotonic() - t0
        measured.append((t, sec))
        if args.record:
            args.record.parent.mkdir(parents=True, exist_ok=True)
            load = os.getloadavg()[0]
            args.record.write_text(
                f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load average {load:.1f} at the end "
                f"(seconds per target, written by tools/run_suite.py)\n"
                + "".join(f"{name}\t{s:.0f}\n" for name, s in measured))
        if rc != 0:
            print(f"{args.name}: step {i}/{n}, {t}, FAILED after {sec:.0f} s "
                  f"({time.monotonic() - start:.0f} s in all)", flush=True)
            return rc
    total = time.monotonic() - start
    print(f"{args.name}: every step passed, {total / 60:.1f} min"
          + (f" (times per step: {args.record})" if args.record else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
