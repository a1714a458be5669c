"""torch's CUDA allocator interface answered by memalloc on a GPU (issue 42;
pytest -m gpu, skipped without one): torch.accelerator's memory queries and
settings, post-facto annotations (torch >= 2.14) and record_function marks in
snapshots, NCCL's allocator trace hook, and copies between two devices over
expandable segments (enablePeerAccess, memcpyAsync; needs two GPUs). Each
case runs in a fresh interpreter, memalloc enabled before CUDA starts. The
interface itself is checked on every build without a GPU:
tests/contract/test_torch_interface.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from memtest_helpers import REPO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])


def child(body: str, timeout: int = 180) -> dict:
    """Runs body after memalloc.enable(backend='cuda') in a fresh process; the
    dict R it fills."""
    code = "import json, torch, memalloc\nmemalloc.enable(backend='cuda')\nR = {}\n"
    code += textwrap.dedent(body) + "\nprint(json.dumps(R))\n"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_accelerator_memory_queries_and_settings_answer_from_memalloc():
    r = child(
        """
        import torch.accelerator.memory as am
        R["names"] = sorted(am.__all__)
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        R["allocated"] = [torch.accelerator.memory_allocated(), torch.cuda.memory_allocated()]
        R["reserved"] = [torch.accelerator.memory_reserved(), torch.cuda.memory_reserved()]
        R["stats"] = [torch.accelerator.memory_stats()["allocated_bytes.all.current"],
                      memalloc.memory.memory_allocated()]
        R["info"] = [list(torch.accelerator.get_memory_info()), list(torch.cuda.mem_get_info())]
        del x
        torch.accelerator.reset_accumulated_memory_stats()
        R["freed_after_reset"] = torch.accelerator.memory_stats()["allocated_bytes.all.freed"]
        torch.accelerator.reset_peak_memory_stats()
        R["peak_after_reset"] = [torch.accelerator.max_memory_allocated(), torch.cuda.memory_allocated()]
        torch.accelerator.empty_cache()
        R["reserved_after_empty"] = torch.cuda.memory_reserved()
        torch._C._accelerator_setAllocatorSettings("garbage_collection_threshold:0.6")
        R["settings"] = memalloc.installed_allocator().settings()
        R["backend"] = torch.cuda.get_allocator_backend()
        """
    )
    assert r["allocated"][0] == r["allocated"][1] == r["stats"][0] == r["stats"][1] >= 64 << 20
    assert r["reserved"][0] == r["reserved"][1] >= r["allocated"][0]
    assert r["info"][0][1] == r["info"][1][1]  # total bytes
    assert r["freed_after_reset"] == 0
    assert r["peak_after_reset"][0] == r["peak_after_reset"][1]
    assert r["reserved_after_empty"] == 0
    assert "garbage_collection_threshold:0.6" in r["settings"]
    assert r["backend"] == "memalloc"


@pytest.mark.skipif(TORCH < (2, 14), reason="annotateMemory came in torch 2.14")
def test_annotations_and_record_function_marks_reach_the_snapshot():
    r = child(
        """
        torch.cuda.memory._record_memory_history("all", global_record_annotations=True)
        R["supported"] = torch.cuda.memory._memory_metadata_supported()
        x = torch.empty(1 << 20, device="cuda")
        with torch.profiler.record_function("marked_region"):
            y = x * 2
        torch.cuda.memory._annotate_tensor(x[10:], "packed for backward")
        s = torch.cuda.memory._snapshot()
        R["x"] = x.data_ptr()
        R["annotate"] = [(e["addr"], e.get("user_metadata"), e["size"])
                         for t in s["device_traces"] for e in t if e["action"] == "annotate"]
        R["marks"] = [a.get("name") for a in s.get("external_annotations", [])]
        """
    )
    assert r["supported"] is True
    assert r["annotate"] == [[r["x"], "packed for backward", 4 << 20]], r["annotate"]
    assert "marked_region" in r["marks"], r["marks"]


def test_nccl_registration_hook_attaches_a_trace_tracker():
    """TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK makes ProcessGroupNCCL
    attach an allocator trace tracker; the pluggable base raised there."""
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    r = child(
        """
        import os, torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
        os.environ["TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"] = "1"
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        R["sum"] = float(t.sum())
        dist.destroy_process_group()
        """
    )
    assert r["sum"] == float(1 << 20)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_copies_between_devices_over_expandable_segments():
    r = child(
        """
        a = torch.arange(1 << 22, device="cuda:0", dtype=torch.float32)
        b = a.to("cuda:1")          # torch enables peer access, then memcpyAsync
        c = b.to("cuda:0")
        torch.cuda.synchronize(0); torch.cuda.synchronize(1)
        R["same"] = bool(torch.equal(a, c))
        R["expandable"] = "expandable_segments:True" in memalloc.installed_allocator().settings()
        R["peer"] = torch.cuda.can_device_access_peer(0, 1)
        """
    )
    assert r["expandable"] and r["same"], r
