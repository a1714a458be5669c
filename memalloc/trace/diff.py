"""Two runs compared call site by call site (``python -m memalloc diff A
B``): which lines hold more or less memory at the peak and per step.

What each run gives (:func:`load`):

- a **flight recorder file** (``*.flight``), the folder holding one
  (``flight_recorder:DIR``), or the ``--out`` folder of ``python -m
  memalloc run`` holding ``flight/`` (kept after an exception, a kill, in a
  job of several ranks, or with ``--config flight_recorder_keep:True``; a
  clean single process removes it, and ``run`` leaves instead
  ``DIR/sites.json``, this module's reading of the file made just before:
  :func:`save_summary`). The device's ring is replayed
  (flight_files.replay): blocks allocated and not yet freed, by call site.
- a **snapshot** pickle (``memalloc.dump_snapshot()``, torch's
  ``torch.cuda.memory._dump_snapshot()``): the live blocks of its segments
  at the moment it was taken, and its trace (``device_traces``), replayed
  backwards from them.

**At the peak**: the bytes live at each call site at the moment the run's
live bytes were highest, as far as the data sees them: over the ring's
records (a flight file, from the blocks live when its recorder started; a
ring that wrapped has lost the blocks allocated before its oldest record,
said in the notes) or over the snapshot's trace,
starting from the blocks live before it (those of its segments not
allocated in the trace, and those the trace frees without having allocated
them, the latter at an unknown line); a snapshot without a trace gives the
moment it was taken. Each run's own peak: the two moments need not be the
same point of the program.

**Per step** (flight files, whose records carry the step): a line's live
bytes at the end of each finished step (``memalloc.step()``, or each
``optimizer.step()`` under ``run --leaks/--steps/--advise``), and its growth
per step, (last - first) / (steps - 1) over those step ends: the rate at
which a line keeps memory from step to step (0 for a line that frees what it
makes). Needs two finished steps in both runs.

A **call site** is the innermost user-code frame of the allocating stack
(memalloc/core/_usercode.py, the rule of the leak report and the
postmortem), else the stack's innermost frame. Two runs of two checkouts of
a project compare: a user file is keyed by its path relative to the folder
holding all of the run's user files (``train.py``, ``pkg/model.py``), then
its line number; a library file by its path. Lines are matched by number:
an edit that moves lines moves their sites.

The **category** of a line is inferred from what allocated it, where that
says it (the allocator's own per-block category is not kept in either kind
of file): ``optimizer_state`` for a stack through ``torch/optim/``,
``gradients`` for blocks made by ``backward()`` (a stack through
``torch/autograd/``, or autograd's engine threads: tag ``<backward>``;
what backward makes and is still live at the peak is mostly ``.grad``),
``parameters`` for a stack through a module's ``__init__`` or
``reset_parameters`` in ``torch/nn/``; "" otherwise (activations,
temporaries and other are told apart by when blocks die, which a line's
bytes at one moment do not say). A line's category is that of most of the
bytes it allocated.

Sizes are block bytes (what the allocator holds for the line: the
requested bytes rounded up, to 512 B at least).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import pickle
from collections.abc import Iterable, Mapping, Sequence

from memalloc.core._usercode import is_internal, source_line
from memalloc.trace.flight_files import (
    SUFFIX,
    FlightFile,
    FlightFileError,
    files_in,
    opened,
    peak_live,
    read,
    replay,
    site_of,
)
from memalloc.trace.recording import Event

SCHEMA = "memalloc.diff/1"
SUMMARY_SCHEMA = "memalloc.diff-run/1"
SUMMARY = "sites.json"  # what `run --out DIR` leaves of a cleanly ended run's flight file
KINDS = (
    "the --out folder of `python -m memalloc run` (its flight/ folder or its sites.json), a flight recorder "
    "folder or *.flight file, or a snapshot pickle (memalloc.dump_snapshot)"
)
UNKNOWN_SITE = ("<allocated before the trace>", 0, "")
_PARAM_FUNCS = ("__init__", "reset_parameters")


class DiffError(ValueError):
    """An input ``diff`` cannot compare (the message names the path and why)."""


@dataclasses.dataclass
class Run:
    """One run's bytes by call site (bytes; keys from :func:`site_keys`)."""

    path: str
    kind: str  # "flight" or "snapshot"
    backend: str | None  # None: not said (a snapshot)
    device: int
    peak: int  # live bytes at the peak, as the data sees them
    moment: str  # what "the peak" is for this run, in words
    at_peak: dict[tuple, int]  # site -> bytes live at the peak
    steps: list[int]  # finished steps whose ends were seen
    per_step: dict[tuple, float] | None  # site -> growth per step (None: no steps)
    categories: dict[tuple, str]  # site -> inferred category ("" unknown)
    notes: list[str]


