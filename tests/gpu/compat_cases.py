"""GPU compatibility cases: torch features that talk to the CUDA allocator,
run under torch's native allocator and under memalloc.

Each case runs in a fresh interpreter, because the allocator is chosen once
per process::

    python tests/gpu/compat_cases.py NAME native     # torch's own allocator
    python tests/gpu/compat_cases.py NAME memalloc   # memalloc.enable(backend="cuda") first

and prints one JSON object on its last stdout line. tests/gpu/test_compat.py
runs every case in both modes and asserts on the two objects; run one by
hand to see what it reports (``python tests/gpu/compat_cases.py --list``
prints the names).

The JSON object always has ``case``, ``mode`` and ``ok``. ``ok`` is False
when the case body raised: ``error_type``, ``error`` and ``traceback`` then
say what, and the fields the case had filled in before are kept. Wrong
values do not make ``ok`` False: the case reports what it saw (booleans,
sums, addresses) and the test decides. A crash (segfault, abort) prints no
JSON; the test then fails with the process's stderr. The process exits 0
whenever it printed its JSON.

memalloc mode: ``memalloc.enable(backend="cuda")`` runs before the case
touches CUDA; at the end ``memalloc.installed_allocator().validate(0)``
checks the allocator's invariants (when this process initialised CUDA), and
a failed validation makes ``ok`` False. Native mode never imports memalloc.
Processes a case spawns (IPC consumer, distributed ranks) are fresh
interpreters: a distributed rank enables memalloc itself in memalloc mode;
the IPC consumer always stays native (see ``_ipc_child``).

Keep each case short: the whole suite, both modes, runs in a few minutes.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

MiB = 1 << 20
MODES = ("native", "memalloc")


# ---- helpers ----------------------------------------------------------------
def _memalloc():
    """memalloc, imported only when a case runs in memalloc mode (native mode
    never loads it)."""
    import memalloc

    return memalloc


def setup(mode: str) -> None:
    """Installs memalloc in memalloc mode; must run before any CUDA work."""
    if mode == "memalloc":
        chosen = _memalloc().enable(backend="cuda")
        if chosen != "cuda":
            raise RuntimeError(f"memalloc.enable(backend='cuda') returned {chosen!r}")
    elif mode != "native":
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")


def memalloc_enabled() -> bool:
    return "memalloc" in sys.modules and sys.modules["memalloc"].is_enabled()


def time_ms(fn, n: int) -> list:
    """Wall milliseconds of ``n`` calls of ``fn``, each between two
    torch.cuda.synchronize() calls (host and device time together)."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def checksum(t: torch.Tensor) -> float:
    """Sum of the tensor's values in float64."""
    return t.detach().double().sum().item()


def abs_sum(t: torch.Tensor) -> float:
    """Sum of absolute values in float64: the scale a checksum is compared at
    (a checksum of LayerNorm outputs is ~0, so it cannot be compared
    relative to itself)."""
    return t.detach().double().abs().sum().item()


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item()


def max_abs(t: torch.Tensor) -> float:
    return t.detach().double().abs().max().item()


