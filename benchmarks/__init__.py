"""memalloc's benchmarks, arranged by what they measure; the one entry point
is ``python -m benchmarks`` (__main__.py lists them)."""
