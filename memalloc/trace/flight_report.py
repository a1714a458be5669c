"""The one reader of a flight directory (one file per process,
memalloc/trace/flight_files.py): what ``report``, ``postmortem`` and
``top`` print, as plain data; memalloc/reporters/flight.py renders it.

- :func:`merge` (``report``: what a finished job left): per rank and step
  the peak allocated bytes, reserved bytes at the step's end and the peak's
  split by category (each file's history), the rank whose peak stands out
  (more than 10% above the median of the ranks' peaks) with the lines that
  make the difference (its live memory by line at its end against the
  median rank's: :func:`_sites`), and per rank the lines whose live memory
  grew at every step the ring covers (:func:`leaks_of`).
- :func:`process_view` (``postmortem``: what held memory when it ended;
  ``top``: what a running process holds now): how the process ended, each
  device's checkpoint, its live memory by line (:func:`live_sites`), its
  last events and last OOM.
- :func:`snapshot_of`: a file as a memory_viz snapshot.
"""

from __future__ import annotations

import bisect
import collections
import functools
import os
import statistics
import time
from typing import Any, TypedDict

from memalloc import _C
from memalloc.trace.flight_files import FlightFile, live_at_end, replay
from memalloc.trace.recording import Event
from memalloc.trace.snapshots import _TORCH_KEEP

STANDS_OUT = 1.10  # a rank whose peak is more than 10% above the median rank's
MIN_LEAK_STEPS = 4  # a leak grows at every step end over at least this many steps


class _RankSummary(TypedDict):
    """One rank's entry in :func:`merge`'s ``"ranks"`` (sizes in bytes)."""

    rank: int
    pid: int
    host: str
    state: str
    path: str
    steps: list[int]
    peak_allocated: list[int]  # per step: the largest of the devices' peaks
    reserved: list[int]  # per step: the largest of the devices' reserved bytes
    split: list[dict]  # per step: the first device's split of the peak by category
    peak: int
    sites: dict[tuple, int]  # live bytes by line at the end (_sites)
    leaks: list[dict]  # leaks_of


def merge(files: list[FlightFile]) -> dict:
    """The merged report of one job's files (sizes in bytes)."""
    ranks: list[_RankSummary] = []
    for f in sorted(files, key=lambda f: (f.rank, f.pid)):
        per_step: dict[int, list[dict]] = collections.defaultdict(list)  # a row per device
        for h in f.history:
            per_step[h["step"]].append(h)
        steps = sorted(per_step)
        peaks = [max(h["peak_allocated"] for h in per_step[s]) for s in steps]
        ranks.append(
            {
                "rank": f.rank,
                "pid": f.pid,
                "host": f.host,
                "state": f.state,
                "path": f.path,
                "steps": steps,
                "peak_allocated": peaks,
                "reserved": [max(h["reserved"] for h in per_step[s]) for s in steps],
                "split": [per_step[s][0]["split"] for s in steps],
                "peak": max(peaks, default=0),
                "sites": _sites(f),
                "leaks": leaks_of(f),
            }
        )
    median = statistics.median([r["peak"] for r in ranks]) if ranks else 0
    out: dict[str, Any] = {"ranks": ranks, "median_peak": median, "outliers": []}
    median_rank = min(ranks, key=lambda r: abs(r["peak"] - median)) if ranks else None
    for r in ranks:
        if median and r["peak"] > STANDS_OUT * median:
            base = median_rank["sites"] if median_rank is not None else {}
            diff = sorted(
                ((site, b - base.get(site, 0)) for site, b in r["sites"].items() if b > base.get(site, 0)),
                key=lambda x: -x[1],
            )
            out["outliers"].append(
                {
                    "rank": r["rank"],
                    "peak": r["peak"],
                    "above_median": r["peak"] / median - 1,
                    "median_rank": median_rank["rank"] if median_rank else None,
                    "lines": [
                        {
                            "site": list(site),
                            "bytes_more": d,
                            "bytes": r["sites"][site],
                            "median_rank_bytes": base.get(site, 0),
                        }
                        for site, d in diff[:5]
                    ],
                }
            )
    return out


