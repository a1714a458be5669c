"""Who holds the leaked tensors: a search of the object graph for the
container (list, dict, set, deque; a module global, a local of a running
frame, an attribute, a closure variable) that keeps most of a leak's tensors
alive, its name, and the line of source that adds to it
(``losses.append(loss)``). Called by memalloc/features/leaks.py on the leaks it found.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import gc
import inspect
import linecache
import os
import re
import sys
import tokenize
import types
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from memalloc.core._usercode import is_internal, load_zip_source, source_line
from memalloc.reporters.leak_report import Leak

_CONTAINERS = (list, dict, set, collections.deque)


def attribute_holders(leaks: list[Leak], live: list, groups_at_start: dict[int, int] | None = None) -> list[Leak]:
    """Fills ``holder`` and merges the leaks one container keeps alive.
    ``groups_at_start``: {id(optimizer): its parameter groups} when the
    check began (optimizer_groups()); an optimizer holds a leak through the
    groups added since (for one made during the check, all but its first)."""
    leak_of_stack = {sid: id(leak) for leak in leaks for sid in leak.stack_ids}
    site_of_addr = {addr: leak_of_stack[sid] for addr, _size, _req, sid, _tag, _step in live if sid in leak_of_stack}
    block_at = {addr: (size, step) for addr, size, _req, _sid, _tag, step in live}
    by_leak: dict[int, list[torch.Tensor]] = collections.defaultdict(list)
    with warnings.catch_warnings():  # isinstance() wakes deprecated module attributes
        warnings.simplefilter("ignore")
        objects = gc.get_objects()
        optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
        hooks = _hook_code(o for o in objects if isinstance(o, torch.nn.Module))
        objects = [o for o in objects if isinstance(o, torch.Tensor)]
    parts = _optimizer_parts(optimizers, groups_at_start or {})
    del optimizers
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
    reached_by: dict[int, set[int]] = {}  # graph-held leak -> the blocks its figures count
    for leak in list(leaks):
        tensors = by_leak.get(id(leak), [])
        held_tensors: list = []  # the last leak's: not a holder of this one's tensors
        found_all = _holders_of(tensors, parts)
        site_id = id(leak)
        for extra in found_all[1:]:
            # Another container of the same site's tensors: its own leak when
            # its tensors carry no graph (a graph's holder keeps the rest).
            held_tensors = _tensors_in(extra)
            if any(t.grad_fn is not None for t in held_tensors):
                continue
            other = copy.copy(leak)
            other.also_allocated_at = []
            if _measure_held(other, held_tensors, block_at, site_of_addr, site_id):
                described = _describe(extra, leak)
                other.holder = described[1]
                holders[id(other)] = described
                _take_adding_line(other, hooks)
                leaks.append(other)
        found = _describe(found_all[0], leak) if found_all else None
        if found is not None:
            holders[id(leak)] = found
            leak.holder = found[1]
            held_tensors = _tensors_in(found[0])
            # The container's tensors, not every tensor of the site: the
            # loop's `out` of this step (a loss with its graph) is no leak.
            # Whether their graphs keep saved activations too (no_grad_eval):
            # _measure_graph_held finds out.
            leak.graph = any(t.grad_fn is not None for t in held_tensors)
            leak.graph_extra = False
            if leak.graph:
                reached = _measure_graph_held(
                    leak,
                    held_tensors,
                    block_at,
                    site_of_addr,
                    site_id,
                    ours={id(tensors) for tensors in by_leak.values()},
                )
                measured = reached is not None
                reached_by[id(leak)] = reached or set()
            else:
                measured = _measure_held(leak, held_tensors, block_at, site_of_addr, site_id)
            if not measured:
                # It holds this step's tensors only (blocks of fewer than
                # _MIN_HELD_STEPS iterations): not what keeps the leak.
                leak.holder, leak.graph, leak.graph_extra = None, False, False
                del holders[id(leak)]
                continue
            _take_adding_line(leak, hooks)
    # Sites whose tensors no container holds: kept by the autograd graph of a held tensor.
    graph_holders = [l for l in leaks if l.holder is not None and l.graph]
    merged: list[Leak] = []
    absorbed: set[int] = set()
    if graph_holders:
        main = max(graph_holders, key=lambda l: l.bytes_per_step)
        reached = reached_by.get(id(main), set())
        for leak in leaks:
            if leak.holder is None:
                mine = [addr for addr, owner in site_of_addr.items() if owner == id(leak)]
                if 2 * sum(addr in reached for addr in mine) < len(mine):
                    continue  # the graph does not keep most of its blocks: its own leak
                # Its blocks are the graph's, already in main's figures.
                _absorb(main, leak, figures=False)
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


def _measure_graph_held(
    leak: Leak, held: list, block_at: dict, site_of_addr: dict, site_id: int, ours: set[int]
) -> set[int] | None:
    """The leak's figures when its container's tensors carry their graphs:
    the blocks of the container's tensors and of every tensor their graphs
    saved (autograd's saved variables, read by walking the graph:
    _graph_storages), allocated from the iteration of the first held
    tensor's block on, per step over those iterations; the tensor count is
    the container's. Blocks the site made that no graph reaches (a library
    workspace made by the first forward, a lazily built buffer) are not the
    container's. Sets ``graph_extra`` when the graphs keep blocks besides
    the container's tensors (saved activations). The addresses of the
    blocks counted, or None (nothing changed) when the container holds no
    block of the site from _MIN_HELD_STEPS iterations. ``ours``: the ids
    of memalloc's own lists of tensors (not holders)."""
    own = {t.untyped_storage().data_ptr() for t in held}
    held_steps = {block_at[p][1] for p in own if site_of_addr.get(p) == site_id and p in block_at}
    if len(held_steps) < _MIN_HELD_STEPS:
        return None
    first = min(held_steps)
    saved = _graph_storages(held) - own
    # What other Python tensors keep (the batch, the loop's variables, the
    # parameters) emptying the container would not free.
    reached = own | (saved - _held_elsewhere(saved, held, ours))
    blocks = {p: block_at[p] for p in reached if p in block_at and block_at[p][1] >= first}
    _set_figures(
        leak,
        sum(size for size, _ in blocks.values()),
        len(held),
        first,
        max(step for _, step in blocks.values()) - first + 1,
    )
    leak.graph_extra = any(p not in own for p in blocks)
    return set(blocks)


