"""benchmarks/fit/plan_vs_search.py's two searches against brute force: the
largest batch a trial passes (doubling, then bisection) and the largest
between the plan and the short search's largest that a long trial passes.
Each threshold and starting point is checked against the answer a linear
scan gives, and each trial is counted (no batch is tried twice by the
long search)."""

from __future__ import annotations

import pytest

from benchmarks.fit import plan_vs_search


@pytest.mark.parametrize("limit", [0, 1, 2, 7, 8, 9, 63, 64, 65, 100, 1000])
@pytest.mark.parametrize("start", [1, 8, 64])
def test_largest_that_fits_is_the_threshold(limit, start):
    assert plan_vs_search.largest_that_fits(lambda b: b <= limit, start) == limit


@pytest.mark.parametrize("planned,largest", [(136, 144), (17, 17), (19, 20), (1, 50)])
@pytest.mark.parametrize("long_limit", [0, 1, 16, 17, 19, 20, 137, 140, 143, 144, 200])
def test_largest_that_runs_long_is_the_long_threshold_in_range(planned, largest, long_limit):
    tried: list[int] = []

    def runs_long(b: int) -> bool:
        tried.append(b)
        return b <= long_limit

    got = plan_vs_search.largest_that_runs_long(runs_long, planned, largest)
    brute = max((b for b in range(planned, largest + 1) if b <= long_limit), default=0)
    assert got == brute
    assert len(tried) == len(set(tried)), tried
    assert tried[0] == planned  # the plan's own batch first: whether it runs the steps it was planned for
