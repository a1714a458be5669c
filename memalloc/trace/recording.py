"""Event recording with stack tags, and its exports.

``record_history(stacks="python")`` makes the C++ core write every
allocator event (alloc, free requested / completed, segment alloc / free,
OOM, empty_cache, ...) as a 64-byte record into a preallocated per-device
ring (csrc/profiler/recorder.h). Each record names who caused it: an interned Python
call stack (``stacks="python"``), the user tag path active on the thread
(``with memalloc.tag("forward"):``), the thread and the ``memalloc.step()``
count. Allocations made by autograd's engine threads, which run no Python,
are attributed to ``<backward>`` plus the tag path and call stack of the
``backward()`` call that started them.

Reading: :func:`events` (Python objects) or :func:`events_array` (numpy
structured array), :func:`stack` (an interned stack's frames). Every
function that touches a ring takes ``allocator=`` (default: the one
installed by :func:`memalloc.enable`), so recording can run on an allocator
of one's own (a test's ``memalloc.Allocator("host")``); the stack mode, the
stack and tag tables, the step counter and the backward context stay
process-wide, shared by every allocator. The exports
sit in their own modules: memalloc/trace/snapshots.py (torch's snapshot format and
the memory_viz pickle), memalloc/trace/trace_files.py (compact trace files); tags
and the backward context in memalloc/trace/tags.py.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable, Sequence
from typing import Union

from memalloc import _C
from memalloc.core import _state
from memalloc.core._config import STACK_MODES
from memalloc.core._device import DeviceLike, device_index
from memalloc.core._usercode import is_internal
from memalloc.trace import tags

PathLike = Union[str, "os.PathLike[str]"]


def struct_format(fields: Sequence[tuple[str, int, int, bool]], nbytes: int) -> str:
    """The little-endian struct format of a C struct that _C describes as
    (name, byte offset, bytes, signed) fields of ``nbytes`` in all (padding
    as ``x``): the record (RECORD_FIELDS) and the live block (LIVE_FIELDS)."""
    codes = {(8, True): "q", (8, False): "Q", (4, True): "i", (4, False): "I", (1, True): "b", (1, False): "B"}
    out, at = "<", 0
    for _, offset, size, signed in fields:
        out += "x" * (offset - at) + codes[(size, signed)]
        at = offset + size
    return out + "x" * (nbytes - at)


RECORD_FORMAT = struct_format(
    _C.RECORD_FIELDS, _C.RECORD_BYTES
)  # "<qQQQQIIIIBBBxxxxx": 64 bytes, one definition (recorder.h)
assert struct.calcsize(RECORD_FORMAT) == _C.RECORD_BYTES == 64
ACTIONS: tuple[str, ...] = tuple(_C.action_names())


@dataclasses.dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} in {self.name}"

    def to_dict(self) -> dict:
        """The frame as torch's snapshot and the leak report write it."""
        return {"filename": self.filename, "line": self.line, "name": self.name}


@dataclasses.dataclass(frozen=True)
class Event:
    """One allocator event (bytes for sizes, ns for time)."""

    time_ns: int
    action: str
    device: int
    stream: int
    addr: int
    size: int
    requested: int
    stack_id: int
    tag: str
    thread: int
    step: int
    pool: str


# ---- turning recording on ---------------------------------------------------
# Allocators with a ring on, by id: (the allocator, its devices recording).
# Holding the allocator keeps its Python object, hence its id, the same while
# it records (memalloc._C.installed() returns that object while it lives).
_recording: dict[int, tuple[_C.Allocator, set[int]]] = {}
# A recorder that owns an allocator's rings for longer (the flight recorder's
# file, memalloc/features/flight.py), by id: record_history may lend
# a ring to the in-memory history, and gives it back on stopping.
_ring_owners: dict[int, tuple[_C.Allocator, Callable[[int], None]]] = {}


def set_ring_owner(allocator: _C.Allocator, take_back: Callable[[int], None] | None) -> None:
    """While ``take_back`` is set, stopping the in-memory history of a device
    of ``allocator`` calls ``take_back(device)`` instead of leaving the ring
    off (None: no owner)."""
    if take_back is None:
        _ring_owners.pop(id(allocator), None)
    else:
        _ring_owners[id(allocator)] = (allocator, take_back)


def history_on(device: int, allocator: _C.Allocator) -> bool:
    """Whether :func:`record_history` has ``device`` of ``allocator``
    recording now (the in-memory history; a flight recorder's file is not it)."""
    entry = _recording.get(id(allocator))
    return entry is not None and device in entry[1]


