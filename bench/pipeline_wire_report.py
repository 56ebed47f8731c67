#!/usr/bin/env python3
"""bench/pipeline_wire_report.py RAW WIRE_MD MEMORY_MD: the tables of bench/pipeline-wire.sh from its raw lines.

RAW holds `wire: k=v ...` lines (bench/pipeline_wire.c, one per rank) and `ddp: batch=B {json}` lines
(bench/ddp_kit.c). The wire tables come from the runs on 2 ranks with 1 replica; the memory tables from every
run of resnet9 at batch 128 (the script's memory part)."""
import json
import sys
from collections import defaultdict


def parse(path):
    pipes, ddps, header = [], {}, ""
    for line in open(path):
        if line.startswith("#"):
            header = line[1:].strip().removeprefix("bench/pipeline-wire.sh, ")
        elif line.startswith("wire:"):
            d = dict(kv.split("=", 1) for kv in line.split()[1:])
            for k, v in d.items():
                if k not in ("schedule", "model"):
                    d[k] = float(v)
            pipes.append(d)
        elif line.startswith("ddp:"):
            batch = int(line.split()[1].split("=")[1])
            j = json.loads(line[line.index("{"):])
            ddps[(j["model"], batch)] = j
    return pipes, ddps, header


def mb(x):
    return f"{x / 1e6:.3f} MB" if x >= 1e5 else f"{x:.0f} B"


