"""``python -m memalloc replay TRACE... [--random N] [--config TEXT ...] [--smallest-device]
[--per-step] [--repeat-last-step N] [--json PATH]``:
replays traces saved by ``memalloc.save_trace`` (and the GPU benchmark's
random workload) on the host backend under each config, and prints peak
allocated, peak reserved, their ratio and OOMs per (workload, config, device);
``--smallest-device`` also finds, per (workload, config), the smallest
simulated device that runs it without an OOM (the batch planner's search,
memalloc/features/planner.py's smallest_device_mb: what fits, from a
trace; the largest batch for a budget is ``run --fit``); ``--per-step`` prints each
step's page moves (does the loop keep mapping and unmapping under expandable
segments?); ``--repeat-last-step N`` runs each trace's last step N more times
first (memalloc/features/replay.py)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Callable

from memalloc import _C
from memalloc.features.planner import smallest_device_mb
from memalloc.features.replay import (
    RANDOM_SOURCE,
    ReplayResult,
    random_workload,
    repeat_last_step,
    replay_ops,
    replay_steps,
    replay_trace,
)
from memalloc.reporters.plan import smallest_device_text
from memalloc.reporters.replay import results_table, results_to_json, steps_table
from memalloc.trace.trace_files import Trace, load_trace


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay traces on the host backend under allocator configs",
        description="Replays traces saved by memalloc.save_trace (and the GPU benchmark's "
        "random workload) on the host backend under each config; prints peak "
        "allocated, peak reserved, their ratio and OOMs.",
    )
    p.add_argument("traces", nargs="*", metavar="TRACE", help="a trace file written by memalloc.save_trace")
    p.add_argument(
        "--random",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="also replay the GPU benchmark's random workload with N allocations (it used 50000)",
    )
    p.add_argument(
        "--config",
        action="append",
        default=None,
        metavar="TEXT",
        help="allocator config text, e.g. max_split_size_mb:64; repeat for several (default: the default config, '')",
    )
    p.add_argument(
        "--host-capacity-mb",
        type=int,
        default=None,
        metavar="MB",
        help="capacity of each simulated device (default: more than any replay can reserve)",
    )
    p.add_argument(
        "--skip-unknown-frees",
        action="store_true",
        help="skip (and count) frees of blocks allocated before the trace began",
    )
    p.add_argument(
        "--smallest-device",
        action="store_true",
        help="also find the smallest simulated device (MiB, to 8 MiB) each workload runs on "
        "without an OOM under each config (a bisection: ~10 replays each)",
    )
    p.add_argument(
        "--per-step",
        action="store_true",
        help="also replay each trace step by step (memalloc.step() numbers) and print each step's "
        "page moves and peaks, beside the recording run's own moves when the trace has them",
    )
    p.add_argument(
        "--repeat-last-step",
        type=int,
        default=0,
        metavar="N",
        help="run each trace's last step N more times first: a longer run of a loop whose steps "
        "repeat (refused for a trace whose steps differ)",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here as JSON")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if not args.traces and not args.random:
        raise SystemExit("memalloc: nothing to replay: give trace files, --random N, or both")
    if any(n < 1 for n in args.random):
        raise SystemExit("memalloc: --random N needs N >= 1 allocations")
    if args.repeat_last_step < 0:
        raise SystemExit("memalloc: --repeat-last-step N needs N >= 0")
    if (args.per_step or args.repeat_last_step) and not args.traces:
        raise SystemExit(
            "memalloc: --per-step and --repeat-last-step need trace files (a random workload has no steps)"
        )
    if args.repeat_last_step and args.smallest_device:
        raise SystemExit("memalloc: --smallest-device replays the trace files as saved: drop --repeat-last-step")
    configs = args.config if args.config is not None else [""]
    workloads: list[Callable[[str], ReplayResult]] = []
    traces = {}
    for path in args.traces:
        try:
            trace = load_trace(path)
        except (ValueError, OSError) as e:
            raise SystemExit(f"memalloc: cannot read {path}: {e}") from None
        if args.repeat_last_step:
            try:
                trace = dataclasses.replace(
                    trace, events=[repeat_last_step(events, args.repeat_last_step) for events in trace.events]
                )
            except ValueError as e:
                raise SystemExit(f"memalloc: --repeat-last-step on {path}: {e}") from None
        traces[path] = trace

        def replay_file(config: str, path: str = path, trace: Trace = trace) -> ReplayResult:
            return replay_trace(
                trace,
                config,
                host_capacity_mb=args.host_capacity_mb,
                skip_unknown_frees=args.skip_unknown_frees,
                name=path,
            )

        workloads.append(replay_file)
    for n in args.random:

        def replay_random(config: str, n: int = n) -> ReplayResult:
            return replay_ops(
                random_workload(n), config, host_capacity_mb=args.host_capacity_mb, name=f"{RANDOM_SOURCE}{n}"
            )

        workloads.append(replay_random)
    try:
        results = [replay(config) for replay in workloads for config in configs]
    except (ValueError, TypeError, _C.MemallocError) as e:
        raise SystemExit(f"memalloc: {e}") from None
    print(results_table([r.to_dict() for r in results]), end="")
    per_step: dict = {}
    if args.per_step:
        try:
            for path, trace in traces.items():
                for config in configs:
                    for device in range(len(trace.events)):
                        rows = replay_steps(
                            trace,
                            config,
                            device=device,
                            host_capacity_mb=args.host_capacity_mb,
                            skip_unknown_frees=args.skip_unknown_frees,
                        )
                        step_rows = [r.to_dict() for r in rows]
                        per_step.setdefault(path, {}).setdefault(config, {})[str(device)] = step_rows
                        print(f"\n== {path} under {config or '(default)'}, device {device}, step by step")
                        print(steps_table(step_rows), end="")
        except (ValueError, TypeError, _C.MemallocError) as e:
            raise SystemExit(f"memalloc: {e}") from None
    smallest: dict = {}
    if args.smallest_device:
        if args.host_capacity_mb is not None:
            raise SystemExit("memalloc: --smallest-device chooses the capacity itself: drop --host-capacity-mb")
        sources = [*args.traces, *(f"{RANDOM_SOURCE}{n}" for n in args.random)]
        try:
            for source in sources:
                for config in configs:
                    options = (
                        {"skip_unknown_frees": True}
                        if args.skip_unknown_frees and not source.startswith(RANDOM_SOURCE)
                        else {}
                    )
                    smallest.setdefault(source, {})[config] = smallest_device_mb(source, config, **options)
        except (ValueError, TypeError, _C.MemallocError) as e:
            raise SystemExit(f"memalloc: {e}") from None
        print("\n" + smallest_device_text(smallest))
    if args.json:
        try:
            results_to_json(
                [r.to_dict() for r in results],
                args.json,
                command=_command(args),
                smallest_device_mb=smallest,
                per_step=per_step,
            )
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
    if args.per_step:
        words.append("--per-step")
    if args.repeat_last_step:
        words += ["--repeat-last-step", str(args.repeat_last_step)]
    return shlex.join(words + ["--json", args.json])
