"""The run page (``DIR/index.html``, memalloc/trace/run_page.py and
memalloc/reporters/run_page.py) of ``python -m memalloc run --out DIR`` on
a script whose memory the test planted (host backend), checked against the
truths the test computes: every step's peak and end, the flame graph's
bytes per stack, and in headless Chromium the widths the browser lays out
(a frame's width is its share of the bytes), zooming, hovering and the
legends' colours against their lines' and bands' colours.

The planted script (SCRIPT) keeps 3 + 1 MiB per step through two calls of
``leaf`` under ``branch``, 2 MiB through ``direct``, frees a 5 MiB temporary
each step, and keeps 7 MiB after the loop. Every size is a multiple of 512,
so block bytes equal tensor bytes, and nothing else allocates: step k's
peak is 6k + 5 MiB, its end 6k MiB, and the run's peak is its end, 6 STEPS
+ 7 MiB, held by exactly the stacks of ``expected_frames``.

The browser tests need Chromium (see tests/integration/test_report_html.py);
CI sets MEMALLOC_REQUIRE_BROWSER=1, which makes a missing browser a failure.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.report import screenshot  # noqa: E402
from memalloc.reporters.run_page import render  # noqa: E402

MiB = 1 << 20
STEPS = 5

SCRIPT = textwrap.dedent("""\
    import torch
    import memalloc

    MiB = 1 << 20
    keep = []


    def leaf(n):
        keep.append(torch.empty(n * MiB, dtype=torch.uint8))  # LEAF


    def branch(a, b):
        leaf(a)  # BRANCH-A
        leaf(b)  # BRANCH-B


    def direct(n):
        keep.append(torch.empty(n * MiB, dtype=torch.uint8))  # DIRECT


    for step in range({steps}):
        branch(3, 1)  # CALL-BRANCH
        direct(2)  # CALL-DIRECT
        tmp = torch.empty(5 * MiB, dtype=torch.uint8)  # TEMP
        del tmp
        memalloc.step()
    keep.append(torch.empty(7 * MiB, dtype=torch.uint8))  # LAST
    {ending}
