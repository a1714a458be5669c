"""torch-compatible memory queries answered from memalloc's accounting.

Names and meanings mirror ``torch.cuda``: ``memory_stats`` returns an
OrderedDict with torch's flattened key names
(``"allocated_bytes.all.current"``, ``"num_ooms"``, ...), and the scalar
queries are read from it exactly as torch reads its own. All sizes are bytes.
``memory_summary`` renders torch's own table (torch's formatter, fed with
memalloc's statistics) and adds a memalloc footer.

This is the public module ``memalloc.memory`` (torch's are in
``torch.cuda.memory``). Beside torch's names it holds the two of memalloc's
own that act on the same cache: ``empty_cache_policy()`` and
``set_empty_cache_policy(...)`` (when memalloc empties it by itself), and
``memory_stats_raw()`` (its counters, torch's and its own).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import torch

from memalloc.core import _policy, _state
from memalloc.core._device import DeviceLike, device_index
from memalloc.core._policy import empty_cache_policy, set_empty_cache_policy
from memalloc.features.breakdown import memory_breakdown

__all__ = [
    "empty_cache",
    "empty_cache_policy",
    "get_per_process_memory_fraction",
    "list_gpu_processes",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_stats_raw",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_empty_cache_policy",
    "set_per_process_memory_fraction",
]

# memalloc's own counters that torch does not have: kept out of the
# torch-format dictionaries, available through memory_stats_raw().
_MEMALLOC_ONLY = ("num_gc_releases", "num_device_free_failures")
_summary_lock = threading.Lock()
# torch's own table formatter, taken before memalloc.enable() can patch
# torch.cuda (memalloc/install/_torch_patch.py imports this module first).
_TORCH_MEMORY_SUMMARY = torch.cuda.memory.memory_summary


def memory_stats_raw(device: DeviceLike = None) -> dict:
    """memalloc's counters for ``device`` as nested dicts
    (``stats[name][pool][current|peak|allocated|freed]``, bytes or counts),
    including memalloc-only counters such as ``num_gc_releases``."""
    return _state.installed_allocator().stats(device_index(device))


def memory_stats_as_nested_dict(device: DeviceLike = None) -> dict[str, Any]:
    """The statistics in the nested layout of
    ``torch.cuda.memory_stats_as_nested_dict``."""
    a = _state.installed_allocator()
    stats = a.stats(device_index(device))
    for key in _MEMALLOC_ONLY:
        stats.pop(key, None)
    stats["max_split_size"] = a.max_split_size
    return stats


def memory_stats(device: DeviceLike = None) -> collections.OrderedDict[str, int]:
    """Like ``torch.cuda.memory_stats``: a sorted OrderedDict of
    ``"<stat>.<all|small_pool|large_pool>.<current|peak|allocated|freed>"``,
    ``"oversize_allocations.<...>"``, ``"num_ooms"``, ``"num_alloc_retries"``,
    ``"num_device_alloc"``, ... (bytes for ``*_bytes``, counts otherwise)."""
    flat: list[tuple[str, int]] = []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat.append((prefix, obj))

    walk("", memory_stats_as_nested_dict(device))
    flat.sort()
    return collections.OrderedDict(flat)


def _current(device: DeviceLike, key: str) -> int:
    return int(memory_stats(device).get(key, 0))


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes held by live tensors (block sizes after rounding), like
    ``torch.cuda.memory_allocated``."""
    return _current(device, "allocated_bytes.all.current")


