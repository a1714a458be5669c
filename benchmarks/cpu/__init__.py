"""The C++ core on the host backend, no GPU: bench_core.cpp built by
core_build.py (the one builder of the standalone core), timed and counted in
callgrind instructions by suite.py, whose --check is CI's gate."""
