"""Features on top of the recording: torch.cuda-style queries (stats), the
breakdown by category and its training landmarks (breakdown, phases), leak
tracking and the holders of leaked tensors (leaks, holders), the OOM report,
the per-step tracker, trace replay on the CPU and the advisor."""