def max_memory_allocated(device: DeviceLike = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last
    :func:`reset_peak_memory_stats`, in bytes."""
    return _current(device, "allocated_bytes.all.peak")


def memory_reserved(device: DeviceLike = None) -> int:
    """Bytes obtained from the device and held by memalloc (live + cached),
    like ``torch.cuda.memory_reserved``."""
    return _current(device, "reserved_bytes.all.current")


def max_memory_reserved(device: DeviceLike = None) -> int:
    """Peak of :func:`memory_reserved` since start or the last reset, in bytes."""
    return _current(device, "reserved_bytes.all.peak")


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    """Sets every peak to its current value (``torch.cuda.reset_peak_memory_stats``)."""
    _state.installed_allocator().reset_peak_stats(device_index(device))


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    """Zeroes the accumulated ``allocated``/``freed`` totals and the event
    counts (``num_ooms``, ``num_alloc_retries``, ...), like torch."""
    _state.installed_allocator().reset_accumulated_stats(device_index(device))


def empty_cache(device: DeviceLike = None) -> int:
    """Returns every fully free cached segment of ``device`` to the device
    (all devices when ``device`` is None); returns the bytes released."""
    a = _state.installed_allocator()
    devices = range(a.device_count) if device is None else [device_index(device)]
    return sum(a.empty_cache(d) for d in devices)


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes of the device as the backend reports them."""
    free, total = _state.installed_allocator().mem_get_info(device_index(device))
    return int(free), int(total)


def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """torch's ``memory_summary`` table for ``device``, computed from
    memalloc's statistics, followed by memalloc's backend and empty-cache
    policy and the bytes by category now and at the step's peak
    (:func:`memalloc.memory_breakdown`)."""
    index = device_index(device)
    formatter = _TORCH_MEMORY_SUMMARY
    module = torch.cuda.memory
    with _summary_lock:
        # torch's formatter reads the module-level memory_stats; point it at
        # memalloc for this call when the torch functions are not patched.
        saved = module.memory_stats
        module.memory_stats = memory_stats
        try:
            table = formatter(device=index, abbreviated=abbreviated)
        finally:
            module.memory_stats = saved
    return table + _footer(index)


def _footer(index: int) -> str:
    """The bytes by category, then memalloc's line (backend, policy)."""
    a = _state.installed_allocator()
    split = a.max_split_size
    return (
        memory_breakdown(index).to_text() + "\n"
        f"memalloc: {a.backend_name} backend, device {index}; "
        f"max_split_size {'unlimited' if split < 0 else f'{split} B'}; "
        f"empty-cache policy: {_policy.describe(index)}\n"
    )


def list_gpu_processes(device: DeviceLike = None) -> str:
    """What nvidia-smi would show for the device (through NVML when
    ``pynvml`` is importable), plus memalloc's share, as text."""
    index = device_index(device)
    free, total = mem_get_info(index)
    lines = [
        f"device {index} ({_state.enabled_backend()} backend): "
        f"{(total - free) / 2**20:.2f} MiB used of {total / 2**20:.2f} MiB"
    ]
    lines.append(
        f"memalloc in this process: {memory_reserved(index) / 2**20:.2f} MiB reserved, "
        f"{memory_allocated(index) / 2**20:.2f} MiB allocated"
    )
    if _state.enabled_backend() == "cuda":
        lines.extend(_nvml_processes(index))
    return "\n".join(lines)


def _nvml_processes(index: int) -> list[str]:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return ["(per-process figures need pynvml: pip install nvidia-ml-py)"]
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLError as e:
        return [f"(NVML unavailable: {e})"]
    if not procs:
        return ["no processes are running"]
    return [f"process {p.pid:>10d} uses {(p.usedGpuMemory or 0) / 2**20:12.3f} MiB GPU memory" for p in procs]


def get_per_process_memory_fraction(device: DeviceLike = None) -> float:
    """The memory fraction set for ``device`` (1.0 when none is set)."""
    return float(_state.installed_allocator().memory_fraction(device_index(device)))


def set_per_process_memory_fraction(fraction: float, device: DeviceLike = None) -> None:
    """Caps memalloc's reserved bytes on ``device`` at ``fraction`` (a float
    in [0, 1], as torch: 0 allows nothing) of its capacity in bytes.

    The fraction is not coerced: like torch, a str or a bool is a TypeError
    (raised by memalloc._C, which also checks the range)."""
    _state.installed_allocator().set_memory_fraction(fraction, device_index(device))
