"""The framework callbacks (memalloc/integrations/) in real Lightning and HF
Trainer runs on the host backend, each run in a fresh interpreter
(tests/callback_cases/): the figures read back from the loggers' own files
(CSVLogger's metrics.csv, TensorBoard's event files, the Trainer's logs and
log_history) equal the truths the case's own callbacks recorded at the same
moment (memalloc.memory's queries; the optimizer's state tensors, summed by
the case); a planted leak is warned once with the case's line and written to
memalloc-leaks.json in the logger's folder; an OOM leaves its report there.

The fast tier runs Lightning (automatic optimization, CSV, a leak) and HF
Trainer (a leak, logs captured by a callback); the slow tier the rest: manual
optimization, TensorBoard for both, a clean run, an OOM. Without lightning,
transformers or tensorboard the runs that need them skip, except where
``MEMALLOC_REQUIRE_LIBRARIES=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from memtest_helpers import REPO, check_run_page

CASES = REPO / "tests" / "callback_cases"
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
FIGURES = ("allocated", "reserved", "peak_allocated", "peak_reserved")
STEPS = 12


def _need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing and os.environ.get("MEMALLOC_REQUIRE_LIBRARIES") == "1":
        raise RuntimeError(f"MEMALLOC_REQUIRE_LIBRARIES=1 but not installed: {', '.join(missing)}")
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def _run(fresh_python, tmp_path, script: str, *args: str) -> dict:
    p = fresh_python.run([str(CASES / script), str(tmp_path / "out"), *args], cwd=tmp_path, timeout=600)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    assert p.returncode == 0 and len(lines) == 1, f"rc={p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return json.loads(lines[0][len("RESULT ") :])


def _csv_rows(log_dir: str) -> dict[int, dict[str, int]]:
    """{step: {figure: bytes}} from CSVLogger's metrics.csv (the rows MemoryMonitor wrote)."""
    with open(os.path.join(log_dir, "metrics.csv"), newline="") as f:
        return {
            int(r["step"]): {k: int(float(v)) for k, v in r.items() if k.startswith("memalloc/")}
            for r in csv.DictReader(f)
            if r.get("memalloc/allocated_bytes")
        }


def _tensorboard_rows(log_dir: str, prefix: str = "") -> dict[int, dict[str, float]]:
    """{step: {figure: value}} from the TensorBoard event files under log_dir (tags without ``prefix``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True)
    assert files, f"no TensorBoard event file under {log_dir}"
    out: dict[int, dict[str, float]] = {}
    for path in files:
        ea = EventAccumulator(path, size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            if tag.startswith(prefix + "memalloc/"):
                for e in ea.Scalars(tag):
                    out.setdefault(e.step, {})[tag[len(prefix) :]] = e.value
    return out


def _float32(n: int) -> float:
    import numpy as np

    return float(np.float32(n))  # TensorBoard keeps scalars as float32


def _check_figures(logged: dict, truth: dict, exact: bool = True) -> None:
    """Every step's figures equal the truths recorded at that step; the
    breakdown adds up to the peak; optimizer_state is the optimizer's state
    tensors from the second step on (the first step's peak may precede them)."""
    same = (lambda a, b: a == b) if exact else (lambda a, b: a == _float32(b))
    assert sorted(logged) == sorted(int(s) for s in truth), (sorted(logged), sorted(truth))
    for step, figures in sorted(logged.items()):
        t = truth[str(step)]
        for f in FIGURES:
            assert same(figures[f"memalloc/{f}_bytes"], t[f]), (step, f, figures, t)
        split = [figures[f"memalloc/breakdown/{c}_bytes"] for c in CATEGORIES]
        if exact:
            assert sum(split) == t["peak_allocated"], (step, figures, t)
        if step > min(logged):
            assert t["optimizer_state"] > 0
            assert same(figures["memalloc/breakdown/optimizer_state_bytes"], t["optimizer_state"]), (step, figures, t)
        assert figures["memalloc/leak_bytes_per_step"] >= 0


def _check_leak(r: dict, folder: str, script: str) -> None:
    line = r["lines"]["# LEAK-LINE"]
    assert len(r["warnings"]) == 1, r["warnings"]
    assert f"{script}:{line} " in r["warnings"][0] and "per step" in r["warnings"][0], r["warnings"]
    report = json.load(open(os.path.join(folder, "memalloc-leaks.json")))
    assert [(os.path.basename(l["site"]["filename"]), l["site"]["line"]) for l in report["leaks"]] == [(script, line)]


def _check_clean(r: dict, folder: str) -> None:
    assert r["warnings"] == []
    assert json.load(open(os.path.join(folder, "memalloc-leaks.json")))["leaks"] == []


# ---- Lightning -------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,logger,what",
    [
        ("automatic", "csv", "leak"),
        pytest.param("manual", "csv", "clean", marks=pytest.mark.slow),
        pytest.param("automatic", "tensorboard", "clean", marks=pytest.mark.slow),
        pytest.param("manual", "tensorboard", "leak", marks=pytest.mark.slow),
    ],
)
def test_lightning_memory_monitor(fresh_python, tmp_path, mode, logger, what):
    _need("lightning", *(["tensorboard"] if logger == "tensorboard" else []))
    r = _run(fresh_python, tmp_path, "lightning_case.py", mode, logger, what, "host")
    assert r["error"] is None
    assert r["log_dir"].startswith(str(tmp_path))
    if logger == "csv":
        logged = _csv_rows(r["log_dir"])
    else:
        logged = _tensorboard_rows(r["log_dir"])
    assert len(logged) == STEPS
    _check_figures(logged, r["truth"], exact=logger == "csv")
    last = logged[max(logged)]["memalloc/leak_bytes_per_step"]
    page = check_run_page(r, r["log_dir"], "lightning_case.py")
    if what == "leak":
        assert last > 0
        _check_leak(r, r["log_dir"], "lightning_case.py")
        assert [l["site"]["line"] for l in page["leaks"]["leaks"]] == [r["lines"]["# LEAK-LINE"]]
    else:
        assert last == 0
        _check_clean(r, r["log_dir"])


