"""Event recording with stack tags (memalloc.recording) on the host backend.

Every scenario runs in this process on a host-backend allocator the test
owns (``_C.Allocator("host", ...)``, never installed): the recording
functions, the snapshot and the trace file take ``allocator=``. Each
scenario is built once per module (a module-scoped fixture, through
``owned_recording``) and several tests assert on its result, which is
plain data (json round-tripped, as the fresh interpreters of old printed
it). The recording state that is process-wide, not the allocator's (the
stack mode, this thread's tag, the backward context and memalloc's wrapper
of torch.autograd.backward), is restored after each scenario. The step
counter, the stack table and thread indexes are process-wide counters that
other tests of this process move too: assertions on them are relative to
their value when the scenario started.

One scenario runs in a fresh interpreter (``enabled``, through
``fresh_python``): what memalloc.enable() wires, which a process can do
once: MEMALLOC_CONF's recording at enable(), torch's own
``torch.cuda.memory._record_memory_history`` / ``_snapshot`` /
``_dump_snapshot`` / ``memory_allocated``, which enable() points at the
installed allocator on the host backend, and the state before enable().

User code whose allocation sites the stacks must name lives in
tests/recording_cases/user_code.py; each site is found by its marker comment
(``# SITE:<name>``). Lines of this file's scenarios are found the same way
(``# HERE:<name>``): a user stack (``user_only``: memalloc/core/_usercode.py) is
user_code.py's frames, then the scenario's line in this file, then whatever
called the scenario: pytest's frames (an installed package: dropped), and
the ``pytest`` script when pytest was started by it (user code). The
scenario that asserts the whole user stack therefore runs in a thread of
its own, whose stack starts in the standard library.

Expected numbers follow the size rules: a request rounds up to a multiple of
512 B (minimum 512); rounded sizes <= 1 MiB come from 2 MiB segments (small
pool), 1-10 MiB requests from 20 MiB segments, >= 10 MiB requests get their
own segment rounded up to 2 MiB (large pool).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import dataclasses
import gc
import importlib.util
import json
import os
import pickle
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import CHILD_PRELUDE
from memtest_helpers import LARGE_SEGMENT, REPO, SMALL_SEGMENT, MiB, rnd
from torch.cuda import _memory_viz as mv

import memalloc
from memalloc import _C, host, recording
from memalloc.core import _hooks
from memalloc.core._usercode import is_internal
from memalloc.trace import snapshots, trace_files
from memalloc.trace import tags as tags_module

USER_FILE = REPO / "tests" / "recording_cases" / "user_code.py"
USER_SOURCE = USER_FILE.read_text()
THIS_SOURCE = Path(__file__).read_text()


def _load_user_code():
    spec = importlib.util.spec_from_file_location("recording_user_code", USER_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


user_code = _load_user_code()


@contextlib.contextmanager
def owned_recording(config: str = "host_capacity_mb:64") -> Iterator[_C.Allocator]:
    """A fresh host-backend allocator (not installed) for one scenario.
    Afterwards its recording is stopped, it is validated, and the
    process-wide recording state is as before: the stack mode, this
    thread's tag, the backward context, and the backward hook (which
    record_history subscribes to, memalloc.core._hooks)."""
    mode, thread_tag, backward = _C.stack_mode(), _C.thread_tag(), _C.backward_context()
    subscribed = _hooks.subscribed(_hooks.BACKWARD, tags_module.BACKWARD_FEATURE)
    a = _C.Allocator("host", config)
    try:
        try:
            yield a
        finally:
            recording.record_history(False, allocator=a)
    finally:
        if not subscribed:
            _hooks.unsubscribe(_hooks.BACKWARD, tags_module.BACKWARD_FEATURE)
        _C.set_stack_mode(mode)
        _C.set_thread_tag(thread_tag)
        _C.set_backward_context(*backward)
    gc.collect()
    a.validate()


def _child_err():
    """The fresh interpreters' ``err(f)`` (tests/conftest.py's CHILD_PRELUDE),
    used here too so both kinds of scenario report errors alike: [type name,
    MRO names, message] of what ``f()`` raised, or None."""
    names: dict = {}
    exec(CHILD_PRELUDE, names)
    return names["err"]


err = _child_err()


def jsonable(x):
    return json.loads(json.dumps(x))


def ev(a, device=0):
    return [dataclasses.asdict(e) for e in recording.events(device, allocator=a)]


def frames(sid, user_only=False):
    return [[f.filename, f.line, f.name] for f in recording.stack(sid, user_only=user_only)]


def stacks_of(events):
    ids = sorted({e["stack_id"] for e in events if e["stack_id"]})
    return {str(i): {"user": frames(i, True), "all": frames(i)} for i in ids}


def allocated(a, device=0):
    return a.stats(device)["allocated_bytes"]["all"]["current"]


def reserved(a, device=0):
    return a.stats(device)["reserved_bytes"]["all"]["current"]


def _marker_line(text: str, marker: str) -> int:
    hits = [i for i, l in enumerate(text.splitlines(), 1) if l.rstrip().endswith(marker)]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


def site(name: str) -> int:
    """Line of ``# SITE:<name>`` in user_code.py."""
    return _marker_line(USER_SOURCE, f"# SITE:{name}")


def here(name: str) -> int:
    """Line of ``# HERE:<name>`` in this file."""
    return _marker_line(THIS_SOURCE, f"# HERE:{name}")


def is_user_file(filename: str) -> bool:
    return os.path.realpath(filename) == os.path.realpath(USER_FILE)


def user_frame(frame, site_name: str, function: str) -> bool:
    """frame ([filename, line, name]) is user_code.py at SITE:site_name in function."""
    return is_user_file(frame[0]) and frame[1] == site(site_name) and frame[2] == function


def here_frame(frame, name: str, function: str) -> bool:
    """frame ([filename, line, name]) is this file at HERE:name in function."""
    return os.path.realpath(frame[0]) == os.path.realpath(__file__) and frame[1:] == [here(name), function]


def internal(filename: str) -> bool:
    path = os.path.realpath(filename)
    roots = [os.path.realpath(REPO / "memalloc"), os.path.realpath(os.path.dirname(torch.__file__))]
    return any(path.startswith(r + os.sep) for r in roots)


def by_addr(events, action="alloc"):
    """{addr: event} of one action (every address is allocated once there)."""
    out = {}
    for e in events:
        if e["action"] == action:
            assert e["addr"] not in out, f"address {e['addr']} allocated twice"
            out[e["addr"]] = e
    return out


def key(e):
    return (e["action"], e["addr"], e["size"], e["requested"], e["pool"])


# =============================================================================
# 1. Exact event sequences; 5. steps
# =============================================================================
@pytest.fixture(scope="module")
def sequence():
    R = {}
    with owned_recording() as a:
        recording.record_history(stacks="python", allocator=a)
        R["actions"] = list(recording.ACTIONS)
        t1 = user_code.alloc_a(1000, a)
        with memalloc.tag("fwd"):
            t2 = user_code.alloc_b(1000, a)
        R["t"] = [t1.data_ptr(), t2.data_ptr()]
        R["allocated_live"] = allocated(a)
        del t1
        del t2
        R["released"] = a.empty_cache(0)
        R["oom"] = err(lambda: user_code.alloc_a(100 * MiB + 1, a))
        R["n_before_stream"] = len(recording.events(allocator=a))
        p = a.malloc(3000)  # HERE:p
        a.record_stream(p, 7)
        a.free(p)
        R["after_free"] = ev(a)
        q = a.malloc(3000)  # HERE:q
        R["after_q"] = ev(a)
        a.host_synchronize_stream(7)
        R["after_sync"] = ev(a)
        r = a.malloc(3000)  # HERE:r
        R["pqr"] = [p, q, r]
        R["events"] = ev(a)
        R["stacks"] = stacks_of(R["events"])
        a.free(q)
        a.free(r)
        a.empty_cache(0)

        # ---- steps (the ring restarts; the step counter is the process's) ----
        recording.record_history(stacks="python", allocator=a)
        R["steps_before"] = memalloc.iteration.steps()
        s0 = host.empty(1000, torch.uint8, allocator=a)
        R["step_returns"] = [memalloc.step()]
        s1 = host.empty(1000, torch.uint8, allocator=a)
        R["step_returns"] += [memalloc.step(), memalloc.step()]
        s2 = host.empty(1000, torch.uint8, allocator=a)
        R["step_ptrs"] = [s0.data_ptr(), s1.data_ptr(), s2.data_ptr()]
        R["steps_now"] = _C.step()
        del s1  # at step 3
        R["after_step_free"] = ev(a)
        a.empty_cache(0)  # at step 3
        R["after_step_empty"] = ev(a)
        del s0, s2
        a.empty_cache(0)

        # ---- a release inside an allocation (OOM retry) ----
        recording.record_history(stacks="python", allocator=a)
        c = user_code.alloc_a(1000, a)
        del c  # a fully free cached 2 MiB segment
        with memalloc.tag("big"):
            big = user_code.alloc_b(63 * MiB, a)  # a 64 MiB segment fits only once the cache is released
        R["retry"] = ev(a)
        R["retry_big"] = big.data_ptr()
        R["retry_stacks"] = stacks_of(R["retry"])
        del big
    return jsonable(R)


