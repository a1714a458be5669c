"""The HTML leak report (memalloc/reporters/report_html.py): unit tests on the page
text, and one test that opens it in a real headless Chromium.

The browser test needs Chromium (``chromium``, ``chromium-browser`` or
``google-chrome`` on PATH, Playwright's download, or $MEMALLOC_BROWSER); CI
installs Debian's ``chromium`` and sets MEMALLOC_REQUIRE_BROWSER=1
(.ci/run), which makes a missing browser a FAILURE there. Elsewhere (a fresh
machine running the README's test command) a missing browser skips the
browser tests and says why.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.report import screenshot  # noqa: E402
from memalloc.reporters.report_html import render_html  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
STEPS = list(range(1, 41))
HOSTILE_FILE = "/tmp/<script>alert(\"x\")</script>&'q'.py"
HOSTILE_CODE = 'if a < b and c > d: s = "it\'s & <b>bold</b>"  # <!-- -->'


def leak(
    file: str,
    line: int,
    function: str,
    code: str,
    bytes_per_step: float,
    tensors_per_step: float,
    first_step: int = 3,
    cause: str = "unknown",
    holder: dict | None = None,
    hint: str = "",
    alloc_line: int | None = None,
    alloc_code: str = "",
) -> dict:
    """One leak entry of docs/leak-report.md growing linearly from first_step."""
    series = [int(max(0, s - first_step + 1) * bytes_per_step) for s in STEPS]
    alloc = {"filename": file, "line": alloc_line or line, "function": function}
    return {
        "site": {"filename": file, "line": line, "function": function},
        "code": code,
        "alloc_site": alloc,
        "alloc_code": alloc_code or code,
        "stack": [
            {"filename": file, "line": alloc_line or line, "name": function},
            {"filename": "/home/ana/proj/train.py", "line": 120, "name": "main"},
            {"filename": "/home/ana/proj/train.py", "line": 131, "name": "<module>"},
        ],
        "bytes_per_step": float(bytes_per_step),
        "tensors_per_step": float(tensors_per_step),
        "retained_bytes": series[-1],
        "retained_tensors": int(tensors_per_step * (41 - first_step)),
        "first_step": first_step,
        "series": series,
        "holder": holder,
        "cause": cause,
        "hint": hint,
    }


def sample_report() -> dict:
    """A realistic report: 40 steps of a training loop on cuda:0 with three
    leaks (listed smallest first, so the page has to sort them)."""
    leaks = [
        leak(
            "/home/ana/proj/eval.py",
            44,
            "evaluate",
            "preds.append(model(xb))",
            512,
            1,
            first_step=5,
            cause="no_grad_eval",
            hint="run evaluation under `torch.no_grad()`",
        ),
        leak(
            "<ipython-input-7-1f2e3d>",
            9,
            "<lambda>",
            'acts[name] = out  # "hook" & co',
            288 * KiB,
            2,
            cause="hook_storage",
            holder={
                "kind": "dict",
                "name": "acts",
                "length": 12,
                "where": "<ipython-input-7-1f2e3d>:9",
                "code": "acts[name] = out",
            },
            hint="the forward hook stores every `out`; store `out.detach().cpu()` or clear `acts` each step",
        ),
        leak(
            "/home/ana/proj/train.py",
            57,
            "train",
            "losses.append(loss)",
            3 * MiB,
            4,
            first_step=2,
            cause="graph_in_container",
            alloc_line=52,
            alloc_code="loss = criterion(model(x), y)",
            holder={
                "kind": "list",
                "name": "losses",
                "length": 39,
                "where": "/home/ana/proj/train.py:57",
                "code": "losses.append(loss)",
            },
            hint="each `loss` appended keeps its autograd graph alive; append loss.item() or loss.detach()",
        ),
    ]
    leaked = [sum(k["series"][i] for k in leaks) for i in range(len(STEPS))]
    allocated = [int(1.25 * GiB + (i % 3) * 4 * MiB + b) for i, b in enumerate(leaked)]
    reserved = [-(-(a + 300 * MiB) // (20 * MiB)) * 20 * MiB for a in allocated]
    reserved = [max(reserved[: i + 1]) for i in range(len(reserved))]  # the cache only grows
    return {
        "schema": "memalloc.leak_report/1",
        "created": "2026-11-29T18:00:00+00:00",
        "backend": "cuda",
        "device": 0,
        "steps": STEPS,
        "allocated": allocated,
        "reserved": reserved,
        "threshold_bytes_per_step": 0,
        "warmup_steps": 1,
        "leaks": leaks,
        "notes": ["7 events were dropped from the ring; early steps may under-count"],
        "future_key": {"ignored": True},
    }


def squash(text: str) -> str:
    """``text`` with runs of white space as one space (as a page shows it)."""
    return " ".join(text.split())


class Dom(HTMLParser):
    """Elements of a page as (tag, attrs, ids of the enclosing elements) plus
    the text, for assertions on structure."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source", "wbr"}

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict, tuple[str, ...]]] = []
        self.stack: list[tuple[str, str]] = []
        self.texts: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a, tuple(i for _, i in self.stack if i)))
        if tag not in self.VOID:
            self.stack.append((tag, a.get("id", "")))

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        self.texts.append(data)

    @property
    def text(self) -> str:
        return squash("".join(self.texts))

    def find(self, tag: str = "", cls: str = "", inside: str = "") -> list[dict]:
        return [
            a
            for t, a, ids in self.elements
            if (not tag or t == tag)
            and (not cls or cls in a.get("class", "").split())
            and (not inside or inside in ids)
        ]


