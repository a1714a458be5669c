"""memalloc: a compiled caching allocator for PyTorch that keeps the accounting.

Quick start::

    import memalloc
    memalloc.enable()            # before the first CUDA tensor
    ...                          # train as usual
    print(memalloc.memory_allocated(), memalloc.memory_reserved())

Without a GPU, ``memalloc.enable(backend="host")`` runs the same allocator
on a simulated device; :func:`memalloc.host.empty` makes real torch tensors
whose storage comes from it.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from . import _C, host
from ._C import (
    Allocator,
    DriverError,
    InvalidArgumentError,
    InvalidPointerError,
    MemallocError,
)
from ._config import config_text
from ._install import cuda_usable, enable, enabled_backend, installed_allocator, is_enabled

__version__ = "0.1.0"

DeviceLike = Union[int, str, torch.device, None]

__all__ = [
    "Allocator",
    "DriverError",
    "InvalidArgumentError",
    "InvalidPointerError",
    "MemallocError",
    "config_keys",
    "config_text",
    "cuda_usable",
    "empty_cache",
    "enable",
    "enabled_backend",
    "host",
    "installed_allocator",
    "is_enabled",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats_raw",
]


def config_keys() -> list[str]:
    """The keys accepted in ``MEMALLOC_CONF`` and ``enable(config=...)``."""
    return list(_C.config_keys())


def _device_index(device: DeviceLike) -> int:
    """Device index for ``device`` (None = torch's current CUDA device on the
    CUDA backend, 0 on the host backend)."""
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.index is not None:
            return device.index
        device = None
    if device is None:
        return torch.cuda.current_device() if enabled_backend() == "cuda" else 0
    raise TypeError(f"device must be an int, a str, a torch.device or None, not {type(device).__name__}")


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes held by live tensors on ``device`` as torch counts them (block
    sizes after rounding), like ``torch.cuda.memory_allocated``."""
    stats = installed_allocator().stats(_device_index(device))
    return int(stats["allocated_bytes"]["all"]["current"])


def memory_reserved(device: DeviceLike = None) -> int:
    """Bytes obtained from the device and held by memalloc (live + cached)
    on ``device``, like ``torch.cuda.memory_reserved``."""
    stats = installed_allocator().stats(_device_index(device))
    return int(stats["reserved_bytes"]["all"]["current"])


def memory_stats_raw(device: DeviceLike = None) -> dict:
    """memalloc's counters for ``device`` as nested dicts
    (``stats[name][pool][current|peak|allocated|freed]``, bytes or counts)."""
    return installed_allocator().stats(_device_index(device))


def empty_cache(device: DeviceLike = None) -> int:
    """Returns every fully free cached segment of ``device`` to the driver
    (all devices when ``device`` is None); returns the bytes released."""
    a = installed_allocator()
    devices = range(a.device_count) if device is None else [_device_index(device)]
    return sum(a.empty_cache(d) for d in devices)


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes of the device as the backend reports them."""
    free, total = installed_allocator().mem_get_info(_device_index(device))
    return int(free), int(total)
