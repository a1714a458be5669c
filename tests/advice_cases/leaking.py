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

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # strategies.py
from strategies import backward, cpu_autocast, end_step, grad_scaler, optimizer_step, parser, write_measurement  # noqa: E402

p = parser(batch=128, steps=12)
p.add_argument("--no-leak", action="store_true")
args = p.parse_args()

torch.set_num_threads(1)  # two cores shared: one thread is ten times faster than two
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1000))
opt = torch.optim.Adam(model.parameters())
scaler = grad_scaler(args)
kept = []
for step in range(args.steps):
    x = torch.randn(args.batch, 64)
    y = torch.randint(0, 1000, (args.batch,))
    for i, (xs, ys) in enumerate(zip(x.chunk(args.micro), y.chunk(args.micro))):
        with cpu_autocast(args):
            logits = model(xs)
            if not args.no_leak:
                kept.append(logits)  # the leak
            loss = nn.functional.cross_entropy(logits, ys) / args.micro
        if i == 0:
            opt.zero_grad(set_to_none=True)
        backward(loss, scaler)
    optimizer_step(opt, scaler)
    if args.empty_cache:
        del x, y, xs, ys, logits, loss
    end_step(args, step)

write_measurement(args.out)
