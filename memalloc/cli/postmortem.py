"""``python -m memalloc postmortem DIR [--events N]``: what the flight
recorder files in DIR (``MEMALLOC_CONF=flight_recorder:DIR``) say about the
processes that wrote them, dead or alive.

For each file: how the process ended (a clean exit that kept its file, or
no clean exit: alive, or gone since its last heartbeat), the last step, the
call sites holding the most live memory at the end (the blocks the ring saw
allocated and not freed, named from the file's own stacks; with the last
checkpoint's figures when the ring has wrapped past older blocks), the
breakdown at the last finished step, and the last N events with their lines.
With ``--snapshot``: each file also as a memory_viz snapshot, written beside
it as ``<file>.pickle`` (pytorch.org/memory_viz opens it).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import pickle
import time

from memalloc.core._format import describe_split, fmt_bytes
from memalloc.trace.flight_files import FlightFile, FlightFileError, files_in, live_at_end, read
from memalloc.trace.flight_report import snapshot_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("postmortem", help="read the flight recorder files of a (dead) job")
    p.add_argument("dir", help="the flight_recorder directory")
    p.add_argument("--events", type=int, default=10, help="last events to list per device")
    p.add_argument("--top", type=int, default=5, help="call sites to list per device")
    p.add_argument("--snapshot", action="store_true", help="also write <file>.pickle for memory_viz")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        paths = files_in(args.dir)
    except FlightFileError as e:
        raise SystemExit(f"memalloc: {e}") from None
    status = 0
    for path in paths:
        try:
            f = read(path)
        except FlightFileError as e:
            print(f"memalloc: {e}")
            status = 1
            continue
        print(describe(f, events=args.events, top=args.top))
        if args.snapshot:
            with open(path + ".pickle", "wb") as out:
                pickle.dump(snapshot_of(f), out)
            print(f"memory_viz snapshot: {path}.pickle")
    return status


def how_it_ended(f: FlightFile, now_ns: int | None = None) -> str:
    """ "exited cleanly", "running" (its pid is alive on this host) or "no
    clean exit: killed or crashed, last heartbeat <when>"."""
    if f.state == "exited":
        return "exited cleanly (file kept)"
    if f.state == "raised":
        return f"exited on an uncaught exception at step {f.step}"
    if f.host == os.uname().nodename and _alive(f.pid):
        return f"running (pid {f.pid} is alive)"
    when = f"{((now_ns or _now_ns()) - f.heartbeat_ns) / 1e9:.0f} s ago, at step {f.step}" if f.heartbeat_ns else "none"
    return f"no clean exit (killed, crashed or aborted); last heartbeat {when}"


def live_sites(f: FlightFile, device: int) -> list[tuple[tuple, int, int]]:
    """((file, line, function), bytes, blocks) of the blocks the ring saw
    allocated and not freed, by innermost user frame, most bytes first."""
    sites: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0])
    for e in live_at_end(f.rings[device]).values():
        key = f.site(e.stack_id)
        sites[key][0] += e.size
        sites[key][1] += 1
    return sorted(((k, v[0], v[1]) for k, v in sites.items()), key=lambda s: -s[1])


def describe(f: FlightFile, events: int = 10, top: int = 5) -> str:
    started = datetime.datetime.fromtimestamp(f.start_ns / 1e9, datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [
        f"== {f.path}",
        f"pid {f.pid} on {f.host}, rank {f.rank} of {f.world_size}, {f.backend} backend, started {started}",
        f"how it ended: {how_it_ended(f)}",
        f"last step: {f.step}",
    ]
    cp = f.checkpoint or {}
    for d, ring in enumerate(f.rings):
        lines.append(
            f"device {d}: {len(ring)} events in the file"
            + (f", {f.torn[d]} torn (being written at the end)" if f.torn[d] else "")
            + (
                f", the ring wrapped ({f.sequences[d][0] - 1} older ones overwritten)"
                if f.sequences[d] and f.sequences[d][0] > 1
                else ""
            )
        )
        dev = next((x for x in cp.get("devices", []) if x["device"] == d), None)
        if dev:
            lines.append(
                f"  at step {cp['step']}'s checkpoint: {fmt_bytes(dev['allocated'])} allocated, "
                f"{fmt_bytes(dev['reserved'])} reserved, peak {fmt_bytes(dev['peak_allocated'])}"
            )
            split = (dev.get("breakdown") or {}).get("split")
            if split:
                lines.append("  breakdown at the last finished step: " + describe_split(split))
        sites = live_sites(f, d)
        if sites:
            lines.append("  live memory at the end by line (blocks the ring saw allocated and not freed):")
            for (file, line, func), nbytes, blocks in sites[:top]:
                lines.append(f"    {fmt_bytes(nbytes):>10} in {blocks} blocks  {file}:{line} in {func}")
        if ring and events:
            lines.append(f"  last {min(events, len(ring))} events:")
            for e in ring[-events:]:
                user = f.user_frame(e.stack_id)
                where = f"  {user[0]}:{user[1]} in {user[2]}" if user else ""
                lines.append(f"    step {e.step:>5} {e.action:<15} {fmt_bytes(e.size):>10}{where}")
    return "\n".join(lines)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _now_ns() -> int:
    return time.time_ns()
