"""The command line, ``python -m memalloc {demo,run,info,replay}``: demo, run
and info each in a fresh interpreter (enable() runs once per process, info
looks for a GPU), replay in this one (tests/conftest.py's cli_here). No GPU
here: the host backend."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
from memtest_helpers import CONFIG_KEYS, REPO

from memalloc import _C, load_trace, recording, replay, save_trace
from memalloc.features import planner
from memalloc.features.breakdown import CATEGORIES

KEYS = CONFIG_KEYS


@pytest.fixture
def memalloc_cli(fresh_python, tmp_path):
    """memalloc_cli(*args, conf=None, cwd=the test's tmp_path): ``python -m
    memalloc <args>`` in a fresh interpreter (tests/conftest.py: no GPU,
    MEMALLOC_CONF only ``conf``, the package importable from any cwd). Not
    in the repository: ``run``'s default ``--out`` folder lands in the cwd."""

    def run(*args: str, conf: str | None = None, cwd: Path = tmp_path) -> subprocess.CompletedProcess:
        return fresh_python.run(["-m", "memalloc", *args], cwd=cwd, conf=conf, timeout=120)

    return run


ROW = re.compile(r"^\s*(\d+)\s+(-?\d+\.\d{4})\s+(.+?B)\s+(.+?B)\s+(.+?B)\s+(\d+)\s+(\d+)\s*$")


def test_demo_runs_on_host_and_prints_table_oom_and_validate(memalloc_cli):
    p = memalloc_cli("demo", "--steps", "3")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "host backend" in out
    lines = out.splitlines()
    header = [i for i, l in enumerate(lines) if l.split()[:2] == ["step", "loss"]]
    assert len(header) == 1, out
    rows = [ROW.match(l) for l in lines]
    rows = [m for m in rows if m]
    assert [int(m.group(1)) for m in rows] == [1, 2, 3], out
    # The rows follow the header directly.
    assert ROW.match(lines[header[0] + 1]) and ROW.match(lines[header[0] + 3])
    loss = [float(m.group(2)) for m in rows]
    assert loss[2] < loss[0], loss
    # 4 setup tensors (x, y, w1, w2) + 5 per step (h, out, g_w2, g_h, g_w1).
    allocs = [int(m.group(6)) for m in rows]
    assert allocs == [4 + 5 * i for i in (1, 2, 3)]
    # After the first step everything comes from the cache.
    from_device = [int(m.group(7)) for m in rows]
    assert from_device[0] > 0 and len(set(from_device)) == 1
    # Live memory is the same after every step: the step's temporaries died.
    assert len({m.group(3) for m in rows}) == 1
    summary = re.search(r"(\d+) of (\d+) allocations were served from the cache; (\d+) segments", out)
    assert summary, out
    hits, total, segs = map(int, summary.groups())
    assert total == allocs[-1] and segs == from_device[-1] and hits == total - segs
    oom = [l for l in lines if l.startswith("caught torch.OutOfMemoryError")]
    assert len(oom) == 1, out
    assert "Tried to allocate 1.00 GiB" in oom[0]
    assert "training continued after the OOM" in out
    assert "num_ooms=1" in out
    assert "empty_cache(): returned" in out
    assert any("validate() passed" in l for l in lines)
    # The leak hunt: the loop keeping loss tensors is reported at its append line, the fixed one is clean.
    example = REPO / "memalloc" / "demo" / "leaky_training.py"
    line = next(i for i, l in enumerate(example.read_text().splitlines(), 1) if "the leak" in l)
    assert f"{example}:{line} in train: +512 B per step" in out, out
    assert "held by list `losses`" in out
    assert "no leaks found" in lines
    # Where the memory goes: the encoder's split at its last step's peak, every category present.
    tour = lines[lines.index("no leaks found") + 1 :]
    assert tour[1].startswith("where the memory goes") and tour[2].startswith("memory by category")
    split = {l.split()[0]: l for l in tour[4:10]}
    assert list(split) == ["parameters", "gradients", "optimizer_state", "activations", "temporaries", "other"]
    assert "0 B" not in split["optimizer_state"] and tour[10].lstrip().startswith("total")
    assert "unexpected" not in out
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("steps", ["0"])
def test_demo_rejects_zero_steps(steps, memalloc_cli):
    p = memalloc_cli("demo", "--steps", steps)
    assert p.returncode != 0
    assert "--steps must be at least 1" in p.stderr
    assert "Traceback" not in p.stderr
    assert "step" not in p.stdout.split()


SCRIPT = """
import json, sys
import torch
import memalloc
from memalloc import host

info = {
    "argv": sys.argv,
    "name": __name__,
    "enabled": memalloc.is_enabled(),
    "backend": memalloc.enabled_backend(),
    "enable_again": memalloc.enable(),   # same backend and config: a no-op
}
big = host.empty(3 << 20, torch.uint8)   # 3 MiB: a 20 MiB segment
small = host.empty(256, torch.float32)   # 1 KiB: a 2 MiB segment
big.fill_(1)
small.fill_(2.0)
info["sums"] = [int(big.sum()), float(small.sum())]
info["allocated"] = memalloc.memory.memory_allocated()
stats = memalloc.memory.memory_stats()
info["peak"] = memalloc.memory.max_memory_allocated()
info["peak_reserved"] = memalloc.memory.max_memory_reserved()
info["allocations"] = stats["allocation.all.allocated"]
info["device_allocations"] = stats["num_device_alloc"]
print("SCRIPT", json.dumps(info))
"""


def test_run_executes_script_with_memalloc_enabled(tmp_path, memalloc_cli):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    p = memalloc_cli("run", str(script), "a", "b")
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stdout.splitlines() if l.startswith("SCRIPT ")]
    assert len(lines) == 1, p.stdout
    info = json.loads(lines[0][len("SCRIPT ") :])
    assert info["argv"] == [str(script), "a", "b"]
    assert info["name"] == "__main__"
    assert info["enabled"] is True
    assert info["backend"] == "host"
    assert info["enable_again"] == "host"
    assert info["sums"] == [3 << 20, 512.0]
    assert info["allocated"] == (3 << 20) + 1024
    # Summary on stderr: the figures the script read at its end. run routes
    # the script's CPU tensors to the simulated device too, so big.sum()'s
    # int64 temporaries count: the peak is above the 3 MiB + 1 KiB kept.
    from memalloc.core._format import fmt_bytes

    summary = [l for l in p.stderr.splitlines() if l.startswith("memalloc (host, device 0)")]
    assert len(summary) == 1, p.stderr
    assert info["peak"] > info["allocated"]
    assert f"peak allocated {fmt_bytes(info['peak'])}" in summary[0]
    assert f"peak reserved {fmt_bytes(info['peak_reserved'])}" in summary[0]
    assert f" {info['allocations']} allocations" in summary[0]
    assert f" {info['device_allocations']} device allocations" in summary[0]
    assert "0 OOMs" in summary[0]
    # No training step: the split of the peak so far (what the script allocated is "other").
    split = [l for l in p.stderr.splitlines() if l.startswith("memalloc by category (host, device 0)")]
    assert split == [
        "memalloc by category (host, device 0): at the peak so far (no step ended): "
        f"other {fmt_bytes(info['peak'])} (100%)"
    ], p.stderr


