"""Two runs compared call site by call site (memalloc/trace/diff.py's plain
data, schema ``memalloc.diff/1``) as text and as a self-contained HTML page
(no script, no link outside it). Sizes in the data are bytes; nothing here
reads a file.

Stable hooks of the page for tests and tools: ``id="runs"``, ``id="peak"``
and ``id="per-step"`` (its table, or a note when there is none), each
table row ``<tr class="site" data-key=... data-a=... data-b=...
data-delta=...>`` (bytes; per step: bytes per step), its cells ``class``
``site``, ``a``, ``b``, ``delta``, ``category``, ``code``.
"""

from __future__ import annotations

from collections.abc import Sequence

from memalloc.core._format import fmt_bytes
from memalloc.reporters.report_html import _e, render_page

__all__ = ["to_html", "to_text"]

_CSS = """
td.delta.more { color:var(--accent); font-weight:600; } td.delta.less { color:var(--green); font-weight:600; }
td.code code { white-space:pre-wrap; word-break:break-all; }
"""


def _signed(n: float, per_step: bool = False) -> str:
    text = ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))
    return text + "/step" if per_step else text


def _where(site: dict) -> str:
    return f"{site['filename']}:{site['line']}" + (f" in {site['function']}" if site.get("function") else "")


def _table_text(rows: Sequence[dict], per_step: bool) -> list[str]:
    unit = "/step" if per_step else ""
    if not rows:
        return []
    out = [f"  {'delta':>14}  {'A' + unit:>13}  {'B' + unit:>13}  {'category':<16}site"]
    for r in rows:
        out.append(
            f"  {_signed(r['delta'], per_step):>14}  {fmt_bytes(r['a']):>13}  {fmt_bytes(r['b']):>13}  "
            f"{r['category'] or '-':<16}{_where(r['site'])}"
        )
        if r["code"]:
            out.append(f"  {'':>14}  {'':>13}  {'':>13}  {'':<16}    {r['code']}")
    return out


def to_text(d: dict) -> str:
    """The comparison as text: the two runs, the lines whose bytes at the
    peak changed, largest change first, and those whose growth per step
    changed."""
    a, b = d["runs"]
    lines = [
        f"memalloc diff: A {a['path']} ({a['kind']}, device {a['device']}) against B {b['path']} "
        f"({b['kind']}, device {b['device']})",
        f"peak: A {fmt_bytes(a['peak'])}, B {fmt_bytes(b['peak'])} ({_signed(b['peak'] - a['peak'])}); "
        f"A at {a['moment']}, B at {b['moment']}",
        "",
        f"at the peak: {len(d['peak'])} line(s) changed"
        + (f" by more than {fmt_bytes(d['min_bytes'])}" if d["min_bytes"] else ""),
    ]
    lines += _table_text(d["peak"], False)
    if d["per_step"] is not None:
        lines += ["", f"per step (growth over the finished steps): {len(d['per_step'])} line(s) changed"]
        lines += _table_text(d["per_step"], True)
    lines += [f"note: {n}" for n in d["notes"]]
    return "\n".join(lines)


def _table(rows: Sequence[dict], per_step: bool, table_id: str) -> str:
    unit = "/step" if per_step else ""
    head = (
        f'<table id="{table_id}-table"><thead><tr><th>site</th><th class="num">A{unit}</th>'
        f'<th class="num">B{unit}</th><th class="num">delta{unit}</th><th>category</th><th>line</th></tr></thead>'
        "<tbody>"
    )
    body = []
    for r in rows:
        cls = "more" if r["delta"] > 0 else "less"
        body.append(
            f'<tr class="site" data-key="{_e(r["key"])}" data-a="{r["a"]!r}" data-b="{r["b"]!r}" '
            f'data-delta="{r["delta"]!r}">'
            f'<td class="site"><code>{_e(_where(r["site"]))}</code></td>'
            f'<td class="num a">{_e(fmt_bytes(r["a"]))}</td><td class="num b">{_e(fmt_bytes(r["b"]))}</td>'
            f'<td class="num delta {cls}">{_e(_signed(r["delta"], per_step))}</td>'
            f'<td class="category">{_e(r["category"] or "-")}</td>'
            f'<td class="code"><code>{_e(r["code"])}</code></td></tr>'
        )
    return head + "".join(body) + "</tbody></table>"


def to_html(d: dict) -> str:
    """The comparison as a complete self-contained HTML page (hooks in the
    module's docstring)."""
    a, b = d["runs"]
    runs = "".join(
        f"<div><dt>{name}: {_e(r['kind'])}, device {r['device']}</dt><dd>peak {_e(fmt_bytes(r['peak']))}</dd>"
        f'<dd class="muted"><code>{_e(r["path"])}</code><br>at {_e(r["moment"])}</dd></div>'
        for name, r in (("A", a), ("B", b))
    )
    sections = [
        f"<h1>memalloc diff</h1><p class=\"muted\">B's peak is {_e(_signed(b['peak'] - a['peak']))} against A's</p>",
        f'<section class="card" id="runs"><dl class="kv">{runs}</dl></section>',
        '<section class="card" id="peak"><h2>At the peak: bytes by line</h2>'
        + (_table(d["peak"], False, "peak") if d["peak"] else '<p class="muted">no line changed</p>')
        + "</section>",
    ]
    if d["per_step"] is not None:
        sections.append(
            '<section class="card" id="per-step"><h2>Per step: growth by line</h2>'
            + (_table(d["per_step"], True, "per-step") if d["per_step"] else '<p class="muted">no line changed</p>')
            + "</section>"
        )
    else:
        sections.append('<section class="card" id="per-step"><p class="muted">no per-step comparison</p></section>')
    if d["notes"]:
        sections.append(
            '<section class="card"><ul class="notes">'
            + "".join(f"<li>{_e(n)}</li>" for n in d["notes"])
            + "</ul></section>"
        )
    return render_page(f"memalloc diff: {a['path']} against {b['path']}", sections, _CSS)
