"""Renders the tables of benchmark results files as one Markdown section:
``python -m benchmarks report --gpu FILE --cpu FILE [--recording FILE] [--readme FILE]``
(--recording: a GPU suite run of the ``recording`` group).

The section is printed; with --readme it replaces what sits between the
markers ``<!-- PERF-START -->`` and ``<!-- PERF-END -->`` of that file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from ..cpu import suite as cpu_bench
from ..speed import suite as gpu_bench

START, END = "<!-- PERF-START -->", "<!-- PERF-END -->"


def portable(command: str) -> str:
    """The recorded command with the machine's output folder written as
    $OUT (no machine paths in the docs)."""
    return re.sub(r"--out \S*/", "--out $OUT/", command)


# Rows whose run-to-run range is shown next to the medians.
SPREAD_ROWS = ("pair_us_512", "pair_us_1048576", "random_ns_per_op", "transformer_bf16_ms", "resnet50_ms")


def spread_table(doc: dict) -> str:
    allocs = [a for a in doc["allocators"] if a in doc["raw"]]
    labels = {m: (label, unit) for m, label, unit, _ in gpu_bench.ROWS}
    lines = ["| case (min – max over repeats) | unit | " + " | ".join(allocs) + " |", "|" + "---|" * (len(allocs) + 2)]
    for metric in SPREAD_ROWS:
        cells = []
        label, unit = labels[metric]
        for a in allocs:
            vals = [r[metric] for r in doc["raw"][a] if metric in r]
            cells.append(f"{gpu_bench.fmt(unit, min(vals))} – {gpu_bench.fmt(unit, max(vals))}" if vals else "—")
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def max_spread(doc: dict) -> float:
    """Largest max/min over repeats of one allocator's figure, across SPREAD_ROWS."""
    worst = 1.0
    for runs in doc["raw"].values():
        for metric in SPREAD_ROWS:
            vals = [r[metric] for r in runs if metric in r]
            if vals and min(vals) > 0:
                worst = max(worst, max(vals) / min(vals))
    return worst


def gpu_section(path: str) -> str:
    with open(path) as f:
        doc = json.load(f)
    m = doc["machine"]
    notes = "".join(f"\n\nNote: {n}" for n in doc.get("notes", []))
    return (
        f"GPU suite, {m['date'][:10]}, {m.get('gpu')} (driver {m.get('driver')}), torch {m['torch']}, "
        f"{doc['repeats']} repeats, each allocator in its own process per group, order rotated per repeat "
        f"(`{os.path.relpath(path)}`), produced on the device by\n\n"
        f"    BENCH_ARGS='--repeats {doc['repeats']}' bash benchmarks/device/steps.sh build bench"
        f"   # = {portable(doc['command'])}\n\n"
        "Medians over repeats; in parentheses the ratio to native from the same run (lower is better). "
        "memalloc's peaks come from its own accounting; device used is total − free from "
        "`cudaMemGetInfo` (CUDA context included, ~0.5 GiB). RMM keeps no peak counters.\n\n"
        + gpu_bench.markdown_table(doc)
        + "\n\nRun-to-run spread on this machine is large for the host-bound cases (the same allocator "
        f"differs by up to {max_spread(doc):.1f}x between processes), so ratios inside the ranges below "
        "are not significant:\n\n" + spread_table(doc) + notes
    )


RECORDING_X = ("rec_bf16_ms_x_tags", "rec_bf16_ms_x_python", "rec_pair_us_512_x_tags", "rec_pair_us_512_x_python")
TARGETS = (  # (key in doc["targets"], label, issue #5's target)
    ("bf16_ms_python_over_native_off_via_in_process", "bf16 step, Python stacks", "≤ 1.05x (stretch 1.02x)"),
    ("bf16_ms_tags_over_native_off_via_in_process", "bf16 step, tags", "≤ 1.02x"),
    ("pair_us_512_python_over_native_off_via_in_process", "torch.empty+del 512 B, Python stacks", "≤ 1.3x"),
    ("pair_us_512_tags_over_native_off_via_in_process", "torch.empty+del 512 B, tags", "—"),
)


