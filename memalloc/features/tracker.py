"""Per-step memory tracking: the ``MemoryTracker`` users write by hand.

::

    with memalloc.StepTracker() as tracker:      # device: torch's current one
        for batch in memalloc.steps_of(loader):  # or memalloc.step() / auto_step()
            train(batch)
    print(tracker.summary())
    tracker.to_csv("memory.csv"); tracker.plot("memory.png")

At every iteration boundary (:func:`memalloc.step`, which also ends each
item of :func:`memalloc.steps_of` and, with :func:`memalloc.auto_step`, each
``optimizer.step()``) or :meth:`StepTracker.record_row`, the tracker records
one row (:data:`FIELDS`; sizes in bytes, times in seconds):

``step``
    the step number :func:`memalloc.step` returned (``record_row``: the
    previous row's + 1 unless given)
``time_s``
    seconds since the tracker was first started (``time.perf_counter``)
``allocated`` / ``reserved``
    ``memory_allocated()`` / ``memory_reserved()`` at the boundary
``peak_allocated`` / ``peak_reserved``
    the highest allocated / reserved bytes *within* this step: since the
    previous row (or :meth:`~StepTracker.start`). Read from a window the C++
    accounting keeps for the tracker alone, so ``torch.cuda.max_memory_allocated``
    and ``reset_peak_memory_stats`` stay the user's: the tracker never resets
    them, and resetting them does not shorten the tracker's window
``device_used`` / ``device_total``
    ``total - free`` and ``total`` of :func:`memalloc.memory.mem_get_info` (every
    process's use of the device; on the host backend, memalloc's reserved bytes)
``num_ooms``
    out-of-memory errors raised during this step (a count per step, not the
    cumulative ``memory_stats()["num_ooms"]``; counted in the same window, so
    ``reset_accumulated_memory_stats`` does not disturb it)
``peak_parameters`` ... ``peak_other``
    the allocated bytes at the step's peak by category
    (:func:`memalloc.memory_breakdown`: parameters, gradients,
    optimizer_state, activations, temporaries, other); at a boundary the
    finished step's resolved split, for :meth:`~StepTracker.record_row` the
    split so far (unresolved blocks under their provisional category)

Several trackers may watch one device: the allocator's window is shared and
each take is folded into every active tracker of that device, so each one
still sees the peak over its own steps.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Union

from memalloc import _C
from memalloc.core import _state, iteration
from memalloc.core._device import DeviceLike, existing_device_index
from memalloc.core._format import fmt_bytes
from memalloc.features import stats
from memalloc.features.breakdown import CATEGORIES
from memalloc.reporters import notebook, steps

PathLike = Union[str, "os.PathLike[str]"]

SCHEMA = "memalloc.step_tracker/1"

BREAKDOWN_FIELDS: tuple[str, ...] = tuple(f"peak_{c}" for c in CATEGORIES)

FIELDS: tuple[str, ...] = (
    "step",
    "time_s",
    "allocated",
    "reserved",
    "peak_allocated",
    "peak_reserved",
    "device_used",
    "device_total",
    "num_ooms",
    *BREAKDOWN_FIELDS,
)

UNITS: dict[str, str] = {
    "step": "count",
    "time_s": "seconds",
    "allocated": "bytes",
    "reserved": "bytes",
    "peak_allocated": "bytes",
    "peak_reserved": "bytes",
    "device_used": "bytes",
    "device_total": "bytes",
    "num_ooms": "count",
    **dict.fromkeys(BREAKDOWN_FIELDS, "bytes"),
}


class Row(NamedTuple):
    """One boundary (see the module docstring; bytes, seconds)."""

    step: int
    time_s: float
    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    device_used: int
    device_total: int
    num_ooms: int
    peak_parameters: int
    peak_gradients: int
    peak_optimizer_state: int
    peak_activations: int
    peak_temporaries: int
    peak_other: int


assert Row._fields == FIELDS

# Guards the trackers' rows and the shared per-device windows: a take of the
# allocator's window is folded into every active tracker of its device.
# Keyed by (id of the allocator, device): each allocator has its own windows.
_lock = threading.Lock()
_active: dict[tuple[int, int], list[StepTracker]] = {}


def _take_window(allocator: _C.Allocator, device: int) -> None:
    """Folds ``allocator``'s step window of ``device`` (peaks, OOMs) into
    every active tracker of it (with ``_lock`` held)."""
    peak_allocated, peak_reserved, ooms = allocator.take_window(device)
    for t in _active.get((id(allocator), device), ()):
        a, r, n = t._window
        t._window = (max(a, peak_allocated), max(r, peak_reserved), n + ooms)


def _output_path(path: PathLike, method: str) -> Path:
    """``path`` as a Path whose directory exists, else a clear error."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"StepTracker.{method}: path must be a str or os.PathLike, not {type(path).__name__}")
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"StepTracker.{method}: {str(p)!r} is a directory; give a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"StepTracker.{method}: directory {str(parent)!r} does not exist; create it first")
    return p


