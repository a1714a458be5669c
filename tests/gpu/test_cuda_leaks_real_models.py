"""The leak corpus on CUDA (pytest -m gpu; skipped without a GPU): every
case of tests/leak_cases/real_models.py (transformers GPT-2, BERT, T5, the
clean loops, GPT-2 under torch.compile with inductor) and of
tests/leak_cases/vision_models.py (torchvision ResNet-18, timm ViT, image and
batch sizes varying) run on the GPU under memalloc.enable(), in one fresh
process, and judged by the host suite's rules (real_models.check_leak):
the keeping line and holder named, the tensor count exact, bytes per step
and retained bytes within 10% of the truth the case computed from what it
kept, the hint true; no leak in a clean loop. The table of reported
against true figures goes to $MEMALLOC_GPU_ARTIFACTS/leak-table-cuda.md.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from test_cuda import record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REPO = pathlib.Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "leak_cases"
sys.path.insert(0, str(CASES))
import real_models  # noqa: E402
import vision_models  # noqa: E402

SCRIPT = f"""
import dataclasses, gc, json, sys
sys.path.insert(0, {str(CASES)!r})
import torch, memalloc
memalloc.enable(backend="cuda")
import real_models, vision_models
real_models.DEVICE = "cuda"
real_models.COMPILE_BACKEND = "inductor"
a = memalloc.installed_allocator()
out = {{}}
cases = (real_models.LEAKS + real_models.CLEAN + real_models.COMPILED + vision_models.LEAKS + vision_models.CLEAN)
for fn in cases:
    check, truth = fn(allocator=a)
    out[fn.__name__] = [check.report.to_dict(), check.report.to_text(),
                        {{k: dataclasses.asdict(v) for k, v in truth.items()}}]
    del check
    gc.collect()
a.validate()
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MEMALLOC_CONF", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    raw = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT ") :])
    out = {
        case: (report, text, {k: real_models.Truth(**v) for k, v in truth.items()})
        for case, (report, text, truth) in raw.items()
    }
    table = real_models.figures_table(out)
    artifacts = os.environ.get("MEMALLOC_GPU_ARTIFACTS")
    if artifacts:
        pathlib.Path(artifacts, "leak-table-cuda.md").write_text(table)
    for case, (report, _text, truth) in out.items():
        record(
            "leak_corpus",
            case,
            {
                "leaks": [
                    {k: l[k] for k in ("bytes_per_step", "retained_bytes", "retained_tensors", "cause")}
                    | {"holder": (l["holder"] or {}).get("name")}
                    for l in report["leaks"]
                ],
                "truth": {k: {"bytes": t.bytes, "tensors": t.tensors, "steps": t.steps} for k, t in truth.items()},
            },
        )
    return out


@pytest.mark.parametrize("case", sorted(real_models.CAUSES))
def test_transformers_leak_on_cuda(runs, case):
    real_models.check_leak(case, *runs[case])


@pytest.mark.parametrize("case", sorted(vision_models.CAUSES))
def test_vision_leak_on_cuda(runs, case):
    real_models.check_leak(
        case,
        *runs[case],
        cases=vision_models.CAUSES,
        graph_cases=vision_models.GRAPH_CASES,
        cases_file=vision_models.__file__,
    )


@pytest.mark.parametrize("case", [fn.__name__ for fn in real_models.CLEAN + real_models.COMPILED + vision_models.CLEAN])
def test_clean_loop_on_cuda_reports_no_leak(runs, case):
    report, text, _ = runs[case]
    assert report["leaks"] == [], text
