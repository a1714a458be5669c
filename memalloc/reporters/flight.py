"""Renderings of a flight directory's plain data (what
memalloc/trace/flight_report.py reads from it): the job report as text and
as a self-contained HTML page (``report DIR``), one process's postmortem
(``postmortem DIR``) and one frame of the live view (``top``). Sizes in the
data are bytes; nothing here reads a file or the allocator."""

from __future__ import annotations

import datetime
import html
from collections.abc import Sequence

from memalloc.core._format import describe_split, fmt_bytes
from memalloc.reporters.report_html import chart, render_page


def _where(site: Sequence) -> str:
    file, line, func = site
    return f"{file}:{line} in {func}" if file else "?"


def job_text(m: dict) -> str:
    """The merged job report (:func:`memalloc.trace.flight_report.merge`) as
    text: each rank's peak, the ranks that stand out with their lines, each
    rank's leaks, and a table of the peak allocated per step and rank."""
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


def job_html(m: dict) -> str:
    """The merged report as one self-contained page: ``id="ranks"`` (a row
    per rank, ``data-rank``, ``data-peak``, a link to the rank's run page
    where ``page`` gives its path), ``id="chart-ranks"`` (one
    ``polyline.series.rank-N`` per rank), ``id="outliers"`` and ``id="leaks"``."""
    e = html.escape
    steps = sorted({s for r in m["ranks"] for s in r["steps"]})
    series = []
    for r in m["ranks"]:
        at = dict(zip(r["steps"], r["peak_allocated"]))
        series.append((f"rank-{r['rank']}", f"rank {r['rank']}", [at.get(s, 0) for s in steps]))
    rows = "".join(
        f'<tr data-rank="{r["rank"]}" data-peak="{r["peak"]}"><td>{r["rank"]}</td><td>{r["pid"]}</td>'
        f"<td>{e(r['host'])}</td><td>{e(r['state'])}</td><td>{e(fmt_bytes(r['peak']))}</td>"
        + (f'<td><a href="{e(r["page"])}">its page</a></td>' if r.get("page") else "<td></td>")
        + "</tr>"
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
        '<table id="ranks"><tr><th>rank</th><th>pid</th><th>host</th><th>end</th><th>peak allocated</th>'
        "<th>run page</th></tr>"
        f"{rows}</table></section>",
        '<section class="card" id="memory"><h2>Peak allocated per step, by rank</h2>'
        + chart("chart-ranks", steps, series)
        + "</section>",
        f'<section class="card" id="outliers"><h2>Ranks that stand out</h2>{outliers}</section>',
        f'<section class="card" id="leaks"><h2>Leaks per rank</h2><ul>{leaks or "<li>none found</li>"}</ul></section>',
    ]
    return render_page(f"memalloc job report: {len(m['ranks'])} ranks", sections, css)


def postmortem_text(v: dict) -> str:
    """One process's :func:`~memalloc.trace.flight_report.process_view` as
    ``postmortem`` prints it: who it was, how it ended, and per device its
    records, the last checkpoint's bytes and breakdown, the live memory by
    line at the end and the last events."""
    started = datetime.datetime.fromtimestamp(v["start_ns"] / 1e9, datetime.timezone.utc).isoformat(timespec="seconds")
    ended = v["ended"]
    if v["running"]:
        ended += f"; `python -m memalloc top {v['pid']}` shows it live"
    lines = [
        f"== {v['path']}",
        f"pid {v['pid']} on {v['host']}, rank {v['rank']} of {v['world_size']}, {v['backend']} backend, "
        f"started {started}",
        f"how it ended: {ended}",
        f"last step: {v['step']}",
    ]
    cp = v["checkpoint"]
    for dev in v["devices"]:
        d = dev["device"]
        lines.append(
            f"device {d}: {dev['records']} events in the file"
            + (f", {dev['torn']} torn (being written at the end)" if dev["torn"] else "")
            + (f", the ring wrapped ({dev['overwritten']} older ones overwritten)" if dev["overwritten"] else "")
        )
        at = next((x for x in cp["devices"] if x["device"] == d), None)
        if at:
            lines.append(
                f"  at step {cp['step']}'s checkpoint: {fmt_bytes(at['allocated'])} allocated, "
                f"{fmt_bytes(at['reserved'])} reserved, peak {fmt_bytes(at['peak_allocated'])}"
            )
            split = (at.get("breakdown") or {}).get("split")
            if split:
                lines.append("  breakdown at the last finished step: " + describe_split(split))
        if dev["live"]:
            lines.append(
                "  live memory at the end by line (blocks live at the recorder's start or allocated since, not freed):"
            )
            for (file, line, func), nbytes, blocks in dev["live"]:
                lines.append(f"    {fmt_bytes(nbytes):>10} in {blocks} blocks  {file}:{line} in {func}")
        if dev["last"]:
            lines.append(f"  last {len(dev['last'])} events:")
            for step, action, size, user in dev["last"]:
                where = f"  {user[0]}:{user[1]} in {user[2]}" if user else ""
                lines.append(f"    step {step:>5} {action:<15} {fmt_bytes(size):>10}{where}")
    return "\n".join(lines)


def top_lines(v: dict, top: int = 3) -> list[str]:
    """One process's :func:`~memalloc.trace.flight_report.process_view` as
    ``top`` shows it: step, heartbeat age, per device of its last checkpoint
    the bytes allocated, reserved and at the peak, the breakdown, the ``top``
    call sites and the last OOM. A process that is no longer running gets
    one line that names ``postmortem``, which says what it held at its end."""
    age = f"{v['heartbeat_age_s']:.1f} s ago" if v["heartbeat_age_s"] is not None else "none yet"
    head = f"pid {v['pid']} (rank {v['rank']}/{v['world_size']}, {v['backend']}) step {v['step']}, heartbeat {age}"
    if not v["running"]:
        return [f"{head}: not running ({v['ended']}); `python -m memalloc postmortem` says what it held"]
    out = [head]
    cp = v["checkpoint"]
    ooms = {dev["device"]: dev["last_oom"] for dev in v["devices"]}
    for dev in cp["devices"]:
        d = dev["device"]
        out.append(
            f"  device {d}: allocated {fmt_bytes(dev['allocated'])}, reserved {fmt_bytes(dev['reserved'])}, "
            f"peak {fmt_bytes(dev['peak_allocated'])} (at step {cp['step']})"
        )
        split = (dev.get("breakdown") or {}).get("split") or {}
        if any(split.values()):
            out.append("    by category: " + describe_split(split))
        if dev.get("top_step") == -1:
            out.append("    call sites: named at the first step")
        elif dev.get("top_step") not in (None, cp["step"]):
            out.append(f"    call sites as of step {dev['top_step']} (named again as 0.5% of the run's time allows):")
        for h in dev.get("top", [])[:top]:
            where = f"{h['filename']}:{h['line']} in {h['function']}" if h.get("filename") else (h.get("tag") or "?")
            out.append(f"    {fmt_bytes(h['bytes']):>10} in {h['tensors']} tensors  {where}")
        if ooms.get(d):
            step, asked = ooms[d]
            out.append(f"    last OOM: step {step}, {fmt_bytes(asked)} asked")
    return out


__all__ = ["job_html", "job_text", "postmortem_text", "top_lines"]
