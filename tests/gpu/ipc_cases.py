"""CUDA tensors through torch.multiprocessing between memalloc and native
processes, both ways, with plain and expandable segments on the sending side.

One run is one parent and one spawned child, each with its own allocator::

    python tests/gpu/ipc_cases.py PARENT CONFIG CHILD

PARENT and CHILD are ``native`` or ``memalloc``; CONFIG is ``plain`` or
``expandable`` and applies to both processes (native: ``PYTORCH_CUDA_ALLOC_CONF``;
memalloc: ``MEMALLOC_CONF``; set here before either process touches CUDA).
The parent sends three tensors: two small ones that share a page (so one
block is shared at an offset inside it) and one of 288 MiB that spans several
pages (memalloc's 20 MiB pages of requests of 256 MiB or more:
pool/vm_arena.h). The child checks their values, adds 1 to each in place,
and sends back one tensor of its own; the parent checks that it sees the child's
writes in its own tensors and the child's tensor's values, then tells the
child to exit. Prints one JSON object (its last stdout line): what each
side saw, the form of each side's handles (``legacy``, ``c`` or ``e`` and
the version byte), and the parent's allocated bytes before and after.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

SMALL = 1000  # float32: 4000 bytes, small pool
BIG = 72 * (1 << 20)  # float32: 288 MiB, several 20 MiB pages of either allocator


def handle_form(numel: int) -> str:
    """The form of the IPC handle this process's allocator writes for a
    block of `numel` float32 (a probe of its own: a shared block stays
    allocated until a receiver lets go, and none will): 'legacy' (64
    bytes), or the type byte and version ('e3')."""
    import torch

    probe = torch.empty(numel, device="cuda")
    raw = probe.untyped_storage()._share_cuda_()[1]
    del probe
    return "legacy" if len(raw) == 64 else f"{chr(raw[1])}{raw[0]}"


def configure(mode: str, config: str) -> None:
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "MEMALLOC_CONF"):  # torch reads the first
        os.environ.pop(name, None)
    flag = "True" if config == "expandable" else "False"
    if mode == "native":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = f"expandable_segments:{flag}"
    else:
        os.environ["MEMALLOC_CONF"] = f"expandable_segments:{flag}"
        import memalloc

        memalloc.enable(backend="cuda")


def child_main(tensor_q, back_q, done_q, mode: str, config: str) -> None:
    res: dict = {"ok": False}
    keep = None
    try:
        configure(mode, config)
        import torch

        small_a, small_b, big = tensor_q.get(timeout=120)
        res["values_ok"] = [
            torch.equal(small_a.cpu(), torch.arange(SMALL, dtype=torch.float32)),
            torch.equal(small_b.cpu(), torch.arange(SMALL, dtype=torch.float32) + 7),
            torch.equal(big[::4096].cpu(), torch.arange(0, BIG, 4096, dtype=torch.float32)),
        ]
        for t in (small_a, small_b, big):
            t.add_(1)
        torch.cuda.synchronize()
        keep = torch.arange(BIG // 3, dtype=torch.float32, device="cuda") * 2
        res["handle_form"] = handle_form(BIG)
        torch.cuda.synchronize()
        del small_a, small_b, big
        res["ok"] = True
        back_q.put((res, keep))
        done_q.get(timeout=120)  # the parent has read `keep`
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-3000:]
        back_q.put((res, None))


def parent_main(parent: str, config: str, child: str) -> dict:
    out: dict = {"parent": parent, "config": config, "child": child, "ok": False}
    configure(parent, config)
    import torch
    import torch.multiprocessing as mp
    from compat_cases import result_of, sending_errors  # imports torch: after configure()

    torch.zeros(1, device="cuda")
    out["handle_form"] = handle_form(BIG)
    base = torch.cuda.memory_allocated()
    small_a = torch.arange(SMALL, dtype=torch.float32, device="cuda")
    small_b = torch.arange(SMALL, dtype=torch.float32, device="cuda") + 7
    big = torch.arange(BIG, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    out["small_same_segment"] = abs(small_a.data_ptr() - small_b.data_ptr()) < (2 << 20)
    ctx = mp.get_context("spawn")
    tensor_q, back_q, done_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    feeder_errors = sending_errors(tensor_q)
    proc = ctx.Process(target=child_main, args=(tensor_q, back_q, done_q, child, config))
    proc.start()
    try:
        tensor_q.put((small_a, small_b, big))
        res, theirs = result_of(back_q, proc, feeder_errors, timeout_s=120)
        out["child_result"] = res
        torch.cuda.synchronize()
        out["parent_sees_child_writes"] = [
            torch.equal(small_a.cpu(), torch.arange(SMALL, dtype=torch.float32) + 1),
            torch.equal(small_b.cpu(), torch.arange(SMALL, dtype=torch.float32) + 8),
            torch.equal(big[::4096].cpu(), torch.arange(0, BIG, 4096, dtype=torch.float32) + 1),
        ]
        if theirs is not None:
            out["received_back_ok"] = torch.equal(
                theirs[::1000].cpu(), torch.arange(0, BIG // 3, 1000, dtype=torch.float32) * 2
            )
            del theirs
        done_q.put(True)
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
            proc.join()
        out["child_exitcode"] = proc.exitcode
    del small_a, small_b, big
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()  # blocks the child held are freed once its counters drop
    out["allocated_back_to_base"] = torch.cuda.memory_allocated() == base
    if parent == "memalloc":
        import memalloc

        memalloc.installed_allocator().validate(0)
    out["ok"] = True
    return out


if __name__ == "__main__":
    parent, config, child = sys.argv[1:4]
    try:
        result = parent_main(parent, config, child)
    except BaseException as e:  # noqa: BLE001 - reported as JSON
        result = {
            "parent": parent,
            "config": config,
            "child": child,
            "ok": False,
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc()[-3000:],
        }
    print(json.dumps(result))
