"""Pages moved per step: a trace (benchmarks/traces/, record_traces.py)
replayed on the host backend one step at a time (its events' step numbers),
with the pages each step mapped and unmapped (num_device_alloc/free: runs of
an expandable segment; segments for plain ones) and the peaks so far.

    python -m benchmarks.page_moves TRACE [--config TEXT ...]

A loop that maps and unmaps pages at every step pays, on a GPU, a stream
synchronisation and the driver's unmap and map calls each step: the
expandable-segment step-time question of issue 25.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Sequence

from memalloc.features import replay
from memalloc.trace.recording import Event
from memalloc.trace.trace_files import load_trace


def per_step(trace: str | os.PathLike | Sequence[Event], config: str = "", device: int = 0) -> list[dict]:
    """[{"step", "maps", "unmaps", "peak_allocated", "peak_reserved", "reserved", "recorded_maps",
    "recorded_unmaps"}] per step of one device of a trace (a file, or one device's events; bytes).
    recorded_*: the segment_map / segment_unmap events the recording run itself made in that
    step (a trace recorded under expandable segments: what the live run did, beside what the
    replay does)."""
    if isinstance(trace, (str, os.PathLike)):
        events, source = load_trace(trace).events[device], os.fspath(trace)
    else:
        events, source = list(trace), "events"
    ops = replay._trace_ops(events)
    a, _capacity, (player,) = replay._replayers([ops], config, None, source, synthetic=False)
    by_step: dict[int, list] = {}
    for op in ops:
        by_step.setdefault(events[op[4]].step, []).append(op)
    recorded: dict[tuple[int, str], int] = {}
    for e in events:
        if e.action in ("segment_map", "segment_unmap"):
            recorded[e.step, e.action] = recorded.get((e.step, e.action), 0) + 1
    rows, before = [], (0, 0)
    for step in sorted(by_step):
        player.run(by_step[step], False)
        s = a.stats(0)
        now = (s["num_device_alloc"], s["num_device_free"])
        rows.append({"step": step, "maps": now[0] - before[0], "unmaps": now[1] - before[1],
                     "peak_allocated": s["allocated_bytes"]["all"]["peak"],
                     "peak_reserved": s["reserved_bytes"]["all"]["peak"],
                     "reserved": s["reserved_bytes"]["all"]["current"],
                     "recorded_maps": recorded.get((step, "segment_map"), 0),
                     "recorded_unmaps": recorded.get((step, "segment_unmap"), 0)})
        before = now
    return rows


def repeat_last_step(events: Sequence[Event], times: int) -> list[Event]:
    """One device's events with its last step run ``times`` more times: a
    longer run of a loop, from a short trace. Each copy is the last step's
    allocation-level events (alloc, free_requested, free_completed,
    empty_cache; its segment events are not copied, so a copy's
    recorded_maps/unmaps are 0) with fresh addresses (the replay's keys):
    where the last step freed a block of the step before, the copy frees
    the one the copy before allocated at the same point. ValueError when the
    trace is not such a loop: the last step frees a block of an earlier step,
    or allocates other sizes than the step before."""
    if times < 0:
        raise ValueError(f"times must be 0 or more, got {times}")
    if not events:
        raise ValueError("no events to repeat")
    last = max(e.step for e in events)
    owner: dict[int, tuple[int, int]] = {}        # live address -> (step, position of its alloc in the step)
    count: dict[int, int] = {}
    sizes: dict[int, list[int]] = {last - 1: [], last: []}
    real: dict[int, int] = {}                      # position -> address of the last step's allocation
    body: list[tuple[Event, tuple[int, int]]] = []
    kinds = ("alloc", "free_requested", "free_completed", "empty_cache")
    for e in events:
        if e.action == "alloc":
            at = (e.step, count.get(e.step, 0))
            count[e.step] = at[1] + 1
            owner[e.addr] = at
            if e.step in sizes:
                sizes[e.step].append(e.requested)
            if e.step == last:
                real[at[1]] = e.addr
        elif e.action in ("free_requested", "free_completed"):
            at = owner.get(e.addr)
        else:
            at = (last, -1)  # empty_cache: no block
        if e.step == last and e.action in kinds:
            if at is None or at[0] < last - 1:
                raise ValueError(f"the last step (step {last}) frees {e.addr:#x}, which "
                                 f"{'no event of the trace allocated' if at is None else f'step {at[0]} allocated'}: "
                                 "only a loop whose step frees what it or the step before allocated repeats")
            body.append((e, at))
        if e.action == "free_completed":
            owner.pop(e.addr, None)
    if sizes[last - 1] != sizes[last]:
        raise ValueError(f"steps {last - 1} and {last} allocate other sizes ({len(sizes[last - 1])} and "
                         f"{len(sizes[last])} allocations): not one loop's steps")
    base = 1 << 60  # above any device address: the copies' keys clash with no real one
    def addr(copy: int, step: int, position: int) -> int:
        if step == last - 1:  # the block of the copy before (the real last step for the first copy)
            copy -= 1
        return real[position] if copy == 0 else base + ((copy * (len(real) + 1) + position) << 9)
    out = list(events)
    for k in range(1, times + 1):
        for e, (step, position) in body:
            out.append(dataclasses.replace(e, step=last + k,
                                           addr=e.addr if position < 0 else addr(k, step, position)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--config", action="append", default=None,
                   help="allocator config text; repeat for several (default: expandable_segments:True)")
    p.add_argument("--json", action="store_true", help="one JSON line per config instead of the table")
    args = p.parse_args(argv)
    for config in args.config or ["expandable_segments:True"]:
        rows = per_step(args.trace, config)
        if args.json:
            print(json.dumps({"trace": args.trace, "config": config, "steps": rows}))
            continue
        print(f"== {args.trace} under {config or '(default)'}")
        live = any(r["recorded_maps"] or r["recorded_unmaps"] for r in rows)
        for r in rows:
            print(f"step {r['step']:>3}: {r['maps']:>4} mapped {r['unmaps']:>4} unmapped  reserved "
                  f"{r['reserved'] / 2**20:9.1f} MiB  peak reserved / allocated "
                  f"{r['peak_reserved'] / max(1, r['peak_allocated']):.4f}"
                  + (f"  (recorded run: {r['recorded_maps']} mapped {r['recorded_unmaps']} unmapped)"
                     if live else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
