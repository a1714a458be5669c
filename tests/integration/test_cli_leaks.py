"""Leak reports from the command line and from pytest:
``python -m memalloc run --leaks`` on unmodified scripts (boundaries from
optimizer.step()), the report written at normal exit, on an exception and
on SIGTERM; ``python -m memalloc report``; the pytest fixture
(memalloc.pytest_plugin) failing a leaking test and passing a clean one."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

import memalloc

LEAKY = textwrap.dedent("""
    import os, signal, sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 32), torch.randn(8, 1)
    history = []
    for step in range(16):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss)  # the leak
    ending = sys.argv[1] if len(sys.argv) > 1 else "normal"
    if ending == "raise":
        raise RuntimeError("the script failed")
    if ending == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
""")


@pytest.fixture
def run(fresh_python):
    """run(*args, cwd): ``python -m memalloc <args>`` in a fresh interpreter (tests/conftest.py)."""
    return lambda *args, cwd: fresh_python.run(["-m", "memalloc", *args], cwd=cwd)


def leak_line() -> int:
    return next(i for i, l in enumerate(LEAKY.splitlines(), 1) if l.endswith("# the leak"))


# the slow tier (CI runs it, `-m slow`): a script under `run --leaks` per way of ending (~5 s each); the real-paths
# matrix runs it too, over the README's fast-tier budget of 180 s on CI's 2 cores
@pytest.mark.slow
@pytest.mark.parametrize("ending,rc", [("normal", 0), ("raise", 1), ("sigterm", 128 + 15)])
def test_run_leaks_reports_the_line_at_any_exit(tmp_path, ending, rc, run):
    script = tmp_path / "train.py"
    script.write_text(LEAKY)
    out = tmp_path / "report"
    p = run(
        "run",
        "--leaks",
        "--backend",
        "host",
        "--config",
        "host_capacity_mb:256",
        "--out",
        str(out),
        str(script),
        ending,
        cwd=tmp_path,
    )
    assert p.returncode == rc, p.stderr[-3000:]
    assert f"{script}:{leak_line()} in <module>: +512 B per step" in p.stderr, p.stderr[-3000:]
    report = json.loads((out / "leaks.json").read_text())
    assert report["schema"] == "memalloc.leak_report/1"
    assert len(report["steps"]) == 16  # one boundary per optimizer.step()
    (leak,) = report["leaks"]
    assert (leak["site"]["line"], leak["holder"]["name"], leak["cause"]) == (
        leak_line(),
        "history",
        "graph_in_container",
    )
    assert leak["bytes_per_step"] == pytest.approx(512)
    html = (out / "leaks.html").read_text()
    assert "history.append(loss)" in html and 'id="leak-0"' in html
    if ending == "raise":
        assert "RuntimeError: the script failed" in p.stderr


@pytest.mark.slow  # a script under `run --steps` (~5 s)
def test_run_steps_writes_one_row_per_optimizer_step(tmp_path, run):
    script = tmp_path / "train.py"
    script.write_text(LEAKY)
    p = run("run", "--steps", "--backend", "host", "--out", "r", str(script), cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "memalloc: 16 steps recorded; wrote steps.csv and steps.json" in p.stderr
    doc = json.loads((tmp_path / "r" / "steps.json").read_text())
    rows = doc["rows"]
    assert [r["step"] for r in rows] == list(range(1, 17))
    # the kept loss tensors: allocated grows by exactly 512 B per step after the first
    grown = [b["allocated"] - a["allocated"] for a, b in zip(rows[1:], rows[2:])]
    assert grown == [512] * 14
    assert all(r["peak_allocated"] >= r["allocated"] for r in rows)
    csv_lines = (tmp_path / "r" / "steps.csv").read_text().splitlines()
    assert len(csv_lines) == 17 and csv_lines[0].startswith("step,")
    assert "leak" not in p.stderr  # --leaks was not asked for


def test_leak_check_answers_like_its_report():
    """In this process: leak_check on an allocator the test owns, torch's CPU tensors routed to it."""
    a = memalloc.Allocator("host", "host_capacity_mb:64")
    check = memalloc.leak_check(allocator=a)
    with pytest.raises(RuntimeError) as early:
        _ = check.leaks
    kept = []
    with memalloc.host.cpu_tensors_from(a):
        with check:
            for _ in range(8):
                kept.append(torch.ones(128))
                memalloc.step()
    assert "made when the `with memalloc.leak_check()` block ends" in str(early.value)
    assert len(check.leaks) == 1 and check.leaks is check.report.leaks
    assert check.to_text() == check.report.to_text()
    assert json.loads(check.to_json())["leaks"][0]["bytes_per_step"] == 512
    del kept