FIRST_STEP_OOM = """
import json, torch
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(512, 512), torch.nn.ReLU())])
x = torch.randn(4096, 512)
saved = {}
def pack(t):
    saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return t
try:
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()  # the first step's forward runs out of memory
except torch.OutOfMemoryError:
    params = {p.data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    activations = sum(n for ptr, n in saved.items() if ptr not in params and ptr != x.data_ptr())
    print("TRUTH " + json.dumps({"params": sum(params.values()), "activations": activations,
                                 "x": x.untyped_storage().nbytes(), "largest": 4096 * 512 * 4}))
"""


def test_a_first_step_oom_splits_its_forward_into_activations(tmp_path, memalloc_cli):
    """A script that runs out of memory in its first step's forward (no step
    has ended): run's split of the peak names what the forward saved as
    activations, not 'other 99% (no step ended)' (issue 37)."""
    script = tmp_path / "first_oom.py"
    script.write_text(FIRST_STEP_OOM)
    p = memalloc_cli("run", "--config", "host_capacity_mb:64", "--out", str(tmp_path / "r"), str(script))
    assert p.returncode == 0, p.stderr
    truth = json.loads(next(l for l in p.stdout.splitlines() if l.startswith("TRUTH "))[6:])
    line = next(l for l in p.stderr.splitlines() if l.startswith("memalloc by category (host, device 0)"))
    assert "(no step ended)" in line, line
    split = {m[0]: m[1] for m in re.findall(r"(\w+) ([\d.]+ \w?i?B) \(", line.split("ended): ")[1])}
    from memalloc.core._format import fmt_bytes

    assert split["parameters"] == fmt_bytes(truth["params"]), line
    assert list(split)[0] == "activations", line  # the largest part: what the forward saved
    # what autograd saved, plus at most the one output in flight when the device filled
    acts = float(split["activations"].split()[0]) * {"MiB": 1 << 20, "KiB": 1 << 10}[split["activations"].split()[1]]
    assert truth["activations"] * 0.99 <= acts <= (truth["activations"] + truth["largest"]) * 1.01, (line, truth)
    # the OOM report's table by category, as the OOM left it: the forward's activations lead there too
    report = next((tmp_path / "r").glob("oom-*.txt")).read_text()
    table = report.split("memory by category")[1].split("\n\n")[0].splitlines()
    now = {r.split()[0]: float(r.split()[3].rstrip("%")) for r in table if r.split() and r.split()[0] in CATEGORIES}
    assert max(now, key=now.get) == "activations" and now["activations"] > 50, report


