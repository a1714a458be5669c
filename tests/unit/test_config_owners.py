"""Config keys belong to the layer that reads them (issue 39): the core's
Config (csrc/common/config.*) holds the allocator's and the host backend's
keys only; the keys only the Python layer reads are parsed by the module that
serves it (csrc/boundary/python/settings.*). Read from the source and checked
against memalloc.config_keys() (every key owned exactly once) and against
the Python package (each Python-layer key is read there, no core key is
left unread by the core)."""

from __future__ import annotations

import re
from pathlib import Path

import memalloc

ROOT = Path(__file__).resolve().parents[2]
CONFIG_CPP = ROOT / "csrc" / "common" / "config.cpp"
CONFIG_H = ROOT / "csrc" / "common" / "config.h"
SETTINGS_CPP = ROOT / "csrc" / "boundary" / "python" / "settings.cpp"


def core_keys() -> list[str]:
    body = CONFIG_CPP.read_text().split("config_keys() {", 1)[1].split("};", 1)[0]
    return re.findall(r'"(\w+)"', body)


def option_keys() -> list[str]:
    body = SETTINGS_CPP.read_text().split("option_places() {", 1)[1].split("};", 1)[0]
    return re.findall(r'\{"(\w+)", "\w*"\}', body)


def test_every_key_has_one_owner():
    core, options = core_keys(), option_keys()
    assert core and options
    assert not set(core) & set(options), set(core) & set(options)
    assert sorted(core + options) == sorted(memalloc.config_keys())


def test_the_core_config_has_no_field_of_the_python_layer():
    struct = CONFIG_H.read_text().split("struct Config {", 1)[1].split("\n};", 1)[0]
    struct = re.sub(r"//[^\n]*", "", struct)  # the declarations, not their comments
    for key in option_keys():
        assert not re.search(rf"\b{key}\b", struct), f"Config still holds the Python layer's {key!r}"


def test_the_python_layer_reads_each_of_its_keys():
    text = "\n".join(p.read_text() for p in (ROOT / "memalloc").rglob("*.py"))
    for key in option_keys():
        assert re.search(rf'["\']{key}["\']', text), f"no Python module reads {key!r}: it would belong nowhere"


def test_the_core_reads_each_of_its_keys():
    core_text = "\n".join(
        p.read_text()
        for p in (ROOT / "csrc").rglob("*.*")
        if p.suffix in (".h", ".cpp") and "common" not in p.parts and "boundary" not in p.parts
    )
    fields = {"max_split_size_mb": "max_split_size", "host_capacity_mb": "host_capacity"}
    for key in core_keys():
        field = fields.get(key, key)
        assert re.search(rf"\.{field}\b", core_text) or re.search(rf"config\.{field}\b", core_text), (
            f"the core never reads {key!r}"
        )
