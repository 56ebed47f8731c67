#!/usr/bin/env python3
"""Lesson 08's pipeline tools against what they claim (`make test-pipeline-tools`):

- bench/torch_pipeline.py runs the kit's network cut where the kit cuts it: its default cut (the kit's cut by
  parameter count, computed in Python) and the parameter count of each PyTorch stage equal what the lesson's
  program prints (`stage s: layers a..b  N params`), for tiny, tiny-bn and resnet9;
- PyTorch's own schedules run through it: one short run prints a row of the promised columns;
- bench/plot_pipeline.py puts the simulator's numbers next to the measurements and refuses a CSV without the
  promised columns.

    python3 tests/bench/test_pipeline_tools.py BUILD/solutions/08-pipeline/train BUILD/bench/pipeline_simulate

Without PyTorch the cases that need it are skipped with the reason.
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
TRAIN = SIMULATE = None  # from the command line
STAGE = re.compile(r"^\s*stage (\d+): layers\s+(\d+)\.\.(\d+)\s+(\d+) params")

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def kit_stages(model, width):
    """[(first layer, last layer, params)] of the lesson's program cutting `model` into 2 stages by parameter
    count: read from its report, then the program is stopped (the report comes before any training)."""
    args = [TRAIN, "--device", "cpu", "--dataset", "synthetic", "--model", model, "--epochs", "1",
            "--stages", "2", "--balance", "params"] + (["--width", str(width)] if width else [])
    stages = []
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT) as p:
        try:
            for line in p.stdout:
                m = STAGE.match(line)
                if m:
                    stages.append((int(m.group(2)), int(m.group(3)), int(m.group(4))))
                    if len(stages) == 2:
                        break
        finally:
            p.kill()
    return stages


@unittest.skipUnless(HAVE_TORCH, "PyTorch is not installed in python3 (pip install torch)")
class TestTorchPipelineSplit(unittest.TestCase):
    def test_same_cut_and_stage_parameters_as_the_kit(self):
        import torch_pipeline
        from torch_models import build
        for model, width in (("tiny", 0), ("tiny-bn", 0), ("resnet9", 8)):
            with self.subTest(model=model, width=width):
                kit = kit_stages(model, width)
                self.assertEqual(len(kit), 2, f"the program printed no 2-stage report for {model}")
                net = build(model, w=width)
                cut = torch_pipeline.kit_param_cut(net)
                self.assertEqual(cut, kit[1][0], f"{model}: the kit cuts before layer {kit[1][0]}")
                stages = torch_pipeline.split_modules(net, [cut])
                self.assertEqual([sum(p.numel() for p in s.parameters()) for s in stages], [k[2] for k in kit])

    def test_a_cut_inside_a_residual_block_is_refused(self):
        import torch_pipeline
        from torch_models import build
        with self.assertRaises(SystemExit):
            torch_pipeline.split_modules(build("resnet9", w=8), [10])  # layers 7..13: the first residual block

    def test_one_short_run_prints_a_row(self):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "torch_pipeline.py"), "--micro", "2",
                              "--schedules", "1f1b", "--steps", "1", "--warmup", "0", "--rounds", "1"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])
        lines = out.stdout.split()
        self.assertEqual(lines[0], "peer,schedule,P,M,batch,step_ms,images_per_s")
        row = lines[1].split(",")
        self.assertEqual(row[:5], ["torch", "1f1b", "2", "2", "64"])
        self.assertGreater(float(row[5]), 0.0)


class TestPlotPipeline(unittest.TestCase):
    def run_plot(self, csv_text):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "kit.csv")
            with open(path, "w") as f:
                f.write(csv_text)
            return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plot_pipeline.py"), "--simulator",
                                   SIMULATE, "--csv", path, "--torch", os.path.join(tmp, "none.csv"), "--png",
                                   os.path.join(tmp, "p.png")], capture_output=True, text=True, timeout=120)

    def test_simulated_idle_next_to_the_measured(self):
        # Made-up measurements: only the simulator's columns and the formula are checked. P = 2, M = 4:
        # (P-1)/(M+P-1) = 0.2 for both; stage 0 stores 4 micro-batches under GPipe, min(P, M) = 2 under 1F1B.
        out = self.run_plot("schedule,P,M,batch,step_ms,idle_measured,idle_formula,peak_inflight\n"
                            "gpipe,2,4,64,10,0.3,0.2,4\n1f1b,2,4,64,10,0.3,0.2,2\n")
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line[:5] in ("gpipe", "1f1b ")}
        for name, peak in (("gpipe", "4"), ("1f1b", "2")):
            cols = rows[name]  # schedule P M | measured simulated formula | peak sim | step torch
            self.assertEqual(cols[1:3], ["2", "4"])
            self.assertEqual(cols[5], "0.200")
            self.assertEqual(cols[6], "0.200")
            self.assertEqual(cols[9], peak)

    def test_missing_column_is_refused(self):
        out = self.run_plot("schedule,P,M,batch,step_ms\ngpipe,2,4,64,10\n")
        self.assertEqual(out.returncode, 1)
        self.assertIn("no column idle_measured", out.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: test_pipeline_tools.py BUILD/solutions/08-pipeline/train BUILD/bench/pipeline_simulate")
    TRAIN, SIMULATE = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)
