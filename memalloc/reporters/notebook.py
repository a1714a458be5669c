"""HTML for Jupyter: what a notebook shows for the objects users get back
(``_repr_html_`` of the leak report, the breakdown, the batch plan, the step
tracker and the advisor's advice), rendered from their plain data (the dicts
of their ``to_dict()``; sizes in bytes). Nothing here reads the allocator.

Each function returns one HTML fragment: a ``<div class="memalloc-nb">``
with its own ``<style>`` whose rules all sit under that class (the
notebook's page keeps its look), no script, no link to anything outside.
Every string from the data is escaped. A size is shown in binary units
with its exact bytes in a ``title`` attribute (``data-bytes`` too), so
hovering gives the exact figure and tests can read it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from memalloc.core._format import fmt_bytes
from memalloc.reporters.report_html import _e, _where, chart

__all__ = ["advice_html", "breakdown_html", "leak_report_html", "plan_html", "steps_html"]

_CSS = """
.memalloc-nb { font:14px/1.45 -apple-system, "Segoe UI", Roboto, Arial, sans-serif; color:#1f2328;
  max-width:900px; }
.memalloc-nb h4 { font-size:15px; margin:4px 0 6px; }
.memalloc-nb .muted { color:#59636e; }
.memalloc-nb .bad { color:#cf222e; } .memalloc-nb .good { color:#1a7f37; }
.memalloc-nb table { border-collapse:collapse; margin:6px 0; }
.memalloc-nb th, .memalloc-nb td { text-align:left; padding:3px 10px; border-bottom:1px solid #d1d9e0;
  vertical-align:top; }
.memalloc-nb th { color:#59636e; font-weight:600; font-size:12px; }
.memalloc-nb td.num, .memalloc-nb th.num { text-align:right; white-space:nowrap;
  font-variant-numeric:tabular-nums; }
.memalloc-nb tr.total td { font-weight:600; border-top:2px solid #d1d9e0; }
.memalloc-nb code, .memalloc-nb pre { font-family:ui-monospace, Menlo, Consolas, monospace; font-size:12px; }
.memalloc-nb pre { margin:2px 0; white-space:pre-wrap; word-break:break-all; }
.memalloc-nb .bytes { border-bottom:1px dotted #8c959f; }
.memalloc-nb .bar { display:flex; height:12px; width:100%; max-width:600px; margin:6px 0;
  border-radius:3px; overflow:hidden; background:#eaeef2; }
.memalloc-nb .bar span { display:block; height:100%; }
.memalloc-nb .swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:6px; }
.memalloc-nb .c-parameters { background:#0969da; } .memalloc-nb .c-gradients { background:#8250df; }
.memalloc-nb .c-optimizer_state { background:#bf8700; } .memalloc-nb .c-activations { background:#cf222e; }
.memalloc-nb .c-temporaries { background:#1a7f37; } .memalloc-nb .c-other { background:#8c959f; }
.memalloc-nb .chart { width:100%; max-width:760px; height:auto; display:block; }
.memalloc-nb .chart text { font-size:11px; fill:#59636e; }
.memalloc-nb .chart .axis-title { font-size:12px; fill:#1f2328; }
.memalloc-nb .chart .grid { stroke:#eaeef2; } .memalloc-nb .chart .axis { stroke:#8c959f; }
.memalloc-nb .chart .series { fill:none; stroke-width:2; stroke-linejoin:round; }
.memalloc-nb .chart .allocated { stroke:#0969da; }
.memalloc-nb .chart .reserved { stroke:#8c959f; stroke-dasharray:5 3; }
.memalloc-nb .chart .live { stroke:#cf222e; } .memalloc-nb .chart .area { stroke:none; opacity:.12; }
.memalloc-nb .chart .area.allocated { fill:#0969da; } .memalloc-nb .chart .area.live { fill:#cf222e; }
.memalloc-nb .chart .band { fill:#1f2328; opacity:0; } .memalloc-nb .chart .band:hover { opacity:.07; }
.memalloc-nb .legend { display:flex; gap:18px; font-size:12px; color:#59636e; }
.memalloc-nb .legend span::before { content:""; display:inline-block; width:18px; height:0; margin-right:6px;
  vertical-align:middle; border-top:2px solid; }
.memalloc-nb .legend .allocated::before { border-color:#0969da; }
.memalloc-nb .legend .reserved::before { border-color:#8c959f; border-top-style:dashed; }
.memalloc-nb .legend .live::before { border-color:#cf222e; }
"""


_ids = itertools.count()  # a fragment's chart ids stay unique in a notebook's page


def _chart_id(kind: str) -> str:
    return f"memalloc-nb-{kind}-{next(_ids)}"


def _frame(kind: str, title: str, body: Sequence[str]) -> str:
    """The fragment: a scoped style, a heading, the parts."""
    return (
        f'<div class="memalloc-nb memalloc-{kind}"><style>{_CSS}</style><h4>{_e(title)}</h4>' + "".join(body) + "</div>"
    )


def _bytes(n: float, suffix: str = "") -> str:
    """``n`` bytes in binary units, the exact bytes in its title."""
    exact = f"{int(n):,}" if float(n).is_integer() else f"{float(n):,.1f}"
    return (
        f'<span class="bytes" title="{exact} bytes{_e(suffix)}" data-bytes="{_e(n)}">'
        f"{_e(fmt_bytes(n))}{_e(suffix)}</span>"
    )


def _table(
    head: Sequence[str],
    rows: Sequence[Sequence[str]],
    num: Sequence[int] = (),
    cls: str = "",
    total: Sequence[str] = (),
) -> str:
    """A table; ``head`` is escaped here, the cells (and the ``total`` row,
    when given) are HTML already; columns in ``num`` are right-aligned."""

    def row(cells: Sequence[str], tag: str = "td", attrs: str = "") -> str:
        return (
            f"<tr{attrs}>"
            + "".join(
                f'<{tag} class="num">{c}</{tag}>' if i in num else f"<{tag}>{c}</{tag}>" for i, c in enumerate(cells)
            )
            + "</tr>"
        )

    foot = row(total, attrs=' class="total"') if total else ""
    body = "".join(row(r) for r in rows)
    return f'<table class="{cls}"><thead>{row([_e(h) for h in head], "th")}</thead><tbody>{body}{foot}</tbody></table>'


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else ""


# ---------------------------------------------------------- leak report ----


def leak_report_html(report: dict) -> str:
    """A leak report (``LeakReport.to_dict()``, schema
    ``memalloc.leak_report/1``): the figures, each leak's line with its
    growth per step, what it retains and the hint, and the allocated and
    reserved bytes over the steps. ``to_html()`` writes the full page."""
    steps = [int(s) for s in report.get("steps", [])]
    leaks = sorted(report.get("leaks", []), key=lambda k: -float(k.get("bytes_per_step", 0)))
    total = sum(float(k.get("bytes_per_step", 0)) for k in leaks)
    span = f" (steps {steps[0]}–{steps[-1]})" if steps else ""
    head = (
        f"<p>{_e(report.get('backend', '?'))} backend, device {_e(report.get('device', '?'))}: "
        f"{len(steps)} steps sampled{_e(span)}"
        + (f"; boundaries: {_e(report['boundaries'])}" if report.get("boundaries") else "")
        + "</p>"
    )
    if leaks:
        verdict = (
            f'<p class="bad leak-summary"><b>{len(leaks)} leak{"s" * (len(leaks) != 1)}</b>, '
            f"{_bytes(total, '/step')} in all</p>"
        )
    else:
        judged = len(steps) >= int(report.get("warmup_steps", 0)) + 4
        verdict = f'<p class="good leak-summary">{"no leaks found" if judged else "not enough steps to judge"}</p>'
    parts = [head, verdict]
    if leaks:
        rows = []
        for i, k in enumerate(leaks, 1):
            site = k.get("site") or {}
            what = f'<code class="site">{_e(_where(site, True))}</code>'
            if k.get("code"):
                what += f'<pre class="code">{_e(k["code"])}</pre>'
            holder = k.get("holder")
            if holder:
                what += (
                    f'<div class="muted">held by {_e(holder.get("kind", "?"))} '
                    f"<code>{_e(holder.get('name', ''))}</code></div>"
                )
            alloc = k.get("alloc_site") or {}
            if alloc and (alloc.get("filename"), alloc.get("line")) != (site.get("filename"), site.get("line")):
                what += f'<div class="muted">allocated at <code>{_e(_where(alloc, True))}</code></div>'
            if k.get("hint"):
                what += f'<div class="muted">hint: {_e(k["hint"])}</div>'
            rows.append(
                [
                    str(i),
                    what,
                    _bytes(float(k.get("bytes_per_step", 0)), "/step"),
                    _e(f"{float(k.get('tensors_per_step', 0)):.1f}"),
                    f"{_bytes(k.get('retained_bytes', 0))} in {_e(k.get('retained_tensors', 0))}",
                    _e(k.get("first_step", "?")),
                    _e(k.get("cause", "")),
                ]
            )
        parts.append(
            _table(
                ["#", "site", "growth", "tensors/step", "retained", "since step", "cause"],
                rows,
                num=(0, 2, 3, 4, 5),
                cls="leaks",
            )
        )
    if steps:
        parts.append(
            chart(
                _chart_id("memory"),
                steps,
                [
                    ("allocated", "allocated", report.get("allocated", [])),
                    ("reserved", "reserved", report.get("reserved", [])),
                ],
            )
        )
    notes = report.get("notes") or []
    if notes:
        parts.append('<ul class="muted">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    return _frame("leak-report", "memalloc leak report", parts)


# ------------------------------------------------------------ breakdown ----


def breakdown_html(b: dict, categories: Sequence[str]) -> str:
    """A breakdown (``MemoryBreakdown.to_dict()``): one row per category of
    ``categories``, bytes and share now and at the peak, the totals, and a
    bar of the peak's split."""
    now, peak = b["now"], b["peak"]
    now_total, peak_total = sum(now.values()), sum(peak.values())
    where = f"step {b['peak_step']}'s peak" if b.get("peak_step") is not None else "peak so far"
    rows = [
        [
            f'<span class="swatch c-{_e(c)}"></span>{_e(c)}',
            _bytes(now[c]),
            _share(now[c], now_total),
            _bytes(peak[c]),
            _share(peak[c], peak_total),
        ]
        for c in categories
    ]
    bar = "".join(
        f'<span class="c-{_e(c)}" style="width:{100 * peak[c] / peak_total:.3f}%" '
        f'title="{_e(c)}: {_e(fmt_bytes(peak[c]))} ({peak[c]:,} bytes)"></span>'
        for c in categories
        if peak_total and peak[c]
    )
    parts = [
        f'<p class="muted">device {_e(b["device"])}, phase {_e(b["phase"])}</p>',
        _table(
            ["category", "now", "", where, ""],
            rows,
            num=(1, 2, 3, 4),
            cls="breakdown",
            total=["total", _bytes(now_total), "", _bytes(peak_total), ""],
        ),
        f'<div class="bar" title="{_e(where)}">{bar}</div>',
    ]
    if b.get("now_provisional") or b.get("peak_provisional"):
        parts.append(
            f'<p class="muted">provisional: {_bytes(b["now_provisional"])} now, '
            f"{_bytes(b['peak_provisional'])} at the peak (decided when the step goes on)</p>"
        )
    return _frame("breakdown", "memalloc memory by category", parts)


# ----------------------------------------------------------------- plan ----


def plan_html(p: dict) -> str:
    """A batch plan (``BatchPlan.to_dict()``): the batch, the budget, the
    predicted peaks, fixed and per-sample bytes, the probes as measured and
    every batch the search replayed."""
    capped = " (the most asked for: max_batch)" if p.get("capped") else ""
    limit = "no limit (nothing grows with the batch)" if p.get("limit") is None else _e(p["limit"])
    facts = [
        ("largest batch that fits", f"<b>{_e(p['batch'])}</b>{_e(capped)}"),
        ("budget", _bytes(p["budget"])),
        ("predicted peak reserved", _bytes(p["peak_reserved"])),
        ("predicted peak allocated", _bytes(p["peak_allocated"])),
        ("fixed (not growing with the batch)", _bytes(p["fixed_bytes"])),
        ("per sample", _bytes(p["per_sample_bytes"])),
        ("a perfect allocator would fit", limit),
    ]
    parts = [_table(["", ""], [[_e(k), v] for k, v in facts], num=(1,), cls="plan")]
    if not p.get("steady", True):
        parts.append(
            f'<p class="bad">not steady: the replay ran {_e(p.get("repeats", 0))} more steps without coming '
            "back to a state it had been in; the plan is for that many steps</p>"
        )
    parts.append(
        '<p class="muted">probes (measured)</p>'
        + _table(
            ["batch", "peak allocated", "peak reserved"],
            [[_e(b), _bytes(a), _bytes(r)] for b, a, r in p.get("probes", [])],
            num=(0, 1, 2),
            cls="probes",
        )
    )
    preds = sorted(p.get("predictions", []), key=lambda x: x["batch"])
    if preds:
        parts.append(
            '<p class="muted">batches replayed</p>'
            + _table(
                ["batch", "fits", "peak allocated", "peak reserved"],
                [
                    [
                        _e(x["batch"]),
                        '<span class="good">yes</span>' if x["fits"] else '<span class="bad">no</span>',
                        _bytes(x["peak_allocated"]),
                        _bytes(x["peak_reserved"]),
                    ]
                    for x in preds
                ],
                num=(0, 2, 3),
                cls="predictions",
            )
        )
    return _frame("plan", "memalloc batch plan", parts)


# ---------------------------------------------------------------- steps ----


def steps_html(d: dict, categories: Sequence[str]) -> str:
    """A step tracker's rows (``StepTracker.to_dict()``): the figures over
    the steps (allocated at each boundary, the highest peaks, OOMs), a chart
    and the last rows with the peak's split."""
    rows: list[dict[str, Any]] = d.get("rows", [])
    parts = [
        f'<p class="muted">device {_e(d.get("device"))} ({_e(d.get("backend"))} backend); '
        f"{len(rows)} steps; boundaries: {_e(d.get('boundaries', ''))}</p>"
    ]
    if not rows:
        parts.append("<p>no steps recorded yet</p>")
        return _frame("steps", "memalloc step tracker", parts)
    first, last = rows[0], rows[-1]
    top = max(rows, key=lambda r: r["peak_allocated"])
    growth = (last["allocated"] - first["allocated"]) / (len(rows) - 1) if len(rows) > 1 else 0
    facts = [
        ("steps", _e(f"{first['step']}–{last['step']}")),
        ("allocated at the last step", _bytes(last["allocated"])),
        ("allocated growth per step", _bytes(growth, "/step")),
        (f"highest peak allocated (step {top['step']})", _bytes(top["peak_allocated"])),
        ("highest peak reserved", _bytes(max(r["peak_reserved"] for r in rows))),
        ("OOMs", _e(sum(r["num_ooms"] for r in rows))),
    ]
    parts.append(_table(["", ""], [[_e(k), v] for k, v in facts], num=(1,), cls="steps-summary"))
    steps = [int(r["step"]) for r in rows]
    parts.append(
        chart(
            _chart_id("steps"),
            steps,
            [
                ("live", "peak allocated in step", [r["peak_allocated"] for r in rows]),
                ("allocated", "allocated at step end", [r["allocated"] for r in rows]),
                ("reserved", "reserved at step end", [r["reserved"] for r in rows]),
            ],
        )
    )
    shown = rows[-10:]
    parts.append(
        f'<p class="muted">the last {len(shown)} steps</p>'
        + _table(
            ["step", "allocated", "peak allocated", "peak reserved", *categories],
            [
                [
                    _e(r["step"]),
                    _bytes(r["allocated"]),
                    _bytes(r["peak_allocated"]),
                    _bytes(r["peak_reserved"]),
                    *(_bytes(r.get(f"peak_{c}", 0)) for c in categories),
                ]
                for r in shown
            ],
            num=tuple(range(4 + len(categories))),
            cls="steps",
        )
    )
    return _frame("steps", "memalloc step tracker", parts)


# --------------------------------------------------------------- advice ----


def advice_html(a: dict) -> str:
    """One piece of advice (``Advice.to_dict()``: strategy, saves in bytes,
    why, cost)."""
    return _frame(
        "advice",
        f"memalloc advice: {a['strategy']}",
        [
            f"<p>saves ~{_bytes(a['saves'])}</p>",
            f"<p><b>why</b>: {_e(a['why'])}</p>",
            f"<p><b>{'hint' if a['strategy'] == 'fix_leak' else 'cost'}</b>: {_e(a['cost'])}</p>",
        ],
    )
