#!/usr/bin/env python3
"""How much of the machine did OTHER work take while a benchmark ran?

The load average cannot say: a benchmark that keeps both cores of a 2-core machine busy drives the load
average to 2 by itself, so "load after the run" reads high on a perfectly quiet machine, and "load before"
misses whatever starts during the run. What matters is the CPU time the machine spent on anything but the
benchmark, and Linux gives both halves of that:

  all busy time   /proc/stat, first line: user + nice + system + irq + softirq + steal (ticks of USER_HZ).
                  steal is time the hypervisor gave to another VM: other work too, from our point of view.
  our own time    getrusage(): RUSAGE_SELF + RUSAGE_CHILDREN (every descendant that was waited for, which
                  includes mpirun's ranks and the programs a shell script starts).

other = busy - ours, as a share of wall time x cores. Above OTHER_LIMIT the run is marked LOADED.

Two ways to use it:
  as a module     s = CpuShare(); ...run...; r = s.stop()      (bench/torch_cpu.py)
  as a wrapper    bench/cpu_share.py --log F --label L -- command args...   appends one JSON line to F and
                  returns the command's exit status; bench/cpu_share.py --report F prints the paragraph a
                  results file carries (the shell benchmarks: run-allreduce.sh, run-ring.sh, ...).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

# Other work above this share of the machine marks a run LOADED. 10 % of 2 cores is one core busy a fifth of
# the time: enough to move a 2-thread benchmark's median by several percent, which is what the figures resolve.
OTHER_LIMIT = 0.10
TICK = os.sysconf("SC_CLK_TCK")



def cpu_model():
    """The machine's CPU model (lscpu's "Model name", else platform's) and its core count: the line every
    benchmark report starts with."""
    import platform
    model = platform.processor() or "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return model, os.cpu_count()

def machine_busy_seconds():
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def own_cpu_seconds():
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


class CpuShare:
    def __init__(self):
        self.t0, self.busy0, self.own0 = time.monotonic(), machine_busy_seconds(), own_cpu_seconds()

    def stop(self, label=""):
        wall = time.monotonic() - self.t0
        busy = machine_busy_seconds() - self.busy0
        own = own_cpu_seconds() - self.own0
        cores = os.cpu_count()
        # Tick rounding can make `busy - own` slightly negative on a quiet machine.
        other = max(0.0, busy - own)
        return {"label": label, "wall_s": round(wall, 2), "cores": cores, "own_cpu_s": round(own, 2),
                "other_cpu_s": round(other, 2), "other_share": round(other / (wall * cores), 4) if wall > 0 else 0.0}


def loaded(records):
    return any(r["other_share"] > OTHER_LIMIT for r in records)


def report_lines(records, remeasure):
    """The paragraph a results file carries: the LOADED mark first when any part of the run was loaded."""
    if not records:
        return []
    worst = max(records, key=lambda r: r["other_share"])
    cores = worst["cores"]
    L = []
    if loaded(records):
        L += [f"> **LOADED MACHINE: other processes took up to {100 * worst['other_share']:.0f} % of the "
              f"{cores} cores while this ran ({worst['label'] or 'one part'}), above {100 * OTHER_LIMIT:.0f} %. "
              f"The speed figures below are NOT to be trusted;** re-measure on a quiet machine with `{remeasure}`.", ""]
    parts = ", ".join(f"{r['label']} {100 * r['other_share']:.1f} %" for r in records if r["label"])
    L.append(f"Other work during the run (bench/cpu_share.py: the machine's busy time from /proc/stat minus the "
             f"benchmark's own CPU time, as a share of wall time x {cores} cores): at most "
             f"{100 * worst['other_share']:.1f} %" + (f" ({parts})." if parts else "."))
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log", help="append the run's JSON record to this file")
    ap.add_argument("--label", default="", help="what the command measures (shown in the report)")
    ap.add_argument("--report", metavar="LOG", help="print the report paragraph for the records in LOG")
    ap.add_argument("--remeasure", default="make bench-...", help="the command the LOADED mark names")
    ap.add_argument("--check", metavar="LOG", help="exit 1 when any record in LOG was loaded (for scripts)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.report or a.check:
        with open(a.report or a.check) as f:
            records = [json.loads(line) for line in f if line.strip()]
        if a.report:
            print("\n".join(report_lines(records, a.remeasure)))
            return 0
        return 1 if loaded(records) else 0
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give a command after --, or --report LOG")
    share = CpuShare()
    rc = subprocess.call(cmd)
    record = share.stop(a.label)
    if a.log:
        with open(a.log, "a") as f:
            f.write(json.dumps(record) + "\n")
    print(f"cpu_share: {a.label or cmd[0]}: other work {100 * record['other_share']:.1f} % of the machine",
          file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
