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
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from . import _C

T = TypeVar("T")
StepListener = Callable[[int], None]

_lock = threading.Lock()
_listeners: list[StepListener] = []


def step() -> int:
    """Marks the end of one training iteration; returns the number of steps
    so far (recorded events carry it). Runs the step listeners."""
    n = int(_C.next_step())
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(n)
    return n


def steps() -> int:
    """How many times :func:`step` has been called."""
    return int(_C.step())


def add_step_listener(fn: StepListener) -> None:
    """Calls ``fn(step_number)`` after every :func:`step` (once per call,
    in order of registration)."""
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
        raise TypeError(f"steps_of needs an iterable (a DataLoader, a range, a list), not "
                        f"{type(iterable).__name__}") from None
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
    its place."""

    def __init__(self) -> None:
        self.handle: Optional[Any] = None
        self.first: Optional[weakref.ref] = None  # the optimizer that marks boundaries

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.first is None or self.first() is None:
            self.first = weakref.ref(optimizer)
        if self.first() is optimizer:
            step()


_auto = _AutoStep()


def auto_step(enabled: bool = True) -> None:
    """Turns on (or off) the automatic boundary after ``optimizer.step()``.
    One boundary per iteration: the optimizer that steps first marks them."""
    import torch.optim.optimizer as optim

    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, not {type(enabled).__name__}")
    with _lock:
        if enabled and _auto.handle is None:
            _auto.first = None
            _auto.handle = optim.register_optimizer_step_post_hook(_auto)
        elif not enabled and _auto.handle is not None:
            _auto.handle.remove()
            _auto.handle = None


def auto_step_enabled() -> bool:
    """Whether :func:`auto_step` is on."""
    return _auto.handle is not None
