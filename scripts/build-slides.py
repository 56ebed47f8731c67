#!/usr/bin/env python3
"""scripts/build-slides.py: one deck, slides/NN-name.md -> slides/NN-name.pdf, checked (make slides).

    scripts/build-slides.py slides/04-checkpoint.md slides/04-checkpoint.pdf

pandoc + beamer + pdflatex build the PDF; the build then FAILS (and removes the PDF, so make retries it) when
  - LaTeX reports an overfull box wider or taller than 1 pt: text that runs off the slide or into its footer
    (a long code line, a table wider than the page, a frame with too many lines), or
  - the PDF's text (pdftotext, poppler-utils) shows Markdown that was not rendered: `**`, a backtick or `#`
    outside the deck's code (inside raw LaTeX such as `\\quad **TODO**` pandoc leaves Markdown as it is).
It prints the deck's pages and words per page (the footer included), and names each page over WORDS_MAX words
(a warning: move the prose to the deck's notes). A deck whose YAML header sets `words-max: N` FAILS on a page of
more than N words (the footer's dozen included): the rule for decks that keep their prose in the notes.
"""
import json
import os
import re
import subprocess
import sys

OVERFULL_PT = 1.0   # LaTeX's own tolerance (\hfuzz) is 0.1 pt; a point is a third of a character
WORDS_MAX = 100     # words on one page, footer included, before the summary names the page
# `#` where Markdown meant a heading: at the start of a line or before a space ("all-reduce #49" is text)
MARKUP = re.compile(r"\*\*|`|^\s*#|#\s")


def fail(msg):
    print(f"make slides: {msg}", file=sys.stderr)
    sys.exit(1)


def run_pandoc(md, pdf):
    env = dict(os.environ, TEXINPUTS=os.path.abspath("slides") + "//:")
    cmd = ["pandoc", md, "-t", "beamer", "--pdf-engine=pdflatex", "--resource-path=slides",
           "-o", pdf, "--verbose"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-1500:])
        fail(f"{md}: pandoc failed (exit {p.returncode})")
    return p.stderr


def overfull_boxes(log):
    """(points, page, kind, what) for each overfull box of pdflatex's LAST run (earlier runs repeat them)."""
    last = log.rsplit("[makePDF] Run #", 1)[-1]
    lines = last.splitlines()
    found = []
    shipped = 0   # TeX prints [N] as it ships page N out: a warning before it is on page N
    for i, line in enumerate(lines):
        for n in re.findall(r"(?:^|[\s)])\[(\d+)(?=[\]\s{<]|$)", line):
            shipped = max(shipped, int(n))
        m = re.match(r"Overfull \\([hv])box \(([0-9.]+)pt too (wide|high)\) (.*)", line)
        if m and float(m.group(2)) > OVERFULL_PT:
            # an hbox's next line is the offending text as TeX typeset it
            what = lines[i + 1].strip() if m.group(1) == "h" and i + 1 < len(lines) else m.group(4)
            what = "a picture, image or table" if what == "[]" else what
            found.append((float(m.group(2)), shipped + 1, f"\\{m.group(1)}box", what))
    return found


def code_texts(md):
    """The text of every code block and inline code span of the deck (where `#` and `**` are meant)."""
    ast = json.loads(subprocess.run(["pandoc", md, "-t", "json"], capture_output=True, text=True,
                                    check=True).stdout)
    out = []

    def walk(x):
        if isinstance(x, dict):
            if x.get("t") in ("Code", "CodeBlock"):
                out.append(x["c"][1])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(ast)
    return out


def squeeze(s):
    return re.sub(r"\s+", "", s)


def page_texts(pdf):
    text = subprocess.run(["pdftotext", "-layout", pdf, "-"], capture_output=True, text=True,
                          check=True).stdout
    return text.split("\f")[:-1] if text.endswith("\f") else text.split("\f")


def unrendered_markup(md, pages):
    """(page, line) for each PDF line holding `**`, a backtick or `#` that no code span or block explains."""
    code = [squeeze(line) for c in code_texts(md) for line in c.splitlines() if squeeze(line)]
    code.sort(key=len, reverse=True)   # longest first: a block's line before a span inside it
    found = []
    for n, page in enumerate(pages, 1):
        for line in page.splitlines():
            if not MARKUP.search(line):
                continue
            rest = squeeze(line)
            for c in code:
                if MARKUP.search(c) and c in rest:
                    rest = rest.replace(c, "")
            if MARKUP.search(rest):
                found.append((n, line.strip()))
    return found


def words_max(md):
    """The deck's own limit of words per page (`words-max: N` in its YAML header), or None."""
    with open(md, encoding="utf-8") as f:
        text = f.read()
    head = re.match(r"---\n(.*?)\n---\n", text, re.S)
    m = re.search(r"(?m)^words-max:\s*(\d+)\s*$", head.group(1)) if head else None
    return int(m.group(1)) if m else None


def main():
    if len(sys.argv) != 3:
        fail("usage: scripts/build-slides.py DECK.md OUT.pdf")
    md, pdf = sys.argv[1:]
    for tool, pkg in (("pandoc", "pandoc"), ("pdflatex", "texlive-latex-recommended"),
                      ("pdftotext", "poppler-utils")):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            fail(f"{tool} not found ({pkg}). HINT: scripts/install-deps.sh --slides")
    log = run_pandoc(md, pdf)
    pages = page_texts(pdf)
    problems = [f"page {page}: overfull {kind} by {pt:.1f}pt: {what}"
                for pt, page, kind, what in overfull_boxes(log)]
    problems += [f"page {n}: unrendered Markdown: {line}" for n, line in unrendered_markup(md, pages)]
    limit = words_max(md)
    if limit is not None:
        problems += [f"page {n}: {len(p.split())} words, over the deck's words-max of {limit} (footer included): "
                     f"move prose to the notes" for n, p in enumerate(pages, 1) if len(p.split()) > limit]
    if problems:
        os.remove(pdf)
        for p in problems:
            print(f"{md}: {p}", file=sys.stderr)
        fail(f"{md}: {len(problems)} problem(s) above, PDF removed. HINT: shorten the line or the slide "
             f"(move prose to the notes); a literal ** or ` sits inside raw LaTeX: write \\textbf{{}} "
             f"or \\texttt{{}} there")
    words = [len(p.split()) for p in pages]
    wordy = [f"p{i}: {w}" for i, w in enumerate(words, 1) if w > WORDS_MAX]
    print(f"{pdf}: {len(pages)} pages, {sum(words) / len(pages):.0f} words per page"
          + (f"; over {WORDS_MAX} words: {', '.join(wordy)}" if wordy else ""))


if __name__ == "__main__":
    main()
