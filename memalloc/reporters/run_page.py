"""The run page (``DIR/index.html``) from its plain data (schema
``memalloc.run_page/1``, memalloc/trace/run_page.py; sizes in bytes):
:func:`render`.

One self-contained page: inline CSS, inline SVG charts, one inline script
(the flame graph's zoom and hover), no link to anything outside; it opens
from the disk with no network. Sections, each with a stable id for tests
and tools:

- ``#summary``: the process, the peak, steps, OOMs and leaks in figures;
- ``#memory``: per step, the peak allocated and the allocated and reserved
  bytes at its end (``svg#chart-steps``, one ``polyline.series`` per line,
  legend swatches in the lines' colours);
- ``#breakdown``: the step's peak split by category over the steps, stacked
  (``svg#chart-breakdown``, a ``path.stack.c-<category>`` per category, its
  legend swatch ``span.c-<category>`` in the same colour);
- ``#flame``: an icicle graph of the live memory at the peak by Python
  stack, outermost frame on top. Each frame is a ``div.frame`` in
  ``#flame-graph`` whose width is its bytes' share of the frame in focus
  (``data-name``, ``data-file``, ``data-line``, ``data-bytes``); clicking a
  frame zooms to it (its ancestors stay above, full width; clicking one
  zooms out to it), hovering shows its bytes, line and, for the user's
  code, the line's text in ``#flame-detail``;
- ``#leaks``, ``#ooms``, ``#advice``: the leak report, the OOMs and the
  advice (memalloc/reporters/notebook.py's fragments), or what gives them.

The data itself travels with the page, for tools and tests:
``<script type="application/json" id="run-data">`` holds it whole (``<``
written as ``\\u003c``); the flame graph's script reads it from there. Every
string from the data shown in the page is escaped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from memalloc.core._format import fmt_bytes
from memalloc.reporters.notebook import advice_html, leak_report_html
from memalloc.reporters.report_html import _e, _nice_axis, _unit_for, chart, render_page

__all__ = ["CATEGORIES", "render"]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
COLOURS = {  # the breakdown's colours, as the notebook's fragments show them
    "parameters": "#0969da",
    "gradients": "#8250df",
    "optimizer_state": "#bf8700",
    "activations": "#cf222e",
    "temporaries": "#1a7f37",
    "other": "#8c959f",
}
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 760, 250, 72, 16, 14, 44
_MAX_BANDS = 300  # the breakdown chart's bands: past this many steps, one band per run of steps

_CSS = """
.chart .live { stroke:var(--accent); }
.stacked .stack { stroke:none; opacity:.85; }
.swatches { display:flex; flex-wrap:wrap; gap:6px 18px; font-size:13px; color:var(--muted); margin-top:4px; }
.swatches span::before { content:""; display:inline-block; width:12px; height:12px; border-radius:2px;
  margin-right:6px; vertical-align:-1px; background:currentcolor; }
.swatches span { color:var(--muted); }
#flame-graph { position:relative; width:100%; margin-top:8px; overflow:hidden;
  font:12px/19px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
#flame-graph .frame { position:absolute; height:19px; box-sizing:border-box; border-right:1px solid #fff;
  border-bottom:1px solid #fff; padding:0 4px; overflow:hidden; white-space:nowrap; text-overflow:ellipsis;
  cursor:pointer; color:#1f2328; }
