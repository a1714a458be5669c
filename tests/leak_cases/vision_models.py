"""Leaks and a clean loop on vision models (torchvision ResNet-18, timm
ViT), with image and batch sizes drawn per step, for the GPU suite
(tests/gpu/test_cuda_leaks_real_models.py): torchvision and timm install
only beside a CUDA torch. Each case returns ``(check, truth)`` as in
real_models.py, whose truth helpers, device and step count it shares; the
keeping lines are marked ``# LEAK:<case>``.
"""

from __future__ import annotations

import random

import real_models
import torch
from real_models import STEPS, freed_by_clearing, truth_of

import memalloc

SIZES = (64, 80, 96)  # image sides (pixels); a batch stays under 1 MiB (the small pool's blocks)
BATCHES = (2, 4)


def _images(seed: int, sizes=SIZES, batches=BATCHES):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        side, n = rng.choice(sizes), rng.choice(batches)
        x = torch.randn(n, 3, side, side, generator=g).to(real_models.DEVICE)
        y = torch.randint(0, 10, (n,), generator=g).to(real_models.DEVICE)
        yield x, y


def _resnet18():
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10).to(real_models.DEVICE)
    return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)


def _vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=96).to(
        real_models.DEVICE
    )


def _train_step(m, opt, x, y) -> torch.Tensor:
    """One step of cross-entropy training; the loss."""
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def resnet18_inputs_kept(allocator=None):
    """ResNet-18 trained with image and batch sizes varying, the loop
    keeping every input batch (a data-side list of device tensors)."""
    m, opt = _resnet18()
    seen = []
    with memalloc.leak_check(allocator=allocator) as check:
        for x, y in _images(1):
            seen.append(x)  # LEAK:resnet18_inputs_kept
            _train_step(m, opt, x, y)
            memalloc.step()
    return check, {"seen": truth_of(seen, STEPS)}


def resnet18_hook_keeps_features(allocator=None):
    """ResNet-18 with a forward hook on layer3 storing its output, detached,
    on every call."""
    m, opt = _resnet18()
    features = []

    def keep(module, args, output):
        features.append(output.detach())  # LEAK:resnet18_hook_keeps_features

    handle = m.layer3.register_forward_hook(keep)
    with memalloc.leak_check(allocator=allocator) as check:
        for x, y in _images(2):
            _train_step(m, opt, x, y)
            memalloc.step()
    handle.remove()
    return check, {"features": truth_of(features, STEPS)}


def vit_eval_without_no_grad(allocator=None):
    """A timm ViT (96-pixel images: its position embedding fixes the side)
    evaluated without torch.no_grad() on batches of varying sizes, keeping
    each batch's logits: each keeps its graph and what it saved (attention's
    outputs and statistics included)."""
    m = _vit().eval()
    logits = []
    with memalloc.leak_check(allocator=allocator) as check:
        for x, _ in _images(3, sizes=(96,)):
            logits.append(m(x))  # LEAK:vit_eval_without_no_grad
            memalloc.step()
    return check, {"logits": freed_by_clearing(logits, allocator, len(logits), STEPS)}


def resnet18_clean(allocator=None):
    """ResNet-18 trained with image and batch sizes varying (the cache warms
    up over new shapes), keeping only floats."""
    m, opt = _resnet18()
    losses = []
    with memalloc.leak_check(allocator=allocator) as check:
        for x, y in _images(4):
            losses.append(_train_step(m, opt, x, y).item())
            memalloc.step()
    return check, {}


LEAKS = [resnet18_inputs_kept, resnet18_hook_keeps_features, vit_eval_without_no_grad]
CLEAN = [resnet18_clean]
CAUSES = {
    "resnet18_inputs_kept": {"seen": "container"},
    "resnet18_hook_keeps_features": {"features": "hook_storage"},
    "vit_eval_without_no_grad": {"logits": "no_grad_eval"},
}
GRAPH_CASES = {"vit_eval_without_no_grad"}
