"""Event recording with stack tags, and its exports.

``record_memory_history(stacks="python")`` makes the C++ core write every
allocator event (alloc, free requested / completed, segment alloc / free,
OOM, empty_cache, ...) as a 64-byte record into a preallocated per-device
ring (csrc/recorder.h). Each record names who caused it: an interned Python
call stack (``stacks="python"``), the user tag path active on the thread
(``with memalloc.tag("forward"):``), the thread and the ``memalloc.step()``
count. Allocations made by autograd's engine threads, which run no Python,
are attributed to ``<backward>`` plus the tag path and call stack of the
``backward()`` call that started them.

Exports: :func:`events` (Python objects) or :func:`events_array` (numpy
structured array), :func:`snapshot` in the format of
``torch.cuda.memory._snapshot()`` and :func:`dump_snapshot` (the pickle that
pytorch.org/memory_viz and ``torch.cuda._memory_viz`` read),
:func:`save_trace` / :func:`load_trace` (compact: raw records + stack and tag
tables).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import pickle
import struct
import threading
from typing import Any, Iterator, Sequence, Union

import torch

from . import _C, _state
from ._device import DeviceLike, device_index
from ._usercode import is_internal

PathLike = Union[str, "os.PathLike[str]"]
STACK_MODES = {"none": 0, "tags": 1, "python": 2}
RECORD_FORMAT = "<qQQQQIIIIBBB5x"  # csrc/recorder.h, 64 bytes
assert struct.calcsize(RECORD_FORMAT) == 64
ACTIONS: tuple[str, ...] = tuple(_C.action_names())


@dataclasses.dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.filename}:{self.line} in {self.name}"


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
_recording: set[int] = set()  # devices whose ring is on

def record_memory_history(enabled: bool = True, max_entries: int = 100_000, stacks: str = "python",
                          device: DeviceLike = None) -> None:
    """Starts (or with ``enabled=False`` stops) recording allocator events.

    Args:
        enabled: record or not. Stopping frees the rings.
        max_entries: ring capacity per device, in events (64 bytes each);
            when full the oldest are overwritten and counted as dropped.
        stacks: "python" (interned Python call stack per allocation),
            "tags" (only ``memalloc.tag`` paths), or "none".
        device: one device, or every device when None.
    """
    if stacks not in STACK_MODES:
        raise ValueError(f"stacks must be one of {', '.join(STACK_MODES)}, not {stacks!r}")
    if enabled and (isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries <= 0):
        raise ValueError(f"max_entries must be a positive int (events per device), not {max_entries!r}")
    if enabled and max_entries > _C.max_trace_records():
        raise ValueError(f"max_entries {max_entries} is too large: at most {_C.max_trace_records()} "
                         "records (64 bytes each) per device")
    a = _state.installed_allocator()
    devices = range(a.device_count) if device is None else [device_index(device)]
    for d in devices:
        a.set_recording(max_entries if enabled else 0, d)
        (_recording.add if enabled else _recording.discard)(d)
    # The stack mode is process-wide: it stays on while any device records.
    if enabled:
        _C.set_stack_mode(STACK_MODES[stacks])
    elif not _recording:
        _C.set_stack_mode(0)
    if enabled and stacks != "none":
        _install_backward_context()


# ---- user tags ----------------------------------------------------------------
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


def _install_backward_context() -> None:
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


# ---- reading events -------------------------------------------------------------
def _raw(device: int) -> tuple[bytes, int]:
    return _state.installed_allocator().trace(device)


def dropped(device: DeviceLike = None) -> int:
    """Events overwritten because the ring was full."""
    return int(_raw(device_index(device))[1])


def _decode(raw: bytes, tags: Sequence[str]) -> list[Event]:
    out = []
    for (t, addr, size, req, stream, stack, tag_id, thread, step, action, dev, pool) in struct.iter_unpack(
            RECORD_FORMAT, raw):
        out.append(Event(t, ACTIONS[action], dev, stream, addr, size, req, stack,
                         tags[tag_id] if tag_id < len(tags) else f"<tag {tag_id}>", thread, step,
                         "small" if pool == 0 else "large"))
    return out


def events(device: DeviceLike = None) -> list[Event]:
    """The recorded events of ``device``, oldest first."""
    return _decode(_raw(device_index(device))[0], _C.tag_names())


def events_array(device: DeviceLike = None):
    """The recorded events as a numpy structured array (fields as in
    csrc/recorder.h: time_ns, addr, size, requested, stream, stack_id,
    tag_id, thread, step, action, device, pool)."""
    import numpy as np

    dtype = np.dtype([("time_ns", "<i8"), ("addr", "<u8"), ("size", "<u8"), ("requested", "<u8"),
                      ("stream", "<u8"), ("stack_id", "<u4"), ("tag_id", "<u4"), ("thread", "<u4"),
                      ("step", "<u4"), ("action", "u1"), ("device", "u1"), ("pool", "u1"), ("pad", "V5")])
    return np.frombuffer(_raw(device_index(device))[0], dtype=dtype)


_frames_cache: dict[int, tuple[Frame, ...]] = {}


def stack(stack_id: int, *, user_only: bool = False) -> tuple[Frame, ...]:
    """Frames of an interned stack, innermost first. ``user_only`` keeps the
    user's code only (memalloc/_usercode.py: not memalloc, torch, the
    standard library or installed packages)."""
    frames = _frames_cache.get(stack_id)
    if frames is None:
        frames = tuple(Frame(f, int(line), n) for f, line, n in _C.stack_frames(stack_id))
        _frames_cache[stack_id] = frames
    if user_only:
        frames = tuple(f for f in frames if not is_internal(f.filename))
    return frames


def _frames_json(stack_id: int) -> list[dict]:
    return [{"filename": f.filename, "line": f.line, "name": f.name} for f in stack(stack_id)] if stack_id else []


# ---- torch's snapshot format ---------------------------------------------------
def snapshot(device: DeviceLike = None) -> dict:
    """The allocator state and recorded events in the format of
    ``torch.cuda.memory._snapshot()``: {"segments": [...], "device_traces":
    [[...] per device]}. ``device`` None = every device.

    Entries with the same stack share one ``frames`` list object (and
    pickle writes it once): copy it before modifying it."""
    a = _state.installed_allocator()
    devices = range(a.device_count) if device is None else [device_index(device)]
    for d in devices:
        a.stats(d)  # raises "device N does not exist" for a bad index
    tags = _C.tag_names()
    frames_json = functools.lru_cache(maxsize=None)(_frames_json)  # one shared list per stack
    segments, traces = [], []
    for d in range(a.device_count):
        if d not in devices:
            traces.append([])
            continue
        for seg in a.segments(d):
            blocks = [{"address": b["address"], "size": b["size"], "requested_size": b["requested_size"],
                       "state": b["state"], "frames": frames_json(b["stack_id"]),
                       "tag": tags[b["tag_id"]] if b["tag_id"] < len(tags) else ""} for b in seg["blocks"]]
            active = [b for b in blocks if b["state"] != "inactive"]
            segments.append({
                "device": d, "address": seg["address"], "total_size": seg["total_size"],
                "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                "active_size": sum(b["size"] for b in active),
                "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
                "stream": seg["stream"], "segment_type": seg["segment_type"], "segment_pool_id": (0, 0),
                "is_expandable": False, "frames": [], "blocks": blocks})
        # Built in C++ (csrc/boundary/trace_export.cpp): ~0.2 s per million events.
        traces.append(_C.trace_entries(_raw(d)[0], _TORCH_KEEP, tags, frames_json))
    return {"segments": segments, "device_traces": traces}


_TORCH_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom")
_TORCH_KEEP = [a in _TORCH_ACTIONS for a in ACTIONS]


def dump_snapshot(filename: PathLike = "dump_snapshot.pickle") -> str:
    """Writes :func:`snapshot` as the pickle pytorch.org/memory_viz opens;
    returns the path. ``filename`` is a path (str or os.PathLike), never an
    open file descriptor (TypeError)."""
    filename = os.fspath(filename)
    snap = snapshot()  # before opening: an error must not truncate an existing file
    with open(filename, "wb") as f:
        pickle.dump(snap, f)
    return filename


# ---- compact trace files ---------------------------------------------------------
_MAGIC = b"MEMALLOC-TRACE-1\n"
_HEADER = struct.Struct("<Q")  # metadata length in bytes, after the magic line


def save_trace(path: PathLike) -> str:
    """Writes every device's records (raw, 64 bytes each) with the stack and
    tag tables they refer to; returns the path. Read back with
    :func:`load_trace`. ``path`` is a path (str or os.PathLike), never an
    open file descriptor (TypeError)."""
    path = os.fspath(path)
    a = _state.installed_allocator()
    raws = [_raw(d) for d in range(a.device_count)]
    stack_ids = sorted({e.stack_id for raw, _ in raws for e in _decode(raw, []) if e.stack_id})
    meta = {"record_format": RECORD_FORMAT, "actions": list(ACTIONS), "tags": _C.tag_names(),
            "stacks": {str(i): [[f.filename, f.line, f.name] for f in stack(i)] for i in stack_ids},
            "devices": [{"records": len(raw) // 64, "dropped": int(dropped_)} for raw, dropped_ in raws]}
    blob = json.dumps(meta).encode()
    with open(path, "wb") as f:
        f.write(_MAGIC + _HEADER.pack(len(blob)) + blob)
        for raw, _ in raws:
            f.write(raw)
    return path


@dataclasses.dataclass
class Trace:
    """A trace file read back: events per device plus the tables."""

    events: list[list[Event]]
    dropped: list[int]
    stacks: dict[int, tuple[Frame, ...]]
    tags: list[str]


class _CorruptTrace(Exception):
    """What is wrong inside a trace file (load_trace adds the path)."""


def load_trace(path: PathLike) -> Trace:
    """Reads a file written by :func:`save_trace`.

    ``path`` is a path (str or os.PathLike), never an open file descriptor
    (TypeError). Raises ValueError naming the file when it is not a memalloc
    trace file or is corrupt (truncated, metadata that is not the expected
    JSON, records that do not match the metadata), and OSError as open() does.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        if f.read(len(_MAGIC)) != _MAGIC:
            raise ValueError(f"{path} is not a memalloc trace file (bad magic)")
        try:
            return _read_trace(f, os.fstat(f.fileno()).st_size)
        except _CorruptTrace as e:
            raise ValueError(f"{path} is not a valid memalloc trace file: {e}; it was not written "
                             "by memalloc.save_trace, or was truncated or changed since") from None


