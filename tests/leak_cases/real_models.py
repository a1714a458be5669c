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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

import memalloc

STEPS = 16
VOCAB = 256
DEVICE = "cpu"  # where models and batches live: "cpu" on the host backend, "cuda" in the GPU suite
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
        return allocator.stats(_device_index())["allocated_bytes"]["all"]["current"]

    before = allocated()
    container.clear()
    return Truth(bytes=before - allocated(), tensors=tensors, steps=steps)


def _device_index() -> int:
    return torch.device(DEVICE).index or 0


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=128, bos_token_id=0, eos_token_id=0)
    )


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(
        BertConfig(
            num_hidden_layers=2,
            hidden_size=64,
            num_attention_heads=2,
            intermediate_size=128,
            vocab_size=VOCAB,
            max_position_embeddings=128,
        )
    )


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(
        T5Config(
            num_layers=2,
            num_decoder_layers=2,
            d_model=64,
            d_ff=128,
            num_heads=2,
            d_kv=32,
            vocab_size=VOCAB,
            decoder_start_token_id=0,
        )
    )


def _batches(seed: int):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        length = rng.choice(LENGTHS)
        yield torch.randint(1, VOCAB, (2, length), generator=g).to(DEVICE)


def _setup(make: Callable[[], torch.nn.Module], seed: int = 0):
    torch.manual_seed(seed)
    m = make().to(DEVICE)
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
        out = output[0] if isinstance(output, tuple) else output
        store.append(out.detach())  # LEAK:bert_hook_stores_outputs

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


def bert_losses_with_graph(allocator=None):
    """BERT keeping each step's loss tensor, not its value: every loss keeps
    its graph (backward() freed what the graph saved, not the nodes)."""
    m, opt = _setup(_bert)
    losses = []
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(10):
            out = _train_step(m, opt, ids)
            losses.append(out.loss)  # LEAK:bert_losses_with_graph
            memalloc.step()
    del out  # the last step's logits: the loop's variable, not the leak
    return check, {"losses": freed_by_clearing(losses, allocator, len(losses), STEPS)}


class CachingDataset(torch.utils.data.Dataset):
    """A dataset that moves each sample to the device and keeps it there, "to
    save the copy next epoch": a DataLoader-side list of device tensors."""

    def __init__(self, seed: int):
        self.batches = list(_batches_on_host(seed))
        self.on_device = []

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> torch.Tensor:
        ids = self.batches[i].to(DEVICE, copy=True)
        self.on_device.append(ids)  # LEAK:gpt2_dataloader_keeps_device_batches
        return ids


def _batches_on_host(seed: int):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        yield torch.randint(1, VOCAB, (2, rng.choice(LENGTHS)), generator=g)


def gpt2_dataloader_keeps_device_batches(allocator=None):
    """GPT-2 fed by a DataLoader whose dataset keeps every batch it moved to
    the device (batch_size=None: the dataset's items are the batches)."""
    m, opt = _setup(_gpt2)
    data = CachingDataset(11)
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in torch.utils.data.DataLoader(data, batch_size=None, shuffle=False):
            _train_step(m, opt, ids)
            memalloc.step()
    return check, {"self.on_device": truth_of(data.on_device, STEPS)}


