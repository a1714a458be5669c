"""The ``device`` argument of memalloc's torch-style queries.

One function, :func:`device_index`, turns what a caller passes (an int, a
``"cuda:N"`` string, a ``torch.device``, or None) into the device index the
allocator takes. Only CUDA devices are memalloc's: on the host backend the
simulated devices stand in for them and are named the same way. A ``"cpu"``
device is refused instead of being read as device 0. Range checks (a device
that does not exist) are the allocator's: memalloc._C names its devices;
:func:`existing_device_index` checks up front for objects that keep the
index for later (the leak and step trackers).
"""

from __future__ import annotations

import torch

from memalloc import _C
from memalloc.core import _state

DeviceLike = int | str | torch.device | None


def device_index(device: DeviceLike, backend: str | None = None) -> int:
    """The device index for ``device``; None (or ``"cuda"`` without an index)
    means torch's current CUDA device on the CUDA backend, 0 on the host
    backend (``backend``: "cuda" or "host"; default: the enabled one).

    Raises TypeError for a bool or a type that is not a device, ValueError
    for a device that is not a CUDA device (``"cpu"``), and torch's
    RuntimeError for an unparsable device string.
    """
    if isinstance(device, bool):
        raise TypeError("device must be an int, a str, a torch.device or None, not bool")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(
                f"device {str(device)!r} is not a CUDA device: memalloc manages CUDA devices (the host "
                "backend simulates them); pass an index, 'cuda', 'cuda:N' or torch.device('cuda', N)"
            )
        if device.index is not None:
            return device.index
        device = None
    if device is None:
        backend = backend if backend is not None else _state.enabled_backend()
        return torch.cuda.current_device() if backend == "cuda" else 0
    raise TypeError(f"device must be an int, a str, a torch.device or None, not {type(device).__name__}")


def existing_device_index(device: DeviceLike, allocator: _C.Allocator | None = None) -> int:
    """:func:`device_index`, checked against the devices of ``allocator``
    (default: the installed one) now (InvalidArgumentError, a ValueError,
    naming the valid range)."""
    # RuntimeError naming enable() when none is given and none is installed.
    a = _state.allocator_or_installed(allocator)
    index = device_index(device, a.backend_name)
    if not 0 <= index < a.device_count:
        raise _C.InvalidArgumentError(
            f"device {index} does not exist: the {a.backend_name} backend has "
            f"{a.device_count} device(s), indices 0..{a.device_count - 1}"
        )
    return index
