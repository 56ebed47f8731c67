#!/usr/bin/env python3
"""Loads a --trace timeline in Perfetto's own engine (trace processor) and checks, in SQL over its tables, what a
lesson claims about time.

    tools/trace_perfetto.py FILE [--overlap ASYNC BLOCK] [--no-overlap ASYNC BLOCK]
                                 [--idle-share RANK:SHARE ...] [--gathers-in-unit-windows]

Claims (each a query below):
  --overlap A B          lesson 03: on some rank an async span named A... begins inside a slice named B (an
                         all-reduce starts during backward); --no-overlap: on none
  --idle-share R:S       lesson 08: rank R's time in "recv ..." and "wait: send ..." slices inside its "step N"
                         slices, over those steps' time, is S (what the program printed) within 0.01
  --gathers-in-unit-windows
                         lesson 09 (ZeRO-3): every "all-gather unit u" slice lies inside a "forward unit u" or
                         "backward unit u" slice of the same thread, and there is at least one

The engine. The `perfetto` package on PyPI is Python only: at first use its TraceProcessor downloads a native
trace_processor_shell from Google's servers (no PyPI package ships the binary). Point TRACE_PROCESSOR_SHELL at one
you have (https://get.perfetto.dev/trace_processor, or a Perfetto build), or put it on PATH. Where Perfetto
cannot run (no package, or no binary), the SAME queries run on a stand-in: Python's sqlite3 (Perfetto's SQL is
SQLite's) over the few tables they read, filled from the JSON as Perfetto's JSON import fills them (slice,
thread_track, thread, process, process_track; ts and dur in nanoseconds; an async begin/end pair one slice on a
process-scoped track). The stand-in checks the queries' logic, not Perfetto's import: the output says which
engine ran. tools/trace_check.py checks the same claims in plain Python.
"""
import argparse
import json
import os
import shutil
import sqlite3
import sys
from collections import namedtuple


