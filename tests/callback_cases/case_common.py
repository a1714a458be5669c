"""What tests/callback_cases/'s scripts share: memalloc enabled for the
device asked for (host: the host backend with the script's CPU tensors on
it), the queries the logged figures must equal, the optimizer's state
bytes summed by hand, and the lines the script tags."""

import torch

import memalloc


def enable(device: str):
    """Enables memalloc on ``device`` ("host" or "cuda"); returns the module
    whose queries (memory_allocated ...) the figures must equal."""
    if device == "cuda":
        memalloc.enable()
        return torch.cuda
    memalloc.enable(backend="host")
    memalloc.host.use_for_cpu_tensors()
    return memalloc.memory


def optimizer_state_bytes(opt, device: str) -> int:
    """Storage bytes of the optimizer's state tensors on ``device`` (accelerate's wrapper unwrapped)."""
    opt = getattr(opt, "optimizer", opt)
    kind = "cuda" if device == "cuda" else "cpu"
    return sum(
        t.untyped_storage().nbytes()
        for s in opt.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.device.type == kind
    )


def tagged_lines(path: str, tags: tuple) -> dict:
    """{tag: line number} of the lines of ``path`` that end with a tag."""
    with open(path) as f:
        return {t: n for n, text in enumerate(f.read().splitlines(), 1) for t in tags if text.endswith(t)}
