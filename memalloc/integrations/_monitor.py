"""What the framework callbacks share (memalloc/integrations/lightning.py,
memalloc/integrations/transformers.py): one :class:`Monitor` per training
run, built on memalloc's public features and computing nothing of its own.

- Step boundaries: the callback calls :meth:`Monitor.batch_end` once per
  training step (Lightning: each batch; transformers: each optimizer step),
  which calls :func:`memalloc.step` unless the step already has a boundary
  (the code called :func:`memalloc.step` itself, or :func:`memalloc.auto_step`
  is on: then ``optimizer.step()`` marks them). With automatic or manual
  optimization alike, one boundary per step.
- Figures (:meth:`Monitor.metrics`, at the framework's logging steps): a
  :class:`memalloc.StepTracker` row per step (allocated, reserved, the step's
  peaks and the breakdown's categories at the peak) and the growth a
  :class:`memalloc.LeakTracker` finds (bytes per step, over the last
  ``leak_window`` steps).
- The end (:meth:`Monitor.finish`): the leak report, judged with its holder
  search, written to ``memalloc-leaks.json`` in the logger's folder; one line
  per leak for the callback to warn with.
- Out-of-memory reports (:func:`memalloc.set_oom_report`) go to the logger's
  folder while training runs; the previous settings come back at the end.
- The run page: a flight recorder (memalloc/features/flight.py) runs in
  ``memalloc-flight/`` of the logger's folder unless one already runs (``run``'s,
  or ``flight_recorder:DIR`` in the config); at the end (or after an exception
  the framework reports) ``index.html`` there shows the steps, the breakdown
  over them, the flame graph of the peak, leaks, OOMs
  (memalloc/trace/run_page.py). A clean end removes the flight file the
  monitor started; an exception leaves it for ``python -m memalloc postmortem``.
"""

from __future__ import annotations

import os
import warnings

import memalloc
from memalloc.core import iteration
from memalloc.core._checks import check_int
from memalloc.core._format import fmt_bytes
from memalloc.features import flight
from memalloc.features.breakdown import CATEGORIES
from memalloc.features.leaks import LeakTracker
from memalloc.features.oom import oom_report_settings, set_oom_report
from memalloc.features.tracker import StepTracker
from memalloc.reporters.leak_report import LeakReport
from memalloc.trace import run_page

PREFIX = "memalloc/"
LEAK_FILE = "memalloc-leaks.json"
FLIGHT_DIR = "memalloc-flight"  # the flight recorder the monitor starts, in the logger's folder
METRICS: tuple[str, ...] = (
    "memalloc/allocated_bytes",
    "memalloc/reserved_bytes",
    "memalloc/peak_allocated_bytes",
    "memalloc/peak_reserved_bytes",
    *(f"memalloc/breakdown/{c}_bytes" for c in CATEGORIES),
    "memalloc/leak_bytes_per_step",
)


def require_enabled(who: str) -> None:
    """RuntimeError naming the fix when memalloc is not enabled."""
    if not memalloc.is_enabled():
        raise RuntimeError(
            f"{who} needs memalloc as torch's allocator: call memalloc.enable() at the top of the "
            "script, before the first CUDA tensor (without a GPU: memalloc.enable(backend='host') "
            "and memalloc.host.use_for_cpu_tensors()), or run it with `python -m memalloc run`"
        )


