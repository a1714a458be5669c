"""Leak reports for training loops: which line keeps memory that grows every
iteration, and how many bytes per iteration.

How it works. A :class:`LeakTracker` samples the allocator's live
allocations at every iteration boundary (:func:`memalloc.step`, a
:func:`memalloc.steps_of` loop, or :func:`memalloc.auto_step`). Each live
block carries the interned Python stack that allocated it and the step it
was allocated in (the allocator records both; stacks are captured without
the GIL, see csrc/boundary/pyframes.cpp), so a sample is a table of live
bytes per call site. The report then judges each call site over the steps
after ``warmup_steps`` (docs/architecture.md, "Leak rules"). A site leaks when all of these hold:

1. its floor rises: the least live bytes over the second half of the window
   is above the least over the first half (a sawtooth of late frees, e.g.
   by the garbage collector, keeps a flat floor; so do tensors kept for
   exactly one iteration and warm-up allocations that stop growing);
2. what is alive at the last sample was allocated in at least three
   different steps, and in at least a third of the first half's steps
   (allocations that die late are young; leaked ones are of every age);
3. it grows by at least ``threshold_bytes_per_step`` per step (least-squares
   slope of its live bytes; at least 1 byte).

The cache (reserved but unallocated memory) is never a leak: only live
allocations are counted.

Then the report looks for what keeps the leaked tensors alive: it finds the
torch tensors whose storage is a leaked block (``gc.get_objects``), the list,
dict, set or deque that holds most of them and that container's name (a
module global, a local of a running frame, an attribute, a closure
variable), and the line of source that adds to it (``losses.append(loss)``).
That line becomes the report's ``site``; the allocating line is kept as
``alloc_site``. Leaked blocks with no Python tensor (saved activations of an
autograd graph) are attributed to the holder whose tensors carry a graph.

The report (:class:`LeakReport`) renders as text, JSON (schema in
docs/leak-report.md) and a self-contained HTML page.
"""
from __future__ import annotations

import collections
import datetime
import gc
import json
import linecache
import os
import re
import sys
import threading
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from . import _C, _state, iteration
from ._device import DeviceLike, existing_device_index
from ._format import fmt_bytes
from ._usercode import is_internal, source_line
from .recording import STACK_MODES, stack
from .report_html import render_html
from .sites import SiteKey, frame_json, live_blocks, site_of

SCHEMA = "memalloc.leak_report/1"


def _slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


@dataclass
class _Sample:
    step: int
    allocated: int
    reserved: int
    by_stack: dict[int, tuple[int, int]]  # stack id -> (live blocks, live bytes)


