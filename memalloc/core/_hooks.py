"""Every hook memalloc installs into torch, owned in one place.

A *hook point* is one place where torch calls memalloc: a wrapper of
``torch.autograd.backward``, torch's global optimizer pre- and post-step
hooks, the global module parameter-registration and forward hooks, and memalloc's own
out-of-memory hook (called by the C++ allocator). Features *subscribe* to a
point under their name (``subscribe("backward", "breakdown", before,
after)``); the point installs its one torch hook when the first subscriber
arrives and removes it when the last leaves, so each point has one wrapper
whatever subscribes, and torch gets back its own function or hook.
:func:`replace_attribute` is the same for the functions memalloc puts in
place of torch's (the host backend's ``torch.cuda`` queries, the run-time
settings entry points).

Rules every subscriber is held to (the user's code must not see memalloc):

- a subscriber never raises into user code: an exception turns that
  feature's subscriptions off, with one ``RuntimeWarning`` naming the
  feature, the point and the error, and the user's call goes on as if the
  feature were absent (:func:`failures` lists what was turned off);
- what torch passes through a hook (the backward's arguments and result,
  the optimizer, the module and its parameter) reaches torch unchanged;
- subscribers know tensors by identity (:class:`IdentityRegistry`), never by
  ``==``, a set or a dict keyed by tensors: ``Tensor.__eq__`` is elementwise,
  so ``p in weakref.WeakSet()`` raises for a parameter registered twice (a
  tied weight).

Dispatch reads a tuple of subscribers without a lock (a new tuple is
swapped in on every change), so a hook costs one loop over its subscribers.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import torch
import torch.nn.modules.module as torch_module
import torch.optim.optimizer as torch_optimizer

from memalloc import _C

T = TypeVar("T")

BACKWARD = "backward"  # torch.autograd.backward (also Tensor.backward)
OPTIMIZER_STEP_PRE = "optimizer_step_pre"  # before any optimizer.step()
OPTIMIZER_STEP_POST = "optimizer_step_post"  # after any optimizer.step()
PARAMETER_REGISTRATION = "parameter_registration"  # a module registers an nn.Parameter
MODULE_FORWARD_PRE = "module_forward_pre"  # before any module's forward (observes; returns nothing)
MODULE_FORWARD = "module_forward"  # after any module's forward (observes; the output is untouched)
OUT_OF_MEMORY = "out_of_memory"  # memalloc's allocator failed an allocation for good
POINTS = (
    BACKWARD,
    OPTIMIZER_STEP_PRE,
    OPTIMIZER_STEP_POST,
    PARAMETER_REGISTRATION,
    MODULE_FORWARD_PRE,
    MODULE_FORWARD,
    OUT_OF_MEMORY,
)

_lock = threading.Lock()
_failed: dict[str, str] = {}  # feature -> what went wrong (turned off)


class _Subscriber:
    __slots__ = ("feature", "fn", "after")

    def __init__(self, feature: str, fn: Callable[..., Any], after: Callable[[Any], None] | None) -> None:
        self.feature, self.fn, self.after = feature, fn, after


class _Point:
    """One hook point: its subscribers (a tuple, replaced on change) and the
    torch hook installed while it has any. ``_lock`` guards changes."""

    def __init__(self, name: str, install: Callable[[_Point], Callable[[], None]]) -> None:
        self.name = name
        self.subscribers: tuple[_Subscriber, ...] = ()
        self._install = install
        self._remove: Callable[[], None] | None = None

    def set(self, subscribers: tuple[_Subscriber, ...]) -> None:
        self.subscribers = subscribers
        if subscribers and self._remove is None:
            self._remove = self._install(self)
        elif not subscribers and self._remove is not None:
            self._remove()
            self._remove = None

    @property
    def installed(self) -> bool:
        return self._remove is not None

    def call(self, *args: Any) -> None:
        """Calls every subscriber with ``args``; a failing one is turned off."""
        for s in self.subscribers:
            try:
                s.fn(*args)
            except Exception as e:  # noqa: BLE001 - never into user code
                _turn_off(s.feature, self.name, e)


def _turn_off(feature: str, point: str, error: BaseException) -> None:
    with _lock:
        first = feature not in _failed
        _failed.setdefault(feature, f"{type(error).__name__}: {error}")
        for p in _points.values():
            p.set(tuple(s for s in p.subscribers if s.feature != feature))
    if first:
        warnings.warn(
            f"memalloc: its {feature} feature failed in torch's {point} hook "
            f"({type(error).__name__}: {error}) and is turned off for this process; your code goes on "
            "unchanged. Please report this at memalloc's issue tracker with the traceback above.",
            RuntimeWarning,
            stacklevel=3,
        )


# --- the torch side of each point ------------------------------------------


def _install_backward(point: _Point) -> Callable[[], None]:
    original = torch.autograd.backward

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        subscribers = point.subscribers
        entered: list[tuple[_Subscriber, Any]] = []
        for s in subscribers:
            try:
                entered.append((s, s.fn()))
            except Exception as e:  # noqa: BLE001
                _turn_off(s.feature, point.name, e)
        try:
            return original(*args, **kwargs)
        finally:
            for s, token in reversed(entered):
                if s.after is not None:
                    try:
                        s.after(token)
                    except Exception as e:  # noqa: BLE001
                        _turn_off(s.feature, point.name, e)

    backward.__memalloc_hook__ = True  # type: ignore[attr-defined]
    torch.autograd.backward = backward

    def remove() -> None:
        # Only undo our own wrapper: code that wrapped it after us keeps its own.
        if torch.autograd.backward is backward:
            torch.autograd.backward = original

    return remove


def _install_torch_hook(register: Callable[[Callable[..., None]], Any]) -> Callable[[_Point], Callable[[], None]]:
    def install(point: _Point) -> Callable[[], None]:
        handle = register(point.call)
        return handle.remove

    return install


def _install_oom(point: _Point) -> Callable[[], None]:
    def hook(device: int, size: int) -> str:
        texts = []
        for s in point.subscribers:
            try:
                texts.append(str(s.fn(device, size) or ""))
            except Exception as e:  # noqa: BLE001 - the OOM error must surface, not this
                _turn_off(s.feature, point.name, e)
        return "".join(texts)

    _C.set_oom_hook(hook)
    return lambda: _C.set_oom_hook(None)


_points: dict[str, _Point] = {
    BACKWARD: _Point(BACKWARD, _install_backward),
    OPTIMIZER_STEP_PRE: _Point(
        OPTIMIZER_STEP_PRE, _install_torch_hook(torch_optimizer.register_optimizer_step_pre_hook)
    ),
    OPTIMIZER_STEP_POST: _Point(
        OPTIMIZER_STEP_POST, _install_torch_hook(torch_optimizer.register_optimizer_step_post_hook)
    ),
    PARAMETER_REGISTRATION: _Point(
        PARAMETER_REGISTRATION, _install_torch_hook(torch_module.register_module_parameter_registration_hook)
    ),
    # Global forward hooks may replace a module's inputs or output by returning
    # a value: the dispatcher returns None, so nothing a subscriber does can.
    MODULE_FORWARD_PRE: _Point(MODULE_FORWARD_PRE, _install_torch_hook(torch_module.register_module_forward_pre_hook)),
    MODULE_FORWARD: _Point(MODULE_FORWARD, _install_torch_hook(torch_module.register_module_forward_hook)),
    OUT_OF_MEMORY: _Point(OUT_OF_MEMORY, _install_oom),
}


def _point(name: str) -> _Point:
    p = _points.get(name)
    if p is None:
        raise ValueError(f"unknown hook point {name!r}: use one of {', '.join(POINTS)}")
    return p


# --- the subscriber API -----------------------------------------------------


def subscribe(point: str, feature: str, fn: Callable[..., Any], after: Callable[[Any], None] | None = None) -> None:
    """Calls ``fn`` at ``point`` for ``feature`` (a name for warnings), after
    the point's earlier subscribers. Arguments by point: ``backward``:
    ``fn()`` before the backward, its result passed to ``after(result)`` when
    the backward returns or raises; optimizer points: ``fn(optimizer, args,
    kwargs)``; ``parameter_registration``: ``fn(module, name, param)``;
    ``module_forward_pre``: ``fn(module, args)``; ``module_forward``:
    ``fn(module, args, output)`` (return values are ignored);
    ``out_of_memory``: ``fn(device, size_in_bytes) -> str`` (appended to the
    error). Subscribing a feature again replaces its subscription in place.
    A feature that has failed (:func:`failures`) stays off."""
    if not isinstance(feature, str) or not feature:
        raise ValueError(f"a feature is a non-empty str, not {feature!r}")
    if not callable(fn) or (after is not None and not callable(after)):
        raise TypeError("hook subscribers must be callable")
    if after is not None and point != BACKWARD:
        raise ValueError(f"only the {BACKWARD} point takes an after callback, not {point!r}")
    p = _point(point)
    with _lock:
        if feature in _failed:
            return
        new = _Subscriber(feature, fn, after)
        subs = list(p.subscribers)
        for i, s in enumerate(subs):
            if s.feature == feature:
                subs[i] = new
                break
        else:
            subs.append(new)
        p.set(tuple(subs))


def unsubscribe(point: str, feature: str) -> None:
    """Stops calling ``feature`` at ``point``; not subscribed: nothing happens."""
    p = _point(point)
    with _lock:
        p.set(tuple(s for s in p.subscribers if s.feature != feature))


def subscribed(point: str, feature: str) -> bool:
    """Whether ``feature`` is subscribed at ``point``."""
    return any(s.feature == feature for s in _point(point).subscribers)


def installed(point: str) -> bool:
    """Whether ``point``'s torch hook is in place (it has subscribers)."""
    return _point(point).installed


