"""Boundaries with no setup (memalloc/core/iteration.py): while a leak check or a
step tracker runs and the code marks no iteration itself, optimizer.step()
marks them; the first explicit memalloc.step() hands them to the code; the
reports say which boundaries they used. In this process, on allocators the
tests own (step numbers relative to the process's counter)."""

from __future__ import annotations

import gc

import pytest
import torch

import memalloc
from memalloc.core import iteration

KiB = 1 << 10


def line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, l in enumerate(f, 1) if l.rstrip().endswith(marker) and "line_of(" not in l)


@pytest.fixture
def allocator():
    a = memalloc.Allocator("host", "host_capacity_mb:64")
    yield a
    gc.collect()
    a.validate()


@pytest.fixture(autouse=True)
def no_hook_left():
    """Every test leaves the optimizer hook as it found it (off)."""
    assert not iteration._auto.hooked and not iteration.auto_step_enabled()
    yield
    assert not iteration._auto.hooked and iteration._auto.watchers == 0


def sgd():
    w = torch.nn.Parameter(torch.ones(4))
    return w, torch.optim.SGD([w], lr=0.1)


def train_step(w, opt):
    opt.zero_grad()
    (w * 2).sum().backward()
    opt.step()


def test_leak_check_takes_its_steps_from_the_optimizer(allocator):
    w, opt = sgd()
    kept = []
    with memalloc.leak_check(allocator=allocator) as check:
        for _ in range(12):
            train_step(w, opt)
            kept.append(memalloc.host.empty(1024, torch.uint8, allocator=allocator))  # KEPT-EVERY-STEP
    assert check.report.boundaries == "12 from optimizer.step()"
    assert len(check.report.steps) == 12
    assert len(check.leaks) == 1, check.to_text()
    leak = check.leaks[0]
    assert leak.bytes_per_step == pytest.approx(1 * KiB)
    assert (leak.alloc_site["filename"], leak.alloc_site["line"]) == (__file__, line_of("# KEPT-EVERY-STEP"))
    assert "boundaries: 12 from optimizer.step()" in check.to_text().splitlines()[0]
    del kept


def test_the_first_explicit_step_hands_the_boundaries_to_the_code(allocator):
    w, opt = sgd()
    before = iteration.boundary_counts()
    with memalloc.StepTracker(allocator=allocator) as t:
        for _ in range(5):
            train_step(w, opt)  # marks a boundary only before the first memalloc.step()
            memalloc.step()
    # Five iterations, five boundaries: the one optimizer.step() marked in
    # the first iteration stood in for that iteration's memalloc.step(),
    # which takes it over instead of marking a second one.
    used = {k: v - before[k] for k, v in iteration.boundary_counts().items()}
    assert used == {"memalloc.step()": 5, "optimizer.step()": 0}
    assert t.boundaries == "5 from memalloc.step()"
    assert len(t.rows) == 5 and t.to_dict()["boundaries"] == t.boundaries


def test_optimizer_boundaries_before_a_late_first_step_stay_theirs(allocator):
    w, opt = sgd()
    before = iteration.boundary_counts()
    with memalloc.StepTracker(allocator=allocator) as t:
        for _ in range(3):
            train_step(w, opt)  # three iterations marked by optimizer.step() alone
        for _ in range(2):
            train_step(w, opt)
            memalloc.step()  # the first one takes over its iteration's optimizer boundary
    used = {k: v - before[k] for k, v in iteration.boundary_counts().items()}
    assert used == {"memalloc.step()": 2, "optimizer.step()": 3}
    assert len(t.rows) == 5


def test_no_watcher_no_boundaries_from_the_optimizer():
    w, opt = sgd()
    before = iteration.boundary_counts()
    for _ in range(3):
        train_step(w, opt)
    assert iteration.boundary_counts() == before


def test_auto_step_and_a_watcher_mark_each_optimizer_step_once(allocator):
    w, opt = sgd()
    memalloc.auto_step()
    try:
        with memalloc.StepTracker(allocator=allocator) as t:
            for _ in range(4):
                train_step(w, opt)
            memalloc.step()  # auto_step keeps marking after an explicit step
            train_step(w, opt)
    finally:
        memalloc.auto_step(False)
    assert t.boundaries == "1 from memalloc.step() and 5 from optimizer.step()"
    assert [r["step"] for r in t.rows] == list(range(t.rows[0]["step"], t.rows[0]["step"] + 6))


def test_two_watchers_one_boundary_per_optimizer_step_and_hook_removed_after(allocator):
    w, opt = sgd()
    with memalloc.StepTracker(allocator=allocator) as t1, memalloc.StepTracker(allocator=allocator) as t2:
        for _ in range(3):
            train_step(w, opt)
        assert iteration._auto.watchers == 2
    assert (len(t1.rows), len(t2.rows)) == (3, 3)
    assert t1.boundaries == t2.boundaries == "3 from optimizer.step()"


def test_a_tracker_with_no_boundaries_says_so(allocator):
    with memalloc.leak_check(allocator=allocator) as check:
        pass
    assert check.report.boundaries == "none"
    assert "iterations are marked by optimizer.step()" in check.to_text()