def warm_up_on_side_stream(fn, iters: int = 3) -> None:
    """Runs ``fn`` a few times on a side stream before graph capture, as
    torch's CUDA graph documentation recommends."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(iters):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def ranges_overlap(ptr: int, nbytes: int, ranges) -> bool:
    """True when [ptr, ptr + nbytes) overlaps one of ``ranges`` ((start, nbytes) pairs)."""
    return any(ptr < start + n and start < ptr + nbytes for start, n in ranges)


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def sending_errors(q) -> list:
    """The errors of ``q``'s feeder thread, collected: Queue.put pickles in
    that thread, and a failure there (exporting an IPC handle, say) would
    otherwise only be printed, never raised."""
    errors: list = []
    q._on_queue_feeder_error = lambda e, obj: errors.append(error_text(e))
    return errors


def result_of(result_q, child, feeder_errors: list, timeout_s: float = 60):
    """The child's answer on ``result_q``; RuntimeError when sending to it
    failed (``feeder_errors``, from :func:`sending_errors`) or it exited
    without one, TimeoutError after ``timeout_s`` seconds."""
    import queue

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return result_q.get(timeout=1.0)
        except queue.Empty:
            if feeder_errors:
                raise RuntimeError(f"sending the CUDA tensor failed: {feeder_errors[0]}") from None
            if not child.is_alive():
                try:
                    return result_q.get(timeout=1.0)  # put just before it exited
                except queue.Empty:
                    raise RuntimeError(f"the child exited (code {child.exitcode}) without a result") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result from the child within {timeout_s:.0f} s") from None


# ---- 1. cudnn.benchmark -----------------------------------------------------
def cudnn_benchmark(mode: str, out: dict) -> None:
    """torchvision ResNet-50 training (batch 32, 224x224, SGD) with
    torch.backends.cudnn.benchmark = True: 3 warm-up steps (the autotuner
    runs in the first), then 10 timed steps. Reports the losses and the
    median step time."""
    import torchvision

    # Set after memalloc.enable() (the runner's setup), before the model.
    torch.backends.cudnn.benchmark = True
    out["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, 224, 224, generator=gen).cuda()
    y = torch.randint(0, 1000, (32,), generator=gen).cuda()

    losses, step_ms = [], []
    for i in range(13):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        losses.append(loss.item())
        if i >= 3:
            step_ms.append(ms)
    out["losses"] = losses[:5]
    out["all_losses"] = losses
    out["step_ms"] = step_ms
    out["median_step_ms"] = statistics.median(step_ms)


# ---- 2. torch.compile(mode="reduce-overhead") ---------------------------------
def _cudagraph_tree_nodes() -> int | None:
    """Number of CUDA graphs recorded by cudagraph trees on device 0 (private
    torch internals: None when they cannot be read)."""
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(0, create_if_none_exists=False)
        if manager is None:
            return 0
        nodes, count = list(manager.get_roots()), 0
        while nodes:
            node = nodes.pop()
            count += 1
            for children in node.children.values():
                nodes.extend(children)
        return count
    except Exception:  # noqa: BLE001 - informational only
        return None


def reduce_overhead(mode: str, out: dict) -> None:
    """torch.compile(mode="reduce-overhead") (CUDA graph trees).

    Inference: two TransformerEncoderLayer(256, 4) on a 16x128x256 input
    under no_grad, called enough times to warm up, record and replay; then a
    second input shape (8x64x256, a second graph: the tree branches), then
    the first shape again. Every output is compared with an eager run of the
    same module. Then 6 training steps of a small MLP compiled the same way,
    against an eager copy trained on the same data.

    Reports checksums (float64 sum, and abs-sum for scale), the largest
    difference from eager, the median ms per compiled call after warm-up,
    the training losses, and cudagraph skip / node counts."""
    from torch._dynamo.utils import counters

    # Eager TransformerEncoderLayer in eval takes a fused "fast path" with
    # other numerics than the traced ops; compare like with like.
    torch.backends.mha.set_fastpath_enabled(False)
    torch.manual_seed(0)
    model = (
        nn.Sequential(
            *[nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True) for _ in range(2)]
        )
        .cuda()
        .eval()
    )
    gen = torch.Generator().manual_seed(1)
    xa = torch.randn(16, 128, 256, generator=gen).cuda()
    xb = torch.randn(8, 64, 256, generator=gen).cuda()

    with torch.no_grad():
        ref_a, ref_b = model(xa), model(xb)
        out["eager_median_ms"] = statistics.median(time_ms(lambda: model(xa), 20))
        out["checksum_eager"] = checksum(ref_a)
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)

        def call(x):
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(x)

        diffs = []
        o = None
        for _ in range(4):  # warm-up run, recording, replays
            o = call(xa)
            diffs.append(max_abs_diff(o, ref_a))
        out["checksum"], out["abs_sum"] = checksum(o), abs_sum(o)
        for _ in range(3):  # second shape: another graph in the tree
            o = call(xb)
            diffs.append(max_abs_diff(o, ref_b))
        out["checksum_b"], out["abs_sum_b"] = checksum(o), abs_sum(o)
        for _ in range(2):  # back to the first shape: replay after branching
            o = call(xa)
            diffs.append(max_abs_diff(o, ref_a))
        call_ms = time_ms(lambda: call(xa), 50)
        o = call(xa)
        diffs.append(max_abs_diff(o, ref_a))
        out["checksum_after"] = checksum(o)
    out["diffs"] = diffs
    out["max_abs_diff"] = max(diffs)
    out["max_abs_ref"] = max(max_abs(ref_a), max_abs(ref_b))
    out["rel_err"] = out["max_abs_diff"] / out["max_abs_ref"]
    out["median_call_ms"] = statistics.median(call_ms)
    out["call_ms_min"] = min(call_ms)

    # Training: forward and backward graphs, parameters updated between replays.
    torch.manual_seed(2)
    mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    mlp_eager = copy.deepcopy(mlp)
    cmlp = torch.compile(mlp, mode="reduce-overhead", dynamic=False)
    opt_c = torch.optim.SGD(mlp.parameters(), lr=0.05)
    opt_e = torch.optim.SGD(mlp_eager.parameters(), lr=0.05)
    xt = torch.randn(64, 256, generator=gen).cuda()
    yt = torch.randn(64, 256, generator=gen).cuda()
    train_c, train_e = [], []
    for _ in range(6):
        torch.compiler.cudagraph_mark_step_begin()
        loss = F.mse_loss(cmlp(xt), yt)
        opt_c.zero_grad(set_to_none=True)
        loss.backward()
        opt_c.step()
        train_c.append(loss.item())
        loss = F.mse_loss(mlp_eager(xt), yt)
        opt_e.zero_grad(set_to_none=True)
        loss.backward()
        opt_e.step()
        train_e.append(loss.item())
    out["train_losses"] = train_c
    out["train_losses_eager"] = train_e
    out["cudagraph_skips"] = int(counters["inductor"].get("cudagraph_skips", 0))
    out["cudagraph_nodes"] = _cudagraph_tree_nodes()


# ---- 3. torch.cuda.make_graphed_callables -------------------------------------
def make_graphed_callables(mode: str, out: dict) -> None:
    """torch.cuda.make_graphed_callables on a small MLP (sample input
    requiring grad), then 5 SGD steps through the graphed module; an eager
    copy trains on the same data for comparison."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    eager = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    sample = torch.randn(32, 64, generator=gen).cuda().requires_grad_(True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    out["graphed"] = True
    batches = [
        (torch.randn(32, 64, generator=gen).cuda().requires_grad_(True), torch.randn(32, 10, generator=gen).cuda())
        for _ in range(5)
    ]

    def train(m, params):
        opt = torch.optim.SGD(params, lr=0.1)
        losses = []
        for x, y in batches:
            loss = F.mse_loss(m(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    out["losses"] = train(graphed, model.parameters())
    out["eager_losses"] = train(eager, eager.parameters())


# ---- 4. torch.cuda.MemPool ------------------------------------------------------
def _pool_segments(pool) -> tuple[list, str]:
    """The pool's segments: MemPool.snapshot() where this torch has it, else
    torch.cuda.memory._snapshot() filtered by segment_pool_id."""
    if hasattr(pool, "snapshot"):
        return list(pool.snapshot()), "MemPool.snapshot"
    pid = tuple(pool.id)
    segs = torch.cuda.memory._snapshot()["segments"]
    return [s for s in segs if tuple(s.get("segment_pool_id", ())) == pid], "_snapshot filtered by pool id"


def _in_segments(t: torch.Tensor, segments) -> dict:
    p = t.data_ptr()
    inside = any(s["address"] <= p and p + t.nbytes <= s["address"] + s["total_size"] for s in segments)
    block = any(
        b.get("address") == p and b.get("state") == "active_allocated" for s in segments for b in s.get("blocks", ())
    )
    return {"inside_segment": inside, "active_block": block}


def mempool(mode: str, out: dict) -> None:
    """torch.cuda.MemPool + torch.cuda.use_mem_pool: tensors made inside the
    context come from the pool (their addresses lie in the pool's segments,
    from pool.snapshot()), values are right; then the pool is released."""
    n = 16 * MiB  # 64 MiB of float32
    gen = torch.Generator().manual_seed(0)
    x_cpu = torch.randn(n, generator=gen)
    outside = torch.empty(n, device="cuda")  # not in the pool
    torch.cuda.synchronize()
    out["reserved_start"] = torch.cuda.memory_reserved()
    pool = torch.cuda.MemPool()
    out["pool_id"] = list(pool.id)
    out["use_count_created"] = pool.use_count()
    with torch.cuda.use_mem_pool(pool):
        x = x_cpu.to("cuda")
        y = x * 2 + 1  # the temporary x * 2 is freed inside the pool
        out["use_count_inside"] = pool.use_count()
        segs_inside, how = _pool_segments(pool)
    out["snapshot_method"] = how
    out["use_count_after"] = pool.use_count()
    segs_after, _ = _pool_segments(pool)
    out["x_in_pool_inside"] = _in_segments(x, segs_inside)
    out["y_in_pool_inside"] = _in_segments(y, segs_inside)
    out["x_in_pool"] = _in_segments(x, segs_after)
    out["y_in_pool"] = _in_segments(y, segs_after)
    out["outside_in_pool"] = _in_segments(outside, segs_after)
    out["pool_segments"] = len(segs_after)
    out["pool_bytes"] = sum(s["total_size"] for s in segs_after)
    out["x_ok"] = torch.equal(x.cpu(), x_cpu)
    out["y_ok"] = bool(torch.allclose(y.cpu(), x_cpu * 2 + 1, rtol=1e-6, atol=0))
    torch.cuda.synchronize()
    out["reserved_before"] = torch.cuda.memory_reserved()
    del x, y, pool
    torch.cuda.empty_cache()
    out["reserved_after"] = torch.cuda.memory_reserved()
    del outside


# ---- 5. CUDA IPC ----------------------------------------------------------------
IPC_N = MiB  # 4 MiB of float32


def _ipc_child(tensor_q, result_q, child_memalloc: bool = False) -> None:
    """Consumer, in a process started by the spawn context. The allocator is
    chosen per process: the child keeps torch's native allocator, or (with
    child_memalloc) enables memalloc before the tensor arrives (unpickling a
    CUDA tensor initialises CUDA), so that both the exporting side (the
    parent's mode) and the importing side (memalloc's getIpcDevPtr) are
    exercised."""
    res: dict = {"ok": False}
    try:
        if child_memalloc:
            _memalloc().enable(backend="cuda")
        x = tensor_q.get(timeout=60)
        res["device"] = str(x.device)
        res["values_ok"] = torch.equal(x.cpu(), torch.arange(IPC_N, dtype=torch.float32))
        res["received_sum"] = checksum(x)
        x.add_(1)
        res["after_sum"] = checksum(x)  # .item() waits for add_
        torch.cuda.synchronize()
        del x
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        res["error"] = error_text(e)
        res["traceback"] = traceback.format_exc()[-3000:]
    result_q.put(res)


def ipc(mode: str, out: dict) -> None:
    """A CUDA tensor sent through a torch.multiprocessing (spawn) Queue; the
    child checks it, adds 1 in place and reports; the parent sees the
    change in its own tensor. Twice: to a native child and to a child that
    enabled memalloc."""
    out["rounds"] = {}
    for name, child_memalloc in (("native_child", False), ("memalloc_child", True)):
        out["rounds"][name] = r = {}
        _ipc_round(r, child_memalloc)


def _ipc_round(out: dict, child_memalloc: bool) -> None:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    x = torch.arange(IPC_N, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    out["sent_sum"] = checksum(x)
    tensor_q, result_q = ctx.Queue(), ctx.Queue()
    feeder_errors = sending_errors(tensor_q)
    child = ctx.Process(target=_ipc_child, args=(tensor_q, result_q, child_memalloc))
    child.start()
    try:
        tensor_q.put(x)
        out["child"] = result_of(result_q, child, feeder_errors)
        torch.cuda.synchronize()
        out["parent_sum_after"] = checksum(x)
        out["parent_sees_change"] = torch.equal(x, torch.arange(IPC_N, dtype=torch.float32, device="cuda") + 1)
        out["expected_sum_after"] = out["sent_sum"] + IPC_N
    finally:
        # With a result the child is exiting; without one (an error above)
        # it may still be waiting for the tensor: end it instead of waiting.
        child.join(timeout=60 if "child" in out else 5)
        if child.is_alive():
            child.kill()
            child.join()
        out["child_exitcode"] = child.exitcode
        out["feeder_errors"] = feeder_errors
    del x


# ---- 6. out-of-memory observer ---------------------------------------------------
def oom_observer(mode: str, out: dict) -> None:
    """torch._C._cuda_attach_out_of_memory_observer, then an impossible
    allocation (2**46 float32 = 2**48 bytes): the observer is called once
    and torch.OutOfMemoryError is raised."""
    calls: list = []

    def observer(device, alloc, device_allocated, device_free):
        # Native torch passes (device, rounded request, device total or the
        # memory-fraction limit, device free) despite the binding's names.
        calls.append(
            {"device": device, "alloc": alloc, "device_allocated": device_allocated, "device_free": device_free}
        )

    torch.zeros(1, device="cuda")
    attach_error = None
    try:
        torch._C._cuda_attach_out_of_memory_observer(observer)
        out["attached"] = True
    except Exception as e:  # noqa: BLE001 - still try the OOM, raise below
        attach_error = e
        out["attached"] = False
        out["attach_error"] = error_text(e)
    out["requested_bytes"] = 4 << 46
    try:
        torch.empty(1 << 46, device="cuda")
        out["raised"] = False
    except torch.OutOfMemoryError as e:
        out["raised"] = True
        out["message"] = str(e)[:400]
    out["calls"] = calls
    out["allocated_after"] = torch.cuda.memory_allocated()
    if attach_error is not None:
        raise attach_error


# ---- 7. frees inside a CUDA graph capture ---------------------------------------------
def _capture_with_free(a: torch.Tensor):
    """Captures out = (a * 2) + 1 with the temporary freed inside the capture.
    Returns the graph, its output and the (address, bytes) of the temporary."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = a * 2
        tmp_range = (tmp.data_ptr(), tmp.nbytes)  # host-side, legal while capturing
        out = tmp + 1
        del tmp  # freed inside the capture: the graph still writes it on replay
    return g, out, tmp_range


def graph_frees(mode: str, out: dict) -> None:
    """A tensor freed inside torch.cuda.graph capture must stay the graph's:
    eager tensors allocated after the capture must not get its memory
    (every replay writes it). Variant 1: one eager tensor, one replay.
    Variant 2: a second graph, an eager tensor allocated after the capture
    and another one before each of 3 replays; all are checked after every
    replay."""
    n = MiB // 4  # 1 MiB of float32
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=gen).cuda()  # static input
    warm_up_on_side_stream(lambda: (a * 2) + 1)

    g, o, tmp_range = _capture_with_free(a)
    stats = [_pool_stats()]  # right after the capture: the graph's pool counts as native counts it
    graph_ranges = [tmp_range, (o.data_ptr(), o.nbytes)]
    e = torch.full_like(a, 7.0)
    a.copy_(torch.randn(n, generator=gen))
    g.replay()
    torch.cuda.synchronize()
    out["variant1"] = {
        "e_untouched": bool((e == 7).all()),
        "out_ok": torch.equal(o, a * 2 + 1),
        "tmp_ptr": tmp_range[0],
        "out_ptr": o.data_ptr(),
        "e_ptr": e.data_ptr(),
        "e_is_tmp": e.data_ptr() == tmp_range[0],
        "e_in_graph_pool": ranges_overlap(e.data_ptr(), e.nbytes, graph_ranges),
    }

    g2, o2, tmp2_range = _capture_with_free(a)
    stats.append(_pool_stats())
    ranges2 = [tmp2_range, (o2.data_ptr(), o2.nbytes)]
    e2 = torch.full_like(a, 7.0)
    eager = [(7.0, e2)]
    replays = []
    for i in range(3):
        a.copy_(torch.randn(n, generator=gen))
        g2.replay()
        torch.cuda.synchronize()
        replays.append(
            {"out_ok": torch.equal(o2, a * 2 + 1), "eager_untouched": [bool((t == v).all()) for v, t in eager]}
        )
        fill = float(10 + i)
        eager.append((fill, torch.full_like(a, fill)))
    out["variant2"] = {
        "replays": replays,
        "tmp_ptr": tmp2_range[0],
        "e_ptr": e2.data_ptr(),
        "eager_in_graph_pool": [ranges_overlap(t.data_ptr(), t.nbytes, ranges2) for _, t in eager],
        "eager_is_tmp": [t.data_ptr() == tmp2_range[0] for _, t in eager],
    }
    out["e_untouched"] = out["variant1"]["e_untouched"] and all(all(r["eager_untouched"]) for r in replays)
    out["out_ok"] = out["variant1"]["out_ok"] and all(r["out_ok"] for r in replays)
    stats.append(_pool_stats())
    del g, g2, o, o2
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the graphs' pools are freeable now: their segments go too
    stats.append(_pool_stats())
    out["stats"] = stats


def _pool_stats() -> dict:
    """torch.cuda.memory_stats() figures that private pools move (bytes, counts)."""
    s = torch.cuda.memory_stats()
    keys = (
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "requested_bytes",
        "segment",
        "allocation",
    )
    return {k: s[f"{k}.all.current"] for k in keys}


# ---- 8. single-GPU rows ---------------------------------------------------------------
def compile_default(mode: str, out: dict) -> None:
    """torch.compile (default mode, no CUDA graphs) of an MLP: outputs match eager."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        ref = mlp(x)
        compiled = torch.compile(mlp)
        outs = [compiled(x) for _ in range(3)]
    out["max_abs_diff"] = max(max_abs_diff(o, ref) for o in outs)
    out["max_abs_ref"] = max_abs(ref)
    out["rel_err"] = out["max_abs_diff"] / out["max_abs_ref"]
    out["checksum"] = checksum(outs[-1])
    out["abs_sum"] = abs_sum(outs[-1])


def graph_no_free(mode: str, out: dict) -> None:
    """A manual torch.cuda.graph that frees nothing inside the capture
    (out = a * 2; out.add_(1)); replayed 3 times with new inputs."""
    n = MiB // 4
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=gen).cuda()
    warm_up_on_side_stream(lambda: (a * 2).add_(1))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o = a * 2
        o.add_(1)
    checks = []
    for _ in range(3):
        new = torch.randn(n, generator=gen).cuda()
        a.copy_(new)
        g.replay()
        torch.cuda.synchronize()
        checks.append(torch.equal(o, new * 2 + 1))
    out["checks"] = checks
    out["out_ok"] = all(checks)
    del g


def checkpoint_autocast(mode: str, out: dict) -> None:
    """torch.utils.checkpoint (non-reentrant) inside torch.autocast(bf16):
    5 AdamW training steps of two residual MLP blocks."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    blocks = nn.ModuleList(
        [nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)) for _ in range(2)]
    ).cuda()
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 512, generator=gen).cuda()
    target = torch.randn(64, 512, generator=gen).cuda()
    losses = []
    for _ in range(5):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = x
            for b in blocks:
                h = h + checkpoint(b, h, use_reentrant=False)
            loss = (h.float() - target).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        out["grads_present"] = all(p.grad is not None for p in blocks.parameters())
        opt.step()
        losses.append(loss.item())
    out["losses"] = losses
    out["finite"] = all(math.isfinite(v) for v in losses)


def grad_scaler(mode: str, out: dict) -> None:
    """torch.amp.GradScaler with fp16 autocast: 10 SGD steps on a regression."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, 128, generator=gen).cuda()
    y = (x[:, :8].sum(dim=1, keepdim=True) / 4).contiguous()
    losses, scales = [], []
    for _ in range(10):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.mse_loss(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    out["losses"] = losses
    out["scales"] = scales
    out["finite"] = all(math.isfinite(v) for v in losses)
    out["decreased"] = losses[-1] < losses[0]


def sdpa(mode: str, out: dict) -> None:
    """F.scaled_dot_product_attention (causal, bf16) forward and backward,
    against an fp32 reference computed from the same inputs."""
    torch.manual_seed(0)
    b, h, s, d = 4, 8, 256, 64
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, h, s, d, generator=gen).cuda().bfloat16().requires_grad_(True) for _ in range(3))
    w = torch.randn(b, h, s, d, generator=gen).cuda()
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (o.float() * w).sum().backward()

    qf, kf, vf = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    scores = qf @ kf.transpose(-2, -1) / math.sqrt(d)
    causal = torch.ones(s, s, dtype=torch.bool, device="cuda").tril()
    ref = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ vf
    (ref * w).sum().backward()

    out["out_rel_err"] = max_abs_diff(o, ref) / max_abs(ref)
    out["grad_rel_err"] = max(max_abs_diff(t.grad, r.grad) / max_abs(r.grad) for t, r in ((q, qf), (k, kf), (v, vf)))
    out["out_checksum"] = checksum(o)
    out["out_abs_sum"] = abs_sum(o)
    out["grad_abs_sums"] = [abs_sum(t.grad) for t in (q, k, v)]
    out["finite"] = bool(torch.isfinite(o).all()) and all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


def caching_allocator_alloc(mode: str, out: dict) -> None:
    """torch.cuda.caching_allocator_alloc / caching_allocator_delete: raw
    allocations are counted by memory_allocated and given back; once on the
    current stream, once on a side stream."""
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    for label, stream in (("current", None), ("side", torch.cuda.Stream())):
        before = torch.cuda.memory_allocated()
        ptr = torch.cuda.caching_allocator_alloc(MiB, stream=stream)
        during = torch.cuda.memory_allocated()
        torch.cuda.caching_allocator_delete(ptr)
        after = torch.cuda.memory_allocated()
        out[label] = {"ptr_nonzero": ptr != 0, "before": before, "during": during, "after": after}


def _snapshot_totals(snap: dict, device: int = 0) -> tuple[int, int]:
    """(sum of segment total_size, sum of active_allocated block sizes) on ``device``."""
    segs = [s for s in snap["segments"] if s.get("device", 0) == device]
    return (
        sum(s["total_size"] for s in segs),
        sum(b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated"),
    )


def queries(mode: str, out: dict) -> None:
    """torch's memory queries, read at one quiet point with tensors of
    several sizes alive: memory_allocated / max / reserved / max,
    memory_stats, memory_summary, reset_peak_memory_stats,
    torch.cuda.memory._snapshot() totals, torch.accelerator.memory_stats;
    under memalloc also memalloc's own numbers."""
    keep = [torch.ones(n, device="cuda") for n in (100, 4096, MiB // 4 + 1, 3 * MiB)]
    del keep[1]  # leave a freed block in the cache
    torch.cuda.synchronize()
    out["memory_allocated"] = torch.cuda.memory_allocated()
    out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    out["memory_reserved"] = torch.cuda.memory_reserved()
    out["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    out["stats_allocated_current"] = torch.cuda.memory_stats()["allocated_bytes.all.current"]
    summary = torch.cuda.memory_summary()
    out["summary_is_str"] = isinstance(summary, str)
    out["summary_chars"] = len(summary)
    snap = torch.cuda.memory._snapshot()
    out["snapshot_segments"] = len(snap["segments"])
    out["snapshot_reserved"], out["snapshot_allocated"] = _snapshot_totals(snap)
    if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "memory_stats"):
        try:
            out["accelerator_allocated"] = torch.accelerator.memory_stats()["allocated_bytes.all.current"]
        except Exception as e:  # noqa: BLE001 - reported, not asserted under memalloc
            out["accelerator_error"] = error_text(e)[:400]
    else:
        out["accelerator_error"] = "torch.accelerator.memory_stats does not exist in this torch"
    if mode == "memalloc":
        m = _memalloc()
        out["torch_is_patched"] = m.install._torch_patch.is_patched()
        out["memalloc_allocated"] = m.memory.memory_allocated()
        out["memalloc_reserved"] = m.memory.memory_reserved()
    big = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
    del big
    out["peak_with_big"] = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out["max_after_reset"] = torch.cuda.max_memory_allocated()
    out["allocated_after_reset"] = torch.cuda.memory_allocated()
    del keep


def record_history(mode: str, out: dict) -> None:
    """torch.cuda.memory._record_memory_history + _snapshot(): the trace
    holds an "alloc" entry at each tensor's address with its size."""
    torch.zeros(1, device="cuda")
    # stacks="python": native C++ stack symbolisation would make _snapshot slow.
    torch.cuda.memory._record_memory_history(max_entries=10000, stacks="python")
    try:
        sizes = [3 * 512, 2 * MiB, 5 * MiB + 512]  # multiples of 512: block size == nbytes
        ts = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
        freed_ptr = ts[1].data_ptr()
        del ts[1]
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    traces = snap["device_traces"][0] if snap.get("device_traces") else []
    out["trace_len"] = len(traces)
    out["actions"] = sorted({e.get("action") for e in traces})
    found = []
    for n, ptr in zip(sizes, [ts[0].data_ptr(), freed_ptr, ts[1].data_ptr()]):
        matches = [e.get("size") for e in traces if e.get("action") == "alloc" and e.get("addr") == ptr]
        found.append({"size": n, "addr": ptr, "alloc_sizes_at_addr": matches, "found": n in matches})
    out["allocs"] = found
    out["all_found"] = all(f["found"] for f in found)
    out["free_seen"] = any(
        e.get("action") in ("free_requested", "free_completed") and e.get("addr") == freed_ptr for e in traces
    )
    # Stacks: the alloc entries of our tensors and their live blocks name this file.
    here = os.path.basename(__file__)
    ours = {ts[0].data_ptr(), ts[1].data_ptr()}
    out["trace_frames_here"] = any(
        f.get("filename", "").endswith(here)
        for e in traces
        if e.get("action") == "alloc" and e.get("addr") in ours
        for f in e.get("frames", [])
    )
    out["block_frames_here"] = any(
        f.get("filename", "").endswith(here)
        for seg in snap.get("segments", [])
        for b in seg.get("blocks", [])
        if b.get("state") == "active_allocated"
        for f in b.get("frames", [])
    )
    del ts


# ---- 9. two-GPU rows ----------------------------------------------------------------
def _fsdp2_body(rank: int, world: int) -> dict:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # older torch
        from torch.distributed._composable.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 16)).cuda()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    for _ in range(3):
        x = torch.randn(64, 256, generator=gen).cuda()
        y = torch.randn(64, 16, generator=gen).cuda()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    checksum_full = sum(checksum(p.full_tensor()) for p in model.parameters())  # collective
    return {"losses": losses, "param_checksum": checksum_full, "allocated": torch.cuda.memory_allocated()}


def _nccl_body(rank: int, world: int) -> dict:
    import torch.distributed as dist

    n = MiB
    x = torch.arange(n, dtype=torch.float32, device="cuda") * (rank + 1)
    dist.all_reduce(x)
    factor = sum(range(1, world + 1))
    expected = torch.arange(n, dtype=torch.float32, device="cuda") * factor
    res = {"allreduce_ok": torch.equal(x, expected), "checksum": checksum(x)}
    del x, expected
    # A second round in freshly allocated (cache-reused) memory.
    ys = [torch.full((n,), float(rank + 1 + i), device="cuda") for i in range(4)]
    for y in ys:
        dist.all_reduce(y)
    res["second_ok"] = all(bool((y == float(factor + world * i)).all()) for i, y in enumerate(ys))
    res["second_checksums"] = [checksum(y) for y in ys]
    return res


_DIST_BODIES = {"fsdp2": _fsdp2_body, "nccl": _nccl_body}


def _dist_rank(rank: int, world: int, mode: str, kind: str, init_file: str, out_dir: str) -> None:
    """One rank (torch.multiprocessing.spawn target, a fresh interpreter).
    Writes rank<N>.json to ``out_dir``; re-raises so that spawn stops the
    other rank."""
    result: dict = {"rank": rank, "ok": False}
    try:
        if mode == "memalloc":
            # A spawned rank is a new process: it installs memalloc itself,
            # before anything touches CUDA (set_device included).
            setup(mode)
        torch.cuda.set_device(rank)
        import torch.distributed as dist

        dist.init_process_group(
            "nccl",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=120),
            device_id=torch.device("cuda", rank),
        )
        try:
            result.update(_DIST_BODIES[kind](rank, world))
            torch.cuda.synchronize()
            dist.barrier()
        finally:
            dist.destroy_process_group()
        if mode == "memalloc":
            _memalloc().installed_allocator().validate(rank)
            result["validate"] = "passed"
        result["ok"] = True
    except BaseException as e:
        result.update(error_type=type(e).__name__, error=str(e)[:2000], traceback=traceback.format_exc()[-4000:])
        raise
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f, default=str)