def failures() -> dict[str, str]:
    """Features turned off because a hook of theirs raised: {feature: error}."""
    with _lock:
        return dict(_failed)


# --- attributes of torch replaced by memalloc ------------------------------

_replaced: dict[tuple[int, str], tuple[Any, Any, Any]] = {}  # (id(module), name) -> (module, original, ours)
_ABSENT = object()  # the module had no such attribute


def replace_attribute(module: Any, name: str, value: Any) -> None:
    """Puts ``value`` at ``module.name`` (a function of torch's that memalloc
    answers for), remembering torch's original once (or that there was
    none); see :func:`restore_attribute`."""
    with _lock:
        key = (id(module), name)
        original = _replaced[key][1] if key in _replaced else getattr(module, name, _ABSENT)
        _replaced[key] = (module, original, value)
        setattr(module, name, value)


def original_attribute(module: Any, name: str) -> Any:
    """torch's own ``module.name``, also while memalloc's replaces it."""
    with _lock:
        entry = _replaced.get((id(module), name))
    return entry[1] if entry is not None else getattr(module, name)


def restore_attribute(module: Any, name: str) -> None:
    """Gives ``module.name`` back to torch (only where it is still memalloc's;
    an attribute torch did not have is removed)."""
    with _lock:
        entry = _replaced.pop((id(module), name), None)
        if entry is None or getattr(module, name, _ABSENT) is not entry[2]:
            return
        if entry[1] is _ABSENT:
            delattr(module, name)
        else:
            setattr(module, name, entry[1])


