"""torch's allocator settings, applied to memalloc: ``PYTORCH_CUDA_ALLOC_CONF``
(or ``PYTORCH_ALLOC_CONF``) when memalloc is enabled, and
``torch.cuda.memory._set_allocator_settings(...)`` at run time.

The keys memalloc shares with torch take effect exactly as natively:

- ``max_split_size_mb``, ``roundup_power2_divisions`` (one value or torch's
  list ``[64:8,256:4,>:1]``), ``garbage_collection_threshold``,
  ``expandable_segments``, ``graph_capture_record_stream_reuse`` and
  ``per_process_memory_fraction``;
- at run time each call resets ``max_split_size_mb``,
  ``roundup_power2_divisions`` and ``garbage_collection_threshold`` to their
  defaults unless the text sets them (torch's rule), and keeps
  ``expandable_segments`` (it applies to new segments) and
  ``graph_capture_record_stream_reuse`` unless they are given.

At startup memalloc's own default (``expandable_segments:True``,
memalloc/core/_config.py) comes first, then the environment: torch's
variable, then ``MEMALLOC_CONF`` and ``enable()``'s ``config`` override it
key by key. The ``pinned_*`` keys belong to torch's
pinned host allocator, which memalloc does not replace: torch applies them.
Every other key (``backend:cudaMallocAsync``, ``release_lock_on_cudamalloc``,
``max_non_split_rounding_mb``...)
has no effect under memalloc, and one ``RuntimeWarning`` names them.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Any

import torch

from memalloc import _C
from memalloc.core import _hooks
from memalloc.core._config import config_value

TORCH_ENV_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch reads the first that is set
SHARED_KEYS = (
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "graph_capture_record_stream_reuse",
)
KEPT_KEYS = ("expandable_segments", "graph_capture_record_stream_reuse")  # kept at run time unless given
FRACTION_KEY = "per_process_memory_fraction"


def torch_env_text() -> tuple[str, str]:
    """(variable name, its text) of the torch settings variable in use; ("", "") when none is set."""
    for name in TORCH_ENV_VARS:
        text = os.environ.get(name, "").strip()
        if text:
            return name, text
    return "", ""


def entries(text: str) -> list[tuple[str, str]]:
    """``key:value`` pairs of torch's settings text, in order; a bracketed
    value keeps its own commas (``roundup_power2_divisions:[64:8,>:1]``).
    The one splitter of settings text is the core's (``_C.config_entries``),
    so torch's text and MEMALLOC_CONF split alike."""
    return [tuple(entry) for entry in _C.config_entries(text)]


def split(text: str) -> tuple[str, float | None, list[str]]:
    """(memalloc config text of the shared keys, the memory fraction or
    None, the keys memalloc does not support) of torch's settings text."""
    shared, fraction, unsupported = [], None, []
    for key, value in entries(text):
        if key in SHARED_KEYS:
            shared.append(f"{key}:{value}")
        elif key == FRACTION_KEY:
            fraction = float(value)
        elif key.startswith("pinned_") or (key == "backend" and value == "native"):
            continue  # torch's pinned host allocator; native backend is what memalloc replaces
        else:
            unsupported.append(f"{key}:{value}")
    return ",".join(shared), fraction, unsupported


def _warn_unsupported(unsupported: list[str], where: str) -> None:
    if unsupported:
        warnings.warn(
            f"memalloc is torch's CUDA allocator, so these keys of {where} have no effect: "
            f"{', '.join(unsupported)} (memalloc applies max_split_size_mb, roundup_power2_divisions, "
            "garbage_collection_threshold, expandable_segments, graph_capture_record_stream_reuse and "
            "per_process_memory_fraction; torch "
            "applies the pinned_* keys)",
            RuntimeWarning,
            stacklevel=4,
        )


def startup_text() -> str:
    """The shared keys of the torch settings variable, as memalloc config
    text (the lowest layer of enable()'s config); warns once about the
    keys memalloc does not support."""
    name, text = torch_env_text()
    if not text:
        return ""
    shared, _, unsupported = split(text)
    _warn_unsupported(unsupported, name)
    return shared


def _set_fraction(allocator: _C.Allocator, fraction: float | None) -> None:
    if fraction is not None:
        for d in range(allocator.device_count):
            allocator.set_memory_fraction(fraction, d)


def apply_startup_fraction(allocator: _C.Allocator) -> None:
    """``per_process_memory_fraction`` of the torch settings variable, on every device."""
    _, text = torch_env_text()
    _set_fraction(allocator, split(text)[1] if text else None)


def apply(allocator: _C.Allocator, text: str) -> None:
    """torch's run-time settings text applied to ``allocator`` with torch's
    rules (module docstring). Raises memalloc.errors.InvalidArgumentError for a bad
    value of a shared key, changing nothing."""
    shared, fraction, unsupported = split(text)
    current = allocator.settings()
    keep = [f"{key}:{config_value(current, key) or 'False'}" for key in KEPT_KEYS if config_value(shared, key) is None]
    allocator.apply_settings(",".join(keep + ([shared] if shared else [])))
    _set_fraction(allocator, fraction)
    _warn_unsupported(unsupported, "torch.cuda.memory._set_allocator_settings")


# torch's run-time entry points: the Python function and the C binding it
# calls (torch 2.13 tells users to call the binding directly).
ENTRY_POINTS = ((torch.cuda.memory, "_set_allocator_settings"), (torch._C, "_accelerator_setAllocatorSettings"))
_local = threading.local()


def install(allocator: _C.Allocator) -> None:
    """Makes torch's run-time settings calls apply to ``allocator`` too:
    torch's own function runs first (it validates the text and applies its
    keys to torch's other allocators), then memalloc applies the shared
    keys, once per call however many entry points it passes through."""
    for module, name in ENTRY_POINTS:
        if hasattr(module, name):
            _hooks.replace_attribute(module, name, _wrap(_hooks.original_attribute(module, name), allocator))


def _wrap(original: Any, allocator: _C.Allocator) -> Any:
    @functools.wraps(original)
    def set_allocator_settings(env: str, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        try:
            result = original(env, *args, **kwargs)
        finally:
            _local.depth = depth
        if depth == 0:
            apply(allocator, env)
        return result

    return set_allocator_settings
