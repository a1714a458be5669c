"""``python -m memalloc report FILE|DIR [--html OUT]``: renders a saved report.

DIR holds a job's flight recorder files (one per rank, ``flight_recorder:DIR``),
or is the ``--out`` folder of ``memalloc run`` (its files are in DIR/flight):
they are merged into one report (memalloc/trace/flight_report.py, rendered
by memalloc/reporters/flight.py): per rank
and step the peak allocated, reserved and the breakdown, the rank whose peak
stands out with the lines that make the difference, leaks per rank; with
``--html OUT`` also a page with a per-rank memory-over-steps chart. (What
one process held when it ended: ``postmortem``; a running one: ``top``.)

FILE is a leak report (``leaks.json`` from ``memalloc run --leaks`` or
``LeakReport.to_json``): printed as text, and with ``--html OUT`` written
as the self-contained HTML page. A trace saved with ``memalloc.save_trace``
is summarised: events per action and the call sites holding the most bytes
at the end of the trace.
"""

from __future__ import annotations

import argparse
import collections
import os
import struct

from memalloc.core._format import fmt_bytes
from memalloc.reporters import flight
from memalloc.reporters.leak_report import LeakReport
from memalloc.trace import flight_report, run_page
from memalloc.trace.flight_files import FlightFileError, files_in, read
from memalloc.trace.trace_files import load_trace


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render a saved leak report or trace")
    p.add_argument(
        "file",
        help="a leak report (.json), a trace file, or a flight recorder folder (the job's report)",
    )
    p.add_argument("--html", default=None, help="also write the HTML page here (leak reports)")
    p.add_argument("--top", type=int, default=10, help="call sites to list (traces)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if os.path.isdir(args.file):
        return _job_report(args)
    if not os.path.isfile(args.file):
        raise SystemExit(f"memalloc: no such file: {args.file}")
    with open(args.file, "rb") as f:
        head = f.read(64)
    if head.lstrip().startswith(b"{"):
        try:
            report = LeakReport.from_json(args.file)
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"memalloc: {args.file} is not a leak report: {e}") from None
        print(report.to_text())
        if args.html:
            report.to_html(args.html)
            print(f"wrote {args.html}")
        return 0
    if args.html:
        raise SystemExit("memalloc: --html renders leak reports; this file is not one")
    try:
        trace = load_trace(args.file)
    except (ValueError, OSError, KeyError, struct.error) as e:
        raise SystemExit(f"memalloc: cannot read {args.file}: {e}") from None
    _summarise_trace(trace, args.top)
    return 0


def _job_report(args: argparse.Namespace) -> int:
    try:
        files = [read(p) for p in files_in(args.file)]
    except FlightFileError as e:
        raise SystemExit(f"memalloc: {e}") from None
    merged = flight_report.merge(files)
    print(flight.job_text(merged))
    if args.html:
        here = os.path.dirname(os.path.abspath(args.html))
        pages = {}  # each rank's run page, when its process wrote one (run --out DIR: DIR/rank<N>/index.html)
        for f in files:
            _, page = run_page.page_for(f.path, f.world_size, f.rank)
            if os.path.isfile(page):
                pages[f.rank] = os.path.relpath(page, here)
        for r in merged["ranks"]:
            r["page"] = pages.get(r["rank"])
        with open(args.html, "w") as out:
            out.write(flight.job_html(merged))
        print(f"wrote {args.html}")
    return 0


def _summarise_trace(trace, top: int) -> None:
    for device, events in enumerate(trace.events):
        print(f"device {device}: {len(events)} events, {trace.dropped[device]} dropped")
        for action, n in sorted(collections.Counter(e.action for e in events).items()):
            print(f"  {action:<16} {n}")
        live: dict[int, tuple] = {}
        for e in events:
            if e.action == "alloc":
                live[e.addr] = (e.size, e.stack_id)
            elif e.action == "free_requested":
                live.pop(e.addr, None)
        by_stack: collections.Counter[int] = collections.Counter()  # bytes by stack id
        for size, stack_id in live.values():
            by_stack[stack_id] += size
        if by_stack:
            print(f"  live at the end of the trace, by call site (top {top}):")
        for stack_id, nbytes in by_stack.most_common(top):
            frames = trace.stacks.get(stack_id, [])
            where = str(frames[0]) if frames else "<no stack>"
            print(f"  {fmt_bytes(nbytes):>12}  {where}")
