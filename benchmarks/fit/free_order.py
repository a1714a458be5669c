"""Why two runs of one script free the same tensors in another order: a
small pre-norm transformer, two AdamW steps under CPU bf16 autocast, its
tensors on a host-backend allocator (no memalloc.enable(), no hooks), the
allocator's events recorded; each process prints its requests in order
(``["alloc", size]``, ``["free", k]`` the free of the k-th allocation:
benchmarks/fit/diff.py's requests).

    python -m benchmarks free-order --runs 4 [--perturb 0,0,5000,20011]

runs that many fresh processes (each moving the host heap by ``perturb``
small objects first) and prints, for each, the first request where it parts
from the first process. On this machine two identical processes already
part right after the first forward: the bf16 copies of the parameters that
autocast caches are freed when its cache is cleared, in the order of a hash
map keyed by host addresses, so the order follows the host heap (address
randomisation, or a library that allocates, such as memalloc). That is the
difference between memalloc's plain mode and native on the fit benchmark
(docs/results.md, "37 against 38").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .diff import timeline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker(perturb: int) -> list:
    import torch
    from torch import nn

    sys.path.insert(0, REPO)
    from memalloc import _C
    from memalloc.install import host
    from memalloc.trace import recording

    torch.set_num_threads(1)
    junk = [bytearray(37 * (i % 13 + 1)) for i in range(perturb)]  # moves the host heap, nothing else  # noqa: F841
    a = _C.Allocator("host", "host_capacity_mb:8192")
    with host.cpu_tensors_from(a):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True, norm_first=True)
        model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        opt = torch.optim.AdamW(model.parameters())
        recording.record_history(max_entries=1_000_000, stacks="none", allocator=a)
        for n in (64, 128):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(4, n, 128)).float().square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        events = recording.events(0, allocator=a)
        recording.record_history(enabled=False, allocator=a)
    # as benchmarks/fit/diff.py reads torch's snapshots: the same requests
    trace = [{"action": e.action, "addr": e.addr, "size": e.size} for e in events]
    return [list(r) for r in timeline({"device_traces": [trace]}).requests]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--perturb", default="", help="comma-separated, one per run (default 0)")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker)))
        return 0
    perturbs = [int(x) for x in args.perturb.split(",") if x] or [0] * args.runs
    seqs = []
    for n in perturbs:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.fit.free_order", "--worker", str(n)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        seqs.append(json.loads(out.strip().splitlines()[-1]))
    for i, (n, s) in enumerate(zip(perturbs, seqs)):
        d = next((j for j, (x, y) in enumerate(zip(seqs[0], s)) if x != y), None)
        print(
            json.dumps(
                {
                    "run": i,
                    "perturb": n,
                    "requests": len(s),
                    "first_difference": d,
                    "requests_there": s[d : d + 4] if d is not None else None,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
