#!/usr/bin/env python3
"""Checks a timeline written by --trace (kit/trace.h): that it is what Perfetto and chrome://tracing read, and
what a lesson claims about it.

    tools/trace_check.py FILE [--ranks N] [--overlap ASYNC BLOCK] [--no-overlap ASYNC BLOCK]
                              [--ts PID:NAME:US] [--count PID:NAME:N] [--min-count PID:NAME:N]

Always checked:
  - the file is one JSON object with a traceEvents list; every event has ph, pid, tid, ts (a number), name;
  - complete spans ("X") have dur >= 0 and nest on each track (pid, tid): sorted by start, a span that starts
    inside another ends inside it too (a timeline where they cross cannot be drawn as a stack);
  - every async begin ("b") has exactly one end ("e") with the same pid, category and id, not before it;
  - --ranks N: the processes are ranks 0..N-1, each named "rank R" by a process_name event.
Claims:
  --overlap A B      on some rank, an async span whose name starts with A BEGINS inside a complete span named B
                     (lesson 03: "all-reduce bucket" inside "backward": communication started during backward)
  --no-overlap A B   on no rank does such a span begin inside B (the flat all-reduce: it starts after backward)
  --ts P:NAME:US     the first complete span NAME of process P starts at US microseconds (offsets applied)
  --count P:NAME:N   exactly N complete spans NAME on process P; --min-count: at least N
Exit status 0 when every check holds, 1 with one line per failure otherwise. Python 3 standard library only.
"""
import argparse
import collections
import json
import sys


def load(path):
    with open(path) as f:
        d = json.load(f)
    if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
        raise ValueError("not a JSON object with a traceEvents list")
    return d["traceEvents"]


def check_fields(events, fail):
    for i, e in enumerate(events):
        for k in ("ph", "pid", "tid", "name"):
            if k not in e:
                fail(f"event {i} has no '{k}': {e}")
        if e.get("ph") != "M" and not isinstance(e.get("ts"), (int, float)):
            fail(f"event {i} has no numeric ts: {e}")
        if e.get("ph") == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            fail(f"complete event {i} has no dur >= 0: {e}")


def check_nesting(events, fail):
    tracks = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            tracks[(e["pid"], e["tid"])].append(e)
    for key, spans in tracks.items():
        # Sorted by start, the longer first when two start together: the enclosing one comes first.
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in spans:
            end = e["ts"] + e["dur"]
            while stack and stack[-1][0] <= e["ts"]:
                stack.pop()
            # 1 ns of slack: the files round to 0.001 us.
            if stack and end > stack[-1][0] + 1e-3:
                fail(f"track {key}: '{e['name']}' at {e['ts']} crosses the end of '{stack[-1][1]}' at {stack[-1][0]}")
            stack.append((end, e["name"]))


def async_spans(events, fail):
    """(pid, name, begin, end) of every matched b/e pair."""
    open_ = {}
    spans = []
    for e in sorted((e for e in events if e.get("ph") in ("b", "e")), key=lambda e: (e["ts"], e["ph"] == "b")):
        key = (e["pid"], e.get("cat"), e.get("id"))
        if e["ph"] == "b":
            if key in open_:
                fail(f"async id {key} begun twice")
            open_[key] = e
        else:
            b = open_.pop(key, None)
            if b is None:
                fail(f"async end without a begin: {e}")
                continue
            spans.append((e["pid"], b["name"], b["ts"], e["ts"]))
    for key, b in open_.items():
        fail(f"async span '{b['name']}' {key} never ends")
    return spans


def begins_inside(asyncs, events, prefix, block):
    blocks = [e for e in events if e.get("ph") == "X" and e["name"] == block]
    hits = []
    for pid, name, t0, _t1 in asyncs:
        if not name.startswith(prefix):
            continue
        for x in blocks:
            if x["pid"] == pid and x["ts"] <= t0 < x["ts"] + x["dur"]:
                hits.append((pid, name, t0))
                break
    return hits, len(blocks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--ranks", type=int)
    ap.add_argument("--overlap", nargs=2, action="append", default=[], metavar=("ASYNC", "BLOCK"))
    ap.add_argument("--no-overlap", nargs=2, action="append", default=[], metavar=("ASYNC", "BLOCK"))
    ap.add_argument("--ts", action="append", default=[])
    ap.add_argument("--count", action="append", default=[])
    ap.add_argument("--min-count", action="append", default=[])
    a = ap.parse_args()
    failures = []
    fail = failures.append
    try:
        events = load(a.file)
    except (OSError, ValueError) as err:
        print(f"trace_check: {a.file}: {err}")
        return 1
    check_fields(events, fail)
    if failures:  # the rest assumes the fields are there
        print("\n".join(f"trace_check: {a.file}: {f}" for f in failures[:20]))
        return 1
    check_nesting(events, fail)
    asyncs = async_spans(events, fail)
    if a.ranks is not None:
        pids = {e["pid"] for e in events}
        if pids != set(range(a.ranks)):
            fail(f"processes {sorted(pids)}, expected ranks 0..{a.ranks - 1}")
        names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        for r in range(a.ranks):
            if names.get(r) != f"rank {r}":
                fail(f"process {r} is named {names.get(r)!r}, expected 'rank {r}'")
    for prefix, block in a.overlap:
        hits, n = begins_inside(asyncs, events, prefix, block)
        if not hits:
            fail(f"no async span '{prefix}...' begins inside a '{block}' span ({n} of those)")
        else:
            print(f"trace_check: {len(hits)} '{prefix}...' spans begin inside '{block}' (first: rank {hits[0][0]}, "
                  f"'{hits[0][1]}')")
    for prefix, block in a.no_overlap:
        hits, n = begins_inside(asyncs, events, prefix, block)
        if hits:
            fail(f"{len(hits)} async spans '{prefix}...' begin inside '{block}' (first: {hits[0]})")
    for spec in a.ts:
        pid, name, us = spec.split(":")
        xs = [e for e in events if e["ph"] == "X" and e["pid"] == int(pid) and e["name"] == name]
        if not xs:
            fail(f"no span '{name}' on process {pid}")
        elif abs(xs[0]["ts"] - float(us)) > 1e-3:
            fail(f"span '{name}' on process {pid} starts at {xs[0]['ts']}, expected {us}")
    for spec, exact in [(s, True) for s in a.count] + [(s, False) for s in a.min_count]:
        pid, name, n = spec.split(":")
        k = sum(1 for e in events if e["ph"] == "X" and e["pid"] == int(pid) and e["name"] == name)
        if (k != int(n)) if exact else (k < int(n)):
            fail(f"{k} spans '{name}' on process {pid}, expected {'' if exact else 'at least '}{n}")
    for f in failures:
        print(f"trace_check: {a.file}: {f}")
    if not failures:
        n_x = sum(1 for e in events if e["ph"] == "X")
        print(f"trace_check: {a.file}: ok ({len(events)} events, {n_x} complete spans, {len(asyncs)} async spans)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
