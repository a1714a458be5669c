"""Pointing torch's memory queries at memalloc, and guarding the two torch
features that fail inside torch under any pluggable allocator.

Under ``CUDAPluggableAllocator`` torch's own ``memory_allocated``,
``memory_stats``, ``memory_summary``, ``reset_peak_memory_stats``... raise
("does not yet support getDeviceStats"). :func:`patch` replaces them in
``torch.cuda`` and ``torch.cuda.memory`` with memalloc's equivalents (same
names, same meanings), so Lightning's DeviceStatsMonitor, HF Trainer's
memory metrics and users' own code keep working. :func:`unpatch` restores
torch's functions. On the host backend the device-level functions
(``mem_get_info``, ``empty_cache``, the memory fraction) are patched too,
since there torch has no device to ask.

Guards (CUDA backend): ``torch.backends.cudnn.benchmark = True`` makes cuDNN
query the allocator's cacheInfo, and ``torch.compile(mode="reduce-overhead")``
(CUDA graphs) checks pool allocations; both raise deep inside torch under a
pluggable allocator. memalloc refuses them up front with what to do instead.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable

import torch

from . import _install, stats

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


def _torch_record_memory_history(enabled: Any = "all", context: Any = "all", stacks: str = "all",
                                 max_entries: int = sys.maxsize, device: Any = None, **_: Any) -> None:
    from . import recording

    if enabled is None or enabled is False:
        recording.record_memory_history(False, device=device)
        return
    mode = "python" if stacks in ("python", "all") and context is not None else "tags"
    # torch's default max_entries is sys.maxsize (an unbounded deque); memalloc's
    # ring is preallocated, so "unbounded" becomes DEFAULT_TORCH_ENTRIES (64 MB).
    entries = int(max_entries) if int(max_entries) < (1 << 31) else DEFAULT_TORCH_ENTRIES
    recording.record_memory_history(True, max_entries=entries, stacks=mode, device=device)


def _torch_snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict:
    from . import recording

    return recording.snapshot(device)


def _torch_dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    from . import recording

    recording.dump_snapshot(filename)


_QUERIES.update({
    "_record_memory_history": _torch_record_memory_history,
    "_snapshot": _torch_snapshot,
    "_dump_snapshot": _torch_dump_snapshot,
})

# Only on the host backend: on CUDA torch's own versions reach memalloc
# through the pluggable hooks (reset, memory fraction) or the driver.
_HOST_ONLY: dict[str, Callable[..., Any]] = {
    "mem_get_info": stats.mem_get_info,
    "empty_cache": _empty_cache,
    "set_per_process_memory_fraction": stats.set_per_process_memory_fraction,
}

_lock = threading.Lock()
_originals: dict[str, Any] = {name: getattr(torch.cuda.memory, name)
                              for name in (*_QUERIES, *_HOST_ONLY) if hasattr(torch.cuda.memory, name)}
_patched: dict[str, Any] = {}
_guards_installed = False


def original(name: str) -> Callable[..., Any]:
    """torch's own function ``torch.cuda.memory.<name>`` (unpatched)."""
    return _originals[name]


def patch(backend: str) -> None:
    """Makes ``torch.cuda.<query>`` answer from memalloc."""
    table = dict(_QUERIES)
    if backend == "host":
        table.update(_HOST_ONLY)
    with _lock:
        for name, fn in table.items():
            if name not in _originals:
                continue
            wrapped = functools.wraps(_originals[name])(_named(fn))
            for module in (torch.cuda.memory, torch.cuda):
                setattr(module, name, wrapped)
            _patched[name] = wrapped


def _named(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    call.__memalloc__ = True  # type: ignore[attr-defined]
    return call


def unpatch() -> None:
    """Restores torch's own functions."""
    with _lock:
        for name in list(_patched):
            for module in (torch.cuda.memory, torch.cuda):
                setattr(module, name, _originals[name])
            del _patched[name]


def is_patched() -> bool:
    """True while ``torch.cuda`` memory queries answer from memalloc."""
    return bool(_patched)


# ---- guards -----------------------------------------------------------------
CUDNN_BENCHMARK_MESSAGE = (
    "torch.backends.cudnn.benchmark = True cannot be used with memalloc: cuDNN's autotuner asks "
    "the allocator for cacheInfo, which torch's CUDAPluggableAllocator does not support (it "
    "raises inside the first convolution). Keep torch.backends.cudnn.benchmark = False while "
    "memalloc is enabled, or run this program without memalloc."
)

COMPILE_MESSAGE = (
    "torch.compile with CUDA graphs (mode={mode!r}) cannot be used with memalloc: CUDA graph "
    "trees call checkPoolLiveAllocations, which torch's CUDAPluggableAllocator does not support "
    "(it raises inside torch). Use torch.compile(mode='default') or "
    "mode='max-autotune-no-cudagraphs', or run this program without memalloc."
)

_CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def check_compile_args(mode: Any = None, options: Any = None) -> None:
    """Raises RuntimeError when torch.compile would use CUDA graphs."""
    uses_graphs = mode in _CUDAGRAPH_MODES
    if isinstance(options, dict) and options.get("triton.cudagraphs"):
        uses_graphs, mode = True, f"{mode}, options triton.cudagraphs=True"
    inductor = sys.modules.get("torch._inductor.config")
    if mode is None and inductor is not None and getattr(inductor.triton, "cudagraphs", False):
        uses_graphs, mode = True, "default with torch._inductor.config.triton.cudagraphs=True"
    if uses_graphs:
        raise RuntimeError(COMPILE_MESSAGE.format(mode=mode))


class _GuardedBenchmark:
    """Descriptor replacing ``torch.backends.cudnn.benchmark``: refuses True
    while memalloc's CUDA backend is enabled, else defers to torch."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self.inner.__get__(obj, objtype)

    def __set__(self, obj: Any, value: Any) -> None:
        if value and _install.enabled_backend() == "cuda":
            raise RuntimeError(CUDNN_BENCHMARK_MESSAGE)
        self.inner.__set__(obj, value)


def install_guards() -> None:
    """Installs the cudnn.benchmark and torch.compile guards (CUDA backend).
    Raises at once when cudnn.benchmark is already True."""
    global _guards_installed
    if torch.backends.cudnn.benchmark:
        raise RuntimeError(CUDNN_BENCHMARK_MESSAGE)
    with _lock:
        if _guards_installed:
            return
        cls = type(torch.backends.cudnn)
        inner = cls.__dict__.get("benchmark")
        if inner is not None and hasattr(inner, "__set__"):
            setattr(cls, "benchmark", _GuardedBenchmark(inner))
        compile_fn = torch.compile

        @functools.wraps(compile_fn)
        def guarded_compile(*args: Any, **kwargs: Any) -> Any:
            check_compile_args(kwargs.get("mode"), kwargs.get("options"))
            return compile_fn(*args, **kwargs)

        torch.compile = guarded_compile
        _guards_installed = True


__all__ = ["check_compile_args", "install_guards", "is_patched", "original", "patch", "unpatch"]