def test_action_names_are_torch_trace_names():
    r = {"actions": list(recording.ACTIONS), "record_size": _C.record_size()}
    assert r["actions"] == [
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "alloc_retry",
        "oom",
        "empty_cache",
        "sync_all_streams",
        "gc_release",
        "segment_free_failed",
        "segment_map",
        "segment_unmap",
    ]
    assert r["record_size"] == 64


def test_sequence_alloc_free_empty_cache_oom_and_stream(sequence):
    r = sequence
    A, A2 = r["t"]
    P, Q, Rr = r["pqr"]
    evs = r["events"]
    R100 = rnd(100 * MiB + 1)
    assert A2 == A + 1024, "the second 1000-byte block follows the first in the cached segment"
    assert Q == P + 3072 and Rr == P, "r reuses p's block once its stream work is done"
    expected = [
        ("segment_alloc", A, SMALL_SEGMENT, 0, "small"),
        ("alloc", A, 1024, 1000, "small"),
        ("alloc", A + 1024, 1024, 1000, "small"),
        ("free_requested", A, 1024, 1000, "small"),
        ("free_completed", A, 1024, 1000, "small"),
        ("free_requested", A + 1024, 1024, 1000, "small"),
        ("free_completed", A + 1024, 1024, 1000, "small"),
        ("sync_all_streams", 0, 0, 0, "small"),
        ("segment_free", A, SMALL_SEGMENT, 0, "small"),
        ("empty_cache", 0, SMALL_SEGMENT, 0, "small"),
        ("alloc_retry", 0, R100, 0, "large"),
        ("sync_all_streams", 0, 0, 0, "small"),
        ("oom", 64 * MiB, R100, 100 * MiB + 1, "large"),  # addr: device free bytes then (cache released)
        ("segment_alloc", P, SMALL_SEGMENT, 0, "small"),
        ("alloc", P, 3072, 3000, "small"),
        ("free_requested", P, 3072, 3000, "small"),
        ("alloc", Q, 3072, 3000, "small"),
        ("free_completed", P, 3072, 3000, "small"),
        ("alloc", P, 3072, 3000, "small"),
    ]
    assert [key(e) for e in evs] == expected
    assert r["allocated_live"] == 2048
    assert r["released"] == SMALL_SEGMENT
    assert r["oom"][0] == "OutOfMemoryError"
    assert all(e["device"] == 0 and e["stream"] == 0 for e in evs)
    times = [e["time_ns"] for e in evs]
    assert times == sorted(times) and times[0] > 0


def test_sequence_free_completed_waits_for_the_stream(sequence):
    r = sequence
    P, Q, _ = r["pqr"]
    n0 = r["n_before_stream"]
    # free of a block used on stream 7: only free_requested
    assert [key(e) for e in r["after_free"][n0:]] == [
        ("segment_alloc", P, SMALL_SEGMENT, 0, "small"),
        ("alloc", P, 3072, 3000, "small"),
        ("free_requested", P, 3072, 3000, "small"),
    ]
    # the next malloc finds stream 7's work not done: still no free_completed
    assert [e["action"] for e in r["after_q"][n0 + 3 :]] == ["alloc"]
    assert r["after_q"][-1]["addr"] == Q
    # synchronizing the stream records nothing by itself
    assert r["after_sync"] == r["after_q"]
    # the malloc after it processes the event: free_completed, then the reuse
    assert [(e["action"], e["addr"]) for e in r["events"][len(r["after_sync"]) :]] == [
        ("free_completed", P),
        ("alloc", P),
    ]


def test_sequence_attribution_of_each_event(sequence):
    r = sequence
    evs = r["events"]
    st = r["stacks"]
    seg_a, alloc_a, alloc_b = evs[0], evs[1], evs[2]
    sa, sb = alloc_a["stack_id"], alloc_b["stack_id"]
    assert sa and sb and sa != sb
    assert user_frame(st[str(sa)]["user"][0], "alloc_a", "alloc_a")
    assert user_frame(st[str(sb)]["user"][0], "alloc_b", "alloc_b")
    # the segment is attributed to the call that made it
    assert (seg_a["stack_id"], seg_a["tag"]) == (sa, "")
    assert (alloc_a["tag"], alloc_b["tag"]) == ("", "fwd")
    # frees carry the allocation's stack and tag (t2 is freed outside the tag)
    for e in evs[3:7]:
        origin = alloc_a if e["addr"] == alloc_a["addr"] else alloc_b
        assert (e["stack_id"], e["tag"]) == (origin["stack_id"], origin["tag"]), e
    # the OOM names the failed call (through a lambda: its own stack, same site)
    oom = evs[12]
    assert oom["stack_id"] not in (0, sa)
    assert user_frame(st[str(oom["stack_id"])]["user"][0], "alloc_a", "alloc_a")
    # Allocator.malloc from the scenario's own lines
    p_seg, p_alloc, p_free, q_alloc, p_done, r_alloc = evs[13:]
    for e, name in ((p_alloc, "p"), (q_alloc, "q"), (r_alloc, "r")):
        assert here_frame(st[str(e["stack_id"])]["user"][0], name, "sequence")
    assert len({p_alloc["stack_id"], q_alloc["stack_id"], r_alloc["stack_id"]}) == 3
    assert p_seg["stack_id"] == p_alloc["stack_id"]
    assert p_free["stack_id"] == p_done["stack_id"] == p_alloc["stack_id"]
    # every allocation came from the main thread: one small thread index
    threads = {e["thread"] for e in evs if e["action"] == "alloc"}
    assert len(threads) == 1 and threads.pop() > 0


def test_step_is_carried_by_later_records(sequence):
    r = sequence
    s = r["steps_before"]  # the process's step counter when the scenario started
    assert r["step_returns"] == [s + 1, s + 2, s + 3]
    assert r["steps_now"] == s + 3
    allocs = by_addr(r["after_step_free"])
    assert [allocs[p]["step"] for p in r["step_ptrs"]] == [s, s + 1, s + 3]
    seg = r["after_step_free"][0]
    assert (seg["action"], seg["step"]) == ("segment_alloc", s)


def test_free_records_carry_the_current_step_and_thread(sequence):
    r = sequence
    s = r["steps_before"]
    s1 = r["step_ptrs"][1]
    main = by_addr(r["after_step_free"])[s1]["thread"]
    frees = [e for e in r["after_step_free"] if e["action"].startswith("free") and e["addr"] == s1]
    assert [e["action"] for e in frees] == ["free_requested", "free_completed"]
    assert [(e["step"], e["thread"]) for e in frees] == [(s + 3, main), (s + 3, main)]


def test_empty_cache_records_carry_the_current_step(sequence):
    r = sequence
    s = r["steps_before"]
    new = r["after_step_empty"][len(r["after_step_free"]) :]
    assert [e["action"] for e in new] == ["sync_all_streams", "empty_cache"]  # nothing fully free
    main = r["after_step_free"][1]["thread"]
    assert [(e["step"], e["thread"]) for e in new] == [(s + 3, main), (s + 3, main)]


