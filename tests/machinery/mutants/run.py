#!/usr/bin/env python3
"""Mutation testing of the autograder: does it catch the classic mistakes of each lesson?

Each tests/machinery/mutants/lessonNN.tsv lists planted mistakes, written from the lesson's README, its TODO blocks and
what learners of the PyTorch equivalent get wrong, independently of the tests. A mutant is the lesson's
reference solution with one such mistake in it. This script grades every mutant with the real grader, exactly
as a learner's lessons/ folder is graded (tests/grade.py --lessons-dir), and says which test caught it:

    tests/machinery/mutants/run.py [--lesson NN]... [--only NAME]... [--jobs N] [--label LABEL] [--no-write]
    make mutants [LESSON=NN] [JOBS=N]

Verdicts: CAUGHT (the score is below full marks: the failing tests and their messages are recorded), MISSED
(full marks), STALE (a snippet no longer occurs exactly once in the solution: the list needs re-syncing),
INVALID (the mutant does not compile: a broken entry, not a mistake a test could catch). The caught rate is
CAUGHT / (CAUGHT + MISSED). A name starting with `alt-` is not a mistake but another RIGHT answer (a choice the
README leaves to the learner): it must get full marks, ACCEPTED, and an autograder that fails it, REJECTED,
is wrong; alternatives are left out of the rate and a rejected one is counted in the section's heading. A name
starting with `core-` is a solution that does the lesson's core only (a stretch goal left as the starter has it):
every core test must pass, CORE-OK, and a core test that fails, CORE-FAILS, means the core needs the stretch. The table is printed and written to tests/machinery/mutants/RESULTS.md (one section per lesson
and label, with the date, the commit and the command; sections of other lessons and labels are kept).

List format (TAB-separated; '#' starts a comment line):
    name  file  find  replace  mistake
file is relative to solutions/NN-name/; find must occur exactly once in it. In find and replace, \\n is a newline,
\\t a tab and \\\\ a backslash. Several rows with the same name make one mutant (their edits applied in order).

Mutants are graded --jobs at a time; each job slot has its own build folders (<build>-mutants/slotJ and
slotJ-emu, seeded from --build and --emu-build), because a grade writes its autograder binary into its build
folder. Python 3 standard library only.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HERE = os.path.join(ROOT, "tests", "machinery", "mutants")
RESULTS = os.path.join(HERE, "RESULTS.md")
MESSAGE_CHARS = 150


class Mutant:
    def __init__(self, lesson, name, mistake):
        self.lesson, self.name, self.mistake = lesson, name, mistake
        self.edits = []  # (file, find, replace, line number in the list)
        self.verdict, self.caught_by, self.detail = None, [], ""


def unescape(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[s[i + 1]])
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def read_list(lesson):
    path = os.path.join(HERE, f"lesson{lesson}.tsv")
    mutants, by_name = [], {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != 5:
                raise SystemExit(f"mutants: {path}:{number}: expected 5 TAB-separated columns "
                                 f"(name, file, find, replace, mistake), got {len(cols)}")
            name, file, find, replace, mistake = cols
            if name not in by_name:
                by_name[name] = Mutant(lesson, name, mistake)
                mutants.append(by_name[name])
            by_name[name].edits.append((file, unescape(find), unescape(replace), number))
    return mutants


def lesson_name(num):
    names = [n for n in os.listdir(os.path.join(ROOT, "solutions")) if n.startswith(num + "-")]
    if len(names) != 1:
        raise SystemExit(f"mutants: no single solutions/{num}-* folder")
    return names[0]


def available_lessons():
    return sorted(m.group(1) for m in (re.match(r"^lesson(\d\d)\.tsv$", n) for n in os.listdir(HERE)) if m)


def make_tree(mutant, dest):
    """Copies the lesson's solution into dest/NN-name/ and applies the mutant's edits. Returns None, or why STALE."""
    name = lesson_name(mutant.lesson)
    folder = os.path.join(dest, name)
    shutil.copytree(os.path.join(ROOT, "solutions", name), folder)
    for file, find, replace, number in mutant.edits:
        path = os.path.join(folder, file)
        if not os.path.isfile(path):
            return f"line {number}: {file} does not exist"
        with open(path, encoding="utf-8") as f:
            text = f.read()
        count = text.count(find)
        if count != 1:
            return f"line {number}: the snippet occurs {count} times in {file}"
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(find, replace))
    # Every file new: make rebuilds by time stamp, and the grader keeps the stamps of what it grades, so a
    # solution file older than the objects of the previous mutant in this build folder would not be recompiled.
    for dirpath, _, files in os.walk(folder):
        for fn in files:
            os.utime(os.path.join(dirpath, fn))
    return None


def first_line(text):
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    line = re.sub(r"\s+", " ", line)
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 3] + "..."


def grade(tree, lesson, build, emu_build, log_path):
    """Grades tree (a lessons/ folder) with tests/grade.py. Returns the Gradescope-style results, or None."""
    out = os.path.join(tree, "results.json")
    cmd = [sys.executable, os.path.join(ROOT, "tests", "grade.py"), "--lessons-dir", tree, "--lesson", lesson,
           "--build", build, "--results-json", out]
    if emu_build:
        cmd += ["--emu-build", emu_build]
    env = dict(os.environ)
    env.pop("GRADE_HINTS", None)
    with open(log_path, "w", encoding="utf-8") as log:
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if not os.path.exists(out):
        return None
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def judge(mutant, results, log_path):
    if results is None:
        mutant.verdict, mutant.detail = "INVALID", f"the grader wrote no results (log: {log_path})"
        return
    failed = [t for t in results["tests"] if t["score"] < t["max_score"]]
    if mutant.name.startswith("core-"):  # the core alone: only stretch tests may fail
        core_failed = [t for t in failed if "stretch" not in t.get("tags", [])]
        mutant.verdict = "CORE-FAILS" if core_failed else "CORE-OK"
        for t in core_failed or failed:
            mutant.caught_by.append((t["name"].split(": ", 1)[-1], first_line(t["output"])))
        return
    if mutant.name.startswith("alt-"):  # a right answer the grader must accept
        mutant.verdict = "REJECTED" if failed else "ACCEPTED"
        for t in failed:
            mutant.caught_by.append((t["name"].split(": ", 1)[-1], first_line(t["output"])))
        return
    if not failed:
        mutant.verdict = "MISSED"
        return
    if all(t["output"].startswith("NOBUILD") for t in failed):
        mutant.verdict, mutant.detail = "INVALID", "does not compile: " + first_line(failed[0]["output"])
        return
    mutant.verdict = "CAUGHT"
    for t in failed:
        test = t["name"].split(": ", 1)[-1]
        mutant.caught_by.append((test, first_line(t["output"])))


def seed_slot(src, dest):
    """A job slot's build folder, seeded with the kit library already built in src (make rebuilds what it must)."""
    if os.path.isdir(dest):
        return
    os.makedirs(dest)
    for part in ("kit", "libkit.a"):
        p = os.path.join(src, part)
        if os.path.isdir(p):
            shutil.copytree(p, os.path.join(dest, part), symlinks=True)
        elif os.path.exists(p):
            shutil.copy2(p, os.path.join(dest, part))


