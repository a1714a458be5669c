"""The leak report (schema ``memalloc.leak_report/1``, docs/leak-report.md)
as one self-contained HTML page: :func:`render_html`.

The page needs nothing but itself: CSS is inline, charts are inline SVG drawn
here, there is no script and no link to anything outside (it can be mailed,
attached to a bug or opened offline). Hovering a chart shows the values at
that step (SVG ``<title>`` tooltips). Every string taken from the report is
HTML-escaped. Stable hooks for tests and tools: ``id="summary"``,
``id="chart-memory"``, ``id="no-leaks"`` (only when there are none), and per
leak ``<article class="leak" id="leak-N" data-bytes-per-step=...>`` (N = 0
for the largest bytes/step) holding ``id="chart-leak-N"``; every chart is an
``<svg class="chart">`` with one ``<polyline class="series ...">`` per line.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from typing import Any

from memalloc.core._format import fmt_bytes

__all__ = ["chart", "render_html", "render_page"]

_UNITS = (("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40))
# Chart geometry in SVG user units (the SVG scales to the page width):
# width, heights of the memory chart and of a leak's chart, margins.
_W, _H_MEMORY, _H_LEAK = 760, 250, 190
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 16, 14, 44
_MAX_HOVER_BANDS = 200

_CSS = """
:root { --fg:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#f6f8fa; --card:#fff;
  --accent:#cf222e; --blue:#0969da; --grey:#8c959f; --green:#1a7f37; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width:1080px; margin:0 auto; padding:24px 20px 48px; }
h1 { font-size:26px; margin:0 0 2px; } h2 { font-size:19px; margin:0 0 12px; }
h3 { font-size:16px; margin:0; display:flex; gap:10px; align-items:baseline; flex-wrap:wrap; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size:13px; }
pre { margin:6px 0; padding:8px 10px; background:var(--bg); border:1px solid var(--line);
  border-radius:6px; white-space:pre-wrap; word-break:break-all; }
.muted { color:var(--muted); }
.card { background:var(--card); border:1px solid var(--line); border-radius:10px;
  padding:18px 20px; margin:16px 0; }
.kv { display:grid; grid-template-columns:repeat(auto-fit, minmax(150px, 1fr)); gap:10px 18px; margin:0; }
.kv div { min-width:0; } .kv dt { color:var(--muted); font-size:12px; text-transform:uppercase;
  letter-spacing:.04em; } .kv dd { margin:0; font-size:16px; font-weight:600; overflow-wrap:anywhere; }
.bad { color:var(--accent); } .good { color:var(--green); }
.notes { margin:12px 0 0; padding-left:20px; color:var(--muted); }
table { border-collapse:collapse; width:100%; font-size:14px; }
th, td { text-align:left; padding:7px 10px; border-bottom:1px solid var(--line); vertical-align:top; }
th { color:var(--muted); font-weight:600; font-size:12px; text-transform:uppercase; }
td.num, th.num { text-align:right; white-space:nowrap; font-variant-numeric:tabular-nums; }
tbody tr:nth-child(even) { background:#fafbfc; }
a { color:var(--blue); text-decoration:none; } a:hover { text-decoration:underline; }
.leak { border-left:4px solid var(--accent); }
.rank { color:var(--muted); font-weight:600; }
.badge { background:#ffebe9; color:var(--accent); border-radius:999px; padding:1px 10px;
  font-size:13px; font-weight:600; white-space:nowrap; }
.label { color:var(--muted); font-size:13px; margin:10px 0 0; }
.hint { background:#fff8c5; border:1px solid #eed888; border-radius:6px; padding:8px 12px; margin:12px 0; }
.holder { margin:10px 0; }
details { margin-top:10px; } summary { cursor:pointer; color:var(--blue); }
ol.frames { margin:6px 0; padding-left:28px; font-family:ui-monospace, Menlo, Consolas, monospace; font-size:13px; }
ol.frames li.alloc { font-weight:700; }
.chart { width:100%; height:auto; display:block; margin-top:10px; }
.chart text { font-size:11px; fill:var(--muted); } .chart .axis-title { font-size:12px; fill:var(--fg); }
.chart .grid { stroke:#eaeef2; } .chart .axis { stroke:var(--grey); }
.chart .series { fill:none; stroke-width:2; stroke-linejoin:round; }
.chart .allocated { stroke:var(--blue); } .chart .reserved { stroke:var(--grey); stroke-dasharray:5 3; }
.chart .live { stroke:var(--accent); } .chart .area { stroke:none; opacity:.12; }
.chart .area.allocated { fill:var(--blue); } .chart .area.live { fill:var(--accent); }
.chart .band { fill:var(--fg); opacity:0; } .chart .band:hover { opacity:.07; }
.legend { display:flex; gap:18px; font-size:13px; color:var(--muted); margin-top:4px; }
.legend span::before { content:""; display:inline-block; width:18px; height:0; margin-right:6px;
  vertical-align:middle; border-top:2px solid; }
.legend .allocated::before { border-color:var(--blue); }
.legend .reserved::before { border-color:var(--grey); border-top-style:dashed; }
.legend .live::before { border-color:var(--accent); }
footer { color:var(--muted); font-size:12px; margin-top:24px; }
"""


def render_html(report: dict) -> str:
    """The leak report ``report`` (a ``memalloc.leak_report/1`` dict, sizes in
    bytes, steps as ``memalloc.step()`` numbers) as a complete HTML page.

    Leaks are shown largest ``bytes_per_step`` first. Sizes are printed in
    binary units (B, KiB, MiB, GiB); growth rates per step. Keys the page
    does not use are ignored; missing optional keys (``holder``, ``notes``,
    ``stack``, ...) are left out of the page.
    """
    steps = [int(s) for s in report.get("steps", [])]
    leaks = sorted(report.get("leaks", []), key=lambda k: -float(k.get("bytes_per_step", 0)))
    total = sum(float(k.get("bytes_per_step", 0)) for k in leaks)
    n = len(leaks)
    title = f"memalloc leak report: {n} leak{'s' * (n != 1)}" + (f" (+{fmt_bytes(total)}/step)" if n else "")
    body = [
        _summary(report, steps, n, total),
        '<section class="card" id="memory"><h2>Allocated and reserved memory</h2>'
        + _chart(
            "chart-memory",
            steps,
            [
                ("allocated", "allocated", report.get("allocated", [])),
                ("reserved", "reserved", report.get("reserved", [])),
            ],
            "memory",
        )
        + "</section>",
    ]
    if leaks:
        body.append(_overview(leaks))
        body.extend(_leak(i, leak, steps) for i, leak in enumerate(leaks))
    else:
        body.append(
            '<section class="card no-leaks" id="no-leaks"><h2 class="good">No leaks found</h2>'
            f"<p>No allocation site kept growing over the {len(steps)} sampled steps (threshold "
            f"{_e(fmt_bytes(report.get('threshold_bytes_per_step', 0)))}/step, the first "
            f"{_e(report.get('warmup_steps', 0))} ignored as warm-up).</p></section>"
        )
    body.append(
        f"<footer>schema {_e(report.get('schema', '?'))} · created {_e(report.get('created', '?'))} · "
        "rendered by memalloc.reporters.report_html</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body><main>\n"
        + "\n".join(body)
        + "\n</main></body></html>\n"
    )


def render_page(title: str, sections: Sequence[str], css: str = "") -> str:
    """A complete self-contained page in this module's style: ``sections``
    are HTML fragments (already escaped), ``css`` extra rules."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}{css}</style></head>\n<body><main>\n"
        + "\n".join(sections)
        + "\n</main></body></html>\n"
    )


def chart(
    chart_id: str, steps: Sequence[int], lines: Sequence[tuple[str, str, Sequence[float]]], kind: str = "memory"
) -> str:
    """A line chart of byte series over ``steps`` (inline SVG and legend):
    ``lines`` as (css class, legend label, bytes at each step)."""
    return _chart(chart_id, steps, lines, kind)


# ------------------------------------------------------------ sections ----


def _summary(report: dict, steps: list[int], n: int, total: float) -> str:
    span = f" (steps {steps[0]}–{steps[-1]})" if steps else ""
    facts = [
        ("Backend", f"{report.get('backend', '?')}, device {report.get('device', '?')}"),
        ("Steps sampled", f"{len(steps)}{span}"),
        ("Warm-up steps", report.get("warmup_steps", 0)),
        ("Threshold", f"{fmt_bytes(report.get('threshold_bytes_per_step', 0))}/step"),
        ("Leaks", n),
        ("Leaked per step", f"{fmt_bytes(total)}/step"),
    ]
    cls = {"Leaks": "bad" if n else "good", "Leaked per step": "bad" if n else "good"}
    kv = "".join(
        f'<div><dt>{_e(k)}</dt><dd class="{cls.get(k, "")}" data-key="{_e(k.lower())}">{_e(v)}</dd></div>'
        for k, v in facts
    )
    notes = "".join(f"<li>{_e(x)}</li>" for x in report.get("notes", []) or [])
    return (
        "<header><h1>memalloc leak report</h1>"
        f'<p class="muted">created {_e(report.get("created", "?"))}</p></header>\n'
        f'<section class="card summary" id="summary"><dl class="kv">{kv}</dl>'
        + (f'<ul class="notes">{notes}</ul>' if notes else "")
        + "</section>"
    )


def _overview(leaks: Sequence[dict]) -> str:
    rows = "".join(
        f'<tr><td class="num">{i + 1}</td><td><a href="#leak-{i}"><code>{_e(_where(k.get("site")))}</code></a></td>'
        f'<td class="num">{_e(fmt_bytes(float(k.get("bytes_per_step", 0))))}</td>'
        f'<td class="num">{_e(_count(k.get("tensors_per_step", 0)))}</td>'
        f'<td class="num">{_e(fmt_bytes(k.get("retained_bytes", 0)))}</td><td>{_e(k.get("cause", ""))}</td></tr>'
        for i, k in enumerate(leaks)
    )
    return (
        '<section class="card" id="overview"><h2>Leaks by growth per step</h2><table><thead><tr>'
        '<th class="num">#</th><th>site</th><th class="num">bytes/step</th><th class="num">tensors/step</th>'
        f'<th class="num">retained</th><th>cause</th></tr></thead><tbody>{rows}</tbody></table></section>'
    )


def _leak(i: int, leak: dict, steps: list[int]) -> str:
    site, alloc = leak.get("site") or {}, leak.get("alloc_site") or {}
    bps = float(leak.get("bytes_per_step", 0))
    parts = [
        f'<h3><span class="rank">#{i + 1}</span><code class="site">{_e(_where(site, True))}</code>'
        f'<span class="badge">+{_e(fmt_bytes(bps))}/step</span></h3>',
        _code(leak.get("code", "")),
    ]
    if alloc and (alloc.get("filename"), alloc.get("line")) != (site.get("filename"), site.get("line")):
        parts.append(
            f'<p class="label">allocated at <code class="alloc-site">{_e(_where(alloc, True))}</code></p>'
            + _code(leak.get("alloc_code", ""))
        )
    facts = [
        ("Bytes / step", f"{fmt_bytes(bps)}"),
        ("Tensors / step", _count(leak.get("tensors_per_step", 0))),
        ("Retained", f"{fmt_bytes(leak.get('retained_bytes', 0))} in {leak.get('retained_tensors', 0)} tensors"),
        ("First step", leak.get("first_step", "?")),
        ("Cause", leak.get("cause", "unknown")),
    ]
    parts.append(
        '<dl class="kv facts">' + "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in facts) + "</dl>"
    )
    holder = leak.get("holder")
    if holder:
        length = f", {holder['length']} items" if holder.get("length") is not None else ""
        parts.append(
            f'<div class="holder"><p class="label">held by {_e(holder.get("kind", "?"))} '
            f"<code>{_e(holder.get('name', ''))}</code>{_e(length)} at "
            f"<code>{_e(holder.get('where', ''))}</code></p>{_code(holder.get('code', ''))}</div>"
        )
    if leak.get("hint"):
        parts.append(f'<p class="hint">{_inline_code(leak["hint"])}</p>')
    parts.append(
        _chart(f"chart-leak-{i}", steps, [("live", "live bytes of this site", leak.get("series", []))], "live", _H_LEAK)
    )
    frames = leak.get("stack") or []
    if frames:
        key = (alloc.get("filename"), alloc.get("line"))
        mark = ' class="alloc"'
        items = "".join(
            f"<li{mark if (f.get('filename'), f.get('line')) == key else ''}>"
            f"{_e(f.get('filename', '?'))}:{_e(f.get('line', '?'))} {_e(f.get('name', ''))}</li>"
            for f in frames
        )
        parts.append(
            f'<details class="stack"><summary>Full stack ({len(frames)} frames, innermost first)</summary>'
            f'<ol class="frames">{items}</ol></details>'
        )
    return (
        f'<article class="card leak" id="leak-{i}" data-bytes-per-step="{bps!r}" '
        f'data-tensors-per-step="{float(leak.get("tensors_per_step", 0))!r}" '
        f'data-site="{_e(_where(site))}">' + "\n".join(parts) + "</article>"
    )


# -------------------------------------------------------------- charts ----


def _chart(
    chart_id: str,
    steps: Sequence[int],
    lines: Sequence[tuple[str, str, Sequence[float]]],
    kind: str,
    height: int = _H_MEMORY,
) -> str:
    """A line chart of byte series over ``steps`` as inline SVG plus legend.
    ``lines``: (css class, legend label, bytes at each step); a series is
    cut to the number of steps. The y axis is in the binary unit that fits
    the largest value; hover bands carry ``<title>`` tooltips."""
    lines = [(cls, label, [float(v) for v in vals][: len(steps)]) for cls, label, vals in lines]
    top_value = max([v for _, _, vals in lines for v in vals] + [0.0])
    unit, scale = _unit_for(top_value)
    tick, ymax = _nice_axis(top_value / scale)
    x0, x1 = (steps[0], steps[-1]) if steps else (0, 1)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    pw, ph = _W - _LEFT - _RIGHT, height - _TOP - _BOTTOM

    def px(s: float) -> float:
        return _LEFT + (s - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return _TOP + ph - v / scale / ymax * ph

    out = [
        f'<svg class="chart chart-{kind}" id="{chart_id}" viewBox="0 0 {_W} {height}" role="img" '
        f'data-unit="{unit}" data-steps="{len(steps)}">'
    ]
    for k in range(int(round(ymax / tick)) + 1):  # horizontal grid and y labels
        y = py(k * tick * scale)
        out.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{k * tick:g}</text>'
        )
    xtick, _ = _nice_axis(x1 - x0, target=8, integer=True)
    s = math.ceil(x0 / xtick) * xtick
    while s <= x1:
        out.append(
            f'<line class="axis" x1="{px(s):.1f}" x2="{px(s):.1f}" y1="{_TOP + ph}" y2="{_TOP + ph + 4}"/>'
            f'<text x="{px(s):.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{s:.0f}</text>'
        )
        s += xtick
    out.append(
        f'<line class="axis" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{_TOP + ph}" y2="{_TOP + ph}"/>'
        f'<line class="axis" x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{_TOP + ph}"/>'
        f'<text class="axis-title" x="{_LEFT + pw / 2:.0f}" y="{height - 6}" text-anchor="middle">step</text>'
        f'<text class="axis-title" transform="translate(14 {_TOP + ph / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">bytes ({unit})</text>'
    )
    for cls, label, vals in lines:
        pts = " ".join(f"{px(st):.1f},{py(v):.1f}" for st, v in zip(steps, vals))
        if not pts:
            continue
        if cls != "reserved":  # shade under the main series
            first, last = px(steps[0]), px(steps[len(vals) - 1])
            out.append(
                f'<path class="area {cls}" d="M{first:.1f},{_TOP + ph} L{pts.replace(" ", " L")} '
                f'L{last:.1f},{_TOP + ph} Z"/>'
            )
        out.append(f'<polyline class="series {cls}" data-label="{_e(label)}" points="{pts}"/>')
    out.extend(_hover_bands(steps, lines, px, _TOP, ph))
    out.append("</svg>")
    legend = "".join(f'<span class="{cls}">{_e(label)}</span>' for cls, label, _ in lines)
    return "".join(out) + f'<div class="legend">{legend}</div>'


def _hover_bands(
    steps: Sequence[int], lines: Sequence[tuple[str, str, Sequence[float]]], px: Any, top: float, height: float
) -> list[str]:
    """Invisible vertical bands (at most _MAX_HOVER_BANDS) whose ``<title>``
    gives the step and every series' value there."""
    stride = max(1, math.ceil(len(steps) / _MAX_HOVER_BANDS))
    idx = list(range(0, len(steps), stride))
    bands = []
    for j, i in enumerate(idx):
        left = px(steps[i]) if j == 0 else (px(steps[idx[j - 1]]) + px(steps[i])) / 2
        right = px(steps[i]) if j == len(idx) - 1 else (px(steps[i]) + px(steps[idx[j + 1]])) / 2
        if right - left < 1:
            left, right = left - 3, right + 3
        vals = "; ".join(f"{label} {fmt_bytes(v[i])}" for _, label, v in lines if i < len(v))
        bands.append(
            f'<rect class="band" x="{left:.1f}" y="{top}" width="{right - left:.1f}" height="{height}">'
            f"<title>step {steps[i]}: {_e(vals)}</title></rect>"
        )
    return bands


def _unit_for(value: float) -> tuple[str, int]:
    """The largest binary unit (name, bytes) not above ``value`` (B for < 1 KiB)."""
    name, size = _UNITS[0]
    for n, s in _UNITS:
        if value >= s:
            name, size = n, s
    return name, size


def _nice_axis(top: float, target: int = 4, integer: bool = False) -> tuple[float, float]:
    """(tick spacing, axis maximum) with about ``target`` ticks from 0 to at
    least ``top``; spacings are 1, 2, 2.5 or 5 times a power of ten."""
    if top <= 0:
        return 1.0, 1.0
    raw = top / target
    mag = 10 ** math.floor(math.log10(raw))
    tick = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        tick = max(1.0, float(math.ceil(tick)))
    return tick, math.ceil(top / tick - 1e-9) * tick


# ------------------------------------------------------------- helpers ----


def _e(value: Any) -> str:
    """``value`` as text, escaped for HTML content and quoted attributes."""
    return html.escape(str(value), quote=True)


def _where(site: dict | None, function: bool = False) -> str:
    if not site:
        return "?"
    text = f"{site.get('filename', '?')}:{site.get('line', '?')}"
    return f"{text} {site.get('function', '')}".rstrip() if function else text


def _code(line: str) -> str:
    return f'<pre class="code"><code>{_e(line)}</code></pre>' if line else '<p class="muted">(source unavailable)</p>'


def _count(x: Any) -> str:
    """A count per step: up to two decimals, trailing zeros dropped."""
    return f"{float(x):,.2f}".rstrip("0").rstrip(".")


def _inline_code(text: str) -> str:
    """Escapes ``text``, then shows `backticked` spans as <code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))
