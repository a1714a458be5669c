"""Command line: ``python -m memalloc {demo,run,report,replay,info,postmortem,top}`` (one module per
command under memalloc/cli/)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from memalloc.cli import demo, info, postmortem, replay, report, run, top


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memalloc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (demo, run, report, replay, info, postmortem, top):
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
