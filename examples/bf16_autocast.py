"""Mixed precision with bf16: the forward under torch.autocast(bfloat16);
parameters, gradients and optimizer state stay fp32, most activations are
saved in bf16 (autocast also keeps bf16 copies of the weights it casts).

    python examples/bf16_autocast.py --model transformer
"""

import torch
from _common import build, enable, parse_args, run

args = parse_args(__doc__)
enable()
w = build(args.model)


def step() -> None:
    w.optimizer.zero_grad(set_to_none=True)
    with torch.autocast(w.device.type, dtype=torch.bfloat16):
        loss = w.loss(w.inputs, w.targets)
    loss.backward()
    w.optimizer.step()


run("bf16_autocast", w, step, args)