class LeakTracker:
    """Samples live allocations per call site at every iteration boundary.

    Use :func:`leak_check` (a context manager) unless you need the parts::

        with memalloc.leak_check() as check:
            for batch in loader:
                train(batch)
                memalloc.step()
        print(check.report().to_text())

    While it runs, allocations are attributed to Python stacks (the stack
    mode is raised to "python" and restored afterwards).

    Args:
        device: the device to watch (None: the current one).
        warmup_steps: samples ignored at the start (optimizer state, cuDNN
            workspaces and other one-off growth), at least 0.
        threshold_bytes_per_step: smaller growth is not reported (bytes).
        allocator: the allocator to watch (default: the one
            :func:`memalloc.enable` installed); tests pass their own.
    """

    def __init__(self, device: DeviceLike = None, *, warmup_steps: int = 1,
                 threshold_bytes_per_step: int = 0, allocator: Optional[_C.Allocator] = None) -> None:
        for name, value in (("warmup_steps", warmup_steps), ("threshold_bytes_per_step", threshold_bytes_per_step)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, not {value!r}")
        self.allocator = allocator if allocator is not None else _state.installed_allocator()
        self.device = existing_device_index(device, self.allocator)
        self.warmup_steps = warmup_steps
        self.threshold_bytes_per_step = threshold_bytes_per_step
        self.samples: list[_Sample] = []
        self._lock = threading.Lock()
        self._previous_mode: Optional[int] = None
        self._running = False
        self._last_ages: dict[int, dict[int, list[int]]] = {}

    # ---- sampling ---------------------------------------------------------------
    def start(self) -> "LeakTracker":
        """Starts sampling at every :func:`memalloc.step`."""
        if self._running:
            raise RuntimeError("this LeakTracker is already running")
        self._previous_mode = _C.stack_mode()
        if self._previous_mode != STACK_MODES["python"]:
            _C.set_stack_mode(STACK_MODES["python"])
        iteration.add_step_listener(self._on_step)
        self._running = True
        return self

    def stop(self) -> None:
        """Stops sampling and restores the stack mode."""
        if not self._running:
            return
        iteration.remove_step_listener(self._on_step)
        if self._previous_mode is not None and _C.stack_mode() == STACK_MODES["python"]:
            _C.set_stack_mode(self._previous_mode)
        self._running = False

    def __enter__(self) -> "LeakTracker":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _on_step(self, n: int) -> None:
        self.sample(n)

    def sample(self, step: Optional[int] = None) -> None:
        """Takes one sample now (called at every step while running)."""
        by_stack: dict[int, list[int]] = {}
        ages: dict[int, dict[int, list[int]]] = {}
        for _addr, size, _req, stack_id, _tag, step_allocated in live_blocks(self.device, self.allocator):
            entry = by_stack.setdefault(stack_id, [0, 0])
            entry[0] += 1
            entry[1] += size
            age = ages.setdefault(stack_id, {}).setdefault(step_allocated, [0, 0])
            age[0] += 1
            age[1] += size
        s = self.allocator.stats(self.device)
        with self._lock:
            self.samples.append(_Sample(
                step=int(_C.step()) if step is None else step,
                allocated=s["allocated_bytes"]["all"]["current"], reserved=s["reserved_bytes"]["all"]["current"],
                by_stack={k: (v[0], v[1]) for k, v in by_stack.items()}))
            self._last_ages = ages  # stack id -> step allocated -> [live blocks, bytes], at the latest sample

    # ---- analysis ---------------------------------------------------------------
    def report(self, *, find_holders: bool = True) -> "LeakReport":
        """Judges every call site over the samples so far (see the module
        docstring) and, with ``find_holders``, looks for what keeps the
        leaked tensors alive."""
        with self._lock:
            samples = list(self.samples)
        notes: list[str] = []
        report = LeakReport(backend=self.allocator.backend_name, device=self.device,
                            steps=[s.step for s in samples], allocated=[s.allocated for s in samples],
                            reserved=[s.reserved for s in samples],
                            threshold_bytes_per_step=self.threshold_bytes_per_step,
                            warmup_steps=self.warmup_steps, notes=notes)
        window = samples[self.warmup_steps:]
        if len(window) < 4:
            notes.append(f"{len(samples)} steps sampled: at least warmup_steps + 4 = {self.warmup_steps + 4} "
                         "are needed to judge growth (mark iterations with memalloc.step())")
            return report
        sites = self._site_series(samples)
        live = live_blocks(self.device, self.allocator)
        half = len(window) // 2
        # A block allocated in the iteration that ended at boundary n carries step n - 1.
        first_half_steps = {s.step - 1 for s in window[:half]}
        second_half_from = window[half].step - 1
        last_step = window[-1].step
        xs = [float(s.step) for s in window]
        with self._lock:
            ages_by_stack = self._last_ages
        leaks = []
        for key, (stacks, bytes_series, count_series) in sites.items():
            ys = bytes_series[self.warmup_steps:]
            if not min(ys[half:]) > min(ys[:half]):
                continue
            ages: dict[int, list[int]] = {}  # step allocated -> [live blocks, bytes], over the site's stacks
            for sid in stacks:
                for step, (n, nbytes) in ages_by_stack.get(sid, {}).items():
                    age = ages.setdefault(step, [0, 0])
                    age[0] += n
                    age[1] += nbytes
            if len(ages) < 3 or not any(step >= second_half_from for step in ages):
                continue
            if sum(1 for step in first_half_steps if step in ages) * 3 < len(first_half_steps):
                continue
            per_step = _slope(xs, [float(y) for y in ys])
            if per_step < max(1, self.threshold_bytes_per_step):
                continue
            frames = stack(max(stacks, key=lambda sid: samples[-1].by_stack.get(sid, (0, 0))[1]))
            # Retained: what is alive from the judged steps on (not the site's
            # one-off allocations before them, e.g. a cuBLAS workspace).
            since = [s for s in ages if s >= window[0].step - 1]
            alloc = {"filename": key[0], "line": key[1], "function": key[2]}
            leaks.append(Leak(
                site=dict(alloc), code=source_line(key[0], key[1]), alloc_site=alloc, alloc_code=source_line(key[0], key[1]),
                stack=[frame_json(f) for f in frames], bytes_per_step=per_step,
                tensors_per_step=_slope(xs, [float(c) for c in count_series[self.warmup_steps:]]),
                retained_bytes=sum(ages[s][1] for s in since), retained_tensors=sum(ages[s][0] for s in since),
                first_step=min(since),
                series=bytes_series, stack_ids=sorted(stacks), last_step=last_step))
        if find_holders and leaks:
            leaks = _attribute_holders(leaks, live)
        for leak in leaks:
            leak.cause, leak.hint = _cause(leak)
        report.leaks = sorted(leaks, key=lambda l: -l.bytes_per_step)
        return report

    def _site_series(self, samples: list[_Sample]) -> dict[SiteKey, tuple[set, list[int], list[int]]]:
        """{site: (stack ids, live bytes per sample, live blocks per sample)}."""
        key_of: dict[int, SiteKey] = {}
        for s in samples:
            for sid in s.by_stack:
                if sid not in key_of:
                    key_of[sid] = site_of(sid) or ("<unknown>", 0, "<no stack>")
        out: dict[SiteKey, tuple[set, list[int], list[int]]] = {}
        for sid, key in key_of.items():
            stacks, b, c = out.setdefault(key, (set(), [0] * len(samples), [0] * len(samples)))
            stacks.add(sid)
            for i, s in enumerate(samples):
                n, nbytes = s.by_stack.get(sid, (0, 0))
                b[i] += nbytes
                c[i] += n
        return out


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
    holder: Optional[dict] = None
    cause: str = "unknown"
    hint: str = ""
    also_allocated_at: list = field(default_factory=list)  # further sites kept alive by the same holder
    stack_ids: list = field(default_factory=list)
    last_step: int = 0
    graph: bool = False  # the held tensors carry an autograd graph
    graph_extra: bool = False  # ... which keeps more memory than the tensors themselves

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in ("site", "code", "alloc_site", "alloc_code", "stack", "bytes_per_step",
                                           "tensors_per_step", "retained_bytes", "retained_tensors", "first_step",
                                           "series", "holder", "cause", "hint", "also_allocated_at")}
        return d

    def where(self) -> str:
        return f"{self.site['filename']}:{self.site['line']}"


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
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc)
                         .isoformat(timespec="seconds"))

    def bytes_per_step(self) -> float:
        """Total growth of the reported leaks, bytes per step."""
        return sum(l.bytes_per_step for l in self.leaks)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "created": self.created, "backend": self.backend, "device": self.device,
                "steps": self.steps, "allocated": self.allocated, "reserved": self.reserved,
                "threshold_bytes_per_step": self.threshold_bytes_per_step, "warmup_steps": self.warmup_steps,
                "leaks": [l.to_json() for l in self.leaks], "notes": self.notes}

    def to_json(self, path: Optional[str] = None) -> str:
        """The report as JSON (docs/leak-report.md); written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            with open(path, "w") as f:
                f.write(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str) -> "LeakReport":
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
        return cls(backend=d["backend"], device=d["device"], steps=d["steps"], allocated=d["allocated"],
                   reserved=d["reserved"], threshold_bytes_per_step=d.get("threshold_bytes_per_step", 0),
                   warmup_steps=d.get("warmup_steps", 0), leaks=leaks, notes=d.get("notes", []),
                   created=d.get("created", ""))

    def to_text(self) -> str:
        """A report for the terminal."""
        n = len(self.steps)
        head = (f"memalloc leak report: {self.backend} device {self.device}, {n} steps sampled"
                + (f" ({self.steps[0]}..{self.steps[-1]})" if n else ""))
        lines = [head]
        if not self.leaks:
            lines.append("no leaks found" if n >= self.warmup_steps + 4 else "not enough steps to judge")
        else:
            lines.append(f"{len(self.leaks)} leak(s), {fmt_bytes(self.bytes_per_step())} per step in all")
        for i, l in enumerate(self.leaks, 1):
            lines.append("")
            lines.append(f"#{i} {l.where()} in {l.site['function']}: +{fmt_bytes(l.bytes_per_step)} per step "
                         f"({l.tensors_per_step:.1f} tensors), {fmt_bytes(l.retained_bytes)} retained in "
                         f"{l.retained_tensors} tensors since step {l.first_step}")
            if l.code:
                lines.append(f"    {l.code}")
            if l.holder:
                h = l.holder
                lines.append(f"    held by {h['kind']} `{h['name']}`" + (f" ({h['length']} items)" if h.get("length")
                                                                         is not None else ""))
            if l.alloc_site != l.site:
                a = l.alloc_site
                lines.append(f"    allocated at {a['filename']}:{a['line']} in {a['function']}: {l.alloc_code}")
            for extra in l.also_allocated_at:
                lines.append(f"    also allocated at {extra['filename']}:{extra['line']}: "
                             f"+{fmt_bytes(extra['bytes_per_step'])} per step")
            if l.hint:
                lines.append(f"    hint: {l.hint}")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)

    def to_html(self, path: Optional[str] = None) -> str:
        """A self-contained HTML page (memalloc/report_html.py); written to
        ``path`` when given."""
        html = render_html(self.to_dict())
        if path is not None:
            with open(path, "w") as f:
                f.write(html)
        return html

    def __str__(self) -> str:
        return self.to_text()


# ---- who holds the leaked tensors ------------------------------------------------
_CONTAINERS = (list, dict, set, collections.deque)


def _attribute_holders(leaks: list[Leak], live: list) -> list[Leak]:
    """Fills ``holder`` and merges the leaks one container keeps alive."""
    leak_of_stack = {sid: id(leak) for leak in leaks for sid in leak.stack_ids}
    site_of_addr = {addr: leak_of_stack[sid] for addr, _size, _req, sid, _tag, _step in live if sid in leak_of_stack}
    by_leak: dict[int, list[torch.Tensor]] = collections.defaultdict(list)
    with warnings.catch_warnings():  # isinstance() wakes deprecated module attributes
        warnings.simplefilter("ignore")
        objects = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for obj in objects:
        try:
            ptr = obj.untyped_storage().data_ptr()
        except Exception:  # noqa: BLE001 - meta, sparse or otherwise storage-less tensors
            continue
        owner = site_of_addr.get(ptr)
        if owner is not None:
            by_leak[owner].append(obj)
    del objects
    holders: dict[int, tuple[Any, dict]] = {}
    for leak in leaks:
        tensors = by_leak.get(id(leak), [])
        found = _holder_of(tensors, leak)
        if found is not None:
            holders[id(leak)] = found
            leak.holder = found[1]
            leak.graph = any(t.grad_fn is not None for t in tensors)
            # A graph keeping more than the container's own tensors: saved activations (no_grad_eval).
            items = found[0].values() if isinstance(found[0], dict) else found[0]
            held = {t.untyped_storage().data_ptr(): t for t in items if isinstance(t, torch.Tensor)}
            # More blocks per step than the container gains tensors: the graph keeps activations too.
            held_per_step = len(held) / max(1, len(leak.series))
            leak.graph_extra = leak.graph and bool(held) and leak.tensors_per_step > 1.5 * held_per_step
            where = found[1].get("where_line")
            if where:
                leak.site = {"filename": where[0], "line": where[1], "function": where[2]}
                leak.code = source_line(where[0], where[1])
            found[1].pop("where_line", None)
    # Sites whose tensors no container holds: kept by the autograd graph of a held tensor.
    graph_holders = [l for l in leaks if l.holder is not None and l.graph]
    merged: list[Leak] = []
    absorbed: set[int] = set()
    if graph_holders:
        main = max(graph_holders, key=lambda l: l.bytes_per_step)
        for leak in leaks:
            if leak.holder is None:
                _absorb(main, leak)
                main.graph_extra = True
                absorbed.add(id(leak))
    # One entry per container.
    by_container: dict[int, Leak] = {}
    for leak in leaks:
        if id(leak) in absorbed:
            continue
        found = holders.get(id(leak))
        if found is None:
            merged.append(leak)
            continue
        first = by_container.get(id(found[0]))
        if first is None:
            by_container[id(found[0])] = leak
            merged.append(leak)
        else:
            _absorb(first, leak)
    return merged


def _absorb(into: Leak, other: Leak) -> None:
    into.also_allocated_at.append({**other.alloc_site, "code": other.alloc_code,
                                   "bytes_per_step": other.bytes_per_step, "retained_bytes": other.retained_bytes})
    into.bytes_per_step += other.bytes_per_step
    into.tensors_per_step += other.tensors_per_step
    into.retained_bytes += other.retained_bytes
    into.retained_tensors += other.retained_tensors
    into.first_step = min(into.first_step, other.first_step)
    into.series = [a + b for a, b in zip(into.series, other.series)]
    into.stack_ids = sorted(set(into.stack_ids) | set(other.stack_ids))


def _holder_of(tensors: list, leak: Leak) -> Optional[tuple[Any, dict]]:
    """(container, holder dict) keeping most of ``tensors``, or None."""
    counts: collections.Counter = collections.Counter()
    containers: dict[int, Any] = {}
    sample = tuple(tensors[:200])  # a tuple: not mistaken for a holder below
    ours = {id(tensors), id(containers)}
    for t in sample:
        for r in gc.get_referrers(t):
            if isinstance(r, _CONTAINERS) and not _is_namespace(r) and id(r) not in ours:
                counts[id(r)] += 1
                containers[id(r)] = r
    del sample
    if not counts:
        return None
    container = containers[counts.most_common(1)[0][0]]
    name, file, owner_kind = _name_of(container)
    kind = {list: "list", dict: "dict", set: "set", collections.deque: "deque"}.get(type(container), "other")
    holder = {"kind": kind, "name": name or f"<unnamed {kind}>", "length": len(container),
              "where": "", "code": ""}
    if kind == "dict" and container and all(isinstance(k, int) for k in container):
        holder["int_keys"] = True
    if name and file:
        line = _adding_line(file, name, kind, leak)
        if line:
            holder["where"] = f"{file}:{line[0]}"
            holder["code"] = source_line(file, line[0])
            holder["where_line"] = (file, line[0], line[1])
    holder["owner"] = owner_kind
    return container, holder


def _is_namespace(d: Any) -> bool:
    """A module's globals or an instance/class __dict__ (not a user dict)."""
    return isinstance(d, dict) and ("__name__" in d and "__builtins__" in d)


