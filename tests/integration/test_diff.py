"""``python -m memalloc diff A B`` on runs whose difference the test planted
(host backend): two versions of one script, run under ``python -m memalloc
run --out``, B allocating an extra tensor of EXTRA bytes at one line,
another line shrinking by SHRINK bytes and a third keeping GROW_B instead of
GROW_A bytes per step. The diff must name exactly those lines, with their
text, from the ``--out`` folders, from the flight files themselves and from
snapshots; bad input gets a clear error. A model made wider shows its
parameters, gradients and optimizer state at their lines, each with its
category.

Noise floor: 0. Both scripts run the same code but for the planted lines
(same line numbers), every size is a multiple of 512 (block bytes equal the
tensors' bytes) and the host backend is deterministic, so every other line
holds the same bytes in both runs at their peaks and grows alike: any other
line reported is a bug, not noise.
"""

from __future__ import annotations

import html.parser
import json
import os
import pickle
import shutil
import textwrap

import pytest

from memalloc.trace import flight_files
from memalloc.trace.diff import DiffError, category_of, diff, load

MiB = 1 << 20
BASE_A, SHRINK, EXTRA, GROW_A, GROW_B, STEPS = 8 * MiB, 3 * MiB, 5 * MiB, 1 * MiB, 2 * MiB, 6

SCRIPT = textwrap.dedent("""\
    import sys
    import torch
    import memalloc
    keep = []
    base = torch.empty({base}, dtype=torch.uint8)  # shrinks in B
    {extra_line}
    for step in range({steps}):
        keep.append(torch.empty({grow}, dtype=torch.uint8))  # grows faster in B
        tmp = torch.empty({tmp}, dtype=torch.uint8)  # the same in both
        del tmp
        memalloc.step()
    memalloc.dump_snapshot(sys.argv[1])
""")
EXTRA_A = "extra = None  # B allocates here"
EXTRA_B = f"extra = torch.empty({EXTRA}, dtype=torch.uint8)  # B allocates here"


def line_of(marker: str) -> int:
    return next(i for i, l in enumerate(SCRIPT.splitlines(), 1) if marker in l)


