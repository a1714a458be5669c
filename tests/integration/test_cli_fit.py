"""``python -m memalloc run --fit BUDGET script.py --batch-size {batch}``
(memalloc/cli/fit.py) on the host backend, in fresh interpreters: the batch
it plans for a CPU training script trains under the budget, and a batch 5%
larger runs out of memory (each checked by running the script at it under
``memalloc run --steps``, whose CPU tensors come from the simulated device);
bad arguments and a script too short for a probe say what to do."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from memtest_helpers import REPO

from memalloc.cli import fit
from memalloc.features import planner

SCRIPT = textwrap.dedent("""
    import argparse, torch
    from torch import nn
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(32 * 8 * 8, 10))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(args.steps):
        x, y = torch.randn(args.batch_size, 3, 32, 32), torch.randint(0, 10, (args.batch_size,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print("trained batch", args.batch_size)
""")
HOST = ("--backend", "host", "--config", "host_capacity_mb:64")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def cli(fresh_python):
    def run(*args: str, cwd: Path | None = None):
        return fresh_python.run(["-m", "memalloc", *args], cwd=cwd or REPO, timeout=300)

    return run


def trains(cli, script: Path, batch: int, out: Path) -> bool:
    p = cli("run", *HOST, "--steps", "--out", str(out), str(script), "--batch-size", str(batch))
    assert p.returncode == 0 or "OutOfMemoryError" in p.stderr, p.stderr[-3000:]
    return p.returncode == 0 and f"trained batch {batch}" in p.stdout


@pytest.mark.slow
def test_the_planned_batch_trains_and_five_percent_more_does_not(cli, script, tmp_path):
    p = cli("run", *HOST, "--fit", "64MiB", "--out", str(tmp_path / "r"), str(script), "--batch-size", "{batch}")
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"largest batch that fits 64\.00 MiB: (\d+); predicted peak reserved", p.stderr)
    assert m, p.stderr[-3000:]
    batch = int(m.group(1))
    # the plan is far above the probes: one more probe at half the first plan (planner.refinement), in the plan
    probed = [int(b) for b in re.findall(r"memalloc: probing batch (\d+) \.\.\.", p.stderr)]
    assert probed[:3] == [2, 4, 8] and len(probed) == 4 and probed[3] > 16, p.stderr[-3000:]
    assert f", {probed[3]}: " in p.stderr
    assert f"running {script} --batch-size {batch}" in p.stderr
    assert f"trained batch {batch}" in p.stdout  # the script ran at the planned batch, under the budget
    assert "0 OOMs" in p.stderr
    assert trains(cli, script, batch, tmp_path / "a")
    assert not trains(cli, script, int(batch * 1.05) + 1, tmp_path / "b")


@pytest.mark.slow
def test_fit_only_prints_the_plan_and_stops(cli, script, tmp_path):
    p = cli(
        "run",
        *HOST,
        "--fit",
        "free",
        "--fit-only",
        "--fit-probes",
        "2,4",
        "--fit-steps",
        "1",
        "--out",
        str(tmp_path / "r"),
        str(script),
        "--batch-size",
        "{batch}",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.search(r"largest batch that fits 64\.00 MiB: \d+", p.stderr)  # 'free': the whole simulated device
    assert "probes (batch: peak allocated / reserved): 2: " in p.stderr and "trained batch" not in p.stdout


@pytest.mark.parametrize(
    "flags,batch_arg,message",
    [
        (("--fit", "7GiB"), "3", r"--fit needs the script's batch size argument written as \{batch\}"),
        (("--fit", "7 parsecs"), "{batch}", r"--fit '7 parsecs': give bytes \(an int\), a number with a unit"),
        (("--fit", "1GiB", "--fit-probes", "4"), "{batch}", r"--fit-probes '4': give two or more different"),
        (("--fit", "1GiB", "--fit-max", "4"), "{batch}", r"--fit-max 4 is below the largest probe \(8\)"),
    ],
)
def test_bad_fit_arguments_say_what_to_give(script, tmp_path, flags, batch_arg, message):
    """In this process: each is refused before anything is enabled or probed."""
    from memalloc.__main__ import main

    with pytest.raises(SystemExit, match=message):
        main(["run", *HOST, *flags, "--out", str(tmp_path / "r"), str(script), "--batch-size", batch_arg])


@pytest.mark.slow
def test_a_script_too_short_for_a_probe_says_so(cli, script, tmp_path):
    p = cli(
        "run",
        *HOST,
        "--fit",
        "64MiB",
        "--fit-probes",
        "2,4",
        "--out",
        str(tmp_path / "r"),
        str(script),
        "--batch-size",
        "{batch}",
        "--steps",
        "2",
    )
    assert p.returncode != 0
    assert "the probe at batch 2 failed" in p.stderr
    assert "ended before optimizer.step() number 3" in p.stderr


@pytest.mark.parametrize(
    "text,expected",
    [
        ("1024", 1024),
        ("7GiB", 7 << 30),
        ("7.5G", int(7.5 * (1 << 30))),
        ("512MiB", 512 << 20),
        ("500MB", 500 * 10**6),
        ("free", None),
    ],
)
def test_budgets_parse_as_bytes(text, expected):
    assert fit.parse_budget(text) == expected


@pytest.mark.parametrize("text", ["1024", "7GiB", "7.5G", "512MiB", "500MB", "20GB", "1.5 gib", "free"])
def test_the_cli_and_largest_batch_read_a_budget_alike(text):
    """One parser (planner.parse_size) for --fit's BUDGET and memalloc.largest_batch's budget."""
    assert fit.parse_budget(text) == planner.parse_size(text)
    if fit.parse_budget(text) is None or fit.parse_budget(text) >= 1 << 20:
        assert planner.as_budget(text) == fit.parse_budget(text)


@pytest.mark.slow
def test_a_budget_larger_than_the_device_is_refused_with_the_most_it_can_give(cli, script, tmp_path):
    """Issue 37: --fit 20GB on a smaller simulated device planned a batch that
    then ran out of memory. Here the device is 64 MiB (HOST): the plan is
    refused, naming the device's capacity and --fit free, and the script
    does not run."""
    p = cli(
        "run",
        *HOST,
        "--fit",
        "20GB",
        "--fit-probes",
        "2,4",
        "--fit-steps",
        "1",
        "--out",
        str(tmp_path / "r"),
        str(script),
        "--batch-size",
        "{batch}",
    )
    assert p.returncode != 0
    assert (
        "memalloc: budget 18.63 GiB (20000000000 bytes) is larger than device 0's 64.00 MiB: give a budget of "
        f"at most 64.00 MiB ({64 << 20} bytes), or --fit free to use what is free"
    ) in p.stderr, p.stderr[-3000:]
    assert "largest batch that fits" not in p.stderr and "trained batch" not in p.stdout
    p = cli(
        "run",
        *HOST,
        "--fit",
        "64MiB",
        "--fit-only",
        "--fit-probes",
        "2,4",
        "--fit-steps",
        "1",
        "--out",
        str(tmp_path / "r2"),
        str(script),
        "--batch-size",
        "{batch}",
    )
    assert p.returncode == 0, p.stderr[-3000:]  # the whole device is a budget
    assert re.search(r"largest batch that fits 64\.00 MiB: \d+", p.stderr)
