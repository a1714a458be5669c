"""``python -m memalloc diff A B [--html PATH] [--json] [--min-bytes N]``:
two runs compared call site by call site, which lines hold more or less at
the peak and per step, largest change first, with each line's category and
text. A and B: a ``run --out`` folder with its flight recorder file (of a
job of several ranks: ``--rank N``'s), a flight recorder folder or file, or a snapshot pickle (memalloc/trace/diff.py
says what each gives and what "the peak" and "per step" are); rendered by
memalloc/reporters/diff.py."""

from __future__ import annotations

import argparse
import json
import sys

from memalloc.reporters.diff import to_html, to_text
from memalloc.trace.diff import DiffError, diff


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="compare two runs line by line: bytes at the peak and growth per step")
    p.add_argument("a", help="run A: a `run --out` folder with flight/, a flight folder or file, or a snapshot pickle")
    p.add_argument("b", help="run B, the same kinds (the deltas are B - A)")
    p.add_argument("--device", type=int, default=None, help="the device to compare (default: the one used)")
    p.add_argument("--rank", type=int, default=None, help="in a job's folder (torchrun), the rank to compare")
    p.add_argument(
        "--min-bytes", type=int, default=0, help="leave out lines that changed by at most this (bytes; per step)"
    )
    p.add_argument("--top", type=int, default=None, help="lines to print per table (default: all)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON (schema memalloc.diff/1)")
    p.add_argument("--html", metavar="PATH", default=None, help="also write it as a self-contained HTML page")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.min_bytes < 0 or (args.top is not None and args.top < 1):
        raise SystemExit("memalloc: --min-bytes must be >= 0 and --top >= 1")
    try:
        d = diff(args.a, args.b, device=args.device, min_bytes=args.min_bytes, rank=args.rank)
    except DiffError as e:
        raise SystemExit(f"memalloc: {e}") from None
    if args.top is not None:
        counts = (len(d["peak"]), len(d["per_step"] or []))
        d["peak"] = d["peak"][: args.top]
        if d["per_step"] is not None:
            d["per_step"] = d["per_step"][: args.top]
        if max(counts) > args.top:
            d["notes"].append(f"--top {args.top}: the first of {counts[0]} lines at the peak, {counts[1]} per step")
    print(json.dumps(d, indent=1) if args.json else to_text(d))
    if args.html:
        with open(args.html, "w") as f:
            f.write(to_html(d))
        print(f"memalloc: wrote {args.html}", file=sys.stderr)
    return 0
