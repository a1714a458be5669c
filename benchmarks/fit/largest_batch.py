"""Fit more: the largest batch that trains under a fixed memory budget, per
allocator, side by side in one run (issue 14).

    python -m benchmarks fit --out DIR/fit-more.json [--steps 50] [--parallel 3]

The workload: a 6-layer, 512-wide pre-norm transformer encoder with a
classification head (a fine-tune), bf16 autocast, AdamW; step i trains one
batch of B sequences of length L_i, the lengths long-tailed between 64 and
4096 tokens (most short, a few long; seed 0, the same list for every trial).
A trial (one fresh process: the allocator is chosen once per process) sets
``torch.cuda.set_per_process_memory_fraction(F)`` before anything is
allocated and trains ``--steps`` steps at batch B; it fits when no step runs
out of memory.

The budget F is calibrated once per run, before the search: native trains
batches 4 and 8 without a limit; their peak allocated bytes give the fixed
bytes (parameters, optimizer state) and the bytes per sample, and F is set so
that the ideal batch, the **limit** (budget − fixed) / per sample, is about
``--target-limit`` (default 40). The limit is what a perfect allocator would
fit: peak allocated bytes equal to the budget.

Allocators: ``native``, ``expandable`` (PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True), ``cudaMallocAsync``, ``memalloc`` (its default
config: expandable segments), ``memalloc_plain`` (MEMALLOC_CONF=
expandable_segments:False, native's policy), ``memalloc_expandable``
(MEMALLOC_CONF=expandable_segments:True, the default said explicitly),
``memalloc_expandable_noreuse`` (the same with reuse_free_pages:False).
Each allocator's largest batch is found by bisection between a batch that
fits and one that does not, starting near 0.85 x the limit; ``--parallel``
trials share the GPU at a time (each is capped by its own fraction, so the
results do not depend on it as long as parallel x budget fits the device).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ..speed.suite import machine
from ..speed.worker import ENV

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODES = (
    "native",
    "expandable",
    "cudaMallocAsync",
    "memalloc",
    "memalloc_plain",
    "memalloc_expandable",
    "memalloc_expandable_noreuse",
)
MIN_LEN, MAX_LEN = 64, 4096
LOG_PATH = os.environ.get("FIT_MORE_LOG")  # every trial's JSON, appended as it ends


def lengths(steps: int, seed: int = 0, max_len: int = MAX_LEN) -> list[int]:
    """Long-tailed sequence lengths in [64, max_len], multiples of 8: 64 x 2^X
    with X exponential (rate 0.6): median ~140 tokens, ~3% at 4096."""
    rng = random.Random(seed)
    return [max(MIN_LEN, min(max_len, int(MIN_LEN * 2 ** rng.expovariate(0.6)))) // 8 * 8 for _ in range(steps)]


# ---- the model ------------------------------------------------------------------------
VOCAB, CLASSES = 8192, 16


def model_step(
    device: str = "cuda",
    width: int = 512,
    layers: int = 6,
    vocab: int = VOCAB,
    classes: int = CLASSES,
    bf16: bool = True,
):
    """The workload's model (seed 0) and its optimizer; returns
    ``train(tokens, labels)``, one AdamW step on a batch (bf16 autocast on
    CUDA when ``bf16``). benchmarks/fit/plan_vs_search.py builds it too."""
    import contextlib

    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(width, 8, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.ModuleDict(
        {
            "embed": nn.Embedding(vocab, width),
            "body": nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
            "head": nn.Linear(width, classes),
        }
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train(tokens, labels) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            h = model["body"](model["embed"](tokens))
            loss = nn.functional.cross_entropy(model["head"](h.mean(dim=1)).float(), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return train


# ---- one trial (a fresh process) ---------------------------------------------------
def trial(
    mode: str, batch: int, steps: int, fraction: float, max_len: int = MAX_LEN, history: str | None = None
) -> dict:
    """Trains `steps` steps at `batch` under `fraction` (0 = no limit). With
    `history`, torch's allocator history is on (no stacks) and its snapshot
    is written there at the end, OOM or not (torch's format under both
    allocators: a native and a memalloc run can be compared event by event,
    benchmarks/fit/diff.py)."""
    if mode.startswith("memalloc"):
        sys.path.insert(0, REPO)
        import memalloc

        memalloc.enable(backend="cuda")
    import torch

    if fraction > 0:
        torch.cuda.set_per_process_memory_fraction(fraction)
    if history:
        torch.cuda.memory._record_memory_history(context=None, stacks="python", max_entries=2_000_000)
    train = model_step()
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = {"mode": mode, "batch": batch, "steps": steps, "fraction": fraction, "ok": True, "steps_done": 0}
    times = []
    try:
        for i, n in enumerate(lengths(steps, max_len=max_len)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            tokens = torch.randint(0, VOCAB, (batch, n), device="cuda", generator=gen)
            labels = torch.randint(0, CLASSES, (batch,), device="cuda", generator=gen)
            train(tokens, labels)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            out["steps_done"] = i + 1
    except torch.OutOfMemoryError as e:
        out.update(ok=False, error=str(e).splitlines()[0][:300])
    if history:
        torch.cuda.memory._dump_snapshot(history)
    out["peak_allocated"] = torch.cuda.max_memory_allocated()
    out["peak_reserved"] = torch.cuda.max_memory_reserved()
    out["total_bytes"] = torch.cuda.mem_get_info()[1]
    out["step_ms_median"] = sorted(times)[len(times) // 2] if times else None
    return out


def run_trial(mode: str, batch: int, steps: int, fraction: float, max_len: int = MAX_LEN, timeout: int = 300) -> dict:
    """One trial in a fresh process (the allocator's environment set)."""
    env = dict(os.environ)
    for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "MEMALLOC_CONF"):
        env.pop(k, None)
    env.update(ENV.get(mode, {}))
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.fit.largest_batch",
        "--worker",
        mode,
        str(batch),
        "--steps",
        str(steps),
        "--fraction",
        repr(fraction),
        "--max-len",
        str(max_len),
    ]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "batch": batch, "ok": False, "error": f"timeout after {timeout} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {
            "mode": mode,
            "batch": batch,
            "ok": False,
            "crashed": True,
            "returncode": proc.returncode,
            "error": proc.stderr[-1500:],
        }


