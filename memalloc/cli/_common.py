"""Helpers shared by the commands: byte formatting and enabling with a clean
error (no traceback) for configuration mistakes."""
from __future__ import annotations

from typing import Optional

from .. import _install


def fmt_bytes(n: float) -> str:
    """``n`` bytes as a short human string (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_or_exit(backend: str, config: Optional[str]) -> None:
    """The checks enable() makes before changing anything (config text,
    backend name, CUDA usable), without enabling; exits with the message."""
    from .._config import config_text

    try:
        chosen = _install.resolve_backend(backend, config_text(config))
    except (ValueError, TypeError) as e:
        raise SystemExit(f"memalloc: {e}") from None
    if chosen == "cuda" and not _install.cuda_usable()[0]:
        raise SystemExit(f"memalloc: CUDA is not usable: {_install.cuda_usable()[1]}")


def enable_or_exit(backend: str, config: Optional[str]) -> str:
    """memalloc.enable(); a bad backend/config/state exits with its message."""
    try:
        return _install.enable(backend, config)
    except (ValueError, RuntimeError, TypeError) as e:
        raise SystemExit(f"memalloc: {e}") from None
