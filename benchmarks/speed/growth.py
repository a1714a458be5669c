"""What growing costs on the GPU (issue 38): native, native with
``expandable_segments:True`` and memalloc's default, each in fresh processes
(growth happens once per process: memory the process has never had).

    python -m benchmarks growth --procs 3 --out growth.json [--cases fresh16,fresh64x256,train]

Cases (one worker process per mode, case and round; the modes' order turns
every round; first, ``--warmup`` (1) untimed processes per case of the first
mode, kept apart in the results: on a fresh machine the first process read
1.2-1.7 s per growing step where the rest read 0.67-0.77 s, its libraries
and kernels not yet in the caches). ``--out`` is rewritten after every
process, ``"complete": false`` until the last, so a run cut short by a time
limit keeps what it measured:
- ``fresh16``: one 16 GiB tensor, then the same again after freeing it;
- ``fresh64x256``: 64 tensors of 256 MiB, then the same again after freeing them;
- ``train``: a ~1B-parameter Llama-style transformers model built from its
  config (TinyLlama's shape), bf16 autocast, AdamW, batch 8, sequence
  lengths drawn per step from 256 to 2048 (the same draw in every process),
  every step's time kept. A step "grows" when its length is the longest so
  far (the same steps for every mode); the others reuse what is mapped.

Each figure is the median over processes; ratios are memalloc's median over
the other mode's, from the same run. The worker is
``python -m benchmarks growth --worker MODE CASE`` (prints one JSON object).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

MODES = ("native", "expandable", "memalloc")
CASES = ("fresh16", "fresh64x256", "train")
GiB, MiB = 1 << 30, 1 << 20
TRAIN_STEPS = 13
TRAIN_SEED = 0
DUMP = "MEMALLOC_BENCH_DUMP"


def lengths(steps: int = TRAIN_STEPS, seed: int = TRAIN_SEED) -> list[int]:
    """The train case's sequence lengths, the same in every process."""
    rng = random.Random(seed)
    return [rng.randrange(256, 2049, 64) for _ in range(steps)]


def growing_steps(ls: Sequence[int]) -> list[bool]:
    """Whether each step's length is the longest so far (the first step included)."""
    out, longest = [], 0
    for n in ls:
        out.append(n > longest)
        longest = max(longest, n)
    return out