# ---- the search -------------------------------------------------------------------
def largest_batch(mode: str, start: int, steps: int, fraction: float, log: list, max_len: int = MAX_LEN) -> dict:
    """Bisection: `lo` fits, `hi` does not."""
    lo, hi = 0, None
    b = max(1, start)
    tried = {}
    while True:
        r = run_trial(mode, b, steps, fraction, max_len)
        tried[b] = r
        log.append(r)
        if LOG_PATH:
            with open(LOG_PATH, "a") as f:
                f.write(json.dumps(r) + "\n")
        print(
            f"  {mode:28s} batch {b:4d}: {'fits' if r['ok'] else 'OOM at step ' + str(r.get('steps_done'))}"
            f"{'  (' + str(r.get('error'))[:200] + ')' if r.get('crashed') else ''}",
            flush=True,
        )
        if r.get("crashed"):
            break
        if r["ok"]:
            lo = b
        else:
            hi = b
        if hi is None:
            b = lo + max(1, lo // 4)  # grow until one fails
        elif lo == 0:
            b = hi * 3 // 4  # shrink until one fits
            if b < 1:
                break
        elif hi - lo <= 1:
            break
        else:
            b = (lo + hi) // 2
    best = tried.get(lo, {})
    return {
        "mode": mode,
        "largest_batch": lo,
        "smallest_failing": hi,
        "trials": len(tried),
        "peak_allocated": best.get("peak_allocated"),
        "peak_reserved": best.get("peak_reserved"),
        "step_ms_median": best.get("step_ms_median"),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", nargs=2, metavar=("MODE", "BATCH"), help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--max-len", type=int, default=MAX_LEN, help="longest sequence (tokens)")
    p.add_argument("--fraction", type=float, default=None, help="budget; default: calibrated")
    p.add_argument("--target-limit", type=int, default=40, help="the calibrated budget's ideal batch")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--parallel", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--history", default=None, help="worker: torch's allocator snapshot, with its trace, here")
    args = p.parse_args(argv)
    if args.worker:
        print(
            json.dumps(
                trial(args.worker[0], int(args.worker[1]), args.steps, args.fraction or 0.0, args.max_len, args.history)
            )
        )
        return 0

    t_start = time.time()
    command = "python -m benchmarks fit " + " ".join(argv if argv is not None else sys.argv[1:])
    lens = lengths(args.steps, max_len=args.max_len)
    print(
        f"lengths: max {max(lens)}, median {sorted(lens)[len(lens) // 2]}, "
        f"{sum(n == args.max_len for n in lens)} of {len(lens)} at {args.max_len}",
        flush=True,
    )
    with ThreadPoolExecutor(2) as pool:
        cal = list(pool.map(lambda b: run_trial("native", b, args.steps, 0.0, args.max_len), (4, 8)))
    for r in cal:
        if not r.get("ok"):
            print(json.dumps(cal, indent=1))
            return 1
    per_sample = (cal[1]["peak_allocated"] - cal[0]["peak_allocated"]) / 4
    fixed = cal[0]["peak_allocated"] - 4 * per_sample
    total = cal[0]["total_bytes"]
    fraction = args.fraction or round((fixed + args.target_limit * per_sample) / total, 4)
    budget = fraction * total
    limit = (budget - fixed) / per_sample
    print(
        f"per sample {per_sample / 2**20:.1f} MiB, fixed {fixed / 2**20:.1f} MiB, fraction {fraction} "
        f"= {budget / 2**30:.2f} GiB, limit {limit:.1f}",
        flush=True,
    )

    modes = [m for m in args.modes.split(",") if m]
    log: list = []
    start = int(limit * 0.85)
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda m: largest_batch(m, start, args.steps, fraction, log, args.max_len), modes))
    by_mode = {r["mode"]: r for r in results}
    native = by_mode.get("native", {}).get("largest_batch") or None
    for r in results:
        r["x_native"] = r["largest_batch"] / native if native else None
        r["of_limit"] = r["largest_batch"] / limit
    out = {
        "machine": machine(),
        "command": command,
        "workload": {
            "model": "6-layer 512-wide pre-norm encoder + classifier, bf16 autocast, AdamW",
            "steps": args.steps,
            "max_len": args.max_len,
            "lengths": lens,
        },
        "calibration": cal,
        "per_sample_bytes": per_sample,
        "fixed_bytes": fixed,
        "fraction": fraction,
        "budget_bytes": budget,
        "limit": limit,
        "results": results,
        "trials": log,
        "wall_s": time.time() - t_start,
    }
    print("\n| allocator | largest batch | x native | of the limit | peak reserved at it (GiB) |")
    print("|---|---|---|---|---|")
    for r in results:
        pr = r["peak_reserved"]
        print(
            f"| {r['mode']} | {r['largest_batch']} | {r['x_native']:.2f}x | {r['of_limit']:.3f} | "
            f"{pr / 2**30 if pr else float('nan'):.2f} |"
            if r["x_native"]
            else f"| {r['mode']} | {r['largest_batch']} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
