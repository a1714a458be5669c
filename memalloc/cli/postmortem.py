"""``python -m memalloc postmortem DIR [--events N]``: what the flight
recorder files in DIR (``MEMALLOC_CONF=flight_recorder:DIR``) say about the
processes that wrote them, dead or alive.

The question it answers: what held memory when a process ended (a running
one: ``top``; what a finished job left, all ranks merged: ``report``). The
files are read by memalloc/trace/flight_report.py and rendered by
memalloc/reporters/flight.py. For each file: how the process ended (a clean exit that kept its file, or
no clean exit: alive, or gone since its last heartbeat), the last step, the
call sites holding the most live memory at the end (the blocks the ring saw
allocated and not freed, named from the file's own stacks; with the last
checkpoint's figures when the ring has wrapped past older blocks), the
breakdown at the last finished step, and the last N events with their lines.
With ``--snapshot``: each file also as a memory_viz snapshot, written beside
it as ``<file>.pickle`` (pytorch.org/memory_viz opens it). With ``--html``:
each file's run page (memalloc/trace/run_page.py), the page ``run`` writes at
an end it saw: for a process killed under ``run --out DIR``, ``DIR/index.html``
(``DIR/rank<N>/`` in a job), elsewhere ``<file>.html`` beside the file.
"""

from __future__ import annotations

import argparse
import os
import pickle

from memalloc.reporters.flight import postmortem_text
from memalloc.trace import run_page
from memalloc.trace.flight_files import FlightFileError, files_in, read
from memalloc.trace.flight_report import process_view, snapshot_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("postmortem", help="what held memory when a process ended (its flight recorder file)")
    p.add_argument("dir", help="the flight_recorder directory (or the --out folder of memalloc run)")
    p.add_argument("--events", type=int, default=10, help="last events to list per device")
    p.add_argument("--top", type=int, default=5, help="call sites to list per device")
    p.add_argument("--snapshot", action="store_true", help="also write <file>.pickle for memory_viz")
    p.add_argument(
        "--html",
        action="store_true",
        help="also write each process's run page (under run --out DIR: DIR/index.html; else <file>.html)",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.events < 0 or args.top < 0:
        raise SystemExit("memalloc: --events and --top must be >= 0")
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
        print(postmortem_text(process_view(f, events=args.events, top=args.top)))
        if args.snapshot:
            with open(path + ".pickle", "wb") as out:
                pickle.dump(snapshot_of(f), out)
            print(f"memory_viz snapshot: {path}.pickle")
        if args.html:
            folder, page = run_page.page_for(path, f.world_size, f.rank)
            os.makedirs(folder, exist_ok=True)
            print(f"run page: {run_page.write(folder, f, path=page)}")
    return status