def test_oom_retry_releases_the_cache_then_grows(sequence):
    r = sequence
    evs = r["retry"]
    seg = evs[0]["addr"]
    assert [key(e) for e in evs] == [
        ("segment_alloc", seg, SMALL_SEGMENT, 0, "small"),
        ("alloc", seg, 1024, 1000, "small"),
        ("free_requested", seg, 1024, 1000, "small"),
        ("free_completed", seg, 1024, 1000, "small"),
        ("alloc_retry", 0, 63 * MiB, 0, "large"),
        ("sync_all_streams", 0, 0, 0, "small"),
        ("segment_free", seg, SMALL_SEGMENT, 0, "small"),
        ("segment_alloc", r["retry_big"], 64 * MiB, 0, "large"),
        ("alloc", r["retry_big"], 64 * MiB, 63 * MiB, "large"),
    ]
    big = evs[-1]
    assert big["tag"] == "big" and (evs[-2]["stack_id"], evs[-2]["tag"]) == (big["stack_id"], "big")
    assert user_frame(r["retry_stacks"][str(big["stack_id"])]["user"][0], "alloc_b", "alloc_b")


def test_segment_free_in_oom_retry_carries_the_triggering_call(sequence):
    r = sequence
    evs = r["retry"]
    big = evs[-1]
    seg_free = [e for e in evs if e["action"] == "segment_free"]
    assert len(seg_free) == 1
    assert (seg_free[0]["stack_id"], seg_free[0]["tag"]) == (big["stack_id"], "big")


# =============================================================================
# 2. The ring: wrap-around, events_array, stopping, invalid arguments
# =============================================================================
RING_CASES = [(10, 3), (10, 10), (10, 11), (10, 23), (1, 5), (7, 40)]
FIELDS = ("time_ns", "addr", "size", "requested", "stream", "stack_id", "thread", "step", "device")


def ring_case(a, n, m):
    """m allocations into a ring of n entries (a tag on odd k, a step before
    every k divisible by 3); what events() and events_array() then read."""
    recording.record_history(max_entries=n, stacks="python", allocator=a)
    ptrs = []
    for k in range(1, m + 1):
        if k % 3 == 0:
            memalloc.step()
        if k % 2:
            with memalloc.tag("odd"):
                ptrs.append(a.malloc(512 * k - 7))
        else:
            ptrs.append(a.malloc(512 * k - 7))
    es = recording.events(allocator=a)
    arr = recording.events_array(allocator=a)
    tags = _C.tag_names()
    bad = []
    for i, (e, x) in enumerate(zip(es, arr)):
        for f in FIELDS:
            if int(x[f]) != getattr(e, f):
                bad.append([i, f, int(x[f]), getattr(e, f)])
        if recording.ACTIONS[int(x["action"])] != e.action:
            bad.append([i, "action"])
        if ("small", "large")[int(x["pool"])] != e.pool:
            bad.append([i, "pool"])
        if tags[int(x["tag_id"])] != e.tag:
            bad.append([i, "tag"])
    out = {
        "events": [dataclasses.asdict(e) for e in es],
        "dropped": recording.dropped(allocator=a),
        "n_arr": len(arr),
        "itemsize": arr.dtype.itemsize,
        "names": list(arr.dtype.names),
        "mismatches": bad,
        "ptrs": ptrs,
    }
    recording.record_history(False, allocator=a)
    for p in ptrs:
        a.free(p)
    return out


@pytest.fixture(scope="module")
def ring():
    R = {}
    with owned_recording() as a:
        R["before"] = [len(recording.events(allocator=a)), recording.dropped(allocator=a)]
        a.free(a.malloc(1000))  # a cached 2 MiB segment: each malloc below is one alloc event
        R["rings"] = {f"{n},{m}": ring_case(a, n, m) for n, m in RING_CASES}

        # ---- stopping ----
        recording.record_history(max_entries=100, allocator=a)
        p = a.malloc(1000)
        R["on"] = [len(recording.events(allocator=a)), _C.stack_mode()]
        recording.record_history(False, allocator=a)
        R["off_now"] = [
            len(recording.events(allocator=a)),
            len(recording.events_array(allocator=a)),
            recording.dropped(allocator=a),
            _C.stack_mode(),
        ]
        a.free(p)
        with memalloc.tag("ignored"):
            q = a.malloc(5 * MiB)
        a.free(q)
        a.empty_cache(0)
        R["off_after"] = [len(recording.events(allocator=a)), recording.dropped(allocator=a), a.trace(0)[0] == b""]

        # ---- invalid arguments change nothing ----
        recording.record_history(max_entries=50, stacks="python", allocator=a)
        keep = a.malloc(1000)
        before = ev(a)

        def bad(**kw):
            return err(lambda: recording.record_history(allocator=a, **kw))

        R["bad"] = {
            "stacks_full": bad(stacks="full"),
            "stacks_None": bad(stacks=None),
            "max0": bad(max_entries=0),
            "max_neg": bad(max_entries=-3),
            "max_float": bad(max_entries=2.5),
            "max_bool": bad(max_entries=True),
            "max_str": bad(max_entries="10"),
        }
        R["unchanged"] = [ev(a) == before, len(before), _C.stack_mode()]
        a.free(keep)
    return jsonable(R)


def test_recording_needs_enable_and_starts_off(ring, enabled):
    # before enable(): no allocator to default to; the process-wide stack mode is off
    assert enabled["not_enabled"][0] == "RuntimeError" and "not enabled" in enabled["not_enabled"][2]
    assert enabled["mode_before"] == 0
    # a new allocator's ring is empty
    assert ring["before"] == [0, 0]


@pytest.mark.parametrize("n,m", RING_CASES)
def test_ring_keeps_the_last_n_events_in_order(ring, n, m):
    out = ring["rings"][f"{n},{m}"]
    kept = min(n, m)
    first = m - kept + 1  # the oldest k still stored
    assert [e["size"] for e in out["events"]] == [512 * k for k in range(first, m + 1)]
    assert [e["requested"] for e in out["events"]] == [512 * k - 7 for k in range(first, m + 1)]
    assert [e["addr"] for e in out["events"]] == out["ptrs"][first - 1 :]
    assert {e["action"] for e in out["events"]} == {"alloc"}
    assert [e["tag"] for e in out["events"]] == ["odd" if k % 2 else "" for k in range(first, m + 1)]
    # steps: memalloc.step() ran before each k divisible by 3 (the counter keeps counting across rings)
    steps = [e["step"] for e in out["events"]]
    assert steps == sorted(steps)
    assert all(steps[i + 1] - steps[i] == (1 if (first + i + 1) % 3 == 0 else 0) for i in range(len(steps) - 1))
    times = [e["time_ns"] for e in out["events"]]
    assert times == sorted(times)
    assert out["dropped"] == m - kept


@pytest.mark.parametrize("n,m", RING_CASES)
def test_events_array_matches_events(ring, n, m):
    out = ring["rings"][f"{n},{m}"]
    assert out["n_arr"] == len(out["events"]) == min(n, m)
    assert out["itemsize"] == 64
    assert out["names"][:12] == [
        "time_ns",
        "addr",
        "size",
        "requested",
        "stream",
        "stack_id",
        "tag_id",
        "thread",
        "step",
        "action",
        "device",
        "pool",
    ]
    assert out["mismatches"] == []


def test_stopping_records_nothing_and_empties_the_ring(ring):
    assert ring["on"] == [1, 2]  # one alloc: the 2 MiB segment is cached
    assert ring["off_now"] == [0, 0, 0, 0]
    assert ring["off_after"] == [0, 0, True]


def test_invalid_arguments_raise_value_error_and_change_nothing(ring):
    bad = ring["bad"]
    for k in ("stacks_full", "stacks_None"):
        assert bad[k][0] == "ValueError", bad[k]
        assert "stacks must be one of none, tags, python" in bad[k][2]
    assert "'full'" in bad["stacks_full"][2]
    for k, shown in (("max0", "0"), ("max_neg", "-3"), ("max_float", "2.5"), ("max_bool", "True"), ("max_str", "'10'")):
        assert bad[k][0] == "ValueError", bad[k]
        assert "max_entries must be a positive int" in bad[k][2] and bad[k][2].endswith(shown)
    assert ring["unchanged"] == [True, 2, 2]  # segment_alloc + alloc (the cache was emptied)


