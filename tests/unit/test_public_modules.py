"""The module paths the docs name (docs/usage.md, docs/leak-report.md) keep
working after the package moved into folders: each short name is the module
of its folder, by import statement and by attribute, and nothing else under
memalloc's name is an alias."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import memalloc

DOCUMENTED = {
    "memalloc.advisor": "memalloc.features.advisor",
    "memalloc.host": "memalloc.install.host",
    "memalloc.iteration": "memalloc.core.iteration",
    "memalloc.leaks": "memalloc.features.leaks",
    "memalloc.memory": "memalloc.features.stats",
    "memalloc.phases": "memalloc.features.phases",
    "memalloc.recording": "memalloc.trace.recording",
    "memalloc.replay": "memalloc.features.replay",
}


@pytest.mark.parametrize("short,real", sorted(DOCUMENTED.items()))
def test_documented_path_is_the_real_module(short, real):
    module = importlib.import_module(short)
    assert module is importlib.import_module(real)
    assert getattr(memalloc, short.split(".")[1]) is module
    assert module.__name__ == real


def test_documented_names_resolve_in_a_fresh_interpreter():
    # `from memalloc.replay import replay_source` before anything else
    # imported memalloc: the alias exists as soon as the package does.
    code = (
        "from memalloc.replay import replay_source\n"
        "from memalloc.leaks import LeakReport\n"
        "import memalloc.advisor, memalloc.host\n"
        "print(replay_source.__module__, LeakReport.__module__, memalloc.advisor.advise.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "memalloc.features.replay",
        "memalloc.reporters.leak_report",
        "memalloc.features.advisor",
    ]


def test_no_other_alias_is_registered():
    aliases = {
        name
        for name, module in list(sys.modules.items())
        if name.startswith("memalloc.") and module is not None and module.__name__ != name
    }
    assert aliases <= set(DOCUMENTED), aliases - set(DOCUMENTED)
