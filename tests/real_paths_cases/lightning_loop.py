"""Lightning's Trainer (real-paths case), with automatic optimization
(second argument ``automatic``: training_step returns the loss, Lightning
runs it in the closure it gives Adam, two batches accumulated per optimizer
step) or manual optimization (``manual``: manual_backward, then
``opt.step()``). training_step keeps one 64 KiB tensor per call in a list
(the planted leak). First argument: where truth.py writes what the script
knows of itself."""

import sys

import truth

truth.enable_if_asked()

import lightning as L  # noqa: E402
import torch  # noqa: E402

STEPS = 6
AUTOMATIC = sys.argv[2] == "automatic"
kept = []


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = AUTOMATIC
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        kept.append(torch.ones(16384))  # LEAK-LINE
        if AUTOMATIC:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


torch.manual_seed(0)
module = Module()
data = torch.utils.data.TensorDataset(torch.randn(256, 64), torch.randn(256, 16))
trainer = L.Trainer(
    max_steps=STEPS,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    accumulate_grad_batches=2 if AUTOMATIC else 1,
)
truth.start(kept)
trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=16))
truth.finish(module, trainer.optimizers[0], trainer.global_step, 16)
