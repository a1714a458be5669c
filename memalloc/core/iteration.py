"""Iteration boundaries: where one training step ends and the next begins.

Three ways to mark them, which can be mixed:

- explicit: call :func:`step` at the end of each iteration;
- a loop wrapper: ``for batch in memalloc.steps_of(loader): ...`` calls
  :func:`step` after each item;
- automatic: :func:`auto_step` (on by default under ``python -m memalloc
  run``) calls :func:`step` after every ``optimizer.step()`` of any torch
  optimizer, through torch's global optimizer post-step hook, so unmodified
  scripts get boundaries. With several optimizers stepping in one iteration
  only the first one's step counts as the boundary (see :func:`auto_step`).

Recorded events carry the step number; step listeners (the leak tracker,
the per-step tracker, the every-N-steps empty-cache policy) run at each
boundary, in the thread that called :func:`step`.

A watcher that needs boundaries (``leak_check``, ``LeakTracker``,
``StepTracker``) asks for them with :func:`want_boundaries`: while one
does, and no explicit :func:`step` has come since the first one asked,
``optimizer.step()`` marks the boundaries (the hook of :func:`auto_step`),
so a training loop gets them with no change. The first explicit
:func:`step` hands the boundaries to the code, and takes over the boundary
``optimizer.step()`` marked in its own iteration (the last one), so that
iteration ends once, not twice. :func:`boundary_counts`
says which source marked how many, so a report can say what it used.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from memalloc import _C
from memalloc.core import _hooks

T = TypeVar("T")
StepListener = Callable[[int], None]

# Where a boundary came from (the keys of boundary_counts()).
EXPLICIT = "memalloc.step()"
OPTIMIZER = "optimizer.step()"

FEATURE = "step boundaries from optimizer.step()"  # its name in hook warnings

_lock = threading.Lock()
_listeners: list[StepListener] = []
_counts = {EXPLICIT: 0, OPTIMIZER: 0}


def step() -> int:
    """Marks the end of one training iteration; returns the number of steps
    so far (recorded events carry it). Runs the step listeners. From the
    first call on, ``optimizer.step()`` no longer marks the boundaries that
    watchers asked for (:func:`want_boundaries`); :func:`auto_step` still
    does."""
    with _lock:
        # The boundary optimizer.step() marked for watchers in this iteration
        # stood in for this call: it becomes this call's (counted as
        # memalloc.step()), not a second boundary of one iteration.
        absorb = not _auto.explicit_seen and _auto.stand_in
        _auto.explicit_seen = True
        _auto.stand_in = False
        if absorb:
            _counts[OPTIMIZER] -= 1
            _counts[EXPLICIT] += 1
    if absorb:
        return int(_C.step())
    return _boundary(EXPLICIT)


def _boundary(source: str) -> int:
    n = int(_C.next_step())
    with _lock:
        _counts[source] += 1
        listeners = list(_listeners)
    for listener in listeners:
        listener(n)
    return n


def boundary_counts() -> dict[str, int]:
    """How many boundaries each source has marked in this process:
    ``{"memalloc.step()": n, "optimizer.step()": m}`` (steps_of counts as
    memalloc.step()). A watcher compares the counts at its start and end
    (:func:`describe_boundaries`)."""
    with _lock:
        return dict(_counts)


def describe_boundaries(before: dict[str, int], after: dict[str, int]) -> str:
    """Which sources marked the boundaries between two
    :func:`boundary_counts`, in words: "24 from optimizer.step()",
    "10 from memalloc.step()", "none" ..."""
    parts = [
        f"{after[k] - before.get(k, 0)} from {k}" for k in (EXPLICIT, OPTIMIZER) if after[k] - before.get(k, 0) > 0
    ]
    return " and ".join(parts) if parts else "none"


def want_boundaries() -> None:
    """Called by a watcher when it starts: until the first explicit
    :func:`step` after the first watcher asked, ``optimizer.step()`` marks
    the boundaries. Pair with :func:`release_boundaries`."""
    with _lock:
        if _auto.watchers == 0:
            _auto.explicit_seen = False
            _auto.stand_in = False
        _auto.watchers += 1
        _auto.update_hook()


def release_boundaries() -> None:
    """Called by a watcher when it stops (see :func:`want_boundaries`)."""
    with _lock:
        if _auto.watchers > 0:
            _auto.watchers -= 1
        _auto.update_hook()


def steps() -> int:
    """How many boundaries have been marked in this process (by :func:`step`
    and by ``optimizer.step()``): the current step number."""
    return int(_C.step())


def add_step_listener(fn: StepListener) -> None:
    """Calls ``fn(step_number)`` at every boundary (:func:`step` or
    ``optimizer.step()``; once per boundary, in order of registration)."""
    if not callable(fn):
        raise TypeError(f"a step listener must be callable, not {type(fn).__name__}")
    with _lock:
        if fn not in _listeners:
            _listeners.append(fn)


def remove_step_listener(fn: StepListener) -> None:
    """Stops calling ``fn``; a listener that is not registered is ignored."""
    if not callable(fn):
        raise TypeError(f"a step listener must be callable, not {type(fn).__name__}")
    with _lock:
        if fn in _listeners:
            _listeners.remove(fn)


def steps_of(iterable: Iterable[T]) -> Iterator[T]:
    """Yields the items of ``iterable`` and calls :func:`step` after the
    loop body has finished with each one::

        for batch in memalloc.steps_of(loader):
            train(batch)
    """
    try:
        items = iter(iterable)
    except TypeError:
        raise TypeError(
            f"steps_of needs an iterable (a DataLoader, a range, a list), not {type(iterable).__name__}"
        ) from None
    return _stepping(items)


def _stepping(items: Iterator[T]) -> Iterator[T]:
    for item in items:
        yield item
        step()


class _AutoStep:
    """The optimizer post-step hook: one boundary per iteration, even when
    several optimizers step in it (GANs, multi-optimizer setups): a boundary
    is taken each time the optimizer that stepped first steps. When that
    optimizer is gone (a new training phase), the next one to step takes
    its place. Installed while :func:`auto_step` is on or a watcher wants
    boundaries (the latter only until an explicit :func:`step`). Its fields
    are guarded by ``_lock``."""

    def __init__(self) -> None:
        self.hooked = False
        self.first: weakref.ref | None = None  # the optimizer that marks boundaries
        self.on = False  # auto_step(True)
        self.watchers = 0  # want_boundaries() - release_boundaries()
        self.explicit_seen = False  # an explicit step() since the first watcher asked
        # The last boundary was marked by optimizer.step() standing in for an
        # explicit step() (for watchers, auto_step off), and no step() came since.
        self.stand_in = False

    def marks(self) -> bool:
        return self.on or (self.watchers > 0 and not self.explicit_seen)

    def update_hook(self) -> None:
        """Installs the hook while auto_step is on or any watcher runs (it
        marks a boundary only when marks() says so), removes it otherwise;
        ``_lock`` held."""
        wanted = self.on or self.watchers > 0
        if wanted and not self.hooked:
            self.first = None
            _hooks.subscribe(_hooks.OPTIMIZER_STEP_POST, FEATURE, self)
            self.hooked = True
        elif not wanted and self.hooked:
            _hooks.unsubscribe(_hooks.OPTIMIZER_STEP_POST, FEATURE)
            self.hooked = False

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with _lock:
            if self.first is None or self.first() is None:
                self.first = weakref.ref(optimizer)
            mark = self.first() is optimizer and self.marks()
            if mark:
                self.stand_in = not self.on
        if mark:
            _boundary(OPTIMIZER)


_auto = _AutoStep()


def auto_step(enabled: bool = True) -> None:
    """Turns on (or off) the automatic boundary after ``optimizer.step()``,
    whether or not the code also calls :func:`step`. One boundary per
    iteration: the optimizer that steps first marks them."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, not {type(enabled).__name__}")
    with _lock:
        _auto.on = enabled
        _auto.update_hook()


def optimizer_marks_boundaries() -> bool:
    """Whether ``optimizer.step()`` marks boundaries now (:func:`auto_step`
    is on, or a watcher wants them and no explicit :func:`step` came)."""
    with _lock:
        return _auto.hooked and _hooks.subscribed(_hooks.OPTIMIZER_STEP_POST, FEATURE) and _auto.marks()


def explicit_steps_seen() -> bool:
    """Whether the code has called :func:`step` (or used :func:`steps_of`)."""
    with _lock:
        return _counts[EXPLICIT] > 0


def auto_step_enabled() -> bool:
    """Whether :func:`auto_step` is on."""
    return _auto.on