def check_page(dom: Dom, report: dict) -> None:
    """What any rendering of ``report`` (the string or the browser's DOM) must show."""
    leaks = sorted(report["leaks"], key=lambda k: -k["bytes_per_step"])
    articles = dom.find("article", "leak")
    assert [a["id"] for a in articles] == [f"leak-{i}" for i in range(len(leaks))]
    assert [float(a["data-bytes-per-step"]) for a in articles] == [k["bytes_per_step"] for k in leaks]
    assert [a["data-site"] for a in articles] == [f"{k['site']['filename']}:{k['site']['line']}" for k in leaks]
    memory = dom.find("polyline", "series", inside="chart-memory")
    assert sorted(p["class"] for p in memory) == ["series allocated", "series reserved"]
    for p in memory:
        assert len(p["points"].split()) == len(report["steps"])
    for i in range(len(leaks)):
        assert dom.find("svg", "chart", inside=f"leak-{i}")
        (line,) = dom.find("polyline", "live", inside=f"leak-{i}")
        assert len(line["points"].split()) == len(report["steps"])
        assert dom.find("path", "area", inside=f"leak-{i}")
        assert dom.find("details", "stack", inside=f"leak-{i}")
    for k in leaks:
        assert f"{k['site']['filename']}:{k['site']['line']} {k['site']['function']}" in dom.text
        assert squash(k["code"]) in dom.text and squash(k["hint"].replace("`", "")) in dom.text
    assert "bytes (GiB)" in dom.text and "step" in dom.text  # axis titles with units


# ------------------------------------------------------------ the string ----


def test_sample_report_page_shows_every_leak_sorted_with_units():
    report = sample_report()
    page = render_html(report)
    dom = Dom(page)
    check_page(dom, report)
    text = dom.text
    assert "3 leaks (+3.28 MiB/step)" in text  # <title>: 3 MiB + 288 KiB + 512 B
    assert "3.00 MiB" in text and "288.00 KiB" in text and "512 B" in text
    assert "117.00 MiB in 156 tensors" in text  # retained by the largest leak (39 steps x 3 MiB)
    assert "allocated at /home/ana/proj/train.py:52 train" in text and "loss = criterion(model(x), y)" in text
    assert "held by list losses, 39 items at /home/ana/proj/train.py:57" in text
    assert "7 events were dropped from the ring" in text
    assert "<code>torch.no_grad()</code>" in page  # backticks in hints become code
    assert dom.find("li", "alloc", inside="leak-0")  # the allocating frame is marked in the stack
    assert "No leaks found" not in text


