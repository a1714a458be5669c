"""A plain training script (no memalloc in it but the measurement at its
end), with each of the advisor's strategies as a flag, for
tests/integration/test_real_paths_advice_applied.py.

    python -m memalloc run --advise --out D plain.py OUT.json            (the baseline, advised)
    python -m memalloc run --out D plain.py OUT.json --batch 16          (half the batch)
    ... --micro 2 (two micro-batches), --checkpoint (the repeated blocks
    under torch.utils.checkpoint), --autocast bf16|fp16 (torch.autocast on
    the CPU; fp16 with a GradScaler), --empty-cache (del + empty_cache after
    each step)

The model of plain_model.py (4 residual blocks in an nn.Sequential), Adam,
a fresh batch each step as a data loader would give. OUT.json gets what the
run measured over the steps after the first two: peak allocated and peak
reserved, and reserved after the last step."""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # plain_model.py, strategies.py
from plain_model import CLASSES, TOKENS, WIDTH, Net  # noqa: E402
from strategies import backward, cpu_autocast, end_step, grad_scaler, optimizer_step, parser, write_measurement  # noqa: E402

p = parser(batch=32, steps=5)
p.add_argument("--checkpoint", action="store_true")
args = p.parse_args()

torch.set_num_threads(1)  # two cores shared: one thread is ten times faster than two
torch.manual_seed(0)
model = Net(checkpoint=args.checkpoint)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = grad_scaler(args)
for step in range(args.steps):
    x = torch.randn(args.batch, TOKENS, WIDTH)
    y = torch.randint(0, CLASSES, (args.batch, TOKENS))
    opt.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(args.micro), y.chunk(args.micro)):
        with cpu_autocast(args):
            logits = model(xs)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), ys.flatten()) / args.micro
        backward(loss, scaler)
    optimizer_step(opt, scaler)
    if args.empty_cache:
        del x, y, xs, ys, logits, loss
    end_step(args, step)

write_measurement(args.out)
