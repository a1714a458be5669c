"""benchmarks/compat/conformance.py, the runner of torch's own tests, on a stand-in
upstream file (no GPU, native mode): per-test outcomes, the selection, a
test that kills its process and one that hangs (past --timeout: its stack
in the message) recorded as crashed with the run going on after them,
--only, and --merge's per-test provenance."""

from __future__ import annotations

import json
import textwrap

import pytest

# the slow tier (CI runs it, `-m slow`): the runner on torch-like test files in fresh processes (~30 s), over the
# README's fast-tier budget of 180 s on CI's 2 cores
pytestmark = pytest.mark.slow

from benchmarks.compat import conformance  # noqa: E402 (after the slow mark, as the module's other tests)

FAKE = textwrap.dedent("""
    import os, threading, unittest
    class TestCuda(unittest.TestCase):
        def test_memory_passes(self): pass
        def test_memory_aborts(self): os.abort()
        def test_memory_hangs(self): threading.Event().wait()  # never set
        def test_memory_fails(self): self.assertEqual(1, 2)
        def test_memory_after_the_crash(self): pass
        def test_unrelated(self): pass          # not an allocator test: not selected
    class TestMemPool(unittest.TestCase):
        def test_pool(self): pass               # the whole class is selected
""")


@pytest.fixture(autouse=True)
def no_torch_testing_shims(monkeypatch):
    monkeypatch.setenv("MEMALLOC_CONFORMANCE_SHIMS", "0")  # the stand-in file imports nothing of torch's tests


def _run(tmp_path, *extra):
    up = tmp_path / "up"
    up.mkdir(exist_ok=True)
    (up / "test_cuda.py").write_text(FAKE)
    out = tmp_path / f"out{len(extra)}"
    conformance.main(
        [
            "--upstream",
            str(up),
            "--out",
            str(out),
            "--lanes",
            "cuda:native:default",
            "--budget",
            "120",
            "--timeout",
            "3",
            *extra,
        ]
    )
    return json.loads((out / "conformance.json").read_text())


def _outcomes(result, config="default"):
    return {t.split("::")[-1]: m["native"] for t, m in result["tests"]["cuda"][config].items()}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMALLOC_CONFORMANCE_SHIMS", "0")
        return _run(tmp_path_factory.mktemp("conformance"))


def test_outcomes_crash_and_selection(full):
    r = full
    assert _outcomes(r) == {
        "test_memory_passes": "passed",
        "test_memory_aborts": "crashed",
        "test_memory_hangs": "crashed",
        "test_memory_fails": "failed",
        "test_memory_after_the_crash": "passed",
        "test_pool": "passed",
    }
    s = r["summary"]["cuda/default"]
    assert s["passed_natively"] == 3 and s["passed_natively_and_under_memalloc"] == 0
    assert all(v["outcome"] == "not run" for v in s["regressions"].values())  # memalloc was not run
    messages = r["messages"]["cuda"]["default"]["native"]
    assert "1 != 2" in messages[next(t for t in messages if t.endswith("test_memory_fails"))]
    hung = messages[next(t for t in messages if t.endswith("test_memory_hangs"))]
    assert "Timeout" in hung and "in test_memory_hangs" in hung  # faulthandler's dump names where it hung


def test_only_and_merge_keep_the_latest_outcome_per_test(tmp_path, full):
    only = tmp_path / "only.txt"
    only.write_text("TestCuda::test_memory_fails\n")
    part = _run(tmp_path, "--only", str(only))
    assert list(_outcomes(part)) == ["test_memory_fails"]
    only.write_text("upstream/test/inductor/test_cudagraph_trees.py::TestCase::test_other\n")
    other = _run(tmp_path, "--only", str(only), "--timeout", "3")  # names no test of this file: it runs whole
    assert _outcomes(other) == _outcomes(full)
    paths = []
    for i, r in enumerate((full, part)):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(r))
        paths.append(p)
    merged = conformance.merge(paths, tmp_path / "merged.json")
    assert _outcomes(merged) == _outcomes(full)  # same outcomes; fails came again from run 1
    src = merged["sources"]["cuda/default/native"]
    assert {t.split("::")[-1]: i for t, i in src.items()}["test_memory_fails"] == 1
    assert {t.split("::")[-1]: i for t, i in src.items()}["test_pool"] == 0


