"""Compact trace files: every device's raw event records with the stack and
tag tables they refer to (:func:`save_trace`), read back by
:func:`load_trace`."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import struct
from typing import Any, BinaryIO, Union

from memalloc import _C
from memalloc.core import _state
from memalloc.trace.recording import ACTIONS, RECORD_FORMAT, Event, Frame, decode_records, raw_records, stack

PathLike = Union[str, "os.PathLike[str]"]


_MAGIC = b"MEMALLOC-TRACE-1\n"
_GZIP_MAGIC = b"\x1f\x8b"
_HEADER = struct.Struct("<Q")  # metadata length in bytes, after the magic line


def save_trace(path: PathLike, *, allocator: _C.Allocator | None = None) -> str:
    """Writes the records (raw, 64 bytes each) of every device of
    ``allocator`` (default: the installed one) with the stack and tag tables
    they refer to; returns the path. Read back with :func:`load_trace`.
    ``path`` is a path (str or os.PathLike), never an open file descriptor
    (TypeError); a path ending in ``.gz`` is written gzip-compressed (a
    trace to commit: records of a training loop compress several-fold)."""
    path = os.fspath(path)
    a = _state.allocator_or_installed(allocator)
    raws = [raw_records(d, allocator=a) for d in range(a.device_count)]
    stack_ids = sorted({e.stack_id for raw, _ in raws for e in decode_records(raw, []) if e.stack_id})
    meta = {
        "record_format": RECORD_FORMAT,
        "actions": list(ACTIONS),
        "tags": _C.tag_names(),
        "stacks": {str(i): [[f.filename, f.line, f.name] for f in stack(i)] for i in stack_ids},
        "devices": [{"records": len(raw) // 64, "dropped": int(dropped_)} for raw, dropped_ in raws],
    }
    blob = json.dumps(meta).encode()
    with gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb") as f:
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
    """Reads a file written by :func:`save_trace` (gzip-compressed or not).

    ``path`` is a path (str or os.PathLike), never an open file descriptor
    (TypeError). Raises ValueError naming the file when it is not a memalloc
    trace file or is corrupt (truncated, metadata that is not the expected
    JSON, records that do not match the metadata), and OSError as open() does.
    """
    path = os.fspath(path)
    f: BinaryIO  # the file, or its decompressed bytes
    with open(path, "rb") as f:
        if f.read(len(_GZIP_MAGIC)) == _GZIP_MAGIC:  # written to a .gz path: decompress in memory
            f.seek(0)
            try:
                data = gzip.decompress(f.read())
            except (OSError, EOFError) as e:
                raise ValueError(f"{path} is a damaged gzip file ({e})") from None
            f = io.BytesIO(data)
            size = len(data)
        else:
            f.seek(0)
            size = os.fstat(f.fileno()).st_size
        if f.read(len(_MAGIC)) != _MAGIC:
            raise ValueError(f"{path} is not a memalloc trace file (bad magic)")
        try:
            return _read_trace(f, size)
        except _CorruptTrace as e:
            raise ValueError(
                f"{path} is not a valid memalloc trace file: {e}; it was not written "
                "by memalloc.save_trace, or was truncated or changed since"
            ) from None


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
        stacks = {
            int(k): tuple(Frame(str(fn), int(line), str(name)) for fn, line, name in v)
            for k, v in meta["stacks"].items()
        }
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise _CorruptTrace(f"the metadata is malformed ({type(e).__name__}: {e})") from None
    expected = sum(records for records, _ in counts) * 64
    if any(records < 0 for records, _ in counts) or expected != len(body):
        raise _CorruptTrace(
            f"the metadata announces {expected} bytes of records (64 each), but {len(body)} bytes follow"
        )
    events_, offset = [], 0
    for records, _ in counts:
        try:
            events_.append(decode_records(body[offset : offset + records * 64], tags))
        except IndexError:  # an action code memalloc does not have
            raise _CorruptTrace(
                f"a record of device {len(events_)} has an unknown action code (known: 0..{len(ACTIONS) - 1})"
            ) from None
        offset += records * 64
    return Trace(events_, [dropped_ for _, dropped_ in counts], stacks, tags)