def gpt2_param_groups_added(allocator=None):
    """GPT-2 tuned with a new soft-prompt vector each step, each added to
    AdamW as its own parameter group: the optimizer keeps every one of them,
    and the state AdamW made for it."""
    m, opt = _setup(_gpt2)
    groups_before = len(opt.param_groups)
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(12):
            prompt = torch.nn.Parameter(torch.zeros(1, 1, m.config.n_embd, device=DEVICE))
            opt.add_param_group({"params": [prompt]})  # LEAK:gpt2_param_groups_added
            out = m(inputs_embeds=m.transformer.wte(ids) + prompt, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            memalloc.step()
    added = [p for g in opt.param_groups[groups_before:] for p in g["params"]]
    kept = added + [
        t
        for p in added
        for t in opt.state[p].values()
        if torch.is_tensor(t) and t.device.type == torch.device(DEVICE).type
    ]
    return check, {"opt": truth_of(kept, STEPS)}


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


def gpt2_compiled_clean(allocator=None):
    """GPT-2 under torch.compile (``COMPILE_BACKEND``: "aot_eager" on the
    host backend, where inductor would compile C++ for minutes; inductor on
    the GPU), lengths varying (a recompile for dynamic shapes), keeping only
    floats."""
    m, opt = _setup(_gpt2)
    forward = torch.compile(m, backend=COMPILE_BACKEND)
    losses = []
    with memalloc.leak_check(allocator=allocator) as check:
        for ids in _batches(13):
            out = forward(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(out.loss.item())
            memalloc.step()
    return check, {}


COMPILE_BACKEND = "aot_eager"


LEAKS = [
    gpt2_detached_hidden_states,
    bert_cache_by_step,
    t5_leak_after_warmup,
    gpt2_two_leaks,
    gpt2_eval_without_no_grad,
    bert_hook_stores_outputs,
    t5_batches_kept,
    bert_losses_with_graph,
    gpt2_dataloader_keeps_device_batches,
    gpt2_param_groups_added,
]
CLEAN = [gpt2_clean, bert_clean_grads_kept]
COMPILED = [gpt2_compiled_clean]  # ~25 s of compiling on 2 cores: the slow tier


# ---- what each leak must be reported as (the host and the GPU suite check the same) ----
# case: {holder: cause}
CAUSES = {
    "gpt2_detached_hidden_states": {"kept": "container"},
    "bert_cache_by_step": {"cache": "cache_by_step"},
    "t5_leak_after_warmup": {"kept": "container"},
    "gpt2_two_leaks": {"logits": "container", "firsts": "container"},
    "gpt2_eval_without_no_grad": {"outputs": "no_grad_eval"},
    "bert_hook_stores_outputs": {"store": "hook_storage"},
    "t5_batches_kept": {"seen": "container"},
    "bert_losses_with_graph": {"losses": "graph_in_container"},
    "gpt2_dataloader_keeps_device_batches": {"self.on_device": "container"},
    "gpt2_param_groups_added": {"opt": "optimizer_state"},
}
# the kept tensors carry their graphs: the hint says so (for the others it must not)
GRAPH_CASES = {"gpt2_eval_without_no_grad", "bert_losses_with_graph"}
RELATIVE_BOUND = 0.10  # bytes per step and retained bytes within 10% of the truth


def marker(source: str, case: str, holder: str) -> int:
    """The line of ``source`` marked ``# LEAK:<case>`` (or ``# LEAK:<case>:<holder>``)."""
    hits = [
        i
        for i, line in enumerate(source.splitlines(), 1)
        if line.rstrip().endswith((f"# LEAK:{case}:{holder}", f"# LEAK:{case}"))
    ]
    assert len(hits) == 1, (case, holder, hits)
    return hits[0]


def check_leak(
    case: str,
    report: dict,
    text: str,
    truth: dict,
    cases: dict = CAUSES,
    graph_cases: set = GRAPH_CASES,
    cases_file: str = __file__,
) -> None:
    """One leak case's report against its truth: one leak per holder, at the
    keeping line, the holder named, the tensor count exact, bytes per step
    and retained bytes within RELATIVE_BOUND, the cause (and so the hint)
    the case's."""
    import pytest

    source = open(cases_file).read()
    by_holder = {leak["holder"]["name"]: leak for leak in report["leaks"] if leak["holder"]}
    assert set(by_holder) == set(truth) and len(report["leaks"]) == len(truth), text
    for holder, t in truth.items():
        leak = by_holder[holder]
        assert leak["site"]["filename"] == cases_file, text
        assert leak["site"]["line"] == marker(source, case, holder), text
        assert leak["retained_tensors"] == t.tensors, text
        assert leak["retained_bytes"] == pytest.approx(t.bytes, rel=RELATIVE_BOUND), text
        assert leak["bytes_per_step"] == pytest.approx(t.bytes_per_step, rel=RELATIVE_BOUND), text
        assert leak["cause"] == cases[case][holder], text
        if case in graph_cases:
            assert "autograd graph" in leak["hint"], text
        elif leak["hint"]:
            assert "autograd graph" not in leak["hint"], text  # the kept tensors are detached


def figures_table(runs: dict) -> str:
    """Markdown: per case and holder, the reported figures beside the truth
    (``runs``: {case: (report dict, text, truth)}; docs/leak-report.md holds
    the table of the last run with MEMALLOC_LEAK_TABLE=<file>)."""
    rows = [
        "| case | holder | bytes/step reported | true | retained reported | true | tensors reported | true |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, (report, _text, truth) in runs.items():
        by_holder = {leak["holder"]["name"]: leak for leak in report["leaks"] if leak["holder"]}
        if not truth:
            rows.append(f"| {case} (clean) | - | {len(report['leaks'])} leaks | 0 leaks | | | | |")
        for holder, tr in truth.items():
            leak = by_holder.get(holder)
            got = (
                (f"{leak['bytes_per_step']:,.0f}", f"{leak['retained_bytes']:,}", str(leak["retained_tensors"]))
                if leak
                else ("not found",) * 3
            )
            rows.append(
                f"| {case} | `{holder}` | {got[0]} | {tr.bytes_per_step:,.0f} | {got[1]} | {tr.bytes:,} "
                f"| {got[2]} | {tr.tensors} |"
            )
    return "\n".join(rows) + "\n"
