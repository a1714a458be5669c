"""A plain PyTorch loop (real-paths case): an MLP trained with Adam for
STEPS steps at the batch size given as the second argument (default 16),
keeping one 64 KiB tensor per step in a list (the planted leak; not with a
third argument ``no-leak``). First argument: where truth.py writes what the
script knows of itself."""

import sys

import truth

truth.enable_if_asked()

import torch  # noqa: E402

STEPS = 6
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
leak = sys.argv[3:] != ["no-leak"]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
kept = []
truth.start(kept)
for step in range(STEPS):
    x, y = torch.randn(batch, 64), torch.randn(batch, 16)
    loss = torch.nn.functional.mse_loss(model(x), y)
    if leak:
        kept.append(torch.ones(16384))  # LEAK-LINE
    opt.zero_grad()
    loss.backward()
    opt.step()
truth.finish(model, opt, STEPS, batch)