def test_run_passes_option_like_arguments_to_the_script(tmp_path, memalloc_cli):
    script = tmp_path / "args.py"
    script.write_text("import sys, memalloc\nprint('ARGV', sys.argv[1:], memalloc.is_enabled())\n")
    p = memalloc_cli("run", "--config", "host_capacity_mb:64", str(script), "--config", "x", "-v")
    assert p.returncode == 0, p.stderr
    assert "ARGV ['--config', 'x', '-v'] True" in p.stdout


def test_run_script_that_raises_still_prints_summary_and_fails(tmp_path, memalloc_cli):
    script = tmp_path / "crash.py"
    script.write_text(
        textwrap.dedent(
            """
        import memalloc, torch
        from memalloc import host
        t = host.empty((512, 512), torch.float32)   # 1 MiB
        print("TOTAL", memalloc.memory.mem_get_info()[1])
        m = memalloc.memory
        print("PEAK", m.max_memory_allocated(), m.memory_stats()["allocation.all.allocated"])
        raise ValueError("boom from the script")
        """
        )
    )
    p = memalloc_cli("run", "--config", "host_capacity_mb:64", "--out", str(tmp_path / "r"), str(script))
    assert p.returncode != 0
    assert f"TOTAL {64 << 20}" in p.stdout  # --config reached the allocator
    # the flight recorder's file stays for postmortem (an exception is no clean end)
    assert [n.endswith(".flight") for n in os.listdir(tmp_path / "r" / "flight")] == [True]
    assert "ValueError: boom from the script" in p.stderr
    summary = [l for l in p.stderr.splitlines() if l.startswith("memalloc (host, device 0)")]
    assert len(summary) == 1, p.stderr
    from memalloc.core._format import fmt_bytes

    peak, allocations = next(l for l in p.stdout.splitlines() if l.startswith("PEAK ")).split()[1:]
    assert int(peak) >= 1 << 20  # the 1 MiB tensor, and the script's CPU tensors (run routes them)
    assert f"peak allocated {fmt_bytes(int(peak))}" in summary[0]
    assert f" {allocations} allocations" in summary[0]


