"""The out-of-memory report: what was holding memory when an allocation
failed.

When memalloc cannot satisfy an allocation, torch raises
``torch.OutOfMemoryError`` with memalloc's message (what was asked, what the
device has, what memalloc holds), followed by the live allocations holding
the most memory grouped by call site (the innermost line of user code that
allocated them, with that line of source when the file is readable; call
sites are on from ``memalloc.enable()`` unless the config says
``call_sites:False``; without them, by tag). With a report folder set
(:func:`set_oom_report`, the ``MEMALLOC_OOM_REPORT_DIR`` environment variable,
or ``python -m memalloc run``'s ``--out``), the first ``max_reports`` OOMs of
the process also write ``oom-<pid>-<n>.txt`` (the message, the holders and
``memory_summary``) and ``oom-<pid>-<n>.pickle`` (``memalloc.snapshot()``,
for pytorch.org/memory_viz); the message says where.

The report is built by a hook the C++ allocator calls after the failed
allocation has released its lock (csrc/boundary/torch/oom_report.cpp); a failing
hook never hides the out-of-memory error.
"""

from __future__ import annotations

import collections
import os
import pickle
import threading
from typing import TypedDict

from memalloc import _C
from memalloc.core import _hooks, _state
from memalloc.core._checks import check_int
from memalloc.core._device import DeviceLike, device_index
from memalloc.core._format import fmt_bytes
from memalloc.core._usercode import is_source, source_line
from memalloc.features import stats
from memalloc.trace import snapshots
from memalloc.trace.sites import live_blocks, site_of


class _Settings(TypedDict):
    enabled: bool
    directory: str | None
    max_reports: int
    top: int


_lock = threading.Lock()
_settings: _Settings = {
    "enabled": True,
    "directory": os.environ.get("MEMALLOC_OOM_REPORT_DIR") or None,
    "max_reports": 3,
    "top": 5,
}
_written = 0


def set_oom_report(enabled: bool = True, *, directory: str | None = None, max_reports: int = 3, top: int = 5) -> None:
    """Configures the out-of-memory report.

    Args:
        enabled: append the top holders to out-of-memory errors.
        directory: where to write report files (None: no files).
        max_reports: files are written for the first this many OOMs of the
            process (>= 0).
        top: call sites listed (>= 1).
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, not {type(enabled).__name__}")
    check_int("max_reports", max_reports, 0)
    check_int("top", top, 1)
    if directory is not None:
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path or None, not {type(directory).__name__}")
        os.makedirs(directory, exist_ok=True)
    with _lock:
        _settings.update(
            {
                "enabled": enabled,
                "directory": None if directory is None else os.fspath(directory),
                "max_reports": max_reports,
                "top": top,
            }
        )
    install()


def oom_report_settings() -> dict:
    """The settings now in force, as :func:`set_oom_report`'s keyword
    arguments (``enabled``, ``directory``, ``max_reports``, ``top``): a caller
    that changes them for a while (the framework callbacks) restores them
    with ``set_oom_report(**settings)``."""
    with _lock:
        return dict(_settings)


FEATURE = "out-of-memory report"  # its name in hook warnings


def install() -> None:
    """Subscribes the report to the allocator's out-of-memory hook
    (memalloc.core._hooks) with the current settings (done by memalloc.enable)."""
    if _settings["enabled"]:
        _hooks.subscribe(_hooks.OUT_OF_MEMORY, FEATURE, _hook)
    else:
        _hooks.unsubscribe(_hooks.OUT_OF_MEMORY, FEATURE)


def top_holders(device: DeviceLike = None, n: int = 5, *, allocator: _C.Allocator | None = None) -> list[dict]:
    """The ``n`` call sites whose live allocations hold the most memory on
    ``device`` of ``allocator`` (default: the installed one): [{"bytes",
    "tensors", "filename", "line", "function", "code", "tag"}], bytes, largest
    first. Sites are the innermost user-code frame of the allocating stack
    (None fields when stacks were not captured; then the grouping is by tag)."""
    check_int("n", n, 1, note="call sites to list")
    a = _state.allocator_or_installed(allocator)
    d = device_index(device, a.backend_name)
    tags = _C.tag_names()
    by_stack: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0])
    for _addr, size, _req, stack_id, tag_id, _step in live_blocks(d, a):
        g = by_stack[stack_id, tag_id]  # (blocks share few stacks: each is named once below)
        g[0] += size
        g[1] += 1
    groups: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0])
    for (stack_id, tag_id), (nbytes, count) in by_stack.items():
        site = site_of(stack_id)
        tag = tags[tag_id] if tag_id < len(tags) else f"<tag {tag_id}>"
        g = groups[site + ("",) if site else (None, None, None, tag)]
        g[0] += nbytes
        g[1] += count
    out = []
    for (filename, line, function, tag), (nbytes, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:n]:
        out.append(
            {
                "bytes": nbytes,
                "tensors": count,
                "filename": filename,
                "line": line,
                "function": function,
                "code": source_line(filename, line) if filename else "",
                "tag": tag,
            }
        )
    return out


def _describe(holders: list[dict]) -> str:
    lines = ["", "Live allocations holding the most memory (memalloc):"]
    for h in holders:
        where = (
            f"{h['filename']}:{h['line']} in {h['function']}"
            if h["filename"]
            else f"tag {h['tag']!r}"
            if h["tag"]
            else "no call site recorded"
        )
        lines.append(f"  {fmt_bytes(h['bytes']):>11} in {h['tensors']:>5} allocations  {where}")
        if is_source(h["code"]):  # the message stays one line per holder
            lines.append(f"  {'':>11}    {h['code']}")
    if holders and all(h["filename"] is None for h in holders):
        lines.append(
            "  (call sites are off: remove call_sites:False from MEMALLOC_CONF or enable()'s config, "
            "or call memalloc.record_history(stacks='python'))"
        )
    return "\n".join(lines)


def _hook(device: int, size: int) -> str:
    """Called by the allocator after an allocation of ``size`` bytes failed
    for good on ``device``; returns the text appended to the error."""
    global _written
    try:
        with _lock:
            settings = _settings.copy()
        text = _describe(top_holders(device, settings["top"]))
        directory = settings["directory"]
        if directory:
            with _lock:
                n = _written + 1 if _written < settings["max_reports"] else 0
                _written = max(_written, n)
            if n:
                base = os.path.join(directory, f"oom-{os.getpid()}-{n}")
                with open(base + ".pickle", "wb") as f:
                    pickle.dump(snapshots.snapshot(device), f)
                with open(base + ".txt", "w") as f:
                    f.write(f"out of memory: {size} bytes requested on device {device}\n{text}\n\n")
                    f.write(stats.memory_summary(device))
                text += f"\nOOM report written to {base}.txt and {base}.pickle (open at pytorch.org/memory_viz)"
        return text
    except Exception as e:  # noqa: BLE001 - the OOM error must surface, not this
        return f"\n(memalloc could not build the OOM report: {type(e).__name__}: {e})"
