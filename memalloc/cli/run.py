"""``python -m memalloc run script.py [args...]``: enable memalloc before the
script starts, run it as ``__main__``, print the memory totals at exit."""
from __future__ import annotations

import argparse
import os
import runpy
import sys

from .. import _install
from ._common import check_or_exit, enable_or_exit, fmt_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a Python script with memalloc enabled")
    p.add_argument("--backend", default="auto", choices=_install.BACKENDS)
    p.add_argument("--config", default=None, help="key:value,... applied after $MEMALLOC_CONF")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    check_or_exit(args.backend, args.config)
    if not os.path.isfile(args.script):
        raise SystemExit(f"memalloc: no such script: {args.script}")
    backend = enable_or_exit(args.backend, args.config)
    sys.argv = [args.script, *args.script_args]
    # As `python script.py` does: the script's folder first on sys.path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    try:
        runpy.run_path(args.script, run_name="__main__")
    finally:
        a = _install.installed_allocator()
        for d in range(a.device_count):
            s = a.stats(d)
            if s["allocation"]["all"]["allocated"] == 0:
                continue
            print(
                f"memalloc ({backend}, device {d}): peak allocated "
                f"{fmt_bytes(s['allocated_bytes']['all']['peak'])}, peak reserved "
                f"{fmt_bytes(s['reserved_bytes']['all']['peak'])}, "
                f"{s['allocation']['all']['allocated']} allocations, "
                f"{s['num_device_alloc']} device allocations, {s['num_ooms']} OOMs",
                file=sys.stderr,
            )
    return 0
