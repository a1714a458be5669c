"""Renderings of replays (memalloc/features/replay.py) and of the smallest
device search: a text table per (workload, config, device), a text table
per step, and the JSON of ``python -m memalloc replay --json``. They take
the plain dicts of ``ReplayResult.to_dict()`` and ``StepReplay.to_dict()``
(sizes in bytes)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Union

from memalloc.core._format import fmt_bytes

PathLike = Union[str, "os.PathLike[str]"]

_COLUMNS = ("workload", "config", "device", "peak allocated", "peak reserved", "reserved/allocated", "OOMs")


def results_table(results: Sequence[dict]) -> str:
    """A text table: one row per (workload, config, device) of ``results``
    (``ReplayResult.to_dict()`` each)."""
    rows = [_COLUMNS]
    for r in results:
        for d in r["devices"]:
            rows.append(
                (
                    r["source"],
                    r["config"] or "(default)",
                    str(d["device"]),
                    fmt_bytes(d["peak_allocated"]),
                    fmt_bytes(d["peak_reserved"]),
                    "-" if d["ratio"] is None else f"{d['ratio']:.4f}",
                    str(d["ooms"]),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def steps_table(rows: Sequence[dict]) -> str:
    """A text table of a step-by-step replay (``StepReplay.to_dict()`` each),
    one line per step (the recording run's own moves too when the trace has
    any)."""
    live = any(r["recorded_maps"] or r["recorded_unmaps"] for r in rows)
    lines = []
    for r in rows:
        ratio = r["peak_reserved"] / r["peak_allocated"] if r["peak_allocated"] else 0.0
        lines.append(
            f"step {r['step']:>4}: {r['maps']:>4} mapped {r['unmaps']:>4} unmapped  "
            f"reserved {fmt_bytes(r['reserved']):>10}  peak reserved / allocated {ratio:.4f}"
            + (f"  (recorded run: {r['recorded_maps']} mapped {r['recorded_unmaps']} unmapped)" if live else "")
        )
    return "\n".join(lines) + "\n"


def results_to_json(
    results: Sequence[dict],
    path: PathLike | None = None,
    command: str | None = None,
    smallest_device_mb: dict | None = None,
    per_step: dict | None = None,
) -> str:
    """``{"command": command, "results": results}`` as JSON text (plus
    ``"smallest_device_mb": {source: {config: MiB}}`` and ``"per_step":
    {source: {config: {device: [step dicts]}}}`` when given), also written to
    ``path`` when given."""
    data: dict = {"command": command, "results": list(results)}
    if smallest_device_mb:
        data["smallest_device_mb"] = smallest_device_mb
    if per_step:
        data["per_step"] = per_step
    text = json.dumps(data, indent=2) + "\n"
    if path is not None:
        with open(path, "w") as f:
            f.write(text)
    return text


__all__ = ["results_table", "results_to_json", "steps_table"]
