"""Helpers shared by the commands: enabling with a clean error (no
traceback) for configuration mistakes."""

from __future__ import annotations

from memalloc.core import _state
from memalloc.core._config import config_text
from memalloc.install import _install


def check_or_exit(backend: str, config: str | None) -> None:
    """The checks enable() makes before changing anything (config text,
    backend name, CUDA usable), without enabling; exits with the message."""
    try:
        chosen = _state.resolve_backend(backend, config_text(config))
    except (ValueError, TypeError) as e:
        raise SystemExit(f"memalloc: {e}") from None
    if chosen == "cuda" and not _state.cuda_usable()[0]:
        raise SystemExit(f"memalloc: CUDA is not usable: {_state.cuda_usable()[1]}")


def enable_or_exit(backend: str, config: str | None) -> str:
    """memalloc.enable(); a bad backend/config/state exits with its message."""
    try:
        return _install.enable(backend, config)
    except (ValueError, RuntimeError, TypeError) as e:
        raise SystemExit(f"memalloc: {e}") from None
