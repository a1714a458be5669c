"""The run page on CUDA with a real model (pytest -m gpu): ``python -m
memalloc run --out DIR`` of a transformers GPT-2 (built from its config,
AdamW, lengths varying per step) leaves ``DIR/index.html`` whose figures
equal ``torch.cuda``'s queries read by the script itself: each step's peak
(``max_memory_allocated`` since the last boundary) and the allocated bytes
at its end, and the flame graph's peak is the run's highest peak, held by
stacks through the script and transformers' GPT-2. The layout in a browser
is tested on the host (tests/integration/test_run_page.py).
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest
import torch
from memtest_helpers import run_memalloc

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LENGTHS = (128, 512, 256, 1024, 384)

SCRIPT = textwrap.dedent("""\
    import json
    import sys

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    truth = []
    for length in {lengths}:
        x = torch.randint(0, 8192, (8, length), device="cuda")
        loss = model(x, labels=x).loss  # FORWARD
        loss.backward()
        opt.step()  # the step's boundary (memalloc: optimizer.step() while the code calls no memalloc.step())
        peak, now = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
        truth.append({{"peak_allocated": peak, "allocated": now}})
        torch.cuda.reset_peak_memory_stats()
        opt.zero_grad(set_to_none=True)
    with open(sys.argv[1], "w") as f:
        json.dump(truth, f)
""")


def _frames(node: dict) -> set[str]:
    return {os.path.basename(node["file"])} | {f for c in node["children"] for f in _frames(c)}


def test_run_page_of_a_real_model_on_cuda(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "train.py").write_text(SCRIPT.format(lengths=LENGTHS))
    run_memalloc("run", "--out", "out", "train.py", "truth.json", cwd=tmp_path)
    truth = json.loads((tmp_path / "truth.json").read_text())
    page = (tmp_path / "out" / "index.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S).group(1))
    assert data["process"]["backend"] == "cuda" and data["process"]["state"] == "exited"
    steps = data["steps"]
    assert [s["step"] for s in steps] == list(range(1, len(LENGTHS) + 1))
    assert [s["peak_allocated"] for s in steps] == [t["peak_allocated"] for t in truth]
    assert [s["allocated"] for s in steps] == [t["allocated"] for t in truth]
    assert all(sum(s["split"].values()) == s["peak_allocated"] for s in steps)
    assert all(s["reserved"] >= s["allocated"] for s in steps)
    flame = data["flame"]
    assert flame["total"] == max(t["peak_allocated"] for t in truth), (flame["total"], truth)
    assert flame["tree"]["bytes"] == flame["total"]
    assert {"train.py", "modeling_gpt2.py"} <= _frames(flame["tree"])
    assert LENGTHS.index(max(LENGTHS)) + 1 == flame["step"]  # the longest sequence's step holds the peak
