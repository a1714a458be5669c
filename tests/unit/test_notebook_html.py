"""What a notebook shows (``_repr_html_``, memalloc/reporters/notebook.py)
and what ``repr()`` says for the objects users get back: the leak report
(and ``leak_check``), the breakdown, the batch plan, the step tracker and
the advisor's advice. Each is built from a real run on a host-backend
allocator the test owns; the HTML must carry the figures the test computes
(in human units, the exact bytes in a title), parse with balanced tags,
need nothing outside itself and escape what it shows (a path or a line with
``<`` and ``&``). tests/integration/test_notebook.py runs them in Jupyter.
"""

from __future__ import annotations

import importlib.util
from html.parser import HTMLParser

import torch

import memalloc
from memalloc.core._format import fmt_bytes
from memalloc.features.advisor import Advice
from memalloc.features.breakdown import CATEGORIES, memory_breakdown

KiB, MiB = 1 << 10, 1 << 20
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
SVG_EMPTY = {"line", "polyline", "path", "rect"}  # written <line .../>: self-closing


class Checked(HTMLParser):
    """Parses a fragment, failing on an unbalanced or stray closing tag;
    keeps the text, the ``title`` attributes, the tags and every attribute."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.titles: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.feed(html)
        self.close()
        assert not self.stack, f"tags left open: {self.stack}"

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        self.titles.extend(v for k, v in attrs if k == "title" and v is not None)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        self.titles.extend(v for k, v in attrs if k == "title" and v is not None)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:] or 'nothing'}"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def check_fragment(html: str) -> Checked:
    """Balanced, scoped, self-contained: no script, nothing fetched."""
    page = Checked(html)
    assert page.tags[0] == "div" and "script" not in page.tags
    assert not any(k in ("src", "href") and v and not v.startswith("#") for k, v in page.attrs), page.attrs
    assert "http://" not in html and "https://" not in html and "@import" not in html
    return page


def exact(n: int, suffix: str = "") -> str:
    """The title a size carries."""
    return f"{n:,} bytes{suffix}"


# A module in a folder whose name needs escaping, holding its leak in a global (the holder).
LEAKY = """import torch
kept = []
def leaky(a, n):
    for _ in range(n):
        scratch = torch.from_dlpack(a.host_buffer(64 * 1024))
        kept.append(torch.from_dlpack(a.host_buffer(4096)))  # if a < b & c: "kept"
        del scratch
        memalloc_step()
