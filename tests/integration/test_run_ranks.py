"""``python -m memalloc run`` in a job of several ranks (issue 37): under
``torchrun --nproc_per_node 2 -m memalloc run --steps --leaks --out D`` on
the CPU (gloo, host backend) each rank writes its own files in
``D/rank<N>/`` (no rank overwrites another's), each holding that rank's own
rows; a clean job keeps every rank's flight file, so ``python -m memalloc
report D`` merges them. A single process keeps its paths (``D/steps.csv``)
and, ending cleanly, leaves no flight file: ``report D`` then says why,
truly (the folder holds none), and points at the leak report that is there.

The truth is the script's: rank r takes 3 + r steps and holds one more
tensor of (r + 1) * 64 KiB from the start.
"""

from __future__ import annotations

import csv
import json
import re
import sys

import pytest
from memtest_helpers import REPO

sys.path.insert(0, str(REPO / "tests" / "recording_cases"))
from flight_checks import memalloc_cli, memalloc_run  # noqa: E402

from memalloc.trace import flight_files as ff  # noqa: E402

# the slow tier (CI runs it, `-m slow`): a torchrun job of two ranks and single runs under `run` (~18 s), over the
# README's fast-tier budget of 180 s on CI's 2 cores
pytestmark = pytest.mark.slow

SCRIPT = """\
import torch
import torch.distributed as dist
import memalloc

dist.init_process_group("gloo")
rank = dist.get_rank()
held = torch.ones((rank + 1) * 16 * 1024)  # (rank + 1) * 64 KiB, float32
for step in range(4):  # the same collectives on every rank
    x = torch.ones(1024)
    dist.all_reduce(x)
    if step < 3 + rank:  # rank r: 3 + r steps
        memalloc.step()
dist.barrier()
dist.destroy_process_group()
"""
HELD = {r: (r + 1) * 64 * 1024 for r in (0, 1)}
HELD_LINE = next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if line.startswith("held = "))
STEPS = {r: 3 + r for r in (0, 1)}


def steps_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranks")
    script = d / "train.py"
    script.write_text(SCRIPT)
    out = d / "out"
    p = memalloc_run("--backend", "host", "--steps", "--leaks", "--out", str(out), str(script), ranks=2, timeout=150)
    assert p.returncode == 0, p.stderr[-3000:]
    return out, p


def test_each_rank_writes_its_own_files(job):
    out, p = job
    for name in ("steps.csv", "steps.json", "leaks.json", "leaks.html", "index.html"):
        assert not (out / name).exists(), name  # nothing shared that a rank could overwrite
        for r in (0, 1):
            assert (out / f"rank{r}" / name).is_file(), (r, name)
    for r in (0, 1):
        rows = steps_csv(out / f"rank{r}" / "steps.csv")
        doc = json.loads((out / f"rank{r}" / "steps.json").read_text())
        assert [int(row["step"]) for row in rows] == list(range(1, STEPS[r] + 1)), (r, rows)
        assert [row["step"] for row in doc["rows"]] == list(range(1, STEPS[r] + 1))
        assert "wrote steps.csv and steps.json" in p.stderr and f"to {out / f'rank{r}'}" in p.stderr, p.stderr
    for r in (0, 1):  # each rank's page: its own steps, its rank, its held tensor at the script's line
        page = (out / f"rank{r}" / "index.html").read_text()
        data = json.loads(re.search(r'id="run-data">(.*?)</script>', page, re.S).group(1))
        assert (data["process"]["rank"], data["process"]["world_size"]) == (r, 2)
        assert [s["step"] for s in data["steps"]] == list(range(1, STEPS[r] + 1))
        held = [n["bytes"] for n in data["flame"]["tree"]["children"] if n["line"] == HELD_LINE]
        assert held == [HELD[r]], data["flame"]["tree"]["children"]
    # the same loop on both ranks: what differs at the last step is the tensor each rank holds
    last = {r: int(steps_csv(out / f"rank{r}" / "steps.csv")[-1]["allocated"]) for r in (0, 1)}
    assert last[1] - last[0] == HELD[1] - HELD[0], last


def test_report_merges_the_ranks_of_a_clean_job(job):
    out, p = job
    files = [ff.read(f) for f in ff.files_in(out / "flight")]
    assert sorted((f.rank, f.world_size, f.state) for f in files) == [(0, 2, "exited"), (1, 2, "exited")]
    assert sorted((f.rank, f.step) for f in files) == [(r, STEPS[r]) for r in (0, 1)]
    r = memalloc_cli("report", str(out))  # the --out folder itself: its flight folder is found
    assert r.returncode == 0, r.stderr
    assert "2 rank(s)" in r.stdout and "rank 0 (pid" in r.stdout and "rank 1 (pid" in r.stdout, r.stdout
    # the job's page links each rank's run page, relative to where the job page is written
    page = out / "pages" / "job.html"
    page.parent.mkdir(exist_ok=True)
    r = memalloc_cli("report", str(out), "--html", str(page))
    assert r.returncode == 0, r.stderr
    links = dict(re.findall(r'<tr data-rank="(\d)".*?<a href="([^"]+)">its page</a>', page.read_text()))
    assert links == {str(k): f"../rank{k}/index.html" for k in (0, 1)}, links
    assert all(
        (page.parent / link).resolve() == (out / f"rank{k}" / "index.html").resolve() for k, link in links.items()
    )


def test_diff_takes_a_rank_of_a_job(job):
    """diff of a job's folder needs --rank; rank 0's file against the job's
    rank 1 names the one planted difference: the tensor each rank holds at
    HELD_LINE, 64 KiB more on rank 1."""
    out, _ = job
    p = memalloc_cli("diff", str(out), str(out))
    assert p.returncode != 0 and "--rank N" in p.stderr and "rank 0, rank 1" in p.stderr, p.stderr
    (rank0,) = [f for f in ff.files_in(out / "flight") if ff.read(f).rank == 0]
    p = memalloc_cli("diff", rank0, str(out), "--rank", "1", "--json")
    assert p.returncode == 0, p.stderr
    peak = json.loads(p.stdout)["peak"]
    assert [(r["site"]["line"], r["delta"]) for r in peak] == [(HELD_LINE, HELD[1] - HELD[0])], peak
    p = memalloc_cli("diff", str(out), str(out), "--rank", "2")
    assert p.returncode != 0 and "0 flight files of rank 2" in p.stderr, p.stderr


def test_a_single_clean_process_keeps_its_paths_and_report_says_why_no_flight_files(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, memalloc\nkept = []\nfor step in range(4):\n"
        "    kept.append(torch.ones(1024))\n    memalloc.step()\n"
    )
    out = tmp_path / "out"
    p = memalloc_run("--backend", "host", "--steps", "--leaks", "--out", str(out), str(script), timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(steps_csv(out / "steps.csv")) == 4 and (out / "leaks.json").is_file()
    assert not list(out.glob("rank*")) and not (out / "flight").exists()
    r = memalloc_cli("report", str(out))
    assert r.returncode != 0
    assert "ends cleanly in a single process" in r.stderr and "flight_recorder_keep:True" in r.stderr, r.stderr
    assert "was the job run with" not in r.stderr  # the configuration is not to blame
    assert f"python -m memalloc report {out / 'leaks.json'}" in r.stderr, r.stderr