def test_run_script_can_import_its_sibling_modules(tmp_path, memalloc_cli):
    (tmp_path / "helper_mod_for_memalloc_test.py").write_text("VALUE = 41\n")
    script = tmp_path / "main.py"
    script.write_text("import helper_mod_for_memalloc_test as h\nprint('VALUE', h.VALUE + 1)\n")
    p = memalloc_cli("run", str(script))
    assert p.returncode == 0, p.stderr
    assert "VALUE 42" in p.stdout


def test_info_prints_backend_and_config_keys(memalloc_cli):
    p = memalloc_cli("info", conf="host_capacity_mb:48")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "CUDA usable: no" in out
    assert "enable() would use the host backend" in out
    config = [l for l in out.splitlines() if l.startswith("config: ")]
    assert len(config) == 1
    assert "host_capacity_mb:48" in config[0]
    keys_line = [l for l in out.splitlines() if l.startswith("config keys: ")]
    assert len(keys_line) == 1
    assert keys_line[0][len("config keys: ") :].split(", ") == KEYS


def test_info_reports_a_bad_environment_config(memalloc_cli):
    p = memalloc_cli("info", conf="no_such_key:1")
    assert p.returncode != 0
    assert "unknown key 'no_such_key'" in p.stderr


def record_trace(path: Path, *, late: bool = False) -> Path:
    """A trace of a host allocator of this process: 1000 B, 3 MiB (freed)
    and 20 MiB allocations. ``late``: the 3 MiB one is allocated before
    recording starts, so the trace frees an address it never allocated."""
    a = _C.Allocator("host", "host_capacity_mb:64")
    mode = _C.stack_mode()
    early = a.malloc(3 << 20) if late else None
    try:
        recording.record_history(max_entries=1000, stacks="none", allocator=a)
        keep = [a.malloc(1000), early if late else a.malloc(3 << 20), a.malloc(20 << 20)]
        a.free(keep.pop(1))
        save_trace(path, allocator=a)
    finally:
        recording.record_history(False, allocator=a)
        _C.set_stack_mode(mode)
    for ptr in keep:
        a.free(ptr)
    return path


def test_replay_prints_a_row_per_workload_and_config(tmp_path, memalloc_cli_here):
    trace = record_trace(tmp_path / "run.trace")
    out = tmp_path / "replay.json"
    p = memalloc_cli_here(
        "replay",
        str(trace),
        "--random",
        "2000",
        "--config",
        "",
        "--config",
        "roundup_power2_divisions:4",
        "--json",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:3] == ["workload", "config", "device"] and lines[-1] == f"wrote {out}"
    rows = [l.split()[:2] for l in lines[1:5]]
    assert rows == [
        [str(trace), "(default)"],
        [str(trace), "roundup_power2_divisions:4"],
        ["random:2000", "(default)"],
        ["random:2000", "roundup_power2_divisions:4"],
    ]
    data = json.loads(out.read_text())
    assert data["command"] == (
        f"python -m memalloc replay {trace} --random 2000 --config '' --config roundup_power2_divisions:4 --json {out}"
    )
    # The trace's figures are the in-process replay's (no equal-size ties in it) and the recording's.
    for got, config in zip(data["results"][:2], ["", "roundup_power2_divisions:4"]):
        assert got == replay.replay_trace(trace, config).to_dict()
    first = data["results"][0]["devices"][0]
    assert first["peak_reserved"] == first["recorded_peak_reserved"] == (2 + 20 + 20) << 20  # small, 20, 20 MiB
    for got, config in zip(data["results"][2:], ["", "roundup_power2_divisions:4"]):
        want = replay.replay_source("random:2000", config).devices[0]
        assert got["devices"][0]["allocations"] == 2000
        assert abs(got["devices"][0]["ratio"] / want.ratio - 1) < 0.01  # equal-size ties: memalloc/features/replay.py
    assert "Traceback" not in p.stderr


