"""The advisor on a real run that leaks (issue 37, item 4): a CPU script on the
host backend keeps every step's logits in a list. Its advice must not
contradict the run: no DDP on a CPU, a del + empty_cache figure no lower
than what the script holds between steps, and, given the same run's leak
report, the leak first and the leaked logits left out of the activations.
Every truth is what the script itself measures: the storage bytes of the
tensors it keeps (the list, the parameters, their gradients, Adam's state)."""

from __future__ import annotations

import json
import textwrap

import pytest

from memalloc import advisor
from memalloc.core._format import fmt_bytes
from memalloc.features.breakdown import CATEGORIES, MemoryBreakdown

STEPS = 12
LOOP = textwrap.dedent(f"""
    import json, sys
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1000))
    opt = torch.optim.Adam(model.parameters())
    kept = []
    for step in range({STEPS}):
        x = torch.randn(128, 64)
        y = torch.randint(0, 1000, (128,))
        logits = model(x)
        kept.append(logits)  # the leak
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def nbytes(tensors):
        return sum(t.untyped_storage().nbytes() for t in tensors)

    truth = {{
        "logits": kept[-1].untyped_storage().nbytes(),
        "kept": nbytes(kept),
        "kept_before_last_step": nbytes(kept[:-1]),
        "parameters": nbytes(model.parameters()),
        "gradients": nbytes(p.grad for p in model.parameters()),
        "optimizer_state": nbytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)),
        # what the last step itself holds when its optimizer steps (the peak's moment): the batch, the logits
        "step_tensors": nbytes([x, y, logits]),
    }}
""")
TRUTH_OUT = 'json.dump(truth, open(sys.argv[1], "w"))\n'

# The same loop under the advisor's API, as `run --leaks --advise` starts it:
# boundaries at optimizer.step(), a leak tracker, a forward profile, the
# reserved bytes at each boundary; at the end the leak report goes to advise().
API_PRELUDE = textwrap.dedent("""
    import memalloc
    from memalloc import advisor
    from memalloc.core import iteration
    from memalloc.features import stats
    from memalloc.features.breakdown import memory_breakdown
    from memalloc.features.leaks import LeakTracker
    from memalloc.install import host
    memalloc.enable(backend="host", config="host_capacity_mb:256")
    host.use_for_cpu_tensors()
    iteration.auto_step()
    tracker = LeakTracker(warmup_steps=1).start()
    profile = advisor.ForwardProfile().start()
    seen = {}
    iteration.add_step_listener(lambda n: seen.__setitem__("reserved_after", stats.memory_reserved(0)))
""")
API_END = textwrap.dedent("""
    tracker.stop()
    profile.stop()
    report = tracker.report()
    b = memory_breakdown(0)
    advice = advisor.advise(b, profile.profile(), seen["reserved_after"], leaks=report)
    json.dump({"truth": truth, "breakdown": b.to_dict(), "reserved_after": seen["reserved_after"],
               "held_between_steps": profile.held_between_steps, "profile": profile.profile().to_dict(),
               "visible_gpus": advisor.visible_gpus(),
               "advice": [a.to_dict() for a in advice], "text": advisor.to_text(advice, b),
               "leaks": report.to_dict()}, open(sys.argv[1], "w"))
""")


def leak_line(source: str) -> int:
    return next(i for i, l in enumerate(source.splitlines(), 1) if l.endswith("# the leak"))


