"""GPU tests: memalloc as torch's CUDA allocator (pytest -m gpu).

Each scenario runs in a fresh interpreter (tests/gpu/scenarios.py) because
the allocator is chosen once per process. Skipped without a CUDA GPU. When
MEMALLOC_GPU_RESULTS names a file, every scenario's JSON result is appended
to it (one line each) for the results file under benchmarks/results/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def record(name: str, mode: str, result: dict) -> None:
    """Appends one GPU run's result to $MEMALLOC_GPU_RESULTS (one JSON line:
    scenario, mode, result), when it names a file; benchmarks/device/collect.py collects it."""
    path = os.environ.get("MEMALLOC_GPU_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"scenario": name, "mode": mode, "result": result}, default=str) + "\n")


def gpu_worker(allocator: str, group: str, name: str, env: dict | None = None) -> dict:
    """benchmarks/speed/worker.py's result for one group under ``allocator``,
    run in a fresh process (environment ``env``, default this one's),
    recorded as scenario ``name`` (record())."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed.worker", allocator, group],
        cwd=os.path.dirname(os.path.dirname(HERE)),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    record(name, allocator, r)
    return r


def scenario(name: str, mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "scenarios.py"), name, mode],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{name}/{mode} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    record(name, mode, result)
    return result


def test_training_losses_equal_native():
    native_a = scenario("train20", "native")
    native_b = scenario("train20", "native")
    if native_a["losses"] != native_b["losses"]:
        pytest.skip("native training is not bitwise reproducible on this machine")
    mem = scenario("train20", "memalloc")
    assert mem["losses"] == native_a["losses"]
    assert mem["losses"][-1] < mem["losses"][0]
    # The steady state is served from the cache: far fewer device
    # allocations than allocations.
    assert mem["device_allocs"] * 10 < mem["allocations"]


def test_oom_in_forward_and_backward_then_training_continues():
    r = scenario("oom", "memalloc")
    assert r["forward"] == "OutOfMemoryError"
    assert r["backward"] == "OutOfMemoryError"
    for key in ("forward_message", "backward_message"):
        msg = r[key]
        assert msg.startswith("CUDA out of memory. Tried to allocate")
        assert "total capacity" in msg and "reserved by PyTorch but unallocated" in msg
    assert r["num_ooms"] == 2
    assert r["num_alloc_retries"] == 2
    losses = r["losses_after"]
    assert all(l == l and l < float("inf") for l in losses)
    assert losses[-1] < r["loss_before"]


def test_record_stream_block_not_reused_before_side_stream_finishes():
    r = scenario("record_stream", "memalloc")
    assert r["side_done_before"] is False, "the side stream finished too fast for the test to mean anything"
    assert r["reused_early"] is False
    assert r["state_while_pending"] == ["active_pending_free"]
    assert r["reused_after_sync"] is True
    assert r["y_ok"] is True


def test_empty_cache_returns_memory_to_driver():
    r = scenario("empty_cache", "memalloc")
    assert r["reserved_cached"] >= 4 << 30
    assert r["reserved_after"] == 0
    # The 4 GiB segment shows up as free device memory again.
    assert r["returned"] >= (4 << 30) - 64 * MiB


def test_memory_fraction_is_honoured():
    r = scenario("fraction", "memalloc")
    assert r["over_limit"] == "OutOfMemoryError"
    assert "memory fraction limit" in r["message"]
    assert r["after_reset"] is True


