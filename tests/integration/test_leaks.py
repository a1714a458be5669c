"""Leak reports (memalloc/features/leaks.py) on real training loops, on the host
backend with torch's CPU tensors allocated by memalloc
(memalloc.host.cpu_tensors_from), so models, autograd graphs, optimizers
and hooks behave as on a GPU.

The loops live in tests/leak_cases/loops.py, each under its own
``memalloc.leak_check()`` as a user would write it; each leaking one marks
the line the report must name with ``# LEAK:<name>``. All loops run in this
process, once per module, on a host allocator the test owns (not installed),
with torch's CPU tensors routed to it (memalloc.host.cpu_tensors_from); the
assertions are made here.

Expected bytes per step are computed from the tensors' shapes: every
allocation rounds up to 512 B (a 16x64 float32 tensor is 4096 B, a 16x128
one 8192 B, a scalar loss 512 B).
"""

from __future__ import annotations

import gc
import sys

import pytest
from memtest_helpers import REPO

import memalloc

LOOPS_FILE = REPO / "tests" / "leak_cases" / "loops.py"
LOOPS_SOURCE = LOOPS_FILE.read_text()
sys.path.insert(0, str(LOOPS_FILE.parent))
import loops  # noqa: E402  (tests/leak_cases, put on the path above)


@pytest.fixture(scope="module")
def reports():
    a = memalloc.Allocator("host", "host_capacity_mb:512")
    r = {}
    with memalloc.host.cpu_tensors_from(a):
        for fn in loops.LEAKS + loops.NOT_LEAKS:
            report = fn(allocator=a).report  # each loop runs under its own memalloc.leak_check()
            r[fn.__name__] = report.to_dict()
            r[fn.__name__]["text"] = report.to_text()
            gc.collect()
    yield r
    gc.collect()
    a.validate()


def marker(name: str) -> int:
    hits = [i for i, l in enumerate(LOOPS_SOURCE.splitlines(), 1) if l.rstrip().endswith(f"# LEAK:{name}")]
    assert len(hits) == 1
    return hits[0]


# name: (bytes per step, cause, holder name)
LEAKS = {
    "losses_with_graph": (512, "graph_in_container", "losses"),
    "logits_with_graph": (512, "graph_in_container", "logits"),
    "eval_without_no_grad": (None, "no_grad_eval", "outputs"),  # output + saved activations: see below
    "hook_storage": (8192, "hook_storage", "self.store"),
    "cache_by_step": (4096, "cache_by_step", "cache"),
    "leak_in_helper": (4096, "container", "store"),
    "nested_module": (4096, "container", "self.seen"),
    "auto_step_loss_list": (512, "graph_in_container", "losses"),
    # the kept output and the ReLU output its graph saved; not the layer's workspace
    "eval_with_a_lazy_workspace": (512 + 8192, "no_grad_eval", "outputs"),
}
MARKERS = {"leak_in_helper": "helper", "hook_storage": "hook_storage", "nested_module": "nested_module"}


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_leak_is_reported_at_the_line_that_keeps_it(reports, name):
    r = reports[name]
    per_step, cause, holder = LEAKS[name]
    assert len(r["leaks"]) == 1, r["text"]
    leak = r["leaks"][0]
    assert leak["site"]["filename"] == str(LOOPS_FILE)
    assert leak["site"]["line"] == marker(MARKERS.get(name, name)), r["text"]
    assert leak["cause"] == cause, r["text"]
    assert leak["holder"]["name"] == holder
    if per_step is not None:
        assert leak["bytes_per_step"] == pytest.approx(per_step), r["text"]
    # the report's total growth is the loop's: memory_allocated grows by exactly that per step
    steps, allocated = r["steps"][r["warmup_steps"] :], r["allocated"][r["warmup_steps"] :]
    assert leak["bytes_per_step"] == pytest.approx((allocated[-1] - allocated[0]) / (steps[-1] - steps[0]))
    assert leak["retained_tensors"] >= 20 and leak["hint"]


def test_the_hint_fits_what_is_kept(reports):
    """A kept loss (one element) is told to keep .item(); kept logits (a
    tensor of 128 elements) to keep .detach(), not loss.item() (issue 37)."""
    assert "loss.item()" in reports["losses_with_graph"]["leaks"][0]["hint"]
    hint = reports["logits_with_graph"]["leaks"][0]["hint"]
    assert "t.detach()" in hint and "loss.item()" not in hint and "`logits`" in hint


def test_a_workspace_made_at_the_forward_line_is_not_the_graphs(reports):
    leak = reports["eval_with_a_lazy_workspace"]["leaks"][0]
    assert leak["retained_bytes"] == loops.STEPS * (512 + 8192), reports["eval_with_a_lazy_workspace"]["text"]


def test_eval_without_no_grad_counts_the_saved_activations(reports):
    leak = reports["eval_without_no_grad"]["leaks"][0]
    # the kept output (16x8: 512 B) and the ReLU output its graph saved (16x128: 8192 B),
    # both allocated inside `out = m(x)`
    assert leak["bytes_per_step"] == pytest.approx(512 + 8192)
    assert leak["alloc_code"] == "out = m(x)"


@pytest.mark.parametrize(
    "name",
    ["training_with_item", "cache_heavy", "one_iteration_retention", "warmup_then_flat", "gc_delayed", "bounded_deque"],
)
def test_no_leak_is_reported(reports, name):
    r = reports[name]
    assert r["leaks"] == [], r["text"]
    assert "no leaks found" in r["text"]


@pytest.mark.parametrize("with_graph", [False, True])
def test_the_holder_search_keeps_none_of_the_loops_variables_alive(host_allocator, with_graph):
    """Naming a holder reads the running frames' variables; on Python 3.11
    and 3.12 that leaves a snapshot of them on each frame. A tensor the loop
    deletes after the check must be freed then, as without memalloc (also
    when the kept tensors carry graphs, whose saved tensors the report
    looks up among everything Python holds)."""
    import weakref

    import torch

    def loop() -> tuple[int, int, list]:
        kept = []
        w = torch.ones(128, requires_grad=True)
        with memalloc.host.cpu_tensors_from(host_allocator):
            with memalloc.leak_check(allocator=host_allocator) as check:
                for _ in range(8):
                    out = torch.ones(4096)  # 16 KiB, the loop's variable
                    kept.append(torch.sin(w) if with_graph else out * 2)  # sin saves w
                    memalloc.step()
        assert [l.holder["name"] for l in check.leaks] == ["kept"], check.to_text()
        last = weakref.ref(out)
        before = host_allocator.stats(0)["allocated_bytes"]["all"]["current"]
        del out  # freed at once, as natively: no gc.collect() needed
        return last() is None, before - host_allocator.stats(0)["allocated_bytes"]["all"]["current"], kept

    freed, freed_bytes, kept = loop()
    assert freed and freed_bytes == 4096 * 4