def breakdown(**peak: int) -> MemoryBreakdown:
    split = dict.fromkeys(CATEGORIES, 0) | peak
    return MemoryBreakdown(0, "forward", split, 0, split, 3, 0)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, fresh_python):
    """`python -m memalloc run --advise` of the leaking script on the host backend."""
    d = tmp_path_factory.mktemp("advise_cli")
    script = d / "train.py"
    script.write_text(LOOP + TRUTH_OUT)
    p = fresh_python.run(
        [
            "-m",
            "memalloc",
            "run",
            "--advise",
            "--backend",
            "host",
            "--config",
            "host_capacity_mb:256",
            "--out",
            str(d / "out"),
            str(script),
            str(d / "truth.json"),
        ],
        cwd=d,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return {
        "stderr": p.stderr,
        "advice": json.loads((d / "out" / "advice.json").read_text()),
        "truth": json.loads((d / "truth.json").read_text()),
    }


@pytest.fixture(scope="module")
def api_run(tmp_path_factory, fresh_python):
    """The same loop with the leak tracker's report given to advise()."""
    d = tmp_path_factory.mktemp("advise_api")
    script = d / "train.py"
    source = API_PRELUDE + LOOP + API_END
    script.write_text(source)
    p = fresh_python.run([str(script), str(d / "out.json")], cwd=d)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads((d / "out.json").read_text())
    data["script"], data["line"] = str(script), leak_line(source)
    return data


def by_name(advice: list[dict]) -> dict[str, dict]:
    return {a["strategy"]: a for a in advice}


# ---- 1. what cannot apply is not listed ------------------------------------------------------
def test_ddp_needs_a_second_gpu():
    b = breakdown(parameters=30, gradients=5, optimizer_state=60, activations=100, temporaries=20)
    for gpus in (0, 1):
        assert "ddp" not in {a.strategy for a in advisor.advise(b, gpus=gpus)}
    assert {a.strategy: a.saves for a in advisor.advise(b, gpus=2)}["ddp"] == 60 - 30


@pytest.mark.slow  # a training script in a fresh process (the rules themselves: the fast tests above)
def test_no_ddp_on_a_cpu_run(cli_run):
    assert "ddp" not in by_name(cli_run["advice"]["advice"]) and "ddp " not in cli_run["stderr"]
    assert "a second GPU" not in cli_run["stderr"]


# ---- 2. del + empty_cache: what must stay reserved is at least what the run holds -------------
@pytest.mark.slow  # a training script in a fresh process (the rules themselves: the fast tests above)
def test_del_empty_cache_keeps_what_the_run_holds_between_steps(cli_run):
    t, data = cli_run["truth"], cli_run["advice"]
    # at every boundary after the first the script holds these (zero_grad(set_to_none=True)
    # comes before backward, so the gradients live across the boundary)
    held = t["kept"] + t["parameters"] + t["gradients"] + t["optimizer_state"]
    a = by_name(data["advice"])["del_empty_cache"]
    stays = data["reserved_after"] - a["saves"]
    assert a["saves"] > 0 and stays >= held, (fmt_bytes(stays), fmt_bytes(held))
    assert f"({fmt_bytes(stays)}) must stay reserved, not {fmt_bytes(data['reserved_after'])}" in a["why"]
    # the figure is the run's own: the segments and pages holding what the run held allocated
    # at the last boundary (what empty_cache() there would keep)
    assert stays == data["profile"]["kept_reserved"] >= data["profile"]["held_between_steps"] >= held
    assert f"the {fmt_bytes(data['profile']['held_between_steps'])} the run kept allocated" in a["why"]


def test_del_empty_cache_counts_a_known_leak_without_a_profile():
    b = breakdown(parameters=30, optimizer_state=60, activations=100, other=7)
    leak = leak_of(series=[10, 20, 30, 40], steps=[1, 2, 3, 4])
    got = {a.strategy: a.saves for a in advisor.advise(b, reserved_after=500, leaks=[leak], gpus=0)}
    assert got["del_empty_cache"] == 500 - (30 + 60 + 7 + 40)  # the leak held 40 at the last boundary


# ---- 3. the leak report of the same run ----------------------------------------------------
def leak_of(series, steps, cause="container"):
    from memalloc.reporters.leak_report import Leak

    site = {"filename": "train.py", "line": 9, "function": "<module>"}
    return Leak(
        site=site,
        code="kept.append(x)",
        alloc_site=site,
        alloc_code="",
        stack=[],
        bytes_per_step=10.0,
        tensors_per_step=1.0,
        retained_bytes=series[-1],
        retained_tensors=len(series),
        first_step=steps[0] - 1,
        series=series,
        cause=cause,
        hint="keep .item()",
    )


def test_leaked_bytes_are_not_activations_on_made_up_figures():
    from memalloc.reporters.leak_report import LeakReport

    b = breakdown(parameters=30, gradients=5, optimizer_state=60, activations=100, temporaries=20)
    report = LeakReport(
        backend="host",
        device=0,
        steps=[1, 2, 3],
        allocated=[0] * 3,
        reserved=[0] * 3,
        leaks=[leak_of([20, 40, 60], [1, 2, 3])],
    )
    advice = advisor.advise(b, leaks=report, gpus=2)
    assert advice[0].strategy == "fix_leak" and advice[0].saves == 40  # held at boundary 2: step 3's start
    got = {a.strategy: a.saves for a in advice}
    assert got["half_batch"] == (100 - 40 + 20) // 2
    assert got["ddp"] == (100 - 40 + 20) // 2 - 30
    # a leak of parameter groups holds parameters and state, not activations
    report.leaks = [leak_of([20, 40, 60], [1, 2, 3], cause="optimizer_state")]
    assert {a.strategy: a.saves for a in advisor.advise(b, leaks=report)}["half_batch"] == (100 + 20) // 2


@pytest.mark.slow  # a training script in a fresh process (the rules themselves: the fast tests above)
def test_the_leak_comes_first_and_is_not_counted_as_activations(api_run):
    t, advice = api_run["truth"], api_run["advice"]
    (leak,) = api_run["leaks"]["leaks"]
    assert leak["site"]["line"] == api_run["line"] and leak["bytes_per_step"] == t["logits"]
    first = advice[0]
    assert first["strategy"] == "fix_leak"
    assert first["saves"] == t["kept_before_last_step"]  # the list when the peak's (last) step began
    lines = api_run["text"].splitlines()
    assert (
        lines[1]
        .split(None, 1)[1]
        .startswith(f"fix the leak at {api_run['script']}:{api_run['line']}: +{fmt_bytes(t['logits'])} per step")
    ), lines[1]
    peak = api_run["breakdown"]["peak"]
    # the breakdown counts them as activations (the first step's as other, that step is its warm-up)
    assert peak["activations"] + peak["other"] >= t["kept_before_last_step"]
    got = by_name(advice)
    # The peak is in Adam's step: what scales with the batch there is the step's own batch and
    # logits (the temporaries are Adam's): half of them, within the loss's few bytes and the rounding
    assert api_run["profile"]["peak_phase"] == "optimizer"
    assert got["half_batch"]["saves"] == pytest.approx(t["step_tensors"] / 2, rel=0.02)
    assert "the peak came in the optimizer's step" in got["half_batch"]["why"]
    assert "the leaks held)" in got["half_batch"]["why"]
    assert got["half_batch"]["saves"] < (peak["activations"] + peak["temporaries"]) // 2
    assert "ddp" not in got and api_run["visible_gpus"] == 0  # the host backend: the device is CPU memory
    held = t["kept"] + t["parameters"] + t["gradients"] + t["optimizer_state"]
    if "del_empty_cache" in got:
        assert api_run["reserved_after"] - got["del_empty_cache"]["saves"] >= held
    else:  # empty_cache() at the last boundary would have returned nothing: not advised
        assert api_run["profile"]["kept_reserved"] == api_run["reserved_after"]
    assert [a["saves"] for a in advice[1:]] == sorted((a["saves"] for a in advice[1:]), reverse=True)


@pytest.mark.slow  # a training script in a fresh process (the rules themselves: the fast tests above)
def test_run_leaks_advise_puts_the_leak_first(tmp_path, fresh_python):
    script = tmp_path / "train.py"
    script.write_text(LOOP + TRUTH_OUT)
    p = fresh_python.run(
        [
            "-m",
            "memalloc",
            "run",
            "--leaks",
            "--advise",
            "--backend",
            "host",
            "--config",
            "host_capacity_mb:256",
            "--out",
            str(tmp_path / "out"),
            str(script),
            str(tmp_path / "truth.json"),
        ],
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    t = json.loads((tmp_path / "truth.json").read_text())
    advice = json.loads((tmp_path / "out" / "advice.json").read_text())["advice"]
    assert advice[0]["strategy"] == "fix_leak" and advice[0]["saves"] == t["kept_before_last_step"]
    line = leak_line(LOOP)
    head = f"fix_leak             fix the leak at {script}:{line}: +{fmt_bytes(t['logits'])} per step"
    assert head in p.stderr, p.stderr[-3000:]
