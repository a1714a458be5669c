"""Installing memalloc as the process's allocator (``memalloc.enable``).

CUDA: builds the C++ CachingAllocator on the CUDA driver backend, registers
it in the core's AllocatorRegistry, and makes it torch's CUDA allocator: a
C++ subclass of torch's ``CUDAPluggableAllocator``
(csrc/boundary/torch/cuda/torch_allocator.cpp) installed with
``changeCurrentAllocator``. torch's own functions then answer from memalloc
(``torch.cuda.memory_stats`` & co., ``empty_cache``, the memory fraction,
``record_stream``, CUDA graphs and graph trees, ``MemPool``, IPC, OOM
observers, ``_snapshot``), so nothing of torch is patched on CUDA.

Host: registers a CachingAllocator on the simulated host device; tensors come
from :func:`memalloc.host.empty`. torch's own allocators are untouched; its
``torch.cuda`` memory queries are pointed at memalloc (there is no CUDA
device for torch to ask).

One allocator per process: torch cannot swap an initialised allocator back.
This is the top of the library's layers (below only ``__init__``, the pytest
plugin and the CLI): it wires every feature; the state it sets lives in
memalloc/core/_state.py.
"""

from __future__ import annotations

import torch

from memalloc import _C
from memalloc.core import _policy, _settings, _state, iteration
from memalloc.core._config import PRODUCT_DEFAULTS, ConfigLike, config_text, config_value
from memalloc.features import flight, oom, phases
from memalloc.install import _torch_patch
from memalloc.trace import recording


def enable(
    backend: str = "auto", config: ConfigLike = None, *, verbose: bool = False, patch_torch: bool | None = None
) -> str:
    """Installs memalloc as this process's allocator and returns the backend
    used ("cuda" or "host").

    Args:
        backend: "auto" (CUDA when a GPU is usable, else the host backend),
            "cuda" or "host". "auto" defers to a ``backend:`` key in the config.
        config: ``key:value,...`` text or a mapping, applied after
            ``$MEMALLOC_CONF``, which is applied after the keys memalloc
            shares with ``$PYTORCH_CUDA_ALLOC_CONF`` (memalloc/core/_settings.py),
            which are applied after memalloc's defaults
            (``expandable_segments:True``; ``expandable_segments:False``
            gives native's plain segments). Keys: ``memalloc.config_keys()``.
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
    # memalloc's defaults first (expandable segments), then torch's own
    # variable (its shared keys), then MEMALLOC_CONF, then config: later keys win.
    torch_var, _ = _settings.torch_env_text()  # memalloc's defaults never fail: a bad base is torch's variable's
    text = config_text(
        config,
        base=",".join(p for p in (PRODUCT_DEFAULTS, _settings.startup_text()) if p),
        base_source=f"{torch_var} (its keys memalloc shares with torch)" if torch_var else "memalloc's base config",
    )
    chosen = _state.resolve_backend(backend, text)
    with _state.lock:
        if _state.is_enabled():
            if (_state.enabled_backend(), _state.installed_config()) == (chosen, text):
                return chosen
            raise RuntimeError(
                f"memalloc is already enabled with the {_state.enabled_backend()} backend "
                f"(config {_state.installed_config()!r}); it can be enabled once per process. "
                "Call memalloc.enable() once, at the start of the program."
            )
        if chosen == "cuda":
            _install_cuda(text)
        else:
            _C.install(_C.Allocator("host", text))
        _state.set_enabled(chosen, text)
    # torch's settings: per_process_memory_fraction from its variable, and
    # _set_allocator_settings at run time (memalloc/core/_settings.py).
    _settings.apply_startup_fraction(_state.installed_allocator())
    _settings.install(_state.installed_allocator())
    # Call sites from here on (config call_sites, default True): OOM messages,
    # top_holders and leak reports name lines with no setup.
    _C.set_stack_mode(max(_C.stack_mode(), _state.base_stack_mode()))
    iteration.add_step_listener(_policy.on_step)
    # The training phases behind memory_breakdown(): backward(), optimizer
    # steps and step boundaries, hooked in torch (memalloc/features/phases.py).
    phases.install()
    oom.install()
    wants_patch = patch_torch if patch_torch is not None else config_value(text, "patch_torch") != "False"
    if chosen == "host" and wants_patch:
        _torch_patch.patch(chosen)
    entries = int(config_value(text, "record_history") or 0)
    flight_dir = config_value(text, "flight_recorder")
    if flight_dir:
        # the rings in a file that outlives the process (memalloc/features/flight.py)
        flight.start(
            flight_dir,
            records=entries or flight.DEFAULT_RECORDS,
            keep=config_value(text, "flight_recorder_keep") == "True",
        )
    elif entries:
        recording.record_history(True, max_entries=entries, stacks=config_value(text, "record_stacks") or "python")
    if verbose:
        why = "" if chosen == "cuda" or backend == "host" else f" ({_state.cuda_usable()[1]})"
        print(f"memalloc: enabled on the {chosen} backend{why}")
    return chosen


def _install_cuda(text: str) -> None:
    ok, why = _state.cuda_usable()
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