def _graph_storages(roots: list) -> set[int]:
    """The storage addresses of every tensor the autograd graphs of
    ``roots`` saved for backward (each node's ``_saved_*`` values; a custom
    Function's saved_tensors), a graph that backward() already freed
    contributing nothing."""
    found: set[int] = set()
    seen: set[int] = set()
    nodes = [t.grad_fn for t in roots if t.grad_fn is not None]
    alive = []  # the nodes visited, kept alive so that their ids stay unique
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        alive.append(node)
        for name in _saved_names(type(node)):
            try:
                value = getattr(node, name)
            except RuntimeError:  # freed by backward(), or never saved
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    try:
                        found.add(t.untyped_storage().data_ptr())
                    except Exception:  # noqa: BLE001 - storage-less tensors
                        pass
        nodes.extend(fn for fn, _ in getattr(node, "next_functions", ()))
    return found


def _held_elsewhere(ptrs: set[int], own: list, ours: set[int]) -> set[int]:
    """The storage addresses among ``ptrs`` that a Python tensor other than
    ``own``'s keeps alive: one that some Python object (a variable, a
    container, a module's parameters) refers to. A tensor whose Python
    object only autograd's saved variables keep (torch preserves it while
    its storage lives) keeps nothing of its own. memalloc's own frames and
    lists (``ours``: their ids) do not count."""
    if not ptrs:
        return set()
    own_ids = {id(t) for t in own}
    with warnings.catch_warnings():  # isinstance() wakes deprecated module attributes
        warnings.simplefilter("ignore")
        candidates = [
            o
            for o in gc.get_objects()
            if isinstance(o, torch.Tensor) and id(o) not in own_ids and _storage_of(o) in ptrs
        ]
    if not candidates:
        return set()
    by_id = {id(t): t for t in candidates}
    held: set[int] = set()
    # A running frame does not show its variables to gc.get_referrers: read them.
    for o in _running_frames_values():
        if id(o) in by_id and (storage := _storage_of(o)) is not None:
            held.add(storage)
    for r in gc.get_referrers(*candidates):
        if (
            r is candidates
            or r is by_id
            or r is own
            or id(r) in ours
            or (isinstance(r, types.FrameType) and is_internal(r.f_code.co_filename))
            or (isinstance(r, tuple) and len(r) == len(candidates) and all(a is b for a, b in zip(r, candidates)))
        ):
            continue
        for o in gc.get_referents(r):
            if id(o) in by_id and (storage := _storage_of(o)) is not None:
                held.add(storage)
    return held


