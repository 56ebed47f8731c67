#!/usr/bin/env python3
"""make check-docs: the facts the documents repeat, checked against their one source.

Sources (nothing here lists lessons; a lesson added as solutions/NN-name/ is checked with no edit here):
  the lessons        the folders solutions/NN-name/ (tools/lessoninfo.py), with their lesson.mk
  the decks          slides/NN-name.md, one per lesson
  a lesson's extras  tests/lessonNN/run-tests.sh (make test-lessonNN)
  GPU runs           the table "Each lesson on a GPU" in bench/results-gpu-check.md
Checked against them:
  README.md          the course map (a row per lesson, its status "GPU: <verdict>"), the "GPU status" line,
                     every "(01-NN)" range beside lesson-NN / LESSON=NN / test-lessonNN, "lessons ... start N ranks"
  INSTRUCTORS.md     the learning-path table (a row per lesson), the deck count ("ten decks")
  solutions/NN/README.md  the "**Built on**" paragraph: exactly the earlier solution files USES links in
  kit/README.md, tests/GRADING.md: ranges and deck counts as above
  bench/README.md    the index: each row's files exist, its "last run" is its result file's newest date and machine

    tools/check_docs.py              check this checkout; one line per drift, exit 1 when any
    tools/check_docs.py --self-test  plant stale lines in a copy and show that each is caught
"""
import argparse
import pathlib
import re
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import lessoninfo as li  # noqa: E402

DOCS = ("README.md", "INSTRUCTORS.md", "kit/README.md", "tests/GRADING.md")
GPU_RECORD = "bench/results-gpu-check.md"
VERDICTS = ("passed", "failed", "not yet run")
NUMBERS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                      "thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}


def section(text, heading):
    """The lines under '## heading' up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    if not m:
        return None
    rest = text[m.end():]
    end = re.search(rf"^#{{1,{len(m.group(1))}}} ", rest, re.M)
    return rest[:end.start()] if end else rest


def table_rows(block):
    """{NN: [cells]} for the rows of a Markdown table whose first cell is a lesson number."""
    rows = {}
    for line in (block or "").splitlines():
        m = re.match(r"\|\s*(\d\d)\s*\|", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in line.strip().strip("|").split("|")]
    return rows


def gpu_verdicts(root, errors):
    text = (root / GPU_RECORD).read_text()
    rows = table_rows(section(text, "Each lesson on a GPU"))
    if not rows:
        errors.append(f"{GPU_RECORD}: no table under '## Each lesson on a GPU' (the record of GPU runs)")
    verdicts = {}
    for n, cells in rows.items():
        if len(cells) < 2 or cells[1] not in VERDICTS:
            errors.append(f"{GPU_RECORD}: lesson {n}'s verdict must be one of {', '.join(VERDICTS)}")
        else:
            verdicts[n] = cells[1]
    return verdicts


def gpu_status_line(verdicts):
    """The README's line, from the record: 'lessons 01-09 passed on a GPU; lesson 10 not yet run on one'."""
    parts = []
    for v in VERDICTS:
        nums = [n for n, x in verdicts.items() if x == v]
        if nums:
            what = "lesson" if len(nums) == 1 else "lessons"
            where = "not yet run on one" if v == "not yet run" else f"{v} on a GPU"
            parts.append(f"{what} {li.compact(nums)} {where}")
    return "; ".join(parts)


