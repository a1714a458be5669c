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


def describe_split(split: dict[str, int]) -> str:
    """``split`` (bytes by category) on one line, largest first, zeros left
    out: "activations 5.20 GiB (81%), optimizer_state 651.18 MiB (10%), ..."
    ("" when every category is 0). The one rendering of a breakdown's split:
    the step tracker, ``run``'s summary, ``top`` and ``postmortem``."""
    whole = sum(split.values())
    return ", ".join(
        f"{c} {fmt_bytes(v)} ({100 * v / whole:.0f}%)" for c, v in sorted(split.items(), key=lambda kv: -kv[1]) if v
    )
