"""CUDA IPC under memalloc (pytest -m gpu; skipped without a GPU): a tensor
sent through torch.multiprocessing arrives intact, in-place writes show on
both sides, and a tensor comes back the other way, for every pairing of a
native and a memalloc process, with plain and with expandable segments on
both sides (tests/gpu/ipc_cases.py runs one pairing per process pair).

Expandable segments travel in native's own form (the pages a block spans,
one POSIX descriptor each, csrc/boundary/torch/ipc_wire.h): the test checks
that the sending side wrote that form ('e' and the installed torch's
version byte) where it should, so a pairing cannot pass by falling back to
plain segments. The host half (the bytes): tests/unit/test_ipc_wire.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_cuda import record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODES = ("native", "memalloc")


def run_pair(parent: str, config: str, child: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MEMALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
    }
    p = subprocess.run(
        [sys.executable, os.path.join(HERE, "ipc_cases.py"), parent, config, child],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0 and lines, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    r = json.loads(lines[-1])
    record("ipc", f"{parent}-{config}-{child}", r)
    return r


def expected_form(mode: str, config: str) -> str:
    """What a sender writes for a 288 MiB block: plain segments go as a
    cudaIpcMemHandle (memalloc: the legacy 64 bytes; native: 'c' with its
    version), expandable ones as 'e' with the installed torch's version."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    version = 3 if (major, minor) >= (2, 13) else 2
    if config == "expandable":
        return f"e{version}"
    return "legacy" if mode == "memalloc" else f"c{version}"


@pytest.mark.parametrize("config", ["plain", "expandable"])
@pytest.mark.parametrize("parent,child", [(p, c) for p in MODES for c in MODES])
def test_a_tensor_goes_both_ways(parent, config, child):
    r = run_pair(parent, config, child)
    assert r["ok"], (r.get("error"), r.get("traceback"))
    c = r["child_result"]
    assert c["ok"], (c.get("error"), c.get("traceback"))
    assert c["values_ok"] == [True, True, True]
    assert r["parent_sees_child_writes"] == [True, True, True]
    assert r["received_back_ok"] is True
    assert r["child_exitcode"] == 0
    assert r["small_same_segment"], "the two small tensors should share a segment (an offset inside it)"
    assert r["handle_form"] == expected_form(parent, config)
    assert c["handle_form"] == expected_form(child, config)
    assert r["allocated_back_to_base"], "the parent's blocks were not freed after the child let go"
