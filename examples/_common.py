"""What every strategy script shares: the two models of the guide's table,
the data, the timing, and the result line. Each script in this folder is one
strategy; it builds a model here, writes its own training step (the part
the strategy changes), and calls :func:`run`.

Models (``--model``):

- ``transformer``: a 12-layer, 768-wide pre-norm encoder (85 M parameters),
  batch 16 x 512 tokens, AdamW, fp32 (the step benchmarks/speed/worker.py
  times);
- ``resnet50``: torchvision's ResNet-50, batch 64 at 224 x 224, SGD with
  momentum, fp32;
- ``tiny``: a 4-layer, 64-wide encoder, batch 8 x 32: runs on a CPU in a
  second (the tests run every script with it on memalloc's host backend).

A script runs ``--steps`` steps after ``--warmup`` steps; it prints one line
``RESULT {json}``: peak allocated and peak reserved bytes over the measured
steps, reserved bytes after the last one, the median step time (ms), and
memalloc's split of the peak by category (memalloc.memory_breakdown). Every
script runs under memalloc (memalloc.enable(): CUDA when a GPU is usable,
else the host backend with torch's CPU tensors on it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import memalloc  # noqa: E402

MODELS = ("transformer", "resnet50", "tiny")


@dataclass
class Workload:
    """A model, its optimizer, one batch (inputs, targets) and its loss."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    blocks: list[nn.Module]  # the repeated blocks (what checkpointing wraps)
    device: torch.device

    @property
    def batch(self) -> int:
        return self.inputs.shape[0]

    def forward(self, x: torch.Tensor, checkpoint: bool = False) -> torch.Tensor:
        """The model's forward; with ``checkpoint``, each repeated block under
        torch.utils.checkpoint (non-reentrant): its activations are dropped
        after the forward and recomputed during backward."""
        if not checkpoint:
            return self.model(x)
        return _forward_checkpointed(self, x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, checkpoint: bool = False) -> torch.Tensor:
        return self.loss_fn(self.forward(x, checkpoint), y)


class Encoder(nn.Module):
    """A pre-norm transformer encoder with a regression head."""

    def __init__(self, layers: int, width: int, heads: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.1, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def _forward_checkpointed(w: Workload, x: torch.Tensor) -> torch.Tensor:
    m = w.model
    if isinstance(m, Encoder):
        for layer in m.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        return m.norm(x)
    # ResNet-50: the stem, then every bottleneck block checkpointed, then the head.
    x = m.maxpool(m.relu(m.bn1(m.conv1(x))))
    for block in w.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    return m.fc(torch.flatten(m.avgpool(x), 1))


def build(name: str, batch_scale: float = 1.0, device: torch.device | None = None) -> Workload:
    """The workload ``name`` with its batch multiplied by ``batch_scale``."""
    if device is None:
        device = torch.device("cuda" if memalloc.enabled_backend() == "cuda" else "cpu")
    torch.manual_seed(0)
    if name in ("transformer", "tiny"):
        layers, width, heads, batch, tokens = (12, 768, 12, 16, 512) if name == "transformer" else (4, 64, 4, 8, 32)
        model = Encoder(layers, width, heads).to(device)
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        b = max(1, round(batch * batch_scale))
        x = torch.randn(b, tokens, width, device=device)
        y = torch.randn(b, tokens, width, device=device)
        return Workload(name, model, opt, x, y, nn.functional.mse_loss, list(model.layers), device)
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        b = max(1, round(64 * batch_scale))
        x = torch.randn(b, 3, 224, 224, device=device)
        y = torch.randint(0, 1000, (b,), device=device)
        blocks = [blk for stage in (model.layer1, model.layer2, model.layer3, model.layer4) for blk in stage]
        return Workload(name, model, opt, x, y, nn.functional.cross_entropy, blocks, device)
    raise SystemExit(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="transformer", choices=MODELS)
    p.add_argument("--steps", type=int, default=8, help="measured steps")
    p.add_argument("--warmup", type=int, default=3, help="steps before measuring")
    if extra is not None:
        extra(p)
    return p.parse_args()


def enable() -> str:
    """memalloc on CUDA when a GPU is usable, else on the host backend with
    torch's CPU tensors on it (so the breakdown sees a CPU run too)."""
    backend = memalloc.enable()
    if backend == "host":
        memalloc.host.use_for_cpu_tensors()
    return backend


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(
    strategy: str,
    w: Workload,
    step: Callable[[], Any],
    args: argparse.Namespace,
    samples_per_step: int | None = None,
    quiet: bool = False,
    **extra: Any,
) -> dict:
    """Runs ``step`` ``args.warmup`` times, then ``args.steps`` timed times;
    returns the result (bytes, ms) and prints it unless ``quiet``."""
    device = w.device.index if w.device.type == "cuda" else None
    for _ in range(args.warmup):
        step()
    _sync(w.device)
    memalloc.memory.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        _sync(w.device)
        times.append((time.perf_counter() - t0) * 1e3)
    b = memalloc.memory_breakdown(device)
    result = {
        "strategy": strategy,
        "model": w.name,
        "backend": memalloc.enabled_backend(),
        "batch": w.batch,
        "samples_per_step": samples_per_step or w.batch,
        "steps": args.steps,
        "peak_allocated": memalloc.memory.max_memory_allocated(device),
        "peak_reserved": memalloc.memory.max_memory_reserved(device),
        "reserved_after": memalloc.memory.memory_reserved(device),
        "step_ms": sorted(times)[len(times) // 2],
        "breakdown_at_peak": b.peak,
        "breakdown_step": b.peak_step,
        **extra,
    }
    if not quiet:
        print("RESULT " + json.dumps(result), flush=True)
    return result
