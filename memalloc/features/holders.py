"""Who holds the leaked tensors: a search of the object graph for the
container (list, dict, set, deque; a module global, a local of a running
frame, an attribute, a closure variable) that keeps most of a leak's tensors
alive, its name, and the line of source that adds to it
(``losses.append(loss)``). Called by memalloc/features/leaks.py on the leaks it found.
"""
from __future__ import annotations

import collections
import copy
import gc
import linecache
import os
import re
import sys
import types
import warnings
from typing import Any, Optional

import torch

from memalloc.core._usercode import load_zip_source, is_internal, source_line
from memalloc.reporters.leak_report import Leak

_CONTAINERS = (list, dict, set, collections.deque)


def attribute_holders(leaks: list[Leak], live: list) -> list[Leak]:
    """Fills ``holder`` and merges the leaks one container keeps alive."""
    leak_of_stack = {sid: id(leak) for leak in leaks for sid in leak.stack_ids}
    site_of_addr = {addr: leak_of_stack[sid] for addr, _size, _req, sid, _tag, _step in live if sid in leak_of_stack}
    block_at = {addr: (size, step) for addr, size, _req, _sid, _tag, step in live}
    by_leak: dict[int, list[torch.Tensor]] = collections.defaultdict(list)
    with warnings.catch_warnings():  # isinstance() wakes deprecated module attributes
        warnings.simplefilter("ignore")
        objects = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for obj in objects:
        try:
            ptr = obj.untyped_storage().data_ptr()
        except Exception:  # noqa: BLE001 - meta, sparse or otherwise storage-less tensors
            continue
        owner = site_of_addr.get(ptr)
        if owner is not None:
            by_leak[owner].append(obj)
    del objects
    holders: dict[int, tuple[Any, dict]] = {}
    for leak in list(leaks):
        tensors = by_leak.get(id(leak), [])
        found_all = _holders_of(tensors, leak)
        site_id = id(leak)
        for extra in found_all[1:]:
            # Another container of the same site's tensors: its own leak when
            # its tensors carry no graph (a graph's holder keeps the rest).
            held_tensors = _tensors_in(extra[0])
            if any(t.grad_fn is not None for t in held_tensors):
                continue
            other = copy.copy(leak)
            other.also_allocated_at = []
            other.holder = extra[1]
            _take_adding_line(other)
            if _measure_held(other, held_tensors, block_at, site_of_addr, site_id):
                holders[id(other)] = extra
                leaks.append(other)
        found = found_all[0] if found_all else None
        if found is not None:
            holders[id(leak)] = found
            leak.holder = found[1]
            # A graph keeping more than the container's own tensors: saved activations (no_grad_eval).
            held_tensors = _tensors_in(found[0])
            held = {t.untyped_storage().data_ptr(): t for t in held_tensors}
            # The container's tensors, not every tensor of the site: the
            # loop's `out` of this step (a loss with its graph) is no leak.
            leak.graph = any(t.grad_fn is not None for t in held_tensors)
            # More blocks per step than the container gains tensors (the site's
            # live blocks, before the figures below count the container's):
            # the graph keeps activations too.
            held_per_step = len(held) / max(1, len(leak.series))
            leak.graph_extra = leak.graph and bool(held) and leak.tensors_per_step > 1.5 * held_per_step
            measured = (_measure_graph_held if leak.graph else _measure_held)(
                leak, held_tensors, block_at, site_of_addr, site_id)
            if not measured:
                # It holds this step's tensors only (blocks of fewer than
                # _MIN_HELD_STEPS iterations): not what keeps the leak.
                leak.holder, leak.graph, leak.graph_extra = None, False, False
                del holders[id(leak)]
                continue
            _take_adding_line(leak)
    # Sites whose tensors no container holds: kept by the autograd graph of a held tensor.
    graph_holders = [l for l in leaks if l.holder is not None and l.graph]
    merged: list[Leak] = []
    absorbed: set[int] = set()
    if graph_holders:
        main = max(graph_holders, key=lambda l: l.bytes_per_step)
        for leak in leaks:
            if leak.holder is None:
                tensors_before = main.retained_tensors
                _absorb(main, leak)
                main.retained_tensors = tensors_before  # its blocks are the graph's, not tensors the container keeps
                main.graph_extra = True
                absorbed.add(id(leak))
    # One entry per container.
    by_container: dict[int, Leak] = {}
    for leak in leaks:
        if id(leak) in absorbed:
            continue
        found = holders.get(id(leak))
        if found is None:
            merged.append(leak)
            continue
        first = by_container.get(id(found[0]))
        if first is None:
            by_container[id(found[0])] = leak
            merged.append(leak)
        else:
            _absorb(first, leak)
    return merged


