"""All ranks, one report: the flight recorder files of one job (a DIR, one
file per rank, memalloc/trace/flight_files.py) merged: per rank and step the
peak allocated bytes, reserved bytes at the step's end and the peak's split
by category (each file's history), the rank whose peak stands out (more than
10% above the median of the ranks' peaks) with the lines that make the
difference (its live memory by line at its end against the median rank's:
:func:`_sites`), and per rank the lines whose live memory grew at every step
the ring covers (leaks). Text (:func:`to_text`) and a self-contained HTML
page with a per-rank memory-over-steps chart (:func:`to_html`).
"""

from __future__ import annotations

import bisect
import collections
import functools
import html
import statistics
from typing import Any, TypedDict

from memalloc import _C
from memalloc.core._format import fmt_bytes
from memalloc.reporters.report_html import chart, render_page
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


def _where(site) -> str:
    file, line, func = site
    return f"{file}:{line} in {func}" if file else "?"


def to_text(m: dict) -> str:
    lines = [f"memalloc job report: {len(m['ranks'])} rank(s), median peak {fmt_bytes(m['median_peak'])}"]
    for r in m["ranks"]:
        lines.append(
            f"rank {r['rank']} (pid {r['pid']} on {r['host']}, {r['state']}): peak {fmt_bytes(r['peak'])} "
            f"over {len(r['steps'])} steps"
        )
    for o in m["outliers"]:
        lines.append(
            f"rank {o['rank']} stands out: peak {fmt_bytes(o['peak'])}, {o['above_median']:.0%} above the "
            f"median; the lines that make the difference (against rank {o['median_rank']}):"
        )
        for l in o["lines"]:
            lines.append(
                f"    +{fmt_bytes(l['bytes_more'])}  {_where(l['site'])}  ({fmt_bytes(l['bytes'])} against "
                f"{fmt_bytes(l['median_rank_bytes'])})"
            )
    for r in m["ranks"]:
        for leak in r["leaks"]:
            lines.append(
                f"rank {r['rank']} leaks: {_where(leak['site'])} grows by "
                f"{fmt_bytes(leak['bytes_per_step'])} per step (steps {leak['steps'][0]}-{leak['steps'][1]})"
            )
    if m["ranks"]:
        lines.append("peak allocated per step:")
        lines.append("  step  " + "".join(f"{'rank ' + str(r['rank']):>14}" for r in m["ranks"]))
        peak_at = [dict(zip(r["steps"], r["peak_allocated"])) for r in m["ranks"]]
        for s in sorted({s for r in m["ranks"] for s in r["steps"]}):
            cells = [fmt_bytes(at[s]) if s in at else "-" for at in peak_at]
            lines.append(f"  {s:>4}  " + "".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


_PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#953800", "#57606a")


def to_html(m: dict) -> str:
    """The merged report as one self-contained page: ``id="ranks"`` (a row
    per rank, ``data-rank``, ``data-peak``), ``id="chart-ranks"`` (one
    ``polyline.series.rank-N`` per rank), ``id="outliers"`` and ``id="leaks"``."""
    e = html.escape
    steps = sorted({s for r in m["ranks"] for s in r["steps"]})
    series = []
    for r in m["ranks"]:
        at = dict(zip(r["steps"], r["peak_allocated"]))
        series.append((f"rank-{r['rank']}", f"rank {r['rank']}", [at.get(s, 0) for s in steps]))
    rows = "".join(
        f'<tr data-rank="{r["rank"]}" data-peak="{r["peak"]}"><td>{r["rank"]}</td><td>{r["pid"]}</td>'
        f"<td>{e(r['host'])}</td><td>{e(r['state'])}</td><td>{e(fmt_bytes(r['peak']))}</td></tr>"
        for r in m["ranks"]
    )
    outliers = (
        "".join(
            f'<p data-rank="{o["rank"]}">rank {o["rank"]} stands out: peak {e(fmt_bytes(o["peak"]))}, '
            f"{o['above_median']:.0%} above the median</p><ul>"
            + "".join(
                f"<li>+{e(fmt_bytes(l['bytes_more']))} <code>{e(_where(l['site']))}</code></li>" for l in o["lines"]
            )
            + "</ul>"
            for o in m["outliers"]
        )
        or "<p>No rank stands out.</p>"
    )
    leaks = "".join(
        f'<li data-rank="{r["rank"]}">rank {r["rank"]}: <code>{e(_where(l["site"]))}</code> +'
        f"{e(fmt_bytes(l['bytes_per_step']))} per step</li>"
        for r in m["ranks"]
        for l in r["leaks"]
    )
    # a legend swatch is the 2px top border of a box 0 high (report_html's .legend rule): the border takes the colour
    css = "".join(
        f".series.rank-{r['rank']}{{stroke:{_PALETTE[i % len(_PALETTE)]};fill:none;stroke-width:2}}"
        f".legend .rank-{r['rank']}::before{{border-color:{_PALETTE[i % len(_PALETTE)]}}}"
        f".area.rank-{r['rank']}{{fill:none}}"
        for i, r in enumerate(m["ranks"])
    )
    sections = [
        f'<section class="card" id="summary"><h1>memalloc job report: {len(m["ranks"])} ranks</h1>'
        f'<table id="ranks"><tr><th>rank</th><th>pid</th><th>host</th><th>end</th><th>peak allocated</th></tr>'
        f"{rows}</table></section>",
        '<section class="card" id="memory"><h2>Peak allocated per step, by rank</h2>'
        + chart("chart-ranks", steps, series)
        + "</section>",
        f'<section class="card" id="outliers"><h2>Ranks that stand out</h2>{outliers}</section>',
        f'<section class="card" id="leaks"><h2>Leaks per rank</h2><ul>{leaks or "<li>none found</li>"}</ul></section>',
    ]
    return render_page(f"memalloc job report: {len(m['ranks'])} ranks", sections, css)


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


__all__ = ["STANDS_OUT", "leaks_of", "merge", "snapshot_of", "to_html", "to_text"]
