"""What the advice case scripts (plain.py, leaking.py, lightning_auto.py)
share: their command line (each of the advisor's strategies as a flag) and
the measurement each writes at its end. Nothing here allocates a tensor:
the scripts' allocations stay at their own lines, where the advisor and the
leak report name them."""

from __future__ import annotations

import argparse
import contextlib
import json
from contextlib import AbstractContextManager
from typing import Any

import torch

import memalloc


def parser(batch: int, steps: int) -> argparse.ArgumentParser:
    """OUT.json, then the strategies' flags: --batch (the baseline's
    ``batch``), --micro N (micro-batches per optimizer step), --autocast
    bf16|fp16 (fp16 with a GradScaler), --empty-cache, --steps (the
    baseline's ``steps``)."""
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--micro", type=int, default=1)
    p.add_argument("--autocast", choices=("bf16", "fp16"), default=None)
    p.add_argument("--empty-cache", action="store_true")
    p.add_argument("--steps", type=int, default=steps)
    return p


def autocast_dtype(args: argparse.Namespace) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast)


def cpu_autocast(args: argparse.Namespace) -> AbstractContextManager[Any]:
    """torch.autocast on the CPU at --autocast's dtype (nothing without it)."""
    dtype = autocast_dtype(args)
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def grad_scaler(args: argparse.Namespace) -> torch.amp.GradScaler | None:
    """fp16's GradScaler (None otherwise)."""
    return torch.amp.GradScaler("cpu") if args.autocast == "fp16" else None


def backward(loss: torch.Tensor, scaler: torch.amp.GradScaler | None) -> None:
    """loss.backward(), through fp16's GradScaler when there is one."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def optimizer_step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()


def end_step(args: argparse.Namespace, step: int) -> None:
    """After a step: memalloc.memory.empty_cache() with --empty-cache (the caller
    has deleted its step's tensors first), and after the second step the
    peaks reset (Adam's state exists from the first step on: the
    measurement is of the steps after the second)."""
    if args.empty_cache:
        memalloc.memory.empty_cache()
    if step == 1:
        memalloc.memory.reset_peak_memory_stats()


def write_measurement(path: str, **extra: int) -> None:
    """Peak allocated and peak reserved since the last reset (bytes), and
    reserved and allocated now, with ``extra``, as JSON at ``path``."""
    with open(path, "w") as f:
        json.dump(
            {
                "peak_allocated": memalloc.memory.max_memory_allocated(),
                "peak_reserved": memalloc.memory.max_memory_reserved(),
                "reserved_after": memalloc.memory.memory_reserved(),
                "allocated_after": memalloc.memory.memory_allocated(),
                **extra,
            },
            f,
        )
