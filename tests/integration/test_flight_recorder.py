"""The flight recorder (issue 24; memalloc/features/flight.py writes the file,
memalloc/trace/flight_files.py reads it, ``python -m memalloc postmortem``
reports it) on the host backend: a loop (tests/recording_cases/flight_loop.py)
SIGKILLed or segfaulting after step 20 leaves a file whose records are
exactly what the same loop's in-memory ring held at that step (a run that
did not die, the peer truth), sequence numbers contiguous, none torn; a ring
that wrapped keeps the newest records; postmortem names the line holding the
most memory at the end; a clean exit removes the file (or keeps it, marked
exited); bad files and directories get errors naming them.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

import pytest
from memtest_helpers import REPO

from memalloc.trace import flight_files as ff
from memalloc.trace.recording import ACTIONS, RECORD_FORMAT

sys.path.insert(0, str(REPO / "tests" / "recording_cases"))
from flight_checks import check_job, check_postmortem, check_snapshot, check_top, env, memalloc_cli, run_job, run_loop  # noqa: E402


def comparable(raw: bytes) -> list[tuple]:
    """What two runs of the loop share: every field but the time and the address."""
    return [
        (size, req, stack, tag, step, action, dev, pool)
        for (_t, _addr, size, req, _stream, stack, tag, _thread, step, action, dev, pool) in struct.iter_unpack(
            RECORD_FORMAT, raw
        )
    ]


def records_of(f: ff.FlightFile, device: int = 0) -> list[tuple]:
    return [(e.size, e.requested, e.stack_id, e.step, e.action, e.pool) for e in f.rings[device]]


@pytest.fixture(scope="module")
def memory_ring(tmp_path_factory):
    """The in-memory ring of a run that did not die, at step 20."""
    d = tmp_path_factory.mktemp("memory")
    p = run_loop("memory", d)
    assert p.returncode == 0, p.stderr
    return (d / "ring.bin").read_bytes()


@pytest.fixture(scope="module")
def killed_dir(tmp_path_factory):
    """The loop SIGKILLed after step 20, once for the module: its flight directory."""
    d = tmp_path_factory.mktemp("killed")
    p = run_loop("kill", d)
    assert p.returncode == -9, p.stderr
    return d


@pytest.fixture
def killed(killed_dir, tmp_path):
    """A copy of the killed run's flight directory that a test may change."""
    d = tmp_path / "killed"
    shutil.copytree(killed_dir, d)
    return d


@pytest.mark.parametrize("mode, rc", [("kill", -9), ("segv", -11)])
def test_a_killed_process_leaves_every_committed_record(tmp_path, memory_ring, mode, rc):
    p = run_loop(mode, tmp_path)
    assert p.returncode == rc, p.stderr
    (path,) = ff.files_in(tmp_path)
    f = ff.read(path)
    assert f.state == "running" and f.step == 21 and f.pid > 0 and f.torn == [0]
    n = len(f.rings[0])
    assert f.sequences[0] == list(range(1, n + 1))  # contiguous from the first, nothing torn or lost
    # the records the same loop's in-memory ring held at step 20, field for field (but times and addresses)
    assert comparable(f.raw[0]) == comparable(memory_ring) and len(f.rings[0]) == n
    # the stacks interned before the end are in the file: every record's line reads back
    assert {e.stack_id for e in f.rings[0]} <= set(f.stacks)


def test_a_wrapped_ring_keeps_the_newest_records(tmp_path, memory_ring):
    p = run_loop("kill", tmp_path, records=32)
    assert p.returncode == -9
    f = ff.read(ff.files_in(tmp_path)[0])
    total = len(comparable(memory_ring))
    assert total > 32
    assert f.sequences[0] == list(range(total - 31, total + 1))
    assert records_of(f)[-1][3] == 20  # the last step's


def test_postmortem_names_the_line_holding_the_most_memory(killed):
    check_postmortem(killed)


def test_top_names_postmortem_for_a_process_that_has_ended(killed):
    """The killed loop is not running: top gives it one line, its pid and
    last step read from its file, that names postmortem (which says what
    it held); none of the live view's figures."""
    (path,) = ff.files_in(killed)
    f = ff.read(path)
    p = memalloc_cli("top", "--once", str(killed))
    assert p.returncode == 0, p.stderr
    (line,) = [l for l in p.stdout.splitlines() if l.startswith(f"pid {f.pid} ")]
    assert f"step {f.step}" in line and "not running (no clean exit" in line, p.stdout
    assert "python -m memalloc postmortem" in line and "allocated" not in p.stdout, p.stdout


