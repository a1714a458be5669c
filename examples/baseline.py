"""Baseline: the full batch in fp32, one optimizer step per batch.

python examples/baseline.py --model transformer
"""

from _common import build, enable, parse_args, run

args = parse_args(__doc__)
enable()
w = build(args.model)


def step() -> None:
    w.optimizer.zero_grad(set_to_none=True)
    w.loss(w.inputs, w.targets).backward()
    w.optimizer.step()


run("baseline", w, step, args)