def run_all(mutants, jobs, build, emu_build, keep, slots_dir):
    scratch = tempfile.mkdtemp(prefix="mutants-")
    queue, lock = list(mutants), threading.Lock()
    slots = []
    for j in range(jobs):
        b = f"{slots_dir}/slot{j}"
        e = f"{slots_dir}/slot{j}-emu" if emu_build else None
        seed_slot(os.path.join(ROOT, build), os.path.join(ROOT, b))
        if emu_build:
            seed_slot(os.path.join(ROOT, emu_build), os.path.join(ROOT, e))
        slots.append((b, e))
    done = [0]

    def worker(slot):
        b, e = slot
        while True:
            with lock:
                if not queue:
                    return
                mutant = queue.pop(0)
            tree = os.path.join(scratch, f"{mutant.lesson}-{mutant.name}")
            os.makedirs(tree)
            stale = make_tree(mutant, tree)
            if stale:
                mutant.verdict, mutant.detail = "STALE", stale
            else:
                log = os.path.join(scratch, f"{mutant.lesson}-{mutant.name}.log")
                judge(mutant, grade(tree, mutant.lesson, b, e, log), log)
            if not keep:
                shutil.rmtree(tree, ignore_errors=True)
            with lock:
                done[0] += 1
                what = mutant.caught_by[0][0] if mutant.caught_by else mutant.detail
                print(f"[{done[0]}/{len(mutants)}] lesson {mutant.lesson} {mutant.name}: {mutant.verdict} {what}",
                      flush=True)

    threads = [threading.Thread(target=worker, args=(s,)) for s in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if keep:
        print(f"mutants: trees and grader logs kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)


def control(lesson, slots_dir, emu_build):
    """The unmodified solution, graded the same way, must get full marks: else every mutant looks caught."""
    scratch = tempfile.mkdtemp(prefix="mutants-control-")
    try:
        m = Mutant(lesson, "(solution)", "")
        make_tree(m, scratch)
        judge(m, grade(scratch, lesson, f"{slots_dir}/slot0", f"{slots_dir}/slot0-emu" if emu_build else None,
                       os.path.join(scratch, "log")), "")
        return m
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def rate(mutants):
    caught = sum(m.verdict == "CAUGHT" for m in mutants)
    judged = sum(m.verdict in ("CAUGHT", "MISSED") for m in mutants)
    return caught, judged


def md(s):
    return s.replace("|", "\\|").replace("\n", " ")


def section(lesson, label, mutants, stamp):
    caught, judged = rate(mutants)
    pct = f"{100.0 * caught / judged:.0f} %" if judged else "n/a"
    stale = sum(m.verdict == "STALE" for m in mutants)
    invalid = sum(m.verdict == "INVALID" for m in mutants)
    rejected = sum(m.verdict in ("REJECTED", "CORE-FAILS") for m in mutants)
    lines = [f"<!-- section {lesson} {label} -->", f"## lesson {lesson} ({label}): {caught}/{judged} caught = {pct}"
             + (f", {stale} stale" if stale else "") + (f", {invalid} invalid" if invalid else "")
             + (f", {rejected} right alternative(s) rejected" if rejected else ""), "",
             stamp, "", "| mutant | classic mistake | verdict | caught by | message |", "|---|---|---|---|---|"]
    for m in mutants:
        if m.caught_by:
            tests = ", ".join(t for t, _ in m.caught_by[:3]) + (f" (+{len(m.caught_by) - 3})" if len(m.caught_by) > 3 else "")
            msg = m.caught_by[0][1]
        else:
            tests, msg = "", m.detail
        lines.append(f"| {m.name} | {md(m.mistake)} | {m.verdict} | {md(tests)} | {md(msg)} |")
    lines.append("")
    return {"lesson": lesson, "label": label, "caught": caught, "judged": judged, "stale": stale,
            "invalid": invalid, "text": "\n".join(lines)}


def read_sections():
    if not os.path.exists(RESULTS):
        return []
    with open(RESULTS, encoding="utf-8") as f:
        text = f.read()
    parts = re.split(r"(?m)^(?=<!-- section \d\d \S+ -->$)", text)
    out = []
    for p in parts:
        m = re.match(r"<!-- section (\d\d) (\S+) -->\n## [^\n]*: (\d+)/(\d+) caught[^\n]*", p)
        if not m:
            continue
        head = m.group(0)
        stale = re.search(r", (\d+) stale", head)
        invalid = re.search(r", (\d+) invalid", head)
        out.append({"lesson": m.group(1), "label": m.group(2), "caught": int(m.group(3)), "judged": int(m.group(4)),
                    "stale": int(stale.group(1)) if stale else 0, "invalid": int(invalid.group(1)) if invalid else 0,
                    "text": p.rstrip("\n") + "\n"})
    return out


def write_results(new_sections):
    keep = [s for s in read_sections() if (s["lesson"], s["label"]) not in {(n["lesson"], n["label"]) for n in new_sections}]
    sections = sorted(keep + new_sections, key=lambda s: (s["lesson"], s["label"]))
    head = ["# Mutation testing of the autograder", "",
            "Each lesson's solution with one classic mistake planted (tests/machinery/mutants/lessonNN.tsv, written from the",
            "READMEs, the TODOs and PyTorch pitfalls, independently of the tests), graded by tests/grade.py as a",
            "learner's lessons/ folder. CAUGHT: below full marks. Rate = CAUGHT / (CAUGHT + MISSED); STALE (the",
            "solution changed under the list) and INVALID (does not compile) are left out. Regenerate:",
            "`make mutants [LESSON=NN]` or `tests/machinery/mutants/run.py --lesson NN --label LABEL --jobs 2`.", "",
            "| lesson | label | caught | rate | stale | invalid |", "|---|---|---|---|---|---|"]
    for s in sections:
        pct = f"{100.0 * s['caught'] / s['judged']:.0f} %" if s["judged"] else "n/a"
        head.append(f"| {s['lesson']} | {s['label']} | {s['caught']}/{s['judged']} | {pct} | {s['stale']} | {s['invalid']} |")
    with open(RESULTS, "w", encoding="utf-8") as f:
        f.write("\n".join(head) + "\n\n" + "\n".join(s["text"] for s in sections))


def commit_id():
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "solutions", "tests", "kit"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description="Plant classic mistakes in the solutions; see which tests catch them.")
    ap.add_argument("--lesson", action="append", default=[], help="lesson NN (repeatable; default: every list)")
    ap.add_argument("--only", action="append", default=[], help="only the mutant NAME (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants graded at the same time (default 1)")
    ap.add_argument("--build", default="build", help="the kit's build folder (default build)")
    ap.add_argument("--emu-build", default="build-emu", help="CUDA emulation build folder for GPU tests "
                                                             "(default build-emu; '' for none)")
    ap.add_argument("--slots", help="where the job slots' build folders go (default <build>-mutants; two runs at "
                                    "the same time need two)")
    ap.add_argument("--label", default="current", help="the RESULTS.md section label (e.g. baseline)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument("--keep", action="store_true", help="keep the mutated trees and the grader's logs")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--check", action="store_true", help="only apply every edit: list the STALE ones, exit 1 if any")
    args = ap.parse_args()
    if not re.fullmatch(r"[A-Za-z0-9._-]+", args.label):
        ap.error("--label: letters, digits, . _ - only")
    lessons = [l.zfill(2) for l in args.lesson] or available_lessons()
    mutants = []
    for l in lessons:
        mutants += [m for m in read_list(l) if not args.only or m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.lesson} {m.name}: {m.mistake}")
        return 0
    if not mutants:
        print("mutants: nothing to run")
        return 1
    if args.check:
        stale = 0
        for m in mutants:
            with tempfile.TemporaryDirectory(prefix="mutants-check-") as d:
                why = make_tree(m, d)
            if why:
                stale += 1
                print(f"STALE lesson {m.lesson} {m.name}: {why}")
        print(f"mutants: {len(mutants) - stale} of {len(mutants)} apply cleanly")
        return 1 if stale else 0
    jobs = max(1, args.jobs)
    slots_dir = args.slots or f"{args.build}-mutants"
    emu = args.emu_build or None
    command = "tests/machinery/mutants/run.py " + " ".join(sys.argv[1:])
    stamp = (f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; commit {commit_id()}; "
             f"command: `{command}`")  # as it was when the run started
    print(f"mutants: {len(mutants)} mutant(s) of lesson(s) {' '.join(lessons)}, {jobs} at a time", flush=True)
    for l in sorted({m.lesson for m in mutants}):
        seed_slot(os.path.join(ROOT, args.build), os.path.join(ROOT, slots_dir, "slot0"))
        if emu:
            seed_slot(os.path.join(ROOT, emu), os.path.join(ROOT, slots_dir, "slot0-emu"))
        c = control(l, slots_dir, emu)
        if c.verdict != "MISSED":
            print(f"mutants: lesson {l}'s unmodified solution does not get full marks here ({c.verdict}: "
                  f"{c.caught_by or c.detail}); fix that first")
            return 1
    run_all(mutants, jobs, args.build, emu, args.keep, slots_dir)
    sections = []
    for l in lessons:
        ms = [m for m in mutants if m.lesson == l]
        if ms:
            s = section(l, args.label, ms, stamp)
            sections.append(s)
            print("\n" + s["text"])
    print("| lesson | caught | rate |")
    for s in sections:
        pct = f"{100.0 * s['caught'] / s['judged']:.0f} %" if s["judged"] else "n/a"
        print(f"| {s['lesson']} | {s['caught']}/{s['judged']} | {pct} |")
    if not args.no_write and not args.only:
        write_results(sections)
        print(f"mutants: wrote {os.path.relpath(RESULTS, ROOT)}")
    rejected = [m for m in mutants if m.verdict in ("REJECTED", "CORE-FAILS")]
    for m in rejected:
        print(f"mutants: lesson {m.lesson} {m.name} is a right answer (or a right core) the autograder rejects: "
              f"{m.caught_by}")
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())
