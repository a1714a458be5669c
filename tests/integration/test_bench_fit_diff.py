"""benchmarks/fit/diff.py: where two allocators' traces of one workload part,
on traces this test writes in torch's snapshot format (device_traces of
alloc / free_requested / segment_alloc / segment_free / oom entries), with
the place they differ chosen here."""

from __future__ import annotations

import gzip
import pickle

from benchmarks.fit import diff

MiB = 1 << 20


def trace(events: list[tuple]) -> dict:
    return {
        "segments": [],
        "device_traces": [[{"action": a, "addr": addr, "size": size, "stream": 0} for a, addr, size in events]],
    }


def common() -> list[tuple]:
    return [
        ("segment_alloc", 0x1000, 20 * MiB),
        ("alloc", 0x1000, 4 * MiB),
        ("alloc", 0x2000, 8 * MiB),
        ("free_requested", 0x1000, 4 * MiB),
    ]


def test_the_first_segment_event_that_differs_is_named_with_both_sides_books(tmp_path):
    a = common() + [("alloc", 0x3000, 30 * MiB), ("segment_alloc", 0x3000, 30 * MiB)]
    # b grows its segment before the same request, then runs out of memory
    b = common() + [
        ("segment_free", 0x1000, 20 * MiB),
        ("alloc", 0x3000, 30 * MiB),
        ("segment_alloc", 0x3000, 30 * MiB),
        ("oom", 0, 64 * MiB),
    ]
    pa, pb = tmp_path / "a.pickle.gz", tmp_path / "b.pickle"
    with gzip.open(pa, "wb") as f:
        pickle.dump(trace(a), f)
    pb.write_bytes(pickle.dumps(trace(b)))
    r = diff.compare(diff.timeline(diff.load(str(pa))), diff.timeline(diff.load(str(pb))), ("native", "memalloc"))
    assert r["first_request_difference"] is None  # the same requests in the same order
    d = r["first_segment_difference"]
    assert d["index"] == 1
    assert d["native"]["event"] == "segment_alloc" and d["native"]["at_request"] == 4
    assert d["memalloc"] == {
        **d["memalloc"],
        "event": "segment_free",
        "at_request": 3,
        "reserved_mib": 0.0,
        "allocated_mib": 8.0,
        "request": ("free", 0),
    }
    assert r["native"]["peak_reserved_mib"] == 50.0 and r["memalloc"]["peak_reserved_mib"] == 30.0
    assert r["memalloc"]["last"] == {
        "action": "oom",
        "size": 64 * MiB,
        "at_request": 4,
        "reserved": 30 * MiB,
        "allocated": 38 * MiB,
    }


def test_a_request_that_differs_is_found():
    a = diff.timeline(trace(common()))
    b = diff.timeline(trace(common()[:2] + [("alloc", 0x2000, 9 * MiB)]))
    r = diff.compare(a, b)
    assert r["first_request_difference"] == {"index": 1, "a": ("alloc", 8 * MiB), "b": ("alloc", 9 * MiB)}
