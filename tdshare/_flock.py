"""InterProcessLock: one exclusive lock for the threads of a process and for every process.

It is an ``flock`` on a descriptor the lock keeps open for its whole life, so taking and
releasing it costs two system calls (about 1 µs here), where opening and closing a lock file
around each use, as :mod:`filelock` does, costs two orders of magnitude more.  It is:

- **reentrant** in the thread that holds it, and exclusive between threads (an ``RLock``);
- **fork-safe**: a child never inherits a held lock.  After a fork the child closes its copies of
  the descriptors (closing a copy does not release the parent's lock, ``LOCK_UN`` would) and opens
  its own on first use;
- **crash-safe**: the kernel releases the ``flock`` of a process that dies, even by SIGKILL.

>>> import os, tempfile
>>> lock = InterProcessLock(os.path.join(tempfile.mkdtemp(), "x.lock"))
>>> with lock:
...     with lock:  # reentrant
...         lock.is_held
True
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import weakref
from types import TracebackType

__all__ = ["InterProcessLock", "lock_for"]

_LIVE: weakref.WeakSet[InterProcessLock] = weakref.WeakSet()
# One lock object per lock file per process: a second object would open a second descriptor,
# and its flock would wait forever on the first one's, held by this very process.
_BY_PATH: weakref.WeakValueDictionary[str, InterProcessLock] = weakref.WeakValueDictionary()
_BY_PATH_GUARD = threading.Lock()
_HELD: set[InterProcessLock] = set()  # a held lock stays alive (and in _BY_PATH) until released


def lock_for(path: str) -> InterProcessLock:
    """The process's one :class:`InterProcessLock` on ``path`` (made on first use).

    Every caller that locks the same file gets the same object, so the lock stays reentrant even
    when the object that first asked for it (a registry) is gone while the lock is held.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.lock")
    >>> lock_for(path) is lock_for(path)
    True
    """
    with _BY_PATH_GUARD:
        lock = _BY_PATH.get(path)
        if lock is None:
            lock = InterProcessLock(path)
            _BY_PATH[path] = lock
        return lock


def _close(fd: int, pid: int) -> None:
    if os.getpid() == pid:  # a forked child closed its copy already, and its number may be reused
        try:
            os.close(fd)
        except OSError:
            pass


class InterProcessLock:
    """An exclusive, reentrant lock on the file ``path`` (created with mode 0600 if missing)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._finalizer: weakref.finalize | None = None
        self._count = 0
        self._thread_lock = threading.RLock()
        _LIVE.add(self)

    @property
    def is_held(self) -> bool:
        """Whether this process holds the lock."""
        return self._count > 0

    def _descriptor(self) -> int:
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._fd = fd
            self._finalizer = weakref.finalize(self, _close, fd, os.getpid())
        return self._fd

    def acquire(self, timeout: float | None = None) -> None:
        """Take the lock, waiting at most ``timeout`` seconds (None: as long as it takes).

        Raises:
            TimeoutError: another thread or process held it for the whole ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._thread_lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise TimeoutError(f"Could not take the lock {self.path!r} within {timeout} s: another thread holds it.")
        try:
            if self._count == 0:
                self._lock_file(deadline, timeout)
                _HELD.add(self)
            self._count += 1
        except BaseException:
            self._thread_lock.release()
            raise

    def _lock_file(self, deadline: float | None, timeout: float | None) -> None:
        fd = self._descriptor()
        if deadline is None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks in the kernel, without the GIL
            return
        delay = 1e-4
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"Could not take the lock {self.path!r} within {timeout} s: another process holds it."
                    ) from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, 0.02)

    def release(self) -> None:
        """Release one level of the lock (the file lock with the outermost one).

        Raises:
            RuntimeError: this thread does not hold it.
        """
        if self._count == 0:
            raise RuntimeError(f"Releasing the lock {self.path!r}, which this process does not hold.")
        self._count -= 1
        if self._count == 0:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            _HELD.discard(self)
        self._thread_lock.release()

    def __enter__(self) -> InterProcessLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _after_fork_in_child() -> None:
    global _BY_PATH_GUARD
    _BY_PATH_GUARD = threading.Lock()  # another thread may have held it at the fork
    for lock in list(_LIVE):
        if lock._fd is not None:
            if lock._finalizer is not None:
                lock._finalizer.detach()
            try:
                os.close(lock._fd)  # the parent's lock stays held by the parent's descriptor
            except OSError:
                pass
            lock._fd = None
        lock._count = 0
        lock._thread_lock = threading.RLock()
    _HELD.clear()  # the child holds none of the parent's locks


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
