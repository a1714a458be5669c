"""Distributed training loops on the CPU (gloo), for
tests/integration/test_distributed_cpu.py: DistributedDataParallel and FSDP2
(``torch.distributed.fsdp.fully_shard``) train a small transformer block a
few AdamW steps, each rank on its own data. Run by torchrun, one process per
rank::

    torchrun --standalone --nproc_per_node 2 tests/libraries/dist_cases.py MODE OUT_DIR

MODE ``native`` (torch's CPU allocator), ``memalloc`` (``memalloc.enable()``
on the host backend plus ``use_for_cpu_tensors()``, as a user would at the
top of the script) or ``memalloc_expandable`` (the same with
``expandable_segments:True``). Each rank writes ``OUT_DIR/rank<N>.json``:
per case its losses and a checksum of the full parameters after training,
or the error; in memalloc modes what memalloc saw (allocations, peak
allocated bytes, hook failures, whether ``validate()`` passed).
"""
from __future__ import annotations

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 8))


def _train(model: nn.Module, rank: int) -> list:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(32, 64, generator=gen), torch.randn(32, 8, generator=gen)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def ddp(rank: int) -> dict:
    model = nn.parallel.DistributedDataParallel(_model())
    losses = _train(model, rank)
    return {"losses": losses, "param_sum": sum(float(p.double().sum()) for p in model.parameters())}


def fsdp2(rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    losses = _train(model, rank)
    return {"losses": losses, "param_sum": sum(float(p.full_tensor().double().sum()) for p in model.parameters())}


CASES = {"ddp": ddp, "fsdp2": fsdp2}


def main() -> None:
    mode, out_dir = sys.argv[1], sys.argv[2]
    memalloc = None
    if mode != "native":
        import memalloc  # noqa: F811 - imported only in these modes, as a user would
        memalloc.enable(backend="host", config="expandable_segments:True" if mode == "memalloc_expandable" else None)
        memalloc.host.use_for_cpu_tensors()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results: dict = {"rank": rank, "world_size": dist.get_world_size()}
    for name, case in CASES.items():
        try:
            results[name] = case(rank)
        except Exception:  # noqa: BLE001 - reported per case, the test names it
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    dist.destroy_process_group()
    if memalloc is not None:
        from memalloc.core import _hooks
        s = memalloc.memory_stats()
        results["memalloc"] = {"allocations": s.get("allocation.all.allocated", 0),
                               "peak_allocated": s.get("allocated_bytes.all.peak", 0),
                               "expandable": any(seg["is_expandable"] for seg in memalloc.installed_allocator().segments(0)),
                               "hook_failures": _hooks.failures()}
        memalloc.installed_allocator().validate()
        results["memalloc"]["validate"] = "passed"
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