# A container is a leak's holder when it keeps the site's blocks of at least
# this many iterations (leaks.py's second rule: a leak's blocks are of every age).
_MIN_HELD_STEPS = 3


def _measure_graph_held(leak: Leak, held: list, block_at: dict, site_of_addr: dict, site_id: int) -> bool:
    """The leak's figures when its container's tensors carry their graphs
    (which keep saved activations, with no Python tensor of their own): every
    live block of the site allocated from the iteration of the first held
    tensor's block on, per step over those iterations; the tensor count is
    the container's. False (nothing changed) when the container holds no
    block of the site from _MIN_HELD_STEPS iterations."""
    held_steps = {block_at[p][1] for p in (t.untyped_storage().data_ptr() for t in held)
                  if site_of_addr.get(p) == site_id and p in block_at}
    if len(held_steps) < _MIN_HELD_STEPS:
        return False
    first = min(held_steps)
    blocks = [(size, step) for addr, (size, step) in block_at.items()
              if site_of_addr.get(addr) == site_id and step >= first]
    _set_figures(leak, sum(size for size, _ in blocks), len(held), first,
                 max(step for _, step in blocks) - first + 1)
    return True


def _measure_held(leak: Leak, held: list, block_at: dict, site_of_addr: dict, site_id: int) -> bool:
    """The leak's figures from what its container holds, when the tensors
    carry no graph: the blocks of the leak's site that held tensors' storages
    start (each block once, views of one storage included), the tensors on
    them, and per step over the iterations from the first such block's to the
    last one's. The site's other live blocks (the loop's current
    outputs, one-off caches) and the shape of its live-bytes series (noisy
    with varying shapes) no longer enter the figures. ``site_id`` names the
    site's leak in ``site_of_addr``. False (nothing changed) when the
    container holds the site's blocks of fewer than _MIN_HELD_STEPS
    iterations."""
    storages: dict[int, int] = {}  # block address -> tensors held on it
    for t in held:
        ptr = t.untyped_storage().data_ptr()
        if site_of_addr.get(ptr) == site_id and ptr in block_at:
            storages[ptr] = storages.get(ptr, 0) + 1
    steps = [block_at[ptr][1] for ptr in storages]
    if len(set(steps)) < _MIN_HELD_STEPS:
        return False
    # The iterations the blocks were allocated over, counted from their own
    # step stamps, not from the boundaries sampled.
    _set_figures(leak, sum(block_at[ptr][0] for ptr in storages), sum(storages.values()), min(steps),
                 max(steps) - min(steps) + 1)
    return True


def _set_figures(leak: Leak, retained_bytes: int, retained_tensors: int, first: int, iterations: int) -> None:
    """A measured leak's figures: retained bytes and tensors, the iteration
    it starts in, and both per step over ``iterations``."""
    leak.retained_bytes = retained_bytes
    leak.retained_tensors = retained_tensors
    leak.first_step = first
    leak.bytes_per_step = retained_bytes / iterations
    leak.tensors_per_step = retained_tensors / iterations


def _tensors_in(container: Any) -> list:
    """The tensors a holder keeps (a dict's values, a sequence's or set's items)."""
    items = container.values() if isinstance(container, dict) else container
    return [t for t in items if isinstance(t, torch.Tensor)]


