"""GPU scenarios, each run in a fresh interpreter (the allocator is chosen
once per process): ``python tests/gpu/scenarios.py NAME {memalloc|native}``.
Each prints one JSON object on its last line; tests/gpu/test_cuda.py asserts
on it. Kept free of pytest so that a scenario can also be run by hand.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import torch  # noqa: E402

import memalloc  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def setup(mode: str, config: str = "") -> None:
    """native: torch's allocator. memalloc: memalloc.enable(config=config)
    (memalloc's subclass of torch's CUDAPluggableAllocator; its default
    config has expandable segments; memalloc_plain: without them, as
    native's default). memalloc_c_entry: the route
    for users who load the library by hand: torch's own
    CUDAPluggableAllocator over memalloc's C entry points (memalloc_alloc /
    memalloc_free), with torch's per-allocation map and mutex in front."""
    if mode == "memalloc":
        assert memalloc.enable(backend="cuda", config=config) == "cuda"
    elif mode == "memalloc_plain":  # without expandable segments: native's plain policy, to compare to the byte
        plain = ",".join(c for c in ("expandable_segments:False", config) if c)
        assert memalloc.enable(backend="cuda", config=plain) == "cuda"
    elif mode == "memalloc_c_entry":
        from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator

        from memalloc import _C

        _C.install(_C.Allocator("cuda", ""))
        change_current_allocator(CUDAPluggableAllocator(_C.__file__, "memalloc_alloc", "memalloc_free"))
    elif mode != "native":
        raise SystemExit(f"mode must be memalloc, memalloc_plain, memalloc_c_entry or native, not {mode}")


def stats(device: int = 0) -> dict:
    return memalloc.memory.memory_stats_raw(device) if memalloc.is_enabled() else {}


def train20(mode: str) -> dict:
    """20 deterministic fp32 training steps of a small MLP; the losses."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    setup(mode)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 10),
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(512, 256, device="cuda")
    y = torch.randint(0, 10, (512,), device="cuda")
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"losses": losses}
    if mode == "memalloc":
        s = stats()
        out["allocations"] = s["allocation"]["all"]["allocated"]
        out["device_allocs"] = s["num_device_alloc"]
        out["peak_allocated"] = s["allocated_bytes"]["all"]["peak"]
        out["peak_reserved"] = s["reserved_bytes"]["all"]["peak"]
    torch.cuda.synchronize()
    memalloc_validate()
    return out


class HugeInBackward(torch.autograd.Function):
    """Identity forward; its backward asks for 2**46 floats (256 TiB)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        torch.empty(1 << 46, device=grad.device)
        return grad


def oom(mode: str) -> dict:
    """torch.empty(1<<46) in forward and inside backward raise
    torch.OutOfMemoryError; training continues afterwards."""
    setup(mode)
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 512, device="cuda")
    out: dict = {}

    def step(extra=None):
        h = model(x)
        if extra is not None:
            h = extra(h)
        loss = h.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    out["loss_before"] = step()
    reserved_before = stats().get("reserved_bytes", {}).get("all", {}).get("current")
    try:
        torch.empty(1 << 46, device="cuda")
        out["forward"] = "no error"
    except torch.OutOfMemoryError as e:
        out["forward"] = "OutOfMemoryError"
        out["forward_message"] = str(e)
    except Exception as e:  # noqa: BLE001 - report what was raised instead
        out["forward"] = f"{type(e).__name__}: {e}"
    try:
        step(HugeInBackward.apply)
        out["backward"] = "no error"
    except torch.OutOfMemoryError as e:
        out["backward"] = "OutOfMemoryError"
        out["backward_message"] = str(e)
    except Exception as e:  # noqa: BLE001
        out["backward"] = f"{type(e).__name__}: {e}"
    out["losses_after"] = [step() for _ in range(5)]
    if mode == "memalloc":
        s = stats()
        out["num_ooms"] = s["num_ooms"]
        out["num_alloc_retries"] = s["num_alloc_retries"]
        out["reserved_before"] = reserved_before
        out["reserved_after"] = s["reserved_bytes"]["all"]["current"]
    torch.cuda.synchronize()
    memalloc_validate()
    return out