@pytest.mark.slow
def test_lightning_oom_report_in_the_log_dir(fresh_python, tmp_path):
    _need("lightning")
    r = _run(fresh_python, tmp_path, "lightning_case.py", "automatic", "csv", "oom", "host")
    reports = glob.glob(os.path.join(r["log_dir"], "oom-*.txt"))
    assert r["error"] and len(reports) == 1 and reports[0] in r["error"], (r["error"], reports)
    text = open(reports[0]).read()  # the request that failed, then what held the memory
    assert f"{1 << 42} bytes requested" in text and "Live allocations holding the most memory" in text, text
    assert os.path.exists(reports[0][: -len(".txt")] + ".pickle")
    page = check_run_page(r, r["log_dir"], "lightning_case.py", state="raised")  # written by on_exception
    assert [o["bytes"] for o in page["ooms"]] == [1 << 42]
    assert [f["file"] for f in page["oom_files"]] == [os.path.basename(reports[0])]


# ---- HF Trainer --------------------------------------------------------------


@pytest.mark.parametrize(
    "report,what", [("none", "leak"), pytest.param("tensorboard", "clean", marks=pytest.mark.slow)]
)
def test_transformers_memory_callback(fresh_python, tmp_path, report, what):
    _need("transformers", "accelerate", *(["tensorboard"] if report == "tensorboard" else []))
    r = _run(fresh_python, tmp_path, "hf_case.py", report, what, "host")
    # ahead of the report_to callbacks, so they receive the figures with the loss
    assert r["order"][:2] == ["DefaultFlowCallback", "MemoryCallback"], r["order"]
    steps = {l["step"]: {k: v for k, v in l.items() if k.startswith("memalloc/")} for l in r["logs"] if "loss" in l}
    assert len(steps) == STEPS
    _check_figures(steps, r["truth"])
    history = {h["step"]: h for h in r["history"] if "loss" in h}
    assert all(history[s][k] == v for s, figures in steps.items() for k, v in figures.items())
    if report == "tensorboard":
        logged = _tensorboard_rows(str(tmp_path / "out" / "runs"), prefix="train/")
        _check_figures(logged, r["truth"], exact=False)
    folder = str(tmp_path / "out")
    check_run_page(r, folder, "hf_case.py")
    if what == "leak":
        assert steps[STEPS]["memalloc/leak_bytes_per_step"] > 0
        _check_leak(r, folder, "hf_case.py")
    else:
        _check_clean(r, folder)


# ---- without enable(), and the imports ------------------------------------------


def test_importing_memalloc_imports_no_framework():
    code = "import sys, memalloc; print(sorted(m for m in ('lightning', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module,name", [("lightning", "MemoryMonitor"), ("transformers", "MemoryCallback")])
def test_callback_without_enable_names_the_fix(fresh_python, module, name):
    _need(module)
    code = (
        f"from memalloc.integrations.{module} import {name}\n"
        f"try:\n    {name}()\nexcept RuntimeError as e:\n    print('ERROR', e)\n"
    )
    p = fresh_python.run(["-c", code])
    assert p.returncode == 0, p.stderr
    assert f"ERROR {name} needs memalloc" in p.stdout and "memalloc.enable()" in p.stdout, p.stdout
