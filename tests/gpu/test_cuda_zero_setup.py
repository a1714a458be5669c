"""Call sites and boundaries with no setup, on CUDA (issue: zero setup;
pytest -m gpu, skipped without a GPU): with memalloc.enable() alone an OOM
names the filling line and a leak check of an optimizer loop names the
leaking line; call_sites:False gives the message without call sites; and
what the default call-site capture costs, measured in one process
(benchmarks/speed/worker.py call_sites group: stack capture off and on
alternating over 11 rounds) against the budget: bf16 transformer step
<= 1.02x, 512 B torch.empty+del <= 1.10x. The host-backend versions:
tests/integration/test_zero_setup.py."""

from __future__ import annotations

import pytest
import torch
from test_cuda import gpu_worker, scenario

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_oom_names_the_filling_line_with_enable_alone():
    r = scenario("zero_setup_oom", "memalloc")
    lines = r["message"].splitlines()
    assert lines[0].startswith("CUDA out of memory. Tried to allocate")  # torch's message first
    i = lines.index("Live allocations holding the most memory (memalloc):")
    assert f"16.00 GiB in     4 allocations  {r['file']}:{r['line']} in zero_setup_oom" in lines[i + 1]
    assert lines[i + 2].strip().endswith("# FILLS-GPU")  # the line of source


def test_call_sites_off_gives_the_message_without_them():
    r = scenario("zero_setup_oom", "memalloc_no_call_sites")
    assert r["message"].startswith("CUDA out of memory. Tried to allocate")
    assert "no call site recorded" in r["message"] and r["file"] not in r["message"]
    assert "(call sites are off" in r["message"]


def test_leak_check_of_an_optimizer_loop_with_no_step_calls():
    r = scenario("zero_setup_leak", "memalloc")
    rep = r["report"]
    assert rep["boundaries"] == "20 from optimizer.step()", r["text"]
    assert len(rep["leaks"]) == 1, r["text"]
    leak = rep["leaks"][0]
    assert (leak["site"]["filename"], leak["site"]["line"]) == (r["file"], r["line"]), r["text"]
    assert leak["holder"]["name"] == "losses" and leak["cause"] == "graph_in_container"


def test_call_site_capture_costs_within_budget():
    r = gpu_worker("memalloc", "call_sites", "call_site_overhead")
    assert r["cs_bf16_ms_x_on"] <= 1.02, r
    assert r["cs_pair_us_512_x_on"] <= 1.10, r
