"""Where two allocators part on the same workload: reads two of torch's
allocator snapshots with their traces (``torch.cuda.memory._dump_snapshot``;
memalloc writes the same format), one per allocator, of the same run
(benchmarks/fit/largest_batch.py ``--worker ... --history PATH``), and says

* whether both saw the same requests (sizes in order, and which earlier
  allocation each free gave back), and the first one that differs;
* the first segment event (a cudaMalloc or a release of one) that differs,
  with the request it came at and both sides' reserved and allocated bytes
  there;
* each side's peaks, and its last event (an OOM, with the request).

    python -m benchmarks fit-diff A.pickle[.gz] B.pickle[.gz] [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import sys
from dataclasses import dataclass, field

MiB = 1 << 20


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return pickle.load(f)


@dataclass
class Timeline:
    """One device's trace as requests and segment events, in order."""

    requests: list = field(default_factory=list)  # ("alloc", size) or ("free", index of its alloc)
    segments: list = field(
        default_factory=list
    )  # (request index, "segment_alloc"|"segment_free", size, reserved after)
    reserved_at: list = field(default_factory=list)  # reserved bytes after each request
    allocated_at: list = field(default_factory=list)
    peak_reserved: int = 0
    peak_allocated: int = 0
    last: dict | None = None


def timeline(snapshot: dict, device: int = 0) -> Timeline:
    t = Timeline()
    live: dict = {}  # addr -> alloc index
    reserved = allocated = 0
    n_allocs = 0
    for e in snapshot["device_traces"][device]:
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = n_allocs
            t.requests.append(("alloc", e["size"]))
            n_allocs += 1
            allocated += e["size"]
        elif a == "free_requested":
            t.requests.append(("free", live.pop(e["addr"], None)))
            allocated -= e["size"]
        elif a in ("segment_alloc", "segment_map"):
            reserved += e["size"]
            t.segments.append((len(t.requests), "segment_alloc", e["size"], reserved))
        elif a in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
            t.segments.append((len(t.requests), "segment_free", e["size"], reserved))
        else:
            if a == "oom":
                t.last = {
                    "action": "oom",
                    "size": e.get("size"),
                    "at_request": len(t.requests),
                    "reserved": reserved,
                    "allocated": allocated,
                }
            continue
        if a in ("alloc", "free_requested"):
            t.reserved_at.append(reserved)
            t.allocated_at.append(allocated)
        t.peak_reserved = max(t.peak_reserved, reserved)
        t.peak_allocated = max(t.peak_allocated, allocated)
    return t


def first_difference(a: list, b: list) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(a: Timeline, b: Timeline, names=("a", "b")) -> dict:
    out: dict = {"requests": {n: len(t.requests) for n, t in zip(names, (a, b))}}
    d = first_difference(a.requests, b.requests)
    out["first_request_difference"] = (
        None
        if d is None
        else {
            "index": d,
            names[0]: a.requests[d] if d < len(a.requests) else None,
            names[1]: b.requests[d] if d < len(b.requests) else None,
        }
    )
    seg_a = [(i, k, s) for i, k, s, _ in a.segments]
    seg_b = [(i, k, s) for i, k, s, _ in b.segments]
    out["segment_events"] = {names[0]: len(seg_a), names[1]: len(seg_b)}
    s = first_difference(seg_a, seg_b)
    if s is not None:
        row = {"index": s}
        for n, t in zip(names, (a, b)):
            if s < len(t.segments):
                req, kind, size, res = t.segments[s]
                row[n] = {
                    "at_request": req,
                    "event": kind,
                    "mib": round(size / MiB, 1),
                    "reserved_mib": round(res / MiB, 1),
                    "allocated_mib": round(t.allocated_at[req - 1] / MiB, 1) if req else 0.0,
                    "request": t.requests[req - 1] if req else None,
                }
        row["context"] = {
            n: [(i, k, round(sz / MiB, 1)) for i, k, sz, _ in t.segments[max(0, s - 3) : s + 4]]
            for n, t in zip(names, (a, b))
        }
        out["first_segment_difference"] = row
    else:
        out["first_segment_difference"] = None
    for n, t in zip(names, (a, b)):
        out[n] = {
            "peak_reserved_mib": round(t.peak_reserved / MiB, 1),
            "peak_allocated_mib": round(t.peak_allocated / MiB, 1),
            "last": t.last,
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--names", default="a,b")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    names = tuple(args.names.split(","))
    r = compare(timeline(load(args.a)), timeline(load(args.b)), names)
    print(json.dumps(r, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
