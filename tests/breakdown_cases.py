"""The real-model breakdown case: a training loop run under memalloc in a
fresh interpreter (model_script) and the checks of its results
(check_model_run), shared by tests/unit/test_breakdown.py (the host backend)
and tests/gpu/test_cuda_breakdown.py (CUDA)."""
from __future__ import annotations

from memalloc.features.breakdown import CATEGORIES


def model_script(backend: str) -> str:
    """A 5-layer MLP trained 3 steps with Adam (backend "host": on the host
    backend through use_for_cpu_tensors; "cuda": on the GPU, the model also
    under torch.compile when COMPILE is set); R["steps"] holds, per step,
    the breakdown and what the model, its gradients, Adam and autograd hold."""
    return (PRELUDE[backend] + MODEL)


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
from memalloc.trace import sites
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.Tanh(), torch.nn.Linear(512, 16)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(4096, 128, device=device), torch.randn(4096, 16, device=device)  # activations dominate
forward = torch.compile(model) if os.environ.get("COMPILE") else model
a = memalloc.installed_allocator()

def block_bytes(tensors):
    sizes = {blk[0]: blk[1] for blk in sites.live_blocks(0)}
    return sum(sizes[p] for p in {t.untyped_storage().data_ptr() for t in tensors})

R = {"steps": []}
tracker = memalloc.StepTracker().start()
for step in range(3):
    opt.zero_grad(set_to_none=True)
    saved = []
    def pack(t):
        saved.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(x)
        loss = torch.nn.functional.mse_loss(out, y)
    params = list(model.parameters())
    mine = [t for t in saved if t.untyped_storage().data_ptr() not in {p.data_ptr() for p in params}
            and t.untyped_storage().data_ptr() not in {x.data_ptr(), y.data_ptr()}]
    before_backward = memalloc.memory_breakdown()
    expected_activations = block_bytes(mine + [loss])
    del saved, mine, out
    memalloc.reset_peak_memory_stats()
    loss.backward()
    opt.step()
    b = memalloc.memory_breakdown()
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.device == x.device]
    R["steps"].append({
        "before_backward": before_backward.now, "expected_activations": expected_activations,
        "now": b.now, "peak": b.peak, "peak_step": b.peak_step,
        "params": block_bytes(params), "grads": block_bytes([p.grad for p in params]),
        "state": block_bytes(state), "inputs": block_bytes([x, y]), "loss": block_bytes([loss]),
        "max_allocated": memalloc.max_memory_allocated(), "loss_value": loss.item(),
    })
tracker.stop()
R["rows"] = tracker.rows
R["summary"] = tracker.summary()
R["memory_summary"] = memalloc.memory_summary()
a.validate()
"""


def check_model_run(R: dict, compiled: bool = False, workspaces: int = 0) -> None:
    """The checks of model_script's results (also run on CUDA by
    tests/gpu/test_cuda_breakdown.py, where ``other`` also holds up to
    ``workspaces`` bytes of library workspaces: cuBLAS keeps one per handle
    and stream, made by the first matmul of the forward and of the autograd
    engine's thread)."""

    def other_is_inputs(other: int, inputs: int) -> None:
        assert inputs <= other <= inputs + workspaces
    first, *later = R["steps"]
    assert first["peak_step"] == 1
    for s in R["steps"]:
        # After the step: what the model, its gradients and Adam hold, to the byte.
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
        # Data made before the loop: other; the loss kept by the loop variable: an activation.
        other_is_inputs(s["now"]["other"], s["inputs"])
        assert s["now"]["activations"] == s["loss"]
        # The step's peak: in backward, when its first gradients and temporaries
        # join the activations; every byte accounted for.
        assert sum(s["peak"].values()) == s["max_allocated"]
        assert s["peak"]["parameters"] == s["params"]
        assert s["peak"]["optimizer_state"] == s["state"]
        assert 0 < s["peak"]["activations"] <= s["before_backward"]["activations"]
        assert s["peak"]["temporaries"] > 0
        other_is_inputs(s["peak"]["other"], s["inputs"])
    # The step tracker's rows carry the same split, which adds up to the step's peak.
    assert len(R["rows"]) == 3
    for row, s in zip(R["rows"], R["steps"]):
        assert {c: row[f"peak_{c}"] for c in CATEGORIES} == s["peak"]
        assert sum(s["peak"].values()) == row["peak_allocated"]
    highest = max(R["rows"], key=lambda r: r["peak_allocated"])
    largest = max(CATEGORIES, key=lambda c: highest[f"peak_{c}"])
    assert f"at that peak: {largest} " in R["summary"]
    assert "memory by category" in R["memory_summary"] and "step 3's peak" in R["memory_summary"]
