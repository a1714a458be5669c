"""A planner case in a fresh interpreter, as a user runs it: memalloc
enabled on the host backend with a capacity, torch's CPU tensors routed to
it (memalloc.host.use_for_cpu_tensors), a fresh model of models.py.

    python fresh_run.py plan MODEL CAPACITY_MB [hook]    -> {"batch": planned, "seconds", "steady", "repeats"}
    python fresh_run.py trial MODEL CAPACITY_MB BATCH N  -> {"fits": bool, "oom_step": i or None}

A trial trains N steps at BATCH and says whether (and in which step) it ran
out of memory. ``hook``: a global forward pre-hook that takes itself off in
the first forward is registered before the plan (as the memory breakdown's
first-forward hook is)."""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)


def main(argv: list[str]) -> dict:
    import torch
    from models import MODELS

    import memalloc

    mode, model, capacity = argv[0], argv[1], int(argv[2])
    memalloc.enable(backend="host", config=f"host_capacity_mb:{capacity}")
    memalloc.host.use_for_cpu_tensors()
    step = MODELS[model]()
    if mode == "plan":
        if argv[3:] == ["hook"]:
            handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: handle.remove())
        t0 = time.perf_counter()
        p = memalloc.largest_batch(step)
        return {"batch": p.batch, "seconds": time.perf_counter() - t0, "steady": p.steady, "repeats": p.repeats}
    batch, steps = int(argv[3]), int(argv[4])
    for i in range(steps):
        try:
            step(batch)
        except torch.OutOfMemoryError:
            return {"fits": False, "oom_step": i}
    return {"fits": True, "oom_step": None}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
