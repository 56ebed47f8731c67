#!/usr/bin/env python3
"""The grading driver: builds each lesson's autograder, runs every test in its own process, prints a score table.

Learner / CI:
    tests/grade.py [--lesson NN] [--solutions] [--expect pass|fail] [--results-json F] [--junit F]
Instructor:
    tests/grade.py --submissions DIR --out OUTDIR [--lesson NN] [--jobs N]

Each test runs as `test_lessonNN --only NAME` under its own supervisor process, in a sandbox when one is
available (bubblewrap: everything read-only but the test's scratch folder, its own PID namespace; as root
without it: an unprivileged user per test), with a timeout and resource limits: tests/grader_sandbox.py, which
says what it promises. Its verdict comes through a channel with a secret token per run (tests/grading.h),
never from what the program prints nor from a file it could write. This file decides what each run's facts
mean (a crash, a timeout or a missing verdict is a failure with its reason) and reports them. Points and hints
come from tests/lessonNN/hints.tsv:
    test_name<TAB>points<TAB>hint shown when it fails[<TAB>timeout seconds]
A test whose hint starts "TODO <n> (stretch" grades a stretch goal: the score table gives the core (what the
lesson's time plan covers) and the stretch goals each out of their own total, besides the sum.
See tests/GRADING.md. Python 3 standard library only.
"""
import glob
import html
import json
import os
import py_compile
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ET

from grader_sandbox import (PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, Guard, Limits, check_objects,
                            choose_sandbox, open_to, prctl, remove_path, run_command, run_contained, supervise,
                            sweep_strays)