def _two_ranks(mode: str, kind: str, out: dict) -> None:
    import torch.multiprocessing as mp

    out["gpus"] = torch.cuda.device_count()  # does not initialise CUDA here
    if out["gpus"] < 2:
        out["skipped"] = "needs 2 GPUs"
        return
    # NVLink multicast stays off on shared machines.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    with tempfile.TemporaryDirectory() as d:
        try:
            mp.spawn(_dist_rank, args=(2, mode, kind, os.path.join(d, "init"), d), nprocs=2, join=True)
        finally:
            ranks = []
            for r in range(2):
                path = os.path.join(d, f"rank{r}.json")
                ranks.append(json.load(open(path)) if os.path.exists(path) else None)
            out["ranks"] = ranks


def fsdp2(mode: str, out: dict) -> None:
    """FSDP2 (torch.distributed.fsdp.fully_shard) on a small MLP, 2 ranks on
    2 GPUs over NCCL, 3 AdamW steps; each rank's losses and a full-parameter
    checksum."""
    _two_ranks(mode, "fsdp2", out)


def nccl(mode: str, out: dict) -> None:
    """NCCL all_reduce across 2 ranks on 2 GPUs, then 4 more in freshly
    allocated tensors."""
    _two_ranks(mode, "nccl", out)


CASES = {
    f.__name__: f
    for f in (
        cudnn_benchmark,
        reduce_overhead,
        make_graphed_callables,
        mempool,
        ipc,
        oom_observer,
        graph_frees,
        compile_default,
        graph_no_free,
        checkpoint_autocast,
        grad_scaler,
        sdpa,
        caching_allocator_alloc,
        queries,
        record_history,
        fsdp2,
        nccl,
    )
}
TWO_GPU_CASES = ("fsdp2", "nccl")