""")


def line_of(marker: str) -> int:
    return next(i for i, l in enumerate(SCRIPT.splitlines(), 1) if l.rstrip().endswith(marker))


def expected_frames() -> list[tuple[int, str, int, int]]:
    """(depth, function, line, bytes) of every frame of the flame graph at the peak."""
    S = STEPS
    return [
        (0, "all live memory", 0, (6 * S + 7) * MiB),
        (1, "<module>", line_of("# CALL-BRANCH"), 4 * S * MiB),
        (1, "<module>", line_of("# CALL-DIRECT"), 2 * S * MiB),
        (1, "<module>", line_of("# LAST"), 7 * MiB),
        (2, "branch", line_of("# BRANCH-A"), 3 * S * MiB),
        (2, "branch", line_of("# BRANCH-B"), 1 * S * MiB),
        (2, "direct", line_of("# DIRECT"), 2 * S * MiB),
        (3, "leaf", line_of("# LEAF"), 3 * S * MiB),
        (3, "leaf", line_of("# LEAF"), 1 * S * MiB),
    ]


def page_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)
    assert m, "the page carries no run-data"
    return json.loads(m.group(1))


def flatten(node: dict, depth: int = 0) -> list[tuple[int, str, int, int]]:
    out = [(depth, node["name"], node["line"], node["bytes"])]
    for c in node["children"]:
        out += flatten(c, depth + 1)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fresh_python):
    """The planted script run twice: to its end, and into an OOM after it."""
    out = {}
    for name, ending in (("clean", "pass"), ("oom", "torch.empty(1 << 42, dtype=torch.uint8)  # OOM")):
        root = tmp_path_factory.mktemp(name)
        (root / "planted.py").write_text(SCRIPT.format(steps=STEPS, ending=ending))
        p = fresh_python.run(["-m", "memalloc", "run", "--out", "report", "planted.py"], cwd=root)
        out[name] = (root, p)
    return out


def test_clean_run_writes_its_page_with_the_planted_figures(runs):
    root, p = runs["clean"]
    assert p.returncode == 0, p.stderr[-3000:]
    page_path = root / "report" / "index.html"
    assert f"wrote report{os.sep}index.html" in p.stderr
    data = page_data(page_path.read_text())
    assert data["process"]["state"] == "exited"
    assert data["process"]["argv"][:5] == ["python", "-m", "memalloc", "run", "--out"]
    steps = data["steps"]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert [s["peak_allocated"] for s in steps] == [(6 * k + 5) * MiB for k in range(1, STEPS + 1)]
    assert [s["allocated"] for s in steps] == [6 * k * MiB for k in range(1, STEPS + 1)]
    assert all(sum(s["split"].values()) == s["peak_allocated"] for s in steps)
    assert all(s["reserved"] >= s["peak_allocated"] - 5 * MiB for s in steps)
    flame = data["flame"]
    assert flame["total"] == (6 * STEPS + 7) * MiB and flame["step"] == STEPS + 1  # after the loop
    assert sorted(flatten(flame["tree"])) == sorted(expected_frames())
    assert all(os.path.basename(f) == "planted.py" for f in _files(flame["tree"])), _files(flame["tree"])
    assert data["ooms"] == [] and data["leaks"] is None and data["advice"] is None
    assert not (root / "report" / "flight").exists()  # a clean end removes the flight file


def _files(node: dict) -> set[str]:
    return {node["file"]} - {""} | {f for c in node["children"] for f in _files(c)}


def test_oom_run_page_lists_the_oom_and_its_report(runs):
    root, p = runs["oom"]
    assert p.returncode != 0 and "OutOfMemoryError" in p.stderr, p.stderr[-3000:]
    page = (root / "report" / "index.html").read_text()
    data = page_data(page)
    assert data["process"]["state"] == "raised"
    assert [o["bytes"] for o in data["ooms"]] == [1 << 42]
    assert data["ooms"][0]["step"] == STEPS + 1  # after the last memalloc.step(): in the step it never ended
    reports = sorted(n for n in os.listdir(root / "report") if n.startswith("oom-") and n.endswith(".txt"))
    assert [f["file"] for f in data["oom_files"]] == reports and len(reports) == 1
    assert f'href="{reports[0]}"' in page
    assert len(os.listdir(root / "report" / "flight")) == 1  # kept for postmortem
    # the peak is still the planted one: the failed request never held memory
    assert data["flame"]["total"] == (6 * STEPS + 7) * MiB


def test_page_is_one_file_that_needs_no_network(runs):
    page = (runs["clean"][0] / "report" / "index.html").read_text()
    assert not re.search(r'\b(?:src|href)\s*=\s*["\']?(?:https?:)?//', page, re.I), "a link to outside the page"
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert page.count("<script") == 2  # the data, and the flame graph's script


def test_hostile_names_are_escaped_and_survive_the_data_round_trip():
    evil = '</script><script>alert("x")</script><!--'
    tree = {
        "name": "all live memory",
        "file": "",
        "line": 0,
        "kind": "root",
        "bytes": 1024,
        "children": [
            {"name": evil, "file": f"/tmp/{evil}.py", "line": 3, "kind": "user", "bytes": 1024, "children": []}
        ],
    }
    data = {
        "schema": "memalloc.run_page/1",
        "title": evil,
        "steps": [],
        "flame": {"total": 1024, "step": None, "tree": tree},
        "ooms": [],
        "oom_files": [{"file": evil, "first_line": evil}],
        "notes": [evil],
        "process": {"argv": ["python", evil], "pid": 1, "host": evil, "state": "exited", "backend": "host"},
    }
    page = render(data)
    assert evil not in page and "<script>alert" not in page
    assert page_data(page)["flame"]["tree"]["children"][0]["name"] == evil


def test_page_of_a_run_with_nothing_to_show_says_what_gives_each_section():
    page = render({"schema": "memalloc.run_page/1", "steps": [], "flame": None, "notes": []})
    for text in ("No step ended", "No allocation was recorded", "run --leaks", "run --advise"):
        assert text in page, text


# ---- in headless Chromium ------------------------------------------------------------

PROBE = """
<script>
(function () {
  var box = document.getElementById("flame-graph");
  function frames() {
    var b = box.getBoundingClientRect();
    return Array.prototype.map.call(box.querySelectorAll(".frame"), function (d) {
      var r = d.getBoundingClientRect();
      return {name: d.dataset.name, line: +d.dataset.line, depth: Math.round((r.top - b.top) / 19),
              left: r.left - b.left, width: r.width, cls: d.className};
    });
  }
  function find(name, line) {
    return Array.prototype.find.call(box.querySelectorAll(".frame"), function (d) {
      return d.dataset.name === name && +d.dataset.line === line;
    });
  }
  var out = {width: box.getBoundingClientRect().width, frames: frames(), legend: [], swatches: []};
  document.querySelectorAll("#memory .legend span").forEach(function (s) {
    var line = Array.prototype.find.call(document.querySelectorAll("#chart-steps polyline.series"),
      function (p) { return p.dataset.label === s.textContent; });
    out.legend.push({label: s.textContent, swatch: getComputedStyle(s, "::before").borderTopColor,
                     line: line ? getComputedStyle(line).stroke : null});
  });
  document.querySelectorAll("#breakdown .swatches span").forEach(function (s) {
    var band = document.querySelector("#chart-breakdown path.stack." + s.className);
    out.swatches.push({cls: s.className, swatch: getComputedStyle(s, "::before").backgroundColor,
                       band: band ? getComputedStyle(band).fill : null});
  });
  var leaf = find("leaf", LEAF_LINE);
  leaf.dispatchEvent(new MouseEvent("mouseenter"));
  out.hover = document.getElementById("flame-detail").textContent;
  find("<module>", ZOOM_LINE).click();
  out.zoomed = frames();
  out.focus = box.dataset.focus;
  find("all live memory", 0).click();
  out.unzoomed = frames();
  var pre = document.createElement("pre");
  pre.id = "probe-out";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


@pytest.fixture(scope="module")
def browser():
    found = screenshot.find_browser()
    if found is None:
        if os.environ.get("MEMALLOC_REQUIRE_BROWSER") == "1":
            pytest.fail("MEMALLOC_REQUIRE_BROWSER=1 but no Chromium found (install Debian's chromium)")
        pytest.skip("no Chromium-family browser (chromium, google-chrome or $MEMALLOC_BROWSER)")
    return found


@pytest.fixture(scope="module")
def probed(runs, browser, tmp_path_factory):
    """What Chromium lays out for the clean run's page, with the test's probe appended."""
    root = runs["clean"][0]
    work = tmp_path_factory.mktemp("probe")
    page = (root / "report" / "index.html").read_text()
    probe = PROBE.replace("LEAF_LINE", str(line_of("# LEAF"))).replace("ZOOM_LINE", str(line_of("# CALL-BRANCH")))
    (work / "index.html").write_text(page.replace("</body>", probe + "</body>"))
    dom = screenshot.run_headless(browser, str(work / "index.html"), "--dump-dom", "--window-size=1200,2400")
    m = re.search(r'<pre id="probe-out">(.*?)</pre>', dom, re.S)
    assert m, dom[-3000:]
    return json.loads(html.unescape(m.group(1)))


def _assert_widths(frames: list[dict], width: float, expected: list[tuple[int, str, int, int]], total: int) -> None:
    got = sorted((f["depth"], f["name"], f["line"], f["width"]) for f in frames)
    want = sorted((d, n, l, b / total * width) for d, n, l, b in expected)
    assert [g[:3] for g in got] == [w[:3] for w in want], (got, want)
    for g, w in zip(got, want):
        assert abs(g[3] - w[3]) <= 1.0, (g, w)  # within a pixel of the bytes' share


def test_flame_graph_widths_are_the_bytes_per_stack(probed):
    total = (6 * STEPS + 7) * MiB
    assert probed["width"] > 600
    _assert_widths(probed["frames"], probed["width"], expected_frames(), total)
    assert probed["unzoomed"] == probed["frames"]  # the reset redraws the same graph


def test_flame_graph_zooms_to_a_frame_and_hovers_its_bytes(probed):
    S, branch_line = STEPS, line_of("# CALL-BRANCH")
    assert probed["focus"].startswith("<module> ") and probed["focus"].endswith(f"planted.py:{branch_line}")
    in_focus = [f for f in probed["zoomed"] if "ancestor" not in f["cls"]]
    ancestors = [f for f in probed["zoomed"] if "ancestor" in f["cls"]]
    assert [(a["name"], round(a["width"])) for a in ancestors] == [("all live memory", round(probed["width"]))]
    expected = [e for e in expected_frames() if e[1] in ("branch", "leaf") or e[1:3] == ("<module>", branch_line)]
    _assert_widths(in_focus, probed["width"], expected, 4 * S * MiB)
    assert f"{3 * S * MiB:,} bytes" in probed["hover"] and f":{line_of('# LEAF')}" in probed["hover"], probed["hover"]
    assert probed["hover"].endswith("keep.append(torch.empty(n * MiB, dtype=torch.uint8))  # LEAF"), probed["hover"]


def test_legend_colours_are_their_lines_and_bands_colours(probed):
    assert [l["label"] for l in probed["legend"]] == [
        "peak allocated in the step",
        "allocated at the step's end",
        "reserved at the step's end",
    ]
    assert all(l["swatch"] == l["line"] and l["line"] for l in probed["legend"]), probed["legend"]
    assert len({l["line"] for l in probed["legend"]}) == 3
    drawn = [s for s in probed["swatches"] if s["band"] is not None]
    assert drawn, probed["swatches"]
    assert all(s["swatch"] == s["band"] for s in drawn), drawn
    assert len({s["swatch"] for s in probed["swatches"]}) == len(probed["swatches"]) == 6


def test_screenshot_of_the_page_is_rendered(runs, browser, tmp_path):
    png = tmp_path / "page.png"
    screenshot.screenshot(browser, str(runs["clean"][0] / "report" / "index.html"), str(png), (1000, 1800))
    assert screenshot.png_size(str(png)) == (1000, 1800)
    assert screenshot.distinct_colours(str(png)) > 100  # text, charts and the flame graph, not a blank page


def test_write_keeps_no_temporary_file(runs):
    names = os.listdir(runs["clean"][0] / "report")
    assert not [n for n in names if n.endswith(".tmp")], names


def test_a_long_run_keeps_the_breakdown_chart_small_and_its_highest_step():
    """40,000 steps (the flight file's history holds up to 43,690 rows): the
    breakdown draws at most 300 bands, one per run of steps showing the run's
    highest peak, so a spike at one step stays on the chart, named."""
    MiB_ = 1 << 20
    steps = [
        {"step": k, "peak_allocated": (9 if k == 23_456 else 1) * MiB_, "allocated": MiB_, "reserved": 2 * MiB_}
        for k in range(1, 40_001)
    ]
    for s in steps:
        s["split"] = {"parameters": s["peak_allocated"]}
    page = render({"schema": "memalloc.run_page/1", "steps": steps, "flame": None, "notes": []})
    chart = page[page.index('id="chart-breakdown"') : page.index("</svg>", page.index('id="chart-breakdown"'))]
    titles = re.findall(r"<title>step (\d+): parameters ([\d.]+ MiB)", chart)
    assert 250 <= len(titles) <= 300, len(titles)
    assert ("23456", "9.00 MiB") in titles and sum(t[1] == "9.00 MiB" for t in titles) == 1
    assert len(chart) < 200_000, len(chart)
