"""Step time of two allocators compared in lockstep: two worker processes
alive at once (the allocator is chosen once per process), taking turns one
step at a time, so that each pair of steps sees the same machine.

Why: on the H200 the machine's speed drifts by tens of percent between
processes and over seconds (native's bf16 step was 33 - 45 ms across the 12
processes of one run). Fresh processes in ABBA order then give per-round
ratios from 0.88 to 1.28, which cannot resolve a 2% target; two steps taken
within ~0.1 s of each other drift together.

Protocol (one line each way per step, text, over the worker's stdin and
stdout): the worker warms up, prints ``ready``; for each ``step`` line it
reads, it runs one step (synchronised) and prints its time in ms; ``stop``
ends it, after which it prints one JSON object as its last line. Only one
worker runs at a time (the other waits on its stdin), so the two never
share the GPU or the CPU cores.

    pairs = lockstep({"native": argv_a, "memalloc_flight": argv_b}, steps=200, env=env)
    # pairs["ratio"]: median over step pairs of b's time / a's time

The order within a pair alternates (a b, b a, ...) so neither side always
runs right after the other's step.

Processes still differ from one another (native against native under two
names, ``native_control``, gave 1.076 over 4 pairs one after another on the
H200), so a ratio needs many processes per mode, and each fresh pair costs
a start-up (~20 s with CUDA and a model). ``crowd`` starts several pairs
at once and steps every process once per round, a0 b0 a1 b1 ... and the
reverse in the next round; ``pooled`` runs as many crowds as it takes.

Workers: ``python -m benchmarks worker NAME GROUP_lockstep`` (CUDA), or
on any machine ``python -m benchmarks lockstep --work N`` (a CPU step of N
units, for testing this driver).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

READY, STEP, STOP = "ready", "step", "stop"


def serve(
    step: Callable[[], None],
    warmup: int = 3,
    sync: Callable[[], None] = lambda: None,
    out=None,
    inp=None,
    ready: Callable[[], None] = lambda: None,
    after: Callable[[], None] = lambda: None,
) -> int:
    """The worker's side: ``warmup`` steps, ``ready()``, then one timed step
    (ms, between two ``sync()`` calls) per ``step`` line on ``inp`` until
    ``stop``, each followed by ``after()`` once its time is out (untimed).
    Returns the number of timed steps."""
    out = out or sys.stdout
    inp = inp or sys.stdin
    for _ in range(warmup):
        step()
    sync()
    ready()
    print(READY, file=out, flush=True)
    n = 0
    for line in inp:
        command = line.strip()
        if command == STOP:
            break
        if command != STEP:
            raise SystemExit(f"lockstep worker: unknown command {command!r} (expected {STEP!r} or {STOP!r})")
        t0 = time.perf_counter()
        step()
        sync()
        print(f"{(time.perf_counter() - t0) * 1e3:.6f}", file=out, flush=True)
        after()
        n += 1
    return n


class _Worker:
    def __init__(self, label: str, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None):
        self.label = label
        self.err = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty worker never blocks on it
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            env=dict(env) if env else None,
            cwd=cwd,
        )

    def stderr_tail(self) -> str:
        self.err.seek(0)
        return self.err.read()[-3000:]

    def line(self) -> str:
        got = self.proc.stdout.readline()
        if not got:
            raise RuntimeError(
                f"lockstep: worker {self.label} ended early (exit {self.proc.wait()}):\n{self.stderr_tail()}"
            )
        return got.strip()

    def step(self) -> float:
        self.proc.stdin.write(STEP + "\n")
        self.proc.stdin.flush()
        return float(self.line())

    def stop(self) -> dict:
        self.proc.stdin.write(STOP + "\n")
        self.proc.stdin.flush()
        out, _ = self.proc.communicate(timeout=120)
        if self.proc.returncode != 0:
            raise RuntimeError(
                f"lockstep: worker {self.label} failed (exit {self.proc.returncode}):\n{self.stderr_tail()}"
            )
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if lines else {}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def lockstep(
    workers: Mapping[str, Sequence[str]], steps: int, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> dict:
    """Runs the two ``workers`` ({label: argv}; the first is the baseline)
    in lockstep for ``steps`` pairs of steps. Returns ``ratio`` (the median
    over pairs of the second's ms / the first's), ``ratios`` (every pair's),
    ``ms`` ({label: every step's ms}), ``median_ms`` ({label: median}) and
    ``results`` ({label: the worker's final JSON object})."""
    return crowd(workers, steps, alive=1, env=env, cwd=cwd)[0]


def crowd(
    workers: Mapping[str, Sequence[str]],
    steps: int,
    alive: int = 1,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> list:
    """``alive`` pairs of the two ``workers`` ({label: argv}; the first is
    the baseline) alive at once, started and warmed up together, then
    ``steps`` rounds in which every process takes one step, one process at a
    time: a0 b0 a1 b1 ... in even rounds, the reverse in odd ones (ABBA), so
    each pair's two steps of a round sit side by side in time. Starting the
    processes together costs one start-up for them all, where fresh pairs
    one after another cost one each. Returns, per pair, what
    :func:`lockstep` returns for its two processes. Idle processes keep
    their device memory: ``alive`` times the pair's memory must fit."""
    if len(workers) != 2:
        raise ValueError(f"lockstep compares exactly two workers, got {len(workers)}: {list(workers)}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if alive < 1:
        raise ValueError(f"alive (pairs of processes at once) must be at least 1, got {alive}")
    (la, argv_a), (lb, argv_b) = workers.items()
    started = []
    try:
        for _ in range(alive):
            for label, argv in ((la, argv_a), (lb, argv_b)):
                started.append(_Worker(label, argv, env, cwd))
        for w in started:  # all warm up at once (not timed)
            got = w.line()
            if got != READY:
                raise RuntimeError(f"lockstep: worker {w.label} said {got!r} before {READY!r}")
        ms = [{la: [], lb: []} for _ in range(alive)]
        order = list(range(len(started)))
        for i in range(steps):
            for k in order if i % 2 == 0 else reversed(order):
                ms[k // 2][started[k].label].append(started[k].step())
        results = [{w.label: w.stop() for w in started[2 * j : 2 * j + 2]} for j in range(alive)]
    finally:
        for w in started:
            w.kill()
    pairs = []
    for j in range(alive):
        ratios = [y / x for x, y in zip(ms[j][la], ms[j][lb])]
        pairs.append(
            {
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "ms": ms[j],
                "median_ms": {k: statistics.median(v) for k, v in ms[j].items()},
                "results": results[j],
                "steps": steps,
                "order": "alternating (a b, b a, ...)"
                if alive == 1
                else f"{alive} pairs alive at once, a0 b0 a1 b1 ... then reversed, round by round",
            }
        )
    return pairs


def pooled(
    workers: Mapping[str, Sequence[str]],
    process_pairs: int,
    steps: int,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    alive: int = 1,
) -> dict:
    """``process_pairs`` pairs of fresh workers, ``steps`` pairs of steps
    each, ``alive`` pairs at once (:func:`crowd`; 1: :func:`lockstep`, one
    pair after another). Returns ``median_ratio`` (over every pair of steps
    of them all), ``per_process_pair`` (each pair's own median),
    ``median_ms`` (each pair's per worker), ``process_pairs``,
    ``step_pairs`` (in all) and ``runs`` (every pair's lockstep result)."""
    runs = []
    while len(runs) < process_pairs:
        runs += crowd(workers, steps, alive=min(alive, process_pairs - len(runs)), env=env, cwd=cwd)
    ratios = [x for r in runs for x in r["ratios"]]
    return {
        "median_ratio": statistics.median(ratios),
        "per_process_pair": [r["ratio"] for r in runs],
        "median_ms": [r["median_ms"] for r in runs],
        "process_pairs": process_pairs,
        "step_pairs": len(ratios),
        "alive": alive,
        "runs": runs,
    }


def _cpu_work(units: int) -> None:
    x = 0
    for i in range(units * 10_000):
        x += i * i
    return None


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="a lockstep worker whose step is CPU work (to test the driver)")
    p.add_argument("--work", type=int, required=True, help="units of CPU work per step (10,000 multiply-adds each)")
    args = p.parse_args(argv)
    n = serve(lambda: _cpu_work(args.work), warmup=1)
    print(json.dumps({"steps": n, "pid": os.getpid()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