def _running_frames_values() -> list:
    """The values of the variables of every frame running now, memalloc's
    own excepted."""
    values = []
    for f in _user_frames():
        with _locals_of(f) as names:
            if names is not f.f_globals:
                values.extend(names.values())
    return values


def _user_frames() -> Iterator[types.FrameType]:
    """Every frame running now in any thread, innermost first, memalloc's
    own excepted. The frame objects are let go when the iteration ends: the
    list of the threads' top frames includes this generator's own frame, a
    cycle that would keep every variable of the frames alive until the
    next garbage collection."""
    tops = list(sys._current_frames().values())
    f: types.FrameType | None = None
    try:
        for f in tops:
            while f is not None:
                if not is_internal(f.f_code.co_filename):
                    yield f
                f = f.f_back
    finally:
        del tops, f


def _storage_of(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - meta, sparse or otherwise storage-less tensors
        return None


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _saved_names(node_type: type) -> tuple[str, ...]:
    """The attributes of an autograd node type that give its saved tensors."""
    names = _SAVED_NAMES.get(node_type)
    if names is None:
        names = tuple(n for n in dir(node_type) if n.startswith("_saved_")) + (
            ("saved_tensors",) if hasattr(node_type, "saved_tensors") else ()
        )
        _SAVED_NAMES[node_type] = names
    return names


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
    _set_figures(
        leak,
        sum(block_at[ptr][0] for ptr in storages),
        sum(storages.values()),
        min(steps) + 1,
        max(steps) - min(steps) + 1,
    )
    return True


def _set_figures(leak: Leak, retained_bytes: int, retained_tensors: int, first: int, iterations: int) -> None:
    """A measured leak's figures: retained bytes and tensors, the step it
    starts in (``first``, numbered as the report's ``steps``: the boundary
    that ends it), and both per step over ``iterations``."""
    leak.retained_bytes = retained_bytes
    leak.retained_tensors = retained_tensors
    leak.first_step = first
    leak.bytes_per_step = retained_bytes / iterations
    leak.tensors_per_step = retained_tensors / iterations


def _tensors_in(container: Any) -> list:
    """The tensors a holder keeps (a dict's values, a sequence's or set's
    items; an optimizer's added groups' parameters, their gradients and
    their state)."""
    if isinstance(container, torch.optim.Optimizer):
        return _added_group_tensors(container)
    items = container.values() if isinstance(container, dict) else container
    return [t for t in items if isinstance(t, torch.Tensor)]


def optimizer_groups() -> dict[int, int]:
    """{id(optimizer): parameter groups} of every optimizer alive now (what
    a leak check notes when it begins)."""
    with warnings.catch_warnings():  # isinstance() wakes deprecated module attributes
        warnings.simplefilter("ignore")
        return {id(o): len(o.param_groups) for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)}


def _added_groups(optimizer: Any) -> list[dict]:
    """The parameter groups an optimizer gained during the check."""
    return optimizer.param_groups[_GROUPS_AT_START.get(optimizer, 1) :]