class Monitor:
    """One training run's trackers (see the module docstring)."""

    def __init__(
        self, who: str, *, leaks: bool = True, leak_window: int = 100, warmup_steps: int = 1, oom_reports: bool = True
    ) -> None:
        if not isinstance(leaks, bool) or not isinstance(oom_reports, bool):
            raise TypeError(f"{who}: leaks and oom_reports must be bools")
        check_int("leak_window", leak_window, warmup_steps + 4)
        check_int("warmup_steps", warmup_steps, 0)
        require_enabled(who)
        self.who = who
        self.want_leaks = leaks
        self.leak_window = leak_window
        self.warmup_steps = warmup_steps
        self.oom_reports = oom_reports
        self.folder: str | None = None
        self.steps: StepTracker | None = None
        self.leaks: LeakTracker | None = None
        self.report: LeakReport | None = None
        self._oom_before: dict | None = None
        self._explicit = 0
        self._flight: flight.FlightRecorder | None = None  # the recorder this monitor started
        self.page: str | None = None  # the run page's path, once written

    @property
    def running(self) -> bool:
        return self.steps is not None

    def start(self, folder: str | None, *, write: bool = True) -> None:
        """Starts the trackers; ``folder``: the logger's, for the OOM reports
        and (with ``write``, rank zero) the leak report."""
        require_enabled(self.who)
        if self.running:
            self.stop()
        self.folder, self._write = folder, write
        self.report = None
        if folder is not None and self.oom_reports:
            self._oom_before = oom_report_settings()
            set_oom_report(**{**self._oom_before, "enabled": True, "directory": folder})
        if folder is not None and flight.current() is None:
            self._flight = flight.start(os.path.join(folder, FLIGHT_DIR))
        self.steps = StepTracker().start()
        self.leaks = LeakTracker(warmup_steps=self.warmup_steps).start() if self.want_leaks else None
        # A boundary now: the boundaries are the code's (memalloc.step()) from
        # here on, so the first step ends at batch_end like every other one.
        if not iteration.auto_step_enabled():
            memalloc.step()
        self.steps.clear()
        self._explicit = iteration.boundary_counts()[iteration.EXPLICIT]

    def batch_start(self) -> None:
        self._explicit = iteration.boundary_counts()[iteration.EXPLICIT]

    def batch_end(self) -> None:
        """The step's boundary, unless the code or auto_step marked it."""
        if self.running and not iteration.auto_step_enabled():
            if iteration.boundary_counts()[iteration.EXPLICIT] == self._explicit:
                memalloc.step()
            self._explicit = iteration.boundary_counts()[iteration.EXPLICIT]
        if self.leaks is not None and len(self.leaks.samples) > 2 * self.leak_window:
            del self.leaks.samples[: -self.leak_window]  # bounded however rarely the figures are read

    def metrics(self) -> dict[str, float]:
        """The figures of the steps since the last call ({} when no step
        ended): allocated and reserved bytes at the last boundary; the
        highest peak of those steps and the breakdown at that step's peak;
        the leak tracker's bytes per step."""
        if self.steps is None:
            return {}
        rows = self.steps.rows
        self.steps.clear()
        if not rows:
            return {}
        last, top = rows[-1], max(rows, key=lambda r: r["peak_allocated"])
        out: dict[str, float] = {
            "memalloc/allocated_bytes": last["allocated"],
            "memalloc/reserved_bytes": last["reserved"],
            "memalloc/peak_allocated_bytes": top["peak_allocated"],
            "memalloc/peak_reserved_bytes": max(r["peak_reserved"] for r in rows),
        }
        for c in CATEGORIES:
            out[f"memalloc/breakdown/{c}_bytes"] = top[f"peak_{c}"]
        if self.leaks is not None:
            del self.leaks.samples[: -self.leak_window]
            out["memalloc/leak_bytes_per_step"] = self.leaks.report(find_holders=False).bytes_per_step()
        return out

    def stop(self) -> None:
        """Stops the trackers and restores the OOM report's settings."""
        if self.steps is not None:
            self.steps.stop()
            self.steps = None
        if self.leaks is not None:
            self.leaks.stop()
        if self._oom_before is not None:
            set_oom_report(**self._oom_before)
            self._oom_before = None

    def abort(self) -> None:
        """After an exception out of the training loop: stops, writes the
        run page, and leaves the flight file it started for postmortem."""
        self.stop()
        self._end(clean=False)

    def _end(self, clean: bool) -> None:
        """The run page (rank zero), then the flight recorder this monitor started."""
        recorder = flight.current()
        if self.folder is not None and self._write:
            if recorder is not None:
                recorder.sync()
            os.makedirs(self.folder, exist_ok=True)
            state = "exited" if clean else "raised"
            try:
                self.page = run_page.write(
                    self.folder, recorder.path if recorder else None, title=self.who, state=state
                )
            except Exception as e:  # noqa: BLE001 - a page that fails must not end training's end
                warnings.warn(f"memalloc: no run page: {type(e).__name__}: {e}", stacklevel=2)
        if self._flight is not None and self._flight is recorder:
            flight.stop(clean)
            try:  # its folder too, when a clean end left it empty
                os.rmdir(os.path.dirname(recorder.path))
            except OSError:
                pass
        self._flight = None

    def finish(self) -> list[str]:
        """Stops, judges the leaks (holders searched), writes the report to
        ``memalloc-leaks.json`` in the folder and the run page; returns one
        line per leak (empty: none found)."""
        leaks = self.leaks
        self.stop()
        if leaks is None:
            self._end(clean=True)
            return []
        del leaks.samples[: -self.leak_window]
        self.report = report = leaks.report()
        self.leaks = None
        path = None
        if self.folder is not None and self._write:
            os.makedirs(self.folder, exist_ok=True)
            path = os.path.join(self.folder, LEAK_FILE)
            report.to_json(path)
        self._end(clean=True)
        return [
            f"memalloc: leak at {l.where()} ({l.code.strip()}): +{fmt_bytes(l.bytes_per_step)} per step, "
            f"{fmt_bytes(l.retained_bytes)} retained" + (f"; report in {path}" if path else "")
            for l in report.leaks
        ]
