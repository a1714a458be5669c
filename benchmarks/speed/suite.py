"""GPU suite: memalloc against native, native expandable segments,
cudaMallocAsync and RMM, side by side in one run.

Each (allocator, group) pair runs in its own process (benchmarks/speed/worker.py)
because the allocator is per process. Within each group the allocators run
back to back, and their order rotates (and reverses) from repeat to repeat so
that drift on a noisy machine does not favour one of them. Every figure is the
median over repeats; ratios are to native from the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from .worker import ALLOCATORS, DEFAULT_ALLOCATORS, GROUPS, PAIR_SIZES, RECORDING_MODES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GiB = 1 << 30

# (metric, label, unit, lower_is_better); the table benchmarks/report/tables.py renders shows these rows.
ROWS = [
    *[
        (f"pair_us_{n}", f"torch.empty+del {label}", "µs", True)
        for n, label in zip(PAIR_SIZES, ("512 B", "64 KiB", "1 MiB", "16 MiB", "256 MiB"))
    ],
    ("random_ns_per_op", "random workload, per alloc+free", "ns", True),
    ("random_reserved_over_allocated", "random workload, peak reserved / peak allocated", "x", True),
    ("random_device_used", "random workload, device used at end", "GiB", True),
    ("transformer_fp32_ms", "transformer step fp32", "ms", True),
    ("transformer_bf16_ms", "transformer step bf16 autocast", "ms", True),
    ("transformer_fp32_device_used", "transformer fp32, device used", "GiB", True),
    ("transformer_fp32_peak_allocated", "transformer fp32, peak allocated", "GiB", True),
    ("resnet50_ms", "ResNet-50 step (batch 64, fp32)", "ms", True),
    ("resnet50_device_used", "ResNet-50, device used", "GiB", True),
    # The recording group: one process per allocator, recording switched per
    # round (worker.run_recording). "Python stacks" under native is
    # torch's _record_memory_history(stacks="python").
    ("rec_bf16_ms_off", "bf16 step, recording off (recording group)", "ms", True),
    ("rec_bf16_ms_tags", "bf16 step, recording with tags", "ms", True),
    ("rec_bf16_ms_python", "bf16 step, recording with Python stacks", "ms", True),
    ("rec_bf16_ms_x_tags", "bf16 step, tags on / off in one process", "x", True),
    ("rec_bf16_ms_x_python", "bf16 step, Python stacks on / off in one process", "x", True),
    ("rec_pair_us_512_off", "torch.empty+del 512 B, recording off", "µs", True),
    ("rec_pair_us_512_tags", "torch.empty+del 512 B, recording with tags", "µs", True),
    ("rec_pair_us_512_python", "torch.empty+del 512 B, recording with Python stacks", "µs", True),
    ("rec_pair_us_512_x_tags", "torch.empty+del 512 B, tags on / off in one process", "x", True),
    ("rec_pair_us_512_x_python", "torch.empty+del 512 B, Python stacks on / off in one process", "x", True),
]
# Rows whose cells are already ratios inside one process: no ratio to native.
IN_PROCESS_RATIOS = {m for m, _, unit, _ in ROWS if m.startswith("rec_") and unit == "x"}


def rmm_available() -> tuple[bool, str]:
    proc = subprocess.run(
        [sys.executable, "-c", "import rmm, rmm.allocators.torch"], capture_output=True, text=True, timeout=120
    )
    if proc.returncode == 0:
        return True, ""
    last = (proc.stderr.strip().splitlines() or ["import failed"])[-1]
    return False, f"rmm not importable ({last}); carry rmm-cu13, librmm-cu13 and rapids-logger wheels to include it"


def run_worker(alloc: str, group: str, timeout: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed.worker", alloc, group],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:300]
        return {"error": f"exit {proc.returncode}: {tail}", "wall_s": wall}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def order_for(allocators: list[str], repeat: int) -> list[str]:
    k = repeat % len(allocators)
    rotated = allocators[k:] + allocators[:k]
    return rotated[::-1] if repeat % 2 else rotated


def medians(raw: dict) -> dict:
    """{alloc: {metric: median over repeats}} (metrics present in every repeat)."""
    out = {}
    for alloc, runs in raw.items():
        metrics: dict[str, list[float]] = {}
        for run in runs:
            for k, v in run.items():
                if isinstance(v, (int, float)) and k != "wall_s":
                    metrics.setdefault(k, []).append(v)
        out[alloc] = {k: statistics.median(v) for k, v in metrics.items()}
    return out


def ratios(med: dict, baseline: str = "native") -> dict:
    base = med.get(baseline, {})
    return {alloc: {k: v / base[k] for k, v in m.items() if base.get(k)} for alloc, m in med.items()}


def fmt(metric_unit: str, v: float | None) -> str:
    if v is None:
        return "—"
    if metric_unit == "GiB":
        return f"{v / GiB:.2f}"
    if metric_unit == "x":
        return f"{v:.2f}"
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


def markdown_table(doc: dict) -> str:
    allocs = [a for a in doc["allocators"] if a in doc["medians"]]
    head = "| case | unit | " + " | ".join(allocs) + " |"
    lines = [head, "|" + "---|" * (len(allocs) + 2)]
    for metric, label, unit, _ in ROWS:
        cells = []
        for a in allocs:
            v = doc["medians"][a].get(metric)
            r = doc["ratios"].get(a, {}).get(metric)
            cell = fmt(unit, v)
            if v is not None and r is not None and a != "native" and metric not in IN_PROCESS_RATIOS:
                cell += f" ({r:.2f}x)"
            cells.append(cell)
        if any(c != "—" for c in cells):
            lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recording_targets(med: dict) -> dict:
    """memalloc with recording against native without it (issue #5's
    targets), two ways: across processes (medians of the recording group's
    times; carries the machine's process-to-process spread) and as
    (memalloc off / native off across processes) x (on / off inside
    memalloc's process)."""
    m, n = med.get("memalloc", {}), med.get("native", {})
    out = {}
    for metric in ("bf16_ms", "pair_us_512"):
        off_m, off_n = m.get(f"rec_{metric}_off"), n.get(f"rec_{metric}_off")
        for mode in ("tags", "python"):
            on = m.get(f"rec_{metric}_{mode}")
            if on and off_n:
                out[f"{metric}_{mode}_over_native_off"] = on / off_n
            x = m.get(f"rec_{metric}_x_{mode}")
            if x and off_m and off_n:
                out[f"{metric}_{mode}_over_native_off_via_in_process"] = off_m / off_n * x
        hist = n.get(f"rec_{metric}_x_python")
        if hist:
            out[f"{metric}_native_history_x"] = hist
    return out


def machine() -> dict:
    import torch

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        drivers = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        info["driver"] = drivers[0] if drivers else None  # one line per GPU
        info["gpus"] = len(drivers)
    except (OSError, subprocess.SubprocessError):
        info["driver"] = None
    return info


def main(argv, command: str | None = None) -> int:
    if command is None:
        command = "python -m benchmarks gpu " + " ".join(argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks gpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--allocators", default=",".join(DEFAULT_ALLOCATORS), help=f"comma-separated, from {','.join(ALLOCATORS)}"
    )
    p.add_argument("--groups", default=",".join(GROUPS))
    p.add_argument("--timeout", type=int, default=300, help="seconds per worker process")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<date>-gpu-bench.json)")
    args = p.parse_args(argv)
    allocators = [a for a in args.allocators.split(",") if a]
    groups = [g for g in args.groups.split(",") if g]
    notes = []
    if "rmm" in allocators:
        ok, why = rmm_available()
        if not ok:
            allocators.remove("rmm")
            notes.append(why)
    raw: dict[str, list[dict]] = {a: [] for a in allocators}
    errors = []
    t_start = time.perf_counter()
    for r in range(args.repeats):
        for group in groups:
            for alloc in order_for(allocators, r):
                if (group == "recording" and alloc not in RECORDING_MODES) or (
                    group == "call_sites" and alloc != "memalloc"
                ):
                    continue
                res = run_worker(alloc, group, args.timeout)
                print(
                    f"repeat {r + 1}/{args.repeats} {group:<12} {alloc:<16} {res['wall_s']:.1f}s"
                    + (f"  ERROR {res['error']}" if "error" in res else ""),
                    flush=True,
                )
                if "error" in res:
                    errors.append({"repeat": r, "group": group, "allocator": alloc, "error": res["error"]})
                    continue
                res["group"] = group
                raw[alloc].append(res)
    med = medians(raw)
    doc = {
        "machine": machine(),
        "command": command,
        "repeats": args.repeats,
        "allocators": allocators,
        "groups": groups,
        "notes": notes,
        "errors": errors,
        "medians": med,
        "ratios": ratios(med),
        "raw": raw,
        "wall_s": time.perf_counter() - t_start,
    }
    doc["targets"] = recording_targets(med)
    doc["table_markdown"] = markdown_table(doc)
    out = args.out or os.path.join(REPO, "benchmarks", "results", f"{doc['machine']['date'][:10]}-gpu-bench.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print()
    print(doc["table_markdown"])
    for n in notes:
        print("note:", n)
    print(f"wrote {out} ({doc['wall_s']:.0f} s)")
    return 1 if errors else 0
