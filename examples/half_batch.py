"""A smaller batch: half the samples per step (activations scale with it;
parameters, gradients and optimizer state do not).

    python examples/half_batch.py --model transformer
"""

from _common import build, enable, parse_args, run

args = parse_args(__doc__)
enable()
w = build(args.model, batch_scale=0.5)


def step() -> None:
    w.optimizer.zero_grad(set_to_none=True)
    w.loss(w.inputs, w.targets).backward()
    w.optimizer.step()


run("half_batch", w, step, args)
