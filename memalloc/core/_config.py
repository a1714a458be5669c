"""Configuration text: MEMALLOC_CONF from the environment merged with the
``config`` argument of :func:`memalloc.enable`.

The format is PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` style,
``key:value,key:value``. Parsing and validation happen once, in C++
(``_C.parse_config``), so the environment, the Python API and the tests share
one parser and one set of error messages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from memalloc import _C

ConfigLike = str | Mapping[str, object] | None

ENV_VAR = "MEMALLOC_CONF"
# What memalloc.enable() (and so ``python -m memalloc run`` and the
# environment switch) installs before any of the user's keys, which win:
# expandable segments, so that a user who never heard of the setting does
# not get native's fragmentation (README, "Fit more, by default", and
# docs/results.md give the figures that had to hold first). The plain
# policy is one key away: ``expandable_segments:False``.
# The engine's own Config{} (``_C.Allocator(backend, "")``, the replay tools'
# '' config) stays torch's native default, the reference the tests model.
PRODUCT_DEFAULTS = "expandable_segments:True"
# Stack capture modes (record_stacks / record_history(stacks=...)): name -> number, as _C defines them.
STACK_MODES: dict[str, int] = dict(_C.STACK_MODES)


def config_text(
    config: ConfigLike = None, *, use_env: bool = True, base: str = "", base_source: str = "memalloc's base config"
) -> str:
    """Returns the canonical config text: ``base`` (raw config text, e.g.
    :data:`PRODUCT_DEFAULTS`) first, then ``$MEMALLOC_CONF``, then ``config``
    (a ``key:value,...`` string or a mapping), later keys winning; all parsed
    at once, so a later key that sets the engine's own default (which the
    canonical text leaves out) still overrides an earlier one.

    Raises ValueError (``memalloc.errors.InvalidArgumentError``) naming an unknown
    key or a malformed value, with the valid keys, and where it came from
    (the ``config`` argument, ``$MEMALLOC_CONF``, or ``base``, named by
    ``base_source``: enable() names torch's ``PYTORCH_CUDA_ALLOC_CONF`` when
    its keys are in it); in a mapping, a key or value containing ',' or ':'
    is malformed (it would set other keys).
    """
    layers = [(lambda: base_source, base)]
    if use_env and os.environ.get(ENV_VAR):
        layers.append((lambda: ENV_VAR, os.environ[ENV_VAR]))
    if isinstance(config, Mapping):
        layers.append(
            (lambda: f"the config argument {dict(config)!r}", ",".join(_entry_text(k, v) for k, v in config.items()))
        )
    elif isinstance(config, str):
        layers.append((lambda: f"the config argument {config!r}", config))
    elif config is not None:
        raise TypeError(f"config must be a 'key:value,...' string or a mapping, not {type(config).__name__}")
    try:
        return _C.parse_config(",".join(text for _, text in layers if text))
    except _C.InvalidArgumentError as e:
        raise _blamed(e, layers) from None


# The core's messages name the syntax's usual home; the layer at fault replaces it.
_CORE_PREFIX = f"{ENV_VAR}: "


def _blamed(error: Exception, layers: list) -> Exception:
    """``error`` (from parsing the layers together) naming the first layer
    that fails alone; unchanged when each parses alone."""
    for source, text in layers:
        if not text:
            continue
        try:
            _C.parse_config(text)
        except _C.InvalidArgumentError as alone:
            message = str(alone)
            if message.startswith(_CORE_PREFIX):
                message = message[len(_CORE_PREFIX) :]
            return type(error)(f"{source()}: {message}")
    return error


def config_value(text: str, key: str) -> str | None:
    """The value of ``key`` in canonical config text, or None."""
    for item in text.split(","):
        k, _, v = item.partition(":")
        if k == key:
            return v
    return None


def _entry_text(key: object, value: object) -> str:
    """``key:value`` for one mapping entry. A key or value holding the
    syntax's own ',' or ':' would be read as more entries (silently setting
    other keys): it is refused, naming the entry."""
    key_text = str(key)
    value_text = ("True" if value else "False") if isinstance(value, bool) else str(value)
    for text, where in ((key_text, f"key {key_text!r}"), (value_text, f"value {value_text!r} of key {key_text!r}")):
        if "," in text or ":" in text:
            raise _C.InvalidArgumentError(
                f"config mapping: {where} contains ',' or ':', which would be read as more entries; "
                "give each key its own entry, e.g. {'host_devices': 2, 'host_capacity_mb': 64}"
            )
    return f"{key_text}:{value_text}"
