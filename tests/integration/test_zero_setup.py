"""No setup beyond ``memalloc.enable()`` (host backend), each script in a
fresh interpreter (tests/conftest.py fresh_python; enable() is once per
process): an OOM message names the line that fills memory, with its source;
a leak_check() around an optimizer loop that never calls memalloc.step()
names the leaking line; ``call_sites:False`` gives the message without call
sites. The same scenarios on CUDA: tests/gpu/test_cuda_zero_setup.py."""

from __future__ import annotations

import json
import textwrap

FILL = textwrap.dedent("""
    import json, sys
    import torch
    import memalloc
    from memalloc import host
    memalloc.enable(backend="host", config="host_capacity_mb:64")
    MiB = 1 << 20

    def load_weights():
        return [host.empty(8 * MiB, torch.uint8) for _ in range(4)]  # FILLS

    weights = load_weights()
    cache = host.empty(6 * MiB, torch.uint8)  # SECOND
    try:
        host.empty(100 * MiB, torch.uint8)
    except torch.OutOfMemoryError as e:
        print("MESSAGE" + json.dumps(str(e)))
""")

LEAK = textwrap.dedent("""
    import json
    import torch
    import memalloc
    memalloc.enable(backend="host", config="host_capacity_mb:256")
    memalloc.host.use_for_cpu_tensors()  # the host backend's way to train a real model on memalloc
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 32), torch.randn(8, 1)
    history = []
    with memalloc.leak_check() as check:
        for _ in range(16):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(loss)  # LEAKS
    print("REPORT" + json.dumps(check.report.to_dict()))
""")


def line_of(src: str, marker: str) -> int:
    return next(i for i, l in enumerate(src.splitlines(), 1) if l.rstrip().endswith(marker))


def output(p, prefix: str):
    assert p.returncode == 0, p.stderr
    return json.loads(next(l for l in p.stdout.splitlines() if l.startswith(prefix))[len(prefix) :])


def test_oom_message_names_the_filling_line_with_no_setup(tmp_path, fresh_python):
    script = tmp_path / "fill.py"
    script.write_text(FILL)
    msg = output(fresh_python.run([str(script)], cwd=tmp_path), "MESSAGE")
    lines = msg.splitlines()
    assert lines[0].startswith("Device out of memory. Tried to allocate 100.00 MiB")  # torch's message first
    i = lines.index("Live allocations holding the most memory (memalloc):")
    fills = f"{script}:{line_of(FILL, '# FILLS')} in "
    assert "32.00 MiB in     4 allocations  " + fills in lines[i + 1], lines[i + 1]
    assert lines[i + 2].strip() == "return [host.empty(8 * MiB, torch.uint8) for _ in range(4)]  # FILLS"
    assert lines[i + 3].endswith(f"6.00 MiB in     1 allocations  {script}:{line_of(FILL, '# SECOND')} in <module>")
    assert lines[i + 4].strip() == "cache = host.empty(6 * MiB, torch.uint8)  # SECOND"
    assert "call sites are off" not in msg


def test_call_sites_off_gives_the_message_without_them(tmp_path, fresh_python):
    script = tmp_path / "fill.py"
    script.write_text(FILL)
    msg = output(fresh_python.run([str(script)], cwd=tmp_path, conf="call_sites:False"), "MESSAGE")
    assert msg.startswith("Device out of memory. Tried to allocate 100.00 MiB")
    assert "38.00 MiB in     5 allocations  no call site recorded" in msg
    assert str(script) not in msg
    assert "(call sites are off: remove call_sites:False from MEMALLOC_CONF" in msg


def test_leak_check_of_an_optimizer_loop_names_the_line_with_no_step_calls(tmp_path, fresh_python):
    script = tmp_path / "train.py"
    script.write_text(LEAK)
    r = output(fresh_python.run([str(script)], cwd=tmp_path), "REPORT")
    assert r["boundaries"] == "16 from optimizer.step()"
    assert len(r["steps"]) == 16
    assert len(r["leaks"]) == 1, r
    leak = r["leaks"][0]
    assert (leak["site"]["filename"], leak["site"]["line"]) == (str(script), line_of(LEAK, "# LEAKS"))
    assert leak["holder"]["name"] == "history" and leak["cause"] == "graph_in_container"


def test_stacks_stay_on_under_every_recording_mode_and_after_it(fresh_python):
    _, r, _ = fresh_python.code(
        "",
        """
from memalloc import _C
R["before"] = _C.stack_mode()
memalloc.enable(backend="host", config="host_capacity_mb:64")
R["enabled"] = _C.stack_mode()
memalloc.record_history(stacks="tags")
t = host.empty(1000)
R["tags_recording"] = [_C.stack_mode(), memalloc.events()[-1].stack_id != 0]
memalloc.record_history(False)
R["stopped"] = _C.stack_mode()
with memalloc.leak_check():
    pass
R["after_leak_check"] = _C.stack_mode()
R["holder"] = memalloc.top_holders(n=1)[0]["line"]
""",
    )
    assert (r["before"], r["enabled"], r["stopped"], r["after_leak_check"]) == (0, 2, 2, 2)
    assert r["tags_recording"] == [2, True]
    assert r["holder"] is not None  # t's call site is known
