"""benchmarks/fit/free_order.py: fresh processes of one autocast
training loop make the same requests, the frees perhaps in another order
(the order, not the set, follows the host heap: docs/results.md). The test
checks what must hold whatever the order: the same allocations, each freed
once, the same number of requests, and where two runs part it is a free."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from benchmarks.fit import free_order

pytestmark = pytest.mark.slow


def run_worker(perturb: int) -> list:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.fit.free_order", "--worker", str(perturb)],
        cwd=free_order.REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_runs_make_the_same_requests_and_part_only_at_a_free():
    a, b = run_worker(0), run_worker(5000)
    assert len(a) == len(b) > 1000
    assert [x for x in a if x[0] == "alloc"] == [x for x in b if x[0] == "alloc"]  # same sizes, same order
    frees = lambda s: Counter(x[1] for x in s if x[0] == "free")  # noqa: E731
    assert frees(a) == frees(b) and max(frees(a).values()) == 1
    d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if d is not None:
        assert a[d][0] == b[d][0] == "free"
