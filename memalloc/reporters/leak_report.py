"""The leak report's types and renderings: :class:`Leak` (one leaking call
site), :class:`LeakReport` (what a tracker found: text, JSON per
docs/leak-report.md, self-contained HTML) and :class:`LeakError`. Plain data:
nothing here reads the allocator; memalloc/features/leaks.py fills them.

One meaning per method name: ``to_dict()`` is the JSON object as a dict,
``to_json(path=None)`` the JSON text (also written to ``path``),
``to_html(path=None)`` and ``to_text()`` likewise.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field

from memalloc.core._format import fmt_bytes
from memalloc.reporters.notebook import leak_report_html
from memalloc.reporters.report_html import render_html

SCHEMA = "memalloc.leak_report/1"


@dataclass
class Leak:
    """One leaking call site (or one holder and the sites it keeps alive).
    Sizes in bytes; see docs/leak-report.md for each field."""

    site: dict
    code: str
    alloc_site: dict
    alloc_code: str
    stack: list
    bytes_per_step: float
    tensors_per_step: float
    retained_bytes: int
    retained_tensors: int
    first_step: int
    series: list
    holder: dict | None = None
    cause: str = "unknown"
    hint: str = ""
    also_allocated_at: list = field(default_factory=list)  # further sites kept alive by the same holder
    stack_ids: list = field(default_factory=list)
    last_step: int = 0
    graph: bool = False  # the held tensors carry an autograd graph
    graph_extra: bool = False  # ... which keeps more memory than the tensors themselves

    def to_dict(self) -> dict:
        """The leak as docs/leak-report.md's JSON object."""
        d = {
            k: getattr(self, k)
            for k in (
                "site",
                "code",
                "alloc_site",
                "alloc_code",
                "stack",
                "bytes_per_step",
                "tensors_per_step",
                "retained_bytes",
                "retained_tensors",
                "first_step",
                "series",
                "holder",
                "cause",
                "hint",
                "also_allocated_at",
            )
        }
        return d

    def where(self) -> str:
        return f"{self.site['filename']}:{self.site['line']}"

    def __repr__(self) -> str:
        return (
            f"<memalloc Leak at {self.where()}: +{fmt_bytes(self.bytes_per_step)}/step, "
            f"{fmt_bytes(self.retained_bytes)} retained in {self.retained_tensors} tensors>"
        )


@dataclass
class LeakReport:
    """What :meth:`LeakTracker.report` found. ``leaks`` is sorted by bytes
    per step, largest first."""

    backend: str
    device: int
    steps: list
    allocated: list
    reserved: list
    threshold_bytes_per_step: int = 0
    warmup_steps: int = 1
    leaks: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    boundaries: str = ""  # which sources marked the steps, e.g. "24 from optimizer.step()"
    created: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )

    def bytes_per_step(self) -> float:
        """Total growth of the reported leaks, bytes per step."""
        return sum(l.bytes_per_step for l in self.leaks)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "created": self.created,
            "backend": self.backend,
            "device": self.device,
            "steps": self.steps,
            "allocated": self.allocated,
            "reserved": self.reserved,
            "threshold_bytes_per_step": self.threshold_bytes_per_step,
            "warmup_steps": self.warmup_steps,
            "leaks": [l.to_dict() for l in self.leaks],
            "notes": self.notes,
            "boundaries": self.boundaries,
        }

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON (docs/leak-report.md); written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str) -> LeakReport:
        """Reads a report written by :meth:`to_json` (a path or the text)."""
        text = text_or_path
        if not text_or_path.lstrip().startswith("{"):
            with open(text_or_path) as f:
                text = f.read()
        d = json.loads(text)
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a memalloc leak report (schema {d.get('schema')!r}, expected {SCHEMA!r})")
        known = {f for f in Leak.__dataclass_fields__}
        leaks = [Leak(**{k: v for k, v in l.items() if k in known}) for l in d["leaks"]]
        return cls(
            backend=d["backend"],
            device=d["device"],
            steps=d["steps"],
            allocated=d["allocated"],
            reserved=d["reserved"],
            threshold_bytes_per_step=d.get("threshold_bytes_per_step", 0),
            warmup_steps=d.get("warmup_steps", 0),
            leaks=leaks,
            notes=d.get("notes", []),
            boundaries=d.get("boundaries", ""),
            created=d.get("created", ""),
        )

    def to_text(self) -> str:
        """A report for the terminal."""
        n = len(self.steps)
        head = (
            f"memalloc leak report: {self.backend} device {self.device}, {n} steps sampled"
            + (f" ({self.steps[0]}..{self.steps[-1]})" if n else "")
            + (f"; boundaries: {self.boundaries}" if self.boundaries else "")
        )
        lines = [head]
        if not self.leaks:
            lines.append("no leaks found" if n >= self.warmup_steps + 4 else "not enough steps to judge")
        else:
            lines.append(f"{len(self.leaks)} leak(s), {fmt_bytes(self.bytes_per_step())} per step in all")
        for i, l in enumerate(self.leaks, 1):
            lines.append("")
            lines.append(
                f"#{i} {l.where()} in {l.site['function']}: +{fmt_bytes(l.bytes_per_step)} per step "
                f"({l.tensors_per_step:.1f} tensors), {fmt_bytes(l.retained_bytes)} retained in "
                f"{l.retained_tensors} tensors since step {l.first_step}"
            )
            if l.code:
                lines.append(f"    {l.code}")
            if l.holder:
                h = l.holder
                if h["kind"] == "optimizer":
                    size = f" ({h['length']} parameter groups, {h.get('added_groups', 0)} added during the check)"
                else:
                    size = f" ({h['length']} items)" if h.get("length") is not None else ""
                lines.append(f"    held by {h['kind']} `{h['name']}`{size}")
            if l.alloc_site != l.site:
                a = l.alloc_site
                lines.append(f"    allocated at {a['filename']}:{a['line']} in {a['function']}: {l.alloc_code}")
            for extra in l.also_allocated_at:
                lines.append(
                    f"    also allocated at {extra['filename']}:{extra['line']}: "
                    f"+{fmt_bytes(extra['bytes_per_step'])} per step"
                )
            if l.hint:
                lines.append(f"    hint: {l.hint}")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)

    def to_html(self, path: str | None = None) -> str:
        """A self-contained HTML page (memalloc/reporters/report_html.py); written to
        ``path`` when given."""
        html = render_html(self.to_dict())
        if path is not None:
            with open(path, "w") as f:
                f.write(html)
        return html

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        n = len(self.leaks)
        what = (
            f"{n} leak{'s' * (n != 1)}, +{fmt_bytes(self.bytes_per_step())}/step (largest at {self.leaks[0].where()})"
            if n
            else "no leaks"
        )
        return f"<memalloc LeakReport {self.backend} device {self.device}, {len(self.steps)} steps: {what}>"

    def _repr_html_(self) -> str:
        """What Jupyter shows (memalloc/reporters/notebook.py renders it)."""
        return leak_report_html(self.to_dict())


class LeakError(AssertionError):
    """A checked loop leaked more than allowed; ``report`` says where."""

    def __init__(self, report: LeakReport, limit: float) -> None:
        self.report = report
        super().__init__(
            f"the loop leaks {fmt_bytes(report.bytes_per_step())} per step "
            f"(allowed: {fmt_bytes(limit)})\n{report.to_text()}"
        )
