"""Two ranks on the CPU (gloo) under ``torchrun -m memalloc run``, for
tests/integration/test_flight_recorder.py: rank 0 keeps a 16 KiB tensor
every step (a leak), rank 1 holds 1 MiB more from the start. With the
argument ``cuda`` (tests/gpu/test_cuda_flight.py) both ranks keep their
tensors on the one GPU; the all-reduce stays on the CPU (gloo)."""
import sys

import torch
import torch.distributed as dist

import memalloc

dist.init_process_group("gloo")
rank = dist.get_rank()
device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
big = torch.ones(256 * 1024, device=device) if rank == 1 else None  # HOLD-LINE
kept = []
for step in range(8):
    x = torch.ones(4096)
    dist.all_reduce(x)
    x = x.to(device)
    if rank == 0:
        kept.append(x.clone())  # LEAK-LINE
    memalloc.step()
dist.destroy_process_group()