def find_shell():
    for p in (os.environ.get("TRACE_PROCESSOR_SHELL"), shutil.which("trace_processor_shell"),
              shutil.which("trace_processor"),
              os.path.expanduser("~/.local/share/perfetto/prebuilts/trace_processor_shell")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


# Every complete slice on a thread track, with its thread and process (a rank is a process).
THREAD_SLICES = """
SELECT slice.ts AS ts, slice.dur AS dur, slice.name AS name, thread.tid AS tid, process.pid AS pid
FROM slice JOIN thread_track ON slice.track_id = thread_track.id
JOIN thread ON thread_track.utid = thread.utid JOIN process ON thread.upid = process.upid
"""
# Async spans land on process-scoped tracks.
PROCESS_SLICES = """
SELECT slice.ts AS ts, slice.dur AS dur, slice.name AS name, process.pid AS pid
FROM slice JOIN process_track ON slice.track_id = process_track.id JOIN process ON process_track.upid = process.upid
"""

OVERLAP = f"""
WITH a AS ({PROCESS_SLICES}), b AS ({THREAD_SLICES})
SELECT COUNT(*) AS n FROM a JOIN b ON a.pid = b.pid
WHERE a.name GLOB :prefix || '*' AND b.name = :block AND a.ts >= b.ts AND a.ts < b.ts + b.dur
"""

# Per rank: the steps' total time and the waits inside them (lesson 08's "step = computing + waiting").
IDLE = f"""
WITH s AS ({THREAD_SLICES}), st AS (SELECT * FROM s WHERE name GLOB 'step *')
SELECT t.pid AS pid, t.total AS total, COALESCE(w.waited, 0) AS waited
FROM (SELECT pid, SUM(dur) AS total FROM st GROUP BY pid) t
LEFT JOIN (SELECT x.pid AS pid, SUM(x.dur) AS waited FROM s x
           WHERE (x.name GLOB 'recv *' OR x.name GLOB 'wait: send*')
             AND EXISTS (SELECT 1 FROM st WHERE st.pid = x.pid AND st.ts <= x.ts AND x.ts + x.dur <= st.ts + st.dur)
           GROUP BY x.pid) w ON w.pid = t.pid
"""

# ZeRO-3: a unit's parameters gathered only inside that unit's forward or backward, on the same thread.
# 'all-gather unit ' is 16 characters: substr(name, 17) is the unit's number.
GATHERS = f"""
WITH s AS ({THREAD_SLICES})
SELECT COUNT(*) AS n,
       COALESCE(SUM(NOT EXISTS (
           SELECT 1 FROM s w WHERE w.pid = g.pid AND w.tid = g.tid
             AND w.name IN ('forward unit ' || substr(g.name, 17), 'backward unit ' || substr(g.name, 17))
             AND w.ts <= g.ts AND g.ts + g.dur <= w.ts + w.dur)), 0) AS outside
FROM s g WHERE g.name GLOB 'all-gather unit *'
"""


class Perfetto:
    name = "Perfetto's trace processor"

    def __init__(self, path, shell):
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
        self.tp = TraceProcessor(trace=path, config=TraceProcessorConfig(bin_path=shell))

    def query(self, sql, **params):
        for k, v in params.items():  # the trace processor takes no bound parameters: quote them as SQL strings
            sql = sql.replace(":" + k, "'" + str(v).replace("'", "''") + "'")
        return list(self.tp.query(sql))

    def close(self):
        self.tp.close()


class Standin:
    """sqlite3 tables filled from the JSON as Perfetto's JSON import fills them (see the docstring at the top)."""

    def __init__(self, path, why):
        self.name = f"a sqlite3 stand-in for Perfetto's tables (Perfetto itself not run: {why})"
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        db = self.db = sqlite3.connect(":memory:")
        db.executescript("""
            CREATE TABLE process (upid INTEGER PRIMARY KEY, pid INT);
            CREATE TABLE thread (utid INTEGER PRIMARY KEY, tid INT, upid INT);
            CREATE TABLE thread_track (id INTEGER PRIMARY KEY, utid INT);
            CREATE TABLE process_track (id INTEGER PRIMARY KEY, upid INT);
            CREATE TABLE slice (id INTEGER PRIMARY KEY, ts INT, dur INT, name TEXT, track_id INT);""")
        upid, utid, track, opened = {}, {}, {}, {}

        def process(pid):
            if pid not in upid:
                upid[pid] = db.execute("INSERT INTO process (pid) VALUES (?)", (pid,)).lastrowid
            return upid[pid]

        def thread_track(pid, tid):
            if (pid, tid) not in utid:
                utid[pid, tid] = db.execute("INSERT INTO thread (tid, upid) VALUES (?, ?)",
                                            (tid, process(pid))).lastrowid
                track[pid, tid] = db.execute("INSERT INTO thread_track (utid) VALUES (?)",
                                             (utid[pid, tid],)).lastrowid
            return track[pid, tid]

        def ns(us):
            return int(round(float(us) * 1000))

        for e in events:
            ph = e.get("ph")
            if ph == "X":
                db.execute("INSERT INTO slice (ts, dur, name, track_id) VALUES (?, ?, ?, ?)",
                           (ns(e["ts"]), ns(e["dur"]), e["name"], thread_track(e["pid"], e["tid"])))
            elif ph == "b":
                opened[e["pid"], e.get("cat"), e.get("id"), e["name"]] = e
            elif ph == "e":
                b = opened.pop((e["pid"], e.get("cat"), e.get("id"), e["name"]), None)
                if b is not None:  # one process-scoped track per async span, as Perfetto lays them out
                    t = db.execute("INSERT INTO process_track (upid) VALUES (?)", (process(e["pid"]),)).lastrowid
                    db.execute("INSERT INTO slice (ts, dur, name, track_id) VALUES (?, ?, ?, ?)",
                               (ns(b["ts"]), ns(e["ts"]) - ns(b["ts"]), b["name"], t))

    def query(self, sql, **params):
        cur = self.db.execute(sql, params)
        Row = namedtuple("Row", [d[0] for d in cur.description])
        return [Row(*r) for r in cur.fetchall()]

    def close(self):
        self.db.close()


def open_engine(path):
    try:
        import perfetto.trace_processor  # noqa: F401
    except ImportError:
        return Standin(path, "the perfetto package is not installed (pip install perfetto)")
    shell = find_shell()
    if shell is None:
        return Standin(path, "no trace_processor_shell: the perfetto package downloads it at first use, from "
                             "outside PyPI; set TRACE_PROCESSOR_SHELL")
    return Perfetto(path, shell)


def check(engine, a):
    """The failures, one line each."""
    failures = []
    n_slices = engine.query("SELECT COUNT(*) AS n FROM slice")[0].n
    if n_slices == 0:
        failures.append("no slices")
    for claims, want in ((a.overlap, True), (a.no_overlap, False)):
        for prefix, block in claims:
            n = engine.query(OVERLAP, prefix=prefix, block=block)[0].n
            if (n > 0) != want:
                failures.append(f"{n} async slices '{prefix}*' begin inside '{block}' slices (expected "
                                f"{'some' if want else 'none'})")
    if a.idle_share:
        rows = {r.pid: r for r in engine.query(IDLE)}
        for rank, share in a.idle_share:
            r = rows.get(rank)
            if r is None or not r.total:
                failures.append(f"rank {rank}: no 'step N' slices")
                continue
            idle = r.waited / r.total
            print(f"trace_perfetto: rank {rank}: idle {100 * idle:.1f} % of its steps in SQL, "
                  f"{100 * share:.1f} % printed")
            if abs(idle - share) > 0.01:
                failures.append(f"rank {rank}: idle share {idle:.3f} in SQL, {share:.3f} printed")
    if a.gathers_in_unit_windows:
        r = engine.query(GATHERS)[0]
        print(f"trace_perfetto: {r.n} unit all-gathers, {r.outside} outside their unit's window (SQL)")
        if r.n == 0 or r.outside:
            failures.append(f"{r.outside} of {r.n} unit all-gathers outside their unit's forward/backward")
    return n_slices, failures


def rank_share(text):
    rank, _, share = text.partition(":")
    try:
        return int(rank), float(share)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not RANK:SHARE (e.g. 0:0.42)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--overlap", nargs=2, action="append", default=[])
    ap.add_argument("--no-overlap", nargs=2, action="append", default=[])
    ap.add_argument("--idle-share", action="append", default=[], type=rank_share, metavar="RANK:SHARE")
    ap.add_argument("--gathers-in-unit-windows", action="store_true")
    a = ap.parse_args()
    # Exit 1 means a claim does not hold; anything that stops the check itself (an unreadable file, an engine
    # error) is 2, so that a test expecting a claim to fail cannot mistake a crash for it.
    try:
        engine = open_engine(a.file)
        try:
            n_slices, failures = check(engine, a)
        finally:
            engine.close()
    except Exception as e:  # noqa: BLE001 (any failure of the engine or the file)
        print(f"trace_perfetto: {a.file}: could not check: {type(e).__name__}: {e}")
        return 2
    for f in failures:
        print(f"trace_perfetto: {a.file}: {f} (in {engine.name})")
    if not failures:
        print(f"trace_perfetto: {a.file}: ok in {engine.name} ({n_slices} slices)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
