"""The trace: every malloc/free the allocator's ring holds (recording), the
stack tags that name who caused them (tags, sites), memory_viz snapshots and
the trace files that carry them to another process."""
