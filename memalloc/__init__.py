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

import sys

import torch  # noqa: F401 - loads libc10, which memalloc._C links against

from memalloc import _C
from memalloc._C import (
    Allocator,
    DriverError,
    InvalidArgumentError,
    InvalidPointerError,
    MemallocError,
)
from memalloc.core._config import config_text
from memalloc.core._policy import empty_cache_policy, set_empty_cache_policy
from memalloc.core._state import cuda_usable, enabled_backend, installed_allocator, is_enabled
from memalloc.core.iteration import add_step_listener, auto_step, remove_step_listener, step, steps, steps_of
from memalloc.features import advisor, leaks, phases, replay, stats
from memalloc.features.breakdown import MemoryBreakdown, memory_breakdown
from memalloc.features.leaks import LeakTracker, leak_check
from memalloc.features.oom import set_oom_report, top_holders
from memalloc.features.planner import BatchPlan, PlannerError, largest_batch
from memalloc.features.stats import (
    empty_cache,
    get_per_process_memory_fraction,
    list_gpu_processes,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_stats_raw,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from memalloc.features.tracker import StepTracker
from memalloc.integration import _torch_patch, host
from memalloc.integration._install import enable
from memalloc.integration._torch_patch import is_patched as torch_is_patched
from memalloc.reporters.leak_report import LeakError, LeakReport
from memalloc.trace import recording
from memalloc.trace.recording import events, events_array, record_memory_history
from memalloc.trace.snapshots import dump_snapshot, snapshot
from memalloc.trace.tags import tag
from memalloc.trace.trace_files import load_trace, save_trace

__version__ = "0.1.0"

# The module paths the docs name keep working under their short names
# (`import memalloc.advisor`, `memalloc.host.empty(...)`,
# `from memalloc.replay import smallest_capacity_mb`), wherever the layout
# keeps the module. (memalloc.pytest_plugin is a file of its own at the top:
# pytest loads it by that name and it imports pytest.)
_PUBLIC_MODULES = {
    "advisor": advisor,
    "host": host,
    "leaks": leaks,
    "phases": phases,
    "recording": recording,
    "replay": replay,
    "stats": stats,
}
for _name, _module in _PUBLIC_MODULES.items():
    sys.modules[f"{__name__}.{_name}"] = _module
del _name, _module

__all__ = [
    "Allocator",
    "BatchPlan",
    "DriverError",
    "InvalidArgumentError",
    "InvalidPointerError",
    "MemallocError",
    "MemoryBreakdown",
    "PlannerError",
    "StepTracker",
    "config_keys",
    "config_text",
    "dump_snapshot",
    "events",
    "events_array",
    "load_trace",
    "record_memory_history",
    "save_trace",
    "snapshot",
    "tag",
    "cuda_usable",
    "empty_cache",
    "empty_cache_policy",
    "enable",
    "enabled_backend",
    "get_per_process_memory_fraction",
    "host",
    "installed_allocator",
    "is_enabled",
    "largest_batch",
    "list_gpu_processes",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_breakdown",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_stats_raw",
    "memory_summary",
    "patch_torch",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_empty_cache_policy",
    "set_per_process_memory_fraction",
    "step",
    "leak_check",
    "set_oom_report",
    "top_holders",
    "LeakTracker",
    "LeakReport",
    "LeakError",
    "steps",
    "steps_of",
    "add_step_listener",
    "remove_step_listener",
    "auto_step",
    "torch_is_patched",
    "unpatch_torch",
]


def config_keys() -> list[str]:
    """The keys accepted in ``MEMALLOC_CONF`` and ``enable(config=...)``."""
    return list(_C.config_keys())


def patch_torch() -> None:
    """Makes torch.cuda's memory queries answer from memalloc's Python
    functions (done by :func:`enable` on the host backend unless
    ``patch_torch=False``; on CUDA torch's own functions already answer from
    memalloc and need no patch)."""
    _torch_patch.patch(enabled_backend() or "host")


def unpatch_torch() -> None:
    """Restores torch.cuda's own memory queries."""
    _torch_patch.unpatch()
