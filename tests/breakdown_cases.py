"""The real-model breakdown case: a training loop run under memalloc in a
fresh interpreter (model_script) and the checks of its results
(check_model_run), shared by tests/unit/test_breakdown.py (the host backend)
and tests/gpu/test_cuda_breakdown.py (CUDA)."""

from __future__ import annotations

from memalloc.features.breakdown import CATEGORIES


def model_script(backend: str, closure: bool = False) -> str:
    """A 5-layer MLP trained 3 steps with Adam (backend "host": on the host
    backend through use_for_cpu_tensors; "cuda": on the GPU, the model also
    under torch.compile when COMPILE is set); with ``closure`` the step's
    zero_grad, forward and backward run in a closure given to
    ``opt.step(closure)``, as LBFGS and Lightning's automatic optimization
    call it; R["steps"] holds, per step,
    the breakdown and what the model, its gradients, Adam and autograd hold
    (their storages' bytes), and the allocator's rounding (the bytes of live
    blocks beyond what was asked for, which the breakdown counts as other)
    now and at the step's peak, replayed from the event ring."""
    return PRELUDE[backend] + f"CLOSURE = {closure!r}\n" + MODEL


PRELUDE = {
    "host": """
import torch, memalloc
memalloc.enable(backend="host", config="host_capacity_mb:512")
memalloc.host.use_for_cpu_tensors()
device = "cpu"
""",
    "cuda": """
import os, torch, memalloc
memalloc.enable(backend="cuda")
device = "cuda"
""",
}

MODEL = """
import os
from memalloc.trace import recording, sites
recording.record_history(max_entries=200_000, stacks="none")  # for the peaks' rounding
already = list(sites.live_blocks(0))  # blocks made before the recording (none expected)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.Tanh(), torch.nn.Linear(512, 16)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(4096, 128, device=device), torch.randn(4096, 16, device=device)  # activations dominate
forward = torch.compile(model) if os.environ.get("COMPILE") else model
a = memalloc.installed_allocator()

def tensor_bytes(tensors):
    # The bytes of the distinct storages of tensors (each the start of a live block).
    found = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    blocks = {blk[0] for blk in sites.live_blocks(0)}
    assert set(found) <= blocks, "a storage the allocator holds no block at"
    return sum(found.values())

def rounding():
    # Bytes of the live blocks beyond what was asked for (size - requested).
    return sum(blk[1] - blk[2] for blk in sites.live_blocks(0))

def ring_length():
    return len(recording.raw_records(0)[0]) // 64

def window_peak_rounding(start, end):
    # (allocated bytes, rounding bytes) when allocated bytes first reached
    # their maximum in the ring's events [start, end) (a step's peak window,
    # which starts at the split after event start - 1), replayed from the
    # recording begun before the model was built.
    live = {blk[0]: blk[1] - blk[2] for blk in already}
    total, slack, best = sum(blk[1] for blk in already), sum(live.values()), None
    for i, e in enumerate(recording.events(0)[:end]):
        if e.action == "alloc":
            live[e.addr] = e.size - e.requested
            total, slack = total + e.size, slack + e.size - e.requested
        elif e.action == "free_requested":
            total, slack = total - e.size, slack - live.pop(e.addr)
        if i == start - 1 or (i >= start and (best is None or total > best[0])):
            best = (total, slack)
    return best

R = {"steps": []}
tracker = memalloc.StepTracker().start()
marks = [ring_length()]
params = list(model.parameters())
seen = {}

def closure():
    opt.zero_grad(set_to_none=True)
    saved = []
    def pack(t):
        saved.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(x)
        loss = torch.nn.functional.mse_loss(out, y)
    mine = [t for t in saved if t.untyped_storage().data_ptr() not in {p.data_ptr() for p in params}
            and t.untyped_storage().data_ptr() not in {x.data_ptr(), y.data_ptr()}]
    seen["before_backward"] = memalloc.memory_breakdown()
    seen["expected_activations"] = tensor_bytes(mine + [loss])
    del saved, mine, out
    memalloc.memory.reset_peak_memory_stats()
    loss.backward()
    return loss

loss = None
for step in range(3):
    loss = None  # the last step's loss is gone before this step's forward, as when the loop assigns it there
    if CLOSURE:
        loss = opt.step(closure)  # Adam returns the closure's loss
    else:
        loss = closure()
        opt.step()  # the step ends here (its first optimizer's post-step hook)
    before_backward, expected_activations = seen["before_backward"], seen["expected_activations"]
    marks.append(ring_length())
    b = memalloc.memory_breakdown()
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.device == x.device]
    R["steps"].append({
        "before_backward": before_backward.now, "expected_activations": expected_activations,
        "now": b.now, "peak": b.peak, "peak_step": b.peak_step,
        "params": tensor_bytes(params), "grads": tensor_bytes([p.grad for p in params]),
        "state": tensor_bytes(state), "inputs": tensor_bytes([x, y]), "loss": tensor_bytes([loss]),
        "rounding": rounding(), "max_allocated": memalloc.memory.max_memory_allocated(), "loss_value": loss.item(),
    })
assert recording.dropped(0) == 0
for s, start, end in zip(R["steps"], marks, marks[1:]):
    s["peak_allocated_replayed"], s["peak_rounding"] = window_peak_rounding(start, end)
recording.record_history(False)
tracker.stop()
R["rows"] = tracker.rows
R["summary"] = tracker.summary()
R["memory_summary"] = memalloc.memory.memory_summary()
a.validate()
"""


