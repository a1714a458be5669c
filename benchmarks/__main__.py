"""The one entry point of memalloc's benchmarks: ``python -m benchmarks NAME [options]``.

``python -m benchmarks --help`` lists every benchmark, grouped by what it
measures; ``python -m benchmarks NAME --help`` gives one's options. The
folders are the groups: speed/ (time: pair costs, step times, growth, driver
calls), fit/ (memory: what fits, the planner against a search, the guide's
strategies), compat/ (torch's own allocator tests under memalloc), cpu/ (the
C++ core on the host backend, CI's instruction gate), traces/ (recorded
training loops for replay), report/ (results rendered) and device/ (the
scripts a GPU machine runs in one call each, and the collector of their
results). results/ holds dated records of runs, baselines/ the figures the
gates compare with.

A benchmark that runs fresh processes starts them as ``python -m
benchmarks.<folder>.<module>`` (the workers): every module here also runs on
its own that way.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name: (module under benchmarks/, one line); grouped as --help lists them.
GROUPS: dict[str, dict[str, tuple[str, str]]] = {
    "speed (time)": {
        "gpu": ("speed.suite", "GPU suite: pair costs and step times, memalloc beside native, cudaMallocAsync, RMM"),
        "worker": ("speed.worker", "one allocator, one group of the GPU suite, in this process (its worker)"),
        "lockstep": ("speed.lockstep", "a CPU-step lockstep worker, to test the driver that compares step times"),
        "growth": ("speed.growth", "what growing costs on the GPU: native, expandable segments, memalloc"),
        "driver-costs": ("speed.driver_costs", "each CUDA virtual-memory driver call's cost, per handle (GPU)"),
        "pool-calls": ("speed.pool_calls", "the private-pool calls of CUDA graph trees, timed on the host backend"),
    },
    "fit (memory)": {
        "fit": ("fit.largest_batch", "the largest batch that trains under a fixed budget, per allocator (GPU)"),
        "fit-diff": ("fit.diff", "where two allocators' snapshots of one workload part"),
        "fit-replay": ("fit.replay_gpu", "one recorded request stream replayed on the GPU under one allocator"),
        "plan-vs-search": ("fit.plan_vs_search", "memalloc.largest_batch against a search with real OOMs"),
        "planner-corpus": ("fit.planner_corpus", "the planner's corpus: plans checked against real searches"),
        "free-order": ("fit.free_order", "why two runs of one autocast script free tensors in another order"),
        "strategies": ("fit.strategies", "the guide's memory-reducing strategies (examples/), measured"),
    },
    "compat (torch's tests)": {
        "conformance": ("compat.conformance", "torch's own allocator tests, natively and under memalloc"),
        "matrix": ("compat.matrix", "memalloc built and its fast tier run per torch release, 2.11 to 2.15 (no GPU)"),
        "interface": ("compat.interface", "torch's CUDA allocator interface against memalloc's subclass"),
    },
    "cpu (the C++ core, no GPU)": {
        "cpu": ("cpu.suite", "the core on the host backend: ns and instructions per op; --check is CI's gate"),
    },
    "traces, results": {
        "record-traces": ("traces.record", "records real training loops' allocator events for replay"),
        "report": ("report.tables", "renders results files' tables as one Markdown section"),
        "screenshot": ("report.screenshot", "renders a leak report to HTML and screenshots it (Chromium)"),
        "collect": ("device.collect", "joins a device run's junit files and figures into one results file"),
    },
}
COMMANDS = {name: entry for group in GROUPS.values() for name, entry in group.items()}


def listing() -> str:
    lines = []
    for group, commands in GROUPS.items():
        lines.append(f"{group}:")
        lines += [f"  {name:16}{line}" for name, (_, line) in commands.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="memalloc's benchmarks, one entry point: python -m benchmarks NAME [options]",
        epilog=listing() + "\n\nDevice scripts (one GPU call each): benchmarks/device/*.sh, usage at their top.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", choices=COMMANDS, metavar="NAME", help="the benchmark (below)")
    parser.add_argument("options", nargs="*", help="its options: python -m benchmarks NAME --help")
    if not argv or argv[0].startswith("-"):
        parser.parse_args(argv or ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    parser.parse_args([name])  # an unknown name: the choices and exit 2
    module = importlib.import_module(f"{__package__ or 'benchmarks'}.{COMMANDS[name][0]}")
    prog = f"python -m benchmarks {name}"
    sys.argv = [prog, *rest]  # each module's argparse names itself by argv[0]
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