def test_memalloc_expandable_hides_the_setting_from_torchs_tests_and_compares_with_native_default(tmp_path):
    """The memalloc_expandable config sets MEMALLOC_CONF in memalloc mode
    only (torch's tests read PYTORCH_CUDA_ALLOC_CONF, which stays unset in
    both modes), and its memalloc outcomes are compared with the default
    config's native ones."""
    up, log = tmp_path / "up", tmp_path / "x.jsonl"
    env = {
        m: conformance._env(up, "cuda", m, "memalloc_expandable", log, tmp_path / "x.skip")
        for m in ("native", "memalloc")
    }
    assert env["memalloc"]["MEMALLOC_CONF"] == "expandable_segments:True"
    assert "MEMALLOC_CONF" not in env["native"]
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env["native"] and "PYTORCH_CUDA_ALLOC_CONF" not in env["memalloc"]
    expandable = conformance._env(up, "cuda", "memalloc", "expandable", log, tmp_path / "x.skip")
    assert expandable["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # the other config: torch's variable
    passed, failed = {"outcome": "passed", "message": ""}, {"outcome": "failed", "message": "E  boom"}
    tables = {
        "cuda": {
            "default": {"native": {"a": passed, "b": passed, "c": failed}},
            "memalloc_expandable": {"memalloc": {"a": passed, "b": failed, "c": passed}},
        }
    }
    s = conformance.summarise(tables)["cuda/memalloc_expandable"]
    assert (s["passed_natively"], s["passed_natively_and_under_memalloc"]) == (2, 1)
    assert list(s["regressions"]) == ["b"] and s["passed_only_under_memalloc"] == ["c"]


def test_expandable_unsaid_sets_expandable_segments_where_torchs_tests_do_not_look(tmp_path):
    """The expandable_unsaid config (the peer of memalloc's expandable
    default): natively torch's allocator gets expandable_segments:True at
    load through its own settings call, under memalloc MEMALLOC_CONF says it;
    PYTORCH_CUDA_ALLOC_CONF, which the tests read, stays unset. Each run's
    allocator settings, as given, are in the results' meta, and the setting
    reaches torch (its own getter, where this torch answers it)."""
    up, log = tmp_path / "up", tmp_path / "x.jsonl"
    env = {
        m: conformance._env(up, "cuda", m, "expandable_unsaid", log, tmp_path / "x.skip")
        for m in ("native", "memalloc")
    }
    assert env["native"]["MEMALLOC_CONFORMANCE_NATIVE_SETTINGS"] == "expandable_segments:True"
    assert env["memalloc"]["MEMALLOC_CONF"] == "expandable_segments:True"
    assert "MEMALLOC_CONFORMANCE_NATIVE_SETTINGS" not in env["memalloc"] and "MEMALLOC_CONF" not in env["native"]
    assert all("PYTORCH_CUDA_ALLOC_CONF" not in e for e in env.values())
    up.mkdir()
    settings_probe = textwrap.indent(
        textwrap.dedent("""
        def test_memory_settings_reach_torch(self):
            import torch
            want = os.environ.get("MEMALLOC_CONFORMANCE_NATIVE_SETTINGS", "")
            self.assertEqual(torch._C._accelerator_getAllocatorSettings(), want)
            self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", os.environ)
    """),
        "    ",
    )
    (up / "test_cuda.py").write_text(
        FAKE.replace("def test_memory_hangs", "def _not_run_hangs")
        .replace("def test_memory_aborts", "def _not_run_aborts")
        .replace("class TestMemPool", settings_probe + "class TestMemPool")
    )
    out = tmp_path / "out"
    conformance.main(
        [
            "--upstream",
            str(up),
            "--out",
            str(out),
            "--lanes",
            "cuda:native:expandable_unsaid,cuda:native:default",
            "--budget",
            "120",
            "--timeout",
            "30",
        ]
    )
    result = json.loads((out / "conformance.json").read_text())
    assert result["meta"]["allocator_config"] == {
        "cuda-native-expandable_unsaid": {
            "PYTORCH_ALLOC_CONF": "",
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "_set_allocator_settings": "expandable_segments:True",
        },
        "cuda-native-default": {"PYTORCH_ALLOC_CONF": "", "PYTORCH_CUDA_ALLOC_CONF": "", "_set_allocator_settings": ""},
    }
    outcomes = _outcomes(result, "expandable_unsaid")
    assert outcomes["test_memory_passes"] == "passed" and outcomes["test_memory_fails"] == "failed"
    for config in ("expandable_unsaid", "default"):
        assert _outcomes(result, config)["test_memory_settings_reach_torch"] == "passed", result["messages"]