def check_model_run(R: dict, compiled: bool = False, workspaces: int = 0) -> None:
    """The checks of model_script's results (also run on CUDA by
    tests/gpu/test_cuda_breakdown.py, where ``other`` also holds up to
    ``workspaces`` bytes of library workspaces: cuBLAS keeps one per handle
    and stream, made by the first matmul of the forward and of the autograd
    engine's thread)."""

    def other_is(other: int, inputs: int) -> None:
        assert inputs <= other <= inputs + workspaces

    first, *later = R["steps"]
    assert first["peak_step"] == 1
    for s in R["steps"]:
        # After the step: what the model, its gradients and Adam hold, to the
        # byte (their storages; the blocks' rounding is other).
        assert s["now"]["parameters"] == s["params"] > 0
        assert s["now"]["gradients"] == s["grads"] == s["params"]
        assert s["now"]["optimizer_state"] == s["state"] > 2 * s["params"] - 1
        assert s["now"]["temporaries"] == 0
    for s in later:
        # Before backward: what autograd saved, plus the loss (provisional
        # activations); a compiled graph saves what it chose to, in its own
        # buffers, which the hooks of saved_tensors_hooks do not see.
        if not compiled:
            assert s["before_backward"]["activations"] == s["expected_activations"] > 0
        else:
            assert s["before_backward"]["activations"] > s["loss"]
        assert s["before_backward"]["parameters"] == s["params"]
        assert s["before_backward"]["gradients"] == 0  # set_to_none: freed at zero_grad
        # Data made before the loop and the blocks' rounding: other; the loss
        # kept by the loop variable: an activation.
        other_is(s["now"]["other"], s["inputs"] + s["rounding"])
        assert s["now"]["activations"] == s["loss"]
        # The step's peak: in backward, when its first gradients and temporaries
        # join the activations; every byte accounted for.
        assert sum(s["peak"].values()) == s["max_allocated"] == s["peak_allocated_replayed"]
        assert s["peak"]["parameters"] == s["params"]
        assert s["peak"]["optimizer_state"] == s["state"]
        assert 0 < s["peak"]["activations"] <= s["before_backward"]["activations"]
        assert s["peak"]["temporaries"] > 0
        other_is(s["peak"]["other"], s["inputs"] + s["peak_rounding"])
    # The step tracker's rows carry the same split, which adds up to the step's peak.
    assert len(R["rows"]) == 3
    for row, s in zip(R["rows"], R["steps"]):
        assert {c: row[f"peak_{c}"] for c in CATEGORIES} == s["peak"]
        assert sum(s["peak"].values()) == row["peak_allocated"]
    highest = max(R["rows"], key=lambda r: r["peak_allocated"])
    largest = max(CATEGORIES, key=lambda c: highest[f"peak_{c}"])
    assert f"at that peak: {largest} " in R["summary"]
    assert "memory by category" in R["memory_summary"] and "step 3's peak" in R["memory_summary"]