def _name_of(container: Any) -> tuple[Optional[str], Optional[str], str]:
    """(name, source file to search, "global" | "local" | "attribute" | "closure" | "")."""
    # A local (or global) of a frame that is running now (not memalloc's own).
    for frame in list(sys._current_frames().values()):
        f = frame
        while f is not None:
            if is_internal(f.f_code.co_filename):
                f = f.f_back
                continue
            for name, value in f.f_locals.items():
                if value is container:
                    return name, f.f_code.co_filename, "local" if f.f_locals is not f.f_globals else "global"
            f = f.f_back
    for r in gc.get_referrers(container):
        if isinstance(r, dict):
            for name, value in r.items():
                if value is container:
                    if _is_namespace(r) and r.get("__file__"):
                        return name, r["__file__"], "global"
                    owners = [o for o in gc.get_referrers(r) if getattr(o, "__dict__", None) is r]
                    if owners:
                        cls = type(owners[0])
                        file = sys.modules.get(cls.__module__)
                        return f"self.{name}", getattr(file, "__file__", None), "attribute"
        elif not isinstance(r, (type, types.ModuleType, types.FrameType)) and isinstance(
                getattr(r, "__dict__", None), dict):
            # An instance whose attributes live inline (CPython 3.11+): it refers to the value itself.
            for name, value in vars(r).items():
                if value is container:
                    module = sys.modules.get(type(r).__module__)
                    return f"self.{name}", getattr(module, "__file__", None), "attribute"
    for r in gc.get_referrers(container):  # a closure variable
        if type(r).__name__ == "cell":
            for fn in gc.get_referrers(r):
                if isinstance(fn, tuple):
                    for g in gc.get_referrers(fn):
                        code = getattr(g, "__code__", None)
                        if code is not None and g.__closure__ is fn:
                            i = list(fn).index(r)
                            return code.co_freevars[i], code.co_filename, "closure"
    return None, None, ""


