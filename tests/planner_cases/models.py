"""Training steps of three kinds of model for the batch planner's tests, on
CPU tensors (which tests route to a host-backend allocator with
memalloc.host.cpu_tensors_from): a pre-norm transformer encoder, a small
CNN with batch norm, and a transformers GPT-2 built from a config. Each
``make_*()`` builds a fresh model and optimizer and returns ``step(batch)``,
one AdamW step at that batch size (inputs made inside the step)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Step = Callable[[int], None]


def optimize(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """The end of every step here: gradients set to None, backward, step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def make_transformer() -> Step:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.AdamW(model.parameters())

    def step(b: int) -> None:
        optimize(opt, model(torch.randn(b, 64, 128)).square().mean())

    return step


def make_cnn() -> Step:
    torch.manual_seed(0)

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)
        )

    model = nn.Sequential(block(3, 16), block(16, 32), block(32, 64), nn.Flatten(), nn.Linear(64 * 4 * 4, 10))
    opt = torch.optim.AdamW(model.parameters())

    def step(b: int) -> None:
        optimize(opt, nn.functional.cross_entropy(model(torch.randn(b, 3, 32, 32)), torch.randint(0, 10, (b,))))

    return step


def make_wide_cnn() -> Step:
    """Issue 37, item 5's CNN: 3 conv (with bias) + batch norm, 48 channels
    wide, AdamW; on a 100 MiB device the batch planner planned one that ran
    out of memory in a later step than its probes' (fragmentation)."""
    torch.manual_seed(0)

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    model = nn.Sequential(block(3, 48), block(48, 96), block(96, 192), nn.Flatten(), nn.Linear(192 * 4 * 4, 10))
    opt = torch.optim.AdamW(model.parameters())

    def step(b: int) -> None:
        optimize(opt, nn.functional.cross_entropy(model(torch.randn(b, 3, 32, 32)), torch.randint(0, 10, (b,))))

    return step


def make_gpt2() -> Step:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters())

    def step(b: int) -> None:
        ids = torch.randint(0, 1000, (b, 64))
        optimize(opt, model(input_ids=ids, labels=ids).loss)

    return step


def make_leaky_mlp() -> Step:
    """An MLP whose step keeps its output (1 KiB per sample) in a list that
    grows every step: a leak the planner cannot plan away."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters())
    kept = []

    def step(b: int) -> None:
        out = model(torch.randn(b, 256))
        kept.append(out.detach().clone())  # the leak
        optimize(opt, out.square().mean())

    return step


MODELS = {
    "transformer": make_transformer,
    "cnn": make_cnn,
    "wide_cnn": make_wide_cnn,
    "gpt2": make_gpt2,
    "leaky_mlp": make_leaky_mlp,
}
