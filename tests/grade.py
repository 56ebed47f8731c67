#!/usr/bin/env python3
"""The grading driver: builds each lesson's autograder, runs every test in its own process, prints a score table.

Learner / CI:
    tests/grade.py [--lesson NN] [--solutions] [--expect pass|fail] [--results-json F] [--junit F]
Instructor:
    tests/grade.py --submissions DIR --out OUTDIR [--lesson NN] [--jobs N]

Each test runs as `test_lessonNN --only NAME` with a timeout and resource limits; its verdict is read from the
cmocka XML file the driver asked for, never from what the program prints. A crash, a timeout or a missing XML
file is a failure with its reason. Points and hints come from tests/lessonNN/hints.tsv:
    test_name<TAB>points<TAB>hint shown when it fails[<TAB>timeout seconds]
See tests/GRADING.md. Python 3 standard library only.
"""
import argparse
import concurrent.futures
import csv
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape, quoteattr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSON_DIR = re.compile(r"^(\d\d)-[A-Za-z0-9._-]+$")
OUTPUT_TAIL = 4000          # characters of a test's own output kept for the report
BUILD_TIMEOUT = 600         # seconds to build one lesson's autograder
SOURCE_SUFFIXES = (".c", ".h", ".cu")

PASS, FAIL, CRASH, TIMEOUT, ERROR, NOBUILD, SKIP, MISSING = (
    "PASS", "FAIL", "CRASH", "TIMEOUT", "ERROR", "NOBUILD", "SKIP", "MISSING")


# ------------------------------------------------------------------------------------------------ lessons

