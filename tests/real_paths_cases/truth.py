"""What a real-paths case script knows of itself, for
tests/integration/test_real_paths_run.py: the test's truths, taken with
torch alone (never with memalloc), so that the script is the same under
``python -m memalloc run`` as a user's.

A case script imports this module, calls :func:`start` before training and
:func:`finish` after it. :func:`start` counts every optimizer step torch
really takes (torch's global optimizer post-step hook: a framework that
skips a step, as accelerate's accumulation does, is not counted) and notes
the leak list's length at each one; :func:`finish` writes the truths as
JSON to the path given as the script's first argument:

``optimizer_steps``
    the optimizer steps taken (the hook's count); ``framework_steps``: the
    framework's own count of them (trainer.global_step ...)
``kept_per_step``
    how many tensors the leak list gained in each step (its length at each
    step's end, differenced)
``leak_bytes``
    the storage bytes of one kept tensor
``parameters`` / ``gradients`` / ``optimizer_state``
    the distinct storages' bytes of the model's parameters, their gradients
    and the optimizer's state tensors at the end
``batch``
    the batch size the script trained with

With ``REAL_PATHS_ENABLE=DIR`` in the environment the case script enables
memalloc itself (:func:`enable_if_asked`, its first lines), with its flight
recorder in DIR; with ``REAL_PATHS_KILL=1`` :func:`finish` SIGKILLs the
process once the truths are written (a job killed after its last step).
"""

import json
import os
import signal
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

_seen = {"steps": 0, "lengths": []}
_kept = None


def enable_if_asked() -> None:
    """``memalloc.enable()`` in the script, as a user writes it, when the
    test asks for that mode (the flight recorder in REAL_PATHS_ENABLE)."""
    directory = os.environ.get("REAL_PATHS_ENABLE")
    if directory:
        import memalloc

        memalloc.enable(backend="host", config=f"host_capacity_mb:1024,flight_recorder:{directory}")
        memalloc.host.use_for_cpu_tensors()


def start(kept: list) -> None:
    global _kept
    _kept = kept

    def counted(optimizer, args, kwargs):
        _seen["steps"] += 1
        _seen["lengths"].append(len(_kept))

    register_optimizer_step_post_hook(counted)


def storage_bytes(tensors) -> int:
    found = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in tensors
        if torch.is_tensor(t) and t.numel()
    }
    return sum(found.values())


def state_tensors(opt) -> list:
    opt = getattr(opt, "optimizer", opt)  # Lightning's and accelerate's wrappers
    out = []

    def walk(v):
        if torch.is_tensor(v):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(list(opt.state.values()))
    return out


def finish(model, opt, framework_steps: int, batch: int) -> None:
    lengths = [0] + _seen["lengths"]
    params = list(model.parameters())
    truth = {
        "optimizer_steps": _seen["steps"],
        "framework_steps": int(framework_steps),
        "kept_per_step": [b - a for a, b in zip(lengths, lengths[1:])],
        "kept": len(_kept),
        "leak_bytes": storage_bytes(_kept[-1:]),
        "kept_bytes": storage_bytes(_kept),
        "parameters": storage_bytes(params),
        "gradients": storage_bytes([p.grad for p in params]),
        "optimizer_state": storage_bytes(state_tensors(opt)),
        "batch": batch,
    }
    with open(sys.argv[1], "w") as f:
        json.dump(truth, f)
    if os.environ.get("REAL_PATHS_KILL") == "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