def test_replay_finds_the_smallest_device(tmp_path, memalloc_cli_here):
    out = tmp_path / "smallest.json"
    p = memalloc_cli_here(
        "replay",
        "--random",
        "3000",
        "--config",
        "",
        "--config",
        "expandable_segments:True",
        "--smallest-device",
        "--json",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    want = {c: planner.smallest_device_mb("random:3000", c) for c in ("", "expandable_segments:True")}
    assert data["smallest_device_mb"] == {"random:3000": want}
    for c, mb in want.items():  # the boundary, to 8 MiB: no OOM there, one a step below
        assert replay.replay_source("random:3000", c, host_capacity_mb=mb).devices[0].ooms == 0
        assert replay.replay_source("random:3000", c, host_capacity_mb=mb - 8).devices[0].ooms > 0
    assert f"random:3000  (default)  {want['']}" in p.stdout
    assert data["command"].endswith("--smallest-device --json " + str(out))


def test_replay_of_a_trace_that_began_late(tmp_path, memalloc_cli_here):
    trace = record_trace(tmp_path / "late.trace", late=True)
    p = memalloc_cli_here("replay", str(trace))
    assert p.returncode != 0
    assert "frees 0x" in p.stderr and "--skip-unknown-frees" in p.stderr
    assert "Traceback" not in p.stderr
    out = tmp_path / "late.json"
    p = memalloc_cli_here("replay", str(trace), "--skip-unknown-frees", "--json", str(out))
    assert p.returncode == 0, p.stderr
    device = json.loads(out.read_text())["results"][0]["devices"][0]
    assert (device["unknown_frees"], device["allocations"], device["recorded_peak_allocated"]) == (1, 2, None)


def test_replay_step_by_step_of_a_loop_run_longer(tmp_path, memalloc_cli_here):
    """--per-step prints and writes replay.replay_steps' rows; with
    --repeat-last-step the trace's last step runs N more times first."""
    trace = REPO / "benchmarks" / "traces" / "transformer.mtrace.gz"
    out = tmp_path / "steps.json"
    p = memalloc_cli_here(
        "replay",
        str(trace),
        "--config",
        "expandable_segments:True",
        "--per-step",
        "--repeat-last-step",
        "3",
        "--json",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    want = replay.replay_steps(replay.repeat_last_step(load_trace(trace).events[0], 3), "expandable_segments:True")
    data = json.loads(out.read_text())
    assert data["per_step"] == {str(trace): {"expandable_segments:True": {"0": [r.to_dict() for r in want]}}}
    assert len(want) == 11 and any(r.maps for r in want)  # 8 steps and 3 more; some step maps pages
    lines = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    assert [(int(l.split()[2]), l.split()[3]) for l in lines] == [(r.maps, "mapped") for r in want]
    assert data["command"].endswith("--per-step --repeat-last-step 3 --json " + str(out))
    # the whole replay's peaks are those of the longer trace too
    assert data["results"][0]["devices"][0]["peak_reserved"] == want[-1].peak_reserved
    # a trace of one step is no loop to run longer
    one = record_trace(tmp_path / "one.trace")
    p = memalloc_cli_here("replay", str(one), "--repeat-last-step", "2")
    assert p.returncode != 0 and f"--repeat-last-step on {one}: the trace has one step" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "nothing to replay: give trace files, --random N, or both"),
        (("--random", "10", "--per-step"), "need trace files (a random workload has no steps)"),
        (("--random", "10", "--repeat-last-step", "-1"), "--repeat-last-step N needs N >= 0"),
        (("--random", "10", "--config", "no_such_key:1"), "unknown key 'no_such_key'"),
        (("/nonexistent/run.trace",), "cannot read /nonexistent/run.trace"),
        (("--random", "10", "--smallest-device", "--host-capacity-mb", "64"), "drop --host-capacity-mb"),
    ],
)
def test_replay_refuses_bad_arguments(args, message, memalloc_cli_here):
    p = memalloc_cli_here("replay", *args)
    assert p.returncode != 0
    assert message in p.stderr
    assert "Traceback" not in p.stderr