class Lesson:
    """One lesson of the kit: its folder name, its tests (from hints.tsv), and how many ranks its tests need."""

    def __init__(self, root, name):
        self.name = name
        self.num = name[:2]
        self.tests = []  # (test name, points, hint, timeout or None)
        hints = os.path.join(root, "tests", f"lesson{self.num}", "hints.tsv")
        with open(hints, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                line = line.rstrip("\r\n")
                if not line.strip() or line.startswith("#"):
                    continue
                cols = line.split("\t")
                if len(cols) < 3 or not re.fullmatch(r"\d+(\.\d+)?", cols[1]):
                    raise SystemExit(f"grade: {hints}:{number}: expected test_name<TAB>points<TAB>hint")
                timeout = float(cols[3]) if len(cols) > 3 and cols[3].strip() else None
                self.tests.append((cols[0].strip(), float(cols[1]), cols[2].strip(), timeout))
        config = read_lesson_mk(os.path.join(root, "solutions", name, "lesson.mk"))
        self.np = int(config.get("GRADE_NP", "1") or 1)

    @property
    def max_points(self):
        return sum(t[1] for t in self.tests)


def read_lesson_mk(path):
    """The simple `VAR := value` lines of a lesson.mk."""
    values = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*[:?]?=\s*(.*?)\s*(#.*)?$", line)
                if m:
                    values[m.group(1)] = m.group(2)
    return values


def find_lessons(root, wanted, skipped):
    """The kit's gradable lessons: solutions/NN-name with tests/lessonNN/test_lessonNN.c and hints.tsv."""
    base = os.path.join(root, "solutions")
    lessons = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        m = LESSON_DIR.match(name)
        if not m or (wanted and m.group(1) not in wanted) or m.group(1) in skipped:
            continue
        test_dir = os.path.join(root, "tests", f"lesson{m.group(1)}")
        if os.path.exists(os.path.join(test_dir, f"test_lesson{m.group(1)}.c")):
            if not os.path.exists(os.path.join(test_dir, "hints.tsv")):
                raise SystemExit(f"grade: {test_dir}/hints.tsv is missing (test_name<TAB>points<TAB>hint)")
            lessons.append(Lesson(root, name))
    missing = sorted(set(wanted) - {l.num for l in lessons} - set(skipped))
    if missing:
        raise SystemExit(f"grade: no gradable lesson {' '.join(missing)} (needs solutions/NN-name/ and "
                         f"tests/lessonNN/test_lessonNN.c)")
    return lessons


# ------------------------------------------------------------------------------------------------ building

def make_env():
    """The environment for a child make: the caller's variables (CC=clang...), without its jobserver."""
    env = os.environ.copy()
    flags = env.get("MAKEFLAGS", "")
    flags = " ".join(w for w in flags.split() if not w.startswith(("--jobserver", "-j")))
    env["MAKEFLAGS"] = flags
    env.pop("MFLAGS", None)
    env.pop("MAKELEVEL", None)
    return env


def build(root, build_dir, target, make_args, log_path=None):
    """Runs make for one target. Returns (ok, log text)."""
    cmd = ["make", "--no-print-directory", f"-j{os.cpu_count() or 1}", f"BUILD={build_dir}", *make_args, target]
    try:
        p = subprocess.run(cmd, cwd=root, env=make_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT)
        ok, log = p.returncode == 0, p.stdout.decode("utf-8", "replace")
        log = "".join(l for l in log.splitlines(keepends=True) if not l.startswith("config: "))
    except subprocess.TimeoutExpired as e:
        ok, log = False, (e.stdout or b"").decode("utf-8", "replace") + f"\nbuild timed out after {BUILD_TIMEOUT} s"
    if log_path:
        with open(log_path, "w", encoding="utf-8") as f:
            f.write("$ " + " ".join(cmd) + "\n" + log)
    return ok, log


def first_error(log):
    """The first compiler or linker error line of a build log, for the one-line reason."""
    for line in log.splitlines():
        if re.search(r": (fatal )?error|undefined reference|No rule to make target|\*\*\*", line):
            return line.strip()[:300]
    lines = [l for l in log.splitlines() if l.strip()]
    return lines[-1].strip()[:300] if lines else "make failed"


def list_tests(binary):
    try:
        p = subprocess.run([binary, "--list"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, timeout=30)
        return p.stdout.decode("utf-8", "replace").split() if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


# ------------------------------------------------------------------------------------------------ running

class Limits:
    def __init__(self, timeout, mem_mb, fsize_mb):
        self.timeout, self.mem_mb, self.fsize_mb = timeout, mem_mb, fsize_mb


def binary_traits(binary):
    """Whether the binary uses AddressSanitizer or CUDA: both reserve huge virtual address ranges,
    so an address-space limit would break them (the data-segment limit is used instead for CUDA)."""
    try:
        with open(binary, "rb") as f:
            data = f.read()
    except OSError:
        return False, False
    return b"__asan_init" in data, b"libcudart" in data or b"cudaGetDeviceCount" in data


def limiter(limits, timeout, asan, cuda):
    """preexec_fn: resource limits for one test process (and everything it starts)."""
    def apply():
        def cap(which, soft, hard=None):
            try:
                resource.setrlimit(which, (soft, soft if hard is None else hard))
            except (ValueError, OSError):
                pass
        cap(resource.RLIMIT_CORE, 0)
        cpu = int(timeout * max(1, os.cpu_count() or 1)) + 10  # CPU seconds over all threads: a backstop
        cap(resource.RLIMIT_CPU, cpu, cpu + 5)
        cap(resource.RLIMIT_FSIZE, limits.fsize_mb << 20)  # also bounds a runaway printf loop's log
        if limits.mem_mb > 0 and not asan:
            cap(resource.RLIMIT_DATA if cuda else resource.RLIMIT_AS, limits.mem_mb << 20)
    return apply


def kill_tree(leader, leader_alive):
    """Kills everything the test started: its session (mpirun puts each rank in its own process group, but
    they stay in the session) and, while the leader is alive (not yet reaped, so its pid cannot have been
    reused), the leader and every descendant, found before any of them dies and gets re-parented."""
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                procs[int(entry)] = (int(fields[1]), int(fields[3]))  # (parent, session)
            except (OSError, IndexError, ValueError):
                pass
    doomed = {pid for pid, (_, sid) in procs.items() if sid == leader}
    if leader_alive:
        doomed.add(leader)
    grew = leader_alive
    while grew:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in doomed} - doomed
        doomed |= more
        grew = bool(more)
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


SIGNAL_WHY = {
    "SIGSEGV": "a bad pointer or an out-of-bounds index",
    "SIGBUS": "a bad pointer",
    "SIGFPE": "an integer division by zero",
    "SIGABRT": "abort() or a failed assert()",
    "SIGKILL": "killed, often for using too much memory",
    "SIGXCPU": "it used more CPU time than allowed",
    "SIGXFSZ": "it wrote more output than allowed",
    "SIGILL": "an illegal instruction",
}


def crash_reason(sig):
    name = signal_name(sig)
    why = SIGNAL_WHY.get(name)
    return f"crashed with {name}" + (f" ({why})" if why else "")


def read_verdict(xml_paths, name):
    """The cmocka verdict for test `name` from the XML files: (status, message) or None when absent."""
    worst = None
    for path in xml_paths:
        try:
            tree = ET.parse(path)
        except (OSError, ET.ParseError):
            return None
        cases = [c for c in tree.iter("testcase") if c.get("name") == name]
        if len(cases) != 1:
            return None
        case = cases[0]
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            text = (failure.text or "").strip()
            m = re.search(r"Test failed with exception: (.*?)\((\d+)\)", text)
            verdict = (CRASH, crash_reason(int(m.group(2)))) if m else (FAIL, text or "assertion failed")
        elif case.find("skipped") is not None:
            verdict = (SKIP, "skipped")
        else:
            verdict = (PASS, "")
        if worst is None or worst[0] == PASS or (worst[0] == SKIP and verdict[0] != PASS):
            worst = verdict
    return worst


def tail(path, limit=OUTPUT_TAIL):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            text = f.read().decode("utf-8", "replace")
        return ("...\n" if size > limit else "") + text
    except OSError:
        return ""


def scratch_dir(root):
    """A fresh working directory for one test, with links so paths like tests/fixtures/... still work."""
    d = tempfile.mkdtemp(prefix="grade-")
    for sub in ("tests", "datasets", "kit", "scripts"):
        if os.path.exists(os.path.join(root, sub)):
            os.symlink(os.path.join(root, sub), os.path.join(d, sub))
    return d


def run_test(root, binary, lesson, test, limits, source_dir):
    """Runs one test in its own process (group). Returns a result dict."""
    name, points, hint, own_timeout = test
    timeout = own_timeout or limits.timeout
    work = scratch_dir(root)
    xml = os.path.join(work, "result.xml")
    log = os.path.join(work, "output.log")
    env = os.environ.copy()
    for k in [k for k in env if k.startswith("CMOCKA_")]:
        del env[k]
    env.update(CMOCKA_MESSAGE_OUTPUT="XML", CMOCKA_XML_FILE=xml, GRADING_ROOT=root,
               GRADING_LESSON_DIR=source_dir, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"))
    cmd = [os.path.abspath(binary), "--only", name]
    if lesson.np > 1:
        cmd = [os.path.join(root, "scripts", "launch.sh"), str(lesson.np)] + cmd
        if not env.get("SLURM_JOB_ID"):  # mpirun: tag each line with its rank, so failure_text can tell them apart
            env["LAUNCH_ARGS"] = (env.get("LAUNCH_ARGS", "") + " --tag-output").strip()
    asan, cuda = binary_traits(binary)
    start = time.monotonic()
    status = message = None
    rc = None
    with open(log, "wb") as out:
        try:
            p = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, preexec_fn=limiter(limits, timeout, asan, cuda),
                                 start_new_session=True)
        except OSError as e:
            status, message = ERROR, f"could not start the test: {e}"
        else:
            try:
                rc = p.wait(timeout=timeout)
                kill_tree(p.pid, leader_alive=False)  # anything it left running in the background
            except subprocess.TimeoutExpired:
                status, message = TIMEOUT, f"timed out after {timeout:g} s (an endless loop, or waiting forever?)"
                kill_tree(p.pid, leader_alive=True)
                p.wait()
    seconds = time.monotonic() - start
    if status is None:
        xmls = [xml] + [f"{xml}.rank{r}" for r in range(1, lesson.np)]
        verdict = read_verdict(xmls, name)
        if rc is not None and rc < 0:
            status, message = CRASH, crash_reason(-rc)
        elif rc is not None and rc >= 128 + 1 and lesson.np > 1 and verdict is None:
            status, message = CRASH, f"a rank died (launcher exit status {rc})"
        elif verdict is None:
            status, message = ERROR, (f"exited with status {rc} before reporting a result "
                                      f"(exit() or a fatal error inside the code under test?)")
        elif verdict[0] == PASS and rc != 0:
            status, message = ERROR, f"reported success but exited with status {rc}"
        else:
            status, message = verdict
    output = tail(log)
    if status == FAIL and one_line(message).startswith("("):
        # cmocka 1.1 keeps print_error() text (e.g. assert_close's "max relative error ...") out of the XML;
        # show the test's last printed line with the location. Display only: the status came from the XML.
        # Under mpirun the launcher's report of a failed rank (a box of dashes) follows the ranks' output.
        own = re.split(r"^-{20,}$", output, maxsplit=1, flags=re.M)[0] if lesson.np > 1 else output
        said = failure_text(own)
        if said:
            message = said[:300] + "\n" + message
    if status == SKIP:  # the reason the test printed (display only; the status came from the XML)
        said = [l.split("]", 1)[1].strip() for l in output.splitlines() if "[  SKIP" in l and "]" in l]
        message = f"skipped: {said[-1]}" if said and said[-1] else message
    shutil.rmtree(work, ignore_errors=True)
    return result(lesson, test, status, message, output, seconds)


def failure_text(output):
    """The line a failed test printed to explain itself: the text cmocka shows right after its first
    "[  ERROR   ] ---" marker, else the last plain line printed before that marker, else the last plain line.
    Under mpirun the ranks' lines interleave in any order; with --tag-output ("[job,rank]<stdout>:text")
    each rank's streams are looked at on their own, and the first one with an error marker is the one shown."""
    tagged = [re.match(r"^\[\d+,(\d+)\]<(std(?:out|err))>:(.*)$", l) for l in output.splitlines()]
    if any(tagged):
        # One stream of one rank at a time: mpirun forwards stdout and stderr separately, so only lines of
        # the same stream keep their order (cmocka's error text and marker both go to stderr).
        streams = {}
        for m in tagged:
            if m:
                streams.setdefault((int(m.group(1)), m.group(2)), []).append(m.group(3))
        keys = sorted(streams)
        marked = [failure_text_of(streams[k]) for k in keys if any("[  ERROR   ] ---" in l for l in streams[k])]
        plain = [failure_text_of(streams[k]) for k in keys]
        return next((t for t in marked + plain if t), "")
    return failure_text_of(output.splitlines())


def failure_text_of(lines):
    plain = lambda l: l.strip() and not l.lstrip().startswith(("<", "["))
    for i, line in enumerate(lines):
        if "[  ERROR   ] ---" in line:
            after = line.split("[  ERROR   ] ---", 1)[1].strip()
            if after and not after.startswith("["):
                return after
            before = [l.strip() for l in lines[:i] if plain(l)]
            return before[-1] if before else ""
    rest = [l.strip() for l in lines if plain(l)]
    return rest[-1] if rest else ""


def result(lesson, test, status, message, output="", seconds=0.0):
    name, points, hint, _ = test
    return {"lesson": lesson.num, "lesson_name": lesson.name, "test": name, "max_score": points,
            "score": points if status == PASS else 0.0, "status": status, "message": message or "",
            "hint": hint if status not in (PASS, SKIP) else "", "output": output, "seconds": round(seconds, 3)}


EMU_NOTE = "ran in the CUDA emulator: no GPU here"


def grade_lesson(root, build_dir, lesson, source, make_args, limits, grade_out=None, lessons_dir=None,
                 log_path=None, strict_names=False, emu_build=None):
    """Builds and runs one lesson's autograder. source: 'solutions' or 'lessons'. Returns (results, build log).
    emu_build: the CUDA emulation build folder (mk/emu.mk); tests skipped for want of a GPU run again there."""
    rs, log = grade_lesson_in(root, build_dir, lesson, source, make_args, limits, grade_out, lessons_dir,
                              log_path, strict_names)
    # skip_without_gpu (tests/testutil.h): no GPU here, or a build without CUDA; the emulator needs neither.
    gpu_skipped = [i for i, r in enumerate(rs) if r["status"] == SKIP and "needs a GPU" in r["message"]]
    if not emu_build or os.path.normpath(emu_build) == os.path.normpath(build_dir) or not gpu_skipped:
        return rs, log
    print(f"grade: no GPU here: running {len(gpu_skipped)} GPU test(s) of lesson {lesson.num} in the CUDA "
          f"emulator (build folder {emu_build})", flush=True)
    only = [lesson.tests[i] for i in gpu_skipped]
    emu_rs, emu_log = grade_lesson_in(root, emu_build, lesson, source, list(make_args) + ["EMU=1"], limits, None,
                                      lessons_dir, None, False, only)
    for i, r in zip(gpu_skipped, emu_rs):
        r["note"] = EMU_NOTE
        rs[i] = r
    return rs, log if emu_rs[0]["status"] != NOBUILD else emu_log


def grade_lesson_in(root, build_dir, lesson, source, make_args, limits, grade_out, lessons_dir, log_path,
                    strict_names, only=None):
    """grade_lesson in one build folder; only: the tests to run (default all)."""
    tests = only or lesson.tests
    args = list(make_args)
    if source == "solutions":
        binary = os.path.join(build_dir, "grade-solutions", f"test_lesson{lesson.num}")
        source_dir = os.path.join(root, "solutions", lesson.name)
    else:
        out = grade_out or os.path.join(build_dir, "grade-lessons")
        binary = os.path.join(out, f"test_lesson{lesson.num}")
        lessons_dir = lessons_dir or "lessons"
        args += [f"GRADE_LESSONS_OUT={out}", f"LESSONS_DIR={lessons_dir}"]
        source_dir = os.path.join(root, lessons_dir, lesson.name)
    if not os.path.isdir(source_dir):
        return [result(lesson, t, MISSING, f"{source_dir} does not exist") for t in tests], ""
    ok, log = build(root, build_dir, binary, args, log_path)
    if lessons_dir and os.path.isabs(lessons_dir):  # a staged copy: show paths as the student knows them
        log = log.replace(lessons_dir.rstrip("/") + "/", "")
    if not ok:
        why = "does not compile: " + first_error(log)
        return [result(lesson, t, NOBUILD, why, log[-OUTPUT_TAIL:]) for t in tests], log
    binary = os.path.join(root, binary) if not os.path.isabs(binary) else binary
    if strict_names:
        listed = list_tests(binary)
        named = [t[0] for t in lesson.tests]
        if listed is None:
            raise SystemExit(f"grade: {binary} --list failed")
        extra, absent = sorted(set(listed) - set(named)), sorted(set(named) - set(listed))
        if extra or absent:
            raise SystemExit(f"grade: tests/lesson{lesson.num}/hints.tsv and the test binary disagree: "
                             f"not in hints.tsv: {extra or '-'}; not in the binary: {absent or '-'}")
    return [run_test(root, binary, lesson, t, limits, source_dir) for t in tests], log


# ------------------------------------------------------------------------------------------------ reports

def fmt_points(x):
    return f"{x:g}"


def one_line(message, limit=160):
    """A failure message on one line: cmocka's 'file:line: error: Failure!' becomes '(file:line)'."""
    where, said = "", []
    for line in message.splitlines():
        m = re.match(r"^(\S+:\d+): error: Failure!$", line.strip())
        if m:
            where = where or m.group(1)
        elif line.strip():
            said.append(line.strip())
    text = ("; ".join(said) + (f" ({where})" if where else "")).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def print_table(results, title, out=sys.stdout):
    width = max([len(r["test"]) for r in results] + [4])
    print(f"\n{title}", file=out)
    print(f"{'lesson':<7}{'test':<{width + 2}}{'points':>8}  result", file=out)
    for r in results:
        pts = f"{fmt_points(r['score'])}/{fmt_points(r['max_score'])}"
        line = f"{r['lesson']:<7}{r['test']:<{width + 2}}{pts:>8}  {r['status']}"
        if r["status"] != PASS:
            line += f"  {one_line(r['message'])}"
        if r.get("note"):
            line += f"  ({r['note']})"
        print(line, file=out)
        if r["hint"]:
            print(f"{'':<7}  hint: {r['hint']}", file=out)
    total = sum(r["score"] for r in results)
    most = sum(r["max_score"] for r in results)
    counts = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"{'TOTAL':<7}{'':<{width + 2}}{fmt_points(total) + '/' + fmt_points(most):>8}  ({summary})", file=out)
    if counts.get(SKIP):
        print("(skipped tests need what this machine lacks, e.g. a GPU; they score 0 here)", file=out)


def gradescope_json(results, extra_output=""):
    tests = []
    for r in results:
        parts = [f"{r['status']}: {r['message']}".strip()] if r["status"] != PASS else ["passed"]
        if r.get("note"):
            parts.append(f"({r['note']})")
        if r["hint"]:
            parts.append(f"Hint: {r['hint']}")
        if r["status"] != PASS and r["output"].strip():
            label = "Compiler output" if r["status"] == NOBUILD else "Program output (last lines)"
            parts.append(f"{label}:\n" + r["output"])
        tests.append({"name": f"lesson {r['lesson']}: {r['test']}", "score": r["score"],
                      "max_score": r["max_score"], "status": "passed" if r["status"] == PASS else "failed",
                      "output": "\n".join(parts)})
    return {"score": sum(r["score"] for r in results), "output": extra_output, "tests": tests}


def junit_xml(results, suite_prefix=""):
    by_lesson = {}
    for r in results:
        by_lesson.setdefault(r["lesson"], []).append(r)
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>"]
    for num, rs in sorted(by_lesson.items()):
        failures = sum(r["status"] not in (PASS, SKIP) for r in rs)
        skipped = sum(r["status"] == SKIP for r in rs)
        suite = f"{suite_prefix}lesson{num}"
        lines.append(f"  <testsuite name={quoteattr(suite)} tests=\"{len(rs)}\" failures=\"{failures}\" "
                     f"skipped=\"{skipped}\" time=\"{sum(r['seconds'] for r in rs):.3f}\">")
        for r in rs:
            lines.append(f"    <testcase classname={quoteattr(suite)} name={quoteattr(r['test'])} "
                         f"time=\"{r['seconds']:.3f}\">")
            if r["status"] == SKIP:
                lines.append(f"      <skipped message={quoteattr(r['message'])}/>")
            elif r["status"] != PASS:
                body = r["message"] + (f"\nHint: {r['hint']}" if r["hint"] else "")
                lines.append(f"      <failure message={quoteattr(r['status'] + ': ' + r['message'][:200])} "
                             f"type={quoteattr(r['status'])}>{escape(body)}</failure>")
                if r["output"].strip():
                    lines.append(f"      <system-out>{escape(clean_xml_text(r['output']))}</system-out>")
            lines.append("    </testcase>")
        lines.append("  </testsuite>")
    lines.append("</testsuites>")
    return "\n".join(lines) + "\n"


def clean_xml_text(text):
    """Drops characters XML 1.0 cannot hold (student output may contain anything)."""
    return re.sub(r"[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd]", "?", text)


def write_file(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def check_expectation(results, expect):
    """CI: every test passes (expect=pass) or every test fails cleanly (expect=fail). Returns problems."""
    problems = []
    for r in results:
        tag = f"lesson {r['lesson']} {r['test']}"
        if r["status"] == SKIP:
            continue
        if expect == "pass" and r["status"] != PASS:
            problems.append(f"{tag}: expected PASS, got {r['status']}: {one_line(r['message'], 200)}")
        if expect == "fail":
            if r["status"] == PASS:
                problems.append(f"{tag}: passes, but on the unmodified starter it must fail (invariant 10)")
            elif r["status"] in (TIMEOUT, NOBUILD, MISSING, ERROR):
                problems.append(f"{tag}: the starter must fail quickly with a hint, got {r['status']}: "
                                f"{one_line(r['message'], 200)}")
            elif r["status"] == CRASH:
                print(f"grade: note: {tag} crashes on the starter ({r['message']}); "
                      f"a STARTER line returning a safe value gives learners a clearer failure")
            if not r["hint"] and r["status"] != PASS:
                problems.append(f"{tag}: no hint in hints.tsv")
    return problems


# ------------------------------------------------------------------------------------------------ instructor

def stage_submission(root, student_dir, lesson, stage_root):
    """Copies the kit's starter of the lesson, then the student's source files over it.
    Returns the staged folder, or None when the student did not hand in this lesson."""
    found = None
    for base in (student_dir, os.path.join(student_dir, "lessons")):
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            if os.path.isdir(os.path.join(base, name)) and (name == lesson.name or name.startswith(lesson.num + "-")
                                                            or name == lesson.num):
                found = os.path.join(base, name)
                break
        if found:
            break
    if not found:
        return None
    dest = os.path.join(stage_root, lesson.name)
    shutil.copytree(os.path.join(root, "lessons", lesson.name), dest)
    for dirpath, _, filenames in os.walk(found):
        for fn in filenames:
            if fn.endswith(SOURCE_SUFFIXES):
                src = os.path.join(dirpath, fn)
                rel = os.path.relpath(src, found)
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                shutil.copyfile(src, os.path.join(dest, rel))
    return dest


def grade_student(root, build_dir, lessons, student_dir, out_dir, make_args, limits):
    """Grades one student into out_dir (results.json, junit.xml, build logs). Never raises."""
    student = os.path.basename(student_dir.rstrip("/"))
    os.makedirs(out_dir, exist_ok=True)
    results, notes = [], []
    work = tempfile.mkdtemp(prefix=f"grade-{student}-")
    try:
        stage = os.path.join(work, "lessons")
        os.makedirs(stage)
        for lesson in lessons:
            try:
                staged = stage_submission(root, student_dir, lesson, stage)
                if staged is None:
                    results += [result(lesson, t, MISSING, "not submitted") for t in lesson.tests]
                    notes.append(f"lesson {lesson.num}: not submitted")
                    continue
                rs, _ = grade_lesson(root, build_dir, lesson, "lessons", make_args, limits,
                                     grade_out=os.path.join(work, "build"), lessons_dir=stage,
                                     log_path=os.path.join(out_dir, f"build-lesson{lesson.num}.log"))
                if rs and rs[0]["status"] == NOBUILD:
                    notes.append(f"lesson {lesson.num}: compile error")
                results += rs
            except Exception as e:  # one broken submission never stops the class
                results += [result(lesson, t, ERROR, f"grader error: {e}") for t in lesson.tests]
                notes.append(f"lesson {lesson.num}: grader error: {e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = "; ".join(notes)
    write_file(os.path.join(out_dir, "results.json"), json.dumps(gradescope_json(results, summary), indent=2))
    write_file(os.path.join(out_dir, "junit.xml"), junit_xml(results))
    return student, results, summary


def instructor(args, lessons, make_args, limits):
    root, subs, out = ROOT, os.path.abspath(args.submissions), os.path.abspath(args.out)
    students = sorted(d for d in os.listdir(subs) if os.path.isdir(os.path.join(subs, d)) and not d.startswith("."))
    if not students:
        raise SystemExit(f"grade: {subs} holds no student folders")
    # The kit library and the starters are built once; each student then builds only their own lesson files.
    ok, log = build(root, args.build, os.path.join(args.build, "libkit.a"), make_args)
    if not ok:
        raise SystemExit("grade: the kit itself does not build:\n" + log[-3000:])
    print(f"grade: {len(students)} students, lessons {' '.join(l.num for l in lessons)}, {args.jobs} at a time")
    rows = {}
    jobs = [(root, args.build, lessons, os.path.join(subs, s), os.path.join(out, s), make_args, limits)
            for s in students]
    # Processes, not threads: each test is started with a preexec_fn, which is only safe in a one-thread parent.
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(grade_student, *j): j[3] for j in jobs}
        for fut in concurrent.futures.as_completed(futures):
            s = os.path.basename(futures[fut])
            try:
                student, results, summary = fut.result()
            except Exception as e:
                student, results, summary = s, [], f"grader error: {e}"
            rows[student] = (results, summary)
            total = sum(r["score"] for r in results)
            print(f"  {student:<24} {fmt_points(total)}/{fmt_points(sum(l.max_points for l in lessons))}"
                  f"{'  (' + summary + ')' if summary else ''}", flush=True)
    with open(os.path.join(out, "class.csv"), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student"] + [f"lesson{l.num}" for l in lessons] + ["total", "max", "notes"])
        for s in students:
            results, summary = rows[s]
            per = [fmt_points(sum(r["score"] for r in results if r["lesson"] == l.num)) for l in lessons]
            w.writerow([s] + per + [fmt_points(sum(r["score"] for r in results)),
                                    fmt_points(sum(l.max_points for l in lessons)), summary])
    print(f"grade: wrote {out}/class.csv and {out}/<student>/results.json, junit.xml")
    return 0


# ------------------------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description="Grade the lessons (see tests/GRADING.md).")
    ap.add_argument("--lesson", action="append", default=[], help="grade only lesson NN (repeatable)")
    ap.add_argument("--skip", action="append", default=[], help="leave lesson NN out (its needs are not met)")
    ap.add_argument("--solutions", action="store_true", help="grade solutions/ instead of lessons/")
    ap.add_argument("--lessons-dir", default="lessons", help="the learner's lessons folder (default lessons)")
    ap.add_argument("--build", default="build", help="build folder of the kit (default build)")
    ap.add_argument("--make-arg", action="append", default=[], help="extra VAR=VALUE for make (repeatable)")
    ap.add_argument("--emu-build", help="CUDA emulation build folder (make EMU=1): tests skipped for want of a "
                                        "GPU run again there")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per test (hints.tsv may say more)")
    ap.add_argument("--mem-mb", type=int, default=4096, help="memory limit per test in MiB (0: none)")
    ap.add_argument("--fsize-mb", type=int, default=512, help="largest file (and output) a test may write, MiB")
    ap.add_argument("--expect", choices=["pass", "fail"], help="CI: exit 0 only if every test passes / fails")
    ap.add_argument("--results-json", help="write Gradescope results.json here")
    ap.add_argument("--junit", help="write JUnit XML here")
    ap.add_argument("--submissions", help="instructor: a folder with one folder per student")
    ap.add_argument("--out", help="instructor: where per-student results and class.csv go")
    ap.add_argument("--jobs", type=int, default=1, help="instructor: students graded at the same time")
    args = ap.parse_args()

    wanted = [w.zfill(2) for w in args.lesson]
    skipped = [s.zfill(2) for s in args.skip]
    lessons = find_lessons(ROOT, wanted, skipped)
    limits = Limits(args.timeout, args.mem_mb, args.fsize_mb)
    make_args = list(args.make_arg)
    if args.submissions:
        if not args.out:
            ap.error("--submissions needs --out")
        return instructor(args, lessons, make_args, limits)
    if not lessons:
        print("grade: no lesson has an autograder yet (solutions/NN-name + tests/lessonNN/test_lessonNN.c)")
        return 0

    source = "solutions" if args.solutions else "lessons"
    results = []
    for lesson in lessons:
        label = f"{source}/{lesson.name}" if source == "solutions" else f"{args.lessons_dir}/{lesson.name}"
        print(f"grade: building and testing {label} ({len(lesson.tests)} tests)", flush=True)
        rs, log = grade_lesson(ROOT, args.build, lesson, source, make_args, limits, lessons_dir=args.lessons_dir,
                               strict_names=args.expect is not None, emu_build=args.emu_build)
        if rs and rs[0]["status"] == NOBUILD:
            print(f"grade: {label} does not compile; the build said:\n" + log[-3000:].rstrip() + "\n")
        results += rs
    print_table(results, f"Score for {source}/" if source == "solutions" else f"Score for {args.lessons_dir}/")
    if args.results_json:
        write_file(args.results_json, json.dumps(gradescope_json(results), indent=2))
    if args.junit:
        write_file(args.junit, junit_xml(results))
    if args.expect:
        problems = check_expectation(results, args.expect)
        for p in problems:
            print(f"grade: EXPECTATION FAILED: {p}")
        if problems:
            return 1
        print(f"grade: as expected, every test {'passes' if args.expect == 'pass' else 'fails'} "
              f"({len(results)} tests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
