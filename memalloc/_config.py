"""Configuration text: MEMALLOC_CONF from the environment merged with the
``config`` argument of :func:`memalloc.enable`.

The format is PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` style,
``key:value,key:value``. Parsing and validation happen once, in C++
(``_C.parse_config``), so the environment, the Python API and the tests share
one parser and one set of error messages.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Union

from . import _C

ConfigLike = Union[str, Mapping[str, object], None]

ENV_VAR = "MEMALLOC_CONF"


def config_text(config: ConfigLike = None, *, use_env: bool = True) -> str:
    """Returns the canonical config text: ``$MEMALLOC_CONF`` first, then
    ``config`` (a ``key:value,...`` string or a mapping), later keys winning.

    Raises ValueError (``memalloc.InvalidArgumentError``) naming an unknown
    key or a malformed value, with the valid keys.
    """
    parts = []
    if use_env and os.environ.get(ENV_VAR):
        parts.append(os.environ[ENV_VAR])
    if isinstance(config, Mapping):
        parts.append(",".join(f"{k}:{_value_text(v)}" for k, v in config.items()))
    elif isinstance(config, str):
        parts.append(config)
    elif config is not None:
        raise TypeError(
            f"config must be a 'key:value,...' string or a mapping, not {type(config).__name__}"
        )
    return _C.parse_config(",".join(p for p in parts if p))


def config_value(text: str, key: str) -> Optional[str]:
    """The value of ``key`` in canonical config text, or None."""
    for item in text.split(","):
        k, _, v = item.partition(":")
        if k == key:
            return v
    return None


def _value_text(value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)