# =============================================================================
# 3. Stacks: the right file:line in user code, interning, modes
# =============================================================================
def stacks_scenario(a) -> dict:
    """Runs in a thread of its own (see ``stacks``)."""
    R = {}
    recording.record_history(stacks="python", allocator=a)
    R["stack_count_before"] = _C.stack_count()  # the stack table is the process's
    keep = []
    keep.append(user_code.alloc_a(allocator=a))  # HERE:a
    keep.append(user_code.alloc_b(allocator=a))  # HERE:b
    keep.append(user_code.outer(allocator=a))  # HERE:outer
    for _ in range(2):
        keep.append(user_code.alloc_a(allocator=a))  # HERE:loop_a
    keep += user_code.loop_twice(a)  # HERE:loop_twice
    keep.append(user_code.deep(100, allocator=a))
    keep.append(user_code.alloc_a(5 * MiB, a))  # HERE:large
    R["ptrs"] = [t.data_ptr() for t in keep]
    R["events"] = ev(a)
    R["stacks"] = stacks_of(R["events"])
    R["stack_count"] = _C.stack_count()
    R["zero"] = frames(0)

    recording.record_history(stacks="tags", allocator=a)
    n = _C.stack_count()
    with memalloc.tag("tagged"):
        t = user_code.alloc_a(allocator=a)
    u = user_code.alloc_b(allocator=a)
    R["tags_mode"] = [ev(a), _C.stack_count() - n, [t.data_ptr(), u.data_ptr()], _C.stack_mode()]

    recording.record_history(stacks="none", allocator=a)
    n = _C.stack_count()
    with memalloc.tag("tagged"):
        v = user_code.alloc_a(allocator=a)
    R["none_mode"] = [ev(a), _C.stack_count() - n, [v.data_ptr()], _C.stack_mode()]
    del keep, t, u, v
    return R


@pytest.fixture(scope="module")
def stacks():
    # In a thread of its own: a stack captured there starts in the standard
    # library (threading, concurrent.futures), so the only user frames above
    # user_code.py's are stacks_scenario's, however pytest was started (the
    # ``pytest`` script is not an installed package's file: user code).
    with owned_recording("host_capacity_mb:256") as a, concurrent.futures.ThreadPoolExecutor(1) as pool:
        return jsonable(pool.submit(stacks_scenario, a).result())


def _allocs_in_order(r):
    allocs = [e for e in r["events"] if e["action"] == "alloc"]
    assert [e["addr"] for e in allocs] == r["ptrs"]
    return allocs


def test_stack_names_the_user_line_and_function(stacks):
    r = stacks
    allocs = _allocs_in_order(r)
    a = allocs[0]
    user = r["stacks"][str(a["stack_id"])]["user"]
    everything = r["stacks"][str(a["stack_id"])]["all"]
    assert user_frame(user[0], "alloc_a", "alloc_a"), user
    assert here_frame(user[1], "a", "stacks_scenario")
    assert len(user) == 2
    # the full stack starts inside memalloc (host.empty); user_only drops it, and the
    # standard library's frames of the thread the scenario runs in
    assert everything[0][0].endswith(os.path.join("memalloc", "install", "host.py")) and everything[0][2] == "empty"
    assert everything[1:3] == user
    assert everything[3:] and all(is_internal(f[0]) for f in everything[3:]), everything
    assert not any(internal(f[0]) for f in user)
    b = allocs[1]
    assert user_frame(r["stacks"][str(b["stack_id"])]["user"][0], "alloc_b", "alloc_b")
    assert b["stack_id"] != a["stack_id"]
    # a large allocation from the same helper: same first frame, another caller line
    large = allocs[-1]
    assert (large["size"], large["pool"]) == (5 * MiB, "large")
    lu = r["stacks"][str(large["stack_id"])]["user"]
    assert user_frame(lu[0], "alloc_a", "alloc_a") and here_frame(lu[1], "large", "stacks_scenario")


def test_nested_calls_give_the_chain_innermost_first(stacks):
    r = stacks
    nested = _allocs_in_order(r)[2]
    user = r["stacks"][str(nested["stack_id"])]["user"]
    assert user_frame(user[0], "alloc_a", "alloc_a")
    assert user_frame(user[1], "middle", "middle")
    assert user_frame(user[2], "outer", "outer")
    assert here_frame(user[3], "outer", "stacks_scenario")
    assert nested["stack_id"] != _allocs_in_order(r)[0]["stack_id"], "another call chain, another stack"


def test_same_call_site_interns_to_one_stack(stacks):
    r = stacks
    allocs = _allocs_in_order(r)
    loop1, loop2, lt1, lt2 = allocs[3:7]
    assert loop1["stack_id"] == loop2["stack_id"] != allocs[0]["stack_id"]
    assert here_frame(r["stacks"][str(loop1["stack_id"])]["user"][1], "loop_a", "stacks_scenario")
    assert lt1["stack_id"] == lt2["stack_id"]
    assert user_frame(r["stacks"][str(lt1["stack_id"])]["user"][0], "loop", "loop_twice")
    assert here_frame(r["stacks"][str(lt1["stack_id"])]["user"][1], "loop_twice", "stacks_scenario")
    # ids are dense (the next ones after the table's size when the scenario started), and
    # every stack interned meanwhile is one seen here
    ids = {e["stack_id"] for e in r["events"]}
    assert 0 not in ids
    assert ids == set(range(r["stack_count_before"] + 1, r["stack_count"] + 1))
    assert len(ids) == 7  # a, b, outer, loop_a, loop_twice, deep, large
    assert r["zero"] == []


def test_deep_stacks_keep_the_innermost_64_frames(stacks):
    r = stacks
    deep = _allocs_in_order(r)[7]
    everything = r["stacks"][str(deep["stack_id"])]["all"]
    user = r["stacks"][str(deep["stack_id"])]["user"]
    assert len(everything) == 64
    assert user_frame(user[0], "deep", "deep")
    assert all(user_frame(f, "deep_rec", "deep") for f in user[1:])
    assert len(user) == 63


def test_segments_carry_the_triggering_stack(stacks):
    r = stacks
    evs = r["events"]
    segs = [e for e in evs if e["action"] == "segment_alloc"]
    assert [(e["size"], e["pool"]) for e in segs] == [(SMALL_SEGMENT, "small"), (LARGE_SEGMENT, "large")]
    for s in segs:
        nxt = evs[evs.index(s) + 1]
        assert nxt["action"] == "alloc" and nxt["addr"] == s["addr"] and nxt["stack_id"] == s["stack_id"]


def test_tags_mode_keeps_tags_but_no_stacks(stacks):
    r = stacks
    evs, new_stacks, ptrs, mode = r["tags_mode"]
    assert mode == 1
    assert [(e["action"], e["addr"], e["stack_id"], e["tag"]) for e in evs] == [
        ("alloc", ptrs[0], 0, "tagged"),
        ("alloc", ptrs[1], 0, ""),
    ]
    assert new_stacks == 0
    assert all(e["thread"] > 0 for e in evs)


def test_none_mode_records_neither(stacks):
    r = stacks
    evs, new_stacks, ptrs, mode = r["none_mode"]
    assert mode == 0
    assert [(e["action"], e["addr"], e["stack_id"], e["tag"]) for e in evs] == [("alloc", ptrs[0], 0, "")]
    assert new_stacks == 0
    assert evs[0]["thread"] > 0 and evs[0]["size"] == 1024