# Each test starts a fresh `grade.py --supervise`: the modules only the driver needs (argparse, csv,
# concurrent.futures) are imported where they are used, and XML is escaped with html.escape (xml.sax.saxutils
# would pull in urllib and ssl), so that a supervisor starts in tens of milliseconds.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSON_DIR = re.compile(r"^(\d\d)-[A-Za-z0-9._-]+$")
OUTPUT_TAIL = 4000          # characters of a test's own output kept for the report
LOG_SCAN = 1 << 20          # bytes of a test's output searched for the failing rank's message
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
    rc, out = run_command(cmd, BUILD_TIMEOUT, cwd=root, env=make_env(), stderr=subprocess.STDOUT)
    ok, log = rc == 0, (out or b"").decode("utf-8", "replace")
    log = "".join(l for l in log.splitlines(keepends=True) if not l.startswith("config: "))
    if rc is None:
        log += f"\nbuild timed out after {BUILD_TIMEOUT} s"
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
    """The test names the binary holds (run outside the sandbox: only for the solutions, under --expect)."""
    try:
        rc, out = run_command([binary, "--list"], 30, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    return out.decode("utf-8", "replace").split() if rc == 0 else None


# ------------------------------------------------------------------------------------------------ running


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


def read_xml_messages(xml_files, name):
    """The cmocka XML's (status, message) for test `name`, worst over the files' contents (None: no file), or
    None. For DISPLAY only: the test can write these files, so the verdict never comes from them."""
    worst = None
    for data in xml_files:
        if data is None:
            continue
        try:
            tree = ET.ElementTree(ET.fromstring(data))
        except ET.ParseError:
            continue
        cases = [c for c in tree.iter("testcase") if c.get("name") == name]
        if len(cases) != 1:
            continue
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


def run_test(root, binary, lesson, test, limits, source_dir, ctx, timeout=None):
    """Runs one test in the sandbox (grader_sandbox.run_contained) and judges what happened. Returns a result."""
    name, points, hint, own_timeout = test
    timeout = timeout or own_timeout or limits.timeout
    run = run_contained(root, binary, name, lesson.np, timeout, limits, source_dir, ctx, OUTPUT_TAIL, LOG_SCAN)
    outcome, rc, verdicts, forged, changed = run.outcome, run.rc, run.verdicts, run.forged, run.changed
    xml_verdict = read_xml_messages(run.xml, name)
    if changed:
        status, message = ERROR, (f"the code under test changed the kit's files ({', '.join(changed[:3])}"
                                  f"{', ...' if len(changed) > 3 else ''}): the kit's versions are back, what the "
                                  f"test wrote is in {ctx.guard.quarantine}. This test scores 0")
    elif outcome is None:
        status, message = ERROR, (f"the test's supervisor was killed (did the code under test signal its parent "
                                  f"process?) {one_line(run.supervisor_error)}".strip())
    elif outcome["error"]:
        status, message = ERROR, outcome["error"]
    elif outcome["timed_out"]:
        status, message = TIMEOUT, f"timed out after {timeout:g} s (an endless loop, or waiting forever?)"
    elif outcome["mem_over"]:
        status, message = CRASH, (f"killed for using more than {limits.mem_mb} MiB of memory "
                                  f"(--mem-mb; {outcome['peak_mb']:.0f} MiB seen)")
    elif forged:
        status, message = ERROR, forged + "; this test scores 0"
    elif rc is not None and rc < 0 and len(verdicts) < lesson.np:
        status, message = CRASH, crash_reason(-rc)
    elif len(verdicts) < lesson.np and lesson.np > 1 and rc is not None and rc >= 129:
        status, message = CRASH, f"a rank died (launcher exit status {rc})"
    elif len(verdicts) < lesson.np:
        status, message = ERROR, (f"exited with status {rc} before reporting a result "
                                  f"(exit() or a fatal error inside the code under test?)")
    elif FAIL in verdicts.values():
        status, message = FAIL, "assertion failed"
        if xml_verdict and xml_verdict[0] in (FAIL, CRASH):
            status, message = xml_verdict
    elif SKIP in verdicts.values():
        status, message = SKIP, "skipped"
    elif rc != 0:
        status, message = ERROR, f"reported success but exited with status {rc}"
    else:
        status, message = PASS, ""
    output = run.output
    failing = sorted(r for r in range(lesson.np) if verdicts.get(r) != PASS)
    if status in (CRASH, ERROR) and lesson.np > 1:
        # "a rank died" alone does not say why: a collective that timed out says so on some rank; else what the
        # failing rank wrote to its stderr. Read from the start of the log: a backtrace can fill the tail.
        whole = run.head + "\n" + output
        said = timeout_text(whole) or rank_story(whole, failing)
        if said:
            message = said + "\n" + message
    if status == FAIL and (one_line(message).startswith("(") or message == "assertion failed"):
        # cmocka 1.1 keeps print_error() text (e.g. assert_close's "max relative error ...") out of the XML;
        # show the test's last printed line with the location. Display only: the status came from the channel.
        # Under mpirun the launcher's report of a failed rank (a box of dashes) follows the ranks' output.
        own = re.split(r"^-{20,}$", output, maxsplit=1, flags=re.M)[0] if lesson.np > 1 else output
        said = failure_text(own, failing)
        if said:
            message = said[:300] + "\n" + message
    if "printed above" in message:  # the table shows one line: bring in what was printed above
        message = printed_above(message, output, failing)
    if status == SKIP:  # the reason the test printed (display only)
        said = [l.split("]", 1)[1].strip() for l in output.splitlines() if "[  SKIP" in l and "]" in l]
        message = f"skipped: {said[-1]}" if said and said[-1] else message
    return result(lesson, test, status, message, output, run.seconds)


def tagged_streams(output):
    """{(rank, 'stdout'|'stderr'): [lines]} of mpirun --tag-output; {(0, 'stdout'): all lines} otherwise."""
    streams = {}
    for line in output.splitlines():
        m = re.match(r"^\[\d+,(\d+)\]<(std(?:out|err))>:(.*)$", line)
        key, text = ((int(m.group(1)), m.group(2)), m.group(3)) if m else ((0, "stdout"), line)
        streams.setdefault(key, []).append(text)
    return streams


def rank_story(output, failing):
    """What the rank that failed said: the launcher names the first rank to fail, else the first rank without a
    passing verdict. Its kit error ("rank R: file:line: call" with its error and HINT lines, kit/check.h) when
    there is one, else the first line it wrote to stderr."""
    named = re.search(r"Process name: \[\[\d+,\d+\],(\d+)\]|process rank (\d+)", output)
    order = ([int(named.group(1) or named.group(2))] if named else []) + sorted(failing)
    streams = tagged_streams(output)
    for rank in order:
        lines = [l.strip() for l in streams.get((rank, "stderr"), [])
                 if l.strip() and not l.lstrip().startswith(("[", "<"))]
        kit = next((i for i, l in enumerate(lines) if re.match(rf"rank {rank}: ", l)), None)
        if kit is not None:
            said = [lines[kit]] + [l for l in lines[kit + 1:kit + 3] if l.startswith(("error:", "HINT:"))]
            return "\n".join(said)[:500]
        if lines:
            return f"rank {rank}: {lines[0]}"[:300]
    return ""


def printed_above(message, output, failing):
    """A message that refers to a line "printed above" gets that line (the one printed just before it, on the
    same rank and stream); without one, the reference goes."""
    found = ""
    streams = tagged_streams(output)
    keys = sorted(streams, key=lambda k: (k[0] not in failing, k[1] != "stderr", k[0]))
    for key in keys:
        lines = [l.strip() for l in streams[key] if l.strip() and not l.lstrip().startswith(("[", "<"))]
        for i, line in enumerate(lines):
            if "printed above" in line and i > 0:
                found = lines[i - 1]
                break
        if found:
            break
    return re.sub(r"\s*\([^()]*printed above\)", (": " + found.replace("\\", "/")) if found else "", message)


def timeout_text(output):
    """The kit's message when a collective timed out (kit/dist.c), from whichever rank printed it, with the HINT
    line that follows it on the same rank and stream."""
    for key, lines in tagged_streams(output).items():
        for i, line in enumerate(lines):
            if "timed out after" in line:
                hint = lines[i + 1].strip() if i + 1 < len(lines) and "HINT" in lines[i + 1] else ""
                return (line.strip() + ("\n" + hint if hint else ""))[:500]
    return ""


def failure_text(output, failing=()):
    """The line a failed test printed to explain itself: the text cmocka shows right after its first
    "[  ERROR   ] ---" marker, else the last plain line printed before that marker, else the last plain line.
    Under mpirun the ranks' lines interleave in any order; with --tag-output ("[job,rank]<stdout>:text")
    each rank's streams are looked at on their own: those of the ranks in `failing` (whose verdict was not a
    pass) first, stderr before stdout, and a stream with an error marker before one without."""
    tagged = [re.match(r"^\[\d+,(\d+)\]<(std(?:out|err))>:(.*)$", l) for l in output.splitlines()]
    if any(tagged):
        # One stream of one rank at a time: mpirun forwards stdout and stderr separately, so only lines of
        # the same stream keep their order (cmocka's error text and marker both go to stderr).
        streams = {}
        for m in tagged:
            if m:
                streams.setdefault((int(m.group(1)), m.group(2)), []).append(m.group(3))
        keys = sorted(streams, key=lambda k: (k[0] not in failing, k[1] != "stderr", k[0]))
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


STRETCH = re.compile(r"^TODO [^:(]*\(stretch")


def is_stretch(hint):
    """Whether a test (by its hints.tsv hint) grades a stretch goal rather than the lesson's core."""
    return bool(STRETCH.match(hint or ""))


def result(lesson, test, status, message, output="", seconds=0.0):
    name, points, hint, _ = test
    ran_on = RAN_ON_GPU if GPU_MARK in output else RAN_ON_CPU
    return {"lesson": lesson.num, "lesson_name": lesson.name, "test": name, "stretch": is_stretch(hint),
            "max_score": points,
            "score": points if status == PASS else 0.0, "status": status, "message": message or "",
            "hint": pick_hint(lesson, name, hint, status, message), "output": output, "seconds": round(seconds, 3),
            "ran_on": ran_on}


# ---- hint levels: hints.tsv says what to think about; tests/lessonNN/hints-full.tsv
# (test<TAB>hint) gives the exact calls, shown only when asked for: `make grade HINTS=full` (GRADE_HINTS=full).
# A test that failed with "fix TODO N first" (tests/grading.h) is about an earlier TODO: its own hint would mislead.
def pick_hint(lesson, name, hint, status, message):
    if status in (PASS, SKIP):
        return ""
    first = re.search(r"fix TODO (\S+) first", message or "")
    if first:
        return f"this test builds on TODO {first.group(1)}; its own hint shows once TODO {first.group(1)} passes"
    if os.environ.get("GRADE_HINTS") == "full":
        path = os.path.join(ROOT, "tests", f"lesson{lesson.num}", "hints-full.tsv")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                full = dict(l.rstrip("\r\n").split("\t", 1) for l in f if "\t" in l and not l.startswith("#"))
            hint = full.get(name, hint)
    return hint


class Context:
    """What every test of one grading run shares: the grader's scratch folder, the sandbox, the guard."""

    def __init__(self, scratch, sandbox, guard):
        self.scratch, self.sandbox, self.guard = scratch, sandbox, guard


EMU_NOTE = "ran in the CUDA emulator: no GPU here"
# Where a test ran: the CPU, the GPU (skip_without_gpu in tests/testutil.h prints GPU_MARK when it goes on), or
# the CUDA emulator (a GPU test run again in the emulation build, below).
RAN_ON_CPU, RAN_ON_GPU, RAN_ON_EMU = "CPU", "GPU", "CUDA emulator"
GPU_MARK = "[  CUDA    ] runs on the CUDA device"


def default_emu_build(build):
    """The emulation build folder make uses beside `build` (mk/config.mk's EMU_BUILD): build-emu, with build's
    -debug and -clang suffixes."""
    name = os.path.basename(os.path.normpath(build))
    return os.path.join(os.path.dirname(os.path.normpath(build)),
                        "build-emu" + "".join(s for s in ("-debug", "-clang") if s in name))


def grade_lesson(root, build_dir, lesson, source, make_args, limits, ctx, grade_out=None, lessons_dir=None,
                 log_path=None, strict_names=False, shown_dir=None, emu_build=None, emu_grade_out=None):
    """Builds and runs one lesson's autograder. source: 'solutions' or 'lessons' (then lessons_dir is a staged
    private copy, see stage_lesson, shown as shown_dir in messages). Returns (results, build log).
    emu_build: the CUDA emulation build folder (mk/config.mk); tests skipped for want of a GPU run again there
    (emu_grade_out: where their binary goes; a class run gives each student their own)."""
    rs, log = grade_lesson_in(root, build_dir, lesson, source, make_args, limits, ctx, grade_out, lessons_dir,
                              log_path, strict_names, shown_dir)
    # skip_without_gpu (tests/testutil.h): no GPU here, or a build without CUDA; the emulator needs neither.
    gpu_skipped = [i for i, r in enumerate(rs) if r["status"] == SKIP and "needs a GPU" in r["message"]]
    if not emu_build or os.path.normpath(emu_build) == os.path.normpath(build_dir) or not gpu_skipped:
        return rs, log
    print(f"grade: no GPU here: running {len(gpu_skipped)} GPU test(s) of lesson {lesson.num} in the CUDA "
          f"emulator (build folder {emu_build})", flush=True)
    only = [lesson.tests[i] for i in gpu_skipped]
    emu_kit_ready(root, emu_build, make_args)
    emu_rs, emu_log = grade_lesson_in(root, emu_build, lesson, source, list(make_args) + ["EMU=1"], limits, ctx,
                                      emu_grade_out, lessons_dir, None, False, shown_dir, only)
    for i, r in zip(gpu_skipped, emu_rs):
        r["note"], r["ran_on"] = EMU_NOTE, RAN_ON_EMU
        rs[i] = r
    return rs, log if emu_rs[0]["status"] != NOBUILD else emu_log


def sources_digest(folder):
    """SHA-256 over the names and contents of the files of a lesson folder (sorted, recursively)."""
    import hashlib
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(folder)):
        dirnames.sort()
        for fn in sorted(filenames):
            path = os.path.join(dirpath, fn)
            h.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
            h.update(b"\0")
    return h.hexdigest()


