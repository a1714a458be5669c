"""Pointing torch's memory queries at memalloc's simulated device (host
backend).

On CUDA nothing needs patching: memalloc is torch's CUDA allocator (a
subclass of torch's CUDAPluggableAllocator, csrc/boundary/torch/cuda/), so
``torch.cuda.memory_allocated``, ``memory_stats``, ``memory_summary``,
``_snapshot``... answer from it through torch's own code.

On the host backend there is no CUDA device for torch to ask, so
:func:`patch` replaces those functions in ``torch.cuda`` and
``torch.cuda.memory`` with memalloc's equivalents (same names, same
meanings), including the device-level ones (``mem_get_info``,
``empty_cache``, the memory fraction); :func:`unpatch` restores torch's.
Code written against ``torch.cuda`` (Lightning's DeviceStatsMonitor, HF
Trainer's memory metrics) then runs against the simulated device in tests.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from memalloc.core import _hooks
from memalloc.features import stats
from memalloc.trace import recording, snapshots

# torch name -> memalloc function, on every backend.
_QUERIES: dict[str, Callable[..., Any]] = {
    "memory_stats": stats.memory_stats,
    "memory_stats_as_nested_dict": stats.memory_stats_as_nested_dict,
    "memory_allocated": stats.memory_allocated,
    "max_memory_allocated": stats.max_memory_allocated,
    "memory_reserved": stats.memory_reserved,
    "max_memory_reserved": stats.max_memory_reserved,
    "memory_cached": stats.memory_reserved,
    "max_memory_cached": stats.max_memory_reserved,
    "reset_peak_memory_stats": stats.reset_peak_memory_stats,
    "reset_accumulated_memory_stats": stats.reset_accumulated_memory_stats,
    "memory_summary": stats.memory_summary,
    "get_per_process_memory_fraction": stats.get_per_process_memory_fraction,
}


def _empty_cache() -> None:
    stats.empty_cache()  # torch.cuda.empty_cache() returns nothing


DEFAULT_TORCH_ENTRIES = 1_000_000


def _torch_record_memory_history(
    enabled: Any = "all",
    context: Any = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    **_: Any,
) -> None:
    if enabled is None or enabled is False:
        recording.record_history(False, device=device)
        return
    mode = "python" if stacks in ("python", "all") and context is not None else "tags"
    # torch's default max_entries is sys.maxsize (an unbounded deque); memalloc's
    # ring is preallocated, so "unbounded" becomes DEFAULT_TORCH_ENTRIES (64 MB).
    entries = int(max_entries) if int(max_entries) < (1 << 31) else DEFAULT_TORCH_ENTRIES
    recording.record_history(True, max_entries=entries, stacks=mode, device=device)


def _torch_snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict:
    return snapshots.snapshot(device)


def _torch_dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    snapshots.dump_snapshot(filename)


_QUERIES.update(
    {
        "_record_memory_history": _torch_record_memory_history,
        "_snapshot": _torch_snapshot,
        "_dump_snapshot": _torch_dump_snapshot,
    }
)

# Device-level functions, patched on the host backend together with the
# queries above (torch has no device to ask there).
_HOST_ONLY: dict[str, Callable[..., Any]] = {
    "mem_get_info": stats.mem_get_info,
    "empty_cache": _empty_cache,
    "set_per_process_memory_fraction": stats.set_per_process_memory_fraction,
}

_lock = threading.Lock()
_originals: dict[str, Any] = {
    name: getattr(torch.cuda.memory, name) for name in (*_QUERIES, *_HOST_ONLY) if hasattr(torch.cuda.memory, name)
}
_MODULES = (torch.cuda.memory, torch.cuda)


def patch(backend: str) -> None:
    """Makes ``torch.cuda.<query>`` answer from memalloc (through
    memalloc.core._hooks.replace_attribute, which keeps torch's originals)."""
    table = dict(_QUERIES)
    if backend == "host":
        table.update(_HOST_ONLY)
    with _lock:
        for name, fn in table.items():
            if name not in _originals:
                continue
            wrapped = functools.wraps(_originals[name])(_named(fn))
            for module in _MODULES:
                _hooks.replace_attribute(module, name, wrapped)


def _named(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call.__memalloc__ = True  # type: ignore[attr-defined]
    return call


def unpatch() -> None:
    """Restores torch's own functions."""
    with _lock:
        for name in _originals:
            for module in _MODULES:
                _hooks.restore_attribute(module, name)


def is_patched() -> bool:
    """True while ``torch.cuda`` memory queries answer from memalloc."""
    return any(module in _MODULES and name in _originals for module, name in _hooks.replaced_attributes())


__all__ = ["is_patched", "patch", "unpatch"]
