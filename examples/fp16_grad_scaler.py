"""Mixed precision with fp16: the forward under torch.autocast(float16) and
a GradScaler, which scales the loss so small fp16 gradients do not underflow
(the guide's "fp16 halves memory").

    python examples/fp16_grad_scaler.py --model transformer
"""

import torch
from _common import build, enable, parse_args, run

args = parse_args(__doc__)
enable()
w = build(args.model)
scaler = torch.amp.GradScaler(w.device.type)


def step() -> None:
    w.optimizer.zero_grad(set_to_none=True)
    with torch.autocast(w.device.type, dtype=torch.float16):
        loss = w.loss(w.inputs, w.targets)
    scaler.scale(loss).backward()
    scaler.step(w.optimizer)
    scaler.update()


run("fp16_grad_scaler", w, step, args)
