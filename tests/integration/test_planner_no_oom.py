"""The batch planner's plan runs (issue 37, item 5): in a fresh interpreter
as a user runs it (tests/planner_cases/fresh_run.py), the batch
memalloc.largest_batch plans trains STEPS steps without running out of
memory, later steps' fragmentation included, and is within 5% of the
largest batch that does, found by a real search (benchmarks/plan_vs_search's
doubling and bisection, each trial a fresh process training STEPS steps).

Before the fix the wide CNN (3 conv + batch norm, 48 channels, AdamW) on a
100 MiB device planned 97, which ran out of memory in its second step, 96
in its sixth; 95 runs 40 steps. The replay ran only the probes' three
recorded steps; it now runs the last one again, as a training run does,
until the replay is steady (planner._replay), so the fragmentation that
builds up over the steps is in the prediction."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import plan_vs_search

RUN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "planner_cases", "fresh_run.py")
STEPS = 12


def fresh(*args) -> dict:
    out = subprocess.run([sys.executable, RUN, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def fits(model: str, capacity_mb: int, batch: int, seen: dict) -> bool:
    if batch not in seen:
        seen[batch] = fresh("trial", model, capacity_mb, batch, STEPS)
    return seen[batch]["fits"]


@pytest.mark.parametrize("model,capacity_mb", [
    # a search of fresh processes (60-130 s on CI's 2 cores): the slow tier
    pytest.param("wide_cnn", 100, marks=pytest.mark.slow),    # planned 96-97 before (OOM in step 6 or 2); 95 runs
    pytest.param("cnn", 100, marks=pytest.mark.slow),          # planned 288: 288 runs 12 steps, 289 OOMs in its first
    pytest.param("transformer", 128, marks=pytest.mark.slow),  # planned 108: 108 runs 12 steps, 109 OOMs in its 7th
])
def test_the_planned_batch_trains_and_is_within_5_percent_of_the_largest_that_does(model, capacity_mb):
    planned = fresh("plan", model, capacity_mb)["batch"]
    seen: dict = {}
    truth = plan_vs_search.largest_that_fits(lambda b: fits(model, capacity_mb, b, seen), planned)
    assert fits(model, capacity_mb, planned, seen), (planned, seen[planned], truth)
    assert truth - planned <= 0.05 * truth, (planned, truth)



@pytest.mark.slow
def test_a_forward_hook_that_comes_off_in_the_first_forward_does_not_change_the_plan():
    """The wide CNN case's flake (issue 37): a global forward pre-hook that
    comes off in the first forward (the memory breakdown's first-forward
    hook, in the tree for a while) made the plan 97, which runs out of
    memory in its second step, where 95 is planned without it
    (torch.nn.Module's dispatch runs forward from other lines while a hook
    is registered, so the probe's first step was recorded as other sites;
    tests/unit/test_planner_probes.py). With the hook the plan trains."""
    planned = fresh("plan", "wide_cnn", 100, "hook")["batch"]
    assert fits("wide_cnn", 100, planned, {}), planned
    assert planned >= 0.95 * 95  # the largest that trains 12 steps (the search of the case above)