class StepTracker:
    """Records memory figures at every iteration boundary of one device.

    Args:
        device: an int, ``"cuda:N"``, a ``torch.device`` or None (torch's
            current CUDA device on the CUDA backend, 0 on the host backend).
            Checked against the allocator's devices when memalloc is enabled
            (here if it already is, else at :meth:`start`):
            ``memalloc.errors.InvalidArgumentError`` (a ValueError) names the valid
            range, TypeError a value of the wrong type.
        allocator: the allocator to track (default: the one
            :func:`memalloc.enable` installed); tests pass their own.

    :meth:`start` (or ``with``) registers a step listener and starts the
    window of the first step; until the code calls :func:`memalloc.step`,
    ``optimizer.step()`` marks the boundaries (:attr:`boundaries` says which
    were used); :meth:`stop` removes the listener and keeps the
    rows. Starting again continues the same table (``time_s`` keeps counting
    from the first start). Thread-safe: boundaries may come from any thread.
    """

    FIELDS = FIELDS

    def __init__(self, device: DeviceLike = None, *, allocator: _C.Allocator | None = None) -> None:
        stats.device_index(device)  # TypeError for a value of the wrong type, now
        self._device_spec = device
        self._given_allocator = allocator
        self._allocator: _C.Allocator | None = allocator
        self._device: int | None = self._resolve() if allocator is not None or _state.is_enabled() else None
        self._rows: list[Row] = []
        self._running = False
        self._t0: float | None = None
        self._window = (0, 0, 0)  # (peak allocated, peak reserved, OOMs) taken so far in this step
        self._used: dict[str, int] = {}  # boundaries by source while running (iteration.boundary_counts)
        self._counts_at_start: dict[str, int] = {}

    # ------------------------------------------------------------ set-up --
    def _resolve(self) -> int:
        # the given allocator, or the installed one (RuntimeError naming enable() when none)
        self._allocator = _state.allocator_or_installed(self._given_allocator)
        return existing_device_index(self._device_spec, self._allocator)

    def _backend(self) -> str | None:
        """ "cuda" or "host" for the tracked allocator (None before one is known)."""
        if self._allocator is not None:
            return self._allocator.backend_name
        return _state.enabled_backend()

    def _key(self) -> tuple[int, int]:
        assert self._device is not None  # used from start() on, after _resolve()
        return (id(self._allocator), self._device)

    @property
    def device(self) -> int | None:
        """The device index tracked (None until an allocator is known: given, or installed by enable())."""
        return self._device

    @property
    def running(self) -> bool:
        """Whether boundaries are being recorded."""
        return self._running

    def start(self) -> StepTracker:
        """Starts listening to :func:`memalloc.step` on the device; the first
        step's peaks count from here. RuntimeError when memalloc is not
        enabled or the tracker already runs. Returns the tracker."""
        with _lock:
            if self._running:
                raise RuntimeError("StepTracker.start: the tracker is already running; call stop() first")
            device = self._device = self._resolve()
            _take_window(self._allocator, device)  # ends the other trackers' windows here, before this one joins
            self._window = (0, 0, 0)  # the allocator's next window starts at the current values
            _active.setdefault(self._key(), []).append(self)
            if self._t0 is None:
                self._t0 = time.perf_counter()
            self._running = True
            self._counts_at_start = iteration.boundary_counts()
        iteration.add_step_listener(self._on_step)
        iteration.want_boundaries()
        return self

    def stop(self) -> None:
        """Stops recording (the rows stay); a stopped tracker ignores it."""
        iteration.remove_step_listener(self._on_step)
        with _lock:
            if not self._running:
                return
            self._used = self._used_locked()
            self._running = False
        iteration.release_boundaries()
        with _lock:
            trackers = _active.get(self._key(), [])
            if self in trackers:
                trackers.remove(self)

    def __enter__(self) -> StepTracker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def boundaries(self) -> str:
        """Which sources marked the boundaries while the tracker ran, in words
        ("24 from optimizer.step()", "10 from memalloc.step()", "none")."""
        with _lock:
            used = self._used_locked()
        return iteration.describe_boundaries({}, used)

    def _used_locked(self) -> dict[str, int]:
        """Boundaries by source over every running period, the current one
        included; ``_lock`` held."""
        now = iteration.boundary_counts()
        return {
            source: self._used.get(source, 0) + (n - self._counts_at_start.get(source, 0) if self._running else 0)
            for source, n in now.items()
        }

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        rows = self.rows
        figures = (
            f" (steps {rows[0]['step']}..{rows[-1]['step']}), allocated {fmt_bytes(rows[-1]['allocated'])} at the "
            f"last, highest peak allocated {fmt_bytes(max(r['peak_allocated'] for r in rows))}"
            if rows
            else ""
        )
        return (
            f"<memalloc.StepTracker device={self._device} {state}, {len(rows)} rows{figures}, "
            f"boundaries: {self.boundaries}>"
        )

    def _repr_html_(self) -> str:
        """What Jupyter shows: the figures, a chart and the last rows
        (memalloc/reporters/notebook.py renders them)."""
        return notebook.steps_html(self.to_dict(), CATEGORIES)

    # --------------------------------------------------------- recording --
    def _on_step(self, step: int) -> None:
        self._record(step, listener=True)

    def record_row(self, step: int | None = None) -> dict[str, Any]:
        """Marks a boundary without :func:`memalloc.step` (which would also
        run the other step listeners and policies) and returns its row.
        ``step`` defaults to the previous row's step + 1 (1 for the first).
        RuntimeError when the tracker is not running."""
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise TypeError(f"StepTracker.record_row: step must be an int or None, not {type(step).__name__}")
        if step is not None and step < 0:
            raise ValueError(f"StepTracker.record_row: step must be >= 0, got {step}")
        row = self._record(step, listener=False)
        assert row is not None
        return row._asdict()

    def _record(self, step: int | None, listener: bool) -> Row | None:
        with _lock:
            if not self._running:
                if listener:  # a step() racing with stop() in another thread
                    return None
                raise RuntimeError(
                    "StepTracker: the tracker is not running; call start() "
                    "(or use `with memalloc.StepTracker() as tracker:`) first"
                )
            device, a = self._device, self._allocator
            assert device is not None and a is not None  # running: start() resolved both
            s = a.stats(device)  # currents before the window: the step's peaks then cover them
            _take_window(a, device)
            (peak_allocated, peak_reserved, ooms), self._window = self._window, (0, 0, 0)
            free, total = a.mem_get_info(device)
            b = a.breakdown(device)
            split = (b["last"] if listener and b["last"] is not None else b["peak"])["split"]
            if step is None:
                step = self._rows[-1].step + 1 if self._rows else 1
            assert self._t0 is not None
            row = Row(
                step=int(step),
                time_s=time.perf_counter() - self._t0,
                allocated=int(s["allocated_bytes"]["all"]["current"]),
                reserved=int(s["reserved_bytes"]["all"]["current"]),
                peak_allocated=int(peak_allocated),
                peak_reserved=int(peak_reserved),
                device_used=int(total) - int(free),
                device_total=int(total),
                num_ooms=int(ooms),
                **{f"peak_{c}": int(split[c]) for c in CATEGORIES},
            )
            self._rows.append(row)
        return row

    # ------------------------------------------------------------ output --
    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows so far, oldest first: a list of fresh dicts with the keys
        of :data:`FIELDS` (bytes, seconds)."""
        with _lock:
            rows = list(self._rows)
        return [r._asdict() for r in rows]

    def clear(self) -> None:
        """Drops the rows recorded so far (the tracker keeps running)."""
        with _lock:
            self._rows.clear()

    def to_csv(self, path: PathLike | None = None) -> str:
        """The rows as CSV text (a header of :data:`FIELDS`, one line per
        row; bytes, seconds), also written to ``path`` when given.
        FileNotFoundError when its directory does not exist,
        IsADirectoryError for a directory. (Rendered by
        memalloc/reporters/steps.py.)"""
        p = _output_path(path, "to_csv") if path is not None else None
        text = steps.to_csv(self.rows, FIELDS)
        if p is not None:
            p.write_text(text, encoding="utf-8")
        return text

    def to_dict(self) -> dict[str, Any]:
        """The rows as the JSON object of :meth:`to_json`."""
        return {
            "schema": SCHEMA,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "backend": self._backend(),
            "device": self._device,
            "units": UNITS,
            "boundaries": self.boundaries,
            "rows": self.rows,
        }

    def to_json(self, path: PathLike | None = None) -> str:
        """The rows as JSON text, also written to ``path`` when given. Schema
        ``memalloc.step_tracker/1`` (keys may be added within a version;
        readers ignore those they do not know)::

            {
              "schema": "memalloc.step_tracker/1",
              "created": "2026-11-30T12:00:00+00:00",  // UTC, ISO 8601
              "backend": "cuda",                        // or "host"
              "device": 0,
              "units": {"step": "count", "time_s": "seconds", "allocated": "bytes", ...},
              "boundaries": "24 from optimizer.step()",  // what marked the steps
              "rows": [
                {"step": 1,                  // memalloc.step() number
                 "time_s": 0.53,             // seconds since the first start()
                 "allocated": 1048576,       // bytes at the boundary
                 "reserved": 20971520,       // bytes at the boundary
                 "peak_allocated": 4194304,  // bytes, highest within the step
                 "peak_reserved": 20971520,  // bytes, highest within the step
                 "device_used": 20971520,    // bytes, total - free of mem_get_info
                 "device_total": 1073741824, // bytes
                 "num_ooms": 0,              // OOMs raised within the step
                 "peak_parameters": 1048576, // bytes by category at the step's peak:
                 ...                         //   parameters, gradients, optimizer_state,
                 "peak_other": 0},           //   activations, temporaries, other
                ...
              ]
            }

        Errors as for :meth:`to_csv`."""
        p = _output_path(path, "to_json") if path is not None else None
        text = json.dumps(self.to_dict(), indent=1) + "\n"
        if p is not None:
            p.write_text(text, encoding="utf-8")
        return text

    def plot(self, path: PathLike) -> Path:
        """Writes a PNG of allocated and reserved bytes at each boundary and
        the peak allocated within each step (MiB) over the steps; returns the
        path. Needs matplotlib (ImportError saying ``pip install matplotlib``
        otherwise); ValueError when there are no rows yet; path errors as for
        :meth:`to_csv`. (Drawn by memalloc/reporters/steps.py.)"""
        p = _output_path(path, "plot")
        steps.plot(self.rows, p, f"memalloc StepTracker: device {self._device} ({self._backend()} backend)")
        return p

    def summary(self) -> str:
        """A few lines of text: steps covered, allocated growth per step, the
        highest peak within a step, reserved and device use, OOMs."""
        head = f"StepTracker, device {self._device} ({self._backend()} backend)"
        return steps.summary(self.rows, head, CATEGORIES)
