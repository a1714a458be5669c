"""One page per run: ``DIR/index.html`` (:func:`write`), from the run's
flight recorder file and the reports written beside it in ``DIR``.

``python -m memalloc run --out DIR`` writes it at the end of the script
(clean or not), and the framework callbacks
(memalloc/integrations/_monitor.py) at the end of training in the
logger's folder. What it reads (:func:`collect`, plain data of schema
:data:`SCHEMA`; sizes in bytes):

- **steps**: the flight file's history, a row per finished step, step N
  ending at the N-th boundary
  (``memalloc.step()``, or ``optimizer.step()`` while nothing calls it):
  the step's peak of allocated bytes with its split by category (the
  breakdown), and the allocated and reserved bytes at its end;
- **flame**: the blocks live at the peak of the file's ring (the moment
  the ring's live bytes were highest, counting from the blocks live when
  the recorder started: flight_files.peak_live), by their
  whole Python stack, as a tree from the outermost frame in (an
  icicle/flame graph): each node's bytes are those of the blocks whose
  stack passes through it. The launcher's own outer frames (``python -m
  memalloc run``'s, runpy's, and any outer to them) are left out; stacks under
  :data:`SMALL_SHARE` of the peak merge into one node per parent, so the
  page stays small and every node still holds the bytes of all its stacks;
- **ooms**: each out-of-memory error the ring saw (step, bytes asked),
  and the OOM report files in ``DIR`` (``oom-<pid>-<n>.txt``);
- **leaks**: the leak report in ``DIR`` (``leaks.json`` of ``run
  --leaks``, ``memalloc-leaks.json`` of the callbacks), when there is one;
- **advice**: ``DIR/advice.json`` (``run --advise``), when there is one;
- **files**: the other reports in ``DIR`` (:data:`LINKED`), linked.

What a section lacks, the page says, with the flag or call that gives it.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from typing import Any

from memalloc.core._usercode import is_internal, source_line
from memalloc.reporters.run_page import render
from memalloc.trace.flight_files import FlightFile, FlightFileError, opened, peak_live

SCHEMA = "memalloc.run_page/1"
PAGE = "index.html"
LEAK_FILES = ("leaks.json", "memalloc-leaks.json")  # run --leaks; the callbacks
ADVICE_FILE = "advice.json"
LINKED = (  # the reports the page links to, when the folder has them
    *("leaks.html", "leaks.json", "memalloc-leaks.json"),
    *("steps.csv", "steps.json", "steps.png", "advice.json", "sites.json"),
)
ROOT = "all live memory"  # the flame graph's root frame
SMALL_SHARE = 1 / 2000  # stacks holding less than this share of the peak merge into one node per parent
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # memalloc/


def write(
    folder: str,
    flight: str | FlightFile | None,
    *,
    title: str = "",
    device: int | None = None,
    state: str | None = None,
    path: str | None = None,
) -> str:
    """Writes the page (:func:`collect` rendered by
    memalloc/reporters/run_page.py) to ``path`` (default
    ``folder/index.html``) and returns where."""
    page = render(collect(folder, flight, title=title, device=device, state=state))
    path = path or os.path.join(folder, PAGE)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, path)
    return path


def page_for(flight_path: str, world_size: int, rank: int) -> tuple[str, str]:
    """(the reports' folder, the page's path) for a flight file read after
    its process: in ``run --out DIR``'s layout (``DIR/flight/``) the page
    ``run`` would have written, ``DIR/index.html`` (``DIR/rank<N>/`` in a
    job of several ranks); elsewhere ``<file>.html`` beside the file."""
    here = os.path.dirname(os.path.abspath(flight_path))
    if os.path.basename(here) == "flight":
        out = os.path.dirname(here)
        if world_size > 1:
            out = os.path.join(out, f"rank{rank}")
        return out, os.path.join(out, PAGE)
    return here, flight_path + ".html"


def collect(
    folder: str,
    flight: str | FlightFile | None,
    *,
    title: str = "",
    device: int | None = None,
    state: str | None = None,
) -> dict[str, Any]:
    """The run's figures as plain data (see the module docstring), from the
    flight file (its path, or the file already read): ``flight`` None (no
    flight recorder ran) leaves steps, the flame
    graph and the ring's OOMs out, with a note saying why. ``device``: the
    one to show (default: the one the ring saw allocate most). ``state``:
    how the process ended, when the process writing the page knows it
    better than its file does (the file says "running" until it closes)."""
    notes: list[str] = []
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "title": title,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "folder": os.path.abspath(folder),
        "process": None,
        "device": device if device is not None else 0,
        "steps": [],
        "flame": None,
        "ooms": [],
        "oom_files": _oom_files(folder),
        "files": [n for n in LINKED if os.path.isfile(os.path.join(folder, n))],
        "leaks": _json(folder, LEAK_FILES, notes),
        "advice": _json(folder, (ADVICE_FILE,), notes),
        "notes": notes,
    }
    f = None
    if flight is None:
        notes.append("no flight recorder ran (--no-flight-recorder): no steps, stacks or OOM events to show")
    else:
        try:
            f = opened(flight)
        except FlightFileError as e:
            notes.append(f"the flight recorder file could not be read: {e}")
    if f is not None:
        d = device if device is not None else _busiest(f)
        data["device"] = d
        data["process"] = {
            "pid": f.pid,
            "host": f.host,
            "rank": f.rank,
            "world_size": f.world_size,
            "backend": f.backend,
            "argv": _command(f.meta.get("argv") or []),
            "state": state or f.state,
        }
        data["steps"] = [
            {k: row[k] for k in ("step", "peak_allocated", "allocated", "reserved", "split")}
            for row in f.history
            if row["device"] == d and row["step"] > 0
        ]
        ring = f.rings[d] if d < len(f.rings) else []
        data["flame"] = _flame(f, d, notes)
        # an event's step is memalloc.step()'s count when it happened: it belongs to the step ending at the next one
        data["ooms"] = [{"step": e.step + 1, "bytes": e.size, "time_ns": e.time_ns} for e in ring if e.action == "oom"]
        if f.sequences[d] and f.sequences[d][0] > 1:
            notes.append(
                f"the ring wrapped ({f.sequences[d][0] - 1} older records lost): the flame graph's peak is the "
                "highest the kept records reach (flight_recorder_records:N keeps more)"
            )
    return data


def _command(argv: Sequence[str]) -> list[str]:
    """The process's command line as typed: ``python -m memalloc ...`` for
    memalloc's own entry point (whose argv[0] is its __main__.py)."""
    argv = [str(a) for a in argv]
    if argv and argv[0].endswith(os.path.join("memalloc", "__main__.py")):
        return ["python", "-m", "memalloc", *argv[1:]]
    return argv