# optimizer -> its parameter groups when the check began, set by
# _optimizer_parts (not an attribute of the user's optimizer: memalloc adds
# nothing to the user's objects)
_GROUPS_AT_START: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _added_group_tensors(optimizer: Any) -> list:
    params = [p for g in _added_groups(optimizer) for p in g["params"] if isinstance(p, torch.Tensor)]
    grads = [p.grad for p in params if p.grad is not None]
    state = [v for p in params for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
    return params + grads + state


def _optimizer_parts(optimizers: list, groups_at_start: dict[int, int]) -> dict[int, Any]:
    """{id(part): optimizer} for the objects through which an optimizer
    holds its added groups' tensors: each group's dict and parameter list,
    each of their parameters' state dicts, and the state dict keyed by
    parameter."""
    parts: dict[int, Any] = {}
    for opt in optimizers:
        # where the added groups begin, for _added_groups (1: made during the check)
        _GROUPS_AT_START[opt] = groups_at_start.get(id(opt), 1)
        groups = _added_groups(opt)
        if not groups:
            continue
        parts[id(opt.state)] = opt
        for g in groups:
            parts[id(g)] = opt
            parts[id(g["params"])] = opt
            for p in g["params"]:
                state = opt.state.get(p)
                if state is not None:
                    parts[id(state)] = opt
    return parts


def _take_adding_line(leak: Leak, hooks: list[tuple[str, int, int]]) -> None:
    """The holder's adding line (``where_line``, popped from the holder dict)
    becomes the leak's site and code; ``in_hook`` when it lies in the code of
    a registered module hook (``hooks``: _hook_code)."""
    assert leak.holder is not None  # both callers set it just before
    where = leak.holder.pop("where_line", None)
    if where:
        leak.site = {"filename": where[0], "line": where[1], "function": where[2]}
        leak.code = source_line(where[0], where[1])
        target = os.path.abspath(where[0])
        if any(file == target and first <= where[1] <= last for file, first, last in hooks):
            leak.holder["in_hook"] = True


def _hook_code(modules) -> list[tuple[str, int, int]]:
    """(absolute file, first line, last line) of every hook registered on
    the live nn.Modules ``modules`` (forward, forward-pre, backward) and of
    torch's global module hooks: a line there that adds to a holder runs on
    every call."""
    from torch.nn.modules import module as module_mod

    hook_dicts = [
        getattr(module_mod, name) for name in dir(module_mod) if name.startswith("_global_") and name.endswith("_hooks")
    ]
    for m in modules:
        hook_dicts += [d for name, d in vars(m).items() if name.endswith("_hooks") and isinstance(d, dict)]
    out = []
    for hooks in hook_dicts:
        for fn in list(hooks.values()) if isinstance(hooks, dict) else ():
            code = getattr(getattr(fn, "func", fn), "__code__", None)  # functools.partial, bound methods
            if code is not None:
                out.append((os.path.abspath(code.co_filename), *_code_lines(code)))
    return out


def _absorb(into: Leak, other: Leak, figures: bool = True) -> None:
    """Merges ``other`` into ``into``: its allocating line, and its figures
    unless ``into``'s already count its blocks (``figures`` False)."""
    into.also_allocated_at.append(
        {
            **other.alloc_site,
            "code": other.alloc_code,
            "bytes_per_step": other.bytes_per_step,
            "retained_bytes": other.retained_bytes,
        }
    )
    into.stack_ids = sorted(set(into.stack_ids) | set(other.stack_ids))
    if not figures:
        return
    into.bytes_per_step += other.bytes_per_step
    into.tensors_per_step += other.tensors_per_step
    into.retained_bytes += other.retained_bytes
    into.retained_tensors += other.retained_tensors
    into.first_step = min(into.first_step, other.first_step)
    into.series = [a + b for a, b in zip(into.series, other.series)]


# A second container of one site's tensors is its own leak from this many
# tensors on (fewer: the loop's variables of the moment, not a growing store).
_MIN_OTHER_HOLDER_TENSORS = 3


def _holders_of(tensors: list, parts: dict[int, Any] | None = None) -> list:
    """The container keeping most of ``tensors``, then every other one
    keeping at least _MIN_OTHER_HOLDER_TENSORS of them, most first ([]
    when none). A part of an optimizer's added parameter groups (``parts``:
    id -> optimizer) counts as the optimizer. One scan of the heap for all
    the tensors (gc.get_referrers walks every object once per call)."""
    parts = parts or {}
    sample = tuple(tensors[:200])  # a tuple: not mistaken for a holder below
    index = {id(t): i for i, t in enumerate(sample)}
    holding: dict[int, set[int]] = collections.defaultdict(set)  # holder id -> the sample's tensors it keeps
    containers: dict[int, Any] = {}
    ours = {id(tensors), id(containers), id(index), id(holding)}
    for r in gc.get_referrers(*sample):
        if id(r) in parts:
            holder = parts[id(r)]
        elif not isinstance(r, _CONTAINERS) or _is_namespace(r) or id(r) in ours:
            continue
        else:
            holder = r
        # (a dict's referents are its keys and values; a set per holder
        # counts a tensor once where an optimizer holds it twice)
        holding[id(holder)] |= {index[id(o)] for o in gc.get_referents(r) if id(o) in index}
        containers[id(holder)] = holder
    del sample
    ranked = sorted(holding, key=lambda h: -len(holding[h]))
    return [containers[h] for i, h in enumerate(ranked) if i == 0 or len(holding[h]) >= _MIN_OTHER_HOLDER_TENSORS]


def _describe(container: Any, leak: Leak) -> tuple[Any, dict]:
    """(container, holder dict): its kind, name, length and adding line."""
    name, file, owner_kind, scope = _name_of(container)
    if isinstance(container, torch.optim.Optimizer):
        kind, length = "optimizer", len(container.param_groups)
    else:
        kinds: dict[type, str] = {list: "list", dict: "dict", set: "set", collections.deque: "deque"}
        kind = kinds.get(type(container), "other")
        length = len(container)
    holder = {"kind": kind, "name": name or f"<unnamed {kind}>", "length": length, "where": "", "code": ""}
    if kind == "optimizer":
        holder["added_groups"] = len(_added_groups(container))
    if kind == "dict" and container and all(isinstance(k, int) for k in container):
        holder["int_keys"] = True
    if kind != "optimizer":
        # Whether the tensors it keeps are single numbers (a loss: keep .item())
        # or more (logits: keep .detach()); its newest 32 items are enough.
        items = list(container.values() if isinstance(container, dict) else container)[-32:]
        tensors = [t for t in items if isinstance(t, torch.Tensor)]
        if tensors:
            holder["scalars"] = all(t.numel() == 1 for t in tensors)
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


def _name_of(container: Any) -> tuple[str | None, str | None, str, tuple[int, int] | None]:
    """(name, source file to search, "global" | "local" | "attribute" |
    "closure" | "", the lines of the function whose local it is or None)."""
    # A local (or global) of a frame that is running now (not memalloc's own).
    for f in _user_frames():
        with _locals_of(f) as names:
            for name, value in names.items():
                if value is container:
                    if names is f.f_globals:
                        return name, f.f_code.co_filename, "global", None
                    return name, f.f_code.co_filename, "local", _code_lines(f.f_code)
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
            getattr(r, "__dict__", None), dict
        ):
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


