"""The libraries people train with, under ``memalloc.enable()`` on the host
backend: transformers models built from configs (GPT-2, Llama with tied
embeddings, BERT's masked-LM head, T5: every one ties weights), HF Trainer,
Lightning's Trainer and an accelerate loop train a few steps natively and
under memalloc, each mode in one fresh interpreter (tests/libraries/cases.py),
and must give the same losses. The same cases plus timm and torchvision run
on CUDA in tests/gpu/test_cuda_libraries.py.

Without transformers, lightning and accelerate installed the suite is
skipped, except where ``MEMALLOC_REQUIRE_LIBRARIES=1`` (CI, which installs
them) makes that a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from memtest_helpers import REPO

CASES_SCRIPT = REPO / "tests" / "libraries" / "cases.py"
LIBRARIES = ("transformers", "lightning", "accelerate")
CASES = ("gpt2", "llama", "bert_mlm", "t5", "hf_trainer", "lightning_trainer", "accelerate")

_missing = [m for m in LIBRARIES if importlib.util.find_spec(m) is None]
if _missing and os.environ.get("MEMALLOC_REQUIRE_LIBRARIES") == "1":
    raise RuntimeError(
        f"MEMALLOC_REQUIRE_LIBRARIES=1 but {', '.join(_missing)} not installed: pip install {' '.join(LIBRARIES)}"
    )
# the slow tier (CI runs it, `-m slow`): seven library loops, native and memalloc side by side (~30 s), over the
# README's fast-tier budget of 180 s on CI's 2 cores
pytestmark = [pytest.mark.skipif(bool(_missing), reason=f"not installed: {', '.join(_missing)}"), pytest.mark.slow]


def _result(p) -> dict:
    out, err = p.communicate(timeout=600)
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    assert p.returncode == 0 and len(lines) == 1, f"rc={p.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    return json.loads(lines[0][len("RESULT ") :])


@pytest.fixture(scope="module")
def runs(fresh_python) -> dict:
    """Both modes, side by side: {"native": results, "memalloc": results}."""
    procs = {
        mode: fresh_python.start([str(CASES_SCRIPT), "--mode", mode, "--device", "cpu"])
        for mode in ("native", "memalloc")
    }
    return {mode: _result(p) for mode, p in procs.items()}


@pytest.mark.parametrize("case", CASES)
def test_same_losses_as_native(runs, case):
    native, ours = runs["native"][case], runs["memalloc"][case]
    assert "error" not in native, f"the case itself fails natively:\n{native['error']}"
    assert "error" not in ours, f"{case} fails under memalloc.enable():\n{ours['error']}"
    assert len(native["losses"]) >= 3
    # Same CPU kernels on the same inputs: the host backend changes where the
    # bytes live, never what is computed.
    assert ours["losses"] == native["losses"]


def test_memalloc_held_the_models_memory_and_no_hook_failed(runs):
    seen = runs["memalloc"]["memalloc"]
    assert seen["hook_failures"] == {}, f"hooks turned off: {seen['hook_failures']}"
    assert seen["allocations"] > 1000  # every case's tensors came from memalloc
    assert seen["peak_allocated"] > 64 * 256 * 4  # at least one embedding table
