"""graph_capture_record_stream_reuse on the simulated device: a block freed
during a CUDA graph capture after record_stream() is reused within the
capture once the captured graph orders every use of it before the
allocating stream's next work, and not before (capture_reuse.h).

The host backend simulates the capture's graph (memalloc._C._testing's
capture_begin / capture_work / capture_wait / capture_end: a kernel, and
``waiter.wait_stream(stream)``); the route into the graph's pool is the
capture's allocation route, as torch's CUDAGraph opens it. The first two
tests are torch's test_graph_capture_reclaim_2_streams and _4_streams
(upstream test/test_cuda.py) step by step; each expected address is the one
native gives there.
"""

import pytest
from memtest_helpers import Checked

from memalloc import _C

T = _C._testing
GRAPH = (5, 0)
S1, S2, S3, S4 = 11, 12, 13, 14
SMALL = 32  # bytes: torch.empty(8) of float32
REUSE = "host_capacity_mb:64,graph_capture_record_stream_reuse:True"


def capture(a, streams):
    a.begin_allocate_to_pool(GRAPH, list(streams))
    T.capture_begin(a.a, streams[0])


def end_capture(a, stream):
    T.capture_end(a.a, stream)
    a.end_allocate_to_pool(GRAPH)


def two_streams(a):
    """torch's test_graph_capture_reclaim_2_streams: (data1, data2, data3)."""
    capture(a, [S1, S2])
    sink1 = a.malloc(SMALL, 0, S1)
    data1 = a.malloc(SMALL, 0, S1)
    T.capture_wait(a.a, S2, S1)  # s2.wait_stream(s1)
    buf2 = a.malloc(SMALL, 0, S2)
    T.capture_work(a.a, S2)  # torch.add(data1, 2.0, out=buf2) on s2
    a.record_stream(data1, S2)
    a.free(data1)  # del data1: s2 still reads it
    data2 = a.malloc(SMALL, 0, S1)  # before the join
    T.capture_wait(a.a, S1, S2)  # s1.wait_stream(s2)
    T.capture_work(a.a, S1)  # sink1.fill_(1.0)
    data3 = a.malloc(SMALL, 0, S1)  # after the join
    end_capture(a, S1)
    for p in (sink1, buf2, data2, data3):
        a.free(p)
    return data1, data2, data3


def test_two_streams_reuse_only_after_the_join():
    data1, data2, data3 = two_streams(Checked(REUSE))
    assert data2 != data1
    assert data3 == data1


def test_four_streams_reuse_only_after_every_stream_joined():
    a = Checked(REUSE)
    capture(a, [S1, S2, S3, S4])
    data1 = a.malloc(SMALL, 0, S1)
    T.capture_work(a.a, S1)  # torch.ones fills it
    sink1 = a.malloc(SMALL, 0, S1)
    sink3 = a.malloc(SMALL, 0, S1)
    bufs = []
    for s in (S2, S3, S4):
        T.capture_wait(a.a, s, S1)
        bufs.append(a.malloc(SMALL, 0, s))
        T.capture_work(a.a, s)  # torch.add(data1, k, out=buf) on s
        a.record_stream(data1, s)
    a.free(data1)
    T.capture_wait(a.a, S1, S2)  # partial joins: s2 -> s1 ...
    T.capture_work(a.a, S1)
    T.capture_wait(a.a, S3, S4)  # ... and s4 -> s3
    T.capture_work(a.a, S3)
    a.record_stream(sink3, S3)
    data2 = a.malloc(SMALL, 0, S1)  # s3's and s4's reads are not before s1's next work
    T.capture_wait(a.a, S1, S3)  # the final join
    T.capture_work(a.a, S1)
    data3 = a.malloc(SMALL, 0, S1)
    end_capture(a, S1)
    assert data2 != data1
    assert data3 == data1
    for p in [sink1, sink3, data2, data3] + bufs:
        a.free(p)


def block_state(a, addr):
    return next(b["state"] for seg in a.segments() for b in seg["blocks"] if b["address"] == addr)


def test_without_the_setting_the_block_waits_for_the_capture_to_end():
    a = Checked()
    data1, data2, data3 = two_streams(a)
    assert data2 != data1 and data3 != data1  # native's default: no reuse during the capture
    # After the capture its event on s2 is recorded; it is free once s2's work is done.
    assert block_state(a, data1) == "active_pending_free"
    a.empty_cache()  # waits for the pending event, frees the block, releases what is free
    assert all(b["state"] != "active_pending_free" for seg in a.segments() for b in seg["blocks"])


@pytest.mark.parametrize("case", ["use on a stream outside the capture", "freed before any captured work"])
def test_a_block_without_markers_waits_for_the_capture_to_end(case):
    """As native: when one of its streams is not being captured, or no stream
    has captured work yet (empty frontiers), nothing in the graph orders its
    uses, so it is not reused during the capture."""
    a = Checked(REUSE)
    capture(a, [S1, S2])
    data1 = a.malloc(SMALL, 0, S1)
    if case == "use on a stream outside the capture":
        T.capture_work(a.a, S1)
        a.record_stream(data1, S3)  # S3 is not being captured
    else:
        T.capture_wait(a.a, S2, S1)
        a.record_stream(data1, S2)
    a.free(data1)
    T.capture_work(a.a, S1)
    assert a.malloc(SMALL, 0, S1) != data1
    end_capture(a, S1)


def test_only_the_allocation_stream_reuses_it():
    a = Checked(REUSE)
    capture(a, [S1, S2])
    data1 = a.malloc(SMALL, 0, S1)
    T.capture_wait(a.a, S2, S1)
    T.capture_work(a.a, S2)
    a.record_stream(data1, S2)
    a.free(data1)
    T.capture_work(a.a, S2)  # s2's frontier reaches the markers...
    assert a.malloc(SMALL, 0, S2) != data1  # ... but the block belongs to s1
    T.capture_wait(a.a, S1, S2)
    T.capture_work(a.a, S1)
    assert a.malloc(SMALL, 0, S1) == data1
    end_capture(a, S1)


def test_the_setting_applies_at_run_time():
    a = Checked()
    a.apply_settings("graph_capture_record_stream_reuse:True")
    assert "graph_capture_record_stream_reuse:True" in a.settings()
    data1, _, data3 = two_streams(a)
    assert data3 == data1
    a.apply_settings("graph_capture_record_stream_reuse:False")
    assert "graph_capture_record_stream_reuse" not in a.settings()