def check(root):
    root = pathlib.Path(root)
    errors = []
    dirs = li.lesson_dirs(root)
    nums = [li.num(d) for d in dirs]
    conf = {li.num(d): li.lesson_mk(d) for d in dirs}
    decks = sorted(p for p in (root / "slides").glob("[0-9][0-9]-*.md") if not p.name.endswith(".notes.md"))
    for d in dirs:
        if not (root / "slides" / f"{d.name}.md").exists():
            errors.append(f"slides/{d.name}.md: missing (every lesson has a deck)")
    extras = [n for n in nums if (root / f"tests/lesson{n}/run-tests.sh").exists()]

    # ---- what has run on a GPU
    verdicts = gpu_verdicts(root, errors)
    if sorted(verdicts) != nums:
        errors.append(f"{GPU_RECORD}: the lesson table has rows {li.compact(sorted(verdicts)) or 'none'}, "
                      f"the lessons are {li.compact(nums)} (a new lesson gets a row: 'not yet run')")
    readme = (root / "README.md").read_text()
    want = gpu_status_line({n: v for n, v in verdicts.items() if n in nums})
    m = re.search(r"\*\*GPU status: (.*?)\.\*\*", readme)
    if not m:
        errors.append(f"README.md: no '**GPU status: ...**' line (it should read '**GPU status: {want}.**')")
    elif m.group(1) != want:
        errors.append(f"README.md: '**GPU status: {m.group(1)}.**' disagrees with {GPU_RECORD}: "
                      f"'**GPU status: {want}.**'")

    # ---- the course map and the learning path: a row per lesson
    cmap = table_rows(section(readme, "Course map"))
    if sorted(cmap) != nums:
        errors.append(f"README.md: the course map has rows {li.compact(sorted(cmap))}, "
                      f"the lesson folders are {li.compact(nums)}")
    for n, cells in cmap.items():
        if n in verdicts and f"GPU: {verdicts[n]}" not in cells[-1]:
            errors.append(f"README.md: course map row {n} says '{cells[-1]}', {GPU_RECORD} says "
                          f"'GPU: {verdicts[n]}'")
    instructors = (root / "INSTRUCTORS.md").read_text()
    path = table_rows(section(instructors, "The learning path"))
    if sorted(path) != nums:
        errors.append(f"INSTRUCTORS.md: the learning path has rows {li.compact(sorted(path))}, "
                      f"the lesson folders are {li.compact(nums)}")

    # ---- ranges, rank counts and deck counts in the prose
    ranks = {}
    for n, c in conf.items():
        ranks.setdefault(c["DEFAULT_NP"], []).append(n)
    for doc in DOCS:
        p = root / doc
        if not p.exists():
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            where = f"{doc}:{i}"
            for m in re.finditer(r"\((\d\d(?:-\d\d)?(?:, \d\d(?:-\d\d)?)*)\)", line):
                if "test-lesson" in line[:m.start()]:
                    expect, what = li.compact(extras), "the lessons with tests/lessonNN/run-tests.sh"
                elif re.search(r"lesson-NN|LESSON=NN|make lesson-|make grade", line[:m.start()]):
                    expect, what = li.compact(nums), "the lesson folders"
                else:
                    continue
                if m.group(1) != expect:
                    errors.append(f"{where}: '({m.group(1)})', {what} are ({expect})")
            for m in re.finditer(r"lessons ((?:\d\d, )*\d\d and \d\d|\d\d) start (\d+) ranks", line):
                said = re.findall(r"\d\d", m.group(1))
                real = ranks.get(m.group(2), [])
                if sorted(said) != sorted(real):
                    errors.append(f"{where}: 'lessons {m.group(1)} start {m.group(2)} ranks', DEFAULT_NP in "
                                  f"lesson.mk says {li.spoken(real) if real else 'none'}")
            for m in re.finditer(r"\b(\w+) (?:lesson |slide )?decks\b", line, re.I):
                word = m.group(1).lower()
                count = int(word) if word.isdigit() else NUMBERS.get(word)
                if count is not None and count != len(decks):
                    errors.append(f"{where}: '{m.group(0)}', slides/ has {len(decks)} decks")

    # ---- each lesson's README names the earlier solution files it is built on (USES)
    for d in dirs:
        want = li.uses_files(root, d)
        text = (d / "README.md").read_text() if (d / "README.md").exists() else ""
        para = re.search(r"^\*\*Built on\*\*.*?(?=\n\s*\n|\Z)", text, re.M | re.S)
        said = sorted(re.findall(r"`(solutions/[^`]+)`", para.group(0))) if para else []
        rel = f"solutions/{d.name}/README.md"
        if want and not para:
            errors.append(f"{rel}: no '**Built on**' paragraph; USES links in {', '.join(want)}")
        elif sorted(want) != said:
            errors.append(f"{rel}: '**Built on**' names {', '.join(said) or 'nothing'}; USES in lesson.mk "
                          f"links in {', '.join(want) or 'nothing'}")
    errors += check_bench_index(root)
    return errors