def forget_stale_objects(obj_dir, binary, source_dir):
    """Every grade compiles what it grades. make decides by time stamps, but a learner's file put back with
    its old time stamp (cp -p, tar, unzip, rsync -a, an older git checkout) is older than the object built
    from what it replaced, and make would link that object. So the object folder keeps the digest of the
    sources its objects came from; when the sources to grade differ, their objects (not those of the kit's
    solutions in uses/, nor the kit library) and the binary are deleted first. Same content: nothing to do,
    a grade of unchanged sources stays fast."""
    digest = sources_digest(source_dir)
    stamp = os.path.join(obj_dir, "graded-sources.sha256")
    try:
        with open(stamp, encoding="ascii") as f:
            if f.read().strip() == digest and os.path.exists(binary):
                return
    except OSError:
        pass
    os.makedirs(obj_dir, exist_ok=True)
    for name in os.listdir(obj_dir):
        if name.endswith(".o") or name == os.path.basename(stamp):
            remove_path(os.path.join(obj_dir, name))
    remove_path(binary)
    write_file(stamp, digest + "\n")


_EMU_KIT = {}                # emulation build folder -> whether its kit library built, once per run
_EMU_KIT_LOCK = threading.Lock()


def emu_kit_ready(root, emu_build, make_args):
    """Builds the emulation build's kit library once, before any student's emulated lesson: students graded at
    the same time would otherwise each start make on the same library (the class run builds the plain kit
    library up front for the same reason). A failure shows in the lesson's own build."""
    with _EMU_KIT_LOCK:
        if emu_build not in _EMU_KIT:
            _EMU_KIT[emu_build] = build(root, emu_build, os.path.join(emu_build, "libkit.a"),
                                        list(make_args) + ["EMU=1"])[0]
        return _EMU_KIT[emu_build]