def _take_adding_line(leak: Leak) -> None:
    """The holder's adding line (``where_line``, popped from the holder dict)
    becomes the leak's site and code."""
    where = leak.holder.pop("where_line", None)
    if where:
        leak.site = {"filename": where[0], "line": where[1], "function": where[2]}
        leak.code = source_line(where[0], where[1])


def _absorb(into: Leak, other: Leak) -> None:
    into.also_allocated_at.append({**other.alloc_site, "code": other.alloc_code,
                                   "bytes_per_step": other.bytes_per_step, "retained_bytes": other.retained_bytes})
    into.bytes_per_step += other.bytes_per_step
    into.tensors_per_step += other.tensors_per_step
    into.retained_bytes += other.retained_bytes
    into.retained_tensors += other.retained_tensors
    into.first_step = min(into.first_step, other.first_step)
    into.series = [a + b for a, b in zip(into.series, other.series)]
    into.stack_ids = sorted(set(into.stack_ids) | set(other.stack_ids))


def _holder_of(tensors: list, leak: Leak) -> Optional[tuple[Any, dict]]:
    """(container, holder dict) keeping most of ``tensors``, or None."""
    found = _holders_of(tensors, leak)
    return found[0] if found else None


# A second container of one site's tensors is its own leak from this many
# tensors on (fewer: the loop's variables of the moment, not a growing store).
_MIN_OTHER_HOLDER_TENSORS = 3


def _holders_of(tensors: list, leak: Leak) -> list[tuple[Any, dict]]:
    """(container, holder dict) for the container keeping most of
    ``tensors``, then for every other one keeping at least
    _MIN_OTHER_HOLDER_TENSORS of them, most first ([] when none)."""
    counts: collections.Counter = collections.Counter()
    containers: dict[int, Any] = {}
    sample = tuple(tensors[:200])  # a tuple: not mistaken for a holder below
    ours = {id(tensors), id(containers)}
    for t in sample:
        for r in gc.get_referrers(t):
            if isinstance(r, _CONTAINERS) and not _is_namespace(r) and id(r) not in ours:
                counts[id(r)] += 1
                containers[id(r)] = r
    del sample
    ranked = [cid for i, (cid, n) in enumerate(counts.most_common()) if i == 0 or n >= _MIN_OTHER_HOLDER_TENSORS]
    return [_describe(containers[cid], leak) for cid in ranked]


def _describe(container: Any, leak: Leak) -> tuple[Any, dict]:
    """(container, holder dict): its kind, name, length and adding line."""
    name, file, owner_kind, scope = _name_of(container)
    kind = {list: "list", dict: "dict", set: "set", collections.deque: "deque"}.get(type(container), "other")
    holder = {"kind": kind, "name": name or f"<unnamed {kind}>", "length": len(container),
              "where": "", "code": ""}
    if kind == "dict" and container and all(isinstance(k, int) for k in container):
        holder["int_keys"] = True
    if name and file:
        line = _adding_line(file, name, kind, leak, scope)
        if line:
            holder["where"] = f"{file}:{line[0]}"
            holder["code"] = source_line(file, line[0])
            holder["where_line"] = (file, line[0], line[1])
    holder["owner"] = owner_kind
    return container, holder


def _is_namespace(d: Any) -> bool:
    """A module's globals or an instance/class __dict__ (not a user dict)."""
    return isinstance(d, dict) and ("__name__" in d and "__builtins__" in d)


def _code_lines(code: types.CodeType) -> tuple[int, int]:
    """The first and last source line of a function's code."""
    last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
    return code.co_firstlineno, last


