"""Leak reports for training loops: which line keeps memory that grows every
iteration, and how many bytes per iteration.

How it works. A :class:`LeakTracker` samples the allocator's live
allocations at every iteration boundary (:func:`memalloc.step`, a
:func:`memalloc.steps_of` loop, :func:`memalloc.auto_step`, or, when the
code marks none, ``optimizer.step()``: see memalloc/core/iteration.py). Each live
block carries the interned Python stack that allocated it and the step it
was allocated in (the allocator records both; stacks are captured without
the GIL, see csrc/boundary/callers/pyframes.cpp), so a sample is a table of live
bytes per call site. The report then judges each call site over the steps
after ``warmup_steps`` (docs/architecture.md, "Leak rules"). A site leaks when all of these hold:

1. its floor rises: the least live bytes over the second half of the window
   is above the least over the first half (a sawtooth of late frees, e.g.
   by the garbage collector, keeps a flat floor; so do tensors kept for
   exactly one iteration and warm-up allocations that stop growing);
2. what is alive at the last sample was allocated in at least three
   different steps, and in at least a third of the first half's steps
   (allocations that die late are young; leaked ones are of every age);
3. it grows by at least ``threshold_bytes_per_step`` per step (at least 1
   byte): the least-squares slope of its live bytes, or, where that slope
   drowns in the noise of the line's other blocks (outputs whose shapes
   vary), the bytes alive now that the judged iterations before the last
   allocated, per iteration.

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

The report (:class:`LeakReport`, memalloc/reporters/leak_report.py) renders as text,
JSON (schema in docs/leak-report.md) and a self-contained HTML page; the
holder search is memalloc/features/holders.py. This module holds the tracker and the
rules.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from memalloc import _C
from memalloc.core import _state, iteration
from memalloc.core._checks import check_int
from memalloc.core._config import STACK_MODES
from memalloc.core._device import DeviceLike, existing_device_index
from memalloc.core._usercode import is_internal, source_line
from memalloc.features.holders import attribute_holders, optimizer_groups
from memalloc.reporters.leak_report import Leak, LeakError, LeakReport
from memalloc.trace.recording import stack
from memalloc.trace.sites import SiteKey, live_blocks, live_size_stack_step, site_of


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
                train(batch)       # optimizer.step() marks the iterations ...
                memalloc.step()    # ... unless the code marks them itself
        print(check.report().to_text())

    While it runs, allocations are attributed to Python stacks (the stack
    mode is raised to "python" and restored afterwards), and
    ``optimizer.step()`` marks the iteration boundaries until the first
    explicit :func:`memalloc.step` (the report's ``boundaries`` says which
    were used).

    Args:
        device: the device to watch (None: the current one).
        warmup_steps: samples ignored at the start (optimizer state, cuDNN
            workspaces and other one-off growth), at least 0.
        threshold_bytes_per_step: smaller growth is not reported (bytes).
        allocator: the allocator to watch (default: the one
            :func:`memalloc.enable` installed); tests pass their own.
    """

    def __init__(
        self,
        device: DeviceLike = None,
        *,
        warmup_steps: int = 1,
        threshold_bytes_per_step: int = 0,
        allocator: _C.Allocator | None = None,
    ) -> None:
        check_int("warmup_steps", warmup_steps, 0)
        check_int("threshold_bytes_per_step", threshold_bytes_per_step, 0)
        self.allocator = _state.allocator_or_installed(allocator)
        self.device = existing_device_index(device, self.allocator)
        self.warmup_steps = warmup_steps
        self.threshold_bytes_per_step = threshold_bytes_per_step
        self.samples: list[_Sample] = []
        self._lock = threading.Lock()
        self._previous_mode: int | None = None
        self._running = False
        self._last_ages: dict[int, dict[int, list[int]]] = {}
        self._counts_at_start: dict[str, int] = {}
        self._counts_at_stop: dict[str, int] | None = None
        self._groups_at_start: dict[int, int] = {}

    # ---- sampling ---------------------------------------------------------------
    def start(self) -> LeakTracker:
        """Starts sampling at every :func:`memalloc.step`."""
        if self._running:
            raise RuntimeError("this LeakTracker is already running")
        self._previous_mode = _C.stack_mode()
        if self._previous_mode != STACK_MODES["python"]:
            _C.set_stack_mode(STACK_MODES["python"])
        iteration.add_step_listener(self._on_step)
        self._counts_at_start, self._counts_at_stop = iteration.boundary_counts(), None
        # what each optimizer holds now is not the check's (holders.py: an
        # optimizer holds a leak through the parameter groups added since)
        self._groups_at_start = optimizer_groups()
        iteration.want_boundaries()
        self._running = True
        return self

    def stop(self) -> None:
        """Stops sampling and restores the stack mode."""
        if not self._running:
            return
        iteration.remove_step_listener(self._on_step)
        iteration.release_boundaries()
        self._counts_at_stop = iteration.boundary_counts()
        if self._previous_mode is not None and _C.stack_mode() == STACK_MODES["python"]:
            _C.set_stack_mode(self._previous_mode)
        self._running = False

    def __enter__(self) -> LeakTracker:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _on_step(self, n: int) -> None:
        self.sample(n)

    def sample(self, step: int | None = None) -> None:
        """Takes one sample now (called at every step while running)."""
        # One pass keyed by (stack, step allocated), a few hundred keys for
        # thousands of blocks; the per-stack totals are summed from those.
        cells: dict[tuple[int, int], list[int]] = {}
        for size, stack_id, step_allocated in live_size_stack_step(self.device, self.allocator):
            cell = cells.get((stack_id, step_allocated))
            if cell is None:
                cells[stack_id, step_allocated] = [1, size]
            else:
                cell[0] += 1
                cell[1] += size
        by_stack: dict[int, list[int]] = {}
        ages: dict[int, dict[int, list[int]]] = {}
        for (stack_id, step_allocated), cell in cells.items():
            entry = by_stack.setdefault(stack_id, [0, 0])
            entry[0] += cell[0]
            entry[1] += cell[1]
            ages.setdefault(stack_id, {})[step_allocated] = cell
        s = self.allocator.stats(self.device)
        with self._lock:
            self.samples.append(
                _Sample(
                    step=int(_C.step()) if step is None else step,
                    allocated=s["allocated_bytes"]["all"]["current"],
                    reserved=s["reserved_bytes"]["all"]["current"],
                    by_stack={k: (v[0], v[1]) for k, v in by_stack.items()},
                )
            )
            self._last_ages = ages  # stack id -> step allocated -> [live blocks, bytes], at the latest sample

    # ---- analysis ---------------------------------------------------------------
    def report(self, *, find_holders: bool = True) -> LeakReport:
        """Judges every call site over the samples so far (see the module
        docstring) and, with ``find_holders``, looks for what keeps the
        leaked tensors alive."""
        with self._lock:
            samples = list(self.samples)
        notes: list[str] = []
        report = LeakReport(
            backend=self.allocator.backend_name,
            device=self.device,
            steps=[s.step for s in samples],
            allocated=[s.allocated for s in samples],
            reserved=[s.reserved for s in samples],
            threshold_bytes_per_step=self.threshold_bytes_per_step,
            warmup_steps=self.warmup_steps,
            notes=notes,
            boundaries=iteration.describe_boundaries(
                self._counts_at_start, self._counts_at_stop or iteration.boundary_counts()
            ),
        )
        window = samples[self.warmup_steps :]
        if len(window) < 4:
            notes.append(
                f"{len(samples)} steps sampled: at least warmup_steps + 4 = {self.warmup_steps + 4} "
                "are needed to judge growth (iterations are marked by optimizer.step(), or by "
                "memalloc.step() where the code has no optimizer)"
            )
            return report
        sites = self._site_series(samples)
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
            ys = bytes_series[self.warmup_steps :]
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
            # The growth the surviving blocks show: bytes alive now that the
            # judged iterations before the last allocated, per iteration. It
            # stands where the series' slope drowns in the noise of the
            # line's other blocks (a loop's outputs whose shapes vary).
            kept_before_last = sum(
                nbytes for step, (_n, nbytes) in ages.items() if window[0].step - 1 <= step < last_step - 1
            )
            per_step = max(per_step, kept_before_last / max(1, last_step - window[0].step))
            if per_step < max(1, self.threshold_bytes_per_step):
                continue
            frames = stack(max(stacks, key=lambda sid: samples[-1].by_stack.get(sid, (0, 0))[1]))
            # Retained: what is alive from the judged steps on (not the site's
            # one-off allocations before them, e.g. a cuBLAS workspace).
            since = [s for s in ages if s >= window[0].step - 1]
            alloc = {"filename": key[0], "line": key[1], "function": key[2]}
            leaks.append(
                Leak(
                    site=dict(alloc),
                    code=source_line(key[0], key[1]),
                    alloc_site=alloc,
                    alloc_code=source_line(key[0], key[1]),
                    stack=[f.to_dict() for f in frames],
                    bytes_per_step=per_step,
                    tensors_per_step=_slope(xs, [float(c) for c in count_series[self.warmup_steps :]]),
                    retained_bytes=sum(ages[s][1] for s in since),
                    retained_tensors=sum(ages[s][0] for s in since),
                    first_step=min(since)
                    + 1,  # a block stamped s was allocated in the step that ends at boundary s + 1
                    series=bytes_series,
                    stack_ids=sorted(stacks),
                    last_step=last_step,
                )
            )
        if find_holders and leaks:
            leaks = attribute_holders(leaks, live_blocks(self.device, self.allocator), self._groups_at_start)
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