def grade_lesson_in(root, build_dir, lesson, source, make_args, limits, ctx, grade_out, lessons_dir, log_path,
                    strict_names, shown_dir, only=None):
    """grade_lesson in one build folder; only: the tests to run (default all)."""
    tests = only or lesson.tests
    args = list(make_args)
    if source == "solutions":
        binary = os.path.join(build_dir, "grade-solutions", f"test_lesson{lesson.num}")
        source_dir = os.path.join(root, "solutions", lesson.name)
        obj_dir = os.path.join(build_dir, "grade-solutions", lesson.name)
    else:
        # A folder only this driver builds into (make's own grade-lessons is also built from lessons/ by
        # other targets, test-emu's for one), so that the stamp below describes every object in it.
        out = grade_out or os.path.join(build_dir, "grade-staged")
        binary = os.path.join(out, f"test_lesson{lesson.num}")
        lessons_dir = lessons_dir or "lessons"
        args += [f"GRADE_LESSONS_OUT={out}", f"LESSONS_DIR={lessons_dir}"]
        source_dir = os.path.join(root, lessons_dir, lesson.name)
        obj_dir = os.path.join(out, lesson.name)
    if not os.path.isdir(source_dir):
        return [result(lesson, t, MISSING, f"{source_dir} does not exist") for t in tests], ""
    if source != "solutions":
        absolute = lambda p: p if os.path.isabs(p) else os.path.join(root, p)
        forget_stale_objects(absolute(obj_dir), absolute(binary), source_dir)
    if ctx.guard:
        ctx.guard.check()  # builds only from the kit's own files
    ok, log = build(root, build_dir, binary, args, log_path)
    if lessons_dir and os.path.isabs(lessons_dir):  # a staged copy: show paths as the student knows them
        log = log.replace(lessons_dir.rstrip("/") + "/", (shown_dir.rstrip("/") + "/") if shown_dir else "")
    if not ok:
        why = "does not compile: " + first_error(log)
        return [result(lesson, t, NOBUILD, why, log[-OUTPUT_TAIL:]) for t in tests], log
    binary = os.path.join(root, binary) if not os.path.isabs(binary) else binary
    obj_dir = os.path.join(root, obj_dir) if not os.path.isabs(obj_dir) else obj_dir
    if strict_names:
        listed = list_tests(binary)
        named = [t[0] for t in lesson.tests]
        if listed is None:
            raise SystemExit(f"grade: {binary} --list failed")
        extra, absent = sorted(set(listed) - set(named)), sorted(set(named) - set(listed))
        if extra or absent:
            raise SystemExit(f"grade: tests/lesson{lesson.num}/hints.tsv and the test binary disagree: "
                             f"not in hints.tsv: {extra or '-'}; not in the binary: {absent or '-'}")
    # The objects built from the graded sources: <stem>.o and <stem>.cu.o for the files of the lesson folder.
    objects = []
    for fn in sorted(os.listdir(source_dir)):
        stem, ext = os.path.splitext(fn)
        obj = os.path.join(obj_dir, stem + (".o" if ext == ".c" else ".cu.o"))
        if ext in (".c", ".cu") and os.path.exists(obj):
            objects.append(obj)
    shown_base = os.path.join(shown_dir, lesson.name) if shown_dir else lesson.name if lessons_dir else source_dir
    shown = lambda obj: os.path.join(shown_base, re.sub(r"\.cu\.o$", ".cu", re.sub(r"(?<!\.cu)\.o$", ".c",
                                                                                   os.path.basename(obj))))
    kit_libs = [os.path.join(root, build_dir, n) if not os.path.isabs(build_dir) else os.path.join(build_dir, n)
                for n in ("libkit.a", "libkit_dist.a")]
    refused = check_objects(binary, objects, kit_libs, shown)
    if refused:
        return [result(lesson, t, ERROR, refused) for t in tests], log
    return run_tests(root, binary, lesson, tests, limits, source_dir, ctx), log


# ---- an endless loop costs one full timeout, not one per test (see run_tests)
PROBE_MIN_S = 10            # the shortest time limit of a test run after another test of its TODO timed out
PROBE_FACTOR = 5            # ... and it is at least this many times the lesson's slowest passing test so far


def todos_of(hint):
    """The TODOs a test exercises, from its hints.tsv hint: "TODO 3: ..." {3}, "TODO 1 + 3: ..." {1, 3},
    "TODO 1-4: ..." {1, 2, 3, 4}, "TODO 3b: ..." {3b}. Empty when the hint names none."""
    m = re.match(r"\s*TODOs?\s+([0-9a-z ,+&-]+?)\s*(?::|$)", hint or "")
    found = set()
    for part in re.split(r"\s*(?:,|\+|&|\band\b)\s*", m.group(1)) if m else []:
        span = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        found |= {str(n) for n in range(int(span.group(1)), int(span.group(2)) + 1)} if span else {part} - {""}
    return found


