"""Lightning's Trainer with memalloc's MemoryMonitor (tests/integration/test_callbacks.py,
tests/gpu/test_cuda_callbacks.py). Arguments: OUT (the logger's root), MODE
(automatic | manual), LOGGER (csv | tensorboard), WHAT (clean | leak | oom),
DEVICE (host | cuda). Two callbacks of the test's own record the truths at the
moment MemoryMonitor reads its figures: Truth (before it) reads the queries and
sums the optimizer's state tensors; ResetPeaks (after it) resets the peaks, so
the next step's peak counts from the step's boundary. Prints RESULT <json>."""

import json
import sys
import warnings

import case_common

OUT, MODE, LOGGER, WHAT, DEVICE = sys.argv[1:6]
Q = case_common.enable(DEVICE)  # the queries the figures must equal

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger  # noqa: E402

from memalloc.integrations.lightning import MemoryMonitor  # noqa: E402

STEPS = 12
kept = []


class Truth(L.Callback):
    def __init__(self):
        self.rows = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        self.rows[trainer.fit_loop.epoch_loop._batches_that_stepped] = {
            "allocated": Q.memory_allocated(),
            "reserved": Q.memory_reserved(),
            "peak_allocated": Q.max_memory_allocated(),
            "peak_reserved": Q.max_memory_reserved(),
            "optimizer_state": case_common.optimizer_state_bytes(trainer.optimizers[0], DEVICE),
        }


class ResetPeaks(L.Callback):
    def on_train_start(self, trainer, module):
        Q.reset_peak_memory_stats()

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        Q.reset_peak_memory_stats()


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = MODE == "automatic"
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        if WHAT == "leak":
            kept.append(loss)  # LEAK-LINE
        if WHAT == "oom" and i == 3:
            torch.empty(1 << 42, dtype=torch.uint8, device=x.device)  # OOM-LINE
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


torch.manual_seed(0)
truth = Truth()
monitor = MemoryMonitor()
logger = CSVLogger(OUT) if LOGGER == "csv" else TensorBoardLogger(OUT)
trainer = L.Trainer(
    max_steps=STEPS,
    accelerator="gpu" if DEVICE == "cuda" else "cpu",
    devices=1,
    logger=logger,
    log_every_n_steps=1,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[truth, monitor, ResetPeaks()],
)
data = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randn(512, 16))
error = None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=32))
    except torch.OutOfMemoryError as e:
        error = str(e)
R = {
    "truth": truth.rows,
    "log_dir": logger.log_dir,
    "warnings": [str(w.message) for w in caught if "memalloc" in str(w.message)],
    "error": error,
    "lines": case_common.tagged_lines(__file__, ("# LEAK-LINE", "# OOM-LINE")),
}
print("RESULT", json.dumps(R))
