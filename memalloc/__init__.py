"""memalloc: a compiled caching allocator for PyTorch that keeps the accounting.

Quick start::

    import memalloc, torch
    memalloc.enable()            # before the first CUDA tensor
    ...                          # train as usual
    print(torch.cuda.memory_allocated(), torch.cuda.memory_reserved())

Without a GPU, ``memalloc.enable(backend="host")`` runs the same allocator
on a simulated device; :func:`memalloc.host.use_for_cpu_tensors` puts the
script's CPU tensors on it, and ``memalloc.memory`` answers torch.cuda's
memory queries for it.

The public names, one per question (``__all__``): turning it on
(``enable`` ...), marking steps (``step``, ``steps_of``, ``auto_step``),
what leaks (``leak_check``, ``LeakTracker``), memory per step
(``StepTracker``), where it goes (``memory_breakdown``, ``top_holders``),
what held it at an OOM (``set_oom_report``), what fits
(``largest_batch``), what happened (``record_history``, ``events``,
``snapshot``, ``save_trace`` ...). Modules: ``memalloc.memory`` (torch.cuda's
memory queries, by torch.cuda.memory's names and signatures),
``memalloc.host`` (the simulated device), ``memalloc.errors`` (every
exception), and, for less common needs, ``memalloc.iteration`` (step
listeners), ``memalloc.recording`` (raw event arrays), ``memalloc.leaks``,
``memalloc.advisor``, ``memalloc.phases``, ``memalloc.replay``.
"""

import sys as _sys

import torch as _torch  # noqa: F401 - loads libc10, which memalloc._C links against

from memalloc import _C, errors
from memalloc._C import Allocator, MemallocError
from memalloc.core import iteration
from memalloc.core._state import enabled_backend, installed_allocator, is_enabled
from memalloc.core.iteration import auto_step, step, steps_of
from memalloc.features import advisor, leaks, phases, replay, stats
from memalloc.features.breakdown import memory_breakdown
from memalloc.features.leaks import LeakTracker, leak_check
from memalloc.features.oom import set_oom_report, top_holders
from memalloc.features.planner import largest_batch
from memalloc.features.tracker import StepTracker
from memalloc.install import _torch_patch, host
from memalloc.install._install import enable
from memalloc.trace import recording
from memalloc.trace.recording import events, record_history
from memalloc.trace.snapshots import dump_snapshot, snapshot
from memalloc.trace.tags import tag
from memalloc.trace.trace_files import load_trace, save_trace

__version__ = "0.1.0"

# Short module paths (`import memalloc.memory`, `memalloc.host.empty(...)`,
# `from memalloc.leaks import LeakReport`), wherever the layout
# keeps the module. (memalloc.pytest_plugin is a file of its own at the top:
# pytest loads it by that name and it imports pytest; memalloc.errors is a
# module of its own.)
_PUBLIC_MODULES = {
    "advisor": advisor,
    "host": host,
    "iteration": iteration,
    "leaks": leaks,
    "memory": stats,
    "phases": phases,
    "recording": recording,
    "replay": replay,
}
for _name, _module in _PUBLIC_MODULES.items():
    _sys.modules[f"{__name__}.{_name}"] = _module
memory = stats
del _name, _module, stats

__all__ = [
    # turning it on, and what is on
    "enable",
    "is_enabled",
    "enabled_backend",
    "installed_allocator",
    "Allocator",
    "config_keys",
    "patch_torch",
    "unpatch_torch",
    # modules: torch.cuda's memory queries, the simulated device, the errors
    "memory",
    "host",
    "errors",
    "MemallocError",
    # steps
    "step",
    "steps_of",
    "auto_step",
    # one tool per question
    "leak_check",
    "LeakTracker",
    "StepTracker",
    "memory_breakdown",
    "top_holders",
    "set_oom_report",
    "largest_batch",
    # what happened: events, snapshots, traces
    "record_history",
    "events",
    "snapshot",
    "dump_snapshot",
    "save_trace",
    "load_trace",
    "tag",
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


# Names that left the top level (issue 40: at most 30 public names), each
# with where it went; `memalloc.<old>` raises an AttributeError saying so.
_MEMORY = (
    "empty_cache empty_cache_policy set_empty_cache_policy get_per_process_memory_fraction "
    "set_per_process_memory_fraction list_gpu_processes max_memory_allocated max_memory_reserved "
    "mem_get_info memory_allocated memory_reserved memory_stats memory_stats_as_nested_dict "
    "memory_stats_raw memory_summary reset_accumulated_memory_stats reset_peak_memory_stats"
).split()
_MOVED: dict[str, str] = {
    **{name: f"memalloc.memory.{name}" for name in _MEMORY},
    **{name: f"memalloc.errors.{name}" for name in ("DriverError", "InvalidArgumentError", "InvalidPointerError")},
    **{name: f"memalloc.errors.{name}" for name in ("PlannerError", "LeakError")},
    **{name: f"memalloc.iteration.{name}" for name in ("steps", "add_step_listener", "remove_step_listener")},
    "events_array": "memalloc.recording.events_array",
    "LeakReport": "memalloc.leaks.LeakReport",
    "BatchPlan": "the value memalloc.largest_batch returns (memalloc.features.planner.BatchPlan)",
    "MemoryBreakdown": "the value memalloc.memory_breakdown returns (memalloc.features.breakdown.MemoryBreakdown)",
    "record_memory_history": (
        "memalloc.record_history (its own signature; torch.cuda.memory._record_memory_history "
        "keeps torch's, answered by memalloc once enabled)"
    ),
    "config_text": "memalloc.enable(config=...), which reads it; memalloc.config_keys() lists the keys",
    "cuda_usable": "`python -m memalloc info`, which says whether CUDA is usable and why",
    "torch_is_patched": "memalloc.patch_torch() / memalloc.unpatch_torch(), which set it",
}


def __getattr__(name: str) -> object:
    if name in _MOVED:
        raise AttributeError(f"memalloc.{name} is no longer a top-level name: use {_MOVED[name]}")
    raise AttributeError(f"module 'memalloc' has no attribute {name!r}")
