#!/usr/bin/env python3
"""How much each lesson's solution changes from the lesson it builds on: train.c + lesson.h.

A lesson builds on the latest earlier lesson whose whole solution it links in (USES in its lesson.mk: 04, 08, 09
and 10 on 03; 05 and 07 on 04), else on the lesson before it (01 -> 02 -> 03, 05 -> 06): tools/lessoninfo.py.

A lesson's diff should show its idea and nothing else. Added and removed lines are what `diff` counts. Of those,
the RESTATED lines are the ones a reader meets that are not new: a line removed and added again elsewhere
(moved), or a line removed and added back written a little differently: the same call with renamed variables
or through a struct. They are the changes to look at when a diff is larger than its
idea; lines that are new or gone altogether are the idea (or its removal).

    tools/lesson_diff.py              the table: + and - per pair, and the restated lines
    tools/lesson_diff.py --show 08    the restated lines of the pair that ends at lesson 08 (03 -> 08)
    tools/lesson_diff.py --root DIR   the same for another checkout (before and after a change)
"""
import argparse
import difflib
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import lessoninfo  # noqa: E402

ROOT = lessoninfo.ROOT
FILES = ("train.c", "lesson.h")
SIMILAR = 0.6  # difflib ratio from which an added line about the same call counts as a removed line rewritten


def changed_lines(a, b):
    """The lines `diff` removes from file a and adds in file b (a missing file is empty)."""
    out = subprocess.run(["diff", str(a) if a.exists() else "/dev/null", str(b) if b.exists() else "/dev/null"],
                         capture_output=True, text=True).stdout
    removed = [l[2:] for l in out.splitlines() if l.startswith("< ")]
    added = [l[2:] for l in out.splitlines() if l.startswith("> ")]
    return removed, added


def meaningful(line):
    # Blank lines, lone braces, section rulers and preprocessor lines (include guards, includes) say nothing of
    # how the code reads: not counted as restated.
    line = line.strip()
    if line.startswith("#") or line.startswith("// ----"):
        return False
    return len(re.findall(r"[A-Za-z0-9]", line)) >= 3


def head(line):
    """What a statement is about: the first function it calls, else its first two words."""
    call = re.search(r"([A-Za-z_]\w*)\s*\(", line)
    return call.group(1) if call else " ".join(re.findall(r"[A-Za-z_]\w*", line)[:2])


def restated(removed, added):
    """Pairs (removed, added) of lines that say the same thing: identical after trimming (moved), or similar."""
    rem = [l.strip() for l in removed if meaningful(l)]
    pairs = []
    rest = []
    for line in (l.strip() for l in added if meaningful(l)):
        if line in rem:
            rem.remove(line)
            pairs.append((line, line))
        else:
            rest.append(line)
    for line in rest:
        best, score = None, SIMILAR
        for cand in rem:
            if head(cand) != head(line):
                continue
            s = difflib.SequenceMatcher(None, cand, line, autojunk=False).ratio()
            if s >= score:
                best, score = cand, s
        if best is not None:
            rem.remove(best)
            pairs.append((best, line))
    return pairs


def pair_stats(a, b):
    removed, added, pairs = [], [], []
    for name in FILES:
        r, ad = changed_lines(a / name, b / name)
        removed += r
        added += ad
        pairs += restated(r, ad)
    return removed, added, pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show", metavar="NN", help="print the restated lines of the pair that ends at lesson NN")
    ap.add_argument("--root", type=pathlib.Path, default=ROOT,
                    help="another checkout to measure (e.g. an earlier commit: git worktree add, git archive)")
    args = ap.parse_args()
    dirs = lessoninfo.lesson_dirs(args.root)
    print(f"{'pair':<10} {'+':>5} {'-':>5} {'restated':>9}   ({' + '.join(FILES)}; each lesson against the one it builds on)")
    for b in dirs:
        a = lessoninfo.base_lesson(args.root, b)
        if a is None:
            continue
        removed, added, pairs = pair_stats(a, b)
        if args.show and not b.name.startswith(args.show):
            continue
        print(f"{a.name[:2]} -> {b.name[:2]}   {len(added):>5} {len(removed):>5} {len(pairs):>9}")
        if args.show:
            for old, new in pairs:
                print(f"  - {old}\n  + {new}" if old != new else f"  = {new}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
