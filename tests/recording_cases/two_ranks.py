"""Two ranks on the CPU (gloo) under ``torchrun -m memalloc run``, for
tests/integration/test_flight_recorder.py: rank 0 keeps a 16 KiB tensor
every step (a leak), rank 1 holds 1 MiB more from the start. With the
argument ``cuda`` (tests/gpu/test_cuda_flight.py) both ranks keep their
tensors on the one GPU, with ``cuda_per_rank`` each on its own
(tests/gpu/test_cuda_distributed.py); the all-reduce stays on the CPU
(gloo)."""

import sys

import torch
import torch.distributed as dist

import memalloc

dist.init_process_group("gloo")
rank = dist.get_rank()
device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
if device == "cuda_per_rank":  # one GPU per rank (tests/gpu/test_cuda_distributed.py)
    device = f"cuda:{rank}"
    torch.cuda.set_device(device)
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
