"""The breakdown by category on CUDA (pytest -m gpu; skipped without a GPU):
the host test's model (tests/unit/test_breakdown.py model_script) trained on the
GPU under memalloc, eagerly and with the model under torch.compile, in fresh
processes: parameters, gradients and Adam's state to the byte, activations
before backward equal to what autograd saved plus the loss (eager), the
step's peak split adding up to max_memory_allocated, the step tracker's
rows carrying it. The examples/ scripts run on the GPU through
benchmarks/fit/strategies.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from breakdown_cases import check_model_run, model_script
from test_cuda import record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_model(compiled: bool, closure: bool = False) -> dict:
    src = "import json\nR = {}\n" + model_script("cuda", closure=closure) + '\nprint("RESULT", json.dumps(R))\n'
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("MEMALLOC_CONF", None)
    if compiled:
        env["COMPILE"] = "1"
    p = subprocess.run([sys.executable, "-c", src], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    R = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT ") :])
    record(
        "breakdown_model",
        ("compiled" if compiled else "eager") + ("_closure" if closure else ""),
        {
            "steps": [
                {k: s[k] for k in ("peak", "params", "grads", "state", "expected_activations")} for s in R["steps"]
            ]
        },
    )
    return R


# cuBLAS workspaces (32 MiB each on Hopper; one per handle and stream) are
# "other": made before the first step ends, never freed.
WORKSPACES = 4 * 32 * MiB


def test_breakdown_of_a_model_trained_on_the_gpu():
    check_model_run(run_model(compiled=False), workspaces=WORKSPACES)


def test_breakdown_when_the_optimizer_runs_the_closure():
    """opt.step(closure), as LBFGS and Lightning's automatic optimization
    call it: the same checks, Adam's state to the byte (issue 37)."""
    check_model_run(run_model(compiled=False, closure=True), workspaces=WORKSPACES)


def test_breakdown_with_the_model_under_torch_compile():
    R = run_model(compiled=True)
    check_model_run(R, compiled=True, workspaces=WORKSPACES)
    assert all(s["loss_value"] == s["loss_value"] for s in R["steps"])  # not NaN