def _sites(f: FlightFile) -> dict[tuple, int]:
    """Live bytes by line at the end, all devices: where a device's ring
    holds every record since the recorder started, its blocks allocated and
    not freed (those of a process that ended cleanly by its last step
    boundary, before the program's objects went at exit; of one killed or
    raising, by its last record, as postmortem lists them); otherwise the
    call sites of the last checkpoint that named them. (The checkpoint's
    call sites alone go stale: a heartbeat names them again only when that
    costs under 0.5% of the run's time, so a fast loop keeps its first
    steps' and a rank's lines that grew since are missing.)"""
    sites: dict[tuple, int] = collections.defaultdict(int)
    whole = [not seqs or seqs[0] == 1 for seqs in f.sequences]
    for d, ring in enumerate(f.rings):
        if not whole[d]:
            continue
        live: dict = {}
        for e in ring:
            if f.state == "exited" and e.step >= f.step:
                break  # the records after the last boundary: the exit's frees
            replay(live, e)
        for e in live.values():
            sites[f.site(e.stack_id)] += e.size
    for dev in (f.checkpoint or {}).get("devices", []):
        if dev["device"] < len(whole) and whole[dev["device"]]:
            continue
        for h in dev.get("top", []):
            sites[(h.get("filename"), h.get("line"), h.get("function"))] += int(h["bytes"])
    return dict(sites)


def leaks_of(f: FlightFile) -> list[dict]:
    """Lines whose live memory (blocks the ring saw allocated and not yet
    freed) grew at every step end over more than MIN_LEAK_STEPS steps the
    ring covers (finished steps: before the file's last heartbeat step):
    [{"device", "site", "bytes_per_step", "steps"}], largest first."""
    out = []
    for d, ring in enumerate(f.rings):
        live: dict[int, Event] = {}
        by_site: dict[tuple, int] = collections.defaultdict(int)
        at_step_end: dict[tuple, list[tuple[int, int]]] = collections.defaultdict(list)
        step = ring[0].step if ring else 0
        for e in ring + [None]:
            if e is None or e.step != step:  # the step ended: note each line's live bytes
                for site, b in by_site.items():
                    at_step_end[site].append((step, b))
                if e is None:
                    break
                step = e.step
            ended = replay(live, e)
            if e.action == "alloc":
                by_site[f.site(e.stack_id)] += e.size
            elif ended is not None:
                by_site[f.site(ended.stack_id)] -= ended.size
        for site, series in at_step_end.items():
            # steps that ended with a boundary (the last one is unfinished: the
            # process ended in it, freeing what it freed at exit)
            series = [(st, b) for st, b in series if st < f.step]
            values = [b for _, b in series]
            grows = len(values) > MIN_LEAK_STEPS and all(b > a for a, b in zip(values, values[1:]))
            if grows:
                out.append(
                    {
                        "device": d,
                        "site": list(site),
                        "bytes_per_step": (values[-1] - values[0]) / (len(values) - 1),
                        "steps": [series[0][0], series[-1][0]],
                    }
                )
    return sorted(out, key=lambda l: -l["bytes_per_step"])


def how_it_ended(f: FlightFile, now_ns: int | None = None) -> str:
    """How the process that wrote ``f`` ended: "exited cleanly (file
    kept)", "exited on an uncaught exception at step N", "running (pid N is
    alive)" (on this host), or "no clean exit (...)" with the age of its
    last heartbeat (``now_ns``: unix ns, default now)."""
    if f.state == "exited":
        return "exited cleanly (file kept)"
    if f.state == "raised":
        return f"exited on an uncaught exception at step {f.step}"
    if f.host == os.uname().nodename and _alive(f.pid):
        return f"running (pid {f.pid} is alive)"
    now = time.time_ns() if now_ns is None else now_ns
    when = f"{(now - f.heartbeat_ns) / 1e9:.0f} s ago, at step {f.step}" if f.heartbeat_ns else "none"
    return f"no clean exit (killed, crashed or aborted); last heartbeat {when}"


def is_running(f: FlightFile) -> bool:
    """Whether the process that wrote ``f`` may still run: it has not
    exited, and its pid is alive on this host (a process of another host
    is taken as running: its heartbeat's age tells)."""
    return f.state == "running" and (f.host != os.uname().nodename or _alive(f.pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_sites(f: FlightFile, device: int) -> list[tuple[tuple, int, int]]:
    """((file, line, function), bytes, blocks) of the blocks live at the end
    of the ring of ``device`` (those it saw allocated, and those live when
    the recorder started, not freed since), by :meth:`FlightFile.site`, most
    bytes first."""
    sites: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0])
    for e in live_at_end(f.rings[device], f.live_at_start.get(device), device).values():
        key = f.site(e.stack_id)
        sites[key][0] += e.size
        sites[key][1] += 1
    return sorted(((k, v[0], v[1]) for k, v in sites.items()), key=lambda s: -s[1])


