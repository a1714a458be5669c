"""The allocator state and recorded events in the format of
``torch.cuda.memory._snapshot()``, and the pickle pytorch.org/memory_viz
opens (:func:`dump_snapshot`)."""

from __future__ import annotations

import functools
import os
import pickle
from typing import Union

from memalloc import _C
from memalloc.core import _state
from memalloc.core._device import DeviceLike, device_index
from memalloc.trace.recording import ACTIONS, frames_json, raw_records

PathLike = Union[str, "os.PathLike[str]"]


def snapshot(device: DeviceLike = None, *, allocator: _C.Allocator | None = None) -> dict:
    """The state and recorded events of ``allocator`` (default: the
    installed one) in the format of ``torch.cuda.memory._snapshot()``:
    {"segments": [...], "device_traces": [[...] per device]} (sizes in
    bytes). ``device`` None = every device.

    Entries with the same stack share one ``frames`` list object (and
    pickle writes it once): copy it before modifying it."""
    a = _state.allocator_or_installed(allocator)
    devices = range(a.device_count) if device is None else [device_index(device, a.backend_name)]
    for d in devices:
        a.stats(d)  # raises "device N does not exist" for a bad index
    tags = _C.tag_names()
    frames_of = functools.lru_cache(maxsize=None)(frames_json)  # one shared list per stack
    segments: list[dict] = []
    traces: list[list[dict]] = []  # one list of trace entries per device
    for d in range(a.device_count):
        if d not in devices:
            traces.append([])
            continue
        for seg in a.segments(d):
            blocks = [
                {
                    "address": b["address"],
                    "size": b["size"],
                    "requested_size": b["requested_size"],
                    "state": b["state"],
                    "frames": frames_of(b["stack_id"]),
                    "tag": tags[b["tag_id"]] if b["tag_id"] < len(tags) else "",
                }
                for b in seg["blocks"]
            ]
            active = [b for b in blocks if b["state"] != "inactive"]
            segments.append(
                {
                    "device": d,
                    "address": seg["address"],
                    "total_size": seg["total_size"],
                    "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                    "active_size": sum(b["size"] for b in active),
                    "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
                    "stream": seg["stream"],
                    "segment_type": seg["segment_type"],
                    "segment_pool_id": tuple(seg["segment_pool_id"]),
                    "is_expandable": seg["is_expandable"],
                    "frames": [],
                    "blocks": blocks,
                }
            )
        # Built in C++ (csrc/boundary/python/trace_export.cpp): ~0.2 s per million events.
        traces.append(_C.trace_entries(raw_records(d, allocator=a)[0], _TORCH_KEEP, tags, frames_of))
    return {"segments": segments, "device_traces": traces}


_TORCH_ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
)
_TORCH_KEEP = [a in _TORCH_ACTIONS for a in ACTIONS]


def dump_snapshot(filename: PathLike = "dump_snapshot.pickle", *, allocator: _C.Allocator | None = None) -> str:
    """Writes :func:`snapshot` of ``allocator`` (default: the installed one)
    as the pickle pytorch.org/memory_viz opens; returns the path.
    ``filename`` is a path (str or os.PathLike), never an open file
    descriptor (TypeError)."""
    filename = os.fspath(filename)
    snap = snapshot(allocator=allocator)  # before opening: an error must not truncate an existing file
    with open(filename, "wb") as f:
        pickle.dump(snap, f)
    return filename