@contextlib.contextmanager
def _locals_of(frame: types.FrameType):
    """A running frame's variables, read without keeping them alive: on
    Python 3.11 and 3.12 reading a function frame's f_locals leaves a
    snapshot dict on the frame that holds every value it had then, so a
    tensor the code deletes afterwards would stay allocated until the
    function returns. The snapshot is emptied after the read (the next
    reader of f_locals or locals() gets a fresh one). Python 3.13's f_locals
    is a view of the variables themselves: nothing to empty (and emptying it
    would delete them)."""
    names = frame.f_locals
    try:
        yield names
    finally:
        if _SNAPSHOT_LOCALS and frame.f_code.co_flags & inspect.CO_OPTIMIZED and names is not frame.f_globals:
            names.clear()


_SNAPSHOT_LOCALS = sys.version_info < (3, 13)


_ADDERS = {
    "list": r"\.(?:append|extend|insert)\s*\(|\s*\+=",
    "deque": r"\.(?:append|appendleft|extend)\s*\(",
    "set": r"\.(?:add|update)\s*\(",
    "dict": r"\s*\[[^\]]*\]\s*=(?!=)|\.(?:setdefault|update)\s*\(",
    "optimizer": r"\.add_param_group\s*\(",
    "other": r"\.(?:append|add)\s*\(",
}


