"""Renderings of the breakdown (bytes by category, memalloc/features/
breakdown.py) and of the advisor's list (memalloc/features/advisor.py) as
text. They take plain data, the dicts of ``MemoryBreakdown.to_dict()`` and
``Advice.to_dict()`` (sizes in bytes); nothing here reads the allocator."""

from __future__ import annotations

from collections.abc import Sequence

from memalloc.core._format import fmt_bytes


def breakdown_text(b: dict, categories: Sequence[str]) -> str:
    """A table: one row per category of ``categories``, in their order,
    bytes and share now and at the peak. ``b``: ``MemoryBreakdown.to_dict()``
    (``device``, ``phase``, ``now``, ``peak``, ``peak_step``, the totals and
    the provisional bytes)."""
    where = f"step {b['peak_step']}'s peak" if b["peak_step"] is not None else "peak so far"
    now, peak = b["now"], b["peak"]
    now_total, peak_total = sum(now.values()), sum(peak.values())
    lines = [
        f"memory by category, device {b['device']} (phase: {b['phase']})",
        f"  {'category':<16}{'now':>12}{'':>7}{where:>20}{'':>7}",
    ]
    for c in categories:
        lines.append(
            f"  {c:<16}{fmt_bytes(now[c]):>12}{_share(now[c], now_total):>7}"
            f"{fmt_bytes(peak[c]):>20}{_share(peak[c], peak_total):>7}"
        )
    lines.append(f"  {'total':<16}{fmt_bytes(now_total):>12}{'':>7}{fmt_bytes(peak_total):>20}")
    if b["now_provisional"] or b["peak_provisional"]:
        lines.append(
            f"  (provisional: {fmt_bytes(b['now_provisional'])} now, "
            f"{fmt_bytes(b['peak_provisional'])} at the peak; decided when the step goes on)"
        )
    return "\n".join(lines)


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else ""


def advice_text(advice: Sequence[dict], peak_total: int, largest: str) -> str:
    """The advice (``Advice.to_dict()`` each: strategy, saves in bytes, why,
    cost) as lines, in the order given: a leak as "fix the leak at
    file:line: +X per step", every other strategy with the bytes it saves
    and their share of ``peak_total`` (allocated bytes at the peak, whose
    ``largest`` category the head names)."""
    lines = [f"memalloc advice (peak allocated {fmt_bytes(peak_total)}; the largest part: {largest}):"]
    for a in advice:
        if a["strategy"] == "fix_leak":
            lines.append(f"  {a['strategy']:<20} {a['why']}; hint: {a['cost']}")
            continue
        if a["strategy"] == "del_empty_cache":
            what = "reserved between steps"
        else:
            what = f"of the peak ({100 * a['saves'] / peak_total:.0f}%)" if peak_total else "of the peak"
        lines.append(f"  {a['strategy']:<20} saves ~{fmt_bytes(a['saves'])} {what}: {a['why']}; cost: {a['cost']}")
    return "\n".join(lines)


__all__ = ["advice_text", "breakdown_text"]
