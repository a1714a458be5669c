"""One process of tests/gpu/test_cuda_expandable.py: memalloc enabled on CUDA
under the MEMALLOC_CONF it is given, a few checks, one JSON object on the
last stdout line.

    MEMALLOC_CONF=expandable_segments:True python tests/gpu/expandable_child.py
"""

from __future__ import annotations

import json
import os
import sys
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import memalloc  # noqa: E402

memalloc.enable(backend="cuda")

import torch  # noqa: E402
from torch import nn  # noqa: E402

MiB = 1 << 20
R: dict = {"conf": os.environ.get("MEMALLOC_CONF", "")}


def books() -> dict:
    """What a user reads, and whether it agrees with itself."""
    snap = torch.cuda.memory._snapshot()
    segs = [s for s in snap["segments"] if s["device"] == 0]
    reserved = torch.cuda.memory_reserved()
    memalloc.installed_allocator().validate(0)
    return {
        "reserved": reserved,
        "snapshot_total": sum(s["total_size"] for s in segs),
        "segments": len(segs),
        "segment_stat": torch.cuda.memory_stats()["segment.all.current"],
        "expandable": sorted({bool(s["is_expandable"]) for s in segs if tuple(s["segment_pool_id"]) == (0, 0)}),
        "free": torch.cuda.mem_get_info()[0],
    }


def step(name, f):
    try:
        R[name] = f()
    except BaseException as e:  # the test reads what went wrong
        R[name] = {"error_type": type(e).__name__, "error": str(e)[:2000], "traceback": traceback.format_exc()}


def training():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(0)
    losses = []
    for n in (64, 512, 128, 1024, 256, 96):  # varying lengths: growth and reuse
        x = torch.randn(16, n, 256, device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"losses": losses, "books": books()}
    del model, opt, x, loss
    return out


def empty_cache_gives_pages_back():
    ts = [torch.empty(50 * MiB, dtype=torch.uint8, device="cuda") for _ in range(40)]
    del ts[1::2]
    torch.cuda.synchronize()
    before = books()
    torch.cuda.empty_cache()
    after = books()
    del ts
    torch.cuda.empty_cache()
    return {"before": before, "after": after, "end": books()}


def fits_where_holes_are():
    """20 x 5 MiB tensors, every other freed, then 40 MiB more under a fraction
    that leaves no room for a new plain segment. Run before the process has
    held 2 GiB: the 5 MiB holes then hold whole 2 MiB pages (from 2 GiB the
    large pool grows in 8 MiB pages, VmArena::page_for, which a 5 MiB hole
    may not hold)."""
    torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info()[1]
    small = [torch.full((5 * MiB,), i, dtype=torch.uint8, device="cuda") for i in range(20)]
    held = small[1::2]
    del small
    reserved = torch.cuda.memory_reserved()
    torch.cuda.set_per_process_memory_fraction((reserved + 8 * MiB) / total)
    out = {"reserved_before": reserved}
    big = None
    try:
        big = torch.full((40 * MiB,), 7, dtype=torch.uint8, device="cuda")
        out["fits"] = True
        out["reserved_after"] = torch.cuda.memory_reserved()
    except torch.OutOfMemoryError as e:
        out["fits"] = False
        out["error"] = str(e).splitlines()[0]
    torch.cuda.set_per_process_memory_fraction(1.0)  # the checks below allocate
    if big is not None:
        out["big_sum_ok"] = int(big.sum(dtype=torch.int64)) == 7 * 40 * MiB
        out["held_ok"] = all(int(t.min()) == 2 * k + 1 == int(t.max()) for k, t in enumerate(held))
        del big
    del held
    torch.cuda.empty_cache()
    out["books"] = books()
    return out


def ipc():
    t = torch.ones(1000, device="cuda")
    handle = t.untyped_storage()._share_cuda_()[1]
    return {"shared": True, "form": "legacy" if len(handle) == 64 else chr(handle[1])}


def graph():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).cuda()
    static_x = torch.randn(64, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            net(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = net(static_x) * 2  # a temporary freed inside the capture
        static_y = tmp.relu()
        del tmp
    ok = True
    for _ in range(3):
        static_x.copy_(torch.randn(64, 256, device="cuda"))
        g.replay()
        ok = ok and torch.allclose(static_y, (net(static_x) * 2).relu())
    snap = torch.cuda.memory._snapshot()
    pools = {tuple(s["segment_pool_id"]): bool(s["is_expandable"]) for s in snap["segments"]}
    out = {"replays_match": bool(ok), "graph_pools_expandable": sorted(v for k, v in pools.items() if k != (0, 0))}
    del g, static_y, static_x, net
    return out


def trace_names_mappings():
    torch.cuda.empty_cache()  # no free mapped pages: the next tensor maps its own
    torch.cuda.memory._record_memory_history(max_entries=10000)
    t = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
    del t
    torch.cuda.empty_cache()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return {"actions": sorted({e["action"] for e in snap["device_traces"][0]})}


def capped_ceiling():
    """The reuse ceiling above 10 GiB (VmArena::kReuseSlackCap): 10 GiB
    freed below a live 1 GiB, then 15 GiB that cannot fit the hole; its
    pages move (unmapped without a synchronisation while the fill of the
    10 GiB may still be running, then mapped under the 15 GiB) until
    reserved is at most 512 MiB over the most allocated. The data of both
    tensors survives the moves."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    big = torch.full((10 << 30,), 1, dtype=torch.uint8, device="cuda")  # work queued on the pages that move
    keep = torch.full((1 << 30,), 3, dtype=torch.uint8, device="cuda")
    del big
    c = torch.full((15 << 30,), 5, dtype=torch.uint8, device="cuda")
    out = {
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
        # min and max: no temporary (a sum in int64 would take 8 bytes per byte)
        "data_ok": int(keep.min()) == int(keep.max()) == 3 and int(c.min()) == int(c.max()) == 5,
        "books": books(),
    }
    del keep, c
    torch.cuda.empty_cache()
    return out


step("training", training)
step("fit", fits_where_holes_are)
step("empty_cache", empty_cache_gives_pages_back)
step("ipc", ipc)
step("graph", graph)
step("trace", trace_names_mappings)
step("capped", capped_ceiling)
step("final", books)
print(json.dumps(R))
