"""Waiting for a 32-bit word of shared memory to change: Linux futexes, or polling elsewhere.

:class:`Futex` wraps one aligned 32-bit word of a shared, writable mapping (the generation
counter of a tree).  :meth:`Futex.wait` blocks until the word differs from a value or a timeout
expires; :meth:`Futex.wake` wakes every waiter, in any process that maps the same file.  A
shared (not process-private) futex on a file mapping is keyed by the file's page, so waiters
and wakers need only map the same file.  Where the ``futex`` system call is not available
(another OS, another architecture), :meth:`Futex.wait` polls with a sleep that grows to 1 ms.

>>> import mmap
>>> m = mmap.mmap(-1, 8)
>>> f = Futex(m, 0)
>>> f.wait(0, timeout=0.001)  # the word is 0 and stays 0: times out
False
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import time
from typing import Any

__all__ = ["Futex"]

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98, "ppc64le": 221, "s390x": 238}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall() -> Any:
    if _SYS_FUTEX is None or not hasattr(os, "sched_getaffinity"):  # Linux only
        return None
    try:
        # the interpreter's own symbols hold libc's: no ``find_library`` (it runs ``ldconfig -p``,
        # ~6 ms at every import of tdshare, a spawned worker's included)
        fn = getattr(ctypes.CDLL(None, use_errno=True), "syscall", None)
        if fn is None:
            fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return fn


_SYSCALL = _load_syscall()


class Futex:
    """One aligned 32-bit word at ``offset`` of the writable shared buffer ``buf`` (an mmap)."""

    __slots__ = ("_addr", "_word")

    def __init__(self, buf: Any, offset: int) -> None:
        # the ctypes view keeps ``buf`` alive (and exported) as long as this object lives
        self._word = ctypes.c_uint32.from_buffer(buf, offset)
        self._addr = ctypes.addressof(self._word)

    @property
    def value(self) -> int:
        return int(self._word.value)

    def wait(self, expected: int, timeout: float | None) -> bool:
        """Block while the word equals ``expected``, at most ``timeout`` seconds (None: no limit).

        Returns True once the word differs, False when the timeout expired first.  Spurious
        wake-ups are absorbed here.
        """
        expected &= 0xFFFFFFFF
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 20e-6
        while self._word.value == expected:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if _SYSCALL is None:
                time.sleep(delay if left is None else min(delay, left))
                delay = min(delay * 2, 1e-3)
                continue
            ts = None
            if left is not None:
                ts = _Timespec(int(left), int((left - int(left)) * 1e9))
            res = _SYSCALL(
                _SYS_FUTEX,
                ctypes.c_void_p(self._addr),
                _FUTEX_WAIT,
                ctypes.c_uint32(expected),
                None if ts is None else ctypes.byref(ts),
                None,
                0,
            )
            if res == -1 and ctypes.get_errno() not in (errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT):
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return True

    def wake(self) -> None:
        """Wake every process and thread waiting on the word (call after changing it)."""
        if _SYSCALL is not None:
            _SYSCALL(_SYS_FUTEX, ctypes.c_void_p(self._addr), _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