# ------------------------------------------------------------------ input ----


def load(path: str, device: int | None = None, rank: int | None = None) -> Run:
    """One run from ``path`` (a kind of :data:`KINDS`); DiffError otherwise.
    A folder of a job's flight files (torchrun under ``run --out``): the
    file of ``rank``, which must then be given."""
    if not os.path.exists(path):
        raise DiffError(f"{path}: no such file or folder (give {KINDS})")
    if os.path.isdir(path):
        try:
            files = files_in(path)
        except FlightFileError as e:
            if os.path.isfile(os.path.join(path, SUMMARY)):
                return _resolved(load_summary(os.path.join(path, SUMMARY)))
            raise DiffError(f"{path}: not a run diff can read ({e}); give {KINDS}") from None
        if len(files) > 1:
            files = _of_rank(path, files, rank)
        run = _from_flight(files[0], device)
    elif path.endswith(SUFFIX):
        run = _from_flight(path, device)
    elif path.endswith(".json"):
        run = load_summary(path)
    else:
        run = _from_snapshot(path, device)
    return _resolved(run)


def _of_rank(path: str, files: list[str], rank: int | None) -> list[str]:
    """The one file of ``rank`` among a job's ``files``; DiffError naming
    the ranks there when ``rank`` is None or not one of them."""
    ranks: dict[int, list[str]] = collections.defaultdict(list)
    for file in files:
        try:
            ranks[read(file).rank].append(file)
        except FlightFileError:
            continue
    found = ranks.get(rank, []) if rank is not None else []
    if len(found) == 1:
        return found
    there = ", ".join(f"rank {r}" for r in sorted(ranks))
    if rank is None:
        raise DiffError(f"{path}: the flight files of a job ({there}); say which rank to compare with --rank N")
    raise DiffError(f"{path}: {len(found)} flight files of rank {rank} (there: {there}); give one file")


def _resolved(run: Run) -> Run:
    """``run`` with its relative file names (a script started as ``python
    -m memalloc run train.py``) made absolute: the first folder above the
    run's file, then the current one, that holds the file."""
    anchors = []
    at = os.path.dirname(os.path.abspath(run.path))
    for _ in range(6):
        anchors.append(at)
        at = os.path.dirname(at)
    anchors.append(os.getcwd())

    @functools.cache
    def where(file: str) -> str:
        if not file or file.startswith("<") or os.path.isabs(file):
            return file
        return next((os.path.join(a, file) for a in anchors if os.path.isfile(os.path.join(a, file))), file)

    def fix(values: dict) -> dict:
        out: dict = {}
        for (file, line, func), v in values.items():
            key = (where(file), line, func)
            out[key] = out.get(key, 0) + v if not isinstance(v, str) else v
        return out

    return dataclasses.replace(
        run,
        at_peak=fix(run.at_peak),
        per_step=fix(run.per_step) if run.per_step is not None else None,
        categories=fix(run.categories),
    )


def save_summary(flight_file: str | FlightFile, out: str) -> Run:
    """Reads the flight file ``flight_file`` (its path, or the file already
    read) as :func:`load` does (the one device it used) and writes that
    reading to ``out`` (JSON, schema
    :data:`SUMMARY_SCHEMA`): ``run --out DIR`` does so before a clean end
    removes the file, so ``diff`` still reads the run from ``DIR``.
    DiffError as :func:`load` (e.g. several devices used)."""
    run = _from_flight(flight_file, None)

    def items(values: Mapping[tuple, object]) -> list[list]:
        return [[*site, v] for site, v in values.items()]

    data = {
        "schema": SUMMARY_SCHEMA,
        **{k: getattr(run, k) for k in ("kind", "backend", "device", "peak", "moment", "steps", "notes")},
        "at_peak": items(run.at_peak),
        "per_step": None if run.per_step is None else items(run.per_step),
        "categories": items(run.categories),
    }
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, out)
    return run


