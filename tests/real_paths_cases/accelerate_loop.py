"""An accelerate loop (real-paths case): an MLP with AdamW prepared by
``Accelerator(cpu=True, gradient_accumulation_steps=2)``, the loop under
``accelerator.accumulate`` calling ``opt.step()`` on every micro-batch (the
prepared optimizer steps only on every second one); each micro-batch keeps
one 64 KiB tensor in a list (the planted leak). First argument: where
truth.py writes what the script knows of itself; second: the batch size
(default 16)."""

import sys

import truth

truth.enable_if_asked()

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

STEPS = 6
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
kept = []
torch.manual_seed(0)
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(2 * STEPS * batch, 64), torch.randn(2 * STEPS * batch, 16))
model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=batch))
truth.start(kept)
taken = 0
for x, y in loader:
    with accelerator.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        kept.append(torch.ones(16384))  # LEAK-LINE
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        taken += accelerator.sync_gradients
truth.finish(model, opt, taken, batch)
