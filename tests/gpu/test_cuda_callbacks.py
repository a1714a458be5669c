"""The framework callbacks on CUDA (pytest -m gpu): tests/callback_cases/'s
Lightning (automatic and manual optimization, CSVLogger) and HF Trainer runs
under ``memalloc.enable()`` on the GPU; the figures logged at every step
equal ``torch.cuda``'s queries and the optimizer's state tensors that the
cases' own callbacks read at the same moment, and the planted leak is
warned with its line; the run page in the logger's folder holds those figures
per step and the parameters at the peak (memtest_helpers.check_run_page). The
host-backend versions: tests/integration/test_callbacks.py.
"""

from __future__ import annotations

import csv
import os

import pytest
import torch
from memtest_helpers import check_run_page, run_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = os.path.join(REPO, "tests", "callback_cases")
FIGURES = ("allocated", "reserved", "peak_allocated", "peak_reserved")


def _run(tmp_path, script: str, *args: str) -> dict:
    return run_case(os.path.join(CASES, script), str(tmp_path / "out"), *args, cwd=tmp_path)


def _check(logged: dict, truth: dict) -> None:
    assert sorted(logged) == sorted(int(s) for s in truth) and len(logged) == 12
    for step, figures in logged.items():
        t = truth[str(step)]
        for f in FIGURES:
            assert figures[f"memalloc/{f}_bytes"] == t[f], (step, f, figures, t)
        if step > min(logged):
            assert figures["memalloc/breakdown/optimizer_state_bytes"] == t["optimizer_state"] > 0, (step, figures, t)


@pytest.mark.parametrize("mode", ["automatic", "manual"])
def test_lightning_memory_monitor_on_cuda(tmp_path, mode):
    pytest.importorskip("lightning")
    r = _run(tmp_path, "lightning_case.py", mode, "csv", "leak", "cuda")
    with open(os.path.join(r["log_dir"], "metrics.csv"), newline="") as f:
        logged = {
            int(row["step"]): {k: int(float(v)) for k, v in row.items() if k.startswith("memalloc/")}
            for row in csv.DictReader(f)
            if row.get("memalloc/allocated_bytes")
        }
    _check(logged, r["truth"])
    assert len(r["warnings"]) == 1 and f"lightning_case.py:{r['lines']['# LEAK-LINE']} " in r["warnings"][0]
    page = check_run_page(r, r["log_dir"], "lightning_case.py")
    assert page["process"]["backend"] == "cuda"


def test_transformers_memory_callback_on_cuda(tmp_path):
    pytest.importorskip("transformers")
    r = _run(tmp_path, "hf_case.py", "none", "leak", "cuda")
    logged = {l["step"]: l for l in r["logs"] if "loss" in l}
    _check(logged, r["truth"])
    assert len(r["warnings"]) == 1 and f"hf_case.py:{r['lines']['# LEAK-LINE']} " in r["warnings"][0]
    page = check_run_page(r, str(tmp_path / "out"), "hf_case.py")
    assert page["process"]["backend"] == "cuda"