def test_postmortem_reads_the_out_folder_of_run_as_report_does(killed, tmp_path):
    """One reader finds the files: postmortem of a `run --out` folder reads
    its flight/ folder, as report does; a folder with none says why."""
    out = tmp_path / "out"
    shutil.copytree(killed, out / "flight")
    p = memalloc_cli("postmortem", str(out), "--events", "3")
    assert p.returncode == 0 and "last step: 21" in p.stdout, p.stderr
    (tmp_path / "none").mkdir()
    p = memalloc_cli("postmortem", str(tmp_path / "none"))
    assert p.returncode != 0 and "flight_recorder_keep:True" in p.stderr, p.stderr


def test_postmortem_writes_the_run_page_a_killed_run_never_wrote(killed, tmp_path):
    """A process SIGKILLed under ``run --out OUT`` wrote no OUT/index.html;
    ``postmortem --html`` writes it from the file: no clean exit, the 21
    finished steps (memalloc.step() after loop iterations 0 to 20), and the
    peak the loop's sizes give (iteration 20's new 4 KiB batch while
    iteration 19's 20 KiB one still lives, beside 20 kept tensors of 16 KiB:
    step 21), held at KEEP_LINE and the batch's line."""
    import json
    import re

    from flight_checks import KEEP_LINE, LOOP

    out = tmp_path / "out"
    shutil.copytree(killed, out / "flight")
    p = memalloc_cli("postmortem", str(out), "--html")
    assert p.returncode == 0 and f"run page: {out / 'index.html'}" in p.stdout, (p.stdout, p.stderr)
    page = (out / "index.html").read_text()
    data = json.loads(re.search(r'id="run-data">(.*?)</script>', page, re.S).group(1))
    assert data["process"]["state"] == "running"  # no clean exit seen
    assert "no end recorded: still running, or killed" in page
    assert [s["step"] for s in data["steps"]] == list(range(1, 22))
    flame, KiB = data["flame"], 1024
    assert flame["total"] == (20 * 16 + 20 + 4) * KiB and flame["step"] == 21
    lines = {}
    for node in flame["tree"]["children"]:
        assert os.path.basename(node["file"]) == LOOP.name, node
        lines[node["line"]] = node["bytes"]
    assert lines.pop(KEEP_LINE) == 20 * 16 * KiB and list(lines.values()) == [24 * KiB], lines
    p = memalloc_cli("postmortem", str(killed), "--html")  # a flight_recorder:DIR folder: beside the file
    (path,) = ff.files_in(killed)
    assert p.returncode == 0 and os.path.isfile(path + ".html"), p.stdout


# the slow tier (CI runs it, `-m slow`): four processes ending each way (~7 s), over the README's fast-tier budget of
# 180 s on CI's 2 cores
@pytest.mark.slow
def test_a_clean_exit_removes_the_file_or_keeps_it_marked(tmp_path):
    assert run_loop("clean", tmp_path / "a").returncode == 0
    assert os.listdir(tmp_path / "a") == []
    assert run_loop("keep", tmp_path / "b").returncode == 0
    f = ff.read(ff.files_in(tmp_path / "b")[0])
    assert f.state == "exited" and f.step == 30 and f.sequences[0] == list(range(1, len(f.rings[0]) + 1))


def test_a_torn_record_is_skipped_and_counted(killed, tmp_path):
    src = ff.files_in(killed)[0]
    good = ff.read(src)
    n = len(good.rings[0])
    (_, _, _, _, _, _, _, _, _, _, ring_offset, capacity, *_rest) = ff.HEADER.unpack_from(open(src, "rb").read(), 0)
    seq_at = ring_offset + capacity * ff.RECORD_BYTES
    torn = tmp_path / "torn.flight"
    shutil.copy(src, torn)
    with open(torn, "r+b") as f:  # the writer died inside push(): the last slot's number is 0
        f.seek(seq_at + (n - 1) * ff.SEQ_BYTES)
        f.write(struct.pack("<Q", 0))
        f.seek(seq_at + 3 * ff.SEQ_BYTES)  # a number that is not its slot's (slot 3 holds 4, 4 + capacity, ...)
        f.write(struct.pack("<Q", 5))
    bad = ff.read(torn)
    assert bad.torn == [2] and len(bad.rings[0]) == n - 2
    assert bad.sequences[0] == [s for s in good.sequences[0] if s not in (4, n)]


