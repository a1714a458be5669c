"""Where a training step is, told to the allocator: the phases behind
:func:`memalloc.memory_breakdown` (csrc/profiler/breakdown.h).

:func:`install` (called by :func:`memalloc.enable`) hooks torch at the
landmarks of a training step, with no change to the user's code:

- ``torch.autograd.backward`` (which ``loss.backward()`` calls) is wrapped:
  the allocator enters the ``backward`` phase (the forward blocks still live
  become activations) and, when it returns, ``forward``;
- torch's global optimizer hooks: before any ``optimizer.step()`` the
  ``optimizer`` phase (the backward blocks still live become gradients),
  after it ``forward``. The first time an optimizer enters it, its
  parameters' storages are marked ``parameters`` and their ``.grad`` s
  ``gradients``; what else the backward passes so far left live is
  ``other`` (a cuBLAS workspace made by the autograd engine's first matmul,
  a cache), not gradients;
- ``optimizer.step(closure)`` (LBFGS, Lightning's automatic optimization):
  when no backward has run in the step yet, the closure is what runs the
  forward and the backward, inside the step. The optimizer phase then
  begins when a backward inside the step returns (each time: LBFGS
  evaluates its closure several times), not before the closure, so the
  closure's forward is the step's forward and what the update allocates is
  optimizer state. When a backward already ran in the step (Lightning's
  manual optimization and mixed precision pass a closure that does nothing
  more), the optimizer phase begins before the closure; should the closure
  run a backward after all (two micro-batches: Lightning's automatic
  optimization with ``accumulate_grad_batches``), what it allocated before
  that backward is its forward's (activations if still live) and the
  optimizer phase begins again when that backward returns. The closure is
  never wrapped: the optimizer gets the user's own object;
- torch's global module forward pre-hook, until the first forward of a
  module with trainable parameters under grad: the first step's forward
  begins there (before it, the ``idle`` phase: setup is ``other``), so a
  first step's activations count as activations before any step ends;
- a step ends (what is left resolves, and the step's peak split is kept)
  at each boundary of :mod:`memalloc.core.iteration` (``memalloc.step()``, and
  ``optimizer.step()`` when boundaries come from it); when none are marked,
  after each ``optimizer.step()`` of the first optimizer that steps (one
  step per iteration with several optimizers, the rule of
  :func:`memalloc.auto_step`), until the code calls ``memalloc.step()``;
- torch's global parameter-registration hook remembers every
  ``nn.Parameter`` (weakly, by identity: a tied weight is one); their
  storages are marked ``parameters`` before the first backward after new
  ones appear, for each optimizer's parameters when it first steps, and at
  every report (:func:`mark_parameters`).

The hooks are subscriptions of :mod:`memalloc.core._hooks` (one wrapper per hook
point, shared with the backward context of :mod:`memalloc.trace.tags` and the
boundaries of :mod:`memalloc.core.iteration`); a failing one turns the breakdown
off with a warning and never reaches the user's code.

Each landmark costs one call into the allocator (a few microseconds with a
walk over the live blocks of the phase it resolves); the malloc/free path
only stamps the current phase on each block.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from memalloc import _C
from memalloc.core import _hooks, _state, iteration

CATEGORIES: tuple[str, ...] = tuple(_C.CATEGORIES)  # as the core defines them (breakdown.h), in its order
PHASES: tuple[str, ...] = tuple(_C.PHASES)

FEATURE = "memory breakdown"  # its name in hook warnings (memalloc.core._hooks)
FIRST_FORWARD = "memory breakdown (first forward)"  # the hook that comes off after the first training forward

_lock = threading.Lock()


class _Landmarks:
    """The hooks and what they remember; fields guarded by ``_lock``."""

    def __init__(self) -> None:
        self.allocator: _C.Allocator | None = None  # None: not installed
        # Known by identity: a tied weight is registered twice, and tensors'
        # == is elementwise (a WeakSet of parameters raised there).
        self.parameters: _hooks.IdentityRegistry[torch.Tensor] = _hooks.IdentityRegistry()
        self.unmarked = 0  # parameters registered since the last marking
        self.optimizers: _hooks.IdentityRegistry[Any] = _hooks.IdentityRegistry()
        self.backward_listeners: list[Any] = []  # called when a backward starts
        self.first: weakref.ref | None = None  # the optimizer whose steps end steps
        self.ended = 0  # steps ended by the optimizer hook (no boundaries marked)
        self.depth = 0  # backward calls in progress (one inside another: reentrant checkpointing)
        # optimizer.step() calls in progress, innermost last: [a weak
        # reference to the optimizer, whether it was given a closure, whether
        # its optimizer phase waits for a backward in its closure]. Weak: a
        # step that raised leaves its frame here until the step ends, and
        # that must not keep the user's optimizer (and its state) alive.
        self.stepping: list[list[Any]] = []
        self.backward_in_step = False  # a backward returned since the last step ended


_marks = _Landmarks()


def install(allocator: _C.Allocator | None = None) -> None:
    """Installs the landmark hooks for ``allocator`` (default: the installed
    one). Idempotent; :func:`uninstall` removes them."""
    a = _state.allocator_or_installed(allocator)
    with _lock:
        if _marks.allocator is not None:
            return
        _marks.allocator = a
    _hooks.subscribe(_hooks.OPTIMIZER_STEP_PRE, FEATURE, _before_optimizer_step)
    _hooks.subscribe(_hooks.OPTIMIZER_STEP_POST, FEATURE, _after_optimizer_step)
    _hooks.subscribe(_hooks.PARAMETER_REGISTRATION, FEATURE, _parameter_registered)
    _hooks.subscribe(_hooks.BACKWARD, FEATURE, _backward_begins, _backward_ends)
    _hooks.subscribe(_hooks.MODULE_FORWARD_PRE, FIRST_FORWARD, _first_forward)
    iteration.add_step_listener(_end_step)


def uninstall() -> None:
    """Removes the hooks of :func:`install`; blocks allocated from now on
    are stamped ``idle``."""
    with _lock:
        if _marks.allocator is None:
            return
        a = _marks.allocator
        _marks.allocator = None
        _marks.stepping.clear()
        _marks.backward_in_step = False
    for point in (
        _hooks.OPTIMIZER_STEP_PRE,
        _hooks.OPTIMIZER_STEP_POST,
        _hooks.PARAMETER_REGISTRATION,
        _hooks.BACKWARD,
    ):
        _hooks.unsubscribe(point, FEATURE)
    _hooks.unsubscribe(_hooks.MODULE_FORWARD_PRE, FIRST_FORWARD)
    iteration.remove_step_listener(_end_step)
    a.enter_phase("idle")


def installed() -> bool:
    """Whether the landmark hooks are installed."""
    return _marks.allocator is not None


def _first_forward(module: Any, args: Any) -> None:
    """Before the first forward of a module with trainable parameters, with
    grad enabled: the first step's forward begins (the allocator leaves the
    idle phase), so what it allocates is activations or temporaries, not
    other, before any step has ended (a first-step OOM's split). Then the
    hook comes off: torch calls global forward hooks on every module."""
    a = _marks.allocator
    if a is None or not torch.is_grad_enabled():
        return
    if not any(p.requires_grad for p in module.parameters()):
        return
    _hooks.unsubscribe(_hooks.MODULE_FORWARD_PRE, FIRST_FORWARD)
    if a.phase() == "idle":
        a.enter_phase("forward")


def _backward_begins() -> _C.Allocator | None:
    """Before a backward: the allocator enters the backward phase (once for
    a backward inside a backward: reentrant checkpointing). Returns the
    allocator to leave the phase of, None when not installed."""
    a = _marks.allocator
    if a is None:
        return None
    with _lock:
        _marks.depth += 1
        outermost = _marks.depth == 1
    if outermost:
        if _marks.unmarked:
            mark_parameters(a)
        for listener in list(_marks.backward_listeners):
            listener()
        with _lock:
            frame = _marks.stepping[-1] if _marks.stepping else None
            in_closure = frame is not None and frame[1] and not frame[2]
            if in_closure:
                assert frame is not None  # in_closure says so
                frame[2] = True  # the update comes after this backward returns
        if in_closure:
            # A closure step entered after a backward (two micro-batches) runs
            # one more forward and backward: what it made so far is that
            # forward's, activations if still live now.
            a.resolve("optimizer", "activations")
        a.enter_phase("backward")
    return a


def _backward_ends(a: _C.Allocator | None) -> None:
    if a is None:
        return
    with _lock:
        _marks.depth -= 1
        done = _marks.depth == 0
        if done:
            _marks.backward_in_step = True
        closure_of = _marks.stepping[-1][0]() if done and _marks.stepping and _marks.stepping[-1][2] else None
    if closure_of is not None:
        _enter_optimizer(a, closure_of)  # the backward of a step's closure: the update comes next
    elif done:
        a.enter_phase("forward")


def add_backward_listener(fn: Any) -> None:
    """Calls ``fn()`` when a backward starts (before the allocator enters
    the backward phase), on the thread that called backward."""
    if not callable(fn):
        raise TypeError(f"a backward listener must be callable, not {type(fn).__name__}")
    with _lock:
        if fn not in _marks.backward_listeners:
            _marks.backward_listeners.append(fn)


def remove_backward_listener(fn: Any) -> None:
    """Stops calling ``fn``; one that is not registered is ignored."""
    with _lock:
        if fn in _marks.backward_listeners:
            _marks.backward_listeners.remove(fn)


def _has_closure(optimizer: Any, args: Any, kwargs: Any) -> bool:
    """Whether ``optimizer.step`` was given a closure: torch's optimizers
    take it first after ``self`` (torch's hooks get ``args`` with ``self``
    in front), or as ``closure=``."""
    if isinstance(kwargs, dict) and "closure" in kwargs:
        return callable(kwargs["closure"])
    rest = tuple(args) if isinstance(args, (tuple, list)) else ()
    if rest and rest[0] is optimizer:
        rest = rest[1:]
    return bool(rest) and callable(rest[0])


def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    a = _marks.allocator
    if a is None:
        return
    with _lock:
        closure = _has_closure(optimizer, args, kwargs)
        waits = closure and not _marks.backward_in_step
        # An optimizer does not step inside its own step: a frame of it still
        # here is one whose step raised (its post-step hook never ran).
        _marks.stepping = [f for f in _marks.stepping if f[0]() is not None and f[0]() is not optimizer]
        _marks.stepping.append([_weak(optimizer), closure, waits])
    if closure and not waits:
        # Its closure may run a forward and backward after all (see
        # _backward_begins), whose blocks would then leave the optimizer
        # phase: what an earlier optimizer's step left live is its state.
        a.resolve("optimizer", "optimizer_state")
    if not waits:
        _enter_optimizer(a, optimizer)


def _weak(obj: Any) -> Any:
    """A weak reference to ``obj``; a callable returning it for the rare
    object that takes none (a class with ``__slots__``)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _enter_optimizer(a: _C.Allocator, optimizer: Any) -> None:
    """The allocator enters the optimizer phase for ``optimizer`` (the
    backward blocks still live become gradients); the first time for this
    optimizer, its parameters are marked first, their ``.grad`` s are
    gradients and what else the backward passes left live is other."""
    if _marks.optimizers.add(optimizer):  # its first step
        params = _optimizer_parameters(optimizer)
        mark_parameters(a, params)
        _mark_tensors(a, [p.grad for p in params if p.grad is not None], "gradients")
        a.resolve("backward", "other")
    a.enter_phase("optimizer")


def _after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    a = _marks.allocator
    if a is None:
        return
    with _lock:
        for i in range(len(_marks.stepping) - 1, -1, -1):  # innermost first
            if _marks.stepping[i][0]() is optimizer:
                del _marks.stepping[i]
                break
        if _marks.first is None or _marks.first() is None:
            _marks.first = weakref.ref(optimizer)
        ends = _marks.first() is optimizer
    if ends and not iteration.explicit_steps_seen() and not iteration.optimizer_marks_boundaries():
        # No boundary will come from this optimizer.step(): end the step here.
        _marks.ended += 1
        _marks.backward_in_step = False
        a.end_step(_marks.ended)
    else:
        a.enter_phase("forward")


def _end_step(step: int) -> None:
    a = _marks.allocator
    if a is not None:
        with _lock:
            _marks.backward_in_step = False
            _marks.stepping.clear()  # a step's end is outside every optimizer.step()
        a.end_step()


def _parameter_registered(module: Any, name: str, param: Any) -> None:
    if param is not None and _marks.parameters.add(param):
        _marks.unmarked += 1


def _optimizer_parameters(optimizer: Any) -> list[torch.Tensor]:
    return [
        p
        for group in getattr(optimizer, "param_groups", ())
        for p in group.get("params", ())
        if isinstance(p, torch.Tensor)
    ]


def mark_parameters(allocator: _C.Allocator | None = None, params: Iterable[torch.Tensor] | None = None) -> int:
    """Marks the storages of ``params`` (default: every ``nn.Parameter``
    registered in a module since :func:`install`, and the parameters of
    every optimizer that has stepped) as ``parameters`` in ``allocator``
    (default: the installed one). Returns the bytes of the blocks found."""
    a = _state.allocator_or_installed(allocator)
    if params is None:
        _marks.unmarked = 0
        tensors = list(_marks.parameters)
        for opt in list(_marks.optimizers):
            tensors.extend(_optimizer_parameters(opt))
    else:
        tensors = list(params)
    return _mark_tensors(a, tensors, "parameters")


def _mark_tensors(a: _C.Allocator, tensors: list[torch.Tensor], category: str) -> int:
    """Marks the blocks of ``tensors`` that are on ``a``'s backend; returns
    the bytes of the blocks found."""
    on_cuda = a.backend_name == "cuda"
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t.is_cuda != on_cuda or t.is_meta:
            continue
        ptr = t.data_ptr()
        if ptr == 0 or ptr in seen:
            continue
        seen.add(ptr)
        total += a.mark(ptr, category)
    return total


def mark(tensor: torch.Tensor, category: str, allocator: _C.Allocator | None = None) -> int:
    """Gives the block holding ``tensor``'s storage the category (one of
    :data:`CATEGORIES`) in ``allocator`` (default: the installed one), for
    memory that the landmarks classify wrongly (e.g. a buffer made before
    training that is an optimizer's state). Returns the block's bytes, 0
    when the allocator does not hold the tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"mark() takes a torch.Tensor, not {type(tensor).__name__}")
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}: use one of {', '.join(CATEGORIES)}")
    a = _state.allocator_or_installed(allocator)
    return int(a.mark(tensor.data_ptr(), category)) if tensor.data_ptr() else 0
