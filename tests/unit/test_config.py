"""Configuration text: memalloc.core._config.config_text() (MEMALLOC_CONF + explicit config)
and the one parser behind it, memalloc._C.parse_config."""

from __future__ import annotations

import pytest
from memtest_helpers import CONFIG_KEYS

import memalloc
from memalloc import _C

KEYS = CONFIG_KEYS
# Defaults documented in csrc/common/config.h: auto backend, 1 GiB capacity, one device,
# no split limit, no power-of-two rounding.
DEFAULT = "backend:auto,host_capacity_mb:1024,host_devices:1"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("MEMALLOC_CONF", raising=False)


def items(text: str) -> dict:
    return dict(item.split(":", 1) for item in text.split(","))


@pytest.mark.parametrize(
    "parse",
    [_C.parse_config, lambda t: memalloc.core._config.config_text(t, use_env=False)],
    ids=["parse_config", "config_text"],
)
def test_defaults(parse):
    assert parse("") == DEFAULT
    assert parse(" , ,") == DEFAULT
    assert memalloc.core._config.config_text() == DEFAULT


def test_config_keys():
    assert memalloc.config_keys() == KEYS
    assert list(_C.config_keys()) == KEYS


@pytest.mark.parametrize(
    "parse", [_C.parse_config, memalloc.core._config.config_text], ids=["parse_config", "config_text"]
)
@pytest.mark.parametrize(
    "text,key",
    [
        ("no_such_key:1", "no_such_key"),
        ("max_split_size_mb:256,Backend:host", "Backend"),
        ("max_split:256", "max_split"),
    ],
)
def test_unknown_key_names_it_and_lists_valid_keys(parse, text, key):
    with pytest.raises(ValueError) as info:
        parse(text)
    assert isinstance(info.value, memalloc.errors.InvalidArgumentError)
    msg = str(info.value)
    assert f"unknown key '{key}'" in msg
    for k in KEYS:
        assert k in msg


MALFORMED = [
    ("max_split_size_mb:abc", ["'abc'", "max_split_size_mb", "not a non-negative integer"]),
    ("max_split_size_mb:-5", ["'-5'", "max_split_size_mb", "not a non-negative integer"]),
    ("max_split_size_mb:", ["max_split_size_mb", "not a non-negative integer"]),
    ("max_split_size_mb:2.5", ["'2.5'", "not a non-negative integer"]),
    ("max_split_size_mb:99999999999999999999999", ["max_split_size_mb", "not a non-negative integer"]),
    ("max_split_size_mb:20", ["max_split_size_mb must be greater than 20", "got 20"]),
    ("max_split_size_mb:0", ["max_split_size_mb must be greater than 20"]),
    ("roundup_power2_divisions:3", ["roundup_power2_divisions must be a power of two", "got 3"]),
    ("roundup_power2_divisions:6", ["power of two"]),
    ("roundup_power2_divisions:128", ["power of two", "got 128"]),
    ("host_capacity_mb:0", ["host_capacity_mb must be positive"]),
    ("host_devices:0", ["host_devices must be between 1 and 64", "got 0"]),
    ("host_devices:65", ["host_devices must be between 1 and 64", "got 65"]),
    ("backend:gpu", ["backend 'gpu' is unknown", "auto, cuda, host"]),
    ("max_split_size_mb", ["'max_split_size_mb' has no ':'"]),
    ("backend:host,host_capacity_mb=64", ["'host_capacity_mb=64' has no ':'"]),
]