# =============================================================================
# 4. Tags: nesting, restoring, threads, invalid names, the backward context
# =============================================================================
@pytest.fixture(scope="module")
def tags():
    R = {}
    with owned_recording() as a:
        recording.record_history(stacks="python", allocator=a)
        cur = tags_module.current_tag
        R["cur"] = [cur()]
        with memalloc.tag("forward") as p1:
            R["cur"].append(cur())
            x1 = a.malloc(1000)
            with memalloc.tag("attn") as p2:
                R["cur"].append(cur())
                x2 = a.malloc(2000)
            R["cur"].append(cur())
            x3 = a.malloc(3000)
        R["cur"].append(cur())
        x4 = a.malloc(4000)
        try:
            with memalloc.tag("boom"):
                raise KeyError("inside")
        except KeyError:
            pass
        R["cur"].append(cur())
        x5 = a.malloc(4500)
        R["paths"] = [p1, p2]
        R["nest_ptrs"] = [x1, x2, x3, x4, x5]

        def enter(name):
            with memalloc.tag(name):
                pass

        R["bad"] = [err(lambda n=n: enter(n)) for n in ("a/b", "", "/", None, 5)]
        R["after_bad"] = [cur(), _C.thread_tag()]

        # ---- threads ----
        barrier = threading.Barrier(3)
        res = {}

        def worker(name, tag):
            def body():
                barrier.wait()
                ptrs = []
                for i in range(40):
                    ptrs.append(a.malloc(512 * (1 + i % 3)))
                res[name] = {"ptrs": ptrs, "cur": cur()}

            if tag:
                with memalloc.tag(tag):
                    body()
            else:
                body()

        with memalloc.tag("main"):
            ts = [threading.Thread(target=worker, args=args) for args in (("A", "alpha"), ("B", "beta"), ("C", None))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            R["main_during"] = cur()
            xm = a.malloc(1000)
        R["workers"] = res
        R["main_ptr"] = xm
        R["events"] = ev(a)

        # ---- the backward context ----
        recording.record_history(stacks="python", allocator=a)
        log = user_code.BackwardLog()
        R["bw_before"] = list(_C.backward_context())
        user_code.train_step(a, log, tagged=True)
        user_code.train_step(a, log, tagged=False)
        user_code.train_step_functional(a, log)
        R["bw_after"] = list(_C.backward_context())
        outside = _C._testing.malloc_on_native_thread(a, 3000)
        with memalloc.tag("caller"):
            outside_tagged = _C._testing.malloc_on_native_thread(a, 3000)
        R["bw_ptrs"] = log.native + [outside, outside_tagged]
        R["bw_events"] = ev(a)
        R["bw_stacks"] = stacks_of(R["bw_events"])
        R["backward_wrapped"] = hasattr(torch.autograd.backward, "__wrapped__")

        # a Python thread allocating (untagged) while backward runs, in python and in tags mode
        R["bw_pythread"] = {}
        for mode in ("python", "tags", "none"):
            recording.record_history(stacks=mode, allocator=a)
            log = user_code.BackwardLog()
            user_code.train_step(a, log, tagged=True, python_thread=True)
            R["bw_pythread"][mode] = {"native": log.native[-1], "python": log.python[-1], "events": ev(a)}
    return jsonable(R)


def test_nested_tags_form_a_path_and_are_restored(tags):
    r = tags
    assert r["cur"] == ["", "forward", "forward/attn", "forward", "", ""]
    assert r["paths"] == ["forward", "forward/attn"]
    allocs = by_addr(r["events"])
    assert [allocs[p]["tag"] for p in r["nest_ptrs"]] == ["forward", "forward/attn", "forward", "", ""]


def test_invalid_tag_names_raise_value_error(tags):
    for e, shown in zip(tags["bad"], ("'a/b'", "''", "'/'", "None", "5")):
        assert e is not None and e[0] == "ValueError", e
        assert "a tag is a non-empty str without '/'" in e[2] and e[2].endswith(shown)
    assert tags["after_bad"] == ["", 0]


def test_tags_are_per_thread(tags):
    r = tags
    allocs = by_addr(r["events"])
    threads = {}
    for name, tag in (("A", "alpha"), ("B", "beta"), ("C", "")):
        w = r["workers"][name]
        assert w["cur"] == tag
        assert len(w["ptrs"]) == 40
        evs = [allocs[p] for p in w["ptrs"]]
        assert {e["tag"] for e in evs} == {tag}, name
        assert len({e["thread"] for e in evs}) == 1, name
        threads[name] = evs[0]["thread"]
    main = allocs[r["main_ptr"]]
    assert r["main_during"] == "main" and main["tag"] == "main"
    assert len(set(threads.values()) | {main["thread"]}) == 4, "one thread index per thread"


def test_backward_context_attributes_native_threads(tags):
    r = tags
    allocs = by_addr(r["bw_events"])
    st = r["bw_stacks"]
    assert r["backward_wrapped"]
    assert r["bw_before"] == [0, 0] and r["bw_after"] == [0, 0]
    tagged, plain, functional, outside, outside_tagged = (allocs[p] for p in r["bw_ptrs"])
    assert (tagged["tag"], plain["tag"], functional["tag"]) == ("<backward>/train", "<backward>", "<backward>")
    assert user_frame(st[str(tagged["stack_id"])]["user"][0], "backward_tagged", "train_step")
    assert user_frame(st[str(plain["stack_id"])]["user"][0], "backward_plain", "train_step")
    assert user_frame(st[str(functional["stack_id"])]["user"][0], "backward_functional", "train_step_functional")
    # outside backward the context is cleared; a native thread never sees its caller's tag
    assert (outside["tag"], outside["stack_id"]) == ("", 0)
    assert (outside_tagged["tag"], outside_tagged["stack_id"]) == ("", 0)
    assert all(e["size"] == 3072 and e["requested"] == 3000 for e in (tagged, outside))
    # every native thread is a new thread: its own index, none the main thread's
    main = {e["thread"] for e in r["events"] if e["addr"] == r["main_ptr"]}
    native = [e["thread"] for e in (tagged, plain, functional, outside, outside_tagged)]
    assert len(set(native)) == 5 and not set(native) & main


def test_backward_context_in_tags_and_none_modes(tags):
    for mode, want_tag in (("tags", "<backward>/train"), ("none", "")):
        out = tags["bw_pythread"][mode]
        native = by_addr(out["events"])[out["native"]]
        assert (native["tag"], native["stack_id"]) == (want_tag, 0), mode


def test_python_thread_during_backward_keeps_its_own_context_in_python_mode(tags):
    out = tags["bw_pythread"]["python"]
    allocs = by_addr(out["events"])
    assert allocs[out["native"]]["tag"] == "<backward>/train"
    py = allocs[out["python"]]
    assert py["tag"] == "" and py["stack_id"] != 0


def test_tags_mode_attributes_untagged_allocations_during_backward_to_it(tags):
    """Documented limitation of stacks='tags': without walking frames (which
    needs the GIL) a Python thread cannot be told from an autograd engine
    thread, so an untagged allocation from any thread while another thread
    runs backward() gets the backward context. stacks='python' is exact
    (test above)."""
    out = tags["bw_pythread"]["tags"]
    py = by_addr(out["events"])[out["python"]]
    assert py["tag"] == "<backward>/train"


def test_owned_recording_restores_the_process_state():
    """What a scenario changes process-wide is put back after it."""
    before = (_C.stack_mode(), _C.thread_tag(), _C.backward_context(), torch.autograd.backward)
    with owned_recording() as a:
        recording.record_history(stacks="python", allocator=a)
        _C.set_thread_tag(_C.intern_tag("left-over"))
        _C.set_backward_context(_C.intern_tag("<backward>/left-over"), 0)
        assert hasattr(torch.autograd.backward, "__wrapped__")
    assert (_C.stack_mode(), _C.thread_tag(), _C.backward_context(), torch.autograd.backward) == before
    assert id(a) not in recording._recording


# =============================================================================
# 6. Snapshot in torch's format, dump_snapshot, torch.cuda._memory_viz
# =============================================================================
@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("snap")
    R = {}
    with owned_recording() as a:
        recording.record_history(max_entries=1000, stacks="python", allocator=a)
        small = user_code.alloc_a(1000, a)
        large = user_code.alloc_b(3 * MiB + 5, a)
        tmp_t = user_code.alloc_a(5000, a)
        del tmp_t
        with memalloc.tag("snap"):
            tagged = user_code.alloc_a(2000, a)
        R["oom"] = err(lambda: user_code.alloc_a(60 * MiB, a))
        R["free_at_oom"] = a.mem_get_info(0)[0]
        R["ptrs"] = {"small": small.data_ptr(), "large": large.data_ptr(), "tagged": tagged.data_ptr()}
        s = snapshots.snapshot(allocator=a)
        R["snap"] = jsonable(s)
        R["pool_id_type"] = type(s["segments"][0]["segment_pool_id"]).__name__
        R["allocated"] = [allocated(a), reserved(a)]
        R["snapshot_dev0_same"] = snapshots.snapshot(0, allocator=a) == s
        path = str(tmp / "a.pickle")
        R["dump_returns"] = snapshots.dump_snapshot(path, allocator=a) == path
        with open(path, "rb") as f:
            R["dump_same"] = pickle.load(f) == s
        R["viz"] = {
            "trace": mv.trace(s),
            "segsum": mv.segsum(s),
            "segments": mv.segments(s, format_flamegraph=lambda x: x),
            "memory": mv.memory(s, format_flamegraph=lambda x: x),
        }

        def embedded(html):
            m = re.search(r'"base64": "([^"]+)"', html)
            return pickle.loads(base64.b64decode(m.group(1))) == s if m else None

        tp, sp = mv.trace_plot(s), mv.segment_plot(s)
        R["plots"] = [
            type(tp).__name__,
            tp.lstrip()[:15],
            embedded(tp),
            type(sp).__name__,
            sp.lstrip()[:15],
            embedded(sp),
        ]

        # the OOM entry after memory was freed
        del large
        a.empty_cache(0)
        R["oom_later"] = [
            e["device_free"] for e in snapshots.snapshot(allocator=a)["device_traces"][0] if e["action"] == "oom"
        ]

        # the C++ conversion against the definition, written out from events()
        R["reference_same"] = snapshots.snapshot(allocator=a)["device_traces"][0] == reference_trace(a)
        del small, tagged
    return jsonable(R)


def reference_trace(a) -> list[dict]:
    """torch's trace entries of ``a``'s recorded events, written out in
    Python from recording.events(): the definition trace_export.cpp builds."""

    def entry_of(e):
        entry = {
            "action": e.action,
            "addr": e.addr,
            "size": e.size,
            "stream": e.stream,
            "time_us": e.time_ns // 1000,
            "frames": recording.frames_json(e.stack_id),
            "requested_size": e.requested,
            "tag": e.tag,
            "step": e.step,
            "thread": e.thread,
        }
        if e.action == "oom":
            entry["device_free"], entry["addr"] = e.addr, 0
        return entry

    torch_actions = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}
    return [entry_of(e) for e in recording.events(allocator=a) if e.action in torch_actions]


