"""Leaks and clean loops on real models (transformers GPT-2, BERT, T5 built
from small configs: no downloads), with varying sequence lengths, for
tests/integration/test_leaks_real_models.py. Each case runs its loop under
``memalloc.leak_check(allocator=...)`` and returns ``(check, truth)``: the
truth is computed here from the tensors the loop kept, as
``{holder name: Truth}`` (empty for a clean loop): the storages of the kept
tensors (truth_of), or for kept tensors that carry their graphs, the bytes
the allocator frees when the container is emptied (freed_by_clearing). Each keeping line is
marked ``# LEAK:<case>`` (``# LEAK:<case>:<holder>`` when a case has two).
"""
from __future__ import annotations

import gc
import random
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

import memalloc

STEPS = 16
VOCAB = 256
LENGTHS = (16, 32, 48, 64)
BLOCK = 512  # the allocator's rounding: a block is a multiple of 512 bytes


@dataclass
class Truth:
    bytes: int  # distinct storages the holder keeps, each rounded up to a 512-byte block
    tensors: int  # tensors the holder keeps
    steps: int  # iterations it kept them over (first keeping step to the last, inclusive)

    @property
    def bytes_per_step(self) -> float:
        return self.bytes / self.steps


def truth_of(kept: Iterable[torch.Tensor], steps: int) -> Truth:
    tensors = list(kept)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    rounded = sum(-(-n // BLOCK) * BLOCK for n in storages.values())
    return Truth(bytes=rounded, tensors=len(tensors), steps=steps)


def freed_by_clearing(container, allocator, tensors: int, steps: int) -> Truth:
    """The truth for a container whose tensors carry their graphs: the bytes
    the allocator frees when the container is emptied (its tensors, and all
    their graphs keep), read from the allocator's own counter."""
    def allocated() -> int:
        gc.collect()
        return allocator.stats(0)["allocated_bytes"]["all"]["current"]
    before = allocated()
    container.clear()
    return Truth(bytes=before - allocated(), tensors=tensors, steps=steps)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=128,
                                      bos_token_id=0, eos_token_id=0))


def _bert():
    from transformers import BertConfig, BertForMaskedLM
    return BertForMaskedLM(BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                      intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=128))


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128,
                                               num_heads=2, d_kv=32, vocab_size=VOCAB, decoder_start_token_id=0))


def _batches(seed: int):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        length = rng.choice(LENGTHS)
        yield torch.randint(1, VOCAB, (2, length), generator=g)


def _setup(make: Callable[[], torch.nn.Module], seed: int = 0):
    torch.manual_seed(seed)
    m = make()
    m.train()
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)


def _train_step(m, opt, ids, *, set_to_none: bool = True, **kwargs):
    """One AdamW step on ``ids`` as its own labels; the model's output."""
    out = m(input_ids=ids, labels=ids, **kwargs)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)
    return out


# ---- leaks -------------------------------------------------------------------------
def gpt2_detached_hidden_states(allocator=None):
    """The issue's loop: GPT-2, lengths drawn per step, each step keeping the
    last hidden state, detached (no graph: the hint must not say so)."""
    m, opt = _setup(_gpt2)
    kept = []
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(1):
            out = _train_step(m, opt, ids, output_hidden_states=True)
            kept.append(out.hidden_states[-1].detach())  # LEAK:gpt2_detached_hidden_states
            memalloc.step()
    return check, {"kept": truth_of(kept, STEPS)}


def bert_cache_by_step(allocator=None):
    """BERT, a dict keyed by step caching each step's logits of the first
    token (a view that keeps the whole logits storage alive)."""
    m, opt = _setup(_bert)
    cache = {}
    with memalloc.leak_check(allocator=allocator) as check:
        for step, ids in enumerate(_batches(2)):
            out = _train_step(m, opt, ids, set_to_none=False)
            cache[step] = out.logits.detach()[:, 0]  # LEAK:bert_cache_by_step
            memalloc.step()
    return check, {"cache": truth_of(cache.values(), STEPS)}


WARMUP = 5


def t5_leak_after_warmup(allocator=None):
    """T5, clean for the first steps, then keeping the encoder's last hidden
    state every step."""
    m, opt = _setup(_t5)
    kept = []
    with memalloc.leak_check(allocator=allocator) as check:
        for step, ids in enumerate(_batches(3)):
            out = _train_step(m, opt, ids)
            if step >= WARMUP:
                kept.append(out.encoder_last_hidden_state.detach())  # LEAK:t5_leak_after_warmup
            memalloc.step()
    return check, {"kept": truth_of(kept, STEPS - WARMUP)}


def gpt2_two_leaks(allocator=None):
    """GPT-2 keeping two things at once: detached logits in one list, and the
    hidden states of the first layer, detached, in another."""
    m, opt = _setup(_gpt2)
    logits, firsts = [], []
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(4):
            out = _train_step(m, opt, ids, output_hidden_states=True)
            logits.append(out.logits.detach())  # LEAK:gpt2_two_leaks:logits
            firsts.append(out.hidden_states[1].detach())  # LEAK:gpt2_two_leaks:firsts
            memalloc.step()
    return check, {"logits": truth_of(logits, STEPS), "firsts": truth_of(firsts, STEPS)}


def bert_hook_stores_outputs(allocator=None):
    """BERT with a forward hook on its first layer that stores the layer's
    output, detached, on every call."""
    m, opt = _setup(_bert)
    store = []

    def keep(module, args, output):
        store.append(output[0].detach() if isinstance(output, tuple) else output.detach())  # LEAK:bert_hook_stores_outputs

    handle = m.bert.encoder.layer[0].register_forward_hook(keep)
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(8):
            _train_step(m, opt, ids)
            memalloc.step()
    handle.remove()
    return check, {"store": truth_of(store, STEPS)}


def t5_batches_kept(allocator=None):
    """T5 whose loop keeps every input batch (a data-side list)."""
    m, opt = _setup(_t5)
    seen = []
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(9):
            seen.append(ids)  # LEAK:t5_batches_kept
            _train_step(m, opt, ids)
            memalloc.step()
    return check, {"seen": truth_of(seen, STEPS)}


def gpt2_eval_without_no_grad(allocator=None):
    """GPT-2 evaluated without torch.no_grad(), keeping each step's logits:
    every logits tensor keeps its graph and the activations autograd saved."""
    m, _ = _setup(_gpt2)
    m.eval()
    outputs = []
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(7):
            outputs.append(m(input_ids=ids).logits)  # LEAK:gpt2_eval_without_no_grad
            memalloc.step()
    return check, {"outputs": freed_by_clearing(outputs, allocator, len(outputs), STEPS)}


# ---- clean loops -----------------------------------------------------------------
def gpt2_clean(allocator=None):
    """GPT-2 with varying lengths, keeping only floats."""
    m, opt = _setup(_gpt2)
    losses = []
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(5):
            out = _train_step(m, opt, ids)
            losses.append(out.loss.item())
            memalloc.step()
    return check, {}


def bert_clean_grads_kept(allocator=None):
    """BERT with zero_grad(set_to_none=False): gradients stay allocated, the
    cache warms up over the varying lengths; nothing grows."""
    m, opt = _setup(_bert)
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(6):
            out = _train_step(m, opt, ids, set_to_none=False)
            memalloc.step()
    return check, {}


LEAKS = [gpt2_detached_hidden_states, bert_cache_by_step, t5_leak_after_warmup, gpt2_two_leaks,
         gpt2_eval_without_no_grad, bert_hook_stores_outputs, t5_batches_kept]
CLEAN = [gpt2_clean, bert_clean_grads_kept]