def _read_trace(f: Any, file_size: int) -> Trace:
    """The trace after the magic line of open file ``f``; _CorruptTrace."""
    header = f.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise _CorruptTrace(f"the header ends after {len(header)} of its {_HEADER.size} bytes")
    (n,) = _HEADER.unpack(header)
    left = file_size - f.tell()
    if n > left:
        raise _CorruptTrace(f"the header announces {n} bytes of metadata, but only {left} bytes follow")
    try:
        meta = json.loads(f.read(n))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise _CorruptTrace(f"the metadata is not JSON ({e})") from None
    body = f.read()
    missing = [k for k in ("tags", "stacks", "devices") if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise _CorruptTrace(f"the metadata lacks {', '.join(map(repr, missing))}")
    try:
        tags = [str(t) for t in meta["tags"]]
        counts = [(int(d["records"]), int(d["dropped"])) for d in meta["devices"]]
        stacks = {int(k): tuple(Frame(str(fn), int(line), str(name)) for fn, line, name in v)
                  for k, v in meta["stacks"].items()}
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise _CorruptTrace(f"the metadata is malformed ({type(e).__name__}: {e})") from None
    expected = sum(records for records, _ in counts) * 64
    if any(records < 0 for records, _ in counts) or expected != len(body):
        raise _CorruptTrace(f"the metadata announces {expected} bytes of records (64 each), "
                            f"but {len(body)} bytes follow")
    events_, offset = [], 0
    for records, _ in counts:
        try:
            events_.append(_decode(body[offset:offset + records * 64], tags))
        except IndexError:  # an action code memalloc does not have
            raise _CorruptTrace(f"a record of device {len(events_)} has an unknown action code "
                                f"(known: 0..{len(ACTIONS) - 1})") from None
        offset += records * 64
    return Trace(events_, [dropped_ for _, dropped_ in counts], stacks, tags)


__all__ = ["ACTIONS", "Event", "Frame", "Trace", "current_tag", "dropped", "dump_snapshot", "events",
           "events_array", "load_trace", "record_memory_history", "save_trace", "snapshot",
           "stack", "tag"]