def oom_loop(mode: str) -> dict:
    """100 out-of-memory errors in a training loop, of four kinds in turn
    (an impossible request; a request just beyond what the device has left,
    which first releases the cache and retries; one in the middle of a
    forward pass; one inside backward), each caught; then training goes on.
    Reports the losses, the number of OOMs torch counted, and allocated /
    reserved bytes at the same point of a step before and after."""
    setup(mode)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device="cuda")
    target = torch.randn(512, 1024, device="cuda")

    def step(extra=None):
        h = model(x)
        if extra is not None:
            h = extra(h)
        loss = (h - target).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    def mid_forward(h):
        h.repeat(100_000, 1)  # 512*100000*1024*4 B = 195 GiB: OOM after the forward's activations exist
        return h

    losses_before = [step() for _ in range(5)]
    torch.cuda.synchronize()
    before = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    kinds = {"impossible": 0, "beyond_free": 0, "mid_forward": 0, "backward": 0}
    caught = 0
    for i in range(100):
        kind = list(kinds)[i % 4]
        try:
            if kind == "impossible":
                torch.empty(1 << 46, device="cuda")
            elif kind == "beyond_free":
                free, _ = torch.cuda.mem_get_info()
                torch.empty(free + torch.cuda.memory_reserved() + GiB, dtype=torch.uint8, device="cuda")
            elif kind == "mid_forward":
                step(mid_forward)
            else:
                step(HugeInBackward.apply)
        except torch.OutOfMemoryError:
            caught += 1
            kinds[kind] += 1
    losses_after = [step() for _ in range(5)]
    torch.cuda.synchronize()
    after = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    out = {
        "caught": caught,
        "kinds": kinds,
        "num_ooms": torch.cuda.memory_stats()["num_ooms"],
        "losses_before": losses_before,
        "losses_after": losses_after,
        "allocated_before": before[0],
        "reserved_before": before[1],
        "allocated_after": after[0],
        "reserved_after": after[1],
    }
    memalloc_validate()
    return out


