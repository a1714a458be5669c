"""Renderings of a step tracker's rows (memalloc/features/tracker.py): CSV
text, a PNG plot and a few lines of summary. A row is a dict of bytes,
seconds and counts per boundary (``step``, ``time_s``, ``allocated``,
``reserved``, ``peak_allocated``, ``peak_reserved``, ``device_used``,
``device_total``, ``num_ooms`` and ``peak_<category>``); nothing here reads
the allocator, so rows read back from ``steps.json`` render the same."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from typing import Any, Union

from memalloc.core._format import describe_split, fmt_bytes

PathLike = Union[str, "os.PathLike[str]"]
Row = dict[str, Any]


def to_csv(rows: Sequence[Row], fields: Sequence[str]) -> str:
    """The rows as CSV text: a header of ``fields``, one line per row."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def plot(rows: Sequence[Row], path: PathLike, title: str) -> None:
    """Writes to ``path`` a PNG of allocated and reserved bytes at each
    boundary and the peak allocated within each step (MiB) over the steps.
    Needs matplotlib (ImportError saying ``pip install matplotlib``) and at
    least one row (ValueError)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        raise ImportError(
            "StepTracker.plot needs matplotlib, which is not installed: "
            "pip install matplotlib (to_csv and to_json need nothing)"
        ) from e
    if not rows:
        raise ValueError("StepTracker.plot: no rows yet: call memalloc.step() or record_row() while it runs")
    steps = [r["step"] for r in rows]
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)  # draws without pyplot: no global backend or figure state
    ax = fig.add_subplot()
    for key, label, style in (
        ("peak_allocated", "peak allocated in step", ":"),
        ("allocated", "allocated at step end", "-"),
        ("reserved", "reserved at step end", "--"),
    ):
        ax.plot(steps, [r[key] / 2**20 for r in rows], style, marker=".", label=label)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)


def summary(rows: Sequence[Row], head: str, categories: Sequence[str]) -> str:
    """A few lines of text under ``head``: steps covered, allocated growth
    per step, the highest peak within a step and its split by
    ``categories`` (the rows' ``peak_<category>`` bytes), reserved and
    device use, OOMs."""
    if not rows:
        return f"{head}: no rows yet"
    first, last = rows[0], rows[-1]
    n = len(rows)
    growth = (last["allocated"] - first["allocated"]) / (n - 1) if n > 1 else 0.0
    peak = max(rows, key=lambda r: r["peak_allocated"])
    peak_r = max(rows, key=lambda r: r["peak_reserved"])
    used = max(r["device_used"] for r in rows)
    ooms = [r for r in rows if r["num_ooms"]]
    sign = "+" if growth >= 0 else "-"
    lines = [
        f"{head}: {n} steps ({first['step']}..{last['step']}) in {last['time_s']:.3f} s",
        f"  allocated at step end: {fmt_bytes(first['allocated'])} -> {fmt_bytes(last['allocated'])} "
        f"({sign}{fmt_bytes(abs(growth))}/step)",
        f"  peak allocated in a step: {fmt_bytes(peak['peak_allocated'])} (step {peak['step']})",
        f"  reserved at step end: {fmt_bytes(last['reserved'])}; peak in a step: "
        f"{fmt_bytes(peak_r['peak_reserved'])} (step {peak_r['step']})",
        f"  device used: up to {fmt_bytes(used)} of {fmt_bytes(last['device_total'])}",
        f"  OOMs: {sum(r['num_ooms'] for r in ooms)}"
        + (f" (steps {', '.join(str(r['step']) for r in ooms)})" if ooms else ""),
    ]
    split = describe_split({c: peak[f"peak_{c}"] for c in categories})
    if split:
        lines.append(f"  at that peak: {split}")
    return "\n".join(lines)


__all__ = ["plot", "summary", "to_csv"]
