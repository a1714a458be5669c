"""The private-pool calls CUDA graph trees make around each replay, timed on the
host backend (microseconds per call, medians of 5 repeats): checkpoint_pool
and restore_pool of a pool holding 200 live blocks, pool_live_blocks_are over
them, and 8 KiB malloc/free pairs with a route to the pool open and without.
Compare two builds side by side by running it once per tree, alternating:

    PYTHONPATH=<tree> python -m benchmarks pool-calls
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from memalloc._C import _testing

from memalloc import _C

POOL = (0, 7)  # a MemPool-style id: {0, id}
BLOCKS = 200


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def one_repeat() -> dict[str, float]:
    a = _C.Allocator("host")
    _testing.begin_allocate_to_pool(a, POOL, [0])
    ptrs = [a.malloc(4096 * (1 + i % 7)) for i in range(BLOCKS)]
    _testing.end_allocate_to_pool(a, POOL)
    state = _testing.checkpoint_pool(a, POOL)

    def pair() -> None:
        a.free(a.malloc(8192))

    out = {
        "live_check_us": per_call_us(lambda: _testing.pool_live_blocks_are(a, POOL, ptrs), 2000),
        "restore_us": per_call_us(lambda: _testing.restore_pool(a, state), 300),
        "checkpoint_us": per_call_us(lambda: _testing.checkpoint_pool(a, POOL), 300),
    }
    _testing.begin_allocate_to_pool(a, POOL, [0])
    out["routed_pair_us"] = per_call_us(pair, 20000)
    _testing.end_allocate_to_pool(a, POOL)
    out["pair_us"] = per_call_us(pair, 20000)
    return out


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m benchmarks pool-calls", description=__doc__.split("\n\n")[0]).parse_args(
        argv
    )
    print(_C.__file__, file=sys.stderr)
    repeats = [one_repeat() for _ in range(5)]
    print({key: round(statistics.median(r[key] for r in repeats), 3) for key in repeats[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
