#!/usr/bin/env python3
"""Lesson 09's memory tools against what they claim (`make test-zero-tools`):

- bench/zero_memory.py's copy of the kit's layer table is the kit's (bench_zeromem prints the kit's own), for
  every architecture at two widths, and its units are cut only where the kit allows;
- its per-rank bytes, recomputed here independently from the kit's own per-unit counts: DDP's total is 3 x 4
  bytes per parameter + BN buffers + the kit's arenas; each sharded part is 4 * sum(ceil(n_u / W)) (padding
  included) between steps; the parts add up to the total; the closed form of the ZeRO paper where no padding
  and no window apply;
- the largest width it reports fits the budget and the next one does not (the kit's arena probed);
- bench/plot_memory.py draws the CSV and refuses one without the promised columns;
- with PyTorch: the FSDP units of bench/torch_zero.py are the kit's units (the same parameter count each), and a
  2-rank run of ZeroRedundancyOptimizer and FSDP2 holds the shards it should (a few minutes on a loaded machine).

    python3 tests/bench/test_zero_tools.py BUILD/bench/bench_zeromem
"""
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
PROBE = None  # from the command line

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

import zero_memory  # noqa: E402


def kit(args):
    out = subprocess.run([PROBE] + args, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def kit_units(model, width, batch):
    """The kit's own default units, derived here from ITS table: a unit starts at a layer with parameters where
    no earlier activation but the previous layer's crosses (the residual's skip cannot be cut)."""
    c, h, w = zero_memory.INPUTS[model]
    rows = kit(["--model", model, "--width", str(width), "--in", f"{c},{h},{w}", "--batch", str(batch)])
    whole, layers = rows[0], rows[1:]

    def crosses(cut):
        return any((l["in"] < cut and l["in"] != cut - 1) or (l["in2"] >= -1 and l["in2"] < cut and l["in2"] != cut - 1)
                   for l in layers[cut:])
    cuts = [0] + [i for i in range(1, len(layers)) if layers[i]["params"] and not crosses(i)] + [len(layers)]
    units = kit(["--model", model, "--width", str(width), "--in", f"{c},{h},{w}", "--batch", str(batch),
                 "--cuts", ",".join(map(str, cuts))])
    return whole, cuts, units


def run_memory(tmp, *args):
    csv_path = os.path.join(tmp, "arith.csv")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "zero_memory.py"), "--probe", PROBE,
                        "--csv", csv_path, "--budget-csv", os.path.join(tmp, "budget.csv")] + list(args),
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f)), p


class TestLayerTable(unittest.TestCase):
    def test_table_and_units_are_the_kits(self):
        for model in ("tiny", "tiny-bn", "fmnist", "resnet9"):
            for width in (8, 12):
                with self.subTest(model=model, width=width):
                    mine = zero_memory.layer_table(model, width)
                    whole, cuts, units = kit_units(model, width, 2)
                    self.assertEqual(sum(l["params"] for l in mine), whole["params"])
                    self.assertEqual(zero_memory.default_cuts(mine), cuts)
                    self.assertEqual([u["params"] for u in zero_memory.units_of(mine, cuts)],
                                     [u["params"] for u in units])


