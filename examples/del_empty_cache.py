"""``del`` and ``empty_cache`` between phases: the step drops its output and
loss as soon as backward is done (before the optimizer step), frees the
gradients right after it (zero_grad(set_to_none=True)), then returns the
cached blocks to the device (torch.cuda.empty_cache; memalloc.memory.empty_cache on
the host backend). The peak is what the tensors need at once; what changes
is what stays reserved between steps, at the price of new device
allocations every step.

    python examples/del_empty_cache.py --model transformer
"""

from _common import build, enable, parse_args, run

import memalloc  # after _common, which makes the repository importable

args = parse_args(__doc__)
enable()
w = build(args.model)


def step() -> None:
    out = w.forward(w.inputs)
    loss = w.loss_fn(out, w.targets)
    loss.backward()
    del out, loss
    w.optimizer.step()
    w.optimizer.zero_grad(set_to_none=True)
    memalloc.memory.empty_cache()


run("del_empty_cache", w, step, args)
