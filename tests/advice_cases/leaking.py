"""The leaking script of tests/integration/test_real_paths_advice.py (the
same model, loop and leak: every step's logits kept in a list), with each
of the advisor's strategies as a flag, for
tests/integration/test_real_paths_advice_applied.py:

    --no-leak (the leak removed), --batch 64 (half the batch), --micro 2 (two
    micro-batches), --autocast bf16|fp16 (torch.autocast on the CPU; fp16
    with a GradScaler), --empty-cache (del + empty_cache after each step)

OUT.json gets what the run measured over the steps after the first two:
peak allocated and peak reserved, and reserved after the last step."""
from __future__ import annotations

import argparse
import contextlib
import json

import torch
from torch import nn

import memalloc

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--batch", type=int, default=128)
p.add_argument("--micro", type=int, default=1)
p.add_argument("--autocast", choices=("bf16", "fp16"), default=None)
p.add_argument("--empty-cache", action="store_true")
p.add_argument("--no-leak", action="store_true")
p.add_argument("--steps", type=int, default=12)
args = p.parse_args()

torch.set_num_threads(1)  # two cores shared: one thread is ten times faster than two
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1000))
opt = torch.optim.Adam(model.parameters())
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast)
scaler = torch.amp.GradScaler("cpu") if args.autocast == "fp16" else None
kept = []
for step in range(args.steps):
    x = torch.randn(args.batch, 64)
    y = torch.randint(0, 1000, (args.batch,))
    for i, (xs, ys) in enumerate(zip(x.chunk(args.micro), y.chunk(args.micro))):
        with torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext():
            logits = model(xs)
            if not args.no_leak:
                kept.append(logits)  # the leak
            loss = nn.functional.cross_entropy(logits, ys) / args.micro
        if i == 0:
            opt.zero_grad(set_to_none=True)
        (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    if args.empty_cache:
        del x, y, xs, ys, logits, loss
        memalloc.empty_cache()
    if step == 1:  # Adam's state exists from the first step on: measure the steps after the second
        memalloc.reset_peak_memory_stats()

json.dump({"peak_allocated": memalloc.max_memory_allocated(), "peak_reserved": memalloc.max_memory_reserved(),
           "reserved_after": memalloc.memory_reserved(), "allocated_after": memalloc.memory_allocated()},
          open(args.out, "w"))