def _busiest(f: FlightFile) -> int:
    """The device whose ring allocated the most bytes, with those live at
    the start (0 when none did)."""
    totals = [
        sum(e.size for e in ring if e.action == "alloc") + sum(b for b, _ in f.live_at_start.get(d, {}).values())
        for d, ring in enumerate(f.rings)
    ]
    return max(range(len(totals)), key=lambda i: totals[i]) if totals and max(totals) > 0 else 0


def _json(folder: str, names: Sequence[str], notes: list[str]) -> Any:
    """The first of ``names`` in ``folder`` as JSON; None when none is there."""
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as fh:
                    return json.load(fh)
            except (OSError, ValueError) as e:
                notes.append(f"{name} could not be read: {e}")
    return None


def _oom_files(folder: str) -> list[dict[str, str]]:
    """The OOM reports memalloc/features/oom.py wrote in ``folder``: each
    ``.txt`` with its first line."""
    out = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("oom-") and n.endswith(".txt"))
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as fh:
                first = fh.readline().strip()
        except OSError:
            first = ""
        out.append({"file": name, "first_line": first})
    return out


# ------------------------------------------------------------ the flame ----


_LAUNCHER = os.path.join(_PACKAGE, "cli", "run.py")  # python -m memalloc run: runs the script through runpy


