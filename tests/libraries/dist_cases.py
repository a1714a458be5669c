"""Distributed training loops for the distributed suites: DistributedDataParallel
and FSDP2 (``torch.distributed.fsdp.fully_shard``) train a small block a few
AdamW steps, each rank on its own data. On the CPU over gloo
(tests/integration/test_distributed_cpu.py), or one GPU per rank over NCCL
(tests/gpu/test_cuda_distributed.py, two GPUs). Run by torchrun, one process
per rank::

    torchrun --standalone --nproc_per_node 2 tests/libraries/dist_cases.py MODE OUT_DIR [cpu|cuda] [STEPS]

MODE ``native`` (torch's allocator), ``memalloc`` (``memalloc.enable()`` as
a user would at the top of the script: the host backend plus
``use_for_cpu_tensors()`` on the CPU, torch's CUDA allocator on a GPU; its
default, expandable segments) or ``memalloc_plain`` (the same with
``expandable_segments:False``: native's plain segments). Each
rank writes ``OUT_DIR/rank<N>.json``: per case its losses, a checksum of the
full parameters after training, the median step time (ms, after the first
step) and, on CUDA, the peak allocated and reserved bytes of the case, or
the error; in memalloc modes what memalloc saw (allocations, peak allocated
bytes, hook failures, whether ``validate()`` passed, whether its segments
are expandable).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8)
    ).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train(model: nn.Module, rank: int, device: torch.device, steps: int) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data, drawn on the CPU
    losses, times = [], []
    for _ in range(steps):
        x, y = torch.randn(32, 64, generator=gen).to(device), torch.randn(32, 8, generator=gen).to(device)
        _sync(device)
        t0 = time.perf_counter()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # (a synchronisation)
        times.append((time.perf_counter() - t0) * 1e3)
    return {"losses": losses, "step_ms": statistics.median(times[1:]) if len(times) > 1 else times[0]}


def ddp(rank: int, device: torch.device, steps: int) -> dict:
    model = nn.parallel.DistributedDataParallel(
        _model(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    out = _train(model, rank, device, steps)
    out["param_sum"] = sum(float(p.double().sum()) for p in model.parameters())
    return out


def fsdp2(rank: int, device: torch.device, steps: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    model = _model(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    out = _train(model, rank, device, steps)
    out["param_sum"] = sum(float(p.full_tensor().double().sum()) for p in model.parameters())
    return out


CASES = {"ddp": ddp, "fsdp2": fsdp2}
MODES = ("native", "memalloc", "memalloc_plain")


# ---- the suites' side (jobs: mode -> the ranks' JSON, rank order) ----------------
def run_jobs(
    mkdir: Callable[[str], Path], env: dict, kind: str = "cpu", steps: int = 3, ranks: int = 2, timeout: float = 300
) -> dict:
    """One torchrun job of this script per mode (``mkdir(mode)``: its output
    folder), in ``env``; each job must succeed. Returns {mode: [rank's JSON]}."""
    out = {}
    for mode in MODES:
        d = mkdir(mode)
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(ranks),
                __file__,
                mode,
                str(d),
                kind,
                str(steps),
            ],
            cwd=Path(__file__).parents[2],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert p.returncode == 0, f"{mode}: rc {p.returncode}\n{p.stderr[-3000:]}"
        out[mode] = [json.loads((d / f"rank{r}.json").read_text()) for r in range(ranks)]
    return out


def check_same_as_native(jobs: dict, mode: str, case: str, rel_tol: float = 0.0) -> None:
    """Every rank's losses and full-parameter checksum of ``case`` under
    ``mode`` equal native's (within ``rel_tol``; 0: bit for bit), and the
    ranks trained on their own data to the same parameters."""
    for rank in range(len(jobs["native"])):
        got, want = jobs[mode][rank][case], jobs["native"][rank][case]
        assert "error" not in got, got.get("error")
        assert "error" not in want, want.get("error")
        assert len(got["losses"]) == len(want["losses"])
        assert all(math.isclose(a, b, rel_tol=rel_tol) for a, b in zip(got["losses"], want["losses"])), (got, want)
        assert math.isclose(got["param_sum"], want["param_sum"], rel_tol=rel_tol), (got, want)
    ranks = jobs["native"]
    assert ranks[0][case]["losses"] != ranks[1][case]["losses"]
    assert math.isclose(ranks[0][case]["param_sum"], ranks[1][case]["param_sum"], rel_tol=1e-12)


def check_memalloc_held_the_memory(jobs: dict, mode: str) -> None:
    """Under ``mode`` memalloc served every rank (its allocations and peak),
    no hook failed, each rank's allocator validates, and its segments are
    expandable exactly in the expandable mode."""
    for rank, r in enumerate(jobs[mode]):
        assert (r["rank"], r["world_size"]) == (rank, len(jobs[mode]))
        m = r["memalloc"]
        assert m["allocations"] > 100 and m["peak_allocated"] > 0, m
        assert m["hook_failures"] == {} and m["validate"] == "passed", m
        assert m["expandable"] == (mode == "memalloc"), m  # memalloc's default: expandable


def main() -> None:
    mode, out_dir = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    memalloc = None
    if mode != "native":
        import memalloc  # noqa: F811 - imported only in these modes, as a user would

        memalloc.enable(
            backend="host" if kind == "cpu" else "cuda",
            config="expandable_segments:False" if mode == "memalloc_plain" else None,
        )
        if kind == "cpu":
            memalloc.host.use_for_cpu_tensors()
    if kind == "cuda":
        local = int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    results: dict = {"rank": rank, "world_size": dist.get_world_size(), "device": str(device)}
    for name, case in CASES.items():
        try:
            if kind == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            results[name] = case(rank, device, steps)
            if kind == "cuda":
                results[name].update(
                    peak_allocated=torch.cuda.max_memory_allocated(device),
                    peak_reserved=torch.cuda.max_memory_reserved(device),
                )
        except Exception:  # noqa: BLE001 - reported per case, the test names it
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    dist.destroy_process_group()
    if memalloc is not None:
        from memalloc.core import _hooks

        s = memalloc.memory.memory_stats(device) if kind == "cuda" else memalloc.memory.memory_stats()
        a = memalloc.installed_allocator()
        index = device.index if kind == "cuda" else 0
        results["memalloc"] = {
            "allocations": s.get("allocation.all.allocated", 0),
            "peak_allocated": s.get("allocated_bytes.all.peak", 0),
            "expandable": any(seg["is_expandable"] for seg in a.segments(index)),
            "hook_failures": _hooks.failures(),
        }
        a.validate(index)
        results["memalloc"]["validate"] = "passed"
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _leave() -> None:
    """End the rank once its results are written: Python's exit handlers
    (memalloc's and torch's) run, then the process leaves without the C++
    static destructors. On torch 2.13's CPU build a rank sometimes aborts
    there ("terminate called without an active exception", main thread, no
    Python frame) after its JSON is written; native ranks do it too (3 of
    ~80 two-rank jobs on 2 busy cores), so it says nothing about memalloc
    and would fail the job at random."""
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _leave()
