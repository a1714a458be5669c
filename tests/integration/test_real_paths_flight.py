"""The flight recorder on the paths users walk (issue 37, item 2), on the
host backend: a plain training script that never imports memalloc, run by
``python -m memalloc run --out D`` with no other flag, and a script that
calls ``memalloc.enable()`` under ``MEMALLOC_CONF=flight_recorder:DIR`` but
never ``memalloc.step()``. Each SIGKILLs itself after its 7th
``optimizer.step()``; the file it leaves must hold the step it reached and
``postmortem`` must name the line that kept memory with the bytes the test
computes (7 tensors of 256 KiB kept in a list)."""

from __future__ import annotations

import sys

import pytest
from memtest_helpers import REPO

from memalloc.trace import flight_files as ff

sys.path.insert(0, str(REPO / "tests" / "recording_cases"))
from flight_checks import env, memalloc_cli  # noqa: E402

# the slow tier (CI runs it, `-m slow`): two training scripts killed in fresh processes (~17 s), over the README's
# fast-tier budget of 180 s on CI's 2 cores
pytestmark = pytest.mark.slow

KEPT_BYTES = 65536 * 4  # one float32 tensor of 65,536 elements kept per step
STEPS_BEFORE_KILL = 7

LOOP = """
import os, signal, torch
torch.manual_seed(0)
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for step in range(20):
    loss = model(torch.randn(64, 256)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    kept.append(torch.ones(65536))  # KEEP-LINE
    if step == 6:
        os.kill(os.getpid(), signal.SIGKILL)
"""

ENABLED = (
    """
import memalloc
memalloc.enable(backend="host")
memalloc.host.use_for_cpu_tensors()
"""
    + LOOP
)


def _keep_line(source: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if "KEEP-LINE" in line)


def _check(flight_dir, script, source: str) -> None:
    (path,) = ff.files_in(flight_dir)
    f = ff.read(path)
    assert f.state == "running" and f.step == STEPS_BEFORE_KILL, (f.state, f.step)
    p = memalloc_cli("postmortem", str(flight_dir))
    assert p.returncode == 0, p.stderr
    first_site = p.stdout.split("live memory at the end by line")[1].splitlines()[1]
    from memalloc.core._format import fmt_bytes

    held = fmt_bytes(STEPS_BEFORE_KILL * KEPT_BYTES)
    assert f"{script.name}:{_keep_line(source)} in <module>" in first_site, p.stdout
    assert f"{held} in {STEPS_BEFORE_KILL} blocks" in first_site, p.stdout


def test_a_plain_run_with_no_flag_records_a_cpu_script(tmp_path):
    import subprocess

    script = tmp_path / "train.py"
    script.write_text(LOOP)
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "memalloc", "run", "--backend", "host", "--out", str(out), str(script)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == -9, (p.returncode, p.stderr)
    _check(out / "flight", script, LOOP)


def test_enable_with_a_flight_recorder_and_no_step_call_beats_at_each_optimizer_step(tmp_path):
    import subprocess

    script = tmp_path / "train.py"
    script.write_text(ENABLED)
    flight_dir = tmp_path / "flight"
    p = subprocess.run(
        [sys.executable, str(script)],
        env=dict(env(), MEMALLOC_CONF=f"flight_recorder:{flight_dir}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == -9, (p.returncode, p.stderr)
    _check(flight_dir, script, ENABLED)
