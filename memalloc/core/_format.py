"""Formatting shared by every layer that prints sizes (bottom layer: no
memalloc imports)."""
from __future__ import annotations


def fmt_bytes(n: float) -> str:
    """``n`` bytes as a short human string (binary units: B, KiB, MiB, GiB, TiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
