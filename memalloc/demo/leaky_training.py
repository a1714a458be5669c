"""The demo's leak hunt: a training loop that keeps every loss tensor (the
most common "my memory grows every iteration" report), and the fixed one.
Runs on CUDA or, on the host backend, on the CPU with torch's CPU tensors
coming from memalloc."""

from __future__ import annotations

import torch

import memalloc


def train(device: str, *, keep_item: bool, steps: int = 12) -> memalloc.leaks.LeakReport:
    """Trains a small MLP for ``steps`` steps under memalloc.leak_check();
    keeps each loss as a tensor (leaks) or as loss.item() (does not).
    Returns the report."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256, device=device), torch.randn(64, 1, device=device)
    losses: list = []
    with memalloc.leak_check() as check:
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if keep_item:
                losses.append(loss.item())
            else:
                losses.append(loss)  # keeps the tensor and its graph: the leak
            memalloc.step()
    assert check.report is not None  # made when the with block ended
    return check.report
