"""The batch planner's plan runs (issue 37, item 5): in a fresh interpreter
as a user runs it (tests/planner_cases/fresh_run.py), the batch
memalloc.largest_batch plans trains STEPS steps without running out of
memory, later steps' fragmentation included, and is within 5% of the
largest batch that does, found by a real search (benchmarks/fit/plan_vs_search's
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

from benchmarks.fit import plan_vs_search

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


@pytest.mark.parametrize(
    "model,capacity_mb",
    [
        # a search of fresh processes (60-130 s on CI's 2 cores): the slow tier
        pytest.param("wide_cnn", 100, marks=pytest.mark.slow),  # planned 96-97 before (OOM in step 6 or 2); 95 runs
        pytest.param("cnn", 100, marks=pytest.mark.slow),  # planned 288: 288 runs 12 steps, 289 OOMs in its first
        pytest.param("transformer", 128, marks=pytest.mark.slow),  # planned 108: 108 runs 12 steps, 109 OOMs in its 7th
    ],
)
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


def in_process(config: str, batch=None, steps: int = STEPS):
    """wide_cnn on a memalloc.Allocator("host", config) of this process: its
    plan (batch None), or whether ``batch`` trains ``steps`` steps."""
    import gc

    import torch
    from models import MODELS

    import memalloc
    from memalloc import host

    a = memalloc.Allocator("host", config)
    with host.cpu_tensors_from(a):
        step = MODELS["wide_cnn"]()
        try:
            if batch is None:
                return memalloc.largest_batch(step, allocator=a).batch
            try:
                for _ in range(steps):
                    step(batch)
                return True
            except torch.OutOfMemoryError:
                return False
        finally:
            del step
            gc.collect()


@pytest.mark.slow
def test_in_process_and_fresh_process_plans_differ_only_by_the_allocators_policy():
    """Issue 37: the wide CNN planned 85 in-process (tests/integration/
    test_planner.py's way: memalloc.Allocator("host", "host_capacity_mb:100"))
    and 95 in a fresh process under memalloc.enable(). Each is right for its
    allocator: enable() turns expandable_segments on (memalloc's default),
    a memalloc.Allocator takes its config as given (off), and the planner
    replays the allocator's own policy (planner.policy_config). Under one
    policy the two agree; without expandable segments 85 trains and 86 does
    not, in this process as in the plan."""
    sys.path.insert(0, os.path.dirname(RUN))
    assert in_process("host_capacity_mb:100,expandable_segments:True") == fresh("plan", "wide_cnn", 100)["batch"]
    planned = in_process("host_capacity_mb:100")
    assert in_process("host_capacity_mb:100", planned) and not in_process("host_capacity_mb:100", planned + 1, 3)


@pytest.mark.slow
def test_a_leaking_step_is_planned_for_the_steps_the_plan_names():
    """A step that keeps 1 KiB per sample every step never comes back to a
    state it was in: the plan says so (not steady, after MAX_REPEATS steps
    beyond the probes') and is the largest batch that runs its own first
    step, the probes' two recorded steps and those MAX_REPEATS steps, within
    5% (a search of fresh processes each training that many steps)."""
    from memalloc.features import planner

    plan = fresh("plan", "leaky_mlp", 64)
    assert not plan["steady"] and plan["repeats"] == planner.MAX_REPEATS, plan
    horizon = 1 + 2 + planner.MAX_REPEATS  # largest_batch's default steps=2 after the first
    seen: dict = {}

    def trial(batch: int) -> bool:
        if batch not in seen:
            seen[batch] = fresh("trial", "leaky_mlp", 64, batch, horizon)
        return seen[batch]["fits"]

    truth = plan_vs_search.largest_that_fits(trial, plan["batch"])
    assert trial(plan["batch"]), (plan, seen)
    assert truth - plan["batch"] <= 0.05 * truth, (plan, truth)
    # the leak is what limits it: the same batch's growth over 12 steps leaves room for a larger one
    assert fresh("trial", "leaky_mlp", 64, truth + truth // 4, 12)["fits"], truth