def _ddp_rank(rank: int, world: int, mode: str, backend: str, port: int, out_dir: str) -> None:
    """One DDP rank (torch.multiprocessing.spawn target)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    setup(mode)  # before this process touches CUDA
    device = rank % torch.cuda.device_count()
    torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    ddp = DDP(model, device_ids=[device])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(1000 + rank)  # each rank its own data
    losses = []
    for _ in range(10):
        x = torch.randn(256, 1024, device="cuda", generator=gen)
        loss = ddp(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    checksum = float(sum(p.double().sum().item() for p in model.parameters()))
    # torch's queries for the current device (patched under memalloc). How
    # much is live here also depends on when NCCL's watchdog releases the
    # buffers it keeps for finished collectives, so it is reported, not
    # compared across processes.
    result = {
        "rank": rank,
        "device": device,
        "losses": losses,
        "param_checksum": checksum,
        "allocated": torch.cuda.memory_allocated(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
    }
    if mode == "memalloc":
        own = stats(device)
        result["own_allocated"] = own["allocated_bytes"]["all"]["current"]
        result["own_reserved"] = own["reserved_bytes"]["all"]["current"]
        result["allocations_per_device"] = [
            stats(d)["allocation"]["all"]["allocated"] for d in range(torch.cuda.device_count())
        ]
        result["num_ooms"] = own["num_ooms"]
        summary = torch.cuda.memory_summary()  # the current device's, from memalloc
        result["summary_device"] = next(
            (int(l.split("device ID")[1].split()[0]) for l in summary.splitlines() if "device ID" in l), None
        )
        result["top_holders"] = memalloc.top_holders(device, 3)
        installed().validate(device)
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def ddp(mode: str) -> dict:
    """DistributedDataParallel, two ranks: one per GPU over NCCL when the
    machine has two GPUs, otherwise both on GPU 0 over gloo. Each rank
    enables the allocator itself; reports every rank's losses, a parameter
    checksum (equal across ranks when gradients were averaged) and its
    accounting."""
    import socket
    import tempfile

    import torch.multiprocessing as mp

    # NVLink multicast stays off on shared machines (the device's KINDS.md).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    gpus = torch.cuda.device_count()  # does not initialise CUDA in this process
    backend = "nccl" if gpus >= 2 else "gloo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_ddp_rank, args=(2, mode, backend, port, d), nprocs=2, join=True)
        ranks = [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(2)]
    return {"backend": backend, "gpus": gpus, "ranks": ranks}


def _resnet_loop(keep: str, train: bool, steps: int = 12):
    """A torchvision ResNet-18 loop (batch 16, 64x64) that keeps each loss:
    as a tensor ("tensor") or as a float ("item"); with or without backward;
    under memalloc.leak_check() when memalloc is enabled, as a user writes it.
    Returns (memory_allocated at each boundary, the leak report or None)."""
    import torchvision

    check = memalloc.leak_check() if memalloc.is_enabled() else contextlib.nullcontext()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (16,), device="cuda")
    losses, allocated = [], []
    with check:
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)  # LOSS-LINE
            if train:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            if keep == "tensor":
                losses.append(loss)  # APPEND-LINE
            else:
                losses.append(loss.item())
            torch.cuda.synchronize()
            allocated.append(torch.cuda.memory_allocated())
            if memalloc.is_enabled():
                memalloc.step()
    return allocated, getattr(check, "report", None)


def leak_report(mode: str) -> dict:
    """The same ResNet-18 loops under native (memory_allocated per step: the
    truth) and under memalloc.leak_check (the report): evaluation without
    no_grad keeping the loss tensors (the whole graph leaks), training
    keeping the loss tensors (the loss leaks), and both keeping loss.item()."""
    import tempfile

    setup(mode)
    out: dict = {}
    src = open(os.path.abspath(__file__)).read().splitlines()
    out["markers"] = {
        m: next(i + 1 for i, l in enumerate(src) if l.rstrip().endswith(f"# {m}")) for m in ("LOSS-LINE", "APPEND-LINE")
    }
    for name, keep, train in (
        ("eval_tensor", "tensor", False),
        ("train_tensor", "tensor", True),
        ("eval_item", "item", False),
        ("train_item", "item", True),
    ):
        allocated, report = _resnet_loop(keep, train)
        out[name] = {"allocated": allocated}
        if report is not None:
            out[name].update(report=report.to_dict(), text=report.to_text())
            if name == "eval_tensor":
                d = os.environ.get("MEMALLOC_GPU_ARTIFACTS") or tempfile.mkdtemp()
                report.to_json(os.path.join(d, "leak-report-resnet18.json"))
                report.to_html(os.path.join(d, "leak-report-resnet18.html"))
        torch.cuda.synchronize()
    return out


def _marker_line(marker: str) -> int:
    """The line of this file that ends with ``marker``."""
    src = open(os.path.abspath(__file__)).read().splitlines()
    return next(i + 1 for i, l in enumerate(src) if l.rstrip().endswith(marker))


def _oom_beyond_free() -> str:
    """The message of an allocation 8 GiB beyond the device's free memory."""
    free, _ = torch.cuda.mem_get_info()
    try:
        torch.empty(free + 8 * GiB, dtype=torch.uint8, device="cuda")
        return "no error"
    except torch.OutOfMemoryError as e:
        return str(e)


def oom_report(mode: str) -> dict:
    """An OOM under memalloc with Python stacks: the message names the line
    holding the memory, and the report files are written."""
    import tempfile

    setup(mode)
    memalloc.record_history(max_entries=10_000, stacks="python")
    d = tempfile.mkdtemp()
    memalloc.set_oom_report(directory=d, max_reports=1)
    line = _marker_line("# HOLDS-MEMORY")
    held = [torch.empty(4 * GiB, dtype=torch.uint8, device="cuda") for _ in range(4)]  # HOLDS-MEMORY
    message = _oom_beyond_free()
    files = sorted(os.listdir(d))
    del held
    return {"message": message, "line": line, "file": os.path.abspath(__file__), "files": files}


def zero_setup_oom(mode: str) -> dict:
    """memalloc.enable() and nothing else ("memalloc"), or with call sites
    off ("memalloc_no_call_sites"): the OOM message names the filling line."""
    if mode == "memalloc_no_call_sites":
        assert memalloc.enable(backend="cuda", config="call_sites:False") == "cuda"
    else:
        setup(mode)
    line = _marker_line("# FILLS-GPU")
    held = [torch.empty(4 * GiB, dtype=torch.uint8, device="cuda") for _ in range(4)]  # FILLS-GPU
    message = _oom_beyond_free()
    del held
    return {"message": message, "line": line, "file": os.path.abspath(__file__)}


