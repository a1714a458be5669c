"""GPU parity workloads: ``python tests/gpu/parity.py NAME {native|memalloc}``
prints one JSON object (the last line) with torch's own memory queries
sampled after every step. Under memalloc the queries are torch.cuda's,
patched to answer from memalloc; under native they are torch's. The test
(tests/gpu/test_parity.py) compares the two processes' series.
"""

from __future__ import annotations

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import torch  # noqa: E402

import memalloc  # noqa: E402


def sample() -> dict:
    return {
        "allocated": torch.cuda.memory_allocated(),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
    }


def transformer(steps: int = 6) -> list:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 512, 768, device="cuda")
    out = []
    for i in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=i % 2 == 1):
            loss = model(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        out.append(sample())
    return out


def resnet50(steps: int = 5) -> list:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (32,), device="cuda")
    out = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        out.append(sample())
    return out


def random_workload(n: int = 6000, every: int = 500) -> list:
    sys.path.insert(0, REPO)
    from benchmarks.speed.worker import random_plan

    sizes, victims, live = random_plan(n_allocs=n)
    slots = [None] * live
    out = []
    for i, (size, victim) in enumerate(zip(sizes, victims), 1):
        slots[victim] = None
        slots[victim] = torch.empty(size, dtype=torch.uint8, device="cuda")
        if i % every == 0:
            out.append(sample())
    return out


def lightning_stats() -> dict:
    """Lightning's DeviceStatsMonitor logs torch.cuda.memory_stats under memalloc."""
    import tempfile

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import DeviceStatsMonitor
    from lightning.pytorch.loggers import CSVLogger

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    with tempfile.TemporaryDirectory() as d:
        trainer = pl.Trainer(
            accelerator="gpu",
            devices=1,
            max_steps=4,
            logger=CSVLogger(d, name="m"),
            callbacks=[DeviceStatsMonitor()],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            log_every_n_steps=1,
        )
        trainer.fit(Tiny(), loader)
        import csv
        import glob

        rows = list(csv.DictReader(open(glob.glob(os.path.join(d, "m", "*", "metrics.csv"))[0])))
    keys = sorted({k for r in rows for k, v in r.items() if v and "allocated_bytes.all.current" in k})
    values = [int(float(r[k])) for r in rows for k in keys if r.get(k)]
    return {"keys": keys, "values": values, "memalloc_peak": memalloc.memory.max_memory_allocated()}


WORKLOADS = {"transformer": transformer, "resnet50": resnet50, "random": random_workload}

if __name__ == "__main__":
    name, mode = sys.argv[1], sys.argv[2]
    if mode == "memalloc":
        # parity with native's default policy: memalloc's plain segments
        # (its own default, expandable segments, lays memory out otherwise)
        memalloc.enable(backend="cuda", config="expandable_segments:False")
    if name == "lightning":
        print(json.dumps(lightning_stats()))
    else:
        # patched: whether torch.cuda's queries were monkeypatched (never on CUDA now:
        # torch's own functions answer through memalloc's getDeviceStats).
        print(json.dumps({"samples": WORKLOADS[name](), "patched": memalloc.install._torch_patch.is_patched()}))