_ADDERS = {
    "list": r"\.(?:append|extend|insert)\s*\(|\s*\+=",
    "deque": r"\.(?:append|appendleft|extend)\s*\(",
    "set": r"\.(?:add|update)\s*\(",
    "dict": r"\s*\[[^\]]*\]\s*=(?!=)|\.(?:setdefault|update)\s*\(",
    "other": r"\.(?:append|add)\s*\(",
}


def _adding_line(file: str, name: str, kind: str, leak: Leak) -> Optional[tuple[int, str]]:
    """(line, enclosing function) of the source line that adds to ``name``,
    the one nearest after the allocating line when several do."""
    base = name.split(".")[-1]
    prefix = r"\." if name.startswith("self.") else r"(?<![\w.])"
    pattern = re.compile(prefix + re.escape(base) + r"(?:" + _ADDERS.get(kind, _ADDERS["other"]) + r")")
    lines = linecache.getlines(file)
    hits = [i + 1 for i, text in enumerate(lines) if pattern.search(text) and not text.lstrip().startswith("#")]
    if not hits:
        return None
    alloc_line = leak.alloc_site["line"] if os.path.abspath(leak.alloc_site["filename"]) == os.path.abspath(file) else 0
    # Prefer a line that adds the very variable the allocating line assigned
    # (`losses.append(loss)` over `losses.append(loss.item())`), then the
    # nearest one after the allocating line.
    var = re.match(r"\s*(\w+)\s*=(?!=)", leak.alloc_code or "")
    def score(h: int) -> tuple:
        text = lines[h - 1]
        exact = bool(var) and re.search(r"[(\[=,]\s*" + re.escape(var.group(1)) + r"\s*[)\],]?\s*(#.*)?$", text)
        mentions = bool(var) and re.search(r"\b" + re.escape(var.group(1)) + r"\b(?!\.(?:item|tolist|cpu|numpy)\()",
                                           text)
        return (not exact, not mentions, h < alloc_line, abs(h - alloc_line))
    line = min(hits, key=score)
    return line, _enclosing_function(lines, line)