def run_tests(root, binary, lesson, tests, limits, source_dir, ctx):
    """Runs the tests one after another. Once a test TIMES OUT, the later tests that exercise the same TODO
    (hints.tsv: the TODOs its hint names; every later test when it names none) are likely to run into the
    same endless loop: each runs with a shorter limit, PROBE_FACTOR x the slowest test of the lesson that
    passed so far and at least PROBE_MIN_S, instead of the full minute; its message names the first timeout.
    They are still RUN, not failed unseen: a test whose path misses the loop (a loop in the batch-norm branch
    only, say) passes as it would have, since it takes a fraction of that limit; a class run, which grades
    the same way, must not take points for a test that was never run. Tests of other TODOs keep their limit."""
    results, first, slowest_pass = [], None, 0.0
    for test in tests:
        name, _, hint, own_timeout = test
        full = own_timeout or limits.timeout
        probe = None
        if first and (not first[2] or not todos_of(hint) or first[2] & todos_of(hint)):
            probe = min(full, max(PROBE_MIN_S, PROBE_FACTOR * slowest_pass))
        r = run_test(root, binary, lesson, test, limits, source_dir, ctx, timeout=probe)
        if r["status"] == PASS:
            slowest_pass = max(slowest_pass, r["seconds"])
        elif r["status"] == TIMEOUT and probe and probe < full:
            todo = f"TODO {' + '.join(sorted(first[2]))}'s code" if first[2] else "this lesson"
            r["message"] = (f"timed out after {probe:g} s: a shorter limit, because {first[0]} had already timed "
                            f"out after {first[1]:g} s in {todo} (an endless loop there?); fix that first")
        elif r["status"] == TIMEOUT and not first:
            first = (name, full, todos_of(hint))
        results.append(r)
    return results


# ------------------------------------------------------------------------------------------------ reports

def fmt_points(x):
    return f"{x:g}"


def one_line(message, limit=None):
    """A failure message on one line: cmocka's 'file:line: error: Failure!' becomes '(file:line)', and its
    integer comparisons ('0xa != 0x14') are shown in decimal ('10 != 20')."""
    where, said = "", []
    for line in message.splitlines():
        m = re.match(r"^(\S+:\d+): error: Failure!$", line.strip())
        if m:
            where = where or m.group(1)
        elif line.strip():
            said.append(decimal_counts(line.strip()))
    text = ("; ".join(said) + (f" ({where})" if where else "")).strip()
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def decimal_counts(text):
    """cmocka 1.1 prints assert_int_equal & co. as "%#lx != %#lx"; integers read better in decimal
    (a value with the top bit set is a negative number)."""
    def dec(m):
        v = int(m.group(0), 16)
        return str(v - (1 << 64) if v >= 1 << 63 else v)
    if not re.search(r"\b(0x[0-9a-f]+|0) (!=|==|<|>|<=|>=|is not in range|is in range) ", text):
        return text
    return re.sub(r"\b0x[0-9a-f]+\b", dec, text)


TABLE_WIDTH = 160           # a row's message wraps onto lines of this width, under the message's first line
CAUSE_LINES = 4             # at most this many of a failed run's own last lines are shown under its row


def wrapped(first, text, width=TABLE_WIDTH):
    """`first` followed by `text`, wrapped at spaces: the continuation lines start under text's first
    character (scripts/check-grade-excerpts joins them back)."""
    import textwrap
    indent = " " * len(first)
    lines = textwrap.wrap(text, width=max(width, len(first) + 40), initial_indent=first,
                          subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines) if lines else first.rstrip()


def cause_lines(r, limit=CAUSE_LINES):
    """The failed run's own last words, for a result whose message does not say the cause itself: a crash, a
    timeout, an error, or a message that points at an error printed above (run_program's "see the error
    above"). Under mpirun the ranks' stderr, each line labelled with its rank; otherwise the last lines the
    test printed. cmocka's own lines and the lines the message already holds are left out."""
    message = r["message"]
    if r["status"] not in (CRASH, ERROR, TIMEOUT) and not (r["status"] == FAIL and "above" in message):
        return []
    shown = one_line(message)
    framing = lambda l: not l.strip() or l.lstrip().startswith(("[", "<", "...")) or l.strip() in shown
    streams = tagged_streams(r["output"])
    if any(key != (0, "stdout") for key in streams):  # mpirun --tag-output: the ranks' stderr, in log order
        lines = []
        for line in r["output"].splitlines():
            m = re.match(r"^\[\d+,(\d+)\]<stderr>:(.*)$", line)
            if m and not framing(m.group(2)):
                lines.append(f"rank {m.group(1)}: {m.group(2).strip()}")
    else:
        lines = [l.rstrip() for l in r["output"].splitlines() if not framing(l)]
    # A sanitizer's report ends with its shadow-memory legend: its ERROR and SUMMARY lines say what happened.
    sanitizer = [l for l in lines if re.search(r"(ERROR|SUMMARY): \w*Sanitizer|: runtime error: ", l)]
    # What a program prints may hold terminal control sequences: shown as "?".
    return [re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "?", l) for l in (sanitizer or lines)[-limit:]]


