"""``python -m memalloc replay TRACE... [--random N] [--config TEXT ...] [--smallest-device] [--json PATH]``:
replays traces saved by ``memalloc.save_trace`` (and the GPU benchmark's
random workload) on the host backend under each config, and prints peak
allocated, peak reserved, their ratio and OOMs per (workload, config, device);
``--smallest-device`` also finds, per (workload, config), the smallest
simulated device that runs it without an OOM (memalloc/features/replay.py)."""
from __future__ import annotations

import argparse
import shlex
from typing import Callable

from memalloc import _C
from memalloc.features.replay import RANDOM_SOURCE, ReplayResult, random_workload, replay_ops, replay_trace, results_table, \
    results_to_json, smallest_capacity_mb
from memalloc.trace.trace_files import load_trace


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay traces on the host backend under allocator configs",
                       description="Replays traces saved by memalloc.save_trace (and the GPU benchmark's "
                                   "random workload) on the host backend under each config; prints peak "
                                   "allocated, peak reserved, their ratio and OOMs.")
    p.add_argument("traces", nargs="*", metavar="TRACE", help="a trace file written by memalloc.save_trace")
    p.add_argument("--random", type=int, action="append", default=[], metavar="N",
                   help="also replay the GPU benchmark's random workload with N allocations (it used 50000)")
    p.add_argument("--config", action="append", default=None, metavar="TEXT",
                   help="allocator config text, e.g. max_split_size_mb:64; repeat for several "
                        "(default: the default config, '')")
    p.add_argument("--host-capacity-mb", type=int, default=None, metavar="MB",
                   help="capacity of each simulated device (default: more than any replay can reserve)")
    p.add_argument("--skip-unknown-frees", action="store_true",
                   help="skip (and count) frees of blocks allocated before the trace began")
    p.add_argument("--smallest-device", action="store_true",
                   help="also find the smallest simulated device (MiB, to 8 MiB) each workload runs on "
                        "without an OOM under each config (a bisection: ~10 replays each)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if not args.traces and not args.random:
        raise SystemExit("memalloc: nothing to replay: give trace files, --random N, or both")
    if any(n < 1 for n in args.random):
        raise SystemExit("memalloc: --random N needs N >= 1 allocations")
    configs = args.config if args.config is not None else [""]
    workloads: list[Callable[[str], ReplayResult]] = []
    for path in args.traces:
        try:
            trace = load_trace(path)
        except (ValueError, OSError) as e:
            raise SystemExit(f"memalloc: cannot read {path}: {e}") from None
        workloads.append(lambda config, path=path, trace=trace: replay_trace(
            trace, config, host_capacity_mb=args.host_capacity_mb, skip_unknown_frees=args.skip_unknown_frees,
            name=path))
    for n in args.random:
        workloads.append(lambda config, n=n: replay_ops(
            random_workload(n), config, host_capacity_mb=args.host_capacity_mb, name=f"{RANDOM_SOURCE}{n}"))
    try:
        results = [replay(config) for replay in workloads for config in configs]
    except (ValueError, TypeError, _C.MemallocError) as e:
        raise SystemExit(f"memalloc: {e}") from None
    print(results_table(results), end="")
    smallest: dict = {}
    if args.smallest_device:
        if args.host_capacity_mb is not None:
            raise SystemExit("memalloc: --smallest-device chooses the capacity itself: drop --host-capacity-mb")
        sources = [*args.traces, *(f"{RANDOM_SOURCE}{n}" for n in args.random)]
        print("\nsmallest device without an OOM (MiB):")
        try:
            for source in sources:
                for config in configs:
                    options = {"skip_unknown_frees": True} if args.skip_unknown_frees and \
                        not source.startswith(RANDOM_SOURCE) else {}
                    mb = smallest_capacity_mb(source, config, **options)
                    smallest.setdefault(source, {})[config] = mb
                    print(f"  {source}  {config or '(default)'}  {mb}")
        except (ValueError, TypeError, _C.MemallocError) as e:
            raise SystemExit(f"memalloc: {e}") from None
    if args.json:
        try:
            results_to_json(results, args.json, command=_command(args), smallest_device_mb=smallest)
        except OSError as e:
            raise SystemExit(f"memalloc: cannot write {args.json}: {e}") from None
        print(f"wrote {args.json}")
    return 0


def _command(args: argparse.Namespace) -> str:
    """The command line that gives these results (written into the JSON)."""
    words = ["python", "-m", "memalloc", "replay", *args.traces]
    for n in args.random:
        words += ["--random", str(n)]
    for config in args.config or []:
        words += ["--config", config]
    if args.host_capacity_mb is not None:
        words += ["--host-capacity-mb", str(args.host_capacity_mb)]
    if args.skip_unknown_frees:
        words.append("--skip-unknown-frees")
    if args.smallest_device:
        words.append("--smallest-device")
    return shlex.join(words + ["--json", args.json])