def _enclosing_function(lines: list[str], line: int) -> str:
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    for i in range(line - 2, -1, -1):
        text = lines[i]
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ")) and len(text) - len(stripped) < indent:
            return stripped.split("def ", 1)[1].split("(", 1)[0]
    return "<module>"


def _cause(leak: Leak) -> tuple[str, str]:
    h = leak.holder
    name = f"`{h['name']}`" if h else ""
    in_hook = any("hook" in f["name"].lower() for f in leak.stack if not is_internal(f["filename"]))
    if h and leak.graph_extra:
        return ("no_grad_eval", f"the tensors kept in {name} carry their autograd graph, saved activations "
                "included: evaluate under torch.no_grad() (or torch.inference_mode()), or keep .detach() / .item()")
    if h and leak.graph:
        return ("graph_in_container", f"each tensor kept in {name} still holds its autograd graph: keep "
                "loss.item() (a float) or loss.detach() instead")
    if in_hook:
        return ("hook_storage", "a hook stores a tensor on every call: keep .detach().cpu() copies, or clear the "
                "store each step")
    if h and h.get("int_keys"):
        return ("cache_by_step", f"{name} is keyed by step and keeps every entry: evict old keys or bound it")
    if h:
        return ("container", f"{name} gains tensors every step and never lets them go: keep only what you need "
                "(a bounded collections.deque, .item(), or clear it)")
    return ("unknown", "allocations from this line survive every step: look for references kept across "
            "iterations (lists, dicts, attributes, closures, global caches)")


