"""Compatibility: torch's own allocator tests (upstream, unmodified), natively
and under memalloc."""