def replaced_attributes() -> list[tuple[Any, str]]:
    """(module, name) of every attribute of torch memalloc replaces now."""
    with _lock:
        return [(m, name) for (_, name), (m, _o, _v) in _replaced.items()]


# --- tensors by identity ----------------------------------------------------


class IdentityRegistry(Generic[T]):
    """A weak set of objects (tensors, optimizers) known by identity: an
    object added twice is kept once, and it leaves when it dies. Never calls
    the objects' ``__eq__`` or ``__hash__``."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}
        self._lock = threading.Lock()

    def add(self, obj: T) -> bool:
        """Adds ``obj``; True when it was not there yet."""
        key = id(obj)
        with self._lock:
            ref = self._refs.get(key)
            if ref is not None and ref() is obj:
                return False
            self._refs[key] = weakref.ref(obj, functools.partial(self._gone, key))
            return True

    def _gone(self, key: int, ref: weakref.ref) -> None:
        with self._lock:
            if self._refs.get(key) is ref:
                del self._refs[key]

    def __contains__(self, obj: object) -> bool:
        ref = self._refs.get(id(obj))
        return ref is not None and ref() is obj

    def __iter__(self) -> Iterator[T]:
        with self._lock:
            refs = list(self._refs.values())
        for r in refs:
            obj = r()
            if obj is not None:
                yield obj

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def clear(self) -> None:
        with self._lock:
            self._refs.clear()