def _model_allocated(sizes):
    """allocated/reserved bytes for an allocation-only sequence, from the
    native rules (docs/architecture.md), written independently of the C++ code."""
    free = []  # [size] of free blocks (allocation-only: one stream, no frees)
    allocated = reserved = 0
    for s in sizes:
        r = 512 if s < 512 else -(-s // 512) * 512
        small = r <= MiB
        fits = [f for f in free if f[1] == small and f[0] >= r]
        if fits:
            block = min(fits)
            free.remove(block)
            size = block[0]
        else:
            size = 2 * MiB if small else 20 * MiB if r < 10 * MiB else -(-r // (2 * MiB)) * 2 * MiB
            reserved += size
        rest = size - r
        if (small and rest >= 512) or (not small and rest > MiB):
            free.append((rest, small))
            size = r
        allocated += size
    return allocated, reserved


def test_accounting_follows_native_rounding():
    r = scenario("accounting", "memalloc")
    allocated, reserved = _model_allocated(r["sizes"])
    assert r["allocated"] == allocated
    assert r["reserved"] == reserved
    assert r["requested"] == sum(r["sizes"])
    assert r["allocated_after_free"] == 0


def test_enable_after_cuda_init_is_refused_with_the_fix():
    r = scenario("late_enable", "native")
    assert r["error"] is not None
    assert "after CUDA was initialised" in r["error"] and "python -m memalloc run" in r["error"]
    assert r["enabled"] is False


def test_demo_runs_on_cuda():
    proc = subprocess.run(
        [sys.executable, "-m", "memalloc", "demo", "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(HERE)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "memalloc demo on the CUDA GPU" in out
    assert "caught torch.OutOfMemoryError: CUDA out of memory" in out
    assert "training continued after the OOM" in out
    assert "validate() passed" in out


def test_pair_cost_informational():
    """Records µs per torch.empty+del pair for memalloc and native side by
    side; asserts only that memalloc is not grossly slower (the real
    benchmark and its targets belong to the benchmark harness)."""
    native = scenario("pair_cost", "native")
    mem = scenario("pair_cost", "memalloc")
    for size, us in mem.items():
        assert us < 3 * native[size] + 2.0, (size, us, native[size])


def test_pair_cost_subclass_against_the_c_entry_route():
    """The subclass skips torch's pluggable per-allocation map and mutex: its
    pair cost is measured against the by-hand C entry route, interleaved
    (7 processes each), and must not be slower. Both under one policy: the
    C entry route's Allocator("cuda", "") is plain, so the subclass runs
    without expandable segments too (memalloc_plain; with its default
    against the plain route, 2026-12-03: 4.00 against 2.89 µs at 512 B, the
    policies' difference, not the route's).

    The statistic is each route's best process per size: on the H100 host of
    2026-12-05 a process's pair cost landed near 2.4 µs or near 4.7 µs for
    every mode, native too (benchmarks/results/2026-12-05-gpu-suite-after-
    inversion-h100.json), so a median of 3 processes compared the placements
    of processes, not the routes; the best of 7 is the route's own cost."""
    rounds = {"native": [], "memalloc_c_entry": [], "memalloc_plain": []}
    for _ in range(7):
        for mode in rounds:
            rounds[mode].append(scenario("pair_cost", mode))
    best = {mode: {k: min(r[k] for r in rs) for k in rs[0]} for mode, rs in rounds.items()}
    path = os.environ.get("MEMALLOC_GPU_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"scenario": "pair_cost_best", "mode": "all", "result": best, "rounds": rounds}) + "\n")
    for k in best["memalloc_plain"]:
        assert best["memalloc_plain"][k] <= best["memalloc_c_entry"][k] * 1.05 + 0.1, (k, best)


def test_c_entry_points_still_work_by_hand():
    r = scenario("c_entry_points", "memalloc_c_entry")
    assert r["ok"] and r["during"] - r["before"] == 4 << 20 and r["after"] == r["before"]
    assert r["backend"] == "pluggable"
    assert "getDeviceStats" in r["stats_error"]  # what that route lacks (docs/usage.md)


def test_recording_a_training_loop_opens_in_memory_viz():
    r = scenario("record_training", "memalloc")
    assert r["dropped"] == 0 and r["allocs"] > 0
    assert "forward" in r["tags"]
    assert any(t.startswith("<backward>") for t in r["tags"]), r["tags"]
    # Forward allocations point at the forward line; engine-thread ones at backward()'s call.
    assert r["markers"]["FORWARD-LINE"] in r["user_lines"]
    assert r["markers"]["BACKWARD-LINE"] in r["user_lines"]
    assert r["steps"][:3] == [0, 1, 2]
    assert r["trace_entries"] > 0 and r["html_bytes"] > 1000 and r["pickle_bytes"] > 0


def test_hundred_ooms_in_a_training_loop_then_training_continues():
    """Under memalloc's default (expandable segments) and without them
    (memalloc_plain, native's policy: its cache to the byte)."""
    native = scenario("oom_loop", "native")
    mem = scenario("oom_loop", "memalloc")
    plain = scenario("oom_loop", "memalloc_plain")
    for r in (native, mem, plain):
        assert r["caught"] == 100 and set(r["kinds"].values()) == {25}, r["kinds"]
        assert r["num_ooms"] == 100  # torch.cuda.memory_stats()["num_ooms"], memalloc's under memalloc
        after = r["losses_after"]
        assert all(l == l for l in after) and after[-1] < r["losses_before"][-1]
        # Nothing leaked: the same bytes are allocated at the same point of a step.
        assert r["allocated_after"] == r["allocated_before"] == native["allocated_before"]
        # The cache comes back to its steady-state size (within two 2 MiB
        # small segments of where it was before the OOMs), not one that
        # grows with the number of OOMs.
        assert 0 <= r["reserved_after"] - r["reserved_before"] <= 2 * 2 * MiB
        # Same training either way.
        assert r["losses_after"] == pytest.approx(native["losses_after"], rel=1e-4)
    # Under native's policy, native's cache to the byte.
    for key in ("reserved_before", "reserved_after"):
        assert plain[key] == native[key]


def test_ddp_two_ranks_under_memalloc():
    native = scenario("ddp", "native")
    mem = scenario("ddp", "memalloc")
    assert mem["backend"] == native["backend"]
    for r in (native, mem):
        a, b = r["ranks"]
        # each rank saw its own data, gradients were averaged: same parameters
        assert a["losses"] != b["losses"]
        assert a["param_checksum"] == b["param_checksum"]
    assert mem["ranks"][0]["param_checksum"] == pytest.approx(native["ranks"][0]["param_checksum"], rel=1e-6)
    for m, n in zip(mem["ranks"], native["ranks"]):
        assert m["losses"] == pytest.approx(n["losses"], rel=1e-4)
        # torch's queries answer for the rank's own device, from memalloc
        assert (m["allocated"], m["reserved"]) == (m["own_allocated"], m["own_reserved"])
        assert 0 < m["allocated"] <= m["max_allocated"] and m["allocated"] <= m["reserved"]
        # every allocation of a rank is on its own device
        per_device = m["allocations_per_device"]
        assert per_device[m["device"]] > 0 and sum(per_device) == per_device[m["device"]]
        assert m["num_ooms"] == 0
        # reports answer for the rank's device too
        assert m["summary_device"] == m["device"]
        assert m["top_holders"] and sum(h["bytes"] for h in m["top_holders"]) <= m["allocated"]


def test_leak_report_of_a_real_model_loop():
    native = scenario("leak_report", "native")
    mem = scenario("leak_report", "memalloc")
    m = mem["markers"]
    for name in ("eval_tensor", "train_tensor"):
        r = mem[name]["report"]
        assert len(r["leaks"]) == 1, mem[name]["text"]
        leak = r["leaks"][0]
        # reported at the line that keeps the loss, allocated at the loss line
        assert (leak["site"]["line"], leak["holder"]["name"]) == (m["APPEND-LINE"], "losses"), mem[name]["text"]
        assert leak["alloc_site"]["line"] == m["LOSS-LINE"]
        # bytes per step: what native's memory_allocated grows by per step
        # (steps 2..12: the second step's graph takes 1 MiB more blocks than
        # the others, the report averages all 12 graphs)
        a = native[name]["allocated"]
        growth = (a[-1] - a[1]) / (len(a) - 2)
        assert leak["bytes_per_step"] == pytest.approx(growth, rel=0.01), mem[name]["text"]
        # retained: every step's graph, the first one's (inside native's first sample) included
        assert leak["retained_bytes"] - (a[-1] - a[0]) == pytest.approx(growth, rel=0.05), mem[name]["text"]
        # bytes in use per step: native's, less the remainders (up to 1 MiB) that native's plain policy
        # leaves in a large block and expandable segments (memalloc's default) do not
        assert all(0 <= n - m <= MiB for n, m in zip(native[name]["allocated"], mem[name]["allocated"]))
    assert mem["eval_tensor"]["report"]["leaks"][0]["cause"] == "no_grad_eval"
    assert mem["train_tensor"]["report"]["leaks"][0]["cause"] == "graph_in_container"
    # the graph of an evaluation step is far bigger than a loss tensor
    assert mem["eval_tensor"]["report"]["leaks"][0]["bytes_per_step"] > 1 * MiB
    assert mem["train_tensor"]["report"]["leaks"][0]["bytes_per_step"] == 512
    for name in ("eval_item", "train_item"):
        assert mem[name]["report"]["leaks"] == [], mem[name]["text"]


def test_oom_message_names_the_holder_and_the_report_is_written():
    r = scenario("oom_report", "memalloc")
    assert r["message"].startswith("CUDA out of memory. Tried to allocate")
    assert f"16.00 GiB in     4 allocations  {r['file']}:{r['line']} in oom_report" in r["message"]
    assert "OOM report written to" in r["message"]
    assert len(r["files"]) == 2 and r["files"][0].endswith(".pickle") and r["files"][1].endswith(".txt")