def wire_report(pipes, ddps, header, out):
    models = []
    for (m, _b) in ddps:
        if m not in models:
            models.append(m)
    lines = [
        "# Bytes per training step per rank: pipeline (model parallel) against DDP (data parallel)",
        "",
        f"Measured by `bench/pipeline-wire.sh` ({header}): the process group's traffic counters (kit/dist.h, "
        "`pg_traffic`: the bytes each call hands to the backend) read before and after 2 training steps (after 1 "
        "warm-up step), per rank. Both on 2 ranks, the same net, the same GLOBAL batch, the synthetic set "
        "(3 x 32 x 32 images). Pipeline: lesson 08's stages (bench/pipeline_wire.c links the solution's "
        "pipe.c / pipe_dist.c), 2 stages cut by parameter count, GPipe, 4 micro-batches; DDP: lesson 03's loop "
        "(bench/ddp_kit.c links the solution's train.c).",
        "",
        "Arithmetic beside each measured number:",
        "",
        "- pipeline, per rank: B x (floats per image crossing its cut forward, if not the last stage + floats per "
        "image crossing back, if not the first) x 4 bytes. Each image crosses each cut once each way whatever M "
        "and the schedule: micro-batches change when, not how much. Point-to-point bytes are what crosses the "
        "wire (one copy, peer to peer).",
        "- DDP, per rank: the all-reduce of the flat gradient, 4 x params bytes handed to it, plus the BN running "
        "statistics' broadcast, 4 x buffers, every step. The counter counts what is handed to the collective, "
        "not the algorithm's own traffic: a ring all-reduce sends 2 (w-1)/w x 4 x params per rank (= 4 x params "
        "at w = 2), the column `ring wire` (plus the broadcast: 4 x buffers leaves the root).",
        "",
        "Activations grow with the batch; gradients do not. The crossover batch B* = DDP's ring bytes per rank / "
        "the pipeline's bytes per image per rank: below B* the pipeline moves less, above it DDP does.",
        "",
    ]
    summary = []
    for m in models:
        rows = [p for p in pipes if p["model"] == m and p["R"] == 1 and p["P"] == 2 and p["schedule"] == "gpipe"
                and p["M"] in (4, p["batch"]) and (m, int(p["batch"])) in ddps]
        by_batch = defaultdict(dict)
        for p in rows:
            by_batch[int(p["batch"])][int(p["stage"])] = p
        if not by_batch:
            continue
        any_ddp = ddps[(m, min(by_batch))]
        params, buffers = any_ddp["n_params"], any_ddp.get("n_buffers", 0)
        cut = int(by_batch[min(by_batch)][0]["out_floats"])
        lines += [f"## {m}: {params} parameters, {buffers} BN buffer floats; the cut carries {cut} floats per image",
                  "",
                  "| global batch | pipeline stage 0 sends (measured / formula) | stage 1 sends (measured / formula) "
                  "| DDP handed to collectives per rank (measured / 4 x (params + buffers)) | DDP ring wire per rank "
                  "| fewer bytes |",
                  "|---:|---:|---:|---:|---:|---|"]
        per_image = None
        for b in sorted(by_batch):
            s0, s1 = by_batch[b].get(0), by_batch[b].get(1)
            d = ddps[(m, b)]
            formula_ddp = 4 * (params + buffers)
            ring = 2 * (2 - 1) / 2 * 4 * params + 4 * buffers
            pipe_max = max(s0["p2p_sent"], s1["p2p_sent"])
            per_image = pipe_max / b
            win = "pipeline" if pipe_max < ring else "DDP"
            lines.append(f"| {b} | {mb(s0['p2p_sent'])} / {mb(s0['p2p_sent_formula'])} | {mb(s1['p2p_sent'])} / "
                         f"{mb(s1['p2p_sent_formula'])} | {mb(d['coll_bytes_per_step'])} / {mb(formula_ddp)} "
                         f"({d['coll_calls_per_step']:.0f} call(s)) | {mb(ring)} | {win} (pipeline / DDP = "
                         f"{pipe_max / ring:.3g}) |")
        ring = 2 * (2 - 1) / 2 * 4 * params + 4 * buffers
        cross = ring / per_image
        lines += ["", f"Crossover: B* = {mb(ring)} / {per_image:.0f} bytes per image = **{cross:.1f} images** per "
                  f"global batch (= (params + buffers) / floats at the cut = ({params} + {buffers}) / {cut}). "
                  f"The pipeline sends less below it, DDP above.", ""]
        summary.append((m, params, cut, cross))
    lines += ["## Where each wins", "",
              "| net | parameters | floats per image at the cut | crossover batch B* (2 ranks) |",
              "|---|---:|---:|---:|"]
    for m, params, cut, cross in summary:
        lines.append(f"| {m} | {params} | {cut} | {cross:.1f} |")
    small = [f"{m} (B* = {c:.1f})" for m, _p, _c, c in summary if c < 16]
    large = [f"{m} (B* = {c:.0f})" for m, _p, _c, c in summary if c >= 16]
    lines += ["",
              "The HPC guide's table, measured: data parallelism exchanges gradients (a cost fixed by the model's "
              "size), model parallelism exchanges activations (a cost that grows with the batch and with the "
              "activation's size at the cut). "
              + (f"Nets with few parameters and wide activations, {', '.join(small)}: the pipeline's traffic passes "
                 "DDP's within a few images, so at any useful batch DDP moves fewer bytes. " if small else "")
              + (f"The parameter-heavy net, {', '.join(large)}: the pipeline moves fewer bytes up to a batch of "
                 "about B*, DDP beyond it. " if large else "")
              + "A pipeline earns its bytes where the model does not fit one device (lesson 08's reason), or where "
              "the parameters are many and the cut is narrow (large dense or transformer layers: d floats per token "
              "cross a cut, d^2 parameters per layer are all-reduced). More ranks change both sides: DDP's ring "
              "approaches 2 x 4 x params per rank, an interior pipeline stage sends across two cuts.",
              "", "Bytes are the same on any machine: they depend on the net, the cut and the batch only.", ""]
    open(out, "w").write("\n".join(lines))