def _adding_line(
    file: str, name: str, kind: str, leak: Leak, scope: tuple[int, int] | None = None
) -> tuple[int, str] | None:
    """(line, enclosing function) of the source line that adds to ``name``:
    one inside ``scope`` (the lines of the function whose local it is) when
    there is one, then the nearest after the allocating line."""
    base = name.split(".")[-1]
    prefix = r"\." if name.startswith("self.") else r"(?<![\w.])"
    pattern = re.compile(prefix + re.escape(base) + r"(?:" + _ADDERS.get(kind, _ADDERS["other"]) + r")")
    lines = linecache.getlines(file) or (linecache.getlines(file) if load_zip_source(file) else [])
    found = [(i + 1, [m.start() for m in pattern.finditer(text)]) for i, text in enumerate(lines)]
    found = [(line, starts) for line, starts in found if starts]
    # tokenized only when the pattern is there at all, once per file's text
    not_code = _strings_and_comments(tuple(lines)) if found else []
    hits = [line for line, starts in found if any(not _inside(not_code, line, c) for c in starts)]
    if not hits:
        return None
    alloc_line = leak.alloc_site["line"] if os.path.abspath(leak.alloc_site["filename"]) == os.path.abspath(file) else 0
    # Prefer a line that adds the very variable the allocating line assigned
    # (`losses.append(loss)` over `losses.append(loss.item())`), then the
    # nearest one after the allocating line.
    var = re.match(r"\s*(\w+)\s*=(?!=)", leak.alloc_code or "")

    def score(h: int) -> tuple:
        text = lines[h - 1]
        exact = var is not None and re.search(r"[(\[=,]\s*" + re.escape(var.group(1)) + r"\s*[)\],]?\s*(#.*)?$", text)
        mentions = var is not None and re.search(
            r"\b" + re.escape(var.group(1)) + r"\b(?!\.(?:item|tolist|cpu|numpy)\()", text
        )
        outside = scope is not None and not scope[0] <= h <= scope[1]
        return (outside, not exact, not mentions, h < alloc_line, abs(h - alloc_line))

    line = min(hits, key=score)
    return line, _enclosing_function(lines, line)


@functools.lru_cache(maxsize=64)  # the holders of one report often share a file
def _strings_and_comments(lines: tuple[str, ...]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (start, end) positions ((line, column), lines from 1) of the
    string literals, f-strings and comments of a file's ``lines``: a line
    that only mentions ``losses.append(loss)`` inside a string or a comment
    does not add to anything. A file that does not tokenize gives the spans
    read before the error."""
    spans: list[tuple[tuple[int, int], tuple[int, int]]] = []
    it = iter(lines)
    fstring_start = getattr(tokenize, "FSTRING_START", None)  # Python 3.12+: f-strings are several tokens
    fstring_end = getattr(tokenize, "FSTRING_END", None)
    opened: list[tuple[int, int]] = []
    try:
        for tok in tokenize.generate_tokens(lambda: next(it, "")):
            if tok.type in (tokenize.STRING, tokenize.COMMENT):
                spans.append((tok.start, tok.end))
            elif fstring_start is not None and tok.type == fstring_start:
                opened.append(tok.start)
            elif fstring_end is not None and tok.type == fstring_end and opened:
                spans.append((opened.pop(), tok.end))
    except (tokenize.TokenError, SyntaxError):
        pass
    return spans


def _inside(spans: list[tuple[tuple[int, int], tuple[int, int]]], line: int, column: int) -> bool:
    return any(start <= (line, column) < end for start, end in spans)


def _enclosing_function(lines: list[str], line: int) -> str:
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    for i in range(line - 2, -1, -1):
        text = lines[i]
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ")) and len(text) - len(stripped) < indent:
            return stripped.split("def ", 1)[1].split("(", 1)[0]
    return "<module>"
