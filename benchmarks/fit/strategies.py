"""The guide's memory-reducing strategies, measured (issue 15).

    python -m benchmarks strategies --out DIR/strategies.json [--models transformer,resnet50]
    python -m benchmarks strategies --doc RESULTS.json          (rewrites docs/strategies.md)

Runs every script of examples/ (one strategy each) for each model, one fresh
process at a time (so peaks and step times are the strategy's alone), and
writes the table: peak allocated, peak reserved, reserved after the step and
step time, each as a ratio to the same model's baseline measured in the same
run, with memalloc's split of the peak by category (memory_breakdown) and the
guide's claim beside each measurement, agreeing or not. It also measures
what the breakdown costs: the bf16 transformer's step with the landmark hooks
(memalloc.phases) installed against uninstalled, alternating in one process
(medians of per-round ratios).

``--doc`` renders docs/strategies.md from a results file (the committed one
under benchmarks/results/); tests/integration/test_strategies.py checks that the page is
current and that the advisor's estimates (memalloc/features/advisor.py) are within
15% of the measured savings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "strategies.md")
STRATEGIES = (
    "baseline",
    "half_batch",
    "grad_accumulation",
    "bf16_autocast",
    "fp16_grad_scaler",
    "checkpointing",
    "checkpointing_bf16",
    "del_empty_cache",
    "ddp",
)
MODELS = ("transformer", "resnet50")


# The guide's claim for each strategy and the verdict on a measurement
# (ratios to the baseline: peak allocated "mem", step time "time", reserved
# after the step "after", samples per step "samples"): "agrees", or in which
# direction it does not. A claimed number agrees within +-0.1 of the ratio.
def _about(value: float, target: float, more: str, less: str) -> str:
    """ "agrees" when value is within 0.1 of target, else `more` (below) or `less` (above)."""
    if abs(value - target) <= 0.1 + 1e-9:
        return "agrees"
    return more if value < target else less


CLAIMS: dict[str, tuple[str, Any]] = {
    "half_batch": ("a smaller batch needs less memory", lambda r: "agrees" if r["mem"] < 0.95 else "no saving"),
    "grad_accumulation": (
        "the same effective batch in less memory",
        lambda r: "agrees" if r["mem"] < 0.95 and r["samples"] == 1.0 else "no saving",
    ),
    "bf16_autocast": ("mixed precision halves memory", lambda r: _about(r["mem"], 0.5, "saves more", "saves less")),
    "fp16_grad_scaler": ("fp16 halves memory", lambda r: _about(r["mem"], 0.5, "saves more", "saves less")),
    "checkpointing": (
        "20-30% more time; memory O(n) -> O(sqrt n)",
        lambda r: (
            "saves less"
            if r["mem"] >= 0.7
            else "agrees"
            if 1.15 <= r["time"] <= 1.35
            else "slower"
            if r["time"] > 1.35
            else "faster"
        ),
    ),
    "checkpointing_bf16": (
        "with fp16, cuts memory by 60%",
        lambda r: _about(r["mem"], 0.4, "saves more", "saves less"),
    ),
    "del_empty_cache": ("del + empty_cache frees memory", lambda r: "agrees" if r["after"] < 0.95 else "frees nothing"),
    "ddp": (
        "splits the batch over GPUs: less memory per GPU",
        lambda r: "agrees" if r["mem"] < 0.95 and r["samples"] == 1.0 else "no saving",
    ),
}


def run_example(strategy: str, model: str, steps: int, warmup: int, timeout: int) -> dict:
    """One strategy script in a fresh process; its RESULT line as a dict
    (or {"error": ...})."""
    cmd = [
        sys.executable,
        os.path.join(REPO, "examples", f"{strategy}.py"),
        "--model",
        model,
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
    ]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"strategy": strategy, "model": model, "error": f"timed out after {timeout} s"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"strategy": strategy, "model": model, "error": (p.stderr or p.stdout)[-2000:]}
    out = json.loads(lines[-1][len("RESULT ") :])
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def ratios(result: dict, base: dict) -> dict:
    """A result's figures as ratios to the baseline's."""
    return {
        "mem": result["peak_allocated"] / base["peak_allocated"],
        "reserved": result["peak_reserved"] / base["peak_reserved"],
        "after": result["reserved_after"] / base["reserved_after"],
        "time": result["step_ms"] / base["step_ms"],
        "samples": result["samples_per_step"] / base["samples_per_step"],
    }


def judge(results: list[dict]) -> list[dict]:
    """Adds "ratios", "claim" and "verdict" to each result (in place)."""
    base = {r["model"]: r for r in results if r.get("strategy") == "baseline" and "error" not in r}
    for r in results:
        if "error" in r or r["model"] not in base:
            continue
        r["ratios"] = ratios(r, base[r["model"]])
        if r["strategy"] in CLAIMS:
            claim, test = CLAIMS[r["strategy"]]
            r["claim"], r["verdict"] = claim, test(r["ratios"])
    return results


def overhead(rounds: int, model: str) -> dict:
    """The landmark hooks' cost: the bf16 step of `model` with
    memalloc.phases installed against uninstalled, alternating per round in
    this process (memalloc enabled here); medians of per-round ratios."""
    sys.path.insert(0, os.path.join(REPO, "examples"))
    import _common  # examples/_common.py
    import torch

    import memalloc
    from memalloc import phases

    backend = _common.enable()
    w = _common.build(model)

    def step() -> None:
        w.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(w.device.type, dtype=torch.bfloat16):
            loss = w.loss(w.inputs, w.targets)
        loss.backward()
        w.optimizer.step()

    def timed(n: int) -> float:
        for _ in range(2):
            step()
        _common._sync(w.device)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            _common._sync(w.device)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2] * 1e3

    on, off, per_round = [], [], []
    for r in range(rounds):
        order = ("on", "off") if r % 2 == 0 else ("off", "on")
        got = {}
        for mode in order:
            if mode == "on":
                phases.install()
            else:
                phases.uninstall()
            got[mode] = timed(8)
        on.append(got["on"])
        off.append(got["off"])
        per_round.append(got["on"] / got["off"])
    phases.install()
    med = lambda v: sorted(v)[len(v) // 2]
    return {
        "model": model,
        "backend": backend,
        "rounds": rounds,
        "step_ms_hooks_on": med(on),
        "step_ms_hooks_off": med(off),
        "ratio_on_over_off": med(per_round),
        "breakdown_after": memalloc.memory_breakdown().peak,
    }


# ---- the doc page ----------------------------------------------------------------------
NAMES = {
    "baseline": "baseline (fp32, full batch)",
    "half_batch": "half the batch",
    "grad_accumulation": "gradient accumulation (2 x half)",
    "bf16_autocast": "bf16 autocast",
    "fp16_grad_scaler": "fp16 autocast + GradScaler",
    "checkpointing": "activation checkpointing",
    "checkpointing_bf16": "checkpointing + bf16",
    "del_empty_cache": "del + empty_cache each step",
    "ddp": "DDP, 2 ranks (half the batch each)",
}
SHORT = {
    "parameters": "params",
    "gradients": "grads",
    "optimizer_state": "optim",
    "activations": "act",
    "temporaries": "temp",
    "other": "other",
}


def gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def split_text(split: dict) -> str:
    total = sum(split.values()) or 1
    return " · ".join(
        f"{SHORT[c]} {100 * v / total:.0f}%"
        for c, v in sorted(split.items(), key=lambda kv: -kv[1])
        if v / total >= 0.01
    )


def render(data: dict) -> str:
    """docs/strategies.md from a results file."""
    m = data["machine"]
    lines = [
        "# Reducing memory: the guide's strategies, measured",
        "",
        "Generated by `python -m benchmarks strategies --doc "
        f"{data['results_file']}` from the run below; do not edit by hand.",
        "",
        f"Run: {m.get('date')}, {m.get('gpu', 'no GPU')} (x{m.get('gpus', 0)}), torch {m.get('torch')}, "
        f"CUDA {m.get('cuda')}. Command: `{data['command']}`.",
        "",
        "Each row is one script of [examples/](../examples/) run in a fresh process under memalloc "
        f"({data['steps']} measured steps after {data['warmup']} warm-up steps). Ratios are to the same "
        "model's baseline in the same run: **peak** allocated and peak reserved bytes over the measured "
        "steps, **after**: reserved bytes after the last step, **time**: median step time (a step trains "
        "the same samples, except half the batch). The split is memalloc's breakdown of the last step's "
        "peak (memalloc.memory_breakdown: params, grads, optimizer state, activations, temporaries, other). "
        "DDP with [gloo] ran both ranks on one GPU (one GPU was lent): its memory per rank is what a rank on "
        "its own GPU holds, its step time is not.",
        "",
    ]
    for model in data["models"]:
        rows = [r for r in data["results"] if r["model"] == model]
        base = next((r for r in rows if r["strategy"] == "baseline" and "error" not in r), None)
        lines += [f"## {model}", ""]
        if base is not None:
            lines += [
                f"Baseline: peak allocated {gib(base['peak_allocated'])} GiB, peak reserved "
                f"{gib(base['peak_reserved'])} GiB, {base['step_ms']:.1f} ms per step "
                f"(batch {base['batch']}); at its peak: {split_text(base['breakdown_at_peak'])}.",
                "",
            ]
        lines += [
            "| strategy | peak GiB | peak × | reserved × | after × | time × | split at the peak | "
            "the guide says | measured |",
            "|---|---:|---:|---:|---:|---:|---|---|---|",
        ]
        for r in rows:
            if "error" in r:
                lines.append(f"| {NAMES[r['strategy']]} | failed: {r['error'].splitlines()[-1][:80]} | | | | | | | |")
                continue
            q = r.get("ratios", {})
            name = NAMES[r["strategy"]] + (f" [{r['process_group']}]" if "process_group" in r else "")
            verdict = r.get("verdict", "")
            agrees = verdict if verdict in ("", "agrees") else f"**{verdict}**"
            lines.append(
                f"| {name} | {gib(r['peak_allocated'])} | {q.get('mem', 1):.2f} | "
                f"{q.get('reserved', 1):.2f} | {q.get('after', 1):.2f} | {q.get('time', 1):.2f} | "
                f"{split_text(r['breakdown_at_peak'])} | {r.get('claim', '')} | {agrees} |"
            )
        lines.append("")
    o = data.get("overhead")
    if o and "error" in o:
        lines += ["## What the breakdown costs", "", f"The measurement failed: {o['error'].splitlines()[-1]}", ""]
    elif o:
        lines += [
            "## What the breakdown costs",
            "",
            f"The {o['model']} trained in bf16 under memalloc, with the landmark hooks behind "
            f"memory_breakdown (memalloc.phases) installed and uninstalled in alternate rounds of one "
            f"process ({o['rounds']} rounds, median of per-round ratios): **{o['ratio_on_over_off']:.3f}x** "
            f"({o['step_ms_hooks_on']:.2f} ms against {o['step_ms_hooks_off']:.2f} ms per step).",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks strategies")
    p.add_argument("--out", help="results JSON path")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=int, default=240, help="seconds per script")
    p.add_argument("--overhead-rounds", type=int, default=9, help="0: skip the overhead measurement")
    p.add_argument("--overhead-model", default="transformer")
    p.add_argument("--overhead", action="store_true", help=argparse.SUPPRESS)  # the child of the measurement
    p.add_argument("--doc", help="render docs/strategies.md from this results file")
    args = p.parse_args(argv)
    if args.overhead:
        print("OVERHEAD " + json.dumps(overhead(args.overhead_rounds, args.overhead_model)), flush=True)
        return 0
    if args.doc:
        with open(args.doc) as f:
            data = json.load(f)
        data["results_file"] = os.path.relpath(os.path.abspath(args.doc), REPO)
        with open(DOC, "w") as f:
            f.write(render(data) + "\n")
        print(f"wrote {DOC}")
        return 0
    if not args.out:
        p.error("--out is required (or --doc)")
    from ..speed.suite import machine

    command = "python -m benchmarks strategies " + " ".join(argv if argv is not None else sys.argv[1:])
    models = [m for m in args.models.split(",") if m]
    results = []
    for model in models:
        for strategy in [s for s in args.strategies.split(",") if s]:
            r = run_example(strategy, model, args.steps, args.warmup, args.timeout)
            print(json.dumps({k: v for k, v in r.items() if k != "breakdown_at_peak"})[:400], flush=True)
            results.append(r)
    judge(results)
    data = {
        "schema": "memalloc.strategies/1",
        "machine": machine(),
        "command": command,
        "models": models,
        "steps": args.steps,
        "warmup": args.warmup,
        "results": results,
    }
    if args.overhead_rounds > 0:
        child = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.fit.strategies",
                "--overhead",
                "--overhead-rounds",
                str(args.overhead_rounds),
                "--overhead-model",
                args.overhead_model,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        got = [l for l in child.stdout.splitlines() if l.startswith("OVERHEAD ")]
        data["overhead"] = json.loads(got[-1][len("OVERHEAD ") :]) if got else {"error": child.stderr[-2000:]}
        print(json.dumps(data["overhead"])[:400], flush=True)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