# ---- the one-call API ---------------------------------------------------------------
class leak_check:
    """Context manager: tracks leaks in the block and reports at exit::

        with memalloc.leak_check() as check:
            for batch in memalloc.steps_of(loader):
                train(batch)
        check.leaks            # [] when nothing leaks (= check.report.leaks)
        print(check.to_text()) # also .to_json(path), .to_html(path), .report

    Args as :class:`LeakTracker`; ``max_bytes_per_step``: when given,
    leaving the block raises :class:`LeakError` if the reported leaks grow
    by more than that many bytes per step (for tests).
    """

    def __init__(self, device: DeviceLike = None, *, warmup_steps: int = 1, threshold_bytes_per_step: int = 0,
                 max_bytes_per_step: Optional[float] = None, allocator: Optional[_C.Allocator] = None) -> None:
        if max_bytes_per_step is not None and (isinstance(max_bytes_per_step, bool) or not isinstance(
                max_bytes_per_step, (int, float)) or not max_bytes_per_step >= 0):
            raise ValueError(f"max_bytes_per_step must be a number >= 0 (bytes) or None, not {max_bytes_per_step!r}")
        self.tracker = LeakTracker(device, warmup_steps=warmup_steps,
                                   threshold_bytes_per_step=threshold_bytes_per_step, allocator=allocator)
        self.max_bytes_per_step = max_bytes_per_step
        self.report: Optional[LeakReport] = None

    def __enter__(self) -> "leak_check":
        self.tracker.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.tracker.stop()
        self.report = self.tracker.report()
        if exc_type is None and self.max_bytes_per_step is not None \
                and self.report.bytes_per_step() > self.max_bytes_per_step:
            raise LeakError(self.report, self.max_bytes_per_step)

    # The report's API, once the block has ended.
    def _finished(self) -> LeakReport:
        if self.report is None:
            raise RuntimeError("the leak report is made when the `with memalloc.leak_check()` block ends")
        return self.report

    @property
    def leaks(self) -> list:
        """The leaks found (:class:`Leak`), largest growth first."""
        return self._finished().leaks

    def to_text(self) -> str:
        return self._finished().to_text()

    def to_json(self, path: Optional[str] = None) -> str:
        return self._finished().to_json(path)

    def to_html(self, path: Optional[str] = None) -> str:
        return self._finished().to_html(path)


class LeakError(AssertionError):
    """A checked loop leaked more than allowed; ``report`` says where."""

    def __init__(self, report: LeakReport, limit: float) -> None:
        self.report = report
        super().__init__(f"the loop leaks {fmt_bytes(report.bytes_per_step())} per step "
                         f"(allowed: {fmt_bytes(limit)})\n{report.to_text()}")
