"""``python -m memalloc diff A B`` and the notebook display on CUDA with a
real model (pytest -m gpu; issue 41's "on the device with a real model").
Two runs of one transformers GPT-2 script (built from its config, AdamW,
lengths varying per step) under ``python -m memalloc run --out``; B keeps
EXTRA bytes more at one line each step (the planted difference). The diff of
the two ``--out`` folders must put that line first, at the peak and per
step, with the bytes the test computes; no other line may differ by as much
as the planted bytes (the model's own lines hold the same in both runs).
The same B script checks its own leak inside ``memalloc.leak_check``: the
report's notebook HTML must name the line and carry EXTRA bytes per step,
and the breakdown's HTML every category's bytes as the object gives them.
The host tests hold the exact noise floor (tests/integration/test_diff.py,
tests/unit/test_notebook_html.py)."""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest
import torch
from memtest_helpers import run_memalloc

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LENGTHS = (128, 512, 256, 1024, 384, 640)
EXTRA = 6 << 20  # a multiple of 2 MiB: its block holds exactly these bytes

SCRIPT = textwrap.dedent("""\
    import json
    import sys

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import memalloc

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    held = []
    peaks = []
    with memalloc.leak_check(warmup_steps=1) as check:
        for length in {lengths}:
            {planted}
            x = torch.randint(0, 8192, (8, length), device="cuda")
            loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            peaks.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
    b = memalloc.memory_breakdown()
    with open(sys.argv[1], "w") as f:
        json.dump({{"peaks": peaks, "leak_html": check._repr_html_(),
                   "leaks": [[l.alloc_site["filename"], l.alloc_site["line"], l.bytes_per_step] for l in check.leaks],
                   "breakdown_html": b._repr_html_(), "now": b.now, "peak": b.peak}}, f)
""")
PLANTED_A = "held.append(None)  # B keeps EXTRA bytes here"
PLANTED_B = f'held.append(torch.empty({EXTRA}, dtype=torch.uint8, device="cuda"))  # B keeps EXTRA bytes here'
PLANTED_LINE = next(i for i, l in enumerate(SCRIPT.splitlines(), 1) if "{planted}" in l)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"a"/"b": (run folder, the script's own JSON)} of the two planted runs."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("cuda_diff")
    found = {}
    for name, planted in (("a", PLANTED_A), ("b", PLANTED_B)):
        folder = root / name
        folder.mkdir()
        (folder / "train.py").write_text(SCRIPT.format(lengths=LENGTHS, planted=planted))
        run_memalloc("run", "--out", "out", "train.py", "result.json", cwd=folder)
        found[name] = (folder, json.loads((folder / "result.json").read_text()))
    return found


def test_diff_of_two_real_runs_names_the_planted_line_on_cuda(runs):
    (fa, ra), (fb, rb) = runs["a"], runs["b"]
    peak_step = max(range(len(LENGTHS)), key=lambda i: ra["peaks"][i])
    # the planted bytes move B's peak to the same step (they are far smaller than the steps' differences)
    assert max(range(len(LENGTHS)), key=lambda i: rb["peaks"][i]) == peak_step
    at_peak = (peak_step + 1) * EXTRA  # appended at each step's start, the peak's step included
    assert rb["peaks"][peak_step] - ra["peaks"][peak_step] == at_peak  # torch's own figure agrees
    page = fb / "diff.html"
    d = json.loads(run_memalloc("diff", str(fa / "out"), str(fb / "out"), "--json", "--html", str(page), cwd=fb).stdout)
    key = f"train.py:{PLANTED_LINE}"
    first = d["peak"][0]
    assert (first["key"], first["a"], first["b"], first["delta"]) == (key, 0, at_peak, at_peak), d["peak"][:5]
    assert first["code"] == PLANTED_B and first["site"]["filename"] == str(fb / "train.py")
    others = [r for r in d["peak"][1:] if abs(r["delta"]) >= EXTRA]
    assert not others, others
    step = d["per_step"][0]
    assert (step["key"], step["delta"]) == (key, EXTRA), d["per_step"][:5]
    assert not [r for r in d["per_step"][1:] if abs(r["delta"]) >= EXTRA], d["per_step"]
    a, b = d["runs"]
    assert b["peak"] - a["peak"] == at_peak + sum(r["delta"] for r in d["peak"][1:])
    html = page.read_text()
    assert "B keeps EXTRA bytes here" in html and key in html
    text = run_memalloc("diff", str(fa / "out"), str(fb / "out"), cwd=fb).stdout
    assert f"+{EXTRA >> 20}.00 MiB/step" in text and key in text


def test_notebook_html_of_a_real_run_on_cuda(runs):
    _, r = runs["b"]
    leaks = [(os.path.basename(f), line, b) for f, line, b in r["leaks"]]
    assert leaks == [("train.py", PLANTED_LINE, EXTRA)], r["leaks"]
    html = r["leak_html"]
    assert f"train.py:{PLANTED_LINE}" in html and f"{EXTRA:,} bytes/step" in html
    assert "<script" not in html and "https://" not in html
    titles = re.findall(r'title="([0-9,]+ bytes)"', r["breakdown_html"])
    for c in r["now"]:
        assert f"{r['now'][c]:,} bytes" in titles and f"{r['peak'][c]:,} bytes" in titles, c
    assert r["now"]["parameters"] > 0 and r["peak"]["optimizer_state"] > 0
    _, ra = runs["a"]
    assert ra["leaks"] == []  # A keeps nothing per step: no leak