def test_bad_files_and_directories_are_named(killed, tmp_path):
    with pytest.raises(ff.FlightFileError, match="no flight recorder files"):
        ff.files_in(tmp_path)
    with pytest.raises(ff.FlightFileError, match="not a directory"):
        ff.files_in(tmp_path / "missing")
    other = tmp_path / "other.flight"
    other.write_bytes(b"x" * 8192)
    with pytest.raises(ff.FlightFileError, match=r"other\.flight: not a memalloc flight recorder file"):
        ff.read(other)
    src = ff.files_in(killed)[0]
    data = bytearray(open(src, "rb").read())
    newer = tmp_path / "newer.flight"
    newer.write_bytes(bytes(data[:8]) + struct.pack("<I", ff.VERSION + 1) + bytes(data[12:]))
    with pytest.raises(ff.FlightFileError, match=f"format version {ff.VERSION + 1}"):
        ff.read(newer)
    p = memalloc_cli("postmortem", str(tmp_path / "empty"))
    assert p.returncode != 0 and "not a directory" in p.stderr


def test_the_config_key_needs_a_directory():
    from memalloc import _C

    with pytest.raises(Exception, match="flight_recorder needs a directory"):
        _C.parse_config("flight_recorder:")
    assert "flight_recorder:/tmp/x" in _C.parse_config("flight_recorder:/tmp/x")