def process_view(f: FlightFile, *, events: int = 10, top: int = 5, now_ns: int | None = None) -> dict:
    """One process's file as plain data (sizes in bytes, times in seconds):
    who it was, how it ended (:func:`how_it_ended`), ``running``, the age of
    its last heartbeat (``heartbeat_age_s``, None before the first), the
    last checkpoint (``checkpoint``: its step and per device allocated,
    reserved, peak, breakdown and call sites), and per device of the file
    (``devices``) its record count, torn and overwritten records, its
    ``top`` live sites (:func:`live_sites`), its last ``events`` records
    (step, action, bytes, user frame) and its last OOM (step, bytes asked)."""
    now = time.time_ns() if now_ns is None else now_ns
    devices = []
    for d, ring in enumerate(f.rings):
        ooms = [e for e in ring if e.action == "oom"]
        devices.append(
            {
                "device": d,
                "records": len(ring),
                "torn": f.torn[d],
                "overwritten": f.sequences[d][0] - 1 if f.sequences[d] else 0,
                "live": live_sites(f, d)[:top],
                "last": [(e.step, e.action, e.size, f.user_frame(e.stack_id)) for e in ring[-events:]]
                if events
                else [],
                "last_oom": (ooms[-1].step, ooms[-1].requested) if ooms else None,
            }
        )
    return {
        "path": f.path,
        "pid": f.pid,
        "host": f.host,
        "rank": f.rank,
        "world_size": f.world_size,
        "backend": f.backend,
        "start_ns": f.start_ns,
        "step": f.step,
        "state": f.state,
        "ended": how_it_ended(f, now),
        "running": is_running(f),
        "heartbeat_age_s": (now - f.heartbeat_ns) / 1e9 if f.heartbeat_ns else None,
        "checkpoint": f.checkpoint or {"step": f.step, "devices": []},
        "devices": devices,
    }


def snapshot_of(f: FlightFile) -> dict:
    """A flight file as ``torch.cuda.memory._snapshot()``'s format (what
    pytorch.org/memory_viz opens; sizes in bytes): every device's recorded
    events as its trace, named from the file's stacks, and the segments the
    ring saw made and not freed, with the blocks it saw allocated in them
    (a segment made before the ring's oldest record is not known)."""

    @functools.cache
    def frames_of(stack_id: int) -> list:
        return [{"filename": fr[0], "line": int(fr[1]), "name": fr[2]} for fr in f.stacks.get(stack_id, [])]

    tags = [""] * (max(f.tags, default=0) + 1)
    for i, name in f.tags.items():
        tags[i] = name
    traces = [_C.trace_entries(raw, _TORCH_KEEP, tags, frames_of) for raw in f.raw]
    segments = []
    for d, ring in enumerate(f.rings):
        segs: dict[int, dict] = {}
        for e in ring:
            if e.action in ("segment_alloc", "segment_map"):
                segs.setdefault(e.addr, {"size": 0, "stream": e.stream, "blocks": {}})["size"] += e.size
            elif e.action == "segment_free":
                segs.pop(e.addr, None)
        starts = sorted(segs)
        for e in live_at_end(ring).values():  # each live block into the segment that holds it
            i = bisect.bisect_right(starts, e.addr) - 1
            if i >= 0 and e.addr < starts[i] + segs[starts[i]]["size"]:  # (else in a segment older than the ring)
                segs[starts[i]]["blocks"][e.addr] = (e.size, e.requested, e.stack_id)
        for addr, seg in sorted(segs.items()):
            blocks, at = [], addr
            for b_addr, (size, requested, stack_id) in sorted(seg["blocks"].items()):
                if b_addr > at:
                    blocks.append(
                        {"address": at, "size": b_addr - at, "requested_size": 0, "state": "inactive", "frames": []}
                    )
                blocks.append(
                    {
                        "address": b_addr,
                        "size": size,
                        "requested_size": requested,
                        "state": "active_allocated",
                        "frames": frames_of(stack_id),
                    }
                )
                at = b_addr + size
            if at < addr + seg["size"]:
                blocks.append(
                    {
                        "address": at,
                        "size": addr + seg["size"] - at,
                        "requested_size": 0,
                        "state": "inactive",
                        "frames": [],
                    }
                )
            live = [b for b in blocks if b["state"] == "active_allocated"]
            segments.append(
                {
                    "device": d,
                    "address": addr,
                    "total_size": seg["size"],
                    "stream": seg["stream"],
                    "allocated_size": sum(b["size"] for b in live),
                    "active_size": sum(b["size"] for b in live),
                    "requested_size": sum(b["requested_size"] for b in live),
                    "segment_type": "small" if seg["size"] <= (2 << 20) else "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "frames": [],
                    "blocks": blocks,
                }
            )
    return {"segments": segments, "device_traces": traces}


__all__ = [
    "STANDS_OUT",
    "how_it_ended",
    "is_running",
    "leaks_of",
    "live_sites",
    "merge",
    "process_view",
    "snapshot_of",
]
