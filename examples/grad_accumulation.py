"""Gradient accumulation: the baseline's batch as ``--micro`` micro-batches
(default 2), gradients summed over them, one optimizer step: the same
effective batch with the activations of one micro-batch.

    python examples/grad_accumulation.py --model transformer --micro 2
"""

from _common import build, enable, parse_args, run

args = parse_args(__doc__, lambda p: p.add_argument("--micro", type=int, default=2, help="micro-batches per step"))
enable()
w = build(args.model)
xs, ys = w.inputs.chunk(args.micro), w.targets.chunk(args.micro)


def step() -> None:
    w.optimizer.zero_grad(set_to_none=True)
    for x, y in zip(xs, ys):
        (w.loss(x, y) / args.micro).backward()
    w.optimizer.step()


run("grad_accumulation", w, step, args, samples_per_step=w.batch, micro_batches=args.micro, micro_batch=xs[0].shape[0])
