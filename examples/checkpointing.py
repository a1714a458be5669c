"""Activation checkpointing: each repeated block (a transformer layer, a
ResNet bottleneck) under torch.utils.checkpoint(use_reentrant=False): only
its input is kept after the forward; its activations are recomputed in the
backward (the guide: "20-30% more time", memory O(n) -> O(sqrt n)).

    python examples/checkpointing.py --model transformer
"""

from _common import build, enable, parse_args, run

args = parse_args(__doc__)
enable()
w = build(args.model)


def step() -> None:
    w.optimizer.zero_grad(set_to_none=True)
    w.loss(w.inputs, w.targets, checkpoint=True).backward()
    w.optimizer.step()


run("checkpointing", w, step, args, checkpointed_blocks=len(w.blocks))
