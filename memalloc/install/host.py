"""Real torch tensors whose storage comes from memalloc's host backend.

The host backend is a simulated device (a capacity limit, host memory behind
it). :func:`empty` returns an ordinary CPU tensor whose bytes were allocated
by memalloc; when the last view of it dies, its memory goes back to the
allocator (a DLPack capsule with a deleter). Python lifetimes, loops and
leaks are therefore real in tests that run without a GPU.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch

from memalloc import _C

ShapeLike = int | Sequence[int] | torch.Size


def _shape(shape: ShapeLike) -> tuple[int, ...]:
    if isinstance(shape, int):
        dims: tuple = (shape,)
    else:
        try:
            dims = tuple(shape)
        except TypeError:
            raise TypeError(f"shape must be an int or a sequence of ints, not {type(shape).__name__}") from None
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"shape entries must be ints, got {d!r} in {shape!r}")
        if d < 0:
            raise ValueError(f"negative dimension {d} in shape {tuple(dims)}: sizes must be >= 0")
    return dims


def _dtype(dtype: torch.dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be torch.dtype, not {type(dtype).__name__}")
    return dtype


def _host_allocator(allocator: _C.Allocator | None) -> _C.Allocator:
    if allocator is not None:
        if not isinstance(allocator, _C.Allocator):
            raise TypeError(
                f"allocator must be a memalloc.Allocator or None (the installed one), not {type(allocator).__name__}"
            )
        return allocator
    a = _C.installed()
    if a is None or a.backend_name != "host":
        raise RuntimeError(
            "memalloc.host.empty needs a host-backend allocator: call "
            "memalloc.enable(backend='host') first, or pass allocator=memalloc.Allocator('host')"
        )
    return a


def empty(
    shape: ShapeLike,
    dtype: torch.dtype = torch.float32,
    device: int = 0,
    *,
    allocator: _C.Allocator | None = None,
    stream: int = 0,
) -> torch.Tensor:
    """An uninitialised CPU tensor of ``shape`` and ``dtype`` whose
    ``numel * element_size`` bytes come from memalloc's simulated ``device``.

    Uses the installed host allocator unless ``allocator`` is given. Raises
    torch.OutOfMemoryError when the simulated device is full, and ValueError
    when the byte count exceeds 2**63 - 1. Every argument is checked before
    any memory is taken. Tensors with no elements do not touch the allocator
    (as with CUDA).
    """
    dims = _shape(shape)
    nbytes = math.prod(dims) * torch.empty((), dtype=_dtype(dtype)).element_size()
    if nbytes == 0:
        return torch.empty(dims, dtype=dtype)
    capsule = _host_allocator(allocator).host_buffer(nbytes, device, stream)
    raw = torch.utils.dlpack.from_dlpack(capsule)
    return raw.view(dtype).view(dims)


def zeros(
    shape: ShapeLike, dtype: torch.dtype = torch.float32, device: int = 0, *, allocator: _C.Allocator | None = None
) -> torch.Tensor:
    """Like :func:`empty`, filled with zeros."""
    return empty(shape, dtype, device, allocator=allocator).zero_()


def use_for_cpu_tensors() -> None:
    """Makes every CPU tensor torch creates from now on (activations,
    gradients, optimizer state of a model run on the CPU) come from device 0
    of the host backend, so that memalloc's accounting, recording, leak
    reports and step tracker see a real training loop on a machine without a
    GPU. Needs ``memalloc.enable(backend="host")`` first; cannot be undone
    (tensors made before keep their own allocator). The simulated device's
    capacity (``host_capacity_mb``) then bounds all CPU tensor memory.
    """
    _C.use_for_torch_cpu()


@contextlib.contextmanager
def cpu_tensors_from(allocator: _C.Allocator) -> Iterator[_C.Allocator]:
    """Inside the ``with`` block, every CPU tensor torch creates comes from
    device 0 of ``allocator`` (a host-backend ``memalloc.Allocator`` that
    need not be installed); after it, torch's previous CPU allocator is back.
    Tensors made inside go back to ``allocator`` whenever they die, even
    after the block. This is :func:`use_for_cpu_tensors` for one scope,
    without ``memalloc.enable()``: a real model's activations, gradients and
    optimizer state in ``allocator``, for its leak reports, step tracker and
    accounting in this process::

        a = memalloc.Allocator("host", "host_capacity_mb:512")
        with memalloc.host.cpu_tensors_from(a), memalloc.leak_check(allocator=a) as check:
            train(model)

    One block at a time, on one thread while no other thread makes CPU
    tensors (the route is process-wide). Raises ValueError
    (memalloc.errors.InvalidArgumentError) when another block is open.
    """
    if not isinstance(allocator, _C.Allocator):
        raise TypeError(f"allocator must be a memalloc.Allocator on the host backend, not {type(allocator).__name__}")
    route = _C.CpuRoute(allocator)
    try:
        yield allocator
    finally:
        route.close()


def used_for_cpu_tensors() -> bool:
    """Whether :func:`use_for_cpu_tensors` has been called in this process."""
    return bool(_C.used_for_torch_cpu())