def load_summary(path: str) -> Run:
    """A run from a file :func:`save_summary` wrote; DiffError otherwise."""
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA:
            raise ValueError(f"not a {SUMMARY_SCHEMA} file")

        def sites(rows: list) -> dict:
            return {(str(file), int(line), str(func)): v for file, line, func, v in rows}

        return Run(
            path=path,
            kind=str(data["kind"]),
            backend=data["backend"],
            device=int(data["device"]),
            peak=int(data["peak"]),
            moment=str(data["moment"]),
            at_peak=sites(data["at_peak"]),
            steps=[int(s) for s in data["steps"]],
            per_step=None if data["per_step"] is None else sites(data["per_step"]),
            categories=sites(data["categories"]),
            notes=[str(n) for n in data["notes"]],
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DiffError(f"{path}: not a run summary diff can read ({e}); give {KINDS}") from None


def _from_flight(source: str | FlightFile, device: int | None) -> Run:
    """A run from a flight file, given by its path or already read."""
    try:
        f = opened(source)
    except FlightFileError as e:
        raise DiffError(f"{e}; give {KINDS}") from None
    path = f.path
    d = _pick_device(path, [i for i, ring in enumerate(f.rings) if any(e.action == "alloc" for e in ring)], device)
    ring = f.rings[d] if d < len(f.rings) else []
    notes = []
    if f.sequences[d] and f.sequences[d][0] > 1:
        notes.append(
            f"the ring wrapped: {f.sequences[d][0] - 1} older records lost (blocks allocated before them are not "
            "counted; flight_recorder_records:N keeps more)"
        )
    if f.missing:
        notes.append(f"the file is cut short ({f.missing} bytes missing)")
    events = [(e.action, e.addr, e.size, _flight_site(f, e)) for e in ring]
    # from the blocks live when the recorder started (a recorder started after the model was built)
    start = {addr: (size, f.site(stack_id)) for addr, (size, stack_id) in f.live_at_start.get(d, {}).items()}
    peak, at_peak, meta = peak_live(start, events)
    steps, per_step = _per_step(ring, events, f.step)
    when = f"step {ring[meta].step}" if ring and meta >= 0 else "the start"
    return Run(
        path=path,
        kind="flight",
        backend=f.backend,
        device=d,
        peak=peak,
        moment=f"the ring's peak of live bytes (in {when})",
        at_peak=at_peak,
        steps=steps,
        per_step=per_step,
        categories=_categories(f, ring),
        notes=notes,
    )


def _flight_site(f: FlightFile, e: Event) -> tuple:
    return f.site(e.stack_id)


def _categories(f: FlightFile, ring: Sequence[Event]) -> dict[tuple, str]:
    bytes_by: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in ring:
        if e.action == "alloc":
            frames = [tuple(fr) for fr in f.stacks.get(e.stack_id, [])]
            bytes_by[f.site(e.stack_id)][category_of(frames, e.tag)] += e.size
    return {site: c.most_common(1)[0][0] for site, c in bytes_by.items()}


def category_of(frames: Sequence[Sequence], tag: str = "") -> str:
    """The breakdown's category an allocation's stack (``[(file, line,
    function), ...]``) and tag say it is, "" when they say none (see the
    module's docstring)."""
    paths = [(str(fr[0]).replace(os.sep, "/"), str(fr[2]).rsplit(".", 1)[-1]) for fr in frames]
    if any("/torch/optim/" in p for p, _ in paths):
        return "optimizer_state"
    if tag.startswith("<backward>") or any("/torch/autograd/" in p for p, _ in paths):
        return "gradients"
    if any("/torch/nn/" in p and fn in _PARAM_FUNCS for p, fn in paths):
        return "parameters"
    return ""


def _from_snapshot(path: str, device: int | None) -> Run:
    try:
        with open(path, "rb") as fh:
            snap = pickle.load(fh)  # a snapshot is a pickle: read only files you trust, as torch does
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as e:
        raise DiffError(f"{path}: not a snapshot pickle ({e.__class__.__name__}: {e}); give {KINDS}") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise DiffError(f"{path}: a pickle but not a memory snapshot (no 'segments'); give {KINDS}")
    traces = snap.get("device_traces") or []
    used = {int(s.get("device", 0)) for s in snap["segments"]} | {
        i for i, t in enumerate(traces) if any(e.get("action") == "alloc" for e in t)
    }
    d = _pick_device(path, sorted(used), device)
    cats: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    live: dict[int, tuple[int, tuple]] = {}
    for seg in snap["segments"]:
        if int(seg.get("device", 0)) != d:
            continue
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                site = _frames_site(b.get("frames", []))
                live[int(b["address"])] = (int(b["size"]), site)
                cats[site][category_of(_frame_tuples(b.get("frames", [])), b.get("tag", "") or "")] += int(b["size"])
    trace = traces[d] if d < len(traces) else []
    events = []
    for entry in trace:
        if entry.get("action") in ("alloc", "free_requested"):
            site = _frames_site(entry.get("frames", []))
            events.append((entry["action"], int(entry["addr"]), int(entry["size"]), site))
            if entry["action"] == "alloc":
                frames = _frame_tuples(entry.get("frames", []))
                cats[site][category_of(frames, entry.get("tag", "") or "")] += int(entry["size"])
    before = _before_trace(live, events)
    peak, at_peak, _ = peak_live(before, events)
    moment = "the trace's peak of live bytes" if events else "the moment the snapshot was taken (it has no trace)"
    return Run(
        path=path,
        kind="snapshot",
        backend=None,
        device=d,
        peak=peak,
        moment=moment,
        at_peak=at_peak,
        steps=[],
        per_step=None,
        categories={site: c.most_common(1)[0][0] for site, c in cats.items()},
        notes=[],
    )


def _frame_tuples(frames: Iterable[dict]) -> list[tuple]:
    return [(fr.get("filename", ""), fr.get("line", 0), fr.get("name", "")) for fr in frames]


def _frames_site(frames: Sequence[dict]) -> tuple:
    """The call site of a snapshot's frames (innermost first): flight_files.site_of."""
    return site_of(_frame_tuples(frames))


def _pick_device(path: str, used: list[int], device: int | None) -> int:
    if device is not None:
        return device
    if len(used) > 1:
        raise DiffError(f"{path}: memory on devices {used}; say which with --device")
    return used[0] if used else 0


# ------------------------------------------------------------- replaying ----


def _before_trace(live_end: dict[int, tuple[int, tuple]], events: list[tuple]) -> dict[int, tuple[int, tuple]]:
    """The blocks live before ``events`` (action, addr, bytes, site), from
    those live after them: undone backwards. A block the events free and
    never allocated was older than them: its line is unknown."""
    alloc_site: dict[int, tuple] = {}
    freed_site: list[tuple | None] = []
    for action, addr, _, site in events:  # the site of each freed block, when its alloc is in the events
        if action == "alloc":
            alloc_site[addr] = site
            freed_site.append(None)
        else:
            freed_site.append(alloc_site.pop(addr, None))
    live = dict(live_end)
    for (action, addr, size, _), site in zip(reversed(events), reversed(freed_site)):
        if action == "alloc":
            live.pop(addr, None)
        else:
            live[addr] = (size, site or UNKNOWN_SITE)
    return live


def _per_step(ring: Sequence[Event], events: list[tuple], last_step: int) -> tuple[list[int], dict | None]:
    """The finished steps whose ends the ring saw (before ``last_step``, the
    file's last heartbeat) and each site's growth per step over them."""
    live: dict[int, Event] = {}
    by_site: dict[tuple, int] = collections.defaultdict(int)
    site_of = {id(e): ev[3] for e, ev in zip(ring, events)}
    ends: list[tuple[int, dict[tuple, int]]] = []
    step = ring[0].step if ring else 0
    for e in list(ring) + [None]:
        if e is None or e.step != step:
            if step < last_step:
                ends.append((step, dict(by_site)))
            if e is None:
                break
            step = e.step
        ended = replay(live, e)
        if e.action == "alloc":
            by_site[site_of[id(e)]] += e.size
        elif ended is not None:
            by_site[site_of[id(ended)]] -= ended.size
    if len(ends) < 2:
        return [s for s, _ in ends], None
    first, last = ends[0][1], ends[-1][1]
    n = len(ends) - 1
    sites = set(first) | set(last)
    return [s for s, _ in ends], {s: (last.get(s, 0) - first.get(s, 0)) / n for s in sites}


# --------------------------------------------------------------- compare ----


def site_keys(sites: Iterable[tuple]) -> dict[tuple, tuple]:
    """Each site's key for matching across runs: (path relative to the
    folder holding all the user files among ``sites``, line) for user code,
    (path, line) for library code and markers."""
    sites = list(sites)
    user = [os.path.abspath(s[0]) for s in sites if s[0] and not str(s[0]).startswith("<") and not is_internal(s[0])]
    root = os.path.dirname(user[0]) if len(set(user)) == 1 else (os.path.commonpath(user) if user else "")
    out = {}
    for s in sites:
        p = str(s[0])
        if p and not p.startswith("<") and not is_internal(p) and root:
            p = os.path.relpath(os.path.abspath(p), root)
        out[s] = (p, int(s[1]))
    return out


def compare(a: Run, b: Run, *, min_bytes: int = 0) -> dict:
    """A against B as plain data (schema ``memalloc.diff/1``, bytes): per
    site at the peak and per step, sorted by the size of the change, largest
    first; changes of at most ``min_bytes`` (per step: per step) left out.
    DiffError when they are of different backends or devices."""
    if a.backend and b.backend and a.backend != b.backend:
        raise DiffError(f"{a.path} ran on {a.backend}, {b.path} on {b.backend}: compare runs of one kind of device")
    if a.device != b.device:
        raise DiffError(f"{a.path} is device {a.device}, {b.path} device {b.device}: compare one device (--device N)")
    ka, kb = site_keys(set(a.at_peak) | set(a.per_step or {})), site_keys(set(b.at_peak) | set(b.per_step or {}))
    # a key's displayed site: B's (the newer run), else A's
    shown = {k: s for s, k in ka.items()} | {k: s for s, k in kb.items()}
    cat = {ka[s]: c for s, c in a.categories.items() if s in ka} | {
        kb[s]: c for s, c in b.categories.items() if s in kb and c
    }

    def by_key(values: Mapping[tuple, float], keys: dict[tuple, tuple]) -> dict[tuple, float]:
        out: dict[tuple, float] = collections.defaultdict(float)
        for s, v in values.items():
            out[keys[s]] += v
        return out

    def rows(va: dict[tuple, float], vb: dict[tuple, float], floor: float) -> list[dict]:
        out = []
        for k in set(va) | set(vb):
            delta = vb.get(k, 0) - va.get(k, 0)
            if abs(delta) <= floor:
                continue
            file, line, func = shown[k]
            out.append(
                {
                    "site": {"filename": file, "line": line, "function": func},
                    "key": f"{k[0]}:{k[1]}",
                    "a": _number(va.get(k, 0)),
                    "b": _number(vb.get(k, 0)),
                    "delta": _number(delta),
                    "category": cat.get(k, ""),
                    "code": source_line(file, line) if line else "",
                }
            )
        return sorted(out, key=lambda r: (-abs(r["delta"]), r["key"]))

    per_step = None
    if a.per_step is not None and b.per_step is not None:
        per_step = rows(by_key(a.per_step, ka), by_key(b.per_step, kb), min_bytes)
    notes = [f"A: {n}" for n in a.notes] + [f"B: {n}" for n in b.notes]
    if per_step is None:
        why = [f"{r.path} ({r.kind}, {len(r.steps)} finished steps)" for r in (a, b) if r.per_step is None]
        notes.append(
            "no per-step comparison: it needs two finished steps in both runs' flight files; " + ", ".join(why)
        )
    return {
        "schema": SCHEMA,
        "runs": [_run_dict(r) for r in (a, b)],
        "min_bytes": min_bytes,
        "peak": rows(by_key(a.at_peak, ka), by_key(b.at_peak, kb), min_bytes),
        "per_step": per_step,
        "notes": notes,
    }


def _number(v: float) -> int | float:
    """Bytes as an int; a growth per step that is not whole stays a float."""
    return int(v) if float(v).is_integer() else v


def _run_dict(r: Run) -> dict:
    return {
        "path": r.path,
        "kind": r.kind,
        "backend": r.backend,
        "device": r.device,
        "peak": r.peak,
        "moment": r.moment,
        "steps": r.steps,
    }


def diff(a: str, b: str, *, device: int | None = None, min_bytes: int = 0, rank: int | None = None) -> dict:
    """:func:`compare` of the runs at paths ``a`` and ``b`` (:func:`load`;
    ``rank``: the rank to take from a job's folder)."""
    return compare(load(a, device, rank), load(b, device, rank), min_bytes=min_bytes)


__all__ = [
    "KINDS",
    "SCHEMA",
    "SUMMARY",
    "DiffError",
    "Run",
    "category_of",
    "compare",
    "diff",
    "load",
    "load_summary",
    "save_summary",
    "site_keys",
]