BASE_LINE, EXTRA_LINE, GROW_LINE = line_of("{base}"), line_of("{extra_line}"), line_of("{grow}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fresh_python):
    """{"a"/"b": (out folder, snapshot path, script)} of the two planted runs
    (flight files kept), and "clean": the --out folder of A's script run
    without keeping its flight file (a clean end leaves sites.json instead)."""
    root = tmp_path_factory.mktemp("diff")
    found = {}
    for name, base, extra, grow in (("a", BASE_A, EXTRA_A, GROW_A), ("b", BASE_A - SHRINK, EXTRA_B, GROW_B)):
        folder = root / name
        folder.mkdir()
        script = folder / "train.py"
        script.write_text(SCRIPT.format(base=base, extra_line=extra, steps=STEPS, grow=grow, tmp=4 * MiB))
        out, snap = folder / "out", folder / "snap.pickle"
        p = fresh_python.run(
            ["-m", "memalloc", "run", "--backend", "host", "--config", "flight_recorder_keep:True",
             "--out", str(out), str(script), str(snap)],
            cwd=folder,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        found[name] = (out, snap, script)
    clean = root / "clean"
    p = fresh_python.run(
        ["-m", "memalloc", "run", "--backend", "host", "--out", str(clean / "out"),
         str(found["a"][2]), str(clean / "snap.pickle")],
        cwd=root,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    found["clean"] = clean / "out"
    return found


def by_line(rows):
    return {(r["key"], r["site"]["line"]): r for r in rows}


def assert_planted_peak(d, b_script):
    rows = by_line(d["peak"])
    assert set(rows) == {(f"train.py:{n}", n) for n in (EXTRA_LINE, BASE_LINE, GROW_LINE)}, d["peak"]
    extra, base, grow = (rows[f"train.py:{n}", n] for n in (EXTRA_LINE, BASE_LINE, GROW_LINE))
    assert (extra["a"], extra["b"], extra["delta"]) == (0, EXTRA, EXTRA)
    assert (base["a"], base["b"], base["delta"]) == (BASE_A, BASE_A - SHRINK, -SHRINK)
    assert grow["delta"] == STEPS * (GROW_B - GROW_A)
    assert extra["code"] == f"extra = torch.empty({EXTRA}, dtype=torch.uint8)  # B allocates here"
    assert base["code"] == f"base = torch.empty({BASE_A - SHRINK}, dtype=torch.uint8)  # shrinks in B"
    assert extra["site"]["filename"] == str(b_script)
    # sorted by the size of the change, largest first
    assert [abs(r["delta"]) for r in d["peak"]] == sorted((abs(r["delta"]) for r in d["peak"]), reverse=True)
    a, b = d["runs"]
    assert b["peak"] - a["peak"] == EXTRA - SHRINK + STEPS * (GROW_B - GROW_A)


def test_out_folders_give_the_planted_lines_at_the_peak_and_per_step(runs, memalloc_cli_here, tmp_path):
    page = tmp_path / "diff.html"
    p = memalloc_cli_here("diff", str(runs["a"][0]), str(runs["b"][0]), "--json", "--html", str(page))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert_planted_peak(d, runs["b"][2])
    steps = by_line(d["per_step"])
    assert list(steps) == [(f"train.py:{GROW_LINE}", GROW_LINE)], d["per_step"]
    g = steps[f"train.py:{GROW_LINE}", GROW_LINE]
    assert (g["a"], g["b"], g["delta"]) == (GROW_A, GROW_B, GROW_B - GROW_A)
    assert "keep.append" in g["code"]
    assert_page_matches(page.read_text(), d)
    text = memalloc_cli_here("diff", str(runs["a"][0]), str(runs["b"][0])).stdout
    assert f"+{EXTRA // MiB}.00 MiB" in text and f"-{SHRINK // MiB}.00 MiB" in text
    assert f"+{(GROW_B - GROW_A) // MiB}.00 MiB/step" in text and "B allocates here" in text


def test_flight_files_and_folders_give_the_same(runs):
    (fa,) = flight_files.files_in(runs["a"][0])
    (fb_dir,) = {os.path.dirname(p) for p in flight_files.files_in(runs["b"][0])}
    d = diff(fa, fb_dir)
    assert_planted_peak(d, runs["b"][2])
    assert [r["delta"] for r in d["per_step"]] == [GROW_B - GROW_A]


def test_snapshots_give_the_planted_lines_at_the_peak(runs):
    d = diff(str(runs["a"][1]), str(runs["b"][1]))
    assert_planted_peak(d, runs["b"][2])
    assert d["per_step"] is None and any("no per-step comparison" in n for n in d["notes"])
    # mixed kinds: a flight folder against a snapshot
    assert_planted_peak(diff(str(runs["a"][0]), str(runs["b"][1])), runs["b"][2])


def test_a_plain_run_out_folder_that_ended_cleanly_is_read_from_its_summary(runs):
    # `python -m memalloc run --out DIR` with no flag: a clean end removes the
    # flight file and leaves DIR/sites.json, the same reading of it
    out = runs["clean"]
    assert not (out / "flight").exists() and (out / "sites.json").is_file()
    d = diff(str(out), str(runs["b"][0]))
    assert_planted_peak(d, runs["b"][2])
    assert [r["delta"] for r in d["per_step"]] == [GROW_B - GROW_A]
    assert diff(str(out), str(runs["a"][0]))["peak"] == []  # A's script, read from its flight file


def test_a_run_against_itself_changes_nothing(runs):
    d = diff(str(runs["a"][0]), str(runs["a"][0]))
    assert d["peak"] == [] and d["per_step"] == []


def test_bad_input_gets_a_clear_error(runs, tmp_path, memalloc_cli_here):
    a = str(runs["a"][0])
    with pytest.raises(DiffError, match="no such file or folder.*snapshot pickle"):
        diff(a, str(tmp_path / "nothing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a run")
    with pytest.raises(DiffError, match="not a run diff can read.*flight_recorder_keep:True"):
        diff(a, str(empty))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sites.json").write_text('{"schema": "memalloc.diff-run/1", "peak": 1}')
    with pytest.raises(DiffError, match="not a run summary diff can read.*snapshot pickle"):
        diff(a, str(broken))
    with pytest.raises(DiffError, match="not a snapshot pickle"):
        diff(a, str(empty / "notes.txt"))
    # two different devices: the snapshot's memory moved to device 1; a flight file of another backend
    snap = pickle.loads(runs["b"][1].read_bytes())
    for seg in snap["segments"]:
        seg["device"] = 1
    snap["device_traces"] = [[], snap["device_traces"][0]]
    moved = tmp_path / "device1.pickle"
    moved.write_bytes(pickle.dumps(snap))
    with pytest.raises(DiffError, match="device 0.*device 1"):
        diff(str(runs["a"][1]), str(moved))
    (fb,) = flight_files.files_in(runs["b"][0])
    cuda = tmp_path / os.path.basename(fb)
    shutil.copy(fb, cuda)
    with open(cuda, "r+b") as f:
        f.seek(flight_files.BACKEND_AT)
        f.write(b"cuda".ljust(flight_files.BACKEND_BYTES, b"\0"))
    with pytest.raises(DiffError, match="ran on host.*on cuda"):
        diff(a, str(cuda))
    p = memalloc_cli_here("diff", a, str(tmp_path / "nothing"))
    assert p.returncode == 1 and "memalloc: " in p.stderr and "no such file or folder" in p.stderr, p


class _Rows(html.parser.HTMLParser):
    """The page's tables: {table id: [{data-*} of each row]} and each row's cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict]] = {}
        self.table: str | None = None
        self.cell: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.table = a.get("id")
            self.tables[self.table] = []
        elif tag == "tr" and a.get("class") == "site":
            self.tables[self.table].append({k: v for k, v in a.items() if k.startswith("data-")} | {"cells": {}})
        elif tag == "td" and self.tables.get(self.table):
            self.cell = a.get("class", "").split()[-1]
            self.tables[self.table][-1]["cells"][self.cell] = ""

    def handle_endtag(self, tag):
        if tag == "td":
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.tables[self.table][-1]["cells"][self.cell] += data


def assert_page_matches(page: str, d: dict) -> None:
    """The page's numbers equal the table's, row for row, in its order;
    nothing outside the page is linked."""
    assert "http://" not in page and "https://" not in page and "<script" not in page
    p = _Rows()
    p.feed(page)
    for table, rows in (("peak-table", d["peak"]), ("per-step-table", d["per_step"])):
        got = p.tables[table]
        assert [(r["data-key"], float(r["data-a"]), float(r["data-b"]), float(r["data-delta"])) for r in got] == [
            (r["key"], r["a"], r["b"], r["delta"]) for r in rows
        ]
        assert [r["cells"]["code"] for r in got] == [r["code"] for r in rows]
        assert [r["cells"]["category"] for r in got] == [r["category"] or "-" for r in rows]


def test_the_category_comes_from_the_stack_and_tag():
    user = ("/home/me/train.py", 12, "train")
    assert category_of([("/x/site-packages/torch/optim/adam.py", 90, "_init_group"), user]) == "optimizer_state"
    assert category_of([("/x/site-packages/torch/nn/modules/linear.py", 100, "Linear.__init__"), user]) == "parameters"
    assert category_of([user], "<backward>") == "gradients"
    assert category_of([("/x/site-packages/torch/autograd/__init__.py", 388, "backward"), user]) == "gradients"
    assert category_of([user]) == ""


MODEL = textwrap.dedent("""\
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(256, {h}), torch.nn.ReLU(), torch.nn.Linear({h}, 1))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    for step in range(4):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
""")


def test_a_wider_model_shows_its_parameters_gradients_and_optimizer_state(tmp_path, fresh_python):
    """Hidden width 256 -> 512 under `run --steps`: the model's line holds
    the extra parameters, backward()'s the extra gradients (the same bytes),
    opt.step()'s at least twice that (Adam's two moments), each with its
    category."""
    outs = []
    for h in (256, 512):
        folder = tmp_path / f"h{h}"
        folder.mkdir()
        (folder / "train.py").write_text(MODEL.format(h=h))
        p = fresh_python.run(
            ["-m", "memalloc", "run", "--steps", "--backend", "host", "--config", "flight_recorder_keep:True",
             "--out", "out", "train.py"],
            cwd=folder,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        outs.append(str(folder / "out"))
    rows = {r["site"]["line"]: r for r in diff(*outs)["peak"]}
    # fp32, blocks of 512 B at least: 256*256*4 more weight, 256*4 more bias, 256*4 more second weight
    more = 256 * 256 * 4 + 2 * (2048 - 1024)
    model, backward, step = rows[2], rows[8], rows[9]
    assert (model["delta"], model["category"]) == (more, "parameters")
    assert (backward["delta"], backward["category"]) == (more, "gradients")
    assert step["delta"] >= 2 * more and step["category"] == "optimizer_state"
    assert model["code"].startswith("model = torch.nn.Sequential(torch.nn.Linear(256, 512)")
    assert step["code"] == "opt.step()"


def test_a_recorder_started_late_counts_the_blocks_live_before_it(fresh_python, tmp_path):
    """A flight recorder started after a tensor was made (as the framework
    callbacks start theirs after the model is built) still counts that
    tensor at its line at the peak: the file keeps the blocks live at its
    start. Truth: 3 MiB made before the recorder, 1 MiB after, both kept."""
    script = tmp_path / "late.py"
    script.write_text(
        textwrap.dedent(f"""\
            import torch
            import memalloc
            from memalloc.features import flight
            memalloc.enable(backend="host")
            memalloc.host.use_for_cpu_tensors()
            early = torch.empty(3 * {MiB}, dtype=torch.uint8)  # EARLY
            flight.start({str(tmp_path / "flight")!r}, keep=True)
            late = torch.empty({MiB}, dtype=torch.uint8)  # LATE
            flight.stop(True)
        """)
    )
    p = fresh_python.run([str(script)], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = {m: i for i, l in enumerate(script.read_text().splitlines(), 1) for m in ("EARLY", "LATE") if m in l}
    run = load(str(tmp_path / "flight"))
    at = {(os.path.basename(f), line): b for (f, line, _), b in run.at_peak.items()}
    assert at == {("late.py", lines["EARLY"]): 3 * MiB, ("late.py", lines["LATE"]): MiB}, at
    assert run.peak == 4 * MiB
