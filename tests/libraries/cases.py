"""Training loops of the libraries people train with, for the libraries
suite (tests/integration/test_libraries.py on the host backend, tests/gpu/test_cuda_libraries.py
on CUDA).

Run as a script, in a fresh interpreter per mode::

    python tests/libraries/cases.py --mode native|memalloc --device cpu|cuda [--cases a,b]

``memalloc`` mode calls ``memalloc.enable()`` first, as a user would at the
top of a script (host backend plus ``use_for_cpu_tensors()`` on the CPU, so
every tensor of the model comes from memalloc; memalloc as torch's CUDA
allocator on a GPU). Each case builds its model from a config (no downloads),
trains a few steps with fixed seeds and reports its losses; the script prints
one ``RESULT <json>`` line: {case: {"losses": [...]} or {"error": text}}, and
in memalloc mode what memalloc saw ("memalloc": allocations, peak allocated
bytes, features its hooks turned off). The test compares the two modes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable

import torch

STEPS = 3
VOCAB = 256


def _seed(n: int = 0) -> None:
    torch.manual_seed(n)


def _tokens(device: str, batch: int = 2, length: int = 16, step: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (batch, length), generator=g).to(device)


def _train(model: torch.nn.Module, device: str, forward: Callable[[torch.nn.Module, int], torch.Tensor]) -> list:
    """STEPS AdamW steps of ``forward(model, step) -> loss``; the losses."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        loss = forward(model, step)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


# --- transformers models from configs (tied embeddings in all four) ---------


def gpt2(device: str) -> list:
    from transformers import GPT2Config, GPT2LMHeadModel

    _seed()
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64))
    assert m.lm_head.weight is m.transformer.wte.weight  # the tied weight that broke enable()
    return _train(m, device, lambda m, s: m(input_ids=_tokens(device, step=s), labels=_tokens(device, step=s)).loss)


def llama(device: str) -> list:
    from transformers import LlamaConfig, LlamaForCausalLM

    _seed()
    m = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            tie_word_embeddings=True,
        )
    )
    return _train(m, device, lambda m, s: m(input_ids=_tokens(device, step=s), labels=_tokens(device, step=s)).loss)


def bert_mlm(device: str) -> list:
    from transformers import BertConfig, BertForMaskedLM

    _seed()
    m = BertForMaskedLM(
        BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            vocab_size=VOCAB,
            max_position_embeddings=64,
        )
    )
    return _train(m, device, lambda m, s: m(input_ids=_tokens(device, step=s), labels=_tokens(device, step=s)).loss)


def t5(device: str) -> list:
    from transformers import T5Config, T5ForConditionalGeneration

    _seed()
    m = T5ForConditionalGeneration(
        T5Config(
            d_model=64,
            d_ff=128,
            d_kv=32,
            num_layers=2,
            num_heads=2,
            vocab_size=VOCAB,
            decoder_start_token_id=0,
            pad_token_id=0,
        )
    )
    return _train(
        m, device, lambda m, s: m(input_ids=_tokens(device, step=s), labels=_tokens(device, length=8, step=s + 50)).loss
    )


# --- trainers ---------------------------------------------------------------


class _TokenData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2 * STEPS

    def __getitem__(self, i: int) -> dict:
        ids = _tokens("cpu", batch=1, step=i)[0]
        return {"input_ids": ids, "labels": ids.clone()}


def hf_trainer(device: str) -> list:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    _seed()
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            max_steps=STEPS,
            per_device_train_batch_size=2,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=device == "cpu",
            dataloader_num_workers=0,
            seed=0,
            disable_tqdm=True,
        )
        trainer = Trainer(model=m, args=args, train_dataset=_TokenData())
        trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def lightning_trainer(device: str) -> list:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, VOCAB)
            )
            self.net[3].weight = torch.nn.Parameter(torch.randn(VOCAB, 128) * 0.02)
            self.losses: list = []

        def training_step(self, batch: dict, i: int) -> torch.Tensor:
            logits = self.net(batch["input_ids"])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    _seed()
    module = Module()
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu" if device == "cpu" else "gpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(module, torch.utils.data.DataLoader(_TokenData(), batch_size=2))
    return module.losses


def accelerate_loop(device: str) -> list:
    from accelerate import Accelerator
    from transformers import GPT2Config, GPT2LMHeadModel

    _seed()
    accelerator = Accelerator(cpu=device == "cpu")
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(_TokenData(), batch_size=2)
    m, opt, loader = accelerator.prepare(m, opt, loader)
    losses = []
    for batch in loader:
        loss = m(**batch).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


# --- vision models (GPU only: the index's torchvision needs a CUDA torch) ---


def _images(device: str, step: int, size: int = 64) -> tuple:
    g = torch.Generator().manual_seed(2000 + step)
    return (torch.randn(2, 3, size, size, generator=g).to(device), torch.randint(0, 10, (2,), generator=g).to(device))


def _vision(model: torch.nn.Module, device: str) -> list:
    def forward(m: torch.nn.Module, s: int) -> torch.Tensor:
        x, y = _images(device, s)
        return torch.nn.functional.cross_entropy(m(x), y)

    return _train(model, device, forward)


def torchvision_resnet18(device: str) -> list:
    import torchvision

    _seed()
    return _vision(torchvision.models.resnet18(num_classes=10), device)


def timm_vit(device: str) -> list:
    import timm

    _seed()
    return _vision(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=64), device)


CPU_CASES = {
    "gpt2": gpt2,
    "llama": llama,
    "bert_mlm": bert_mlm,
    "t5": t5,
    "hf_trainer": hf_trainer,
    "lightning_trainer": lightning_trainer,
    "accelerate": accelerate_loop,
}
CUDA_CASES = {**CPU_CASES, "torchvision_resnet18": torchvision_resnet18, "timm_vit": timm_vit}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("native", "memalloc"), required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--cases", default="")
    args = p.parse_args()
    cases = CUDA_CASES if args.device == "cuda" else CPU_CASES
    names = [c for c in args.cases.split(",") if c] or list(cases)
    torch.use_deterministic_algorithms(True, warn_only=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    memalloc = None
    if args.mode == "memalloc":
        import memalloc  # noqa: F811 - imported only in this mode, as a user would

        memalloc.enable(backend="host" if args.device == "cpu" else "cuda")
        if args.device == "cpu":
            memalloc.host.use_for_cpu_tensors()
    results: dict = {}
    for name in names:
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # trainers print; RESULT stays alone
                results[name] = {"losses": cases[name](args.device)}
        except Exception:  # noqa: BLE001 - reported per case, the test names it
            results[name] = {"error": traceback.format_exc()}
    if memalloc is not None:
        from memalloc.core import _hooks

        s = memalloc.memory.memory_stats()
        results["memalloc"] = {
            "allocations": s.get("allocation.all.allocated", 0),
            "peak_allocated": s.get("allocated_bytes.all.peak", 0),
            "hook_failures": _hooks.failures(),
        }
        memalloc.installed_allocator().validate()
    print("RESULT", json.dumps(results))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