def _cause(leak: Leak) -> tuple[str, str]:
    h = leak.holder
    name = f"`{h['name']}`" if h else ""
    in_hook = bool(h and h.get("in_hook")) or any(
        "hook" in f["name"].lower() for f in leak.stack if not is_internal(f["filename"])
    )
    if h and h["kind"] == "optimizer":
        return (
            "optimizer_state",
            f"{name} gains a parameter group every step and keeps its parameters, their "
            f"gradients and their state: make the parameters once, before the loop, or take the old groups "
            f"out of {h['name']}.param_groups and {h['name']}.state",
        )
    if h and leak.graph_extra:
        return (
            "no_grad_eval",
            f"the tensors kept in {name} carry their autograd graph, saved activations "
            "included: evaluate under torch.no_grad() (or torch.inference_mode()), or keep .detach() / .item()",
        )
    if h and leak.graph:
        # A single number (a loss) reads as a float; anything larger (logits,
        # outputs) is a tensor to detach.
        keep = (
            "loss.item() (a float) or loss.detach()"
            if h.get("scalars", True)
            else "t.detach() (or t.detach().cpu(), or only the figure you need: t.argmax(-1), t.mean().item())"
        )
        return ("graph_in_container", f"each tensor kept in {name} still holds its autograd graph: keep {keep} instead")
    if in_hook:
        return (
            "hook_storage",
            "a hook stores a tensor on every call: keep .detach().cpu() copies, or clear the store each step",
        )
    if h and h.get("int_keys"):
        return ("cache_by_step", f"{name} is keyed by step and keeps every entry: evict old keys or bound it")
    if h:
        return (
            "container",
            f"{name} gains tensors every step and never lets them go: keep only what you need "
            "(a bounded collections.deque, .item(), or clear it)",
        )
    return (
        "unknown",
        "allocations from this line survive every step: look for references kept across "
        "iterations (lists, dicts, attributes, closures, global caches)",
    )


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

    def __init__(
        self,
        device: DeviceLike = None,
        *,
        warmup_steps: int = 1,
        threshold_bytes_per_step: int = 0,
        max_bytes_per_step: float | None = None,
        allocator: _C.Allocator | None = None,
    ) -> None:
        if max_bytes_per_step is not None and (
            isinstance(max_bytes_per_step, bool)
            or not isinstance(max_bytes_per_step, (int, float))
            or not max_bytes_per_step >= 0
        ):
            raise ValueError(f"max_bytes_per_step must be a number >= 0 (bytes) or None, not {max_bytes_per_step!r}")
        self.tracker = LeakTracker(
            device, warmup_steps=warmup_steps, threshold_bytes_per_step=threshold_bytes_per_step, allocator=allocator
        )
        self.max_bytes_per_step = max_bytes_per_step
        self.report: LeakReport | None = None

    def __enter__(self) -> leak_check:
        self.tracker.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.tracker.stop()
        self.report = self.tracker.report()
        if (
            exc_type is None
            and self.max_bytes_per_step is not None
            and self.report.bytes_per_step() > self.max_bytes_per_step
        ):
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

    def to_json(self, path: str | None = None) -> str:
        return self._finished().to_json(path)

    def to_html(self, path: str | None = None) -> str:
        return self._finished().to_html(path)

    def __repr__(self) -> str:
        if self.report is None:
            return f"<memalloc.leak_check {'running' if self.tracker._running else 'not started'}: no report yet>"
        return f"<memalloc.leak_check: {repr(self.report)[1:-1]}>"

    def _repr_html_(self) -> str:
        """The report as Jupyter shows it (:meth:`LeakReport._repr_html_`);
        before the block ends, a line saying so."""
        if self.report is None:
            return "<p>memalloc.leak_check: the report is made when the <code>with</code> block ends</p>"
        return self.report._repr_html_()