def record_history(
    enabled: bool = True,
    max_entries: int = 100_000,
    stacks: str = "python",
    device: DeviceLike = None,
    *,
    allocator: _C.Allocator | None = None,
) -> None:
    """Starts (or with ``enabled=False`` stops) recording allocator events.

    While the flight recorder runs (``flight_recorder:DIR``), starting this
    history moves the devices' rings from its file into memory for a while,
    and stopping gives them back to the file (whose ring starts again).

    Args:
        enabled: record or not. Stopping frees the rings.
        max_entries: ring capacity per device, in events (64 bytes each, so
            ``64 * max_entries`` bytes per device); when full the oldest are
            overwritten and counted as dropped.
        stacks: "python" (interned Python call stack per allocation),
            "tags" (only ``memalloc.tag`` paths), or "none". The mode is
            process-wide (every allocator's records): it stays on while
            any device of any allocator records. It never goes below the
            call sites' mode: after ``memalloc.enable()`` stacks are kept
            unless the config says ``call_sites:False``, so "tags" and
            "none" then record stacks too, and stopping keeps them.
        device: one device, or every device when None.
        allocator: the allocator whose rings to start or stop (default: the
            installed one; RuntimeError when memalloc is not enabled).
    """
    if stacks not in STACK_MODES:
        raise ValueError(f"stacks must be one of {', '.join(STACK_MODES)}, not {stacks!r}")
    if enabled and (isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries <= 0):
        raise ValueError(f"max_entries must be a positive int (events per device), not {max_entries!r}")
    if enabled and max_entries > _C.max_trace_records():
        raise ValueError(
            f"max_entries {max_entries} is too large: at most {_C.max_trace_records()} "
            "records (64 bytes each) per device"
        )
    a = _state.allocator_or_installed(allocator)
    devices = range(a.device_count) if device is None else [device_index(device, a.backend_name)]
    _, on = _recording.setdefault(id(a), (a, set()))
    lent = {d for d in devices if d in on}  # the rings this call stops (an owner's, lent)
    try:
        for d in devices:
            a.set_recording(max_entries if enabled else 0, d)
            (on.add if enabled else on.discard)(d)
    finally:
        if not on:
            del _recording[id(a)]
    # The stack mode is process-wide: it stays on while any device records.
    if enabled:
        _C.set_stack_mode(max(STACK_MODES[stacks], _state.base_stack_mode()))
    elif not _recording:
        _C.set_stack_mode(_state.base_stack_mode())
    if enabled and stacks != "none":
        tags.install_backward_context()
    owner = _ring_owners.get(id(a))
    if not enabled and owner is not None:  # (after the stack mode: the owner keeps what it needs)
        for d in sorted(lent):
            owner[1](d)


# ---- reading events -------------------------------------------------------------
def raw_records(device: int, *, allocator: _C.Allocator | None = None) -> tuple[bytes, int]:
    """(the ring's records of ``device`` of ``allocator`` (default: the
    installed one) as bytes, 64 per record, oldest first; the number of
    records dropped)."""
    return _state.allocator_or_installed(allocator).trace(device)


def _device_records(device: DeviceLike, allocator: _C.Allocator | None) -> tuple[bytes, int]:
    """raw_records of ``device`` as the readers below take it (None: device 0
    on the host backend, the current CUDA device on CUDA)."""
    backend = allocator.backend_name if allocator is not None else None  # None: the enabled one
    return raw_records(device_index(device, backend), allocator=allocator)


def dropped(device: DeviceLike = None, *, allocator: _C.Allocator | None = None) -> int:
    """Events of ``device`` of ``allocator`` (default: the installed one)
    overwritten because the ring was full."""
    return int(_device_records(device, allocator)[1])


def decode_records(raw: bytes, tags: Sequence[str]) -> list[Event]:
    """Events of raw 64-byte records; ``tags`` names the tag ids."""
    out = []
    for t, addr, size, req, stream, stack, tag_id, thread, step, action, dev, pool in struct.iter_unpack(
        RECORD_FORMAT, raw
    ):
        out.append(
            Event(
                t,
                ACTIONS[action],
                dev,
                stream,
                addr,
                size,
                req,
                stack,
                tags[tag_id] if tag_id < len(tags) else f"<tag {tag_id}>",
                thread,
                step,
                "small" if pool == 0 else "large",
            )
        )
    return out


def events(device: DeviceLike = None, *, allocator: _C.Allocator | None = None) -> list[Event]:
    """The recorded events of ``device`` of ``allocator`` (default: the
    installed one), oldest first (sizes in bytes)."""
    return decode_records(_device_records(device, allocator)[0], _C.tag_names())


def events_array(device: DeviceLike = None, *, allocator: _C.Allocator | None = None):
    """The recorded events of ``device`` of ``allocator`` (default: the
    installed one) as a numpy structured array (fields as in
    csrc/profiler/recorder.h: time_ns, addr, size, requested (bytes), stream,
    stack_id, tag_id, thread, step, action, device, pool)."""
    import numpy as np

    dtype = np.dtype(
        {
            "names": [f[0] for f in _C.RECORD_FIELDS],
            "formats": [f"<{'i' if signed else 'u'}{nbytes}" for _, _, nbytes, signed in _C.RECORD_FIELDS],
            "offsets": [f[1] for f in _C.RECORD_FIELDS],
            "itemsize": _C.RECORD_BYTES,
        }
    )
    return np.frombuffer(_device_records(device, allocator)[0], dtype=dtype)


_frames_cache: dict[int, tuple[Frame, ...]] = {}


def stack(stack_id: int, *, user_only: bool = False) -> tuple[Frame, ...]:
    """Frames of an interned stack, innermost first. ``user_only`` keeps the
    user's code only (memalloc/core/_usercode.py: not memalloc, torch, the
    standard library or installed packages)."""
    frames = _frames_cache.get(stack_id)
    if frames is None:
        frames = tuple(Frame(f, int(line), n) for f, line, n in _C.stack_frames(stack_id))
        _frames_cache[stack_id] = frames
    if user_only:
        frames = tuple(f for f in frames if not is_internal(f.filename))
    return frames


def frames_json(stack_id: int) -> list[dict]:
    """An interned stack as torch snapshot frames ([] for stack id 0)."""
    return [f.to_dict() for f in stack(stack_id)] if stack_id else []


__all__ = [
    "ACTIONS",
    "Event",
    "Frame",
    "RECORD_FORMAT",
    "STACK_MODES",
    "decode_records",
    "dropped",
    "events",
    "events_array",
    "frames_json",
    "raw_records",
    "record_history",
    "stack",
]