def print_table(results, title, out=sys.stdout):
    width = max([len(r["test"]) for r in results] + [4])
    print(f"\n{title}", file=out)
    print(f"{'lesson':<7}{'test':<{width + 2}}{'points':>8}  result", file=out)
    for r in results:
        pts = f"{fmt_points(r['score'])}/{fmt_points(r['max_score'])}"
        line = f"{r['lesson']:<7}{r['test']:<{width + 2}}{pts:>8}  {r['status']}"
        said = one_line(r["message"]) if r["status"] != PASS else ""
        if r.get("note"):
            said += f"  ({r['note']})"
        print(wrapped(line + "  ", said.strip()) if said.strip() else line, file=out)
        if r["hint"]:
            print(f"{'':<7}  hint: {r['hint']}", file=out)
        cause = cause_lines(r) if r["status"] != NOBUILD else []
        if cause:
            print(f"{'':<7}  the run's last lines:", file=out)
            for c in cause:
                print(f"{'':<7}  | {c}", file=out)
    total = sum(r["score"] for r in results)
    most = sum(r["max_score"] for r in results)
    counts = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"{'TOTAL':<7}{'':<{width + 2}}{fmt_points(total) + '/' + fmt_points(most):>8}  ({summary})", file=out)
    for line in core_stretch_lines(results):
        print(line, file=out)
    unverified = not_verified(results)
    if unverified:
        print("Not verified on this machine (0 points here, graded where it can run):", file=out)
        for line in unverified:
            print(f"  {line}", file=out)


def not_verified(results):
    """One line per skipped test: what it needs that this machine lacks, in the test's own words."""
    lines = []
    for r in results:
        if r["status"] == SKIP:
            why = re.sub(r"^skipped:\s*", "", one_line(r["message"])) or "skipped"
            lines.append(f"lesson {r['lesson']} {r['test']}: {why}")
    return lines


def core_stretch_lines(results):
    """Per lesson with stretch tests: the core's score out of the core's points, the stretch goals' apart."""
    lines = []
    for lesson in sorted({r["lesson"] for r in results}):
        mine = [r for r in results if r["lesson"] == lesson]
        stretch = [r for r in mine if r.get("stretch")]
        if not stretch:
            continue
        core = [r for r in mine if not r.get("stretch")]
        score = lambda rs: f"{fmt_points(sum(r['score'] for r in rs))}/{fmt_points(sum(r['max_score'] for r in rs))}"
        lines.append(f"  lesson {lesson}: core {score(core)}, stretch goals {score(stretch)} (scored apart: the core is "
                     f"what the lesson's time plan covers)")
    return lines


def gradescope_json(results, extra_output=""):
    tests = []
    for r in results:
        parts = [f"{r['status']}: {r['message']}".strip()] if r["status"] != PASS else ["passed"]
        if r.get("note"):
            parts.append(f"({r['note']})")
        if r["status"] not in (NOBUILD, MISSING):
            parts.append(f"Ran on: {r.get('ran_on', RAN_ON_CPU)}")
        if r["hint"]:
            parts.append(f"Hint: {r['hint']}")
        if r["status"] != PASS and r["output"].strip():
            label = "Compiler output" if r["status"] == NOBUILD else "Program output (last lines)"
            parts.append(f"{label}:\n" + r["output"])
        tests.append({"name": f"lesson {r['lesson']}: {r['test']}", "score": r["score"],
                      "max_score": r["max_score"], "status": "passed" if r["status"] == PASS else "failed",
                      "tags": ["stretch" if r.get("stretch") else "core"], "output": "\n".join(parts)})
    split = "\n".join(core_stretch_lines(results))
    output = "\n".join(s for s in (extra_output, split) if s)
    return {"score": sum(r["score"] for r in results), "output": output, "tests": tests}


def junit_xml(results, suite_prefix=""):
    """JUnit XML. Every string goes through xml_attr / xml_text: test output and messages may hold anything,
    control characters included."""
    by_lesson = {}
    for r in results:
        by_lesson.setdefault(r["lesson"], []).append(r)
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<testsuites>"]
    for num, rs in sorted(by_lesson.items()):
        failures = sum(r["status"] not in (PASS, SKIP) for r in rs)
        skipped = sum(r["status"] == SKIP for r in rs)
        suite = f"{suite_prefix}lesson{num}"
        lines.append(f"  <testsuite name={xml_attr(suite)} tests=\"{len(rs)}\" failures=\"{failures}\" "
                     f"skipped=\"{skipped}\" time=\"{sum(r['seconds'] for r in rs):.3f}\">")
        for r in rs:
            lines.append(f"    <testcase classname={xml_attr(suite)} name={xml_attr(r['test'])} "
                         f"time=\"{r['seconds']:.3f}\">")
            if r["status"] == SKIP:
                lines.append(f"      <skipped message={xml_attr(r['message'])}/>")
            elif r["status"] != PASS:
                body = r["message"] + (f"\nHint: {r['hint']}" if r["hint"] else "")
                lines.append(f"      <failure message={xml_attr(r['status'] + ': ' + r['message'][:200])} "
                             f"type={xml_attr(r['status'])}>{xml_text(body)}</failure>")
                if r["output"].strip():
                    lines.append(f"      <system-out>{xml_text(r['output'])}</system-out>")
            lines.append("    </testcase>")
        lines.append("  </testsuite>")
    lines.append("</testsuites>")
    return "\n".join(lines) + "\n"


def xml_attr(text):
    """A quoted XML attribute value; line breaks kept as character references (a parser would fold them)."""
    value = html.escape(clean_xml_text(str(text)), quote=True)
    return '"' + value.replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;") + '"'


def xml_text(text):
    return html.escape(clean_xml_text(str(text)), quote=False)


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
                problems.append(f"{tag}: passes, but on the unmodified starter it must fail")
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

_INCLUDE_ROOTS = None


def include_roots(root):
    """Where the compiler looks for headers: the C compiler's own list, the kit's folders, MPI's and CUDA's.
    A learner's header with a name found there would replace that header inside the TEST's own source."""
    global _INCLUDE_ROOTS
    if _INCLUDE_ROOTS is None:
        roots = [os.path.join(root, "kit"), os.path.join(root, "tests"), "/usr/local/cuda/include"]
        try:
            rc, out = run_command([os.environ.get("CC", "cc"), "-xc", "-E", "-v", "-"], 60,
                                  stderr=subprocess.STDOUT)
            text = (out or b"").decode("utf-8", "replace")
            m = re.search(r"search starts here:\n(.*?)End of search list", text, re.S)
            roots += [l.strip().split(" (")[0] for l in (m.group(1) if m else "").splitlines() if l.startswith(" ")]
            rc, out = run_command(["mpicc", "--showme:incdirs"], 60, stderr=subprocess.DEVNULL)
            roots += (out or b"").decode().split() if rc == 0 else []
        except OSError:
            pass
        _INCLUDE_ROOTS = [r for r in roots if os.path.isdir(r)]
    return _INCLUDE_ROOTS


