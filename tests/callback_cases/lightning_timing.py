"""Step time of a Lightning run with and without memalloc's MemoryMonitor
(tests/gpu/test_cuda_callback_cost.py). Arguments: OUT (the logger's root),
WITH (1: MemoryMonitor in the callbacks; 0: not), STEPS, DEVICE (host |
cuda). Both modes run under memalloc.enable(), so the difference is the
callback's alone (its trackers, its step boundaries, the flight recorder and
run page it adds). A transformer encoder in bf16 autocast with AdamW; a
callback of the script's own times each step, from one batch's start to the
next's (device synchronised there). Prints RESULT <json>: the steps' seconds."""

import json
import sys
import time

import case_common

OUT, WITH, STEPS, DEVICE = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
case_common.enable(DEVICE)

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from memalloc.integrations.lightning import MemoryMonitor  # noqa: E402

WIDTH, LAYERS, BATCH, LENGTH = (1024, 8, 16, 512) if DEVICE == "cuda" else (64, 2, 4, 32)


class Timer(L.Callback):
    """A step's time: from its batch's start to the next batch's start (the
    device synchronised at each), so every callback's work at the step's end,
    MemoryMonitor's included, is inside it whatever the callbacks' order."""

    def __init__(self):
        self.times, self._t = [], None

    def _mark(self):
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self._t is not None:
            self.times.append(now - self._t)
        self._t = now

    def on_train_batch_start(self, trainer, module, batch, i):
        self._mark()

    def on_train_end(self, trainer, module):
        self._mark()


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(WIDTH, 16 if DEVICE == "cuda" else 4, 4 * WIDTH, batch_first=True)
        self.net = torch.nn.TransformerEncoder(layer, LAYERS)

    def training_step(self, batch, i):
        (x,) = batch
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return self.net(x).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


torch.manual_seed(0)
timer = Timer()
trainer = L.Trainer(
    max_steps=STEPS,
    accelerator="gpu" if DEVICE == "cuda" else "cpu",
    devices=1,
    logger=CSVLogger(OUT),
    log_every_n_steps=1,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[timer, *([MemoryMonitor()] if WITH else [])],
)
data = torch.utils.data.TensorDataset(torch.randn(BATCH * STEPS, LENGTH, WIDTH))
trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=BATCH))
print("RESULT", json.dumps({"times": timer.times}))