# ---- the worker (one mode, one case, a fresh process) ------------------------
def _timed(torch, f) -> tuple[float, Any]:
    """(milliseconds f() took, synchronised on both sides; its result)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, out


def _fresh(torch, sizes: list[int]) -> dict:
    def make():
        return [torch.empty(s, dtype=torch.uint8, device="cuda") for s in sizes]

    fresh_ms, ts = _timed(torch, make)
    del ts
    again_ms, ts = _timed(torch, make)
    del ts
    return {"fresh_ms": fresh_ms, "again_ms": again_ms, "reserved": torch.cuda.memory_reserved()}


def _train(torch) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=2048,
    )
    model = LlamaForCausalLM(config).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_ms, reserved, maps = [], [], []
    for n in lengths():
        ids = torch.randint(0, config.vocab_size, (8, n), device="cuda")

        def step(ids=ids):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        ms, _ = _timed(torch, step)
        step_ms.append(ms)
        reserved.append(torch.cuda.memory_reserved())
        maps.append(torch.cuda.memory_stats().get("num_device_alloc", 0))  # device allocations so far
    return {
        "step_ms": step_ms,
        "lengths": lengths(),
        "reserved": reserved,
        "num_device_alloc": maps,
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
    }


def worker(mode: str, case: str) -> dict:
    if mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    if mode == "memalloc":
        import memalloc

        # expandable segments: memalloc's default; with MEMALLOC_BENCH_DUMP=DIR the ring keeps a
        # whole train run, whose trace is written there (replayed on the host: memalloc.replay)
        memalloc.enable(backend="cuda", config="record_history:2000000" if os.environ.get(DUMP) else None)
    torch.empty(1, device="cuda")  # the context, outside the timings
    if case == "fresh16":
        out = _fresh(torch, [16 * GiB])
    elif case == "fresh64x256":
        out = _fresh(torch, [256 * MiB] * 64)
    else:
        out = _train(torch)
    trace = os.path.join(os.environ.get(DUMP) or "", "growth-train.mtrace.gz")
    if mode == "memalloc" and case == "train" and os.environ.get(DUMP) and not os.path.exists(trace):
        memalloc.save_trace(trace)  # the first process's
    return {"mode": mode, "case": case, **out}


# ---- the orchestrator -------------------------------------------------------
def summarize(runs: Sequence[dict]) -> dict:
    """Medians per (case, mode) over processes, and memalloc's ratios to the
    other modes. Fresh cases: fresh_ms and again_ms; train: the median of
    growing steps' and other steps' times per process (then over processes),
    the whole run's time, and each step's median over processes."""
    by: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        by.setdefault((r["case"], r["mode"]), []).append(r)
    out: dict[str, Any] = {}
    for (case, mode), rs in sorted(by.items()):
        if case == "train":
            grows = growing_steps(rs[0]["lengths"])
            figures = {
                "growing_step_ms": statistics.median(
                    statistics.median(ms for ms, g in zip(r["step_ms"], grows) if g) for r in rs
                ),
                "other_step_ms": statistics.median(
                    statistics.median(ms for ms, g in zip(r["step_ms"], grows) if not g) for r in rs
                ),
                "run_ms": statistics.median(sum(r["step_ms"]) for r in rs),
                # each step's median over processes: which steps a difference lies in
                "step_ms": [statistics.median(ms) for ms in zip(*(r["step_ms"] for r in rs))],
                "peak_reserved": statistics.median(r["peak_reserved"] for r in rs),
                "peak_allocated": statistics.median(r["peak_allocated"] for r in rs),
            }
        else:
            figures = {k: statistics.median(r[k] for r in rs) for k in ("fresh_ms", "again_ms")}
        out.setdefault(case, {})[mode] = {**figures, "processes": len(rs)}
    for modes in out.values():
        if "memalloc" not in modes:
            continue
        for other in [m for m in modes if m in MODES]:
            if other == "memalloc":
                continue
            modes[f"memalloc_over_{other}"] = {
                k: modes["memalloc"][k] / modes[other][k]
                for k in modes["memalloc"]
                if k not in ("processes", "step_ms") and modes[other].get(k)
            }
    return out


def _spawn(mode: str, case: str) -> dict | None:
    """One worker process's figures (None, its error on stderr, when it failed)."""
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed.growth", "--worker", mode, case],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        print(f"{mode} {case}: exit {r.returncode}\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", nargs=2, metavar=("MODE", "CASE"))
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--procs", type=int, default=3, help="processes per mode and case")
    p.add_argument("--warmup", type=int, default=1, help="untimed processes per case first (the first mode's)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return 0
    cases, modes = args.cases.split(","), args.modes.split(",")
    bad = [c for c in cases if c not in CASES] + [m for m in modes if m not in MODES]
    if bad or args.procs < 1 or args.warmup < 0:
        p.error(f"unknown cases or modes {bad} (cases: {CASES}, modes: {MODES}), or --procs < 1, or --warmup < 0")
    command = "python -m benchmarks growth " + " ".join(argv if argv is not None else sys.argv[1:])
    warmup: list[dict] = []
    runs: list[dict] = []

    def save(complete: bool) -> dict:
        summary = summarize(runs)
        if args.out:
            with open(args.out, "w") as f:
                result = {"command": command, "complete": complete, "summary": summary, "runs": runs}
                json.dump({**result, "warmup": warmup}, f, indent=1)
        return summary

    # untimed first: the first process of a machine pays its cold caches (libraries, kernels)
    schedule = [(modes[0], case, warmup) for case in cases for _ in range(args.warmup)]
    for rnd in range(args.procs):
        turned = modes[rnd % len(modes) :] + modes[: rnd % len(modes)]  # the order turns each round
        schedule += [(mode, case, runs) for case in cases for mode in turned]
    for mode, case, into in schedule:
        r = _spawn(mode, case)
        if r is None:
            save(False)
            return 1
        into.append(r)
        save(False)
        if into is runs:
            print(json.dumps({k: v for k, v in r.items() if k not in ("step_ms", "reserved", "lengths")}), flush=True)
    print(json.dumps(save(True), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
