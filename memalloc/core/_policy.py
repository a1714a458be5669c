"""Empty-cache policies.

- manual: ``memalloc.memory.empty_cache()`` and ``torch.cuda.empty_cache()``
  return every fully free cached segment to the device (always available).
- on-OOM: before raising an out-of-memory error the allocator releases the
  cache and retries once (always on; in C++).
- threshold: before a new segment would take reserved memory above
  ``threshold`` x limit (the memory-fraction limit, else the device
  capacity), unused cached segments are released (C++, per device;
  ``garbage_collection_threshold`` in MEMALLOC_CONF).
- every N steps: :func:`memalloc.step` empties the cache every N calls
  (``empty_cache_every_n_steps`` in MEMALLOC_CONF); a step listener
  (memalloc/core/iteration.py), registered when the allocator is enabled.
"""

from __future__ import annotations

import threading

from memalloc.core import _state
from memalloc.core._checks import check_int
from memalloc.core._config import config_value
from memalloc.core._device import DeviceLike, device_index

_lock = threading.Lock()
_every_n: int | None = None  # None: not read from the config yet


def _every() -> int:
    global _every_n
    if _every_n is None:
        text = _state.installed_config()
        if text is None:
            return 0  # not enabled yet: read the config once it is
        _every_n = int(config_value(text, "empty_cache_every_n_steps") or 0)
    return _every_n


def set_empty_cache_policy(*, threshold: float | None = None, every_n_steps: int | None = None) -> None:
    """Changes the automatic empty-cache policies at run time.

    Args:
        threshold: 0 < threshold < 1 releases unused cached segments before
            reserved memory (bytes) would exceed that share of the limit; 0
            turns the policy off. Applies to every device. A float (or int),
            never coerced from a str: TypeError otherwise, ValueError when
            out of range.
        every_n_steps: N > 0 empties the cache on every N-th
            :func:`memalloc.step`; 0 turns it off.

    A rejected call changes nothing.
    """
    global _every_n
    a = _state.installed_allocator()
    if every_n_steps is not None:
        check_int("every_n_steps", every_n_steps, 0, note="0 = off")
    if threshold is not None:
        # memalloc._C checks the type and the range before it sets anything:
        # once device 0 accepts the value, every device does.
        for d in range(a.device_count):
            a.set_gc_threshold(threshold, d)
    if every_n_steps is not None:
        with _lock:
            _every_n = every_n_steps


def empty_cache_policy(device: DeviceLike = None) -> dict:
    """The active policies of ``device``: {"manual": True, "on_oom": True,
    "threshold": float (0 = off), "every_n_steps": int (0 = off)}."""
    a = _state.installed_allocator()
    return {
        "manual": True,
        "on_oom": True,
        "threshold": a.gc_threshold(device_index(device)),
        "every_n_steps": _every(),
    }


def describe(device: int = 0) -> str:
    p = empty_cache_policy(device)
    parts = ["manual", "on-OOM"]
    if p["threshold"] > 0:
        parts.append(f"threshold {p['threshold']:g} of the limit")
    if p["every_n_steps"]:
        parts.append(f"every {p['every_n_steps']} steps")
    return " + ".join(parts)


def on_step(n: int) -> None:
    """The every-N-steps policy (a step listener): empties the cache on every
    N-th step."""
    every = _every()
    if every > 0 and n % every == 0:
        a = _state.installed_allocator()
        for d in range(a.device_count):
            a.empty_cache(d)