def find_submitted_lesson(student_dir, lesson):
    for base in (student_dir, os.path.join(student_dir, "lessons")):
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            if os.path.isdir(os.path.join(base, name)) and (name == lesson.name or name.startswith(lesson.num + "-")
                                                            or name == lesson.num):
                return os.path.join(base, name)
    return None


def stage_lesson(root, lesson, found, stage_root, starter_dir=None):
    """The private copy that gets built: the kit's starter of the lesson (instructor mode: a missing file is
    graded as the untouched starter), the learner's .c/.cu/.h files over it, and the lesson's own headers
    (lesson.h) from the kit, so that the test, which includes them, is compiled against the kit's and not the
    learner's. A learner's header named like one of the kit, the tests or the system is left out too.
    Symbolic links are never followed. Returns (staged folder, notes)."""
    dest = os.path.join(stage_root, lesson.name)
    if starter_dir:
        shutil.copytree(starter_dir, dest, symlinks=True)
    else:
        os.makedirs(dest)
    pristine = {}
    for path in sorted(glob.glob(os.path.join(root, "solutions", lesson.name, "*.h"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            if "BEGIN SOLUTION" not in f.read():
                pristine[os.path.basename(path)] = path
    test_dir = os.path.join(root, "tests", f"lesson{lesson.num}")
    notes = []
    for dirpath, dirnames, filenames in os.walk(found):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for fn in filenames:
            src = os.path.join(dirpath, fn)
            rel = os.path.relpath(src, found)
            if not fn.endswith(SOURCE_SUFFIXES) or os.path.islink(src) or not os.path.isfile(src):
                continue
            if fn.endswith(".h"):
                if rel in pristine:
                    continue  # the kit's copy is put in below
                if any(os.path.exists(os.path.join(d, rel)) for d in include_roots(root) + [test_dir]):
                    notes.append(f"{rel} left out: the kit, the tests or the system have a header of that name")
                    continue
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(src, target)  # time stamps kept; forget_stale_objects decides on content
    for name, path in pristine.items():
        shutil.copy2(path, os.path.join(dest, name))
    return dest, notes


def grade_student(root, build_dir, lessons, student_dir, out_dir, make_args, limits, ctx, emu_build=None):
    """Grades one student into out_dir (results.json, junit.xml, build logs). Never raises."""
    student = os.path.basename(student_dir.rstrip("/"))
    os.makedirs(out_dir, exist_ok=True)
    results, notes = [], []
    work = tempfile.mkdtemp(prefix="student-", dir=ctx.scratch)
    if ctx.sandbox == "uid":
        open_to(work, None)  # the tests' users read the student's build and sources
    try:
        stage = os.path.join(work, "lessons")
        os.makedirs(stage)
        for lesson in lessons:
            try:
                found = find_submitted_lesson(student_dir, lesson)
                if found is None:
                    results += [result(lesson, t, MISSING, "not submitted") for t in lesson.tests]
                    notes.append(f"lesson {lesson.num}: not submitted")
                    continue
                staged, staged_notes = stage_lesson(root, lesson, found, stage,
                                                    os.path.join(root, "lessons", lesson.name))
                notes += [f"lesson {lesson.num}: {n}" for n in staged_notes]
                rs, _ = grade_lesson(root, build_dir, lesson, "lessons", make_args, limits, ctx,
                                     grade_out=os.path.join(work, "build"), lessons_dir=stage,
                                     log_path=os.path.join(out_dir, f"build-lesson{lesson.num}.log"),
                                     emu_build=emu_build, emu_grade_out=os.path.join(work, "build-emu"))
                if rs and rs[0]["status"] == NOBUILD:
                    notes.append(f"lesson {lesson.num}: compile error")
                results += rs
            except Exception as e:  # one broken submission never stops the class
                results += [result(lesson, t, ERROR, f"grader error: {e}") for t in lesson.tests]
                notes.append(f"lesson {lesson.num}: grader error: {e}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = "; ".join(notes + result_notes(results))
    write_file(os.path.join(out_dir, "results.json"), json.dumps(gradescope_json(results, summary), indent=2))
    write_file(os.path.join(out_dir, "junit.xml"), junit_xml(results))
    return student, results, summary


def result_notes(results):
    """class.csv's notes for one student: why each test that did not pass failed or was skipped, and where the
    tests that did not run on this machine's CPU ran. A lesson that did not build or was not handed in is
    noted once (by grade_student), not once per test."""
    notes = []
    for r in results:
        tag = f"lesson {r['lesson']} {r['test']}"
        where = r.get("ran_on", RAN_ON_CPU)
        if r["status"] in (NOBUILD, MISSING):
            continue
        if r["status"] != PASS:
            notes.append(f"{tag}: {r['status']}: {one_line(r['message'])}"
                         + (f" (on the {where})" if where != RAN_ON_CPU else ""))
        elif where != RAN_ON_CPU:
            notes.append(f"{tag}: passed on the {where}")
    return notes


def instructor(args, lessons, make_args, limits, ctx):
    import concurrent.futures
    import csv
    root, subs, out = ROOT, os.path.abspath(args.submissions), os.path.abspath(args.out)
    students = sorted(d for d in os.listdir(subs) if os.path.isdir(os.path.join(subs, d)) and not d.startswith("."))
    if not students:
        raise SystemExit(f"grade: {subs} holds no student folders")
    # The kit library and the starters are built once; each student then builds only their own lesson files.
    ok, log = build(root, args.build, os.path.join(args.build, "libkit.a"), make_args)
    if not ok:
        raise SystemExit("grade: the kit itself does not build:\n" + log[-3000:])
    workers = max(1, args.jobs)
    if ctx.guard:
        ctx.guard.check()
    if ctx.sandbox == "none":
        if workers > 1:  # one student's test could change the kit while another student's build reads it
            print("grade: note: without a sandbox students are graded one at a time (--jobs 1)")
            workers = 1
    print(f"grade: {len(students)} students, lessons {' '.join(l.num for l in lessons)}, {workers} at a time, "
          f"sandbox: {dict(bwrap='bubblewrap', uid='a user per test').get(ctx.sandbox, 'none')}")
    rows = {}
    jobs = [(root, args.build, lessons, os.path.join(subs, s), os.path.join(out, s), make_args, limits, ctx,
             args.emu_build) for s in students]
    # Threads: each test runs in its own supervisor process (tests never run inside the grader), so nothing
    # a student's code does to its parent process reaches the grader or another student.
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
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
    import argparse
    ap = argparse.ArgumentParser(description="Grade the lessons (see tests/GRADING.md).")
    ap.add_argument("--lesson", action="append", default=[], help="grade only lesson NN (repeatable)")
    ap.add_argument("--skip", action="append", default=[], help="leave lesson NN out (its needs are not met)")
    ap.add_argument("--solutions", action="store_true", help="grade solutions/ instead of lessons/")
    ap.add_argument("--lessons-dir", default="lessons", help="the learner's lessons folder (default lessons)")
    ap.add_argument("--build", default="build", help="build folder of the kit (default build)")
    ap.add_argument("--make-arg", action="append", default=[], help="extra VAR=VALUE for make (repeatable)")
    ap.add_argument("--emu-build", help="CUDA emulation build folder (make EMU=1): tests skipped for want of a "
                                        "GPU run again there (default: make's, build-emu beside --build; "
                                        "'none': no emulator)")
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
    # The grader is a subreaper: a test that kills its supervisor leaves its processes to the grader, which
    # sweeps them (sweep_strays). Its own memory is not readable by a test running as the same user.
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_DUMPABLE, 0)

    wanted = [w.zfill(2) for w in args.lesson]
    skipped = [s.zfill(2) for s in args.skip]
    lessons = find_lessons(ROOT, wanted, skipped)
    limits = Limits(args.timeout, args.mem_mb, args.fsize_mb)
    make_args = list(args.make_arg)
    if args.emu_build is None:
        args.emu_build = default_emu_build(args.build)
    elif args.emu_build == "none":
        args.emu_build = None
    if args.submissions and not args.out:
        ap.error("--submissions needs --out")
    if not lessons:
        print("grade: no lesson has an autograder yet (solutions/NN-name + tests/lessonNN/test_lessonNN.c)")
        return 0
    scratch = tempfile.mkdtemp(prefix="grade-")
    try:
        sandbox = choose_sandbox(scratch)
        if sandbox == "uid":
            open_to(scratch, None)
        guard = None
        if sandbox in ("none", "uid"):  # "uid": a backstop behind the file permissions
            # The supervisor imports this module, and Python would cache its bytecode in tests/__pycache__ during
            # the first test, which the guard would then take for a file the test wrote: compile it now, before
            # the guard looks (nothing to do where bytecode is not written: PYTHONDONTWRITEBYTECODE, -B).
            if not sys.dont_write_bytecode:
                for module in ("grade.py", "grader_sandbox.py"):
                    py_compile.compile(os.path.join(os.path.dirname(os.path.abspath(__file__)), module),
                                       doraise=False)
            quarantine = os.path.join(ROOT, args.build, "grade-quarantine")
            guard = Guard(ROOT, quarantine, [args.submissions] if args.submissions else [])
        ctx = Context(scratch, sandbox, guard)
        if args.submissions:
            return instructor(args, lessons, make_args, limits, ctx)
        return learner(args, lessons, make_args, limits, ctx)
    finally:
        sweep_strays()
        shutil.rmtree(scratch, ignore_errors=True)


def learner(args, lessons, make_args, limits, ctx):
    source = "solutions" if args.solutions else "lessons"
    results = []
    for lesson in lessons:
        label = f"{source}/{lesson.name}" if source == "solutions" else f"{args.lessons_dir}/{lesson.name}"
        print(f"grade: building and testing {label} ({len(lesson.tests)} tests)", flush=True)
        if source == "solutions":
            rs, log = grade_lesson(ROOT, args.build, lesson, source, make_args, limits, ctx,
                                   strict_names=args.expect is not None, emu_build=args.emu_build)
        else:
            found = os.path.join(ROOT, args.lessons_dir, lesson.name)
            if not os.path.isdir(found):
                results += [result(lesson, t, MISSING, f"{label} does not exist") for t in lesson.tests]
                continue
            stage = tempfile.mkdtemp(prefix="lessons-", dir=ctx.scratch)
            if ctx.sandbox == "uid":
                open_to(stage, None)
            staged, notes = stage_lesson(ROOT, lesson, found, stage)
            for n in notes:
                print(f"grade: note: {args.lessons_dir}/{lesson.name}/{n}")
            rs, log = grade_lesson(ROOT, args.build, lesson, source, make_args, limits, ctx, lessons_dir=stage,
                                   strict_names=args.expect is not None, shown_dir=args.lessons_dir,
                                   emu_build=args.emu_build)
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
    if sys.argv[1:] == ["--supervise"]:
        sys.exit(supervise())
    sys.exit(main())
