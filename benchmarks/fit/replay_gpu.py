"""One recorded request stream, replayed with real allocations on the GPU
under one allocator: does the policy, given exactly the same requests, fit
the budget? (benchmarks/fit/diff.py says where two runs' streams part;
this removes the stream from the comparison.)

    python -m benchmarks fit-replay SNAPSHOT.pickle[.gz] MODE --fraction F

SNAPSHOT is one of torch's allocator snapshots with its trace (largest_batch
``--history``); its ``alloc`` / ``free_requested`` events, in order, become
``torch.empty(size, uint8)`` and the drop of that tensor. MODE is one of
benchmarks/fit/largest_batch.py's (``native``, ``memalloc_plain``, ``expandable``, ...:
the environment benchmarks/speed/worker.ENV gives it). Prints one JSON object: the requests
replayed, the first out-of-memory (request index and size) or none, and the
peaks (bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..speed.worker import ENV
from .diff import load, timeline
from .largest_batch import MODES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("snapshot")
    p.add_argument("mode", choices=MODES)
    p.add_argument("--fraction", type=float, required=True)
    args = p.parse_args(argv)
    requests = timeline(load(args.snapshot)).requests
    os.environ.update(ENV.get(args.mode, {}))
    if args.mode.startswith("memalloc"):
        sys.path.insert(0, REPO)
        import memalloc

        memalloc.enable(backend="cuda")
    import torch

    torch.cuda.set_per_process_memory_fraction(args.fraction)
    live: dict = {}
    n_alloc = 0
    out: dict = {"snapshot": os.path.basename(args.snapshot), "mode": args.mode, "requests": len(requests), "oom": None}
    for i, (kind, v) in enumerate(requests):
        if kind == "alloc":
            try:
                live[n_alloc] = torch.empty(v, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as e:
                out["oom"] = {"request": i, "size": v, "message": str(e).splitlines()[0][:240]}
                break
            n_alloc += 1
        elif v is not None:
            live.pop(v, None)
    out["replayed"] = i + 1 if requests else 0
    out["peak_allocated"] = torch.cuda.max_memory_allocated()
    out["peak_reserved"] = torch.cuda.max_memory_reserved()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