SEGMENT_KEYS = {
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "blocks",
}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}


def first_user(frames):
    return next(([f["filename"], f["line"], f["name"]] for f in frames if not internal(f["filename"])), None)


def test_snapshot_segments_have_torch_structure(snap):
    r = snap
    s = r["snap"]
    assert set(s) == {"segments", "device_traces"}
    assert r["pool_id_type"] == "tuple"
    segs = {seg["segment_type"]: seg for seg in s["segments"]}
    assert len(s["segments"]) == 2 and set(segs) == {"small", "large"}
    for seg in s["segments"]:
        assert SEGMENT_KEYS <= set(seg)
        assert seg["device"] == 0 and seg["stream"] == 0
        assert seg["address"] == seg["blocks"][0]["address"]
        for b in seg["blocks"]:
            assert BLOCK_KEYS <= set(b)
        # blocks tile the segment
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        for b, n in zip(seg["blocks"], seg["blocks"][1:]):
            assert b["address"] + b["size"] == n["address"]
    p = r["ptrs"]
    small, large = segs["small"], segs["large"]
    assert small["total_size"] == SMALL_SEGMENT and large["total_size"] == LARGE_SEGMENT
    assert [(b["address"], b["size"], b["requested_size"], b["state"]) for b in small["blocks"]] == [
        (p["small"], 1024, 1000, "active_allocated"),
        (p["tagged"], 2048, 2000, "active_allocated"),
        (p["tagged"] + 2048, SMALL_SEGMENT - 3072, 0, "inactive"),
    ]
    assert p["tagged"] == p["small"] + 1024
    L = rnd(3 * MiB + 5)
    assert [(b["address"], b["size"], b["requested_size"], b["state"]) for b in large["blocks"]] == [
        (p["large"], L, 3 * MiB + 5, "active_allocated"),
        (p["large"] + L, LARGE_SEGMENT - L, 0, "inactive"),
    ]
    assert (small["allocated_size"], small["active_size"], small["requested_size"]) == (3072, 3072, 3000)
    assert (large["allocated_size"], large["active_size"], large["requested_size"]) == (L, L, 3 * MiB + 5)
    allocated_, reserved_ = r["allocated"]  # torch.cuda.memory_allocated(): test_torch_snapshot_and_dumps_match
    assert sum(seg["allocated_size"] for seg in s["segments"]) == allocated_ == 3072 + L
    assert sum(seg["total_size"] for seg in s["segments"]) == reserved_ == SMALL_SEGMENT + LARGE_SEGMENT


def test_snapshot_block_frames_point_at_user_code(snap):
    s = snap["snap"]
    blocks = {b["address"]: b for seg in s["segments"] for b in seg["blocks"]}
    p = snap["ptrs"]
    for name, site_name, fn in (
        ("small", "alloc_a", "alloc_a"),
        ("tagged", "alloc_a", "alloc_a"),
        ("large", "alloc_b", "alloc_b"),
    ):
        fr = first_user(blocks[p[name]]["frames"])
        assert fr is not None and user_frame(fr, site_name, fn), (name, blocks[p[name]]["frames"])
    assert blocks[p["tagged"]]["tag"] == "snap" and blocks[p["small"]]["tag"] == ""
    inactive = [b for b in blocks.values() if b["state"] == "inactive"]
    assert len(inactive) == 2 and all(b["frames"] == [] for b in inactive)


def test_snapshot_device_traces(snap):
    r = snap
    s = r["snap"]
    p = r["ptrs"]
    assert len(s["device_traces"]) == 1
    tr = s["device_traces"][0]
    for e in tr:
        assert TRACE_KEYS <= set(e), e
    small_seg = p["small"]
    L = rnd(3 * MiB + 5)
    # alloc_retry and sync_all_streams are memalloc-only: not in torch's trace
    assert [(e["action"], e["addr"], e["size"]) for e in tr] == [
        ("segment_alloc", small_seg, SMALL_SEGMENT),
        ("alloc", p["small"], 1024),
        ("segment_alloc", p["large"], LARGE_SEGMENT),
        ("alloc", p["large"], L),
        ("alloc", p["tagged"], 5120),
        ("free_requested", p["tagged"], 5120),
        ("free_completed", p["tagged"], 5120),
        ("alloc", p["tagged"], 2048),
        ("oom", 0, 60 * MiB),
    ]
    assert [e["requested_size"] for e in tr if e["action"] == "alloc"] == [1000, 3 * MiB + 5, 5000, 2000]
    times = [e["time_us"] for e in tr]
    assert times == sorted(times)
    assert all(
        user_frame(
            first_user(e["frames"]),
            "alloc_a" if e["addr"] != p["large"] else "alloc_b",
            "alloc_a" if e["addr"] != p["large"] else "alloc_b",
        )
        for e in tr
    )
    oom = tr[-1]
    assert r["oom"][0] == "OutOfMemoryError"
    assert oom["device_free"] == r["free_at_oom"] == 64 * MiB - SMALL_SEGMENT - LARGE_SEGMENT
    assert oom["requested_size"] == 60 * MiB


def test_snapshot_oom_device_free_is_the_free_memory_at_the_oom(snap):
    assert snap["oom_later"] == [snap["free_at_oom"]]


def test_snapshot_traces_equal_the_events_written_out_in_python(snap):
    # device_traces are built in C++ (trace_export.cpp); this is the definition.
    assert snap["reference_same"] is True


def test_snapshot_traces_equal_the_reference_where_each_field_changes_alone():
    """trace_export.cpp copies each entry from the one before and sets only
    the fields whose record differs: a trace where each field changes on
    its own between neighbours (stream, tag, step, thread, stack, size),
    with ooms back to back and entries after them (an oom entry has one key
    more), is still the definition, entry for entry."""
    with owned_recording() as a:
        recording.record_history(stacks="python", allocator=a)
        kept = [a.malloc(1000)]
        kept.append(a.malloc(1000, 0, 7))  # another stream
        with memalloc.tag("other"):
            kept.append(a.malloc(1000))  # another tag
        memalloc.step()
        kept.append(a.malloc(1000))  # another step
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            kept.append(pool.submit(a.malloc, 1000).result())  # another thread
        kept.append(user_code.alloc_a(1000, a).data_ptr() and a.malloc(1000))  # another stack
        kept.append(a.malloc(3000))  # another size
        for _ in range(2):  # two ooms in a row, then an allocation
            err(lambda: a.malloc(200 * MiB))
        kept.append(a.malloc(1000))
        for p in kept[::2]:
            a.free(p)
        got = snapshots.snapshot(allocator=a)["device_traces"][0]
        want = reference_trace(a)
        for p in kept[1::2]:
            a.free(p)
    assert [e["action"] for e in got].count("oom") == 2
    assert [sorted(e) for e in got] == [sorted(e) for e in want]
    assert got == want


