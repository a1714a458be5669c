"""Command line: ``python -m memalloc {demo,run,report,diff,replay,info,postmortem,top}`` (one module per
command under memalloc/cli/)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from memalloc.cli import demo, diff, info, postmortem, replay, report, run, top

DESCRIPTION = (
    "memalloc: PyTorch's CUDA caching allocator with full accounting. "
    "`demo` shows it on a small model (no GPU needed), `run SCRIPT` runs a training script under it "
    "(leaks, memory per step, advice, the largest batch that fits), `report`, `postmortem` and `top` "
    "read what a run left (reports, flight recorder files), `diff` compares two runs line by line, "
    "`replay` replays traces on the CPU, "
    "`info` shows the backend and settings it would use."
)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every command's parser under one."""
    parser = argparse.ArgumentParser(prog="python -m memalloc", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (demo, run, report, diff, replay, info, postmortem, top):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
