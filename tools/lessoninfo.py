"""What the lesson folders say about the lessons: the one source that docs and tools read.

The list of lessons is the folders solutions/NN-name/; a lesson's deck is slides/NN-name.md; what it needs,
how many ranks it starts and which earlier solution files it is built on are in solutions/NN-name/lesson.mk
(read here the way mk/lessons.mk reads it: NEEDS, USES, DEFAULT_NP, GRADE_NP).
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def lesson_dirs(root=ROOT):
    """solutions/NN-name folders, in order."""
    sol = pathlib.Path(root) / "solutions"
    return sorted(p for p in sol.iterdir() if p.is_dir() and re.fullmatch(r"\d\d-[\w-]+", p.name))


def lesson_mk(lesson_dir):
    """The variables of a lesson.mk (`NAME := value` lines), with mk/lessons.mk's defaults."""
    conf = {"NEEDS": "", "USES": "", "DEFAULT_NP": "1", "GRADE_NP": "1"}
    path = pathlib.Path(lesson_dir) / "lesson.mk"
    if path.exists():
        for line in path.read_text().splitlines():
            m = re.match(r"\s*([A-Z_]+)\s*:?=\s*(.*?)\s*$", line)
            if m and not line.lstrip().startswith("#"):
                conf[m.group(1)] = m.group(2)
    return conf


def uses_files(root, lesson_dir):
    """The earlier solutions' .c files a lesson is linked with, as mk/lessons.mk expands USES:
    a folder entry (03-ddp) gives every .c of that solution, a file entry (04-checkpoint/ckpt.c) that file."""
    root = pathlib.Path(root)
    files = []
    for entry in lesson_mk(lesson_dir)["USES"].split():
        path = root / "solutions" / entry
        if path.is_dir():
            files += sorted(path.glob("*.c"))
        else:
            files.append(path)
    return [f.relative_to(root).as_posix() for f in files]


def base_lesson(root, lesson_dir):
    """The folder a lesson builds on: the latest earlier lesson whose whole solution it uses (USES), else the
    lesson before it (lessons 01-03 and 06 are programs of their own)."""
    root = pathlib.Path(root)
    whole = [e for e in lesson_mk(lesson_dir)["USES"].split() if "/" not in e]
    if whole:
        return root / "solutions" / max(whole)
    dirs = lesson_dirs(root)
    i = [d.name for d in dirs].index(pathlib.Path(lesson_dir).name)
    return dirs[i - 1] if i > 0 else None


def num(lesson_dir):
    return pathlib.Path(lesson_dir).name[:2]


def compact(nums):
    """["03", "04", "05", "07"] -> "03-05, 07": runs of consecutive lessons as first-last."""
    nums = sorted(nums, key=int)
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and int(nums[j + 1]) == int(nums[j]) + 1:
            j += 1
        parts.append(nums[i] if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(parts)


def spoken(nums):
    """["03", "04", "07"] -> "03, 04 and 07"."""
    nums = sorted(nums, key=int)
    return nums[0] if len(nums) == 1 else ", ".join(nums[:-1]) + " and " + nums[-1]
