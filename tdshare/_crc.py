"""The zip CRC-32, fast where possible, and combining the CRCs of pieces computed on threads.

:func:`crc32` is ISA-L's (the ``isal`` package, about 5x faster than zlib's here) when it
imports, otherwise :func:`zlib.crc32`: the same polynomial, so the same values.  Both release
the GIL, so the pieces of one payload are checked on threads and joined with
:func:`crc32_combine`.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import zlib
from typing import Any, Protocol

__all__ = ["CHUNK", "crc32", "crc32_combine", "crc32_threaded", "pool", "results"]

CHUNK = 8 << 20  # bytes per CRC task
_M32 = 0xFFFFFFFF


class Crc32(Protocol):
    def __call__(self, data: Any, value: int = 0, /) -> int: ...


def best_crc32() -> Crc32:
    """ISA-L's CRC-32 if the ``isal`` package imports, else zlib's."""
    try:
        from isal.isal_zlib import crc32 as fast

        if fast(b"123456789") != 0xCBF43926 or fast(b"6789", fast(b"12345")) != 0xCBF43926:
            return zlib.crc32  # a broken build: the standard check value says so
    except ImportError:  # no wheel for this platform
        return zlib.crc32
    return fast


crc32: Crc32 = best_crc32()
"""``crc32(data, value=0)``: the zip CRC-32 of ``data`` continuing from ``value``."""

_ZERO_OPS: list[list[int]] = []  # [k]: the GF(2) matrix appending 2**k zero bytes to a CRC register
_ZERO_LOCK = threading.Lock()


def _gf2_times(matrix: list[int], vector: int) -> int:
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)``."""
    with _ZERO_LOCK:
        while len(_ZERO_OPS) < len2.bit_length():
            if not _ZERO_OPS:  # one zero byte: column i is what register bit i becomes
                _ZERO_OPS.append([~zlib.crc32(b"\0", ~(1 << i) & _M32) & _M32 for i in range(32)])
            else:
                _ZERO_OPS.append([_gf2_times(_ZERO_OPS[-1], col) for col in _ZERO_OPS[-1]])
    for k in range(len2.bit_length()):
        if len2 >> k & 1:
            crc1 = _gf2_times(_ZERO_OPS[k], crc1)
    return crc1 ^ crc2


_POOLS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """A process-wide pool of ``threads`` threads (one per size, made on first use)."""
    with _POOLS_LOCK:
        if threads not in _POOLS:
            _POOLS[threads] = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="tdshare-tdz")
        return _POOLS[threads]


def _after_fork_in_child() -> None:
    # threads do not survive a fork, and a lock another thread held then would stay held
    global _POOLS_LOCK, _ZERO_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()
    _ZERO_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def results(futures: list[concurrent.futures.Future[Any]]) -> list[Any]:
    """The futures' results, once every one is done (so no thread still runs when an error propagates)."""
    concurrent.futures.wait(futures)
    return [f.result() for f in futures]


def crc32_threaded(buf: memoryview, threads: int) -> int:
    """The CRC-32 of ``buf``, in :data:`CHUNK` pieces on ``threads`` threads when it is larger."""
    if len(buf) <= CHUNK or threads < 2:
        return crc32(buf)
    starts = range(0, len(buf), CHUNK)
    crcs = results([pool(threads).submit(crc32, buf[a : a + CHUNK]) for a in starts])
    out = crcs[0]
    for a, c in zip(starts[1:], crcs[1:], strict=True):
        out = crc32_combine(out, c, min(CHUNK, len(buf) - a))
    return out