def run(name: str, mode: str) -> dict:
    """Runs one case; never raises (the outcome is in the returned dict)."""
    out: dict = {"case": name, "mode": mode, "ok": False, "torch": torch.__version__}
    t0 = time.perf_counter()
    try:
        if name not in CASES:
            raise KeyError(f"unknown case {name!r}; cases: {', '.join(CASES)}")
        setup(mode)
        CASES[name](mode, out)
        out["ok"] = True
    except BaseException as e:  # noqa: BLE001 - reported in the JSON
        out.update(ok=False, error_type=type(e).__name__, error=str(e)[:4000], traceback=traceback.format_exc()[-6000:])
    if memalloc_enabled() and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
            _memalloc().installed_allocator().validate(0)
            out["validate"] = "passed"
        except BaseException as e:  # noqa: BLE001
            out["validate"] = error_text(e)[:2000]
            if out["ok"]:
                out.update(ok=False, error_type="ValidateError", error=f"validate() failed: {out['validate']}")
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def main(argv: list) -> int:
    if len(argv) == 2 and argv[1] == "--list":
        print("\n".join(CASES))
        return 0
    if len(argv) != 3:
        print(f"usage: python {argv[0]} NAME {{native|memalloc}}  (or --list)", file=sys.stderr)
        return 2
    result = run(argv[1], argv[2])
    sys.stdout.flush()
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
