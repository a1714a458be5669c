"""The breakdown on real models on CUDA (issue 23; pytest -m gpu, skipped
without a GPU): the host test's runs (tests/breakdown_real_models.py,
checked on the host by tests/integration/test_breakdown_real_models.py) on
the GPU, each model in a fresh process: transformers GPT-2, BERT and T5 from
small configs (tied embeddings), and the issue's torch.nn.TransformerEncoder
(6 layers, 512 wide, fp32, AdamW, zero_grad(set_to_none=False)), a sequence
length per step. Parameters, gradients and optimizer state after each step
within 2% of the distinct storages the model's parameters, their gradients
and AdamW's state hold (AdamW's step counts live on the CPU: not this
device's), activations before backward within 10% of what autograd saved
that the step made, plus the loss. cuBLAS's workspaces are ``other``, a
category not checked here. Every run's figures go to $MEMALLOC_GPU_RESULTS
(test_cuda.record)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from breakdown_real_models import MODELS, STEPS, figures, misses, model_script, table
from test_cuda import record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_model(model: str) -> dict:
    src = "import json\nR = {}\n" + model_script("cuda", model) + '\nprint("RESULT", json.dumps(R))\n'
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("MEMALLOC_CONF", None)
    p = subprocess.run([sys.executable, "-c", src], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    R = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT ") :])
    record(
        "breakdown_real_models",
        model,
        {
            "spec": R["spec"],
            "figures": figures(R),
            "after_step": [s["after_step"]["now"] for s in R["steps"]],
            "before_backward": [s["before_backward"]["now"] for s in R["steps"]],
        },
    )
    return R


@pytest.mark.parametrize("model", MODELS)
def test_the_breakdown_on_the_gpu_matches_what_the_tensors_hold(model):
    if model != "encoder" and importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    R = run_model(model)
    assert len(R["steps"]) == STEPS
    bad = misses(R)
    assert not bad, f"{model} on CUDA: outside the bounds:\n" + "\n".join(bad) + "\nall figures:\n" + table(R)