MACHINES = ("H200", "AMD EPYC", "Xeon", "2 cores", "16 cores")


def check_bench_index(root):
    """bench/README.md's index: each row's result files exist, its figure exists, and its 'last run' (date,
    machine) is the newest date in its first result file and a machine that file names."""
    errors = []
    path = root / "bench/README.md"
    if not path.exists():
        return errors
    rows = [l for l in (section(path.read_text(), "Index") or "").splitlines()
            if l.startswith("| `") or l.startswith("| make")]
    if not rows:
        return ["bench/README.md: no '## Index' table"]
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5:
            errors.append(f"bench/README.md: index row '{cells[0]}' has {len(cells)} cells, not 5")
            continue
        results = re.findall(r"`([^`]+)`", cells[2])
        for f in results + re.findall(r"`(figures/[^`]+)`", cells[3]):
            if not list((root / "bench").glob(f)):
                errors.append(f"bench/README.md: index row {cells[0]}: bench/{f} does not exist")
        if not results or not (root / "bench" / results[0]).exists():
            continue
        text = (root / "bench" / results[0]).read_text(errors="replace").replace("-core", " cores")
        dates = sorted(re.findall(r"20\d\d-\d\d-\d\d", text))
        said = re.match(r"(20\d\d-\d\d-\d\d|undated)", cells[4])
        want = dates[-1] if dates else "undated"
        if not said or said.group(1) != want:
            errors.append(f"bench/README.md: index row {cells[0]} says '{cells[4]}', bench/{results[0]}'s newest "
                          f"date is {want}")
        for m in MACHINES:
            if m in cells[4] and m not in text:
                errors.append(f"bench/README.md: index row {cells[0]} names '{m}', bench/{results[0]} does not")
        if not any(m in cells[4] for m in MACHINES):
            errors.append(f"bench/README.md: index row {cells[0]}: 'last run' names no machine ({', '.join(MACHINES)})")
    return errors


# ---------------------------------------------------------------- self-test: a planted stale line must fail