def zero_setup_leak(mode: str) -> dict:
    """memalloc.enable() and a leak_check() around a training loop that calls
    optimizer.step() but never memalloc.step(); the loop keeps every loss."""
    setup(mode)
    line = _marker_line("# KEEPS-LOSS")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
    losses = []
    with memalloc.leak_check() as check:
        for _ in range(20):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss)  # KEEPS-LOSS
    return {"report": check.report.to_dict(), "text": check.to_text(), "line": line, "file": os.path.abspath(__file__)}


def record_stream(mode: str) -> dict:
    """A tensor used on a side stream and freed with record_stream is not
    handed out again until that stream's work has completed."""
    setup(mode)
    n = 8 * MiB
    side = torch.cuda.Stream()
    x = torch.ones(n, dtype=torch.uint8, device="cuda")
    # Load the kernels first: a kernel's first launch loads its module, which
    # waits for the device (CUDA lazy loading) and would end the sleep early.
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        del_me = x * 2
    del del_me
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time on the side stream
        y = x * 2
    x.record_stream(side)
    ptr = x.data_ptr()
    del x
    out: dict = {"side_done_before": side.query()}
    z = torch.empty(n, dtype=torch.uint8, device="cuda")
    out["reused_early"] = z.data_ptr() == ptr
    if mode == "memalloc":
        states = [b["state"] for seg in installed().segments(0) for b in seg["blocks"] if b["address"] == ptr]
        out["state_while_pending"] = states
    side.synchronize()
    w = torch.empty(n, dtype=torch.uint8, device="cuda")
    out["reused_after_sync"] = w.data_ptr() == ptr
    out["y_ok"] = bool((y == 2).all().item())
    del y, z, w
    torch.cuda.synchronize()
    memalloc_validate()
    return out


def empty_cache(mode: str) -> dict:
    """torch.cuda.empty_cache() returns freed memory to the driver."""
    setup(mode)
    x = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    del x
    free_cached, _ = torch.cuda.mem_get_info()
    out = {"reserved_cached": memalloc.memory.memory_reserved(0) if mode == "memalloc" else None}
    torch.cuda.empty_cache()
    free_after, total = torch.cuda.mem_get_info()
    out.update(free_cached=free_cached, free_after=free_after, total=total, returned=free_after - free_cached)
    if mode == "memalloc":
        out["reserved_after"] = memalloc.memory.memory_reserved(0)
    memalloc_validate()
    return out


def fraction(mode: str) -> dict:
    """set_per_process_memory_fraction caps what the allocator may reserve."""
    setup(mode)
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(0.02)  # ~2.8 GiB of an H200
    out: dict = {"total": total, "limit": int(0.02 * total)}
    small = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
        out["over_limit"] = "no error"
    except torch.OutOfMemoryError as e:
        out["over_limit"] = "OutOfMemoryError"
        out["message"] = str(e)
    torch.cuda.set_per_process_memory_fraction(1.0)
    big = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
    out["after_reset"] = big.numel() == 4 * GiB
    del small, big
    memalloc_validate()
    return out


def accounting(mode: str) -> dict:
    """memalloc's counters for tensors of known sizes (native's rounding
    rules: plain segments, as native's default)."""
    setup(mode, "expandable_segments:False")
    sizes = [1, 511, 512, 513, 100_000, MiB, MiB + 1, 9 * MiB, 10 * MiB, 33 * MiB + 3]
    ts = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]
    out = {
        "sizes": sizes,
        "allocated": memalloc.memory.memory_allocated(0),
        "reserved": memalloc.memory.memory_reserved(0),
        "torch_reports": None,
    }
    try:
        out["torch_reports"] = torch.cuda.memory_allocated(0)
    except RuntimeError as e:  # torch's own query raises under a pluggable allocator (issue 4)
        out["torch_error"] = str(e)[:200]
    out["requested"] = memalloc.memory.memory_stats_raw(0)["requested_bytes"]["all"]["current"]
    del ts
    out["allocated_after_free"] = memalloc.memory.memory_allocated(0)
    memalloc_validate()
    return out