def recording_section(path: str) -> str:
    with open(path) as f:
        doc = json.load(f)
    m = doc["machine"]
    labels = {metric: label for metric, label, _, _ in gpu_bench.ROWS}
    allocs = [a for a in doc["allocators"] if a in doc["raw"]]
    per_repeat = ["| in one process, per repeat | " + " | ".join(allocs) + " |", "|" + "---|" * (len(allocs) + 1)]
    for metric in RECORDING_X:
        cells = [", ".join(f"{r[metric]:.3f}" for r in doc["raw"][a] if metric in r) or "—" for a in allocs]
        per_repeat.append(f"| {labels[metric]} | " + " | ".join(cells) + " |")
    t = doc.get("targets", {})
    targets = [
        "| memalloc with recording / native without | via in-process ratio | across processes | target |",
        "|---|---|---|---|",
    ]
    for key, label, goal in TARGETS:
        if key in t:
            across = t.get(key.replace("_via_in_process", ""))
            targets.append(f"| {label} | {t[key]:.3f}x | {across:.3f}x | {goal} |")
    return (
        f"Recording cost, {m['date'][:10]}, {m.get('gpu')} (driver {m.get('driver')}), torch {m['torch']}, "
        f"Python {m.get('python')} (`{os.path.relpath(path)}`), produced on the device by\n\n"
        f"    BENCH_ARGS='--repeats {doc['repeats']} --allocators native,memalloc "
        f"--groups recording' bash benchmarks/device/steps.sh build bench   # = {portable(doc['command'])}\n\n"
        "One process per allocator and repeat. Inside it, 11 rounds switch recording between off, tags "
        'and Python stacks (native: off and torch\'s `_record_memory_history(stacks="python")`); each '
        "round times 8 bf16 transformer steps and 3 x 5,000 512 B pairs per mode, and divides by the same "
        "round's \"off\" figure, so the machine's process-to-process spread cancels out of the on / off "
        "ratios. Medians over rounds, then over repeats:\n\n"
        + gpu_bench.markdown_table(doc)
        + "\n\n"
        + "\n".join(per_repeat)
        + '\n\nAgainst native without recording (issue #5\'s targets): "via in-process ratio" is '
        '(memalloc off / native off, across processes) x (memalloc on / off, in one process); "across '
        'processes" divides the medians directly and carries the spread:\n\n' + "\n".join(targets)
    )


def cpu_section(path: str) -> str:
    with open(path) as f:
        doc = json.load(f)
    comparison = doc.get("baseline")  # {"rows": [...]} from the --check comparison
    table = cpu_bench.format_table(doc["timings"]["medians"], doc["callgrind"]["workloads"], comparison)
    m = doc["machine"]
    return (
        f"CPU suite (the C++ core on the host backend, no torch), {doc['date'][:10]}, {m['cpu_model']}, "
        f"{m['nproc']} cores, {doc['compiler']} (`{os.path.relpath(path)}`):\n\n"
        f"    {portable(doc['command'])}\n\n```\n{table}\n```\n\n"
        "CI runs `python -m benchmarks cpu --check --quick`: it fails when a callgrind "
        "instructions-per-op figure rises more than 10% above `benchmarks/baselines/cpu_instructions.json`."
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks report")
    p.add_argument("--gpu", required=True)
    p.add_argument("--cpu", required=True)
    p.add_argument("--recording", default=None, help="a GPU suite run of the recording group")
    p.add_argument("--readme", default=None, help="a file whose marked section to replace")
    args = p.parse_args(argv)
    parts = [gpu_section(args.gpu)] + ([recording_section(args.recording)] if args.recording else [])
    section = START + "\n" + "\n\n".join(parts + [cpu_section(args.cpu)]) + "\n" + END
    if not args.readme:
        print(section)
        return 0
    with open(args.readme) as f:
        text = f.read()
    if START not in text or END not in text:
        raise SystemExit(f"{args.readme} has no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    with open(args.readme, "w") as f:
        f.write(head + section + tail)
    print(f"updated the Performance section of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