@pytest.mark.parametrize(
    "parse", [_C.parse_config, memalloc.core._config.config_text], ids=["parse_config", "config_text"]
)
@pytest.mark.parametrize("text,fragments", MALFORMED, ids=[t for t, _ in MALFORMED])
def test_malformed_values_raise_value_error_naming_the_problem(parse, text, fragments):
    with pytest.raises(ValueError) as info:
        parse(text)
    assert isinstance(info.value, memalloc.errors.InvalidArgumentError)
    for f in fragments:
        assert f in str(info.value)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("max_split_size_mb:21", {"max_split_size_mb": "21"}),
        ("roundup_power2_divisions:64", {"roundup_power2_divisions": "64"}),
        ("roundup_power2_divisions:4", {"roundup_power2_divisions": "4"}),
        ("host_devices:64", {"host_devices": "64"}),
        ("host_capacity_mb:1", {"host_capacity_mb": "1"}),
        ("backend:cuda", {"backend": "cuda"}),
        ("backend:host", {"backend": "host"}),
    ],
)
def test_boundary_values_are_accepted(text, expected):
    got = items(_C.parse_config(text))
    for k, v in expected.items():
        assert got[k] == v


@pytest.mark.parametrize("text", ["roundup_power2_divisions:0", "roundup_power2_divisions:1"])
def test_power2_divisions_zero_or_one_means_off(text):
    assert _C.parse_config(text) == DEFAULT


