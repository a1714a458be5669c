"""Checkpointing and bf16 autocast together (the guide: fp16 and
checkpointing together "cut memory by 60%").

    python examples/checkpointing_bf16.py --model transformer
"""

import torch
from _common import build, enable, parse_args, run

args = parse_args(__doc__)
enable()
w = build(args.model)


def step() -> None:
    w.optimizer.zero_grad(set_to_none=True)
    with torch.autocast(w.device.type, dtype=torch.bfloat16):
        loss = w.loss(w.inputs, w.targets, checkpoint=True)
    loss.backward()
    w.optimizer.step()


run("checkpointing_bf16", w, step, args, checkpointed_blocks=len(w.blocks))