def _runpy(frame: Sequence) -> bool:
    file = str(frame[0])
    return file.startswith("<frozen runpy") or os.path.basename(file) == "runpy.py"


def program_stack(frames: Sequence[Sequence]) -> list[tuple[str, int, str]]:
    """A stack's frames (innermost first, as the file keeps them) outermost
    first, from the script's own frame in: the frames of ``python -m
    memalloc run`` (and of whatever started it) and runpy's, which start
    the script, are left out."""
    out = [(str(fr[0]), int(fr[1]), str(fr[2])) for fr in reversed(frames)]
    for i, fr in enumerate(out):
        if os.path.abspath(fr[0]) == _LAUNCHER:
            j = i + 1
            while j < len(out) and _runpy(out[j]):
                j += 1
            return out[j:]
    return out


def _flame(f: FlightFile, device: int, notes: list[str]) -> dict[str, Any] | None:
    """The live blocks at the ring's peak, counting from those live when
    the recorder started, as a tree of frames (see the module docstring);
    None when there were none."""
    ring = f.rings[device] if device < len(f.rings) else []
    kept = [e for e in ring if e.action in ("alloc", "free_requested")]
    start = f.live_at_start.get(device, {})
    if not start and not any(e.action == "alloc" for e in kept):
        return None
    total, by_stack, at = peak_live(start, [(e.action, e.addr, e.size, e.stack_id) for e in kept])
    moment = kept[at] if at >= 0 else None
    root: dict[str, Any] = {"name": ROOT, "file": "", "line": 0, "kind": "root", "bytes": 0, "children": {}}
    unnamed = 0
    for stack_id, nbytes in by_stack.items():
        frames = f.stacks.get(stack_id)
        if not frames:
            unnamed += nbytes
            frames = [["<no stack>", 0, "<no stack>"]]
        node = root
        node["bytes"] += nbytes
        for file, line, func in program_stack(frames) or [("<launcher>", 0, "<launcher>")]:
            key = (file, line, func)
            child = node["children"].get(key)
            if child is None:
                kind = "user" if not is_internal(file) and not file.startswith("<") else "library"
                child = {"name": func, "file": file, "line": line, "kind": kind, "bytes": 0, "children": {}}
                node["children"][key] = child
            child["bytes"] += nbytes
            node = child
    if unnamed:
        notes.append(
            f"{unnamed} bytes live at the peak have no stack (call_sites:False, or allocated before recording began)"
        )
    return {
        "total": total,
        "step": moment.step + 1 if moment is not None else None,  # numbered as the steps are (see collect)
        "tree": _finish(root, max(1, int(total * SMALL_SHARE))),
    }


def _finish(node: dict[str, Any], floor: int) -> dict[str, Any]:
    """The node with its children as a list, largest first, those under
    ``floor`` bytes merged into one ``kind: "other"`` node; a frame of the
    user's code gets its line's text (``code``, "" where the file is gone)."""
    kids = sorted(node["children"].values(), key=lambda c: (-c["bytes"], c["file"], c["line"], c["name"]))
    big = [_finish(c, floor) for c in kids if c["bytes"] >= floor]
    small = [c for c in kids if c["bytes"] < floor]
    if small:
        big.append(
            {
                "name": f"{len(small)} smaller stack{'s' * (len(small) != 1)}",
                "file": "",
                "line": 0,
                "kind": "other",
                "bytes": sum(c["bytes"] for c in small),
                "code": "",
                "children": [],
            }
        )
    code = source_line(node["file"], node["line"]) if node["kind"] == "user" else ""
    return {**node, "code": "" if code.startswith("(") else code, "children": big}
