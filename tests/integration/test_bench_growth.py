"""benchmarks/speed/growth.py's own logic, without a GPU: which steps of the train
case grow, that every process draws the same lengths, how runs are summed
up (medians over processes, memalloc's ratios to the other modes, from
figures this test computes itself), and the arguments it refuses. The GPU
figures: benchmarks/results/*growth*.json."""

from __future__ import annotations

import json
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
    assert native["step_ms"] == [2.0 * (i + 1) for i in range(5)]  # step i's median: (i + 1) x the median scale
    assert "step_ms" not in s["train"]["memalloc_over_native"]
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


def test_warmup_processes_come_first_and_stay_out_of_the_summary(monkeypatch, tmp_path, capsys):
    """On a fresh machine the first process pays the cold caches (1.2-1.7 s
    per growing step against 0.67-0.77 s, 2026-12-06's H100 runs): each case
    gets --warmup untimed processes of the first mode before the timed rounds,
    whose order turns each round."""
    calls = []

    def spawn(mode, case):
        calls.append((mode, case))
        first = len(calls) <= 2  # the warm-up processes: a cold machine's figures
        return {"mode": mode, "case": case, "fresh_ms": 1000.0 if first else 10.0, "again_ms": 1.0}

    monkeypatch.setattr(growth, "_spawn", spawn)
    out = tmp_path / "g.json"
    argv = ["--cases", "fresh16,fresh64x256", "--modes", "native,memalloc", "--procs", "2", "--out", str(out)]
    assert growth.main(argv) == 0
    assert calls == [
        ("native", "fresh16"), ("native", "fresh64x256"),  # warm-up
        ("native", "fresh16"), ("memalloc", "fresh16"), ("native", "fresh64x256"), ("memalloc", "fresh64x256"),
        ("memalloc", "fresh16"), ("native", "fresh16"), ("memalloc", "fresh64x256"), ("native", "fresh64x256"),
    ]  # fmt: skip
    result = json.loads(out.read_text())
    assert result["complete"] is True
    assert [(w["mode"], w["case"]) for w in result["warmup"]] == calls[:2] and len(result["runs"]) == 8
    assert result["summary"]["fresh16"]["native"] == {"fresh_ms": 10.0, "again_ms": 1.0, "processes": 2}
    calls.clear()
    assert growth.main(argv + ["--warmup", "0"]) == 0 and len(calls) == 8
    with pytest.raises(SystemExit):
        growth.main(["--warmup", "-1"])
    assert "--warmup < 0" in capsys.readouterr().err


def test_a_run_cut_short_keeps_what_it_measured(monkeypatch, tmp_path):
    """A device call's time limit can end the benchmark mid-run (2026-12-06:
    nothing came back after 345 s): --out is rewritten after every process,
    so a run stopped after its fourth timed process leaves those four and
    their summary, marked incomplete. Here the fifth fails instead."""
    done = []

    def spawn(mode, case):
        if len(done) == 5:
            return None
        done.append((mode, case))
        return {"mode": mode, "case": case, "fresh_ms": float(len(done) ** 2), "again_ms": 1.0}

    monkeypatch.setattr(growth, "_spawn", spawn)
    out = tmp_path / "g.json"
    assert growth.main(["--cases", "fresh16", "--modes", "native,memalloc", "--procs", "3", "--out", str(out)]) == 1
    result = json.loads(out.read_text())
    assert result["complete"] is False and len(result["warmup"]) == 1 and len(result["runs"]) == 4
    # warm-up 1; timed: native 4, memalloc 9, then memalloc 16, native 25 (the order turns)
    assert result["summary"]["fresh16"]["native"]["fresh_ms"] == statistics.median([4.0, 25.0])
    assert result["summary"]["fresh16"]["memalloc_over_native"]["fresh_ms"] == pytest.approx(12.5 / 14.5)