def test_hostile_strings_are_escaped():
    report = sample_report()
    bad = report["leaks"][0]
    bad["site"]["filename"] = bad["alloc_site"]["filename"] = HOSTILE_FILE
    bad["site"]["function"] = '<f "x" & y>'
    bad["code"] = bad["alloc_code"] = HOSTILE_CODE
    bad["holder"] = {"kind": "<k>", "name": "a&b", "length": None, "where": HOSTILE_FILE, "code": HOSTILE_CODE}
    bad["hint"] = "see `<img src=x onerror=alert(1)>` & more"
    bad["stack"][0]["filename"] = HOSTILE_FILE
    report["notes"] = ["<script>alert(1)</script>"]
    report["created"] = '"><svg onload=alert(1)>'
    page = render_html(report)
    dom = Dom(page)
    tags = {t for t, _, _ in dom.elements}
    assert not tags & {"script", "img", "iframe", "object", "embed", "link", "b"}
    assert not [k for _, a, _ in dom.elements for k in a if k.startswith("on")]
    assert "<script" not in page and "<img" not in page and "<b>" not in page
    # Escaped exactly once: the browser-visible text is the original string.
    for s in (HOSTILE_FILE, HOSTILE_CODE, '<f "x" & y>', "<script>alert(1)</script>", "<img src=x onerror=alert(1)>"):
        assert squash(s) in dom.text
    assert '"><svg onload' not in page
    assert [a["data-site"] for a in dom.find("article", "leak") if HOSTILE_FILE in a["data-site"]]


def test_page_is_self_contained():
    for report in (sample_report(), dict(sample_report(), leaks=[])):
        page = render_html(report)
        lowered = page.lower()
        for needle in ("http://", "https://", "src=", 'href="//', "url(", "@import", "<link", "<script"):
            assert needle not in lowered, needle
        assert all(a["href"].startswith("#") for a in Dom(page).find("a"))


def test_no_leaks_page():
    report = dict(sample_report(), leaks=[], notes=[])
    dom = Dom(render_html(report))
    assert dom.find(cls="no-leaks") and "No leaks found" in dom.text
    assert not dom.find("article", "leak")
    assert len(dom.find("polyline", "series", inside="chart-memory")) == 2
    assert "memalloc leak report: 0 leaks" in dom.text


def test_minimal_and_degenerate_reports_render():
    # One step, all zeros, optional keys missing, series shorter than steps.
    one = {
        "schema": "memalloc.leak_report/1",
        "steps": [7],
        "allocated": [0],
        "reserved": [0],
        "leaks": [
            {
                "site": {"filename": "a.py", "line": 1, "function": "f"},
                "code": "",
                "bytes_per_step": 0.5,
                "tensors_per_step": 0.25,
                "series": [],
                "holder": None,
            }
        ],
    }
    dom = Dom(render_html(one))
    assert dom.find("article", "leak") and "(source unavailable)" in dom.text and "0.25" in dom.text
    assert not dom.find("details", "stack") and "allocated at" not in dom.text
    many = copy.deepcopy(sample_report())
    many["steps"] = list(range(0, 100000, 10))  # 10k steps: hover bands are thinned
    many["allocated"] = many["reserved"] = [s * 1000 for s in many["steps"]]
    many["leaks"] = many["leaks"][:1]
    page = render_html(many)
    assert page.count('class="band"') <= 2 * 200 and "bytes (MiB)" in page


def test_chart_axis_units_follow_the_data():
    report = dict(sample_report(), allocated=[100] * 40, reserved=[900] * 40, leaks=[])
    (svg,) = Dom(render_html(report)).find("svg", inside="memory")
    assert svg["data-unit"] == "B"
    report = dict(report, reserved=[int(2.5 * KiB)] * 40)
    assert "bytes (KiB)" in render_html(report)


# ------------------------------------------------------------ the browser ----


@pytest.fixture(scope="module")
def browser() -> str:
    found = screenshot.find_browser()
    if found is None:
        wanted = "no Chromium found (chromium, chromium-browser, google-chrome, Playwright's)"
        if os.environ.get("MEMALLOC_REQUIRE_BROWSER") == "1":
            pytest.fail(wanted + "; MEMALLOC_REQUIRE_BROWSER=1 (CI) needs one: apt-get install chromium")
        pytest.skip(wanted + ": install one (e.g. apt-get install chromium) to run the browser tests")
    return found


# the slow tier (CI runs it, `-m slow`): a headless browser (~8 s), over the README's fast-tier budget of 180 s on CI's
# 2 cores
@pytest.mark.slow
def test_report_in_headless_chromium(browser, tmp_path):
    report = sample_report()
    html_path = tmp_path / "report.html"
    html_path.write_text(render_html(report), encoding="utf-8")
    dumped = screenshot.run_headless(browser, str(html_path), "--dump-dom")
    assert "<svg" in dumped and 'id="leak-2"' in dumped
    dom = Dom(dumped)
    check_page(dom, report)
    assert "3.00 MiB" in dom.text and "288.00 KiB" in dom.text and "3.28 MiB/step" in dom.text

    png = tmp_path / "report.png"
    screenshot.screenshot(browser, str(html_path), str(png), (1280, 2000))
    assert screenshot.png_size(str(png)) == (1280, 2000)
    colours = screenshot.distinct_colours(str(png))
    assert colours > 100, f"screenshot looks blank: {colours} distinct colours"