def copy_tree(src, dst):
    """What the check reads: the documents, the lesson folders' README + lesson.mk (+ empty .c files, for USES),
    deck and run-tests names (empty files), the GPU record."""
    for f in list((src / "bench").glob("results-*")) + list((src / "bench/figures").glob("*")) + [src / "bench/README.md"]:
        rel = f.relative_to(src)
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst / rel)
    for rel in DOCS + (GPU_RECORD,):
        if (src / rel).exists():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / rel, dst / rel)
    for d in li.lesson_dirs(src):
        out = dst / "solutions" / d.name
        out.mkdir(parents=True)
        for f in d.iterdir():
            if f.name in ("README.md", "lesson.mk"):
                shutil.copy(f, out / f.name)
            elif f.suffix == ".c":
                (out / f.name).touch()
    (dst / "slides").mkdir()
    for f in (src / "slides").glob("[0-9][0-9]-*.md"):
        (dst / "slides" / f.name).touch()
    for f in src.glob("tests/lesson[0-9][0-9]/run-tests.sh"):
        (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (dst / f.relative_to(src)).touch()


def edit(path, fn):
    path.write_text(fn(path.read_text()))


def last_row(text, heading):
    rows = table_rows(section(text, heading))
    n = max(rows)
    line = next(l for l in text.splitlines() if re.match(rf"\|\s*{n}\s*\|", l))
    return n, line


def plants(root):
    """(name, what it does to the copy, a piece of the error it must cause)."""
    readme, instr, gpu = root / "README.md", root / "INSTRUCTORS.md", root / GPU_RECORD
    n_last = li.num(li.lesson_dirs(root)[-1])
    new = f"{int(n_last) + 1:02d}"
    uses_lesson = next(d for d in li.lesson_dirs(root) if li.lesson_mk(d)["USES"])

    def drop_course_row():
        n, line = last_row(readme.read_text(), "Course map")
        edit(readme, lambda s: s.replace(line + "\n", ""))

    def flip_course_status():
        n, line = last_row(readme.read_text(), "Course map")
        cells = line.split("|")
        cells[-2] = " available; GPU: failed "
        edit(readme, lambda s: s.replace(line, "|".join(cells)))

    def stale_range():
        edit(readme, lambda s: s + f"\nmake lesson-NN / grade LESSON=NN        run or grade lesson NN (01-{int(n_last) - 2:02d})\n")

    def stale_decks():
        edit(instr, lambda s: s + "\nBuild the seven decks before the day.\n")

    def new_lesson():
        (root / "solutions" / f"{new}-tensor-parallel").mkdir()
        (root / "solutions" / f"{new}-tensor-parallel" / "README.md").write_text(f"# Lesson {new}\n")
        (root / "slides" / f"{new}-tensor-parallel.md").touch()

    def gpu_record_changes():
        edit(gpu, lambda s: re.sub(rf"^\| {n_last} \| [^|]+\|", f"| {n_last} | failed |", s, flags=re.M))

    def uses_changes():
        edit(uses_lesson / "lesson.mk", lambda s: re.sub(r"^USES\s*:=.*$", "USES := 01-single-gpu", s, flags=re.M))

    def stale_bench_row():
        edit(root / "bench/README.md", lambda s: s.replace("| 2026-11-26, H200 |", "| 2026-11-20, H200 |", 1))

    def stale_ranks():
        edit(readme, lambda s: s + "\nlessons 03 and 04 start 2 ranks unless NP says otherwise.\n")

    return [
        ("a course-map row removed", drop_course_row, "the course map has rows"),
        ("a course-map status against the GPU record", flip_course_status, "course map row"),
        ("a stale (01-NN) range", stale_range, "the lesson folders are ("),
        ("a stale deck count", stale_decks, "slides/ has"),
        (f"a new lesson {new} without its rows", new_lesson, "the course map has rows"),
        ("the GPU record changed, README not", gpu_record_changes, "GPU status"),
        (f"lesson {li.num(uses_lesson)}'s USES changed, its README not", uses_changes, "Built on"),
        ("a stale rank count", stale_ranks, "start 2 ranks"),
        ("a bench index row with an old date", stale_bench_row, "newest date is"),
    ]


def self_test(src):
    failures = 0
    with tempfile.TemporaryDirectory(prefix="check-docs-") as tmp:
        base = pathlib.Path(tmp) / "clean"
        copy_tree(src, base)
        errs = check(base)
        print(f"self-test: the unchanged copy: {'passes' if not errs else 'FAILS: ' + errs[0]}")
        failures += bool(errs)
        for i, (name, plant, expect) in enumerate(plants(base)):
            root = pathlib.Path(tmp) / f"plant{i}"
            copy_tree(src, root)
            dict((p[0], p[1]) for p in plants(root))[name]()
            errs = check(root)
            hit = [e for e in errs if expect in e]
            print(f"self-test: {name}: {'caught: ' + hit[0] if hit else 'NOT CAUGHT'}")
            failures += not hit
    print(f"self-test: {'every planted line caught' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path, default=li.ROOT)
    ap.add_argument("--self-test", action="store_true", help="plant stale lines in a copy; each must fail")
    args = ap.parse_args()
    if args.self_test:
        return self_test(args.root)
    errors = check(args.root)
    for e in errors:
        print(f"check-docs: {e}", file=sys.stderr)
    n = len(li.lesson_dirs(args.root))
    print(f"check-docs: {'OK' if not errors else f'{len(errors)} fact(s) disagree with their source'} "
          f"({n} lessons, the GPU record {GPU_RECORD})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
