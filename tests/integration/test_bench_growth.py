"""benchmarks/speed/growth.py's own logic, without a GPU: which steps of the train
case grow, that every process draws the same lengths, how runs are summed
up (medians over processes, memalloc's ratios to the other modes, from
figures this test computes itself), and the arguments it refuses. The GPU
figures: benchmarks/results/*growth*.json."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.speed import growth


def test_a_step_grows_when_its_length_is_the_longest_so_far():
    assert growth.growing_steps([512, 256, 1024, 1024, 2048, 64]) == [True, False, True, False, True, False]
    ls = growth.lengths()
    assert ls == growth.lengths() and len(ls) == growth.TRAIN_STEPS and all(256 <= n <= 2048 for n in ls)
    assert any(growth.growing_steps(ls)[1:]) and not all(growth.growing_steps(ls))


def train_run(mode: str, scale: float) -> dict:
    ls = [512, 256, 1024, 768, 2048]
    return {
        "mode": mode,
        "case": "train",
        "lengths": ls,
        "step_ms": [scale * (i + 1) for i in range(len(ls))],
        "peak_reserved": 100 * scale,
        "peak_allocated": 90.0,
    }


def test_summary_is_medians_over_processes_and_memallocs_ratios():
    runs = [train_run("native", s) for s in (1.0, 3.0, 2.0)] + [train_run("memalloc", s) for s in (2.0, 4.0, 6.0)]
    runs += [
        {"mode": m, "case": "fresh16", "fresh_ms": f, "again_ms": 0.5}
        for m, f in [("expandable", 50.0), ("expandable", 48.0), ("memalloc", 400.0), ("memalloc", 380.0)]
    ]
    s = growth.summarize(runs)
    # growing steps are steps 1, 3 and 5 (times 1, 3, 5 x scale): their median is 3 x scale
    native, memalloc = s["train"]["native"], s["train"]["memalloc"]
    assert native["growing_step_ms"] == statistics.median([3.0, 9.0, 6.0]) == 6.0
    assert native["other_step_ms"] == statistics.median([3 * 1.0, 3 * 3.0, 3 * 2.0])  # steps 2 and 4: (2 + 4) / 2
    assert native["run_ms"] == 15 * 2.0 and memalloc["run_ms"] == 15 * 4.0
    assert s["train"]["memalloc_over_native"]["growing_step_ms"] == pytest.approx(12.0 / 6.0)
    assert s["train"]["memalloc_over_native"]["peak_reserved"] == pytest.approx(400 / 200)
    assert s["fresh16"]["memalloc_over_expandable"] == {"fresh_ms": 390.0 / 49.0, "again_ms": 1.0}
    assert s["fresh16"]["memalloc"]["processes"] == 2


def test_unknown_cases_and_modes_are_refused(capsys):
    with pytest.raises(SystemExit):
        growth.main(["--cases", "fresh16,nope"])
    assert "unknown cases or modes ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        growth.main(["--procs", "0"])