def test_colour_count_of_a_known_page(browser, tmp_path):
    """distinct_colours decodes what Chromium writes: white, red and blue
    blocks give exactly 3 colours (a blank page would give 1)."""
    page = tmp_path / "blocks.html"
    page.write_text(
        '<body style="margin:0;background:#fff"><div style="height:50px;background:#f00"></div>'
        '<div style="height:50px;background:#00f"></div></body>'
    )
    png = tmp_path / "blocks.png"
    screenshot.screenshot(browser, str(page), str(png), (200, 300))
    assert screenshot.distinct_colours(str(png)) == 3


def test_screenshot_command(browser, tmp_path):
    report_path, png = tmp_path / "leaks.json", tmp_path / "shot.png"
    report_path.write_text(json.dumps(dict(sample_report(), leaks=[])))
    assert screenshot.main([str(report_path), str(png), "--size", "800,600", "--html", str(tmp_path / "r.html")]) == 0
    assert screenshot.png_size(str(png)) == (800, 600)
    assert re.search(r'id="no-leaks"', (tmp_path / "r.html").read_text())


# ---- legend swatches: the colour of each line (issue 37) ---------------------
class _Elements(HTMLParser):
    """Every legend entry (its label, ancestors and classes) and every chart
    line (``polyline.series``: its data-label, ancestors and classes), each
    with its chain of (tag, classes) from <html> down."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, frozenset]] = []
        self.legend: dict[str, list] = {}
        self.lines: dict[str, list] = {}
        self.css = ""
        self._text_of: list | None = None
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        el = (tag, frozenset((a.get("class") or "").split()))
        if tag == "polyline" and "series" in el[1]:
            self.lines[a["data-label"]] = [*self.stack, el]
        if tag == "span" and self.stack and "legend" in self.stack[-1][1]:
            self._text_of = [*self.stack, el]
        self._in_style = tag == "style"
        if tag not in ("polyline", "line", "path", "rect", "meta"):  # (void or self-closed in this page)
            self.stack.append(el)

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False
        if self.stack and self.stack[-1][0] == tag:
            self.stack.pop()

    def handle_data(self, data):
        if self._in_style:
            self.css += data
        elif self._text_of is not None:
            self.legend[data] = self._text_of
            self._text_of = None


def _rules(css: str) -> list[tuple[list, tuple, int, list]]:
    """(compound selectors, specificity, source order, [(property, value)]) per selector of every rule."""
    out = []
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    for order, (selectors, body) in enumerate(re.findall(r"([^{}]+)\{([^{}]*)\}", css)):
        decls = [tuple(x.strip() for x in d.split(":", 1)) for d in body.split(";") if ":" in d]
        for sel in selectors.split(","):
            compounds = []
            for part in sel.split():
                m = re.fullmatch(r"([a-z0-9*]*)((?:\.[\w-]+)*)((?::[\w-]+(?:\([^)]*\))?)*)(::[\w-]+)?", part)
                assert m, f"a selector this test cannot read: {sel!r}"
                compounds.append(
                    (
                        m.group(1) if m.group(1) not in ("", "*") else None,
                        frozenset(c for c in m.group(2).split(".") if c),
                        [p for p in m.group(3).split(":") if p],
                        (m.group(4) or "")[2:] or None,
                    )
                )
            spec = (
                0,
                sum(len(c[1]) + len(c[2]) for c in compounds),
                sum((c[0] is not None) + (c[3] is not None) for c in compounds),
            )
            out.append((compounds, spec, order, decls))
    return out


def _matches(compound, el, pseudo) -> bool:
    tag, classes, pseudo_classes, pseudo_element = compound
    if pseudo_element != pseudo:
        return False
    if pseudo_classes and pseudo_classes != ["root"]:
        return False  # :hover and the like: not in a static page
    if pseudo_classes == ["root"] and el[0] != "html":
        return False
    return (tag is None or tag == el[0]) and classes <= el[1]


def _selects(compounds, chain, pseudo) -> bool:
    """Whether the descendant selector ``compounds`` selects the last element of ``chain`` (or its ``pseudo``)."""
    if not _matches(compounds[-1], chain[-1], pseudo):
        return False
    i = len(chain) - 2
    for compound in reversed(compounds[:-1]):
        while i >= 0 and not _matches(compound, chain[i], None):
            i -= 1
        if i < 0:
            return False
        i -= 1
    return True


def _is_colour(token: str) -> bool:
    return token.startswith(("#", "var(", "rgb", "hsl")) or token in (
        "currentcolor",
        "currentColor",
        "grey",
        "red",
        "blue",
        "black",
        "white",
        "transparent",
    )


def _longhands(prop: str, value: str) -> list[tuple[str, str]]:
    """The longhands a declaration sets, as far as colours go (a border
    shorthand without a colour sets it to currentcolor)."""
    if prop in ("border", "border-top"):
        colours = [t for t in value.split() if _is_colour(t)]
        return [("border-top-color", colours[0] if colours else "currentcolor")]
    if prop == "border-color":
        return [("border-top-color", value.split()[0])]
    return [(prop, value)]


def _computed(rules, chain, pseudo, prop: str, variables: dict) -> str | None:
    """The cascaded value of ``prop`` on the last element of ``chain`` (or its
    ``pseudo``): the matching declaration of the highest specificity, the
    later one on a tie; ``color`` inherits; var() and currentcolor resolved."""
    found = [
        (spec, order, i, value)
        for compounds, spec, order, decls in rules
        if _selects(compounds, chain, pseudo)
        for i, (p, v) in enumerate(decls)
        for lp, value in _longhands(p, v)
        if lp == prop
    ]
    if not found:
        if prop == "color" and (pseudo or len(chain) > 1):
            return _computed(rules, chain if pseudo else chain[:-1], None, "color", variables)
        return None
    value = max(found)[3]
    value = re.sub(r"var\((--[\w-]+)\)", lambda m: variables[m.group(1)], value)
    if value.lower() == "currentcolor":
        return _computed(rules, chain, pseudo, "color", variables)
    return value.lower()


def legend_and_line_colours(page: str) -> dict[str, tuple]:
    """Per series label: (its legend swatch's visible colour, its line's
    stroke), computed from the page's own CSS. The swatch is the ``::before``
    of the legend entry; the page draws it as a box 0 high (asserted) whose
    top border is all that shows, so its colour is the border's."""
    doc = _Elements()
    doc.feed(page)
    rules = _rules(doc.css)
    variables = {
        k: v.strip()
        for compounds, _, _, decls in rules
        if compounds[0][2] == ["root"]
        for k, v in decls
        if k.startswith("--")
    }
    assert doc.legend and sorted(doc.legend) == sorted(doc.lines), (doc.legend.keys(), doc.lines.keys())
    out = {}
    for label, chain in doc.legend.items():
        assert _computed(rules, chain, "before", "height", variables) == "0", label  # only the border shows
        out[label] = (
            _computed(rules, chain, "before", "border-top-color", variables),
            _computed(rules, doc.lines[label], None, "stroke", variables),
        )
    return out


def test_legend_swatches_take_their_lines_colours():
    """The leak report's chart and the job report's per-rank chart (issue 37:
    the job page's swatches were grey, its lines blue and red)."""
    from memalloc.reporters import flight

    ranks = [
        {
            "rank": r,
            "pid": 100 + r,
            "host": "h",
            "state": "exited",
            "steps": [1, 2, 3],
            "peak_allocated": [(r + 1) * MiB] * 3,
            "peak": (r + 1) * MiB,
            "leaks": [],
        }
        for r in range(3)
    ]
    pages = {
        "leak report": render_html(sample_report()),
        "job report": flight.job_html({"ranks": ranks, "outliers": []}),
    }
    for name, page in pages.items():
        colours = legend_and_line_colours(page)
        assert all(line is not None for _, line in colours.values()), (name, colours)
        assert {label: swatch for label, (swatch, _) in colours.items()} == {
            label: line for label, (_, line) in colours.items()
        }, (name, colours)
    job = legend_and_line_colours(pages["job report"])
    assert len({line for _, line in job.values()}) == 3  # three ranks, three colours
