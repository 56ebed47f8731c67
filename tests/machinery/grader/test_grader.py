#!/usr/bin/env python3
"""Tests of the grading driver (tests/grade.py) against hostile and broken submissions.

A minimal kit with one lesson (tests/machinery/grader/fake: lesson 99, `lesson_add`) is copied to a temporary folder
with the real tests/grade.py and tests/grading.h, then graded: its solution and starter (learner mode), and a
class of submissions (tests/machinery/grader/attacks/<name>/add.c, instructor mode), each with one attack or mistake.
Every attack must end with 0 points and a clear reason, the kit's files unchanged, no process left behind,
and every other student graded. Run by `make test-grader` (part of `make test`); Python 3 standard library.
"""
import csv
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))  # tests/ (this file is in tests/machinery/grader/)
sys.path.insert(0, TESTS)
import grade  # noqa: E402  (the pure functions are tested directly)

ROOT = None  # the temporary kit


def setUpModule():
    global ROOT
    ROOT = tempfile.mkdtemp(prefix="grader-test-")
    shutil.copytree(os.path.join(HERE, "fake"), ROOT, dirs_exist_ok=True)
    for f in ("grade.py", "grader_sandbox.py", "grading.h"):
        shutil.copy2(os.path.join(TESTS, f), os.path.join(ROOT, "tests", f))


def tearDownModule():
    shutil.rmtree(ROOT, ignore_errors=True)


def run_grade(*args, sandbox=None, timeout=300, write_bytecode=False):
    env = dict(os.environ)
    env.pop("MAKEFLAGS", None)
    if write_bytecode:  # as on a learner's machine, where nothing sets it
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if sandbox:
        env["GRADE_SANDBOX"] = sandbox
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "grade.py"), *args], cwd=ROOT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def kit_digest():
    h = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "**"), recursive=True)
                       + glob.glob(os.path.join(ROOT, "kit", "*"))):
        if os.path.isfile(path) and "__pycache__" not in path:  # Python's caches are not the kit
            with open(path, "rb") as f:
                h.update(path.encode() + f.read())
    return h.hexdigest()


def escapees():
    found = []
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            with open(comm) as f:
                name = f.read().strip()
            if name == "grader-escapee":
                found.append(comm.split("/")[2])
        except OSError:
            pass
    return found


def submissions(names):
    d = tempfile.mkdtemp(prefix="class-", dir=ROOT)
    for n in names:
        shutil.copytree(os.path.join(HERE, "attacks", n), os.path.join(d, n, "99"))
    return d


class ClassRun:
    """One instructor-mode run over some of the attacks; results per student."""

    def __init__(self, names, sandbox=None):
        self.before = kit_digest()
        subs = submissions(names)
        self.out = os.path.join(ROOT, f"graded-{sandbox or 'auto'}")
        self.rc, self.log = run_grade("--submissions", subs, "--out", self.out, "--jobs", "2", "--mem-mb", "128",
                                      sandbox=sandbox)
        self.after = kit_digest()
        with open(os.path.join(self.out, "class.csv"), newline="") as f:
            self.rows = {r["student"]: r for r in csv.DictReader(f)}

    def tests(self, student):
        with open(os.path.join(self.out, student, "results.json")) as f:
            return {t["name"].split(": ")[1]: t for t in json.load(f)["tests"]}


ATTACKS = ["honest", "wrong", "rewrite", "setsid", "shm", "ctrlchars", "killparent", "forge_xml", "forge_ctor",
           "forge_channel", "preinit", "interpose", "header", "loop"]
CHEATS = [a for a in ATTACKS if a not in ("honest", "setsid", "loop")]  # every one of these must score 0