# the slow tier (CI runs it, `-m slow`): two runs of a script under `run` (~12 s), over the README's fast-tier budget of
# 180 s on CI's 2 cores
@pytest.mark.slow
def test_memalloc_run_keeps_a_file_when_the_script_fails_and_none_when_it_ends_well(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch, memalloc\n"
        "kept = []\n"
        "for step in range(5):\n"
        "    kept.append(torch.ones(4096))\n"
        "    memalloc.step()\n"
        "if os.environ.get('FAIL'):\n"
        "    raise RuntimeError('the loss is NaN')\n"
    )

    def run(out, **extra):
        return subprocess.run(
            [sys.executable, "-m", "memalloc", "run", "--backend", "host", "--steps", "--out", str(out), str(script)],
            env={**env(), **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = run(tmp_path / "ok")
    assert ok.returncode == 0, ok.stderr
    assert not (tmp_path / "ok" / "flight").exists()  # a clean end leaves nothing behind
    failed = run(tmp_path / "failed", FAIL="1")
    assert failed.returncode != 0 and "the loss is NaN" in failed.stderr
    f = ff.read(ff.files_in(tmp_path / "failed" / "flight")[0])
    assert f.state == "raised" and f.step == 5
    assert any(e.action == "alloc" and e.size == 16384 for e in f.rings[0])
    p = memalloc_cli("postmortem", str(tmp_path / "failed" / "flight"))
    assert "exited on an uncaught exception at step 5" in p.stdout, p.stdout
    assert f"{script}:4 in <module>" in p.stdout.split("live memory at the end by line")[1], p.stdout


# the slow tier (CI runs it, `-m slow`): a live process watched from outside (~18 s), over the README's fast-tier budget
# of 180 s on CI's 2 cores
@pytest.mark.slow
def test_top_once_shows_a_live_process_from_outside(tmp_path):
    check_top(tmp_path, "host")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """torchrun --nproc_per_node 2 -m memalloc run on tests/recording_cases/two_ranks.py,
    then ``python -m memalloc report DIR --html`` (flight_checks.run_job)."""
    return run_job(tmp_path_factory.mktemp("job") / "out", "host")


# the slow tier (CI runs it, `-m slow`): a torchrun job of two ranks (~15 s), over the README's fast-tier budget of 180
# s on CI's 2 cores
@pytest.mark.slow
def test_torchrun_two_ranks_give_one_report_naming_each_rank_and_line(job):
    """Each rank writes its own file; report DIR names rank 1 as standing out
    (1 MiB held more, at its line) and rank 0's leak (16 KiB per step, at its
    line); the HTML page has a row and a series per rank."""
    check_job(*job)


# the slow tier (CI runs it, `-m slow`): the torchrun job above and a browser (~25 s), over the README's fast-tier
# budget of 180 s on CI's 2 cores
@pytest.mark.slow
def test_the_job_page_in_headless_chromium(job, tmp_path):
    sys.path.insert(0, str(REPO))
    from benchmarks.report import screenshot

    browser = screenshot.find_browser()
    if browser is None:
        if os.environ.get("MEMALLOC_REQUIRE_BROWSER") == "1":
            pytest.fail("no Chromium found; MEMALLOC_REQUIRE_BROWSER=1 (CI) needs one: apt-get install chromium")
        pytest.skip("no Chromium found: install one (e.g. apt-get install chromium) to run the browser tests")
    _text, page, _script, _lines = job
    dumped = screenshot.run_headless(browser, str(page), "--dump-dom")
    assert dumped.count('class="series rank-') == 2 and 'data-rank="1"' in dumped and "stands out" in dumped
    png = tmp_path / "job.png"
    screenshot.screenshot(browser, str(page), str(png), (1280, 1400))
    assert screenshot.png_size(str(png)) == (1280, 1400)
    assert screenshot.distinct_colours(str(png)) > 50  # a chart and text, not a blank page


def test_postmortem_writes_a_snapshot_torchs_memory_viz_reads(killed):
    check_snapshot(killed)


def test_the_in_memory_history_borrows_the_rings_and_gives_them_back(host_allocator, tmp_path):
    """memalloc.record_history while the flight recorder runs: the
    rings move into memory (those events are the in-memory history's), and
    stopping it gives them back to the file, whose ring starts again, with
    stacks still on."""
    from memalloc import _C
    from memalloc.core import _hooks
    from memalloc.features.flight import FlightRecorder
    from memalloc.trace import recording, tags

    a = host_allocator
    # record_history subscribes the backward context for its stacks
    # (memalloc.trace.tags); this process is the test's, so it is taken back
    # afterwards (tests/conftest.py checks torch is left as found)
    subscribed = _hooks.subscribed(_hooks.BACKWARD, tags.BACKWARD_FEATURE)
    r = FlightRecorder(a, str(tmp_path), 64, keep=False)
    try:
        a.free(a.malloc(4096))  # into the file
        recording.record_history(enabled=False, allocator=a)  # stops nothing: the file keeps its ring
        assert [(e.action, e.requested) for e in ff.read(r.path).rings[0] if e.action == "alloc"] == [("alloc", 4096)]
        recording.record_history(max_entries=16, allocator=a)
        a.free(a.malloc(8192))  # into memory
        raw, _dropped = recording.raw_records(0, allocator=a)
        in_memory = [(ACTIONS[rec[9]], rec[3]) for rec in struct.iter_unpack(RECORD_FORMAT, raw)]
        recording.record_history(enabled=False, allocator=a)
        a.free(a.malloc(12288))  # into the file again
        f = ff.read(r.path)
        assert ("alloc", 8192) in in_memory and ("alloc", 4096) not in in_memory
        assert [(e.action, e.requested) for e in f.rings[0] if e.action == "alloc"] == [("alloc", 12288)]
        assert f.sequences[0] == list(range(1, len(f.rings[0]) + 1))  # the file's ring started again
        assert _C.stack_mode() != 0
    finally:
        r.close(clean=True)
        if not subscribed:
            _hooks.unsubscribe(_hooks.BACKWARD, tags.BACKWARD_FEATURE)
    assert not os.path.exists(r.path)
    a.free(a.malloc(4096))
    assert recording.raw_records(0, allocator=a)[0] == b""  # closed: the rings are off


def test_the_first_step_names_the_lines_whatever_the_walk_costs(host_allocator, tmp_path, monkeypatch):
    """The start's checkpoint names no lines (nothing is allocated yet); the
    first step's does even when the budget for the walk would allow none
    (TOP_COST_SHARE raised so far that no later step's may): a short job's
    report names its lines however slow the machine (a CI run once lost
    them when the start's walk was slow); later steps keep them under the
    budget, marked with the step they are of."""
    import inspect

    from memalloc.features import flight

    monkeypatch.setattr(flight, "TOP_COST_SHARE", 10**15)
    a = host_allocator
    r = flight.FlightRecorder(a, str(tmp_path), 64, keep=False)
    try:
        start = ff.read(r.path).checkpoint["devices"][0]
        assert start["top"] == [] and start["top_step"] == -1
        line = inspect.currentframe().f_lineno + 1  # the next line allocates
        held = a.malloc(1 << 20)
        r.heartbeat(1)
        dev = ff.read(r.path).checkpoint["devices"][0]
        assert dev["top_step"] == 1
        assert [(h["filename"], h["line"], h["bytes"]) for h in dev["top"]] == [(__file__, line, 1 << 20)]
        more = a.malloc(2 << 20)
        r.heartbeat(2)
        cp = ff.read(r.path).checkpoint
        assert cp["step"] == 2 and cp["devices"][0]["top_step"] == 1 and cp["devices"][0]["top"] == dev["top"]
        assert cp["devices"][0]["allocated"] == a.stats(0)["allocated_bytes"]["all"]["current"]
        a.free(more)
        a.free(held)
    finally:
        r.close(clean=True)


def test_a_file_cut_short_keeps_what_lies_before_the_cut(killed, tmp_path):
    """A flight file cut off (a full disk, a copy that stopped) reads back the
    records before the cut: cut after the ring, every record of the whole
    file; cut inside the ring's sequence numbers, exactly the slots whose
    number lies before the cut (issue 37: it read nothing before)."""
    src = ff.files_in(killed)[0]
    data = open(src, "rb").read()
    whole = ff.read(src)
    fields = ff.HEADER.unpack_from(data, 0)
    ring_offset, capacity = fields[10], fields[11]
    seq_at = ring_offset + capacity * ff.RECORD_BYTES
    after_ring = seq_at + capacity * ff.SEQ_BYTES
    assert after_ring < len(data) and whole.missing == 0
    cut = tmp_path / "cut.flight"
    cut.write_bytes(data[:after_ring])
    f = ff.read(cut)
    assert f.missing == len(data) - after_ring
    assert records_of(f) == records_of(whole) and f.sequences == whole.sequences and f.step == whole.step
    slots = 5  # keep the numbers of the first 5 slots only
    cut.write_bytes(data[: seq_at + slots * ff.SEQ_BYTES + 3])
    f = ff.read(cut)
    kept = [i for i, seq in enumerate(whole.sequences[0]) if (seq - 1) % capacity < slots]
    assert f.sequences[0] == [whole.sequences[0][i] for i in kept] and len(kept) == min(slots, len(whole.rings[0]))
    assert records_of(f) == [records_of(whole)[i] for i in kept]
    assert f.stacks == {} and f.checkpoint is None and f.history == []  # they lay after the cut


def test_postmortem_counts_the_blocks_live_before_a_late_recorder(tmp_path):
    """A recorder started after a tensor was made (the framework callbacks
    start theirs after the model is built), then the process SIGKILLed:
    postmortem's live memory at the end names the early tensor's line too
    (3 MiB, first), from the blocks the file keeps from its start."""
    import textwrap

    script = tmp_path / "late.py"
    script.write_text(
        textwrap.dedent(f"""\
            import os, signal
            import torch
            import memalloc
            from memalloc.features import flight
            memalloc.enable(backend="host")
            memalloc.host.use_for_cpu_tensors()
            early = torch.empty(3 << 20, dtype=torch.uint8)  # EARLY
            flight.start({str(tmp_path / "flight")!r})
            late = torch.empty(1 << 20, dtype=torch.uint8)  # LATE
            memalloc.step()  # a step names the stacks made since the last (a loop's do)
            os.kill(os.getpid(), signal.SIGKILL)
        """)
    )
    p = subprocess.run([sys.executable, str(script)], env=env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    p = memalloc_cli("postmortem", str(tmp_path / "flight"))
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stdout.split("live memory at the end by line")[1].splitlines()[1:3]]
    early = next(i for i, l in enumerate(script.read_text().splitlines(), 1) if "# EARLY" in l)
    late = early + 2
    assert f"late.py:{early} " in lines[0] and "3.00 MiB in 1 block" in lines[0], p.stdout
    assert f"late.py:{late} " in lines[1] and "1.00 MiB in 1 block" in lines[1], p.stdout
