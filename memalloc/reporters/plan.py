"""Renderings of the batch planner's answers (memalloc/features/planner.py):
a plan (``BatchPlan.to_dict()``) as the text ``print(plan)`` and ``python -m
memalloc run --fit`` show, and the smallest device search's table. Sizes in
the data are bytes (the device sizes MiB, as named)."""

from __future__ import annotations

from memalloc.core._format import fmt_bytes


def plan_text(p: dict) -> str:
    """A plan (``BatchPlan.to_dict()``: batch, budget, predicted peaks,
    fixed and per-sample bytes, the perfect allocator's limit, the probes
    as (batch, peak allocated, peak reserved), whether the search reached
    max_batch and whether the replay was steady) as a few lines of text."""
    limit = "no limit (nothing grows with the batch)" if p["limit"] is None else f"{p['limit']}"
    return (
        f"largest batch that fits {fmt_bytes(p['budget'])}: {p['batch']}"
        f"{' (the most asked for: max_batch)' if p['capped'] else ''}; predicted peak reserved "
        f"{fmt_bytes(p['peak_reserved'])}, allocated {fmt_bytes(p['peak_allocated'])}\n"
        f"  the peak: {fmt_bytes(p['fixed_bytes'])} that does not grow with the batch, "
        f"{fmt_bytes(p['per_sample_bytes'])} per sample; a perfect allocator would fit {limit}\n"
        f"  probes (batch: peak allocated / reserved): "
        + ", ".join(f"{b}: {fmt_bytes(a)} / {fmt_bytes(r)}" for b, a, r in p["probes"])
        + (
            ""
            if p["steady"]
            else f"\n  not steady: the replay ran {p['repeats']} more steps without coming "
            "back to a state it had been in; the plan is for that many steps"
        )
    )


def smallest_device_text(smallest: dict[str, dict[str, int]]) -> str:
    """``{source: {config: MiB}}`` (the planner's smallest device search)
    as the lines ``replay --smallest-device`` prints."""
    lines = ["smallest device without an OOM (MiB):"]
    for source, by_config in smallest.items():
        for config, mb in by_config.items():
            lines.append(f"  {source}  {config or '(default)'}  {mb}")
    return "\n".join(lines)


__all__ = ["plan_text", "smallest_device_text"]
