"""The breakdown on the paths users walk (issue 37, item 1): the optimizer
driven by the frameworks' own loops on the host backend (CPU tensors from
the simulated device: memalloc.host.use_for_cpu_tensors), each in a fresh
interpreter under ``memalloc.enable()``. After training, the breakdown's
``optimizer_state`` and ``parameters`` must be what the optimizer's state
and the model hold, to the byte: the truth is read off the optimizer and
the model by the test (the distinct storages of their tensors), not off
memalloc.

The loops: a plain ``opt.step(closure)`` with Adam (zero_grad inside the
closure), LBFGS (several closure evaluations per step), a closure step
after a backward (two micro-batches), Lightning's automatic optimization
(its closure runs training_step and backward inside ``optimizer.step``;
with ``accumulate_grad_batches=2`` after the first micro-batch's
backward) and manual optimization (``manual_backward`` then
``opt.step()``, which Lightning gives a do-nothing closure), HF Trainer and
accelerate (``AcceleratedOptimizer`` around AdamW)."""

from __future__ import annotations

import pytest
from memtest_helpers import require_library

PRELUDE = """
import torch, memalloc
memalloc.enable(backend="host", config="host_capacity_mb:1024")
memalloc.host.use_for_cpu_tensors()
from memalloc.trace import sites
torch.manual_seed(0)

def storages(tensors):
    # {storage pointer: bytes} of the distinct storages of tensors (each must
    # start a live block of the allocator: the allocator holds it).
    found = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
             if torch.is_tensor(t) and t.numel()}
    blocks = {blk[0] for blk in sites.live_blocks(0)}
    assert set(found) <= blocks, "a storage the allocator holds no block at"
    return found

import sys
sys.path.insert(0, "tests/real_paths_cases")  # the interpreter starts in the repository
from truth import state_tensors  # the optimizer's state tensors, as the run matrix reads them

def finish(model, opt):
    inner = getattr(opt, "optimizer", opt)  # accelerate's and Lightning's wrappers
    params = storages(list(model.parameters()))
    state = storages(state_tensors(inner))
    b = memalloc.memory_breakdown()
    R.update(now=b.now, params=sum(params.values()), state=sum(state.values()),
             shared=len(set(params) & set(state)), n_state=len(state))
    memalloc.installed_allocator().validate()
"""

MLP = """
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
x, y = torch.randn(512, 64), torch.randn(512, 16)
"""

CLOSURE = """
def closure():
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss
"""

# A LightningModule trained 4 steps by Lightning's Trainer; the two cases
# differ in automatic_optimization and training_step.
LIGHTNING = """
import lightning as L

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = {automatic}
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))

    def training_step(self, batch, i):{training_step}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

module = Module()
data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 16))
trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=16))
finish(module, trainer.optimizers[0])
"""

CASES = {
    "adam_closure": MLP
    + """
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
"""
    + CLOSURE
    + """for _ in range(3):
    opt.step(closure)
finish(model, opt)
""",
    "adam_closure_keyword": MLP
    + """
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
"""
    + CLOSURE
    + """for _ in range(3):
    opt.step(closure=closure)
finish(model, opt)
""",
    "lbfgs": MLP
    + """
opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4, history_size=3)
"""
    + CLOSURE
    + """for _ in range(3):
    opt.step(closure)
finish(model, opt)
""",
    # Two micro-batches per step: the first's backward before the step, the
    # second's forward and backward in the closure (Lightning's automatic
    # optimization with accumulate_grad_batches=2 calls the optimizer so).
    "adam_closure_after_backward": MLP
    + """
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
def closure():
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss
for _ in range(3):
    closure()
    opt.step(closure)
    opt.zero_grad()
finish(model, opt)
""",
    "lightning_automatic": LIGHTNING.format(
        automatic=True,
        training_step="""
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)""",
    ),
    "lightning_automatic_accumulating": LIGHTNING.format(
        automatic=True,
        training_step="""
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)""",
    ).replace("enable_model_summary=False", "enable_model_summary=False, accumulate_grad_batches=2"),
    "lightning_manual": LIGHTNING.format(
        automatic=False,
        training_step="""
        opt = self.optimizers()
        opt.zero_grad()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.manual_backward(loss)
        opt.step()""",
    ),
    "hf_trainer": """
import tempfile
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        ids = torch.randint(0, 256, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}

model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64))
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, max_steps=3, per_device_train_batch_size=2, learning_rate=1e-3,
                             save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Data())
    trainer.train()
finish(model, trainer.optimizer)
""",
    "accelerate": """
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(64, 64), torch.randn(64, 16))
model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=16))
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
finish(model, opt)
""",
}

LIBRARY = {
    "lightning_automatic": "lightning",
    "lightning_automatic_accumulating": "lightning",
    "lightning_manual": "lightning",
    "hf_trainer": "transformers",
    "accelerate": "accelerate",
}


# The frameworks' loops (each imports its library in a fresh interpreter:
# 5-10 s) run in the slow tier, which CI runs too; the plain loops stay in
# the fast one.
@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in LIBRARY else c for c in sorted(CASES)]
)
def test_optimizer_state_and_parameters_are_what_the_optimizer_and_model_hold(fresh_python, case):
    if case in LIBRARY:
        require_library(LIBRARY[case])
    _, R, _ = fresh_python.code(PRELUDE, CASES[case], timeout=240)
    assert R["n_state"] > 0 and R["shared"] == 0
    assert R["now"]["optimizer_state"] == R["state"], R
    assert R["now"]["parameters"] == R["params"], R
