#!/usr/bin/env python3
"""bench/cpu_share.py must count the benchmark's own CPU time (its children AND their descendants, as mpirun's
ranks are) as its own, and CPU time of processes outside the measured command as other work. Each case burns a
known amount of CPU time (measured by the burner itself with time.process_time, so a slow or busy machine only
makes it take longer, never changes what is counted); 10 ms clock ticks are the only rounding."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import cpu_share  # noqa: E402

BURN = 0.5  # seconds of CPU time per burner
TICKS = 3 / cpu_share.TICK  # /proc/stat and getrusage each round down to ticks: allow a few
BURNER = "import time\nt = time.process_time()\nwhile time.process_time() - t < %g: pass\n" % BURN


def burn_in(*wrap):
    return subprocess.run([*wrap, sys.executable, "-c", BURNER], check=True)


class TestCpuShare(unittest.TestCase):
    def test_child_time_is_own(self):
        s = cpu_share.CpuShare()
        burn_in()
        r = s.stop("child")
        self.assertGreaterEqual(r["own_cpu_s"], BURN - TICKS)

    def test_grandchild_time_is_own(self):
        # The command is a shell that runs the burner: the burner is a grandchild, as a rank under mpirun is.
        s = cpu_share.CpuShare()
        burn_in("sh", "-c", '"$0" "$@"; exit $?')
        r = s.stop("grandchild")
        self.assertGreaterEqual(r["own_cpu_s"], BURN - TICKS)

    def test_outside_process_is_other_work(self):
        # A burner that is NOT reaped before stop(): its CPU time is nobody's child time yet, as another user's
        # job would be. It says "done" once it has burnt BURN seconds, then waits to be killed.
        s = cpu_share.CpuShare()
        p = subprocess.Popen([sys.executable, "-c", BURNER + "print('done', flush=True)\ntime.sleep(60)\n"],
                             stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(p.stdout.readline().strip(), "done")
            r = s.stop("outside")
        finally:
            p.kill()
            p.wait()
            p.stdout.close()
        self.assertGreaterEqual(r["other_cpu_s"], BURN - TICKS)
        self.assertGreater(r["other_share"], 0.0)

    def test_report_marks_loaded_runs_only(self):
        quiet = {"label": "a", "wall_s": 1, "cores": 2, "own_cpu_s": 2, "other_cpu_s": 0.0, "other_share": 0.0}
        busy = dict(quiet, label="b", other_share=cpu_share.OTHER_LIMIT + 0.01)
        self.assertNotIn("LOADED", "\n".join(cpu_share.report_lines([quiet], "make x")))
        self.assertIn("LOADED", "\n".join(cpu_share.report_lines([quiet, busy], "make x")))


if __name__ == "__main__":
    unittest.main(verbosity=2)
