"""User tags and the backward context: who an allocation belongs to when
its Python stack does not say (``with memalloc.tag("forward"):``; autograd's
engine threads, which run no Python, are attributed to the ``backward()``
call that started them)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from memalloc import _C
from memalloc.core import _hooks
from memalloc.core._config import STACK_MODES

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


BACKWARD_FEATURE = "call-site attribution of backward()"  # its name in hook warnings


def _backward_begins() -> tuple:
    path = current_tag()
    tag_id = _C.intern_tag("<backward>" + (f"/{path}" if path else ""))
    stack_id = _C.capture_stack() if _C.stack_mode() == STACK_MODES["python"] else 0
    previous = _C.backward_context()
    _C.set_backward_context(tag_id, stack_id)
    return previous


def _backward_ends(previous: tuple) -> None:
    _C.set_backward_context(*previous)


def install_backward_context() -> None:
    """Attributes the allocations of autograd's engine threads (which run no
    Python) to "<backward>[/tag path]" and the stack of the ``backward()``
    call that started them: a subscription to torch.autograd.backward
    (memalloc.core._hooks). Idempotent."""
    _hooks.subscribe(_hooks.BACKWARD, BACKWARD_FEATURE, _backward_begins, _backward_ends)
