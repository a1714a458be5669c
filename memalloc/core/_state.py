"""The process's memalloc state, read by every layer above: which backend
memalloc was enabled with, its config text, the installed allocator, and
which backend "auto" resolves to.

Only :func:`memalloc.enable` (memalloc/install/_install.py) changes the state, once
per process (:func:`set_enabled`); everything else reads it.
"""

from __future__ import annotations

import threading

import torch

from memalloc import _C
from memalloc.core._config import STACK_MODES, config_value

BACKENDS = ("auto", "cuda", "host")

lock = threading.Lock()  # held by enable() while it installs
_backend: str | None = None
_config: str | None = None


def set_enabled(backend: str, config: str) -> None:
    """Records that memalloc is enabled (called by enable(), under ``lock``)."""
    global _backend, _config
    _backend, _config = backend, config


def cuda_usable() -> tuple[bool, str]:
    """(True, "") when torch has CUDA and the driver sees a device; else
    (False, reason). Does not initialise CUDA in torch."""
    if torch.version.cuda is None:
        return False, f"this torch ({torch.__version__}) is a CPU-only build"
    ok, why = _C.cuda_available()
    return ok, why


def resolve_backend(requested: str, text: str) -> str:
    """The backend ("cuda" or "host") that ``enable(backend=requested)`` with
    config ``text`` uses; ValueError for an unknown name."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}: use one of {', '.join(BACKENDS)}")
    if requested == "auto":
        requested = config_value(text, "backend") or "auto"
    if requested == "auto":
        return "cuda" if cuda_usable()[0] else "host"
    return requested


def is_enabled() -> bool:
    """True once :func:`memalloc.enable` has installed memalloc in this process."""
    return _backend is not None


def enabled_backend() -> str | None:
    """ "cuda", "host", or None when memalloc is not enabled."""
    return _backend


def installed_config() -> str | None:
    """The canonical config text memalloc was enabled with, or None."""
    return _config


def base_stack_mode() -> int:
    """The stack mode (memalloc.core._config.STACK_MODES) when nothing asks for
    more: "python" from :func:`memalloc.enable` on, so every allocation
    knows its call site, unless the config says ``call_sites:False``; "none"
    before enable(). Recording and leak checks raise the mode while they run
    and come back to this one."""
    if _config is None or config_value(_config, "call_sites") == "False":
        return STACK_MODES["none"]
    return STACK_MODES["python"]


def installed_allocator() -> _C.Allocator:
    """The allocator installed by :func:`memalloc.enable`; RuntimeError when none."""
    a = _C.installed()
    if a is None:
        raise RuntimeError("memalloc is not enabled: call memalloc.enable() first")
    return a


def allocator_or_installed(allocator: _C.Allocator | None) -> _C.Allocator:
    """``allocator`` when given, else :func:`installed_allocator` (the
    default of every tracker and report that takes an allocator)."""
    return allocator if allocator is not None else installed_allocator()