def test_snapshot_of_a_million_events_takes_under_a_second():
    with owned_recording() as a:
        recording.record_history(max_entries=1_000_000, stacks="python", allocator=a)

        def alloc_site(i):
            p = a.malloc(512 + (i % 7) * 4096)  # HERE:million
            a.free(p)

        with memalloc.tag("million"):
            for i in range(400_000):
                alloc_site(i)
        gc_was = gc.isenabled()
        seconds = []
        s = None
        for _ in range(5):
            # CPU time of this (single-threaded) work: other processes on the
            # machine do not inflate it the way they inflate wall-clock time; time
            # the hypervisor steals from the virtual CPU does (seen here: 0.87 to
            # 2.9 s within one run while a neighbour was busy, 0.45 - 0.6 s
            # otherwise), so the cost is the best of five. The previous snapshot
            # is freed first (0.15 s for a million dicts): not the snapshot's cost.
            del s
            t0 = time.process_time()
            s = snapshots.snapshot(allocator=a)
            seconds.append(time.process_time() - t0)
            # the first allocations after it do not collect a million entries (0.15 s when they did)
            t1 = time.process_time()
            made = [[] for _ in range(1000)]
            seconds[-1] += time.process_time() - t1
            del made
        n_events = len(recording.events_array(allocator=a))
    tr = s["device_traces"][0]
    assert n_events == len(tr) == 1_000_000  # the ring is full: every entry is a torch action
    # Issue #5's target, on this 2-core machine: < 1 s of CPU time, the best of five
    # (0.52 - 0.64 s on 2026-12-03's CPU, which runs Python ~2.5x slower than earlier
    # sessions' and read 1.0 - 1.1 s before trace_export.cpp copied each entry from the
    # one before and left the entries untracked); no run over 4 s even on a busy machine.
    assert min(seconds) < 1.0 and max(seconds) < 4.0, seconds
    assert gc.isenabled() == gc_was
    # the entries are not the cyclic collector's: no later collection walks a million dicts
    assert not any(gc.is_tracked(e) for e in tr)
    # one frames list per distinct stack (a loop has one allocation site), not per entry
    allocs = [e["frames"] for e in tr if e["action"] == "alloc"]
    assert len({id(f) for f in allocs}) == 1
    assert sorted({e["tag"] for e in tr}) == ["million"]
    here_frames = [
        [f["filename"], f["line"], f["name"]]
        for f in allocs[0]
        if os.path.realpath(f["filename"]) == os.path.realpath(__file__)
    ]
    assert here_frame(
        here_frames[0], "million", "test_snapshot_of_a_million_events_takes_under_a_second.<locals>.alloc_site"
    )  # co_qualname


def test_torch_snapshot_and_dumps_match(snap, enabled):
    assert enabled["patched"] == [True, True, True]
    assert enabled["mode_on"] == 2
    assert enabled["torch_snapshot_same"] and snap["snapshot_dev0_same"]
    assert snap["dump_returns"] and snap["dump_same"]
    assert enabled["torch_dump_returns"] == "None" and enabled["torch_dump_same"]
    # torch.cuda.memory_allocated() answers from memalloc (small + tagged + large, as in the snapshot above)
    memalloc_allocated, torch_allocated = enabled["allocated"]
    assert memalloc_allocated == torch_allocated == 3072 + rnd(3 * MiB + 5)


def test_memory_viz_reads_the_snapshot(snap):
    r = snap
    v = r["viz"]
    tr = r["snap"]["device_traces"][0]
    assert v["trace"].startswith("Device 0 ----------------\n" + f"{len(tr)} entries\n")
    assert v["trace"].count("cudaMalloc(") == 2
    assert "raise OutOfMemoryError # 60.0MiB requested" in v["trace"]
    assert "segments: 2\n" in v["segsum"] and "total_reserved: 22.0MiB\n" in v["segsum"]
    la, lb = site("alloc_a"), site("alloc_b")
    L = rnd(3 * MiB + 5)
    for text, prefix in ((v["segments"], "stream_0;seg_"), (v["memory"], "stream_0;")):
        lines = text.splitlines()
        # one line per block with its frames and requested bytes, one per block for the rest (<gaps>)
        assert len(lines) == 10 and all(l.startswith(prefix) for l in lines)
        live = [l for l in lines if ";active_allocated;" in l and "<gaps>" not in l]
        assert sorted(int(l.rsplit(" ", 1)[1]) for l in live) == [1000, 2000, 3 * MiB + 5]
        assert sum(f"user_code.py:{la}:alloc_a;host.py:" in l for l in live) == 2
        assert sum(f"user_code.py:{lb}:alloc_b;host.py:" in l for l in live) == 1
        gaps = [int(l.rsplit(" ", 1)[1]) for l in lines if l.rsplit(" ", 1)[0].endswith(";active_allocated;<gaps>")]
        assert sorted(gaps) == sorted([24, 48, L - 3 * MiB - 5])
        free = [int(l.rsplit(" ", 1)[1]) for l in lines if l.rsplit(" ", 1)[0].endswith(";inactive;<gaps>")]
        assert sorted(free) == sorted([SMALL_SEGMENT - 3072, LARGE_SEGMENT - L])
        assert [int(l.rsplit(" ", 1)[1]) for l in lines if ";inactive;<non-python>" in l] == [0, 0]
    assert r["plots"] == ["str", "<!DOCTYPE html>", True, "str", "<!DOCTYPE html>", True]


def test_torch_record_memory_history_stops_and_starts(enabled):
    r = enabled
    assert r["off"] == [0, 0, [[]]]
    assert r["off_after"] == 0
    assert r["segments_while_off"] == 1  # the small segment (the large one was released)
    assert r["on_again"] == 2
    n, dropped, n_trace, actions, all_stacks = r["wrapped"]
    assert (n, dropped, n_trace) == (1000, 400 * 3 - 1000, 1000)
    assert actions == ["alloc", "free_completed", "free_requested"]
    assert all_stacks
    assert r["context_none"] == 1 and r["default"] == 2


# =============================================================================
# 7. save_trace / load_trace (two devices), and per-device stopping
# =============================================================================
@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    R = {}
    with owned_recording("host_capacity_mb:64,host_devices:2") as a:
        recording.record_history(stacks="python", max_entries=8, allocator=a)
        R["steps_before"] = memalloc.iteration.steps()
        keep = []
        with memalloc.tag("d0"):
            for i in range(3):
                keep.append(user_code.alloc_a(1000 + i, a))
        memalloc.step()
        with memalloc.tag("d1"):
            for i in range(10):
                keep.append(host.empty(512 * (i + 1), torch.uint8, device=1, allocator=a))
            t = user_code.alloc_b(allocator=a)
            del t
            for i in range(3):
                keep.append(user_code.alloc_a(700 + i, a))
        R["oom1"] = err(lambda: host.empty(100 * MiB, torch.uint8, device=1, allocator=a))
        R["live"] = [ev(a, 0), ev(a, 1)]
        R["live_dropped"] = [recording.dropped(0, allocator=a), recording.dropped(1, allocator=a)]
        ids = sorted({e["stack_id"] for d in R["live"] for e in d if e["stack_id"]})
        R["live_stacks"] = {str(i): frames(i) for i in ids}
        R["live_tags"] = _C.tag_names()
        path = str(tmp / "t.memtrace")
        R["save_returns"] = trace_files.save_trace(path, allocator=a) == path
        tr = trace_files.load_trace(path)
        R["loaded"] = [[dataclasses.asdict(e) for e in d] for d in tr.events]
        R["loaded_dropped"] = tr.dropped
        R["loaded_stacks"] = {str(i): [[f.filename, f.line, f.name] for f in fs] for i, fs in tr.stacks.items()}
        R["loaded_tags"] = tr.tags
        R["frame_type"] = type(next(iter(tr.stacks.values()))[0]).__name__
        with open(path, "rb") as f:
            R["magic"] = f.read(17).decode()
        bad = str(tmp / "bad")
        with open(bad, "wb") as f:
            f.write(b"MEMALLOC-TRACE-0\n" + b"\0" * 100)
        R["bad_magic"] = err(lambda: trace_files.load_trace(bad))
        with open(bad, "wb") as f:
            pass
        R["empty_file"] = err(lambda: trace_files.load_trace(bad))

        # ---- stopping one device ----
        recording.record_history(stacks="python", max_entries=100, allocator=a)
        recording.record_history(False, device=0, allocator=a)
        with memalloc.tag("still"):
            p0 = a.malloc(1000, 0)
            p1 = a.malloc(1000, 1)
        R["one_off"] = [ev(a, 0), ev(a, 1), p1, _C.stack_mode()]
        a.free(p0, 0)
        a.free(p1, 1)
        del keep
    return jsonable(R)


