"""Two ranks on the CPU (gloo) under ``torchrun -m memalloc run``, for
tests/integration/test_flight_recorder.py: rank 0 keeps a 16 KiB tensor
every step (a leak), rank 1 holds 1 MiB more from the start."""
import torch
import torch.distributed as dist

import memalloc

dist.init_process_group("gloo")
rank = dist.get_rank()
big = torch.ones(256 * 1024) if rank == 1 else None  # HOLD-LINE
kept = []
for step in range(8):
    x = torch.ones(4096)
    dist.all_reduce(x)
    if rank == 0:
        kept.append(x.clone())  # LEAK-LINE
    memalloc.step()
dist.destroy_process_group()
