"""``memalloc run --fit``'s probes (memalloc/cli/fit.py) in fresh
interpreters on the host backend: a probe's process records as
memalloc.largest_batch's probes do (planner.ProbeRecording, step ends
included), and a budget larger than the device is refused before the
script runs in any probe."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from memtest_helpers import REPO

from memalloc.cli import fit
from memalloc.features import planner

SCRIPT = textwrap.dedent("""
    import argparse, pathlib, sys, torch
    from torch import nn
    pathlib.Path(sys.argv[0] + ".ran").touch()  # the script ran (in a probe or the planned run)
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(5):
        x, y = torch.randn(args.batch_size, 64), torch.randint(0, 10, (args.batch_size,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
""")
HOST = ["--backend", "host", "--config", "host_capacity_mb:64"]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def probe_argv(script: Path, batch: int, out: Path, folder: Path, steps: int = 2) -> list[str]:
    """A probe's command line, as memalloc/cli/run.py's _fit_first makes it."""
    return [
        "-m",
        "memalloc",
        "run",
        *HOST,
        "--no-flight-recorder",
        "--out",
        str(folder),
        "--fit-probe-out",
        str(out),
        "--fit-probe-batch",
        str(batch),
        "--fit-steps",
        str(steps),
        str(script),
        "--batch-size",
        str(batch),
    ]


@pytest.mark.slow  # fresh processes: 2-14 s on 2 shared cores
def test_a_probe_process_notes_where_its_steps_end(fresh_python, script, tmp_path):
    """Issue 37: run --fit's probes did not call ProbeRecording.step_ended()
    as memalloc.largest_batch's do, so their records had no step_allocs and
    the replay guessed the step it repeats from the allocation sites. Now
    the child notes each optimizer.step() as a step's end: 1 + --fit-steps
    of them, the last the record's own count of allocations, the repeated
    steps (after the first, which makes the optimizer state) alike."""
    out = tmp_path / "probe.json"
    p = fresh_python.run(probe_argv(script, 4, out, tmp_path / "r"))
    assert p.returncode == 0, p.stderr[-3000:]
    (record,) = planner.load_records(str(out))
    assert record.batch == 4 and len(record.step_allocs) == 3
    assert record.step_allocs[-1] == sum(op[0] == "alloc" for op in record.ops)
    first, second, third = (b - a for a, b in zip((0, *record.step_allocs), record.step_allocs))
    assert second == third < first
    assert planner._step_starts(record) == [0, *record.step_allocs[:-1]]


@pytest.mark.slow
def test_a_probe_process_refuses_a_budget_larger_than_its_device_before_the_script_runs(fresh_python, script, tmp_path):
    """Issue 37, item 5: ``run --fit 20GB`` on a smaller device was refused
    only after every probe had run the script. The budget goes to each
    probe's process (fit.BUDGET_ENV), which checks it against its device
    (planner.check_budget, the parent's check) before the script starts."""
    out = tmp_path / "probe.json"
    env = fresh_python.env(**{fit.BUDGET_ENV: str(20 * 10**9)})
    p = fresh_python.run(probe_argv(script, 2, out, tmp_path / "r"), env=env)
    assert p.returncode == fit.REFUSED, (p.returncode, p.stderr[-3000:])
    assert (
        "memalloc: budget 18.63 GiB (20000000000 bytes) is larger than device 0's 64.00 MiB: give a budget of "
        f"at most 64.00 MiB ({64 << 20} bytes), or --fit free to use what is free"
    ) in p.stderr
    assert not out.exists() and not Path(str(script) + ".ran").exists()
    env = fresh_python.env(**{fit.BUDGET_ENV: str(64 << 20)})  # the whole device is a budget
    p = fresh_python.run(probe_argv(script, 2, out, tmp_path / "r", steps=1), env=env)
    assert p.returncode == 0 and out.exists(), p.stderr[-3000:]


@pytest.mark.slow
def test_run_probes_stops_at_the_first_probes_refusal(script, tmp_path, capsys):
    """fit.run_probes with a budget: the first probe's process refuses it,
    no other probe starts, the script never runs, and the message is the
    child's (SystemExit)."""
    started = []

    def argv_for(batch: int, out: str, folder: str) -> list[str]:
        started.append(batch)
        return [sys.executable, *probe_argv(script, batch, Path(out), Path(folder))]

    with pytest.raises(
        SystemExit,
        match=r"^memalloc: budget 18\.63 GiB \(20000000000 bytes\) is larger than "
        r"device 0's 64\.00 MiB",
    ):
        fit.run_probes(argv_for, (2, 4, 8), budget=20 * 10**9)
    assert started == [2] and not Path(str(script) + ".ran").exists()


@pytest.mark.slow
def test_run_fit_refuses_a_budget_larger_than_the_device_before_any_probe(fresh_python, script, tmp_path):
    """Issue 37, item 5, through the CLI: ``run --fit 20GB`` on a 64 MiB
    device says so before the script runs in a probe."""
    p = fresh_python.run(
        [
            "-m",
            "memalloc",
            "run",
            *HOST,
            "--fit",
            "20GB",
            "--out",
            str(tmp_path / "r"),
            str(script),
            "--batch-size",
            "{batch}",
        ],
        cwd=REPO,
    )
    assert p.returncode != 0
    assert "is larger than device 0's 64.00 MiB" in p.stderr, p.stderr[-3000:]
    assert "probing batch 4" not in p.stderr and not Path(str(script) + ".ran").exists()