"""
LEAK_LINE = 6


def test_a_leak_report_shows_the_leak_its_line_and_escapes_its_path(host_allocator, tmp_path):
    a = host_allocator
    folder = tmp_path / 'odd <x>&amp; "dir"'
    folder.mkdir()
    src = folder / "leaky_nb.py"
    src.write_text(LEAKY)
    spec = importlib.util.spec_from_file_location("leaky_nb", src)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.memalloc_step = memalloc.step
    with memalloc.leak_check(allocator=a, warmup_steps=1) as check:
        mod.leaky(a, 10)
    assert len(check.leaks) == 1, check.to_text()
    leak = check.leaks[0]
    assert leak.bytes_per_step == 4 * KiB
    assert (leak.alloc_site["filename"], leak.alloc_site["line"]) == (str(src), LEAK_LINE)
    for html in (check.report._repr_html_(), check._repr_html_()):
        page = check_fragment(html)
        text = page.all_text
        assert f"{src}:{LEAK_LINE} leaky" in text and 'if a < b & c: "kept"' in text  # shown as written, once unescaped
        assert "<x>" not in html and "a < b" not in html and str(folder) not in html  # ... and escaped in the HTML
        assert exact(4096, "/step") in page.titles and f"{fmt_bytes(4096)}/step" in text
        assert "1 leak" in text and f"{leak.retained_tensors}" in text and exact(leak.retained_bytes) in page.titles
    r = repr(check.report)
    assert r.startswith("<memalloc LeakReport host device 0, 10 steps: 1 leak, +4.00 KiB/step")
    assert r.endswith(f"leaky_nb.py:{LEAK_LINE})>")
    assert repr(check).startswith("<memalloc.leak_check: memalloc LeakReport") and "0x" not in repr(check)
    assert repr(leak) == (
        f"<memalloc Leak at {src}:{LEAK_LINE}: +4.00 KiB/step, {fmt_bytes(leak.retained_bytes)} retained in "
        f"{leak.retained_tensors} tensors>"
    )
    assert leak.site == leak.alloc_site and leak.holder is not None and leak.holder["name"] == "kept"
    mod.kept.clear()


def test_a_report_without_leaks_says_so_and_a_check_not_ended_says_that(host_allocator):
    a = host_allocator
    check = memalloc.leak_check(allocator=a)
    assert "not started" in repr(check) and "when the <code>with</code> block ends" in check._repr_html_()
    with check:
        assert "running" in repr(check)
        for _ in range(8):
            t = torch.from_dlpack(a.host_buffer(8 * KiB))
            del t
            memalloc.step()
    page = check_fragment(check._repr_html_())
    assert "no leaks found" in page.all_text and check.leaks == []
    assert repr(check.report).endswith(": no leaks>")


def test_the_breakdown_shows_every_category_and_they_sum_to_the_total(host_allocator):
    a = host_allocator
    live = []

    def alloc(size: int) -> int:
        p = a.malloc(size)
        live.append(p)
        return p

    a.mark(alloc(4 * MiB), "parameters")
    a.enter_phase("forward")
    x = alloc(2 * MiB)
    a.free(a.malloc(5 * MiB))  # a temporary
    a.enter_phase("backward")
    alloc(3 * MiB)  # a gradient
    a.free(a.malloc(6 * MiB))  # the step's peak
    a.free(x)
    live.remove(x)
    a.enter_phase("optimizer")
    alloc(1 * MiB)  # optimizer state
    a.enter_phase("forward")
    a.end_step()
    b = memory_breakdown(allocator=a)
    assert sum(b.peak.values()) == b.peak_total and b.peak_step is not None
    page = check_fragment(b._repr_html_())
    rows = {}  # category -> the titles of its row (now, peak)
    titles = iter(page.titles)
    for c in CATEGORIES:  # the table's rows come in CATEGORIES' order, two sizes each
        rows[c] = (next(titles), next(titles))
    total_now, total_peak = next(titles), next(titles)
    for c in CATEGORIES:
        assert rows[c] == (exact(b.now[c]), exact(b.peak[c])), c
        assert c in page.all_text
    assert sum(int(t.split()[0].replace(",", "")) for _, t in rows.values()) == b.peak_total
    assert (total_now, total_peak) == (exact(b.now_total), exact(b.peak_total))
    assert b.peak["temporaries"] > 0 and b.peak["gradients"] > 0 and b.peak["parameters"] > 0
    assert f"step {b.peak_step}'s peak" in page.all_text
    assert repr(b) == (
        f"<memalloc MemoryBreakdown device 0: {fmt_bytes(b.now_total)} allocated now, {fmt_bytes(b.peak_total)} "
        f"at step {b.peak_step}'s peak (largest: {b.largest()} {fmt_bytes(b.peak[b.largest()])})>"
    )
    for p in live:
        a.free(p)


def test_a_batch_plan_shows_the_batch_the_budget_and_the_probes(host_allocator):
    a = host_allocator

    def step(batch: int) -> None:
        x = torch.from_dlpack(a.host_buffer(batch * 64 * KiB))
        y = torch.from_dlpack(a.host_buffer(batch * 32 * KiB))
        del x, y

    plan = memalloc.largest_batch(step, budget=16 * MiB, allocator=a, probes=(2, 4))
    assert plan.batch > 4
    page = check_fragment(plan._repr_html_())
    text = page.all_text
    assert str(plan.batch) in text and exact(16 * MiB) in page.titles and fmt_bytes(16 * MiB) in text
    for title in (exact(plan.peak_reserved), exact(plan.peak_allocated), exact(plan.per_sample_bytes)):
        assert title in page.titles
    for _batch, allocated, reserved in plan.probes:
        assert exact(allocated) in page.titles and exact(reserved) in page.titles
    assert repr(plan).startswith(f"<memalloc BatchPlan: batch {plan.batch} fits 16.00 MiB; predicted peak reserved ")


def test_a_step_tracker_shows_its_figures_and_a_chart(host_allocator):
    a = host_allocator
    kept = []
    tr = memalloc.StepTracker(allocator=a)
    assert "0 rows" in repr(tr) and "no steps recorded yet" in check_fragment(tr._repr_html_()).all_text
    with tr:
        for _ in range(5):
            kept.append(torch.from_dlpack(a.host_buffer(1 * MiB)))
            tmp = torch.from_dlpack(a.host_buffer(3 * MiB))
            del tmp
            tr.record_row()
    rows = tr.rows
    page = check_fragment(tr._repr_html_())
    top = max(r["peak_allocated"] for r in rows)
    assert exact(rows[-1]["allocated"]) in page.titles and exact(top) in page.titles
    growth = (rows[-1]["allocated"] - rows[0]["allocated"]) // 4
    assert exact(growth, "/step") in page.titles
    assert "svg" in page.tags and "polyline" in page.tags
    assert f"{rows[0]['step']}–{rows[-1]['step']}" in page.all_text
    r = repr(tr)
    assert "5 rows" in r and f"highest peak allocated {fmt_bytes(top)}" in r and "stopped" in r
    del kept


def test_advice_shows_what_it_saves_and_escapes_its_text():
    a = Advice("checkpoint", 3 * MiB, "blocks <Block> & co keep 12 MiB", "one more forward")
    page = check_fragment(a._repr_html_())
    assert exact(3 * MiB) in page.titles and "blocks <Block> & co" in page.all_text and "<Block>" not in a._repr_html_()
    assert repr(a) == "<memalloc Advice checkpoint: saves ~3.00 MiB; blocks <Block> & co keep 12 MiB>"
