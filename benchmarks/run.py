"""Benchmark entry point: ``python -m benchmarks.run --suite gpu|cpu [options]``.

Each suite measures memalloc side by side with its peers in one run and
writes a JSON file under benchmarks/results/ (date, machine, torch version,
the exact command). The GPU suite is benchmarks/gpu_suite.py; the CPU suite
(the C++ core on the host backend, no GPU) is benchmarks/cpu_suite.py.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", add_help=False)
    parser.add_argument("--suite", choices=("gpu", "cpu"), required=True)
    args, rest = parser.parse_known_args(argv)
    if args.suite == "gpu":
        from . import gpu_suite as suite
    else:
        from . import cpu_suite as suite
    return int(suite.main(rest, command="python -m benchmarks.run " + " ".join(argv)) or 0)


if __name__ == "__main__":
    sys.exit(main())