def pair_cost(mode: str) -> dict:
    """Host cost of torch.empty + del through torch, microseconds per pair,
    measured by the benchmark harness's own loop (informational here)."""
    from benchmarks.speed.worker import run_pair

    setup(mode)
    return run_pair(mode)


def c_entry_points(mode: str) -> dict:
    """The by-hand route (setup's memalloc_c_entry) still allocates from
    memalloc: a tensor's bytes show in memalloc's own counters."""
    setup(mode)
    from memalloc import _C

    a = _C.installed()
    before = a.stats(0)["allocated_bytes"]["all"]["current"]
    x = torch.ones(1 << 20, device="cuda")
    during = a.stats(0)["allocated_bytes"]["all"]["current"]
    ok = bool((x * 2).sum().item() == 2 * (1 << 20))
    del x
    after = a.stats(0)["allocated_bytes"]["all"]["current"]
    try:
        torch.cuda.memory_stats()
        stats_error = None
    except RuntimeError as e:  # torch's plain pluggable class has no getDeviceStats
        stats_error = str(e)
    return {
        "before": before,
        "during": during,
        "after": after,
        "ok": ok,
        "stats_error": stats_error,
        "backend": torch.cuda.get_allocator_backend(),
    }


def late_enable(mode: str) -> dict:
    """enable() after CUDA initialisation is refused with an explanation."""
    torch.zeros(1, device="cuda")
    try:
        memalloc.enable(backend="cuda")
        return {"error": None}
    except RuntimeError as e:
        return {"error": str(e), "enabled": memalloc.is_enabled()}


def record_training(mode: str) -> dict:
    """A real training loop recorded with Python stacks and tags; the
    snapshot must open in torch.cuda._memory_viz."""
    import tempfile

    from torch.cuda import _memory_viz

    setup(mode)
    memalloc.record_history(max_entries=200_000, stacks="python")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 512, device="cuda")
    for _ in range(3):
        with memalloc.tag("forward"):
            loss = model(x).square().mean()  # FORWARD-LINE
        loss.backward()  # BACKWARD-LINE
        opt.step()
        opt.zero_grad(set_to_none=True)
        memalloc.step()
    torch.cuda.synchronize()
    evs = memalloc.events()
    allocs = [e for e in evs if e.action == "alloc"]
    here = os.path.abspath(__file__)
    user_lines = set()
    for e in allocs:
        frames = memalloc.recording.stack(e.stack_id, user_only=True)
        if frames and os.path.abspath(frames[0].filename) == here:
            user_lines.add(frames[0].line)
    src = open(here).read().splitlines()
    marker = {
        name: next(i + 1 for i, l in enumerate(src) if f"# {name}" in l and "marker" not in l)
        for name in ("FORWARD-LINE", "BACKWARD-LINE")
    }
    snap = memalloc.snapshot()
    with tempfile.TemporaryDirectory() as d:
        path = memalloc.dump_snapshot(os.path.join(d, "snap.pickle"))
        html = _memory_viz.trace_plot(snap)
        size = os.path.getsize(path)
    return {
        "events": len(evs),
        "dropped": memalloc.recording.dropped(),
        "allocs": len(allocs),
        "tags": sorted({e.tag for e in allocs}),
        "user_lines": sorted(user_lines),
        "markers": marker,
        "steps": sorted({e.step for e in evs}),
        "trace_entries": len(snap["device_traces"][0]),
        "html_bytes": len(html),
        "pickle_bytes": size,
    }


def installed():
    return memalloc.installed_allocator()


def memalloc_validate() -> None:
    if memalloc.is_enabled():
        installed().validate(0)


SCENARIOS = {
    f.__name__: f
    for f in (
        train20,
        oom,
        record_stream,
        empty_cache,
        fraction,
        accounting,
        pair_cost,
        c_entry_points,
        late_enable,
        record_training,
        oom_loop,
        ddp,
        leak_report,
        oom_report,
        zero_setup_oom,
        zero_setup_leak,
    )
}

if __name__ == "__main__":
    name, mode = sys.argv[1], sys.argv[2]
    result = SCENARIOS[name](mode)
    print(json.dumps(result))
