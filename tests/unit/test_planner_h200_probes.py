"""The batch planner's replay of probes recorded on the H200 (issue 37):
benchmarks/fit/planner_corpus's cases on CUDA (torch 2.11.0+cu130, 2026-12-03,
benchmarks/results/2026-12-03-gpu-planner-corpus.json), their probe records
written by ``MEMALLOC_BENCH_DUMP`` (tests/planner_cases/h200/), planned again
here on the host as ``memalloc.largest_batch`` planned them there. The
truth is the GPU's: the largest batch that ran 10 steps (and 67, where the
plan was below it) in the corpus's search with real out-of-memory errors,
each trial a fresh process under the same memory fraction."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from memalloc.features import planner

MiB = 1 << 20
H200 = Path(__file__).resolve().parents[1] / "planner_cases" / "h200"
CONFIG = "expandable_segments:True"  # memalloc.enable()'s default, the corpus's policy


def records(name: str) -> list[planner.ProbeRecord]:
    with gzip.open(H200 / f"plan-{name}.json.gz", "rt") as f:
        return [planner.ProbeRecord.from_json(d) for d in json.load(f)]


# (records, budget in MiB, the largest batch that ran on the H200, the largest that failed there)
CASES = [("transformer-8192", 8192, 80, 81), ("gpt2-8192", 8192, 8, 9), ("resnet-6144", 6144, 69, 71)]


@pytest.mark.parametrize("name,budget_mb,runs,fails", CASES, ids=[c[0] for c in CASES])
def test_the_plan_from_the_h200s_probes_is_within_5_percent_of_what_ran_there(name, budget_mb, runs, fails):
    """Planned again from the same records it is what the H200's planner
    said (the replay is deterministic), never a batch that failed there,
    and within 5% of the largest that ran (ResNet-50: 69 ran 67 steps, 70
    ran 10; GPT-2: 9 ran 10 steps in an earlier search the same day and
    failed in this one)."""
    p = planner.plan(records(name), budget_mb * MiB, CONFIG)
    assert p.batch < fails and p.batch >= 0.95 * runs, (p.batch, runs, str(p))


def blocks_in_use_after_each_turn(pattern, turns: int) -> list[int]:
    """The replay's blocks in use at the end of each turn of its cycle,
    counted from its ops alone (planner._replay's keys, no allocator)."""
    live, keys = set(), 0
    for op in pattern.ops:
        if op[0] == "alloc":
            live.add(keys)
            keys += 1
        else:
            live.discard(op[1])
    sites, counts = list(pattern.sites), []
    for _ in range(turns):
        for template in pattern.cycle:
            made, ranks = {}, {}
            sites.append(made)
            for op in template:
                if op[0] == "alloc":
                    rank = ranks.get(op[2], 0)
                    ranks[op[2]] = rank + 1
                    made[op[2], rank] = keys
                    live.add(keys)
                    keys += 1
                else:
                    live.discard(sites[-1 - op[1]].get((op[2], op[3])))
        counts.append(len(live))
    return counts


def test_the_replay_of_the_h200s_transformer_keeps_no_step_more_at_each_turn():
    """From the transformer's first three probes (2, 4, 8), as the H200's
    planner had them before the refinement probe: the replay freed the
    gradients that the first step kept by their rank among the backward's
    allocations (one off after the first backward's one more) and took
    the loss freed as the last step returned for that step's own free, so
    it kept a step's gradients more at every turn (38 and 79 blocks) and
    planned 45 where 80 ran 67 steps. Now the blocks in use come back to the
    same count at every turn, and the plan is within 15% of what ran (the
    refinement probe does the rest: the test above)."""
    recs = records("transformer-8192-probes-2-4-8")
    scaler = planner._Scaler(recs[0], recs[1:])
    counts = blocks_in_use_after_each_turn(planner._pattern_at(recs[0], scaler, recs[0].batch), 6)
    assert len(set(counts)) == 1, counts
    p = planner.plan(recs, 8192 * MiB, CONFIG)
    assert 0.85 * 80 <= p.batch < 81, str(p)