#flame-graph .frame:hover { filter:brightness(.92); }
#flame-graph .frame.ancestor { opacity:.6; }
.frame.user, .swatches .k-user::before { background:#f2b27a; }
.frame.library, .swatches .k-library::before { background:#a8c5ea; }
.frame.other, .swatches .k-other::before { background:#d0d7de; }
.frame.root { background:#e6e9ed; }
#flame-detail { min-height:1.5em; font-size:13px; }
button.reset { font:inherit; font-size:13px; padding:2px 10px; border:1px solid var(--line); border-radius:6px;
  background:var(--card); cursor:pointer; }
""" + "".join(f".stacked .c-{c}{{fill:{v}}}.swatches .c-{c}::before{{background:{v}}}" for c, v in COLOURS.items())

# The flame graph's behaviour: lays out the frames under the focus (widths as
# shares of the focus's bytes), the focus's ancestors full width above it.
_FLAME_JS = """
(function () {
  var box = document.getElementById("flame-graph"), detail = document.getElementById("flame-detail");
  var root = JSON.parse(document.getElementById("run-data").textContent).flame.tree, total = root.bytes, ROW = 19;
  var units = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
  function size(n) {
    for (var i = 0; i < units.length; i++) {
      if (n >= units[i][1]) return (n / units[i][1]).toFixed(2) + " " + units[i][0];
    }
    return n + " B";
  }
  function index(node, parent) {
    node.parent = parent;
    node.children.forEach(function (c) { index(c, node); });
  }
  index(root, null);
  function where(n) { return n.file ? n.file + ":" + n.line : ""; }
  function describe(n) {
    return n.name + (where(n) ? "  " + where(n) : "") + "  " + size(n.bytes) + " (" + n.bytes.toLocaleString("en") +
      " bytes, " + (100 * n.bytes / total).toFixed(1) + "% of the peak)" + (n.code ? "  \u2014  " + n.code : "");
  }
  function place(n, depth, left, width, cls, focus) {
    var d = document.createElement("div");
    d.className = "frame " + n.kind + cls;
    d.style.left = 100 * left + "%";
    d.style.width = 100 * width + "%";
    d.style.top = depth * ROW + "px";
    d.dataset.name = n.name; d.dataset.file = n.file; d.dataset.line = n.line; d.dataset.bytes = n.bytes;
    d.title = describe(n);
    d.textContent = n.name + (n.file ? " " + n.file.split("/").pop() + ":" + n.line : "");
    d.addEventListener("mouseenter", function () { detail.textContent = describe(n); });
    d.addEventListener("click", function () { draw(n === focus && n.parent ? n.parent : n); });
    box.appendChild(d);
  }
  function draw(focus) {
    box.textContent = "";
    var chain = [];
    for (var a = focus.parent; a; a = a.parent) chain.unshift(a);
    chain.forEach(function (a, i) { place(a, i, 0, 1, " ancestor", focus); });
    var deepest = chain.length;
    (function lay(n, depth, left, width) {
      place(n, depth, left, width, n === focus ? " focus" : "", focus);
      deepest = Math.max(deepest, depth);
      var x = left;
      n.children.forEach(function (c) {
        var w = n.bytes ? width * c.bytes / n.bytes : 0;
        lay(c, depth + 1, x, w);
        x += w;
      });
    })(focus, chain.length, 0, 1);
    box.style.height = (deepest + 1) * ROW + "px";
    box.dataset.focus = focus.name + (focus.file ? " " + where(focus) : "");
    detail.textContent = describe(focus);
  }
  document.getElementById("flame-reset").addEventListener("click", function () { draw(root); });
  draw(root);
})();
"""


def render(data: dict[str, Any]) -> str:
    """The page for ``data`` (memalloc/trace/run_page.py's :func:`collect`)."""
    steps = data.get("steps") or []
    sections = [
        _summary(data, steps),
        _memory(steps),
        _breakdown(steps),
        _flame(data.get("flame")),
        _leaks(data.get("leaks")),
        _ooms(data.get("ooms") or [], data.get("oom_files") or []),
        _advice(data.get("advice")),
    ]
    notes = data.get("notes") or []
    if notes:
        sections.append(
            '<section class="card" id="notes"><h2>Notes</h2><ul class="notes">'
            + "".join(f"<li>{_e(n)}</li>" for n in notes)
            + "</ul></section>"
        )
    blob = json.dumps(data, separators=(",", ":"), default=str).replace("<", "\\u003c")
    sections.insert(0, f'<script type="application/json" id="run-data">{blob}</script>')
    sections.append(
        f"<footer>schema {_e(data.get('schema', '?'))} · created {_e(data.get('created', '?'))} · "
        f"{_e(data.get('folder', ''))} · rendered by memalloc.reporters.run_page</footer>"
    )
    return render_page(_title(data), sections, _CSS)


def _title(data: dict[str, Any]) -> str:
    if data.get("title"):
        return f"memalloc: {data['title']}"
    argv = (data.get("process") or {}).get("argv") or []
    script = next((a for a in argv if a.endswith(".py")), "")
    return f"memalloc run: {os.path.basename(script)}" if script else "memalloc run"


def _kv(pairs: Sequence[tuple[str, str]]) -> str:
    return '<dl class="kv">' + "".join(f"<div><dt>{_e(k)}</dt><dd>{v}</dd></div>" for k, v in pairs) + "</dl>"


def _bytes(n: float) -> str:
    return f'<span title="{int(n):,} bytes" data-bytes="{int(n)}">{_e(fmt_bytes(n))}</span>'


def _summary(data: dict[str, Any], steps: list[dict]) -> str:
    p = data.get("process") or {}
    flame = data.get("flame") or {}
    leaks = (data.get("leaks") or {}).get("leaks")
    pairs = [
        ("device", _e(f"{p.get('backend', '?')} {data.get('device', 0)}")),
        ("steps", _e(f"{steps[0]['step']}–{steps[-1]['step']}" if steps else "none ended")),
        ("peak allocated", _bytes(max([s["peak_allocated"] for s in steps] + [flame.get("total", 0)]))),
        ("reserved at the end", _bytes(steps[-1]["reserved"]) if steps else "?"),
        ("OOMs", _e(len(data.get("ooms") or []))),
        ("leaks", _e("not tracked" if leaks is None else len(leaks))),
    ]
    if p:
        rank = f" · rank {p['rank']} of {p['world_size']}" if p.get("world_size", 1) > 1 else ""
        ended = _ENDS.get(str(p.get("state")), str(p.get("state")))
        how = f"pid {p.get('pid')} on {p.get('host')}{rank} · {ended}"
        cmd = " ".join(p.get("argv") or [])
        head = f'<p class="muted">{_e(how)}</p>' + (f"<pre><code>{_e(cmd)}</code></pre>" if cmd else "")
    else:
        head = ""
    files = data.get("files") or []
    links = (
        '<p class="muted">reports in this folder: '
        + ", ".join(f'<a href="{_e(n)}">{_e(n)}</a>' for n in files)
        + "</p>"
        if files
        else ""
    )
    return f'<section class="card" id="summary"><h1>{_e(_title(data))}</h1>{head}{_kv(pairs)}{links}</section>'


_ENDS = {  # the flight file's states, in words
    "exited": "exited cleanly",
    "raised": "ended on an exception",
    "running": "no end recorded: still running, or killed",
}

_NO_STEPS = (
    "<p>No step ended: steps end at every <code>memalloc.step()</code>, or at every "
    "<code>optimizer.step()</code> while the code calls no <code>memalloc.step()</code>.</p>"
)


def _memory(steps: list[dict]) -> str:
    head = '<section class="card" id="memory"><h2>Memory per step</h2>'
    if not steps:
        return head + _NO_STEPS + "</section>"
    xs = [int(s["step"]) for s in steps]
    return (
        head
        + chart(
            "chart-steps",
            xs,
            [
                ("live", "peak allocated in the step", [s["peak_allocated"] for s in steps]),
                ("allocated", "allocated at the step's end", [s["allocated"] for s in steps]),
                ("reserved", "reserved at the step's end", [s["reserved"] for s in steps]),
            ],
        )
        + "</section>"
    )


def _buckets(steps: list[dict], most: int) -> list[tuple[float, float, dict]]:
    """(left, right, row) bands over the steps: one per step, or, for more
    than ``most`` steps, one per run of consecutive steps showing the run's
    highest peak (its row), so the chart stays small at any length."""
    size = max(1, -(-len(steps) // most))
    out = []
    for k in range(0, len(steps), size):
        run = steps[k : k + size]
        out.append((run[0]["step"] - 0.5, run[-1]["step"] + 0.5, max(run, key=lambda r: r["peak_allocated"])))
    return out


def _breakdown(steps: list[dict]) -> str:
    """The peak's split by category per step, stacked (parameters at the
    bottom): a band per step (per run of steps past :data:`_MAX_BANDS`)."""
    head = (
        '<section class="card" id="breakdown"><h2>What the peak held, per step</h2>'
        '<p class="muted">the allocated bytes at each step\'s peak by category '
        "(memalloc.memory_breakdown)</p>"
    )
    if not steps:
        return head + _NO_STEPS + "</section>"
    bands = _buckets(steps, _MAX_BANDS)
    totals = [sum(r["split"].get(c, 0) for c in CATEGORIES) for _, _, r in bands]
    unit, scale = _unit_for(max(totals + [0]))
    tick, ymax = _nice_axis(max(totals + [0]) / scale)
    x0, x1 = bands[0][0], bands[-1][1]
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(s: float) -> float:
        return _LEFT + (s - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return _TOP + ph - v / scale / ymax * ph

    out = [f'<svg class="chart stacked" id="chart-breakdown" viewBox="0 0 {_W} {_H}" role="img" data-unit="{unit}">']
    for k in range(int(round(ymax / tick)) + 1):
        y = py(k * tick * scale)
        out.append(
            f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{k * tick:g}</text>'
        )
    base = [0.0] * len(bands)
    for c in CATEGORIES:
        top = [b + r["split"].get(c, 0) for b, (_, _, r) in zip(base, bands)]
        if any(t > b for t, b in zip(top, base)):
            # one path per category: along the bands' tops, then back along their bottoms
            edge = [f"{px(lo):.1f},{py(t):.1f} {px(hi):.1f},{py(t):.1f}" for (lo, hi, _), t in zip(bands, top)]
            back = [
                f"{px(hi):.1f},{py(b):.1f} {px(lo):.1f},{py(b):.1f}" for (lo, hi, _), b in zip(bands[::-1], base[::-1])
            ]
            out.append(f'<path class="stack c-{c}" data-category="{c}" d="M{" L".join(edge + back)} Z"/>')
        base = top
    for lo, hi, r in bands:  # hover: the band's step and split
        split = "; ".join(f"{c} {fmt_bytes(r['split'].get(c, 0))}" for c in CATEGORIES)
        out.append(
            f'<rect class="band" x="{px(lo):.1f}" y="{_TOP}" width="{px(hi) - px(lo):.1f}" height="{ph}">'
            f"<title>step {r['step']}: {_e(split)}</title></rect>"
        )
    out.append(
        f'<line class="axis" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{_TOP + ph}" y2="{_TOP + ph}"/>'
        f'<text class="axis-title" x="{_LEFT + pw / 2:.0f}" y="{_H - 6}" text-anchor="middle">step '
        f"{steps[0]['step']}–{steps[-1]['step']}</text>"
        f'<text class="axis-title" transform="translate(14 {_TOP + ph / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">bytes ({unit})</text></svg>'
    )
    legend = "".join(f'<span class="c-{c}">{_e(c.replace("_", " "))}</span>' for c in CATEGORIES)
    return head + "".join(out) + f'<div class="swatches">{legend}</div></section>'


def _flame(flame: dict[str, Any] | None) -> str:
    head = '<section class="card" id="flame"><h2>Live memory at the peak, by stack</h2>'
    if not flame:
        return (
            head + "<p>No allocation was recorded with its stack (the flight recorder was off, or nothing was "
            "allocated).</p></section>"
        )
    when = f" (step {flame['step']})" if flame.get("step") is not None else ""
    return (
        head + f'<p class="muted">{_bytes(flame["total"])} live at the peak{_e(when)}, outermost frame on top; '
        "a frame's width is its bytes. Click a frame to zoom in, an upper frame to zoom out; hover for "
        'bytes and line. <button class="reset" id="flame-reset" type="button">reset zoom</button></p>'
        '<div class="swatches"><span class="k-user">your code</span><span class="k-library">libraries '
        '(torch, the standard library, ...)</span><span class="k-other">smaller stacks, merged</span></div>'
        '<div id="flame-detail" class="muted"></div><div id="flame-graph"></div>'
        f"<script>{_FLAME_JS}</script></section>"
    )


def _leaks(report: dict[str, Any] | None) -> str:
    head = '<section class="card" id="leaks"><h2>Leaks</h2>'
    if report is None:
        return (
            head + "<p>Leaks were not tracked: <code>python -m memalloc run --leaks</code> (or the framework "
            "callbacks) track them.</p></section>"
        )
    return head + leak_report_html(report) + "</section>"


def _ooms(ooms: list[dict], files: list[dict]) -> str:
    head = '<section class="card" id="ooms"><h2>Out-of-memory errors</h2>'
    if not ooms and not files:
        return head + '<p class="good">None.</p></section>'
    rows = (
        "".join(f"<tr><td>{_e(o['step'])}</td><td class='num'>{_bytes(o['bytes'])}</td></tr>" for o in ooms)
        or "<tr><td colspan='2'>(not in the ring's records)</td></tr>"
    )
    listed = "".join(f'<li><a href="{_e(f["file"])}">{_e(f["file"])}</a>: {_e(f["first_line"])}</li>' for f in files)
    return (
        head
        + f"<table><thead><tr><th>step</th><th class='num'>bytes asked</th></tr></thead><tbody>{rows}</tbody></table>"
        + (f"<p>Reports (what held the memory):</p><ul>{listed}</ul>" if listed else "")
        + "</section>"
    )


def _advice(advice: dict[str, Any] | None) -> str:
    head = '<section class="card" id="advice"><h2>Advice</h2>'
    if advice is None:
        return (
            head + "<p>No advice asked: <code>python -m memalloc run --advise</code> says which strategies would "
            "save memory here.</p></section>"
        )
    items = advice.get("advice") or []
    if not items:
        return head + "<p>Nothing to advise: no strategy would save memory here.</p></section>"
    return head + "".join(advice_html(a) for a in items) + "</section>"
