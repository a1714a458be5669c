"""The batch planner's corpus (issue 37): for each model and memory budget,
the batch ``memalloc.largest_batch`` plans, checked against the largest
batch that really runs, found by a search with real OOMs (doubling, then
bisection: benchmarks/fit/plan_vs_search.largest_that_fits). A row passes when
the planned batch trains the trial's steps without running out of memory
and is within 5% of the largest that runs.

    python -m benchmarks planner-corpus --out X.json                  (host backend: the CPU, tiny models)
    python -m benchmarks planner-corpus --device cuda --out X.json    (a CUDA GPU, real OOMs)
    python -m benchmarks planner-corpus --device cuda --cases gpt2:8192,fit:7168 --out X.json

Models (benchmarks/fit/plan_vs_search.make_model; tiny on the host):
  resnet       a CNN with batch norm: torchvision ResNet-50, 224x224, SGD
               with momentum (host: 3 conv + batch norm blocks, 32x32)
  transformer  a transformer encoder at one length (1024 tokens; host: 64)
  gpt2         transformers' GPT-2 from a config, 512 tokens, bf16 autocast
               (host: 2 layers, 64 wide, 64 tokens, fp32)
  fit          varying lengths: the fit benchmark's transformer, whose
               sequence length changes every step (30 lengths, long-tailed,
               64..4096; host: 8, 64..256); each trial trains the lengths in
               order, twice (host: three times), and the planner is given
               the same steps in the same order (largest_batch(steps=30):
               each probe runs them, and the replay repeats them in turn, so
               their mix's fragmentation is in the plan; ``--fit-plan
               longest`` gives it the longest at every step instead)

The budget (MiB) is, on CUDA, the memory fraction (budget / the device's
total memory) under which every process runs, and on the host the
simulated device's capacity.

How each side runs, as benchmarks/fit/plan_vs_search.py runs it:
- ``--device cuda``: every trial of the search and the plan are each a
  fresh process (``python -m benchmarks plan-vs-search --worker ...``:
  memalloc.enable(backend="cuda"), the memory fraction, the model built,
  then ``--steps`` training steps at the batch, or the plan), so each
  starts on an empty device and a real OOM ends only its own process.
  The search starts at ``--start`` (16) as a search without a plan would.
- host (default): the same in this process, each trial and the plan on a
  fresh host allocator of the budget under memalloc.enable()'s default
  policy (expandable segments), the model built anew for each, the CPU
  tensors routed to it (memalloc.host.cpu_tensors_from): a fresh process
  costs 2-3 s of importing torch per trial. The search starts at the
  planned batch (``--start plan``), so that the corpus runs in under two
  minutes on two cores; ``--fresh`` runs the host's trials and plan in
  fresh processes too.
When the search never tried the planned batch, it is tried on its own.
The planner plans for a run as long as its replay (the probe's 3 steps and
up to 64 more), longer than a trial, and a batch that runs a trial can run
out of memory later (the host's GPT-2 at 48 MiB: 20 runs 12 steps and runs
out of memory in step 49, where the plan was 19). So where the largest
that runs is above the plan, the batches between them are tried again over
``--long-steps`` (67; fit's lengths three times): the largest of them that
runs that long is ``largest_that_runs_long``.

Writes JSON: {"device", "command", "steps", "rows": [...]}, a row per case:
{model, budget (MiB), planned, largest_that_runs, ratio (planned /
largest_that_runs), plan_s, search_s (wall seconds, process starts
included on CUDA), planned_runs, ok (planned_runs and ratio >= 0.95),
steady, repeats (the plan's replay: BatchPlan.steady, .repeats), trials,
tried ([batch, ran] in order), search_start; where the long runs were
tried: long_steps, largest_that_runs_long, planned_runs_long, ratio_long,
tried_long}.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.fit import plan_vs_search  # noqa: E402

MiB = 1 << 20
WITHIN = 0.05  # the planned batch may be at most 5% below the largest that runs
# (model, budget MiB) per device. Host budgets are small: the CPU trains every trial.
CASES = {
    "cpu": [
        ("resnet", 32),
        ("resnet", 64),
        ("transformer", 48),
        ("transformer", 96),
        ("gpt2", 64),
        ("gpt2", 96),
        ("fit", 48),
        ("fit", 64),
    ],
    "cuda": [
        ("resnet", 6144),
        ("resnet", 12288),
        ("transformer", 8192),
        ("transformer", 16384),
        ("gpt2", 16384),
        ("gpt2", 32768),
        ("fit", 7168),
        ("fit", 14336),
    ],
}
# Steps per trial: 12 (host) or 10 (cuda), as the other planner checks; for fit, its lengths three times on
# the host (8 lengths) and twice on CUDA (30): its second pass can run out of memory where the first did not
STEPS = {"cpu": {"fit": 3 * plan_vs_search.LENGTHS[True]}, "cuda": {"fit": 2 * plan_vs_search.LENGTHS[False]}}
# The planner's steps per probe, the job's own in order: fit's lengths once (others: 2, all alike)
PLAN_STEPS = {"cpu": {"fit": plan_vs_search.LENGTHS[True]}, "cuda": {"fit": plan_vs_search.LENGTHS[False]}}
# Steps of the long run that checks a largest batch above the plan: the planner's horizon, its probe's
# 3 steps and the replay's 64 (planner.MAX_REPEATS); fit's lengths 3 times
LONG_STEPS = {"cpu": {"fit": 3 * plan_vs_search.LENGTHS[True]}, "cuda": {"fit": 3 * plan_vs_search.LENGTHS[False]}}
LONG_DEFAULT = 3 + 64
HOST_POLICY = "expandable_segments:True"  # memalloc.enable()'s default; a memalloc.Allocator takes none


# ---- host: trials and the plan in this process ---------------------------------------
def host_allocator(budget_mb: int):
    import memalloc

    return memalloc.Allocator("host", f"{HOST_POLICY},host_capacity_mb:{budget_mb}")


def host_trial(model: str, budget_mb: int, batch: int, steps: int) -> bool:
    """A fresh model trains ``steps`` steps at ``batch`` on a fresh host
    allocator of ``budget_mb`` MiB without running out of memory."""
    import torch

    from memalloc import host

    a = host_allocator(budget_mb)
    with host.cpu_tensors_from(a):
        step = plan_vs_search.make_model(model, "cpu")
        try:
            for i in range(steps):
                step(batch, i)
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            del step
            gc.collect()


def host_plan(model: str, budget_mb: int, plan_steps: int | None) -> dict:
    import memalloc
    from memalloc import host

    a = host_allocator(budget_mb)
    with host.cpu_tensors_from(a):
        step = plan_vs_search.make_model(model, "cpu")
        try:
            p = memalloc.largest_batch(plan_vs_search.plan_step(step, plan_steps), steps=plan_steps or 2, allocator=a)
        finally:
            del step
            gc.collect()
    return {
        "batch": p.batch,
        "steady": p.steady,
        "repeats": p.repeats,
        "text": str(p),
        "device": plan_vs_search.device_words("host"),
    }


# ---- fresh processes: plan_vs_search's workers ----------------------------------------
def fresh_trial(model: str, budget_mb: int, batch: int, steps: int, backend: str) -> bool:
    return bool(plan_vs_search.trial(model, batch, steps, backend, budget_mb)["ok"])


def fresh_plan(model: str, budget_mb: int, backend: str, plan_steps: int | None) -> dict:
    r = plan_vs_search.run_worker(
        [
            "plan",
            model,
            "--backend",
            backend,
            "--budget-mb",
            str(budget_mb),
            *(["--plan-steps", str(plan_steps)] if plan_steps else []),
        ]
    )
    return {
        "batch": r["batch"],
        "steady": r["steady"],
        "repeats": r["repeats"],
        "text": r["text"],
        "device": r["device"],
    }


# ---- one case -----------------------------------------------------------------------
def run_case(
    model: str,
    budget_mb: int,
    device: str,
    steps: int,
    start: int | None,
    fresh: bool,
    plan_steps: int | None = None,
    long_steps: int | None = None,
) -> dict:
    """One row: the plan, then the search (from ``start``, None: from the
    planned batch), then the planned batch on its own if the search did not
    try it. Where the largest that runs is above the plan and ``long_steps``
    is more than ``steps``: the largest batch between them that runs
    ``long_steps`` (the planner plans for a run longer than a trial: a
    batch that runs a short trial can run out of memory later)."""
    backend = "cuda" if device == "cuda" else "host"
    in_process = device != "cuda" and not fresh
    t0 = time.perf_counter()
    planned = (
        host_plan(model, budget_mb, plan_steps) if in_process else fresh_plan(model, budget_mb, backend, plan_steps)
    )
    plan_s = time.perf_counter() - t0
    tried: list[list] = []
    seen: dict[int, bool] = {}

    def runs(batch: int) -> bool:
        if batch not in seen:
            seen[batch] = (
                host_trial(model, budget_mb, batch, steps)
                if in_process
                else fresh_trial(model, budget_mb, batch, steps, backend)
            )
            tried.append([batch, seen[batch]])
        return seen[batch]

    t0 = time.perf_counter()
    largest = plan_vs_search.largest_that_fits(runs, start or planned["batch"])
    search_s = time.perf_counter() - t0
    trials = len(tried)
    planned_runs = runs(planned["batch"])  # tried already when the search started there
    ratio = planned["batch"] / largest if largest else None
    long: dict = {}
    if long_steps and long_steps > steps and planned_runs and largest > planned["batch"]:
        long_seen: dict[int, bool] = {}

        def runs_long(batch: int) -> bool:
            if batch not in long_seen:
                long_seen[batch] = (
                    host_trial(model, budget_mb, batch, long_steps)
                    if in_process
                    else fresh_trial(model, budget_mb, batch, long_steps, backend)
                )
            return long_seen[batch]

        lo = plan_vs_search.largest_that_runs_long(runs_long, planned["batch"], largest)
        long = {
            "long_steps": long_steps,
            "largest_that_runs_long": lo,
            "planned_runs_long": long_seen[planned["batch"]],
            "ratio_long": planned["batch"] / lo if lo else None,
            "tried_long": sorted(long_seen.items()),
        }
    return {
        "model": model,
        "budget": budget_mb,
        "planned": planned["batch"],
        "largest_that_runs": largest,
        "ratio": ratio,
        "plan_s": round(plan_s, 3),
        "search_s": round(search_s, 3),
        "planned_runs": planned_runs,
        "ok": bool(planned_runs and ratio is not None and ratio >= 1 - WITHIN),
        "steady": planned["steady"],
        "repeats": planned["repeats"],
        "trials": trials,
        "tried": tried,
        "search_start": start or "plan",
        "steps": steps,
        "plan_steps": plan_steps or 2,
        "plan_text": planned["text"],
        "device": planned["device"],
        **long,
    }


def corpus(
    device: str = "cpu",
    cases: list | None = None,
    steps: int | None = None,
    start: int | None = None,
    fresh: bool = False,
    out: str | None = None,
    fit_plan: str = "steps",
    command: str | None = None,
    long_steps: int | None = None,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict:
    """Every case's row (CASES[device] unless ``cases`` names them), the
    JSON written to ``out`` after each row (a run cut short keeps its rows)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():  # (no CUDA context here: only the workers use the device)
            raise SystemExit("planner_corpus: --device cuda needs a CUDA GPU")
    doc: dict = {"device": None, "rows": [], "command": command}
    for model, budget_mb in cases or CASES[device]:
        n = steps or STEPS[device].get(model, 10 if device == "cuda" else 12)
        plan_steps = PLAN_STEPS[device].get(model) if fit_plan == "steps" else None
        long_n = long_steps if long_steps is not None else LONG_STEPS[device].get(model, LONG_DEFAULT)
        row = run_case(model, budget_mb, device, n, start, fresh, plan_steps, long_n)
        doc["rows"].append(row)
        doc["device"] = row["device"]
        log(
            f"{model} {budget_mb} MiB: planned {row['planned']}, largest that runs {row['largest_that_runs']} "
            f"(ratio {row['ratio']:.3f}), planned runs {row['planned_runs']}, plan {row['plan_s']:.1f} s, "
            f"search {row['search_s']:.1f} s ({row['trials']} trials), steady {row['steady']} "
            f"({row['repeats']} repeats){'' if row['ok'] else '  <-- FAILS'}"
            + (
                f"; over {row['long_steps']} steps the largest that runs is {row['largest_that_runs_long']}, planned "
                f"runs {row['planned_runs_long']}"
                if "long_steps" in row
                else ""
            )
            if row["ratio"] is not None
            else f"{model} {budget_mb} MiB: nothing runs ({row['tried']})"
        )
        if out:
            with open(out, "w") as f:
                json.dump(doc, f, indent=1)
    return doc


