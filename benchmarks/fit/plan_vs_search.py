"""The batch planner against the search it replaces (issue 25): for a model
and a memory budget, the largest batch found by trial with real OOMs (each
trial a fresh process under memalloc: build the model, train ``--steps``
steps at the batch; doubling, then bisection) and the batch
``memalloc.largest_batch`` predicts (one fresh process: build the model,
plan), with the wall time of each, process starts included.

    python -m benchmarks plan-vs-search --model fit --budget-mb 7168 --out X.json
    python -m benchmarks plan-vs-search --backend host --model gpt2 --budget-mb 128   (CPU, tiny)

Models (``tiny`` on the host backend, where the CPU runs them):
  fit     the fit benchmark's transformer (benchmarks/fit/largest_batch.py: 6 layers,
          512 wide, bf16 autocast, AdamW, long-tailed lengths 64..4096; the
          trial trains its lengths, the planner's step runs the longest, as
          the planner's docs ask for variable shapes, or with --plan-steps
          the job's steps in order; tiny: 2 layers, 64 wide, 8 lengths
          64..256)
  transformer  the same transformer at one length, 1024 tokens (tiny: 2
          layers, 128 wide, 64 tokens)
  resnet  torchvision ResNet-50, 224x224, SGD with momentum, fp32 (CUDA only;
          on the host a 3-block CNN with batch norm)
  gpt2    transformers GPT-2 from a config (12 layers, 768 wide, 512 tokens,
          bf16 autocast, AdamW; tiny: 2 layers, 64 wide, 64 tokens)
The budget (MiB) is the memory fraction on CUDA (budget / the device's
total) and the simulated device's capacity on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ("fit", "transformer", "resnet", "gpt2")
LENGTHS = {False: 30, True: 8}  # the fit model's lengths, one per step in turn: on CUDA, tiny (the host)
MiB = 1 << 20


# ---- in a worker process ----------------------------------------------------------
def setup(backend: str, budget_mb: int) -> str:
    """memalloc enabled under the budget; returns the torch device name."""
    sys.path.insert(0, REPO)
    import torch

    import memalloc

    if backend == "host":
        memalloc.enable(backend="host", config=f"host_capacity_mb:{budget_mb}")
        memalloc.host.use_for_cpu_tensors()
        return "cpu"
    memalloc.enable(backend="cuda")
    torch.cuda.set_per_process_memory_fraction(budget_mb * MiB / torch.cuda.mem_get_info()[1])
    return "cuda"


def make_model(model: str, device: str) -> Callable[[int, int | None], None]:
    """step(batch, i): training step i (None: the worst case) at ``batch``."""
    import torch
    from torch import nn

    tiny = device == "cpu"
    torch.manual_seed(0)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if not tiny else torch.enable_grad
    if model == "fit":
        from benchmarks.fit.largest_batch import CLASSES, VOCAB, lengths, model_step

        vocab = 512 if tiny else VOCAB
        lens = lengths(LENGTHS[device == "cpu"], max_len=256 if tiny else 4096)
        train = model_step(device, width=64, layers=2, vocab=vocab, bf16=False) if tiny else model_step(device)

        def step(b: int, i: int | None) -> None:
            n = max(lens) if i is None else lens[i % len(lens)]
            train(torch.randint(0, vocab, (b, n), device=device), torch.randint(0, CLASSES, (b,), device=device))

        return step
    if model == "transformer":
        from benchmarks.fit.largest_batch import CLASSES, model_step

        vocab, seq = (512, 64) if tiny else (8192, 1024)
        train = model_step(device, width=128, layers=2, vocab=vocab, bf16=False) if tiny else model_step(device)

        def step(b: int, i: int | None) -> None:
            train(torch.randint(0, vocab, (b, seq), device=device), torch.randint(0, CLASSES, (b,), device=device))

        return step
    if model == "resnet":
        if tiny:
            sys.path.insert(0, os.path.join(REPO, "tests", "planner_cases"))
            from models import make_cnn

            cnn = make_cnn()
            return lambda b, i: cnn(b)
        import torchvision

        net = torchvision.models.resnet50().to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

        def step(b: int, i: int | None) -> None:
            x = torch.randn(b, 3, 224, 224, device=device)
            y = torch.randint(0, 1000, (b,), device=device)
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = (
            GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
            if tiny
            else GPT2Config(n_positions=512)
        )
        seq = 64 if tiny else 512
        net = GPT2LMHeadModel(config).to(device)
        net.train()
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

        def step(b: int, i: int | None) -> None:
            ids = torch.randint(0, config.vocab_size, (b, seq), device=device)
            with autocast():
                loss = net(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step
    raise SystemExit(f"unknown model {model!r}: one of {', '.join(MODELS)}")


# MEMALLOC_BENCH_DUMP=DIR: each trial writes its steps' peaks, and each plan
# its probe records (memalloc.features.planner.save_records), under DIR, so
# that a plan made on the GPU can be replayed and compared on the host.
DUMP = "MEMALLOC_BENCH_DUMP"


def worker_trial(model: str, batch: int, steps: int, backend: str, budget_mb: int) -> dict:
    import torch

    import memalloc

    step = make_model(model, setup(backend, budget_mb))
    peaks: list = []  # per step: (peak allocated, peak reserved, bytes allocated at its end), bytes
    out: dict = {"batch": batch, "ok": True}
    try:
        for i in range(steps):
            memalloc.memory.reset_peak_memory_stats()
            step(batch, i)
            s = memalloc.memory.memory_stats()
            peaks.append(
                (s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"], s["allocated_bytes.all.current"])
            )
        if backend == "cuda":
            torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        out = {"batch": batch, "ok": False, "error": str(e).splitlines()[0][:300], "failed_step": len(peaks)}
    if os.environ.get(DUMP):
        with open(os.path.join(os.environ[DUMP], f"trial-{model}-{budget_mb}-{batch}-{steps}.json"), "w") as f:
            json.dump({**out, "steps": steps, "peaks": peaks}, f)
    return out


def plan_step(step: Callable[[int, int | None], None], plan_steps: int | None) -> Callable[[int], None]:
    """The step the planner is given: the worst case (``step(b, None)``), or
    with ``plan_steps`` the job's own steps in order, 0 to ``plan_steps``,
    at each probe (the planner runs 1 + steps per probe, and each probe must
    see the same shapes in the same order)."""
    if plan_steps is None:
        return lambda b: step(b, None)
    calls = [0]

    def in_order(b: int) -> None:
        i = calls[0] % (plan_steps + 1)
        calls[0] += 1
        step(b, i)

    return in_order


def worker_plan(
    model: str, backend: str, budget_mb: int, plan_steps: int | None = None, probes: tuple[int, ...] | None = None
) -> dict:
    import memalloc

    step = make_model(model, setup(backend, budget_mb))
    t0 = time.perf_counter()
    if os.environ.get(DUMP):  # the records the plan is made from, written as plan() receives them
        from memalloc.features import planner

        plan_from = planner.plan

        def dumped(records, *args, **kwargs):
            planner.save_records(records, os.path.join(os.environ[DUMP], f"plan-{model}-{budget_mb}.json"))
            return plan_from(records, *args, **kwargs)

        planner.plan = dumped
    p = memalloc.largest_batch(
        plan_step(step, plan_steps), steps=plan_steps or 2, **({"probes": probes} if probes else {})
    )
    return {
        "batch": p.batch,
        "plan_s_in_process": time.perf_counter() - t0,
        "budget": p.budget,
        "peak_reserved": p.peak_reserved,
        "peak_allocated": p.peak_allocated,
        "fixed_bytes": p.fixed_bytes,
        "per_sample_bytes": p.per_sample_bytes,
        "limit": p.limit,
        "probes": p.probes,
        "matched_share": p.matched_share,
        "growing_share": p.growing_share,
        "steady": p.steady,
        "repeats": p.repeats,
        "text": str(p),
        "device": device_words(backend),
    }


def device_words(backend: str) -> str:
    """The device a worker ran on, in words (the driver never touches CUDA)."""
    import torch

    if backend == "cuda":
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"host backend (a simulated device on the CPU), torch {torch.__version__}, {os.cpu_count()} CPUs"


# ---- the driver -----------------------------------------------------------------
def run_worker(args: list[str], timeout: int = 600) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.fit.plan_vs_search", "--worker", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("MEMALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
        },
    )
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"plan_vs_search worker {args} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(lines[-1])


def largest_that_fits(fits: Callable[[int], bool], start: int) -> int:
    """The largest batch for which ``fits(batch)`` holds (0 if none does):
    doubling from ``start`` while it fits, halving while it does not, then
    bisection between the last that fit and the first that did not."""
    lo, hi = 0, None
    if fits(start):  # double until one fails
        lo = start
        while hi is None:
            b = lo * 2
            lo, hi = (b, None) if fits(b) else (lo, b)
    else:  # halve until one fits
        hi = start
        while hi > 1:
            b = hi // 2
            if fits(b):
                lo = b
                break
            hi = b
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_that_runs_long(runs_long: Callable[[int], bool], planned: int, largest: int) -> int:
    """The largest batch from ``planned`` to ``largest`` (the largest that
    runs a short trial, above the plan) that runs a long one (``runs_long``:
    as many steps as the plan was made for; fragmentation that builds up
    can stop a batch that ran the short trial), bisected; 0 when not even
    the planned batch runs it."""
    if not runs_long(planned):
        return 0
    if largest <= planned:
        return planned
    if runs_long(largest):
        return largest
    lo, hi = planned, largest
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if runs_long(mid) else (lo, mid)
    return lo


def trial(model: str, batch: int, steps: int, backend: str, budget_mb: int) -> dict:
    """One trial in a fresh process (worker_trial): ``steps`` steps at
    ``batch``; its result, ``ok`` when no step ran out of memory."""
    return run_worker(
        ["trial", model, str(batch), "--steps", str(steps), "--backend", backend, "--budget-mb", str(budget_mb)]
    )


def search(model: str, backend: str, budget_mb: int, steps: int, start: int) -> dict:
    trials = []

    def fits(b: int) -> bool:
        r = trial(model, b, steps, backend, budget_mb)
        trials.append(r)
        return r["ok"]

    lo = largest_that_fits(fits, start)
    return {"largest_batch": lo, "trials": len(trials), "tried": [(t["batch"], t["ok"]) for t in trials]}


def compare(model: str, backend: str, budget_mb: int, steps: int, start: int) -> dict:
    """The search (trials of ``steps`` steps) and the plan, each timed.
    The plan holds for the steps it was replayed for (``horizon``: the
    probe's 1 + 2 and the replay's repeats); where the search's largest is
    above the plan and the horizon is longer than a trial, the truth is the
    largest batch between them that runs the horizon (``long``: a batch
    that runs a short trial can run out of memory later, which the plan
    counts and the short search does not)."""
    t0 = time.perf_counter()
    found = search(model, backend, budget_mb, steps, start)
    search_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    planned = run_worker(["plan", model, "--backend", backend, "--budget-mb", str(budget_mb)])
    plan_s = time.perf_counter() - t0
    truth = found["largest_batch"]
    horizon = 1 + 2 + planned["repeats"]  # worker_plan's steps=2
    long: dict = {}
    if truth > planned["batch"] and horizon > steps:
        tried: dict[int, bool] = {}

        def runs_long(b: int) -> bool:
            tried[b] = trial(model, b, horizon, backend, budget_mb)["ok"]
            return tried[b]

        t0 = time.perf_counter()
        largest = largest_that_runs_long(runs_long, planned["batch"], truth)
        long = {
            "steps": horizon,
            "largest_batch": largest,
            "planned_runs": tried[planned["batch"]],
            "tried": sorted(tried.items()),
            "seconds": time.perf_counter() - t0,
        }
        truth = largest
    return {
        "model": model,
        "backend": backend,
        "budget_mb": budget_mb,
        "steps_per_trial": steps,
        "search": found,
        "search_s": search_s,
        "plan": planned,
        "plan_s": plan_s,
        "long": long,
        "truth": truth,
        "planned_over_found": planned["batch"] / truth if truth else None,
        "plan_time_share": plan_s / search_s,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--model", choices=MODELS, default="fit")
    p.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    p.add_argument("--budget-mb", type=int, default=7168)
    p.add_argument("--steps", type=int, default=None, help="steps per trial (default: 30 for fit, 10 otherwise)")
    p.add_argument(
        "--plan-steps",
        type=int,
        default=None,
        help="the planner's steps per probe, each the job's own step in order (default: 2, each the worst case)",
    )
    p.add_argument("--start", type=int, default=16, help="the search's first batch")
    p.add_argument("--probes", default=None, help="the planner's probe batches, e.g. 2,4,8,16 (default: its own)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.worker:
        kind, model, *rest = args.worker
        if kind == "trial":
            r = worker_trial(model, int(rest[0]), args.steps or 10, args.backend, args.budget_mb)
        else:
            r = worker_plan(
                model,
                args.backend,
                args.budget_mb,
                args.plan_steps,
                tuple(int(b) for b in args.probes.split(",")) if args.probes else None,
            )
        print(json.dumps(r))
        return 0
    steps = args.steps or (30 if args.model == "fit" else 10)
    r = compare(args.model, args.backend, args.budget_mb, steps, args.start)
    r["command"] = "python -m benchmarks plan-vs-search " + " ".join(argv if argv is not None else sys.argv[1:])
    print(json.dumps({k: v for k, v in r.items() if k != "plan"} | {"planned": r["plan"]["batch"]}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
