"""Installing memalloc as the process's allocator (``memalloc.enable``).

CUDA: builds the C++ CachingAllocator on the CUDA driver backend, registers
it in the core's AllocatorRegistry, and makes it torch's CUDA allocator: a
C++ subclass of torch's ``CUDAPluggableAllocator``
(csrc/boundary/cuda/torch_allocator.cpp) installed with
``changeCurrentAllocator``. torch's own functions then answer from memalloc
(``torch.cuda.memory_stats`` & co., ``empty_cache``, the memory fraction,
``record_stream``, CUDA graphs and graph trees, ``MemPool``, IPC, OOM
observers, ``_snapshot``), so nothing of torch is patched on CUDA.

Host: registers a CachingAllocator on the simulated host device; tensors come
from :func:`memalloc.host.empty`. torch's own allocators are untouched; its
``torch.cuda`` memory queries are pointed at memalloc (there is no CUDA
device for torch to ask).

One allocator per process: torch cannot swap an initialised allocator back.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch

from . import _C
from ._config import ConfigLike, config_text, config_value

_lock = threading.Lock()
_state: dict = {"backend": None, "config": None}

BACKENDS = ("auto", "cuda", "host")


def cuda_usable() -> tuple[bool, str]:
    """(True, "") when torch has CUDA and the driver sees a device; else
    (False, reason). Does not initialise CUDA in torch."""
    if torch.version.cuda is None:
        return False, f"this torch ({torch.__version__}) is a CPU-only build"
    ok, why = _C.cuda_available()
    return ok, why


def resolve_backend(requested: str, text: str) -> str:
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}: use one of {', '.join(BACKENDS)}")
    if requested == "auto":
        requested = config_value(text, "backend") or "auto"
    if requested == "auto":
        return "cuda" if cuda_usable()[0] else "host"
    return requested


def enable(backend: str = "auto", config: ConfigLike = None, *, verbose: bool = False,
           patch_torch: Optional[bool] = None) -> str:
    """Installs memalloc as this process's allocator and returns the backend
    used ("cuda" or "host").

    Args:
        backend: "auto" (CUDA when a GPU is usable, else the host backend),
            "cuda" or "host". "auto" defers to a ``backend:`` key in the config.
        config: ``key:value,...`` text or a mapping, applied after
            ``$MEMALLOC_CONF``. Keys: ``memalloc.config_keys()``.
        verbose: print which backend was chosen and why.
        patch_torch: host backend only: make ``torch.cuda.memory_allocated``,
            ``memory_stats``, ``memory_summary``... answer from memalloc's
            simulated device (default: the ``patch_torch`` config key, True;
            ``memalloc.unpatch_torch()`` undoes it). On CUDA torch's own
            functions answer from memalloc and nothing is patched.

    Must run before CUDA is initialised (before the first CUDA tensor).
    Calling it again with the same backend and config is a no-op; with a
    different one it raises RuntimeError.
    """
    text = config_text(config)
    chosen = resolve_backend(backend, text)
    with _lock:
        if _state["backend"] is not None:
            if (_state["backend"], _state["config"]) == (chosen, text):
                return chosen
            raise RuntimeError(
                f"memalloc is already enabled with the {_state['backend']} backend "
                f"(config {_state['config']!r}); it can be enabled once per process. "
                "Call memalloc.enable() once, at the start of the program."
            )
        if chosen == "cuda":
            _install_cuda(text)
        else:
            _C.install(_C.Allocator("host", text))
        _state["backend"], _state["config"] = chosen, text
    from . import _policy, _torch_patch, iteration, oom

    iteration.add_step_listener(_policy.on_step)
    oom.install()
    wants_patch = patch_torch if patch_torch is not None else config_value(text, "patch_torch") != "False"
    if chosen == "host" and wants_patch:
        _torch_patch.patch(chosen)
    entries = int(config_value(text, "record_history") or 0)
    if entries:
        from . import recording

        recording.record_memory_history(True, max_entries=entries,
                                        stacks=config_value(text, "record_stacks") or "python")
    if verbose:
        why = "" if chosen == "cuda" or backend == "host" else f" ({cuda_usable()[1]})"
        print(f"memalloc: enabled on the {chosen} backend{why}")
    return chosen


def _install_cuda(text: str) -> None:
    ok, why = cuda_usable()
    if not ok:
        raise RuntimeError(f"memalloc.enable(backend='cuda'): CUDA is not usable: {why}")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "memalloc.enable() was called after CUDA was initialised: torch cannot swap an "
            "allocator that has already been used. Call memalloc.enable() before the first "
            "CUDA tensor (at the top of the script), or run the script with "
            "`python -m memalloc run script.py`."
        )
    if not _C.has_torch_cuda:
        raise RuntimeError(
            "memalloc.enable(backend='cuda'): this memalloc build has no CUDA part (it was built against a "
            "torch without CUDA, or with MEMALLOC_NO_CUDA=1). Rebuild it against this CUDA torch: "
            "`pip install --no-build-isolation -e .`"
        )
    allocator = _C.Allocator("cuda", text)
    _C.install_torch_cuda(allocator)  # refuses (changing nothing) when torch's allocator is in use
    _C.install(allocator)  # memalloc's own API, the deleters and the C entry points


def is_enabled() -> bool:
    """True once :func:`enable` has installed memalloc in this process."""
    return _state["backend"] is not None


def enabled_backend() -> Optional[str]:
    """"cuda", "host", or None when memalloc is not enabled."""
    return _state["backend"]


def installed_config() -> Optional[str]:
    """The canonical config text memalloc was enabled with, or None."""
    return _state["config"]


def installed_allocator() -> _C.Allocator:
    """The allocator installed by :func:`enable`; RuntimeError when none."""
    a = _C.installed()
    if a is None:
        raise RuntimeError("memalloc is not enabled: call memalloc.enable() first")
    return a