def test_trace_round_trip_keeps_every_field(trace_file):
    r = trace_file
    s = r["steps_before"]  # the process's step counter when the scenario started
    assert r["save_returns"]
    assert r["magic"] == "MEMALLOC-TRACE-1\n"
    assert r["loaded"] == r["live"]
    assert [len(d) for d in r["live"]] == [8, 8]
    assert {e["device"] for e in r["live"][0]} == {0} and {e["device"] for e in r["live"][1]} == {1}
    # both rings wrapped, by different amounts: device 0 saw 10 events, device 1 saw 11 + alloc_retry,
    # sync_all_streams and oom
    assert r["live_dropped"] == [10 - 8, 14 - 8]
    assert r["loaded_dropped"] == r["live_dropped"]
    assert r["live"][1][-1]["action"] == "oom" and r["live"][1][-1]["requested"] == 100 * MiB
    assert {e["tag"] for d in r["live"] for e in d} >= {"d0", "d1"}
    # device 0 kept alloc_a #2, #3 (step s, tag d0), then alloc_b and alloc_a x 3 (step s + 1, tag d1)
    allocs0 = [e for e in r["live"][0] if e["action"] == "alloc"]
    assert [(e["step"], e["tag"]) for e in allocs0] == [(s, "d0")] * 2 + [(s + 1, "d1")] * 4
    assert [e["requested"] for e in allocs0] == [1001, 1002, 1000, 700, 701, 702]


def test_trace_round_trip_keeps_stacks_and_tags(trace_file):
    r = trace_file
    assert r["loaded_stacks"] == r["live_stacks"] and r["live_stacks"]
    assert r["loaded_tags"] == r["live_tags"]
    assert {"d0", "d1"} <= set(r["loaded_tags"]) and r["loaded_tags"][0] == ""
    assert r["frame_type"] == "Frame"
    user = [[f for f in fs if is_user_file(f[0])] for fs in r["loaded_stacks"].values()]
    assert any(fs and fs[0][1:] == [site("alloc_a"), "alloc_a"] for fs in user)


def test_load_trace_rejects_other_files(trace_file):
    for e in (trace_file["bad_magic"], trace_file["empty_file"]):
        assert e is not None and e[0] == "ValueError", e
        assert "not a memalloc trace file (bad magic)" in e[2]


def test_stopping_one_device_keeps_the_other_recording(trace_file):
    ev0, ev1, p1, mode = trace_file["one_off"]
    assert ev0 == []
    assert [(e["action"], e["addr"]) for e in ev1][-1] == ("alloc", p1)


def test_stopping_one_device_keeps_the_others_stacks_and_tags(trace_file):
    ev0, ev1, p1, mode = trace_file["one_off"]
    last = ev1[-1]
    assert (last["tag"], mode) == ("still", 2) and last["stack_id"] != 0


# =============================================================================
# 8. What memalloc.enable() wires: a fresh interpreter
# =============================================================================
# enable() installs an allocator once per process, reads MEMALLOC_CONF, and on
# the host backend points torch's own memory functions at the installed
# allocator (torch.cuda.memory._record_memory_history, _snapshot,
# _dump_snapshot, memory_allocated take no allocator), so these assertions
# need a process of their own; one interpreter serves them all.
ENABLED = """
import os, pickle, tempfile
from memalloc import _C
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "recording_cases"))
import user_code
TMP = tempfile.mkdtemp()

# ---- before enable(): no allocator to record on; the process-wide stack mode is off ----
R["not_enabled"] = err(lambda: memalloc.record_history())
R["mode_before"] = _C.stack_mode()

# ---- MEMALLOC_CONF=record_history:3,record_stacks:tags turns recording on at enable() ----
memalloc.enable(backend="host")
with memalloc.tag("conf"):
    ts = [memalloc.host.empty(1000 + i) for i in range(4)]
evs = memalloc.events()
R["conf"] = {"n": len(evs), "dropped": memalloc.recording.dropped(), "tags": [e.tag for e in evs],
             "stacks": [e.stack_id for e in evs], "mode": _C.stack_mode()}
del ts

# ---- torch's own functions answer from memalloc ----
R["patched"] = [torch.cuda.memory._record_memory_history.__memalloc__, torch.cuda.memory._snapshot.__memalloc__,
                torch.cuda.memory._dump_snapshot.__memalloc__]
torch.cuda.memory._record_memory_history("all", stacks="python", max_entries=1000)
R["mode_on"] = _C.stack_mode()
small = user_code.alloc_a(1000)
large = user_code.alloc_b(3 * MiB + 5)
with memalloc.tag("snap"):
    tagged = user_code.alloc_a(2000)
s = memalloc.snapshot()
R["torch_snapshot_same"] = torch.cuda.memory._snapshot() == s
R["allocated"] = [memalloc.memory.memory_allocated(), torch.cuda.memory_allocated()]
path = os.path.join(TMP, "b.pickle")
R["torch_dump_returns"] = repr(torch.cuda.memory._dump_snapshot(path))
with open(path, "rb") as f:
    R["torch_dump_same"] = pickle.load(f) == s
del large
memalloc.memory.empty_cache()

# ---- stopping and starting through torch's API ----
torch.cuda.memory._record_memory_history(enabled=None)
R["off"] = [_C.stack_mode(), len(memalloc.events()), memalloc.snapshot()["device_traces"]]
x = user_code.alloc_a(1000)
del x
R["off_after"] = len(memalloc.events())
R["segments_while_off"] = len(memalloc.snapshot()["segments"])
torch.cuda.memory._record_memory_history("all", stacks="python", max_entries=1000)
R["on_again"] = _C.stack_mode()
for i in range(400):
    t = user_code.alloc_b(1000)
    del t
es = memalloc.events()
R["wrapped"] = [len(es), memalloc.recording.dropped(), len(memalloc.snapshot()["device_traces"][0]),
                sorted({e.action for e in es}), all(e.stack_id for e in es)]
torch.cuda.memory._record_memory_history("all", context=None, max_entries=10)
R["context_none"] = _C.stack_mode()
torch.cuda.memory._record_memory_history(stacks="python", max_entries=10)
R["default"] = _C.stack_mode()
"""


@pytest.fixture(scope="module")
def enabled(fresh_python):
    # call_sites:False: the stack mode is exactly what the recording asks for (test_zero_setup.py
    # covers the default, where stacks stay on under every recording mode)
    return fresh_python.code("", ENABLED, conf="record_history:3,record_stacks:tags,call_sites:False")[1]


def test_recording_from_memalloc_conf(enabled):
    """MEMALLOC_CONF=record_history:N,record_stacks:tags turns recording on at enable()."""
    r = enabled["conf"]
    # 1 segment_alloc + 4 allocs = 5 events into a ring of 3
    assert r["n"] == 3 and r["dropped"] == 2
    assert r["tags"] == ["conf"] * 3 and r["stacks"] == [0, 0, 0] and r["mode"] == 1


def test_wire_formats_come_from_the_core_and_decode_what_it_packs(host_allocator):
    """The record and the live block are defined once, in C++ (recorder.h,
    device_allocator.h); Python's struct formats are built from the fields _C
    exports, and decode what the core packs."""
    import struct

    from memalloc.trace import sites

    assert struct.calcsize(recording.RECORD_FORMAT) == _C.RECORD_BYTES == 64
    assert struct.calcsize(sites.LIVE_FORMAT) == _C.LIVE_BYTES
    assert recording.struct_format([("a", 0, 8, False), ("b", 8, 4, True)], 16) == "<Qixxxx"
    p = host_allocator.malloc(1000)
    try:
        ((addr, size, requested, *_),) = sites.live_blocks(0, allocator=host_allocator)
        assert (addr, size, requested) == (p, 1024, 1000)
        # the leak sample's reading: the same blocks, three of the fields
        q = host_allocator.malloc(3 << 20)
        full = sites.live_blocks(0, allocator=host_allocator)
        assert struct.calcsize(sites.SIZE_STACK_STEP_FORMAT) == _C.LIVE_BYTES
        assert list(sites.live_size_stack_step(0, allocator=host_allocator)) == [(b[1], b[3], b[5]) for b in full]
        assert sorted(b[1] for b in full) == [1024, 3 << 20]
        host_allocator.free(q)
    finally:
        host_allocator.free(p)