def memory_report(pipes, header, out):
    last = {}  # the memory part's run of each (P, schedule, M, stage): the wire part may have run one too
    for p in pipes:
        if p["model"] == "resnet9" and p["batch"] == 128:
            last[(p["P"], p["schedule"], p["M"], p["stage"])] = p
    runs = list(last.values())
    lines = [
        "# Stored activations per pipeline stage: measured peak per rank against the arithmetic",
        "",
        f"Measured by `bench/pipeline-wire.sh` ({header}) with bench/pipeline_wire.c: ResNet-9, global batch "
        "B = 128, synthetic 3 x 32 x 32 images, cut by parameter count, one stage per rank, CPU. A stage keeps one "
        "view (the activations of one micro-batch, model_create_view) per micro-batch it holds between its forward "
        "and its backward. Before the measured step the stage's views are freed (glibc told to mmap every block of "
        "64 KiB or more, so freed memory leaves the process), VmHWM is reset (`echo 5 > /proc/self/clear_refs`), "
        "and after the step `measured` = VmHWM - VmRSS before it: the peak the step added, which is the views "
        "it made and wrote.",
        "",
        "Arithmetic: stored(s) = inflight(s) x ceil(B/M) x f(s) x 4 bytes, where f(s) is what one view writes "
        "per image on stage s (its activations, their gradients in the slots the memory plan shares, and the "
        "input's gradient unless s = 0: Model.act_floats_per_sample + grad_floats_per_sample + in_floats) and "
        "inflight(s) = M for GPipe (all forwards before any backward), min(P - s, M) for 1F1B (stage s starts "
        "its first backward after P - s forwards). GPipe's stored activations are therefore B x f(s) x 4 "
        "whatever M (micro-batches only cut the same images into smaller pieces held at once); 1F1B's shrink as "
        "M grows, to (P - s)/M of GPipe's. `kit allocation` is stage_held_bytes (the views' allocated bytes: "
        "more than they write, e.g. a view's input-gradient buffer on stage 0, which nobody needs).",
        ""]
    for P in (2, 4):
        sel = sorted((p for p in runs if p["P"] == P), key=lambda p: (p["schedule"], p["M"], p["stage"]))
        if not sel:
            continue
        lines += [f"## P = {P}" + (" (ranks share cores: memory does not care)" if P == 4 else ""), "",
                  "| schedule | M | stage | in flight | rows per view | f(s) floats/image | arithmetic | measured "
                  "| measured / arithmetic | kit allocation |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p in sel:
            ratio = p["hwm_delta"] / p["held_formula"] if p["held_formula"] > 0 else float("nan")
            lines.append(f"| {p['schedule']} | {p['M']:.0f} | {p['stage']:.0f} | {p['peak_inflight']:.0f} | "
                         f"{p['micro_rows']:.0f} | {p['view_floats_per_sample']:.0f} | {mb(p['held_formula'])} | "
                         f"{mb(p['hwm_delta'])} | {ratio:.3f} | {mb(p['held_bytes'])} |")
        lines.append("")
    lines += ["Every stage that holds more than 5 MB measures within 0.5 % of the arithmetic (above it: page rounding "
              "and Open MPI's buffers for the step's messages). ResNet-9's last stage on P = 4 (the classifier, "
              "9226 floats per image in the count) measures 4-9 % below: the per-image count includes slots its "
              "step does not write in full (not traced further). GPipe's stored activations are flat in M; 1F1B's "
              "fall as 1/M once M >= P - s, and with the stage: on P = 4 stage 0 holds 4 micro-batches, stage 3 one.",
              "",
              "The cut by parameter count is not a cut by memory: ResNet-9's parameters sit in its late, narrow "
              "layers, so stage 0 takes the wide early layers at full resolution, 6 to 100 times the activations "
              "per image of the later stages. Where memory is what does not fit, balance by stored bytes per "
              "image (f(s) above) instead.", ""]
    open(out, "w").write("\n".join(lines))


def main():
    raw, wire_md, mem_md = sys.argv[1:4]
    pipes, ddps, header = parse(raw)
    wire_report(pipes, ddps, header, wire_md)
    memory_report(pipes, header, mem_md)


if __name__ == "__main__":
    main()
