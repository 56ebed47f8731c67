#!/usr/bin/env python3
"""`make bench-zero`'s measurements against what they claim (`make test-zero-bench`, about a minute):

- bench/zero_kit.c's counters per part (lesson 09's zero.c, a real step) equal bench/zero_memory.py's arithmetic
  for the model states (parameters, gradients, momentum), at the step's peak and between steps, for every stage,
  on 1 rank and on 3 (an odd world: uneven shards, padding), and at stages 2-3 with the overlap off too
  (KIT_OVERLAP=0: one unit's full gradient at the peak, not two adjacent units');
- the bytes its step hands to the collectives, counted by the ring algorithms, equal the closed form
  bench/zero_bench.py prints beside them (stage 1: 1.5x DDP, stage 2: 1x, stage 3: 1.5x);
- bench/zero_bench.py --quick runs end to end and writes zero_memory.py's CSV columns with source=kit.

    python3 tests/bench/test_zero_bench.py BUILD/bench/zero_kit BUILD/bench/bench_zeromem
"""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import zero_bench  # noqa: E402
import zero_memory as zm  # noqa: E402

KIT = PROBE = None  # from the command line
MODEL, WIDTH, BATCH = "tiny-bn", 12, 4


def run_kit(world, stage, overlap=True):
    cmd = [os.path.join(ROOT, "scripts", "launch.sh"), str(world), KIT, "--model", MODEL, "--width", str(WIDTH),
           "--batch", str(BATCH), "--zero", str(stage), "--steps", "1"]
    env = dict(os.environ, KIT_OVERLAP="1" if overlap else "0")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stderr[-1500:]}"
    return json.loads([x for x in p.stdout.splitlines() if x.startswith("{")][-1])


def arith_units():
    layers = zm.layer_table(MODEL, WIDTH)
    return zm.units_of(layers, zm.default_cuts(layers))


@unittest.skipUnless(shutil.which("mpirun"), "Open MPI's mpirun is not installed")
class MeasuredAgainstArithmetic(unittest.TestCase):
    def test_model_states_per_part(self):
        units = arith_units()
        for world, stage, overlap in [(w, s, True) for w in (1, 3) for s in range(4)] + [(3, 2, False), (3, 3, False)]:
            r = run_kit(world, stage, overlap)
            self.assertEqual(r["units"], len(units), "the kit cut the model into other units than zero_memory.py")
            self.assertEqual(r["overlap"], int(overlap and stage >= 2), "KIT_OVERLAP not honoured")
            want = zm.per_rank(stage, world, units, [0] * len(units), overlap)
            for part in ("params", "grads", "optimizer"):
                with self.subTest(world=world, stage=stage, overlap=overlap, part=part):
                    self.assertEqual(r["peak"][part], want["peak"][part], "peak during the step")
                    self.assertEqual(r["live"][part], want["between"][part], "live between steps")

    def test_ring_bytes(self):
        units, world = arith_units(), 3
        n = sum(u["params"] for u in units)
        padded = sum(world * zm.shard(u["params"], world) for u in units)
        for stage in range(4):
            r = run_kit(world, stage)
            with self.subTest(stage=stage):
                self.assertAlmostEqual(r["ring_bytes_per_step"], zero_bench.ring_arith(stage, world, n, padded),
                                       delta=1.0)  # printed rounded to a byte
                self.assertGreater(r["coll_bytes_per_step"], 0)

    def test_quick_harness(self):
        with tempfile.TemporaryDirectory() as tmp:
            md, out = os.path.join(tmp, "r.md"), os.path.join(tmp, "r.csv")
            p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "zero_bench.py"), "--kit-bin", KIT,
                                "--probe", PROBE, "--quick", "--md", md, "--csv", out],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stderr[-1500:])
            with open(out, newline="") as f:
                rd = csv.DictReader(f)
                self.assertEqual(tuple(rd.fieldnames[:len(zm.CSV_COLUMNS)]), zm.CSV_COLUMNS)
                rows = list(rd)
            self.assertTrue(rows and all(r["source"] == "kit" for r in rows))
            with open(md) as f:
                text = f.read()
            for heading in ("## 1.", "## 3.", "## 4."):
                self.assertIn(heading, text)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: test_zero_bench.py BUILD/bench/zero_kit BUILD/bench/bench_zeromem")
    KIT, PROBE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=sys.argv[:1], verbosity=2)