class TestArithmetic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="test-zero-tools-")
        cls.rows, _ = run_memory(cls.tmp, "--models", "tiny-bn,resnet9", "--width", "8", "--batch", "4",
                                 "--worlds", "1,2,3,4", "--budgets-mib", "")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def get(self, model, stage, world, part, when="peak"):
        hits = [r for r in self.rows if (r["model"], int(r["stage"]), int(r["world"]), r["part"], r["when"]) ==
                (model, stage, world, part, when)]
        self.assertEqual(len(hits), 1, (model, stage, world, part, when))
        return int(hits[0]["bytes"])

    def test_columns(self):
        self.assertEqual(tuple(self.rows[0].keys()), zero_memory.CSV_COLUMNS)
        self.assertEqual({r["source"] for r in self.rows}, {"arith"})

    def test_against_an_independent_count(self):
        for model in ("tiny-bn", "resnet9"):
            whole, _, units = kit_units(model, 8, 4)
            N, Nb = whole["params"], whole["buffers"]
            acts = sum(u["arena_bytes"] for u in units)
            n = [u["params"] for u in units]
            for world in (1, 2, 3, 4):
                with self.subTest(model=model, world=world):
                    shards = sum(math.ceil(x / world) for x in n)
                    self.assertEqual(self.get(model, 0, world, "total"), 12 * N + 4 * Nb + acts)
                    self.assertEqual(self.get(model, 1, world, "optimizer"), 4 * shards)
                    self.assertEqual(self.get(model, 2, world, "grads", "between"), 4 * shards)
                    # the overlap (the kit's default): two adjacent units' full gradients at the peak
                    pair = max(a + b for a, b in zip(n, n[1:]))
                    self.assertEqual(self.get(model, 2, world, "grads"), 4 * (shards + pair))
                    self.assertEqual(self.get(model, 3, world, "grads"), 4 * (shards + pair))
                    self.assertEqual(self.get(model, 3, world, "params", "between"), 4 * (shards + Nb))
                    self.assertEqual(self.get(model, 3, world, "params"), 4 * (shards + max(n) + Nb))
                    for stage in range(4):
                        self.assertEqual(self.get(model, stage, world, "activations"), acts)
                        for when in ("peak", "between"):
                            parts = sum(self.get(model, stage, world, p, when) for p in zero_memory.PARTS)
                            self.assertEqual(parts, self.get(model, stage, world, "total", when))

    def test_padding(self):
        # 3 ranks: a unit whose length does not divide by 3 costs its padding on every rank, and the comm
        # scratch is the largest padded unit.
        _, _, units = kit_units("resnet9", 8, 4)
        n = [u["params"] for u in units]
        self.assertTrue(any(x % 3 for x in n))
        self.assertGreater(self.get("resnet9", 1, 3, "optimizer"), 4 * sum(n) / 3)
        self.assertEqual(self.get("resnet9", 1, 3, "comm"), 4 * max(3 * math.ceil(x / 3) for x in n if x % 3))
        self.assertEqual(self.get("resnet9", 0, 3, "comm"), 0)

    def test_closed_form_without_padding_or_windows(self):
        # The ZeRO paper's model states, fp32 SGD with momentum, on units that divide evenly and no window.
        units = [{"params": 1200, "buffers": 0}, {"params": 2400, "buffers": 0}]
        psi = 3600
        for world in (1, 2, 4, 8):
            for stage in range(4):
                b = zero_memory.per_rank(stage, world, units, [0, 0])["between"]
                states = b["params"] + b["grads"] + b["optimizer"]
                self.assertEqual(states, zero_memory.zero_paper(stage, world, psi), (stage, world))


class TestBudget(unittest.TestCase):
    def test_largest_width_fits_and_the_next_does_not(self):
        probe = zero_memory.Probe(PROBE)
        for stage, world in ((0, 1), (3, 4)):
            with self.subTest(stage=stage, world=world):
                budget = 48 * 2**20
                w, peak = zero_memory.largest_width("resnet9", stage, world, budget, 2, probe, w_max=64)
                self.assertGreater(w, 0)
                self.assertLessEqual(peak, budget)

                def total(width):
                    layers = zero_memory.layer_table("resnet9", width)
                    units = zero_memory.units_of(layers, zero_memory.default_cuts(layers))
                    arena = sum(u["arena_bytes"] for u in kit_units("resnet9", width, 2)[2])
                    return zero_memory.per_rank(stage, world, units, [arena])["peak"]["total"]
                self.assertEqual(total(w), peak)
                self.assertGreater(total(w + 1), budget)