def test_report_renders_a_saved_leak_report_and_rejects_other_files(tmp_path, run, memalloc_cli_here):
    script = tmp_path / "train.py"
    script.write_text(LEAKY)
    assert run("run", "--leaks", "--backend", "host", "--out", "r", str(script), cwd=tmp_path).returncode == 0
    p = memalloc_cli_here("report", "r/leaks.json", "--html", "again.html", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"train.py:{leak_line()} in <module>" in p.stdout and "held by list `history`" in p.stdout
    assert (tmp_path / "again.html").read_text().startswith("<!DOCTYPE html>")
    (tmp_path / "junk.json").write_text('{"schema": "something else"}')
    p = memalloc_cli_here("report", "junk.json", cwd=tmp_path)
    assert p.returncode != 0 and "is not a leak report" in p.stderr
    p = memalloc_cli_here("report", "nothing-here.json", cwd=tmp_path)
    assert p.returncode != 0 and "no such file" in p.stderr


PYTEST_FILE = textwrap.dedent("""
    import pytest, torch
    import memalloc
    pytest_plugins = ["memalloc.pytest_plugin"]

    @pytest.fixture(scope="session", autouse=True)
    def allocator():
        memalloc.enable(backend="host", config="host_capacity_mb:128")
        memalloc.host.use_for_cpu_tensors()

    def test_clean(memalloc_leaks):
        with memalloc_leaks():
            for _ in range(10):
                t = torch.ones(256) * 2
                memalloc.step()

    def test_leaky(memalloc_leaks):
        kept = []
        with memalloc_leaks(max_bytes_per_step=100):
            for _ in range(10):
                t = torch.ones(256) * 2
                kept.append(t)  # KEPT
                memalloc.step()
""")


@pytest.mark.slow  # pytest in a fresh process (~5 s)
def test_pytest_fixture_fails_the_leaking_test_only(tmp_path, fresh_python):
    (tmp_path / "test_loop.py").write_text(PYTEST_FILE)
    p = fresh_python.run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_loop.py"], cwd=tmp_path)
    assert "1 failed, 1 passed" in p.stdout, p.stdout[-3000:]
    assert "LeakError: the loop leaks 1.00 KiB per step (allowed: 100 B)" in p.stdout
    line = next(i for i, l in enumerate(PYTEST_FILE.splitlines(), 1) if l.endswith("# KEPT"))
    assert f"test_loop.py:{line} in test_leaky" in p.stdout and "held by list `kept`" in p.stdout


def test_report_summarises_a_saved_trace(tmp_path, fresh_python, memalloc_cli_here):
    script = tmp_path / "record.py"
    script.write_text(
        textwrap.dedent("""
        import memalloc, torch
        memalloc.enable(backend="host", config="host_capacity_mb:64")
        memalloc.host.use_for_cpu_tensors()
        memalloc.record_history(max_entries=1000, stacks="python")
        kept = [torch.empty(1 << 20, dtype=torch.uint8) for _ in range(3)]  # KEEPS 3 MiB
        for _ in range(5):
            t = torch.empty(4096, dtype=torch.uint8)
            del t
        memalloc.save_trace("run.mtrace")
    """)
    )
    p = fresh_python.run([str(script)], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    p = memalloc_cli_here("report", "run.mtrace", "--top", "1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("device 0: ") and lines[0].endswith("events, 0 dropped")
    counts = {l.split()[0]: int(l.split()[1]) for l in lines[1:] if l.startswith("  ") and len(l.split()) == 2}
    assert counts["alloc"] == 8 and counts["free_requested"] == 5
    line = next(i for i, l in enumerate(script.read_text().splitlines(), 1) if l.endswith("# KEEPS 3 MiB"))
    assert lines[-1].strip().startswith("3.00 MiB") and f"record.py:{line} in" in lines[-1]
    p = memalloc_cli_here("report", "run.mtrace", "--html", "x.html", cwd=tmp_path)
    assert p.returncode != 0 and "--html renders leak reports" in p.stderr
