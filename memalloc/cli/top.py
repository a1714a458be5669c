"""``python -m memalloc top [PID|DIR] [--once] [--interval S]``: a live view
of running memalloc processes, from outside them, with no change to their
code: each process whose flight recorder is on (``python -m memalloc run``,
or ``MEMALLOC_CONF=flight_recorder:DIR``) maps its file, and this view reads
it (memalloc/trace/flight_report.py reads, memalloc/reporters/flight.py
renders).

Which processes: a PID (its file is found in /proc/PID/maps), a DIR (every
file there: one job's ranks), or, with neither, every process on this
machine that maps a flight recorder file. Per process: pid, rank, step and
the age of its last heartbeat, allocated / reserved / peak bytes per device
and the breakdown at the last checkpoint (each step), the top call sites of
live memory, the last OOM the ring holds; a process that has ended gets one line naming
``postmortem`` (what it held when it ended). ``--once`` prints one plain-text
frame (for scripts and tests); otherwise the view refreshes every
``--interval`` seconds until Ctrl-C (through ``rich`` when it is installed,
else by redrawing the terminal).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

from memalloc.reporters.flight import top_lines
from memalloc.trace.flight_files import SUFFIX, FlightFileError, files_in, read
from memalloc.trace.flight_report import process_view


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="a live view of running memalloc processes (their flight recorder files)")
    p.add_argument("target", nargs="?", default=None, help="a PID or a flight recorder DIR (default: every one)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    p.add_argument("--top", type=int, default=3, help="call sites per device")
    p.set_defaults(func=main)


def mapped_files(pid: int | None = None) -> list[str]:
    """The flight recorder files mapped by ``pid`` (every process when None),
    from /proc/<pid>/maps."""
    maps = [f"/proc/{pid}/maps"] if pid is not None else glob.glob("/proc/[0-9]*/maps")
    found: set[str] = set()
    for path in maps:
        try:
            with open(path) as f:
                for line in f:
                    name = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                    if name.endswith(SUFFIX) and os.path.basename(name).startswith("memalloc-"):
                        found.add(name)
        except OSError:  # gone, or not ours to read
            continue
    return sorted(found)


def sources(target: str | None) -> list[str]:
    if target is None:
        return mapped_files()
    if target.isdigit():
        if not os.path.exists(f"/proc/{target}"):
            raise FlightFileError(f"no process {target} on this machine")
        files = mapped_files(int(target))
        if not files:
            raise FlightFileError(
                f"process {target} maps no flight recorder file: run it with `python -m memalloc "
                f"run` or MEMALLOC_CONF=flight_recorder:DIR"
            )
        return files
    return files_in(target)


def frame(files: list[str], top: int = 3, now_ns: int | None = None) -> str:
    """One frame of the view, plain text."""
    now_ns = now_ns or time.time_ns()
    lines = [f"memalloc top: {len(files)} process(es)"]
    for path in files:
        try:
            f = read(path)
        except FlightFileError as e:
            lines.append(f"  {e}")
            continue
        lines.extend(top_lines(process_view(f, events=0, top=0, now_ns=now_ns), top))
    if not files:
        lines.append("  no running memalloc process has its flight recorder on (python -m memalloc run turns it on)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise SystemExit("memalloc: --interval must be > 0 seconds")
    try:
        files = sources(args.target)
    except FlightFileError as e:
        raise SystemExit(f"memalloc: {e}") from None
    if args.once:
        print(frame(files, args.top))
        return 0

    def render() -> str:  # a machine-wide view finds the processes again at each refresh
        return frame(sources(None) if args.target is None else files, args.top)

    try:
        try:
            from rich.live import Live
            from rich.text import Text
        except ImportError:
            pass  # without rich: the plain refresh below
        else:
            with Live(Text(frame(files, args.top)), refresh_per_second=4) as live:
                while True:
                    time.sleep(args.interval)  # the refresh period of a display, not synchronisation
                    live.update(Text(render()))
        while True:
            sys.stdout.write("\x1b[H\x1b[2J" + render() + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)  # the refresh period of a display, not synchronisation
    except KeyboardInterrupt:
        return 0
