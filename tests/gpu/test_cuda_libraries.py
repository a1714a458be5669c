"""The libraries suite on CUDA (pytest -m gpu): tests/libraries/cases.py's
transformers models (GPT-2, Llama, BERT MLM, T5), HF Trainer, Lightning,
accelerate, and torchvision's ResNet-18 and timm's ViT (GPU only: the
index's torchvision needs a CUDA torch), trained natively and under
``memalloc.enable()``, each mode in one fresh interpreter, side by side.
Losses must match native's (deterministic algorithms on; 1e-5 relative for
the last bits of a reduction whose order follows the workspace).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from test_cuda import record

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CASES_PY = os.path.join(REPO, "tests", "libraries", "cases.py")
CASES = (
    "gpt2",
    "llama",
    "bert_mlm",
    "t5",
    "hf_trainer",
    "lightning_trainer",
    "accelerate",
    "torchvision_resnet18",
    "timm_vit",
)


def _run(mode: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    env.pop("MEMALLOC_CONF", None)
    return subprocess.Popen(
        [sys.executable, CASES_PY, "--mode", mode, "--device", "cuda"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def runs() -> dict:
    procs = {m: _run(m) for m in ("native", "memalloc")}
    out = {}
    for mode, p in procs.items():
        stdout, stderr = p.communicate(timeout=900)
        lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
        assert p.returncode == 0 and len(lines) == 1, f"{mode}: rc={p.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
        out[mode] = json.loads(lines[0][len("RESULT ") :])
        record("libraries", mode, out[mode])
    return out


@pytest.mark.parametrize("case", CASES)
def test_same_losses_as_native_on_cuda(runs, case):
    native, ours = runs["native"][case], runs["memalloc"][case]
    assert "error" not in native, f"the case fails natively:\n{native['error']}"
    assert "error" not in ours, f"{case} fails under memalloc.enable():\n{ours['error']}"
    assert len(ours["losses"]) == len(native["losses"]) >= 3
    for a, b in zip(ours["losses"], native["losses"]):
        assert math.isfinite(a) and abs(a - b) <= 1e-5 * max(1.0, abs(b)), (ours["losses"], native["losses"])


def test_no_hook_failed_and_memalloc_held_the_memory(runs):
    seen = runs["memalloc"]["memalloc"]
    assert seen["hook_failures"] == {}
    assert seen["allocations"] > 1000 and seen["peak_allocated"] > 1 << 20