class TestLearnerMode(unittest.TestCase):
    def test_solution_passes_and_starter_fails(self):
        rc, log = run_grade("--solutions", "--expect", "pass")
        self.assertEqual(rc, 0, log)
        self.assertIn("Not verified on this machine", log)
        self.assertIn("test_needs_gpu: no usable GPU: this is the fake lesson", log)
        rc, log = run_grade("--expect", "fail")
        self.assertEqual(rc, 0, log)
        self.assertIn("-1 != 5", log)  # cmocka shows 0xffffffffffffffff != 0x5

    def test_fresh_kit_on_a_machine_that_writes_bytecode(self):
        # The supervisor imports grade.py; where Python caches bytecode, that import wrote tests/__pycache__ during
        # the first test, the guard took it for a file the test wrote, and every test of a fresh clone scored 0.
        shutil.rmtree(os.path.join(ROOT, "tests", "__pycache__"), ignore_errors=True)
        rc, log = run_grade("--solutions", "--expect", "pass", sandbox="none", write_bytecode=True)
        self.assertEqual(rc, 0, log)
        self.assertNotIn("changed the kit's files", log)

    def test_killing_the_parent_still_prints_a_table(self):
        lessons = tempfile.mkdtemp(prefix="learner-", dir=ROOT)
        shutil.copytree(os.path.join(HERE, "attacks", "killparent"), os.path.join(lessons, "99-fake"))
        for sandbox in ("none", None):
            rc, log = run_grade("--lessons-dir", lessons, sandbox=sandbox)
            self.assertEqual(rc, 0, log)
            self.assertIn("TOTAL", log)
            self.assertRegex(log, r"TOTAL\s+0/5")


def plant(folder, source, days_ago=None):
    """Copies a lesson's add.c into folder/99-fake, with its time stamp set days_ago in the past (as cp -p,
    tar, unzip, rsync -a or an older git checkout leave it) when given."""
    os.makedirs(os.path.join(folder, "99-fake"), exist_ok=True)
    target = os.path.join(folder, "99-fake", "add.c")
    shutil.copy(os.path.join(ROOT, source, "99-fake", "add.c"), target)
    shutil.copy(os.path.join(ROOT, source, "99-fake", "lesson.h"), os.path.join(folder, "99-fake", "lesson.h"))
    if days_ago is not None:
        for name in ("add.c", "lesson.h"):
            past = os.path.getmtime(os.path.join(folder, "99-fake", name)) - days_ago * 86400
            os.utime(os.path.join(folder, "99-fake", name), (past, past))


class TestEveryGradeCompilesWhatItGrades(unittest.TestCase):
    """The solution graded, then the starter put back with an OLD time stamp: make, deciding by time, would
    link the solution's objects again (it scored 16/16 on lesson 04 that way)."""

    def test_learner_mode(self):
        lessons = tempfile.mkdtemp(prefix="restored-", dir=ROOT)
        plant(lessons, "solutions")
        rc, log = run_grade("--lessons-dir", lessons)
        self.assertRegex(log, r"TOTAL\s+4/5", log)
        # test_add_zero's hint says "TODO 2 (stretch)": the core and the stretch goals are scored apart too
        self.assertIn("lesson 99: core 3/4, stretch goals 1/1", log)
        plant(lessons, "lessons", days_ago=30)
        rc, log = run_grade("--lessons-dir", lessons)
        self.assertRegex(log, r"TOTAL\s+0/5", log)
        self.assertIn("lesson 99: core 0/4, stretch goals 0/1", log)
        plant(lessons, "solutions", days_ago=60)  # and back: older still than the starter's objects
        rc, log = run_grade("--lessons-dir", lessons)
        self.assertRegex(log, r"TOTAL\s+4/5", log)

    def test_class_run(self):
        subs = tempfile.mkdtemp(prefix="restored-class-", dir=ROOT)
        out = os.path.join(ROOT, "graded-restored")
        plant(os.path.join(subs, "ann"), "solutions")
        rc, log = run_grade("--submissions", subs, "--out", out)
        self.assertRegex(log, r"ann\s+4/5", log)
        plant(os.path.join(subs, "ann"), "lessons", days_ago=30)
        rc, log = run_grade("--submissions", subs, "--out", out)
        self.assertRegex(log, r"ann\s+0/5", log)


KIT = os.path.dirname(TESTS)  # the real kit, for its make rules
KIT_BUILD = os.environ.get("GRADER_KIT_BUILD", "build")


@unittest.skipUnless(os.path.exists(os.path.join(KIT, KIT_BUILD, "libkit.a")),
                     f"the kit is not built in {KIT_BUILD} (make first)")
