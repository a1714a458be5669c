"""Call sites: where a live allocation came from, for leak reports and OOM
holders (both sit above this module).

A site is the innermost user-code frame (memalloc/core/_usercode.py) of the
interned Python stack that allocated a block; live blocks are read from an
allocator (default: the installed one) so that callers can be tested
in-process on any allocator.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator

from memalloc import _C
from memalloc.core import _state
from memalloc.core._usercode import user_frame
from memalloc.trace.recording import stack, struct_format

SiteKey = tuple  # (filename, line, function)
LIVE_FORMAT = struct_format(_C.LIVE_FIELDS, _C.LIVE_BYTES)  # "<QQQIIIxxxx": LiveBlock, as _C defines it
LiveBlock = tuple[int, int, int, int, int, int]  # (addr, size, requested, stack_id, tag_id, step)
assert tuple(f[0] for f in _C.LIVE_FIELDS) == ("addr", "size", "requested", "stack_id", "tag_id", "step")


@functools.cache  # an interned stack never changes (csrc/profiler/stacks.h)
def site_of(stack_id: int) -> SiteKey | None:
    """(filename, line, function) of the innermost user-code frame of an
    interned stack; None for stack id 0 (no stack captured)."""
    f = user_frame(stack(stack_id)) if stack_id else None
    return (f.filename, f.line, f.name) if f else None


# (size, stack_id, step) alone, the rest read as padding: what a leak sample needs.
SIZE_STACK_STEP_FORMAT = struct_format(
    [f for f in _C.LIVE_FIELDS if f[0] in ("size", "stack_id", "step")], _C.LIVE_BYTES
)


def live_size_stack_step(device: int, allocator: _C.Allocator | None = None) -> Iterator[tuple[int, int, int]]:
    """(size, stack_id, step) of every live block of ``device``, as
    :func:`live_blocks` reads them, without the fields a leak sample does
    not use."""
    a = _state.allocator_or_installed(allocator)
    return struct.iter_unpack(SIZE_STACK_STEP_FORMAT, a.live_blocks(device))


def live_blocks(device: int, allocator: _C.Allocator | None = None) -> list[LiveBlock]:
    """(addr, size, requested, stack_id, tag_id, step) of every live block of
    ``device`` (bytes; ``step`` = memalloc.step() count at allocation), of
    ``allocator`` or the installed one."""
    a = _state.allocator_or_installed(allocator)
    return list(struct.iter_unpack(LIVE_FORMAT, a.live_blocks(device)))
