#!/usr/bin/env python3
"""kit/'s dependency graph, checked against the layer order declared in kit/README.md.

A node is a module: a header, the source of the same name and its _internal.h header (kit/dist.h, dist.c and
dist_internal.h are `dist`; kit/cuda/*.cu are `cuda/<name>`). A module A depends on B when one of A's files includes one of B's, or calls a function that
B's source defines (the link-time dependency an include alone does not show: ops.c calls conv2d_forward_cpu,
defined in ops_cpu.c). The CUDA emulator's shim headers (kit/cuda/emu) are left out.

The layer order is the "Layers" section of kit/README.md: one line per layer, lowest first, `N. name, name`.
A dependency may point to a module of a lower layer or of the same one, never to a higher one, and no two
modules may depend on each other through any path (a cycle).

    tools/include_graph.py            the summary: modules, edges, up-edges, cycles, public functions per header
    tools/include_graph.py --edges    every edge too
    tools/include_graph.py --check    exit 1 when an edge points up or a cycle exists (for CI)
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
KIT = ROOT / "kit"

INCLUDE = re.compile(r'^\s*#\s*include\s+"(kit/[^"]+)"', re.M)
# A function defined at file scope: a line that starts a declaration and ends with "{" after the ")".
DEFINITION = re.compile(r'^(?!static\b)(?:extern "C" )?[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\([^;{]*?\)\s*'
                        r'(?:__attribute__\(\(\w+\)\)\s*)?\{', re.M)
# A prototype in a header: `type name(args);` at file scope.
PROTOTYPE = re.compile(r'^(?!static\b|typedef\b|#)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\([^;{]*?\)\s*'
                       r'(?:__attribute__\(\([^;]*?\)\)\s*)?;', re.M)
CALL = re.compile(r'\b([A-Za-z_]\w*)\s*\(')
COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/', re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')


def sources():
    files = sorted(p for p in KIT.rglob("*") if p.suffix in (".c", ".h", ".cu") and "emu" not in p.parts)
    return [f for f in files if f.is_file()]


def module_of(path):
    """kit/ops.c and kit/ops.h are `ops`; kit/dist_internal.h is `dist` too: what dist.c offers its tests."""
    rel = path.relative_to(KIT).with_suffix("").as_posix()
    owner = rel[: -len("_internal")]
    if rel.endswith("_internal") and any((KIT / (owner + ext)).exists() for ext in (".h", ".c")):
        return owner
    return rel


def strip(text):
    return STRING.sub('""', COMMENT.sub(" ", text))


def read_layers():
    """The layer order from kit/README.md's "## Layers" section: [[module, ...], ...], lowest first."""
    text = (KIT / "README.md").read_text()
    section = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not section:
        return []
    layers = []
    for line in section.group(1).splitlines():
        m = re.match(r"^(\d+)\. `?([^`:]+)`?:", line)
        if m:
            layers.append([name.strip() for name in m.group(2).split(",") if name.strip()])
    return layers


def build_graph():
    files = sources()
    modules = sorted({module_of(f) for f in files})
    text = {f: f.read_text() for f in files}
    # function -> module that defines it; only functions with a prototype in a header can be called from
    # another module (the rest are static, or a .cu file's own kernels and helpers).
    declared = {name for f in files if f.suffix == ".h" for name in PROTOTYPE.findall(strip(text[f]))}
    defined = {}
    for f in files:
        if f.suffix in (".c", ".cu"):
            for name in DEFINITION.findall(strip(text[f])):
                if name in declared:
                    defined.setdefault(name, module_of(f))
    edges = set()
    for f in files:
        src = module_of(f)
        for inc in INCLUDE.findall(text[f]):
            target = ROOT / inc
            if target.exists() and "emu" not in target.parts and module_of(target) != src:
                edges.add((src, module_of(target)))
        if f.suffix in (".c", ".cu"):
            for name in set(CALL.findall(strip(text[f]))):
                dst = defined.get(name)
                if dst and dst != src:
                    edges.add((src, dst))
    public = {}
    for f in files:
        if f.suffix == ".h":
            public[f.relative_to(KIT).as_posix()] = len(set(PROTOTYPE.findall(strip(text[f]))))
    return files, modules, sorted(edges), public


def find_cycles(modules, edges):
    """Strongly connected components with more than one module (Tarjan)."""
    out = {m: [] for m in modules}
    for a, b in edges:
        out[a].append(b)
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in out[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for m in modules:
        if m not in index:
            visit(m)
    return comps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="print every edge")
    ap.add_argument("--check", action="store_true", help="exit 1 on an up-edge, a cycle or an unlisted module")
    args = ap.parse_args()

    files, modules, edges, public = build_graph()
    layers = read_layers()
    layer = {m: i for i, names in enumerate(layers) for m in names}
    unlisted = [m for m in modules if m not in layer]
    up = [(a, b) for a, b in edges if a in layer and b in layer and layer[b] > layer[a]]
    cycles = find_cycles(modules, edges)

    print(f"files: {len(files)}  modules: {len(modules)}  edges: {len(edges)}  "
          f"up-edges: {len(up)}  cycles: {len(cycles)}")
    if args.edges:
        for a, b in edges:
            print(f"  {a} -> {b}")
    for a, b in up:
        print(f"up-edge: {a} (layer {layer[a] + 1}) -> {b} (layer {layer[b] + 1})")
    for c in cycles:
        print("cycle: " + " <-> ".join(c))
    for m in unlisted:
        print(f"not in a layer (kit/README.md, ## Layers): {m}")
    print("public functions per header: " + ", ".join(f"{h} {n}" for h, n in sorted(public.items()) if n))
    if args.check and (up or cycles or unlisted):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
