"""benchmarks/fit/largest_batch.py's pure parts, without a GPU: the sequence lengths
every trial trains on, and the bisection that finds the largest batch (run
against a fake trial with a known answer)."""

from __future__ import annotations

import pytest

from benchmarks.fit import largest_batch


def test_lengths_are_long_tailed_within_bounds_and_repeatable():
    lens = largest_batch.lengths(50)
    assert lens == largest_batch.lengths(50)
    assert all(64 <= n <= 4096 and n % 8 == 0 for n in lens)
    assert max(lens) == 4096 and sorted(lens)[25] < 256  # a few long, most short


@pytest.mark.parametrize("answer,start", [(37, 34), (37, 50), (1, 20), (120, 34), (0, 5)])
def test_bisection_finds_the_largest_batch_that_fits(monkeypatch, answer, start):
    calls = []

    def fake(mode, batch, steps, fraction, max_len=4096, timeout=300):
        calls.append(batch)
        fits = batch <= answer
        return {
            "mode": mode,
            "batch": batch,
            "ok": fits,
            "steps_done": steps if fits else 3,
            "peak_allocated": batch * 10,
            "peak_reserved": batch * 11,
            "step_ms_median": 1.0,
        }

    monkeypatch.setattr(largest_batch, "run_trial", fake)
    r = largest_batch.largest_batch("native", start, 50, 0.1, [])
    assert r["largest_batch"] == answer
    if answer:
        assert r["smallest_failing"] == answer + 1 and r["peak_reserved"] == answer * 11
    assert len(calls) == len(set(calls)) and len(calls) <= 14  # no batch twice, few trials
