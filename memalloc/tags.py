"""User tags and the backward context: who an allocation belongs to when
its Python stack does not say (``with memalloc.tag("forward"):``; autograd's
engine threads, which run no Python, are attributed to the ``backward()``
call that started them)."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

from . import _C
from ._config import STACK_MODES


_local = threading.local()


def _tag_stack() -> list:
    s = getattr(_local, "tags", None)
    if s is None:
        s = _local.tags = []
    return s


def current_tag() -> str:
    """The tag path active on this thread ("outer/inner"; "" when none)."""
    return "/".join(_tag_stack())


@contextlib.contextmanager
def tag(name: str) -> Iterator[str]:
    """Attributes this thread's allocations inside the block to ``name``
    (nested tags form a path "outer/inner"). Yields the path."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"a tag is a non-empty str without '/', not {name!r}")
    stack = _tag_stack()
    stack.append(name)
    path = "/".join(stack)
    previous = _C.thread_tag()
    _C.set_thread_tag(_C.intern_tag(path))
    try:
        yield path
    finally:
        stack.pop()
        _C.set_thread_tag(previous)


_backward_installed = False
_backward_lock = threading.Lock()


def install_backward_context() -> None:
    """Wraps torch.autograd.backward so that engine-thread allocations are
    attributed to "<backward>[/tag path]" and the caller's stack."""
    global _backward_installed
    with _backward_lock:
        if _backward_installed:
            return
        original = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            path = current_tag()
            tag_id = _C.intern_tag("<backward>" + (f"/{path}" if path else ""))
            stack_id = _C.capture_stack() if _C.stack_mode() == STACK_MODES["python"] else 0
            previous = _C.backward_context()
            _C.set_backward_context(tag_id, stack_id)
            try:
                return original(*args, **kwargs)
            finally:
                _C.set_backward_context(*previous)

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        backward.__doc__ = original.__doc__
        torch.autograd.backward = backward
        _backward_installed = True
