"""torch's CUDA IPC handle bytes as memalloc reads and writes them
(csrc/boundary/torch/ipc_wire.h), against layouts this test packs itself from
native torch's format (read from its wheels: torch 2.11's version 2
with a 24-byte header, 2.13/2.14's version 3 with a 32-byte header carrying
the page handle type). The CUDA half (pages exported, mapped in another
process, native on either side) is tests/gpu/test_cuda_ipc.py."""

from __future__ import annotations

import os
import struct

import pytest
import torch

from memalloc import _C

T = _C._testing
RAW = bytes(range(64))


def native_e_v2(pid: int, page: int, payload: list[bytes]) -> bytes:
    """torch 2.11's 'e' handle: ShareHeader{pid_t; size_t; size_t} (24 bytes)."""
    return bytes([2]) + b"e" + struct.pack("<iiQQ", pid, 0, page, len(payload)) + b"".join(payload)


def native_e_v3(pid: int, page: int, handle_type: int, payload: list[bytes], pad: int = 0) -> bytes:
    """torch 2.13's: the same header plus an int handle type (32 bytes); the
    pad bytes are left unset there (#198305), so they are not read."""
    return (
        bytes([3]) + b"e" + struct.pack("<iiQQii", pid, pad, page, len(payload), handle_type, pad) + b"".join(payload)
    )


def test_legacy_and_versioned_cuda_malloc_handles_give_the_64_bytes():
    assert T.ipc_decode(RAW) == {"version": 0, "type": "c", "cuda_ipc": RAW}
    for version in (1, 2, 3):  # 2.13/2.14 send version 3: refused before this change
        assert T.ipc_decode(bytes([version]) + b"c" + RAW) == {"version": version, "type": "c", "cuda_ipc": RAW}
        assert T.ipc_encode_cuda_malloc(version, RAW) == bytes([version]) + b"c" + RAW
    assert T.ipc_encode_cuda_malloc(0, RAW) == RAW


def test_torch_2_11_expandable_handle_with_posix_descriptors():
    fds = [17, 18, 40]
    d = T.ipc_decode(native_e_v2(4242, 20 << 20, [struct.pack("<i", f) for f in fds]))
    assert (d["version"], d["type"], d["pid"], d["page_bytes"], d["handle"], d["fds"]) == (
        2,
        "e",
        4242,
        20 << 20,
        "posix_fd",
        fds,
    )


def test_torch_2_11_expandable_handle_with_fabric_handles_is_told_by_its_length():
    blobs = [os.urandom(64), os.urandom(64)]
    d = T.ipc_decode(native_e_v2(7, 2 << 20, blobs))
    assert (d["handle"], d["fabric"], d["fds"]) == ("fabric", blobs, [])


@pytest.mark.parametrize("pad", [0, 0x5A5A5A5A])
def test_torch_2_13_expandable_handle_reads_the_type_and_ignores_the_pad(pad):
    d = T.ipc_decode(native_e_v3(99, 2 << 20, 1, [struct.pack("<i", 5)], pad=pad))
    assert (d["version"], d["pid"], d["handle"], d["fds"]) == (3, 99, "posix_fd", [5])
    blob = os.urandom(64)
    assert T.ipc_decode(native_e_v3(99, 2 << 20, 2, [blob], pad=pad))["fabric"] == [blob]


@pytest.mark.parametrize("version", [2, 3])
def test_memalloc_writes_what_native_writes(version):
    fds, pid, page = [3, 9, 11, 12], 31337, 2 << 20
    payload = [struct.pack("<i", f) for f in fds]
    expected = native_e_v2(pid, page, payload) if version == 2 else native_e_v3(pid, page, 1, payload)
    assert T.ipc_encode_expandable(version, pid, page, fds) == expected
    assert T.ipc_decode(expected)["fds"] == fds


def test_the_version_sent_is_the_installed_torchs():
    assert [T.ipc_version_for_torch(2, m) for m in (10, 11, 12, 13, 14)] == [2, 2, 2, 3, 3]
    assert T.ipc_version_for_torch(3, 0) == 3
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    assert T.ipc_version_built == T.ipc_version_for_torch(major, minor)


@pytest.mark.parametrize(
    "handle, says",
    [
        (b"", "0 bytes are too few"),
        (bytes([4]) + b"c" + RAW, "version 4 of a 'c' handle"),
        (bytes([2]) + b"c" + RAW[:10], "a 'c' handle has 66 bytes"),
        (bytes([2]) + b"x" + RAW, "unknown type byte 120"),
        (bytes([1]) + b"e" + bytes(40), "version 1 of an 'e' handle"),
        (bytes([2]) + b"e" + bytes(10), "24-byte header"),
        (native_e_v2(1, 2 << 20, [b"abc"]), "1 pages in 3 bytes of payload"),
        (native_e_v3(1, 2 << 20, 7, [b"abcd"]), "page handle type 7"),
        (native_e_v3(1, 2 << 20, 1, [b"abcd", b"ab"]), "2 pages need 8 bytes of payload, not 6"),
        (native_e_v2(1, 0, [b"abcd"]), "no pages"),
    ],
)
def test_an_unreadable_handle_is_refused_naming_what_is_wrong(handle, says):
    with pytest.raises(_C.InvalidArgumentError) as e:
        T.ipc_decode(handle)
    assert says in str(e.value) and "torch 2.11 to 2.14" in str(e.value)