ROUND_TRIP = [
    "",
    "backend:host",
    " max_split_size_mb : 256 , backend:host ",
    "host_devices:4,host_capacity_mb:64,roundup_power2_divisions:8,max_split_size_mb:512,backend:cuda",
    "host_capacity_mb:8,host_capacity_mb:32",
    "max_split_size_mb:21,,roundup_power2_divisions:2,",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_canonical_text_round_trips(text):
    canon = _C.parse_config(text)
    assert _C.parse_config(canon) == canon
    assert memalloc.core._config.config_text(canon, use_env=False) == canon
    # Canonical form: every key once, in documentation order, no spaces.
    keys = [item.split(":")[0] for item in canon.split(",")]
    assert keys == [k for k in KEYS if k in keys]
    assert " " not in canon
    assert memalloc.Allocator("host", canon).config == canon


def test_canonical_form_normalises_whitespace_and_order():
    canon = _C.parse_config(" host_devices : 2 , max_split_size_mb : 256 , backend:host ")
    assert canon == "backend:host,max_split_size_mb:256,host_capacity_mb:1024,host_devices:2"


def test_later_keys_win():
    assert items(_C.parse_config("host_capacity_mb:8,host_capacity_mb:32"))["host_capacity_mb"] == "32"
    assert items(_C.parse_config("backend:cuda,backend:host"))["backend"] == "host"


def test_mapping_config():
    text = memalloc.core._config.config_text({"max_split_size_mb": 256})
    assert items(text)["max_split_size_mb"] == "256"
    assert text == _C.parse_config("max_split_size_mb:256")
    text = memalloc.core._config.config_text({"host_capacity_mb": 64, "backend": "host", "host_devices": 2})
    got = items(text)
    assert (got["host_capacity_mb"], got["backend"], got["host_devices"]) == ("64", "host", "2")
    assert memalloc.core._config.config_text({}) == DEFAULT
    with pytest.raises(ValueError, match="unknown key 'nope'"):
        memalloc.core._config.config_text({"nope": 1})
    with pytest.raises(ValueError, match="max_split_size_mb must be greater than 20"):
        memalloc.core._config.config_text({"max_split_size_mb": 10})


def test_env_is_read_and_explicit_config_overrides_it(monkeypatch):
    monkeypatch.setenv("MEMALLOC_CONF", "host_capacity_mb:8,max_split_size_mb:64")
    env_only = items(memalloc.core._config.config_text())
    assert env_only["host_capacity_mb"] == "8"
    assert env_only["max_split_size_mb"] == "64"

    merged = items(memalloc.core._config.config_text("host_capacity_mb:32"))
    assert merged["host_capacity_mb"] == "32"  # explicit wins
    assert merged["max_split_size_mb"] == "64"  # env key kept

    merged = items(memalloc.core._config.config_text({"max_split_size_mb": 128, "backend": "host"}))
    assert merged["max_split_size_mb"] == "128"
    assert merged["host_capacity_mb"] == "8"
    assert merged["backend"] == "host"

    assert memalloc.core._config.config_text(use_env=False) == DEFAULT
    assert memalloc.core._config.config_text("host_devices:2", use_env=False) == _C.parse_config("host_devices:2")


def test_empty_env_means_defaults(monkeypatch):
    monkeypatch.setenv("MEMALLOC_CONF", "")
    assert memalloc.core._config.config_text() == DEFAULT


def test_malformed_env_raises_unless_ignored(monkeypatch):
    monkeypatch.setenv("MEMALLOC_CONF", "host_capacity_mb:lots")
    with pytest.raises(ValueError, match="'lots' of key 'host_capacity_mb'"):
        memalloc.core._config.config_text()
    # An explicit config does not rescue a malformed environment...
    with pytest.raises(ValueError, match="host_capacity_mb"):
        memalloc.core._config.config_text("host_capacity_mb:8")
    # ...but use_env=False ignores it.
    assert items(memalloc.core._config.config_text("host_capacity_mb:8", use_env=False))["host_capacity_mb"] == "8"


@pytest.mark.parametrize("bad", [42, 1.5, ["max_split_size_mb:256"], ("a", "b"), b"max_split_size_mb:256", object()])
def test_config_of_wrong_type_raises_type_error(bad, monkeypatch):
    monkeypatch.setenv("MEMALLOC_CONF", "host_capacity_mb:8")
    with pytest.raises(TypeError, match="config must be"):
        memalloc.core._config.config_text(bad)
    with pytest.raises(TypeError):
        memalloc.core._config.config_text(bad, use_env=False)


@pytest.mark.parametrize("key", ["host_capacity_mb", "max_split_size_mb"])
def test_huge_mb_values_are_rejected_or_round_trip(key):
    text = f"{key}:{2**44}"
    try:
        canon = _C.parse_config(text)
    except ValueError:
        return  # rejecting an out-of-range value is fine
    assert _C.parse_config(canon) == canon
    assert items(canon)[key] == str(2**44)


@pytest.mark.parametrize(
    "env,config,blamed,key",
    [
        ({}, "bogus:1", "the config argument 'bogus:1'", "unknown key 'bogus'"),
        ({}, {"nope": 1}, "the config argument {'nope': 1}", "unknown key 'nope'"),
        ({"MEMALLOC_CONF": "bogus:1"}, "host_devices:2", "MEMALLOC_CONF", "unknown key 'bogus'"),
        (
            {"MEMALLOC_CONF": "host_devices:2"},
            "host_devices:0",
            "the config argument 'host_devices:0'",
            "host_devices must be between 1 and 64",
        ),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:abc"},
            None,
            "PYTORCH_CUDA_ALLOC_CONF",
            "value 'abc' of key 'max_split_size_mb'",
        ),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:abc", "MEMALLOC_CONF": "bogus:1"},
            "nope:1",
            "PYTORCH_CUDA_ALLOC_CONF",
            "max_split_size_mb",
        ),  # the lowest layer at fault first
    ],
    ids=["config-str", "config-mapping", "env", "config-value", "torch-env", "all-three"],
)
def test_a_bad_key_is_blamed_on_where_it_came_from(monkeypatch, env, config, blamed, key):
    """enable()'s layers (torch's variable, MEMALLOC_CONF, config=): the
    message names the one the bad entry is in (issue 37: config="bogus:1"
    was blamed on MEMALLOC_CONF). enable() refuses before changing anything."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(memalloc.errors.InvalidArgumentError) as info:
        memalloc.enable(backend="host", config=config)
    msg = str(info.value)
    assert msg.startswith(f"{blamed}") and key in msg, msg
    others = {"the config argument", "MEMALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"} - {
        blamed.split(" {")[0].split(" '")[0]
    }
    assert not any(other in msg for other in others), msg