def parse_cases(text: str) -> list[tuple[str, int]]:
    cases = []
    for item in text.split(","):
        model, _, budget = item.partition(":")
        if model not in plan_vs_search.MODELS or not budget.isdigit():
            raise SystemExit(
                f"planner_corpus: --cases {text!r}: give MODEL:BUDGET_MB,... with MODEL one of "
                f"{', '.join(plan_vs_search.MODELS)}"
            )
        cases.append((model, int(budget)))
    return cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: the host backend (default); cuda: a CUDA GPU, real OOMs",
    )
    p.add_argument(
        "--cases", type=parse_cases, default=None, help="MODEL:BUDGET_MB,... (default: the device's corpus, CASES)"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per trial (default: STEPS: 12 on the host, 10 on CUDA; fit's lengths 3 and 2 times)",
    )
    p.add_argument(
        "--start",
        default=None,
        help="the search's first batch: a number, or 'plan' (default: 16 on CUDA, the planned batch on the host)",
    )
    p.add_argument("--fresh", action="store_true", help="host: trials and the plan in fresh processes")
    p.add_argument(
        "--long-steps",
        type=int,
        default=None,
        help="steps of the long run that checks a largest batch above the plan (default: 67, the "
        "planner's horizon; fit's lengths 3 times; 0: none)",
    )
    p.add_argument(
        "--fit-plan",
        choices=("steps", "longest"),
        default="steps",
        help="what the planner's step runs for fit: the job's lengths in order (default), or the longest at every step",
    )
    p.add_argument("--out", default=None, help="the JSON file (written after each case)")
    args = p.parse_args(argv)
    start = args.start or ("16" if args.device == "cuda" else "plan")
    doc = corpus(
        args.device,
        args.cases,
        args.steps,
        None if start == "plan" else int(start),
        args.fresh,
        args.out,
        args.fit_plan,
        "python -m benchmarks planner-corpus " + " ".join(sys.argv[1:] if argv is None else argv),
        args.long_steps,
    )
    failed = [r for r in doc["rows"] if not r["ok"]]
    print(
        json.dumps(
            [
                {
                    k: r[k]
                    for k in (
                        "model",
                        "budget",
                        "planned",
                        "largest_that_runs",
                        "ratio",
                        "plan_s",
                        "search_s",
                        "planned_runs",
                        "steady",
                    )
                }
                for r in doc["rows"]
            ],
            indent=1,
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