class TestPlot(unittest.TestCase):
    def run_plot(self, text):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.csv")
            with open(path, "w") as f:
                f.write(text)
            png = os.path.join(d, "m.png")
            p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plot_memory.py"), "--model", "tiny",
                                "--png", png, path],
                               capture_output=True, text=True)
            return p, os.path.exists(png) and os.path.getsize(png) > 0

    @unittest.skipUnless(shutil.which("gnuplot"), "gnuplot is not installed (apt-get install gnuplot-nox)")
    def test_draws_arith_and_measured_rows(self):
        head = ",".join(zero_memory.CSV_COLUMNS) + "\n"
        body = "".join(f"tiny,16,8,4,{s},{w},{p},peak,{2**20 * (s + 1) * w},{src}\n"
                       for s in range(4) for w in (1, 2) for p in zero_memory.PARTS for src in ("arith", "kit"))
        p, drawn = self.run_plot(head + body)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(drawn)
        # The kit's marker sits at the sum of its model states: 4 parts x (stage + 1) x world MiB.
        line = next(l for l in p.stdout.splitlines() if l.startswith("ZeRO-3") and l.split()[1] == "2")
        self.assertTrue(line.endswith("32.00/nan"), line)

    def test_missing_column_is_refused(self):
        p, drawn = self.run_plot("model,stage,world,part,bytes\ntiny,0,1,params,4\n")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("when", p.stderr)
        self.assertFalse(drawn)


@unittest.skipUnless(HAVE_TORCH, "PyTorch is not installed in python3 (pip install torch)")
class TestTorchPeers(unittest.TestCase):
    def test_fsdp_units_are_the_kits(self):
        from torch_models import build
        for model, width in (("resnet9", 8), ("fmnist", 8), ("tiny-bn", 16)):
            with self.subTest(model=model):
                c, h, _ = zero_memory.INPUTS[model]
                net = build(model, w=width, in_c=c, size=h)
                torch_units = [sum(p.numel() for p in m.parameters()) for m in net]
                torch_units = [n for n in torch_units if n]
                layers = zero_memory.layer_table(model, width)
                mine = [u["params"] for u in zero_memory.units_of(layers, zero_memory.default_cuts(layers))]
                self.assertEqual(torch_units, mine)

    def test_sharded_peers_hold_shards(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "t.csv")
            p = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "torch_zero.py"), "--quick", "--impls",
                                "zero1,fsdp2-full", "--csv", out, "--md", os.path.join(d, "t.md")],
                               capture_output=True, text=True, cwd=ROOT, timeout=900)
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            with open(out, newline="") as f:
                rows = {(r["impl"], r["part"]): int(r["bytes"]) for r in csv.DictReader(f)}
        # tiny-bn, 2 ranks. ZeroRedundancyOptimizer runs under DDP: every gradient float (the count of the
        # model's parameters), about half of the momentum (whole tensors, so not exactly half); FSDP2 (FULL_SHARD)
        # half of every tensor's parameters, gradients and momentum, rounded up per tensor (a few floats).
        from torch_models import build
        net = build("tiny-bn")
        full = 4 * sum(p.numel() for p in net.parameters())
        buffers = 4 * sum(b.numel() for b in net.buffers())
        self.assertEqual(rows[("zero1", "grads")], full)
        self.assertEqual(rows[("zero1", "params")], full + buffers)
        self.assertLess(rows[("zero1", "optimizer")], full)
        self.assertGreater(rows[("zero1", "optimizer")], 0)
        tensors = sum(1 for _ in net.parameters())
        for part in ("grads", "optimizer"):
            self.assertGreaterEqual(rows[("fsdp2-full", part)], full // 2)
            self.assertLessEqual(rows[("fsdp2-full", part)], full // 2 + 4 * tensors)
        self.assertLess(rows[("fsdp2-full", "params")], full // 2 + 4 * tensors + buffers + 1)

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_zero_tools.py BUILD/bench/bench_zeromem")
    PROBE = os.path.abspath(sys.argv[1])
    unittest.main(argv=sys.argv[:1] + sys.argv[2:], verbosity=2)
