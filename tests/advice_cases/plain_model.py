"""The model of the advice cases (plain.py, lightning_auto.py): a residual
MLP over tokens, 4 pre-norm blocks in an nn.Sequential (the repeated blocks
the advisor finds), optionally each under torch.utils.checkpoint."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

TOKENS, WIDTH, CLASSES = 32, 128, 256


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, checkpoint: bool = False) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.Sequential(*(Block(WIDTH) for _ in range(4)))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpoint else block(x)
        return self.head(x)