def _name_of(container: Any) -> tuple[Optional[str], Optional[str], str, Optional[tuple[int, int]]]:
    """(name, source file to search, "global" | "local" | "attribute" |
    "closure" | "", the lines of the function whose local it is or None)."""
    # A local (or global) of a frame that is running now (not memalloc's own).
    for frame in list(sys._current_frames().values()):
        f = frame
        while f is not None:
            if is_internal(f.f_code.co_filename):
                f = f.f_back
                continue
            for name, value in f.f_locals.items():
                if value is container:
                    if f.f_locals is f.f_globals:
                        return name, f.f_code.co_filename, "global", None
                    return name, f.f_code.co_filename, "local", _code_lines(f.f_code)
            f = f.f_back
    for r in gc.get_referrers(container):
        if isinstance(r, dict):
            for name, value in r.items():
                if value is container:
                    if _is_namespace(r) and r.get("__file__"):
                        return name, r["__file__"], "global", None
                    owners = [o for o in gc.get_referrers(r) if getattr(o, "__dict__", None) is r]
                    if owners:
                        cls = type(owners[0])
                        file = sys.modules.get(cls.__module__)
                        return f"self.{name}", getattr(file, "__file__", None), "attribute", None
        elif not isinstance(r, (type, types.ModuleType, types.FrameType)) and isinstance(
                getattr(r, "__dict__", None), dict):
            # An instance whose attributes live inline (CPython 3.11+): it refers to the value itself.
            for name, value in vars(r).items():
                if value is container:
                    module = sys.modules.get(type(r).__module__)
                    return f"self.{name}", getattr(module, "__file__", None), "attribute", None
    for r in gc.get_referrers(container):  # a closure variable
        if type(r).__name__ == "cell":
            for fn in gc.get_referrers(r):
                if isinstance(fn, tuple):
                    for g in gc.get_referrers(fn):
                        code = getattr(g, "__code__", None)
                        if code is not None and g.__closure__ is fn:
                            i = list(fn).index(r)
                            return code.co_freevars[i], code.co_filename, "closure", None
    return None, None, "", None


_ADDERS = {
    "list": r"\.(?:append|extend|insert)\s*\(|\s*\+=",
    "deque": r"\.(?:append|appendleft|extend)\s*\(",
    "set": r"\.(?:add|update)\s*\(",
    "dict": r"\s*\[[^\]]*\]\s*=(?!=)|\.(?:setdefault|update)\s*\(",
    "other": r"\.(?:append|add)\s*\(",
}


def _adding_line(file: str, name: str, kind: str, leak: Leak,
                 scope: Optional[tuple[int, int]] = None) -> Optional[tuple[int, str]]:
    """(line, enclosing function) of the source line that adds to ``name``:
    one inside ``scope`` (the lines of the function whose local it is) when
    there is one, then the nearest after the allocating line."""
    base = name.split(".")[-1]
    prefix = r"\." if name.startswith("self.") else r"(?<![\w.])"
    pattern = re.compile(prefix + re.escape(base) + r"(?:" + _ADDERS.get(kind, _ADDERS["other"]) + r")")
    lines = linecache.getlines(file) or (linecache.getlines(file) if load_zip_source(file) else [])
    hits = [i + 1 for i, text in enumerate(lines) if pattern.search(text) and not text.lstrip().startswith("#")]
    if not hits:
        return None
    alloc_line = leak.alloc_site["line"] if os.path.abspath(leak.alloc_site["filename"]) == os.path.abspath(file) else 0
    # Prefer a line that adds the very variable the allocating line assigned
    # (`losses.append(loss)` over `losses.append(loss.item())`), then the
    # nearest one after the allocating line.
    var = re.match(r"\s*(\w+)\s*=(?!=)", leak.alloc_code or "")
    def score(h: int) -> tuple:
        text = lines[h - 1]
        exact = bool(var) and re.search(r"[(\[=,]\s*" + re.escape(var.group(1)) + r"\s*[)\],]?\s*(#.*)?$", text)
        mentions = bool(var) and re.search(r"\b" + re.escape(var.group(1)) + r"\b(?!\.(?:item|tolist|cpu|numpy)\()",
                                           text)
        outside = scope is not None and not scope[0] <= h <= scope[1]
        return (outside, not exact, not mentions, h < alloc_line, abs(h - alloc_line))
    line = min(hits, key=score)
    return line, _enclosing_function(lines, line)


def _enclosing_function(lines: list[str], line: int) -> str:
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    for i in range(line - 2, -1, -1):
        text = lines[i]
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ")) and len(text) - len(stripped) < indent:
            return stripped.split("def ", 1)[1].split("(", 1)[0]
    return "<module>"


