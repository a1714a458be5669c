"""Iteration boundaries (memalloc/core/iteration.py): explicit step(), the loop
wrapper, step listeners and the automatic boundary after optimizer.step().
Each scenario runs in a fresh interpreter (tests/conftest.py fresh_python):
the step numbers asserted are absolute, counted from 0 in a new process."""

from __future__ import annotations

PRELUDE = """
memalloc.enable(backend="host", config="host_capacity_mb:64")
seen = []
memalloc.iteration.add_step_listener(seen.append)
"""


def test_step_counts_and_calls_listeners_in_order(fresh_python):
    _, r, _ = fresh_python.code(
        PRELUDE,
        """
order = []
memalloc.iteration.add_step_listener(lambda n: order.append(("b", n)))
memalloc.iteration.add_step_listener(seen.append)  # registered twice: called once
R["returns"] = [memalloc.step(), memalloc.step()]
R["seen"] = seen[:]
R["order"] = order[:]
memalloc.iteration.remove_step_listener(seen.append)
memalloc.iteration.remove_step_listener(seen.append)  # not registered any more: ignored
memalloc.step()
R["after_remove"] = seen
R["count"] = memalloc.iteration.steps()
R["bad"] = err(lambda: memalloc.iteration.add_step_listener(3))
""",
    )
    assert r["returns"] == [1, 2] and r["seen"] == [1, 2]
    assert r["order"] == [["b", 1], ["b", 2]]
    assert r["after_remove"] == [1, 2] and r["count"] == 3
    assert r["bad"][0] == "TypeError" and "callable" in r["bad"][2]


def test_steps_of_steps_after_each_item_body(fresh_python):
    _, r, _ = fresh_python.code(
        PRELUDE,
        """
bodies = []
for x in memalloc.steps_of(["a", "b", "c"]):
    bodies.append((x, memalloc.iteration.steps()))
R["bodies"] = bodies
R["seen"] = seen[:]
""",
    )
    # the body of item k runs before step k+1 is marked
    assert r["bodies"] == [["a", 0], ["b", 1], ["c", 2]]
    assert r["seen"] == [1, 2, 3]


def test_auto_step_marks_one_boundary_per_iteration_of_two_optimizers(fresh_python):
    _, r, _ = fresh_python.code(
        PRELUDE,
        """
w1 = torch.nn.Parameter(torch.ones(3)); w2 = torch.nn.Parameter(torch.ones(3))
g, d = torch.optim.SGD([w1], lr=0.1), torch.optim.Adam([w2], lr=0.1)
def iteration():
    for opt, w in ((g, w1), (d, w2)):  # g: a global, so `del g` below drops the optimizer
        opt.zero_grad()
        (w * 2).sum().backward()
        opt.step()
iteration()
R["before"] = seen[:]
memalloc.auto_step()
R["enabled"] = memalloc.core.iteration.auto_step_enabled()
for _ in range(3):
    iteration()
R["auto"] = seen[:]
# a new phase: the first optimizer is gone, the remaining one marks the boundaries
del g
import gc; gc.collect()
for _ in range(2):
    d.zero_grad(); (w2 * 2).sum().backward(); d.step()
R["next_phase"] = seen[:]
memalloc.auto_step(False)
d.zero_grad(); (w2 * 2).sum().backward(); d.step()
R["off"] = seen[:]
R["disabled"] = memalloc.core.iteration.auto_step_enabled()
""",
    )
    assert r["before"] == [] and r["enabled"] is True
    assert r["auto"] == [1, 2, 3]  # SGD stepped first: its steps are the boundaries
    assert r["next_phase"] == [1, 2, 3, 4, 5]
    assert r["off"] == [1, 2, 3, 4, 5] and r["disabled"] is False


def test_every_n_steps_policy_is_a_listener(fresh_python):
    _, r, _ = fresh_python.code(
        """
memalloc.enable(backend="host", config="host_capacity_mb:64,empty_cache_every_n_steps:2")
""",
        """
def cached():
    t = host.empty(1000); del t
    return memalloc.memory.memory_reserved()
R["reserved"] = []
for _ in range(4):
    R["reserved"].append(cached())
    memalloc.step()
    R["reserved"].append(memalloc.memory.memory_reserved())
""",
    )
    seg = 2 << 20
    assert r["reserved"] == [seg, seg, seg, 0, seg, seg, seg, 0]