class TestMakeRebuildsOnContent(unittest.TestCase):
    """The same sequence through the kit's own make rules (mk/lessons.mk), which `make`, `make lesson-NN` and
    `make grade` use on lessons/ in place: lesson 01's solution, then its starter restored with cp -p."""

    def make_and_run(self, lessons, out):
        env = dict(os.environ)
        env.pop("MAKEFLAGS", None)
        env.pop("MAKELEVEL", None)
        binary = os.path.join(out, "test_lesson01")
        p = subprocess.run(["make", "--no-print-directory", "-j2", f"BUILD={KIT_BUILD}", f"LESSONS_DIR={lessons}",
                            f"GRADE_LESSONS_OUT={out}", binary], cwd=KIT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout.decode("utf-8", "replace"))
        run = subprocess.run([binary, "--only", "test_sgd_plain"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=120)
        return run.returncode

    def test_cp_p_restore(self):
        work = tempfile.mkdtemp(prefix="make-restore-")
        try:
            lessons, out = os.path.join(work, "lessons"), os.path.join(work, "out")
            lesson = os.path.join(lessons, "01-single-gpu")
            shutil.copytree(os.path.join(KIT, "solutions", "01-single-gpu"), lesson)
            self.assertEqual(self.make_and_run(lessons, out), 0)  # the solution passes
            for name in os.listdir(os.path.join(KIT, "lessons", "01-single-gpu")):
                src = os.path.join(KIT, "lessons", "01-single-gpu", name)
                shutil.copy2(src, os.path.join(lesson, name))  # cp -p
                os.utime(os.path.join(lesson, name), (1e9, 1e9))  # 2001: older than any object
            self.assertNotEqual(self.make_and_run(lessons, out), 0)  # the starter fails
        finally:
            shutil.rmtree(work, ignore_errors=True)


@unittest.skipUnless(os.path.exists(os.path.join(KIT, KIT_BUILD, "libkit.a")),
                     f"the kit is not built in {KIT_BUILD} (make first)")
class TestClassRunGradesLikeMakeGrade(unittest.TestCase):
    """A class run of the reference solution of lesson 01 (which has a CUDA kernel test: run in the emulator
    without a GPU) scores full marks, with the same tests, statuses and places as the learner's grade."""

    def grade(self, *args):
        env = dict(os.environ)
        env.pop("MAKEFLAGS", None)
        p = subprocess.run([sys.executable, os.path.join(KIT, "tests", "grade.py"), "--build", KIT_BUILD,
                            "--lesson", "01", *args], cwd=KIT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=900)
        log = p.stdout.decode("utf-8", "replace")
        self.assertEqual(p.returncode, 0, log)
        return log

    def test_reference_solution(self):
        work = tempfile.mkdtemp(prefix="class-like-make-")
        try:
            subs, out = os.path.join(work, "subs"), os.path.join(work, "out")
            shutil.copytree(os.path.join(KIT, "solutions", "01-single-gpu"), os.path.join(subs, "ref", "01-single-gpu"))
            learner_json = os.path.join(work, "learner.json")
            self.grade("--lessons-dir", os.path.join(subs, "ref"), "--results-json", learner_json)
            log = self.grade("--submissions", subs, "--out", out)
            with open(os.path.join(out, "class.csv"), newline="") as f:
                row = next(csv.DictReader(f))
            self.assertEqual(row["total"], row["max"], f"{row}\n{log}")
            with open(learner_json) as f:
                learner = [(t["name"], t["status"], t["score"]) for t in json.load(f)["tests"]]
            with open(os.path.join(out, "ref", "results.json")) as f:
                tests = json.load(f)["tests"]
            self.assertEqual([(t["name"], t["status"], t["score"]) for t in tests], learner)
            with open(os.path.join(KIT, "tests", "lesson01", "hints.tsv")) as f:
                listed = [l.split("\t")[0] for l in f if l.strip() and not l.startswith("#")]
            self.assertEqual([t["name"].split(": ")[1] for t in tests], listed)
            kernel = next(t for t in tests if t["name"].endswith("test_sgd_cuda_kernel"))
            self.assertRegex(kernel["output"], r"Ran on: (GPU|CUDA emulator)")
            self.assertIn("test_sgd_cuda_kernel: passed on the", row["notes"])
        finally:
            shutil.rmtree(work, ignore_errors=True)


class TestClass(unittest.TestCase):
    """Instructor mode, in the sandbox this machine offers (bubblewrap where it works)."""
    cr = None

    @classmethod
    def setUpClass(cls):
        cls.cr = ClassRun(ATTACKS)

    def test_run_completes_for_everyone(self):
        self.assertEqual(self.cr.rc, 0, self.cr.log)
        self.assertEqual(sorted(self.cr.rows), sorted(ATTACKS), self.cr.log)

    def test_honest_scores_and_every_attack_scores_zero(self):
        self.assertEqual(self.cr.rows["honest"]["total"], "4", self.cr.log)
        self.assertEqual(self.cr.rows["setsid"]["total"], "4", self.cr.log)  # right answers; its child is killed
        for name in CHEATS:
            self.assertEqual(self.cr.rows[name]["total"], "0", f"{name}: {self.cr.rows[name]}\n{self.cr.log}")

    def test_kit_files_unchanged(self):
        self.assertEqual(self.cr.before, self.cr.after)
        self.assertFalse(os.path.exists(os.path.join(ROOT, "tests", "lesson99", "extra.c")))
        rc, log = run_grade("--expect", "fail")  # the next run still grades with the real tests
        self.assertEqual(rc, 0, log)

    def test_one_endless_loop_costs_one_full_timeout(self):
        tests = self.cr.tests("loop")
        self.assertIn("TIMEOUT: timed out after 20 s", tests["test_add"]["output"])
        many = tests["test_add_many"]["output"]
        self.assertIn(f"timed out after {grade.PROBE_MIN_S:g} s: a shorter limit, because test_add had already "
                      f"timed out after 20 s", many)
        self.assertEqual(tests["test_add_zero"]["score"], 1, tests["test_add_zero"])  # never met the loop
        self.assertEqual(self.cr.rows["loop"]["total"], "1", self.cr.log)

    def test_no_process_left_behind(self):
        self.assertEqual(escapees(), [])

    def test_shared_memory_is_counted(self):
        t = self.cr.tests("shm")["test_add"]
        self.assertIn("memory", t["output"])

    def test_forgeries_are_errors(self):
        for name in ("forge_xml", "forge_ctor", "forge_channel"):
            for test, t in self.cr.tests(name).items():
                self.assertEqual(t["score"], 0, f"{name} {test}: {t}")
        self.assertIn("forged", self.cr.tests("forge_channel")["test_add"]["output"])

    def test_refused_objects(self):
        self.assertIn(".preinit_array", self.cr.tests("preinit")["test_add"]["output"])
        self.assertIn("_assert_int_equal", self.cr.tests("interpose")["test_add"]["output"])

    def test_headers_of_the_kit_are_not_replaced(self):
        self.assertIn("grading.h left out", self.cr.rows["header"]["notes"])
        self.assertIn("FAIL", self.cr.tests("header")["test_add"]["output"])

    def test_junit_is_valid_xml(self):
        for name in ATTACKS:
            ET.parse(os.path.join(self.cr.out, name, "junit.xml"))
        with open(os.path.join(self.cr.out, "ctrlchars", "junit.xml")) as f:
            self.assertIn("bad bytes", f.read())


class TestClassWithoutSandbox(unittest.TestCase):
    """GRADE_SANDBOX=none (no bubblewrap, not root): the supervisor, the guard and the channel still hold."""

    def test_attacks(self):
        names = ["honest", "rewrite", "setsid", "killparent", "forge_channel"]
        run = ClassRun(names, sandbox="none")
        self.assertEqual(run.rc, 0, run.log)
        self.assertEqual(sorted(run.rows), sorted(names), run.log)
        self.assertEqual(run.rows["honest"]["total"], "4", run.log)
        self.assertEqual(run.rows["setsid"]["total"], "4", run.log)
        for name in ("rewrite", "killparent", "forge_channel"):
            self.assertEqual(run.rows[name]["total"], "0", f"{name}: {run.rows[name]}\n{run.log}")
        self.assertEqual(run.before, run.after)
        self.assertIn("changed the kit's files", run.tests("rewrite")["test_add"]["output"])
        self.assertIn("supervisor was killed", run.tests("killparent")["test_add"]["output"])
        self.assertEqual(escapees(), [])


@unittest.skipUnless(os.geteuid() == 0, "the uid sandbox is for root without bubblewrap")
class TestClassUidSandbox(unittest.TestCase):
    """GRADE_SANDBOX=uid (root without bubblewrap): every test as an unprivileged user of its own."""

    def test_attacks(self):
        names = ["honest", "rewrite", "setsid", "killparent", "forge_channel", "shm"]
        run = ClassRun(names, sandbox="uid")
        self.assertEqual(run.rc, 0, run.log)
        self.assertIn("sandbox: a user per test", run.log)
        self.assertEqual(run.rows["honest"]["total"], "4", run.log)
        self.assertEqual(run.rows["setsid"]["total"], "4", run.log)
        for name in ("rewrite", "killparent", "forge_channel", "shm"):
            self.assertEqual(run.rows[name]["total"], "0", f"{name}: {run.rows[name]}\n{run.log}")
        self.assertEqual(run.before, run.after)
        self.assertFalse(os.path.exists(os.path.join(ROOT, "tests", "lesson99", "extra.c")))
        self.assertEqual(escapees(), [])


class TestMessages(unittest.TestCase):
    def test_decimal_counts(self):
        self.assertEqual(grade.one_line("0xa != 0x14\nt.c:3: error: Failure!"), "10 != 20 (t.c:3)")
        self.assertEqual(grade.one_line("0 != 0xffffffffffffffff"), "0 != -1")
        self.assertEqual(grade.one_line("checksum 0xdeadbeef"), "checksum 0xdeadbeef")

    def test_failing_rank_own_stderr(self):
        out = "\n".join([
            "[1,0]<stdout>:lesson 03: 2 ranks, device cpu",
            "[1,1]<stdout>:lesson 03: rank 1 ready",
            "[1,1]<stderr>:the gradient on rank 1 is 2x the global mean",
            "[1,1]<stderr>:[  ERROR   ] --- ",
        ])
        self.assertEqual(grade.failure_text(out, failing=[1]), "the gradient on rank 1 is 2x the global mean")
        died = "[1,0]<stdout>:banner of rank 0\n[1,1]<stderr>:rank 1: out of memory in pg_allreduce"
        self.assertEqual(grade.failure_text(died, failing=[1]), "rank 1: out of memory in pg_allreduce")

    def test_timeout_text(self):
        out = ("[1,0]<stdout>:banner\n[1,0]<stderr>:rank 0: all-reduce of 10 floats timed out after 7.5 s: a peer "
               "rank died or stalled (see its log)\n")
        out += "[1,1]<stdout>:banner\n[1,0]<stderr>:  HINT: every rank must call the same collectives\n"
        said = grade.timeout_text(out).splitlines()
        self.assertTrue(said[0].startswith("rank 0: all-reduce of 10 floats timed out"))
        self.assertEqual(said[1], "HINT: every rank must call the same collectives")

    def test_dead_rank_says_why(self):
        out = ("[1,0]<stdout>:process group: 2 ranks\n[1,1]<stderr>:epoch 1 starts with epoch 0's batch again\n"
               "[1,1]<stderr>:kit/data.c:512: ds->c >= 1\n---------\n  Process name: [[2197,1],1]\n")
        self.assertEqual(grade.rank_story(out, [0, 1]), "rank 1: epoch 1 starts with epoch 0's batch again")
        kit = ("[1,1]<stderr>:MPI Error in NBC subrequest 0x5653 : 15\n[1,1]<stderr>:rank 1: kit/dist.c:150: "
               "MPI_Test(req)\n[1,1]<stderr>:  error: MPI_ERR_TRUNCATE\n[1,1]<stderr>:  HINT: a peer rank died\n"
               "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 11\n")
        self.assertEqual(grade.rank_story(kit, [0, 1]).splitlines(),
                         ["rank 1: kit/dist.c:150: MPI_Test(req)", "error: MPI_ERR_TRUNCATE", "HINT: a peer rank died"])

    def test_printed_above_is_brought_in(self):
        msg = "the replicas stopped being identical (the first step where they differ is printed above)"
        out = f"[1,1]<stderr>:after step 1 the replicas differ: momentum\n[1,1]<stderr>:{msg}\n"
        self.assertEqual(grade.printed_above(msg, out, [1]),
                         "the replicas stopped being identical: after step 1 the replicas differ: momentum")
        self.assertEqual(grade.printed_above(msg, f"[1,0]<stderr>:{msg}\n", [0]),
                         "the replicas stopped being identical")

    def test_long_messages_wrap(self):
        fake = type("L", (), {"num": "99", "name": "99-fake"})
        why = "the loss after step 3 is 2.31 instead of 0.98: " + "a long explanatory sentence " * 8 + "THE END"
        r = grade.result(fake, ("test_add", 1, "hint", None), grade.FAIL, why)
        import io
        out = io.StringIO()
        grade.print_table([r], "t", out=out)
        rows = [l for l in out.getvalue().splitlines() if l.startswith("99") or l.startswith(" " * 12)]
        self.assertGreater(len(rows), 1)
        self.assertTrue(all(len(l) <= grade.TABLE_WIDTH for l in rows), rows)
        self.assertEqual(" ".join(" ".join(rows).split()), " ".join(("99 test_add 0/1 FAIL " + why).split()))

    def test_the_cause_is_shown(self):
        fake = type("L", (), {"num": "04", "name": "04-ckpt"})
        out = ("[1,0]<stdout>:epoch 1/2 step 3/39\n"
               "[1,0]<stderr>:error: rank 0: cannot resume: the checkpoint was trained with --seed 0\n"
               "[1,1]<stderr>:error: rank 1: cannot resume: the checkpoint was trained with --seed 0\n"
               "[1,0]<stderr>:run_program returned RUN_FAILED (see the error above), expected RUN_DONE\n")
        r = grade.result(fake, ("test_resume", 3, "hint", None), grade.FAIL,
                         "run_program returned RUN_FAILED (see the error above), expected RUN_DONE\nt.c:9: error: Failure!",
                         out)
        self.assertEqual(grade.cause_lines(r), ["rank 0: error: rank 0: cannot resume: the checkpoint was trained "
                                                "with --seed 0", "rank 1: error: rank 1: cannot resume: the "
                                                "checkpoint was trained with --seed 0"])
        plain = grade.result(fake, ("test_x", 1, "hint", None), grade.CRASH, "crashed with SIGSEGV",
                             "[ RUN      ] test_x\nloading model.bin\nkit/ops.c:12: buffer too small\n")
        self.assertEqual(grade.cause_lines(plain), ["loading model.bin", "kit/ops.c:12: buffer too small"])
        asan = grade.result(fake, ("test_x", 1, "hint", None), grade.CRASH, "crashed with SIGABRT",
                            "==7==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6\n#0 0x5 in f t.c:3\n"
                            "SUMMARY: AddressSanitizer: heap-buffer-overflow t.c:3 in f\nShadow bytes:\n  Heap left redzone: fa\n")
        self.assertEqual(grade.cause_lines(asan), ["==7==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6",
                                                   "SUMMARY: AddressSanitizer: heap-buffer-overflow t.c:3 in f"])
        clear = grade.result(fake, ("test_x", 1, "hint", None), grade.FAIL, "1 != 2", "noise\n")
        self.assertEqual(grade.cause_lines(clear), [])  # a message that says it all gets no extra lines

    def test_junit_cleans_every_string(self):
        r = grade.result(type("L", (), {"num": "99", "name": "99-fake"}), ("t\x01", 1, "h\x02", None), grade.FAIL,
                         "\x1b[31m(t.c:3)", "out\x07put")
        ET.fromstring(grade.junit_xml([r]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
