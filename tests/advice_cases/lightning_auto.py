"""The model of plain.py trained by Lightning's automatic optimization (its
training_step returns the loss; Lightning calls optimizer.step(closure)),
with each of the advisor's strategies as Lightning does it, for
tests/integration/test_real_paths_advice_applied.py:

    --batch 16 (half the batch), --micro 2 (accumulate_grad_batches=2, each
    batch of the loader half as large: the same samples per optimizer step), --checkpoint (the
    repeated blocks under torch.utils.checkpoint), --autocast bf16
    (precision="bf16-mixed": torch.autocast on the CPU), --autocast fp16
    (Lightning's MixedPrecision plugin, fp16 on the CPU with a GradScaler:
    precision="16-mixed" alone turns into bf16 there), --empty-cache
    (memalloc.memory.empty_cache() at the end of every training batch: Lightning
    has dropped the step's outputs by then)

OUT.json gets what the run measured over the optimizer steps after the
first two: peak allocated and peak reserved, and reserved after the last
step."""

from __future__ import annotations

import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # plain_model.py, strategies.py
import lightning as L  # noqa: E402
from plain_model import CLASSES, TOKENS, WIDTH, Net  # noqa: E402
from strategies import parser, write_measurement  # noqa: E402

import memalloc  # noqa: E402

p = parser(batch=32, steps=5)
p.add_argument("--checkpoint", action="store_true")
args = p.parse_args()
warnings.filterwarnings("ignore")
torch.set_num_threads(1)  # two cores shared: one thread is ten times faster than two


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net(checkpoint=args.checkpoint)

    def training_step(self, batch, i):
        x, y = batch
        logits = self.net(x)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Measure(L.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        if args.empty_cache:
            memalloc.memory.empty_cache()
        if trainer.global_step == 2 and (i + 1) % args.micro == 0:  # after the second optimizer step
            memalloc.memory.reset_peak_memory_stats()

    def on_train_end(self, trainer, module):
        write_measurement(args.out, optimizer_steps=trainer.global_step)


torch.manual_seed(0)
module = Module()
samples = 32 * args.steps  # the baseline's samples, whatever the batch (a data set does not shrink with it)
data = torch.utils.data.TensorDataset(torch.randn(samples, TOKENS, WIDTH), torch.randint(0, CLASSES, (samples, TOKENS)))
plugins = []
if args.autocast == "fp16":
    from lightning.pytorch.plugins import MixedPrecision

    plugins.append(MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu")))
trainer = L.Trainer(
    max_steps=args.steps,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    accumulate_grad_batches=args.micro,
    precision="bf16-mixed" if args.autocast == "bf16" else None,
    plugins=plugins,
    callbacks=[Measure()],
)
trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=args.batch // args.micro))
