"""Handing a descriptor to another process of this user through ``/proc/<pid>/fd``, then releasing it.

:mod:`multiprocessing` passes a descriptor outside a spawn through its *resource sharer*: the
receiver connects to a socket of the sender, both sides run an HMAC challenge, and a thread of the
sender sends the descriptor with ``SCM_RIGHTS``: about 1 ms of hand-shake and wake-ups on both
sides for each descriptor (0.2 ms on a quiet machine, several on a busy one).  Here instead:

- the sender duplicates the descriptor (so that it stays open even when the sender drops its own
  object right after pickling, as ``queue.put(td); del td`` does), writes a fresh *token* into a
  slot of its small *release table* (a memfd of 8-byte slots) and pickles
  ``(pid, dup, table, slot, token)``;
- the receiver opens ``/proc/<pid>/fd/<dup>`` (the kernel allows it to processes of the same user),
  checks that it is the expected file (device and inode, sent along) and writes 0 into the slot:
  about 20 µs;
- the sender's release thread, which runs every 20 ms while duplicates are held, closes those
  whose slot was cleared, so the memory is freed once every process that holds it dropped it,
  as after ``SCM_RIGHTS`` (at most 20 ms later).

A duplicate that is never received stays open until the sender exits, as with the resource sharer.
Where ``/proc`` cannot be used (another OS, a process the kernel does not let others inspect, no
``memfd``), :func:`send_fd` returns None and the caller falls back to :mod:`multiprocessing`.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
import threading
import time
from typing import Any

from ._errors import MemmapError

__all__ = ["receive_fd", "release", "release_thread_running", "send_fd", "unreleased"]

_SLOTS = 4096
_HEADER = 8  # (reserved) slots follow, 8 bytes each
_POLL = 0.02
_PR_GET_DUMPABLE = 3


def _dumpable() -> bool:
    """Whether other processes of this user may open ``/proc/<this pid>/fd/*`` (PR_GET_DUMPABLE)."""
    try:
        return bool(ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 1)
    except (OSError, AttributeError):
        return False


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


class _Table:
    """This process's release table, its held duplicates and the thread that closes them."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("handoff-release", os.MFD_CLOEXEC)  # (not "tdshare*": those are segments)
        os.ftruncate(self.fd, _HEADER + 8 * _SLOTS)
        self.map = mmap.mmap(self.fd, _HEADER + 8 * _SLOTS)
        self.slots = memoryview(self.map)[_HEADER:].cast("Q")
        st = os.fstat(self.fd)
        self.ident = (st.st_dev, st.st_ino)
        self.pid = os.getpid()
        self.ns = _pid_namespace()
        self.lock = threading.Lock()
        self.held: dict[int, tuple[int, int]] = {}  # slot -> (token, duplicate descriptor)
        self.free = list(range(_SLOTS - 1, -1, -1))
        self.token = 0
        self.thread: threading.Thread | None = None
        self.busy = threading.Event()  # set while duplicates are held

    def reap(self) -> None:
        """Close the duplicates whose receiver cleared their slot."""
        with self.lock:
            slots = self.slots
            done = [s for s, (token, _) in self.held.items() if slots[s] != token]
            for s in done:
                os.close(self.held.pop(s)[1])
                self.free.append(s)
            if not self.held:
                self.busy.clear()

    def _run(self) -> None:
        # Polls while it holds duplicates: a receiver that woke it (a futex wake) would pay the
        # switch to this thread on its own critical path (0.1-0.3 ms on a busy machine), so
        # receivers only clear their slot, and a duplicate is closed at most _POLL s later.
        while True:
            self.busy.wait()
            time.sleep(_POLL)
            self.reap()

    def send(self, fd: int) -> tuple[int, int, int, int] | None:
        with self.lock:
            if not self.free:
                return None
            slot = self.free.pop()
            self.token += 1
            dup = os.dup(fd)
            self.slots[slot] = self.token
            self.held[slot] = (self.token, dup)
            token = self.token
            self.busy.set()
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="tdshare-release", daemon=True)
            self.thread.start()
        return dup, slot, token, self.fd


_TABLE: list[_Table | None] = [None]
_USABLE: list[bool | None] = [None]


_TABLE_LOCK = threading.Lock()


def _table() -> _Table | None:
    table = _TABLE[0]
    if table is None:
        with _TABLE_LOCK:  # (two threads pickling at once make one table)
            return _new_table()
    return table


def _new_table() -> _Table | None:
    table = _TABLE[0]
    if table is None:
        if _USABLE[0] is None:
            _USABLE[0] = sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd") and _dumpable()
        if not _USABLE[0]:
            return None
        try:
            table = _TABLE[0] = _Table()
        except OSError:
            _USABLE[0] = False
            return None
    return table


def send_fd(fd: int) -> tuple[Any, ...] | None:
    """What a receiver needs to open ``fd`` of this process (see :func:`receive_fd`), or None when
    this process cannot hand descriptors through ``/proc``; a duplicate is held until received.

    Args:
        fd: an open descriptor (a memfd).

    Returns:
        ``(pid, pid namespace, duplicate, device, inode, table, slot, token, table device,
        table inode)``, a tuple of ints to pickle; or None.

    >>> import os
    >>> fd = os.memfd_create("x")
    >>> code = send_fd(fd)
    >>> code is None or code[0] == os.getpid()
    True
    >>> release(code) if code is not None else None
    """
    table = _table()
    if table is None:
        return None
    sent = table.send(fd)
    if sent is None:
        return None
    dup, slot, token, tfd = sent
    st = os.fstat(fd)
    return (table.pid, table.ns, dup, st.st_dev, st.st_ino, tfd, slot, token, *table.ident)


# The release tables of the senders this process received from, mapped: (pid, table device, inode).
_SENDERS: dict[tuple[int, int, int], tuple[mmap.mmap, memoryview]] = {}
_SENDERS_MAX = 64
_SENDERS_LOCK = threading.Lock()


def _sender_table(pid: int, tfd: int, ident: tuple[int, int]) -> tuple[mmap.mmap, memoryview] | None:
    key = (pid, *ident)
    with _SENDERS_LOCK:
        known = _SENDERS.get(key)
        if known is not None:
            return known
        try:
            fd = os.open(f"/proc/{pid}/fd/{tfd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != ident:
                return None
            m = mmap.mmap(fd, _HEADER + 8 * _SLOTS)
        finally:
            os.close(fd)
        if len(_SENDERS) >= _SENDERS_MAX:
            _SENDERS.pop(next(iter(_SENDERS)))
        known = _SENDERS[key] = (m, memoryview(m)[_HEADER:].cast("Q"))
        return known


def release(code: tuple[Any, ...]) -> None:
    """Tell the sender of ``code`` (from :func:`send_fd`) that its duplicate may be closed: the
    receiver has the file (opened, or already held).

    Args:
        code: what :func:`send_fd` returned in the sending process.

    >>> import os
    >>> code = send_fd(os.memfd_create("x"))
    >>> release(code) if code is not None else None
    """
    pid, _, _, _, _, tfd, slot, token, tdev, tino = code
    if pid == os.getpid() and _TABLE[0] is not None and _TABLE[0].ident == (tdev, tino):
        table = _TABLE[0]
        if table.slots[slot] == token:
            table.slots[slot] = 0
        table.reap()
        return
    sender = _sender_table(pid, tfd, (tdev, tino))
    if sender is None:  # the sender is gone (its duplicates with it) or cannot be reached
        return
    slots = sender[1]
    if slots[slot] == token:
        slots[slot] = 0


def receive_fd(code: tuple[Any, ...]) -> int:
    """Open the descriptor that :func:`send_fd` described, and release the sender's duplicate.

    Args:
        code: what :func:`send_fd` returned in the sending process.

    Returns:
        A new descriptor of the same file (the caller owns it).

    Raises:
        MemmapError: the sender exited (or closed the file) before it was received, or is in
            another pid namespace, or the kernel refused to open it (the message says which).

    >>> import os
    >>> fd = os.memfd_create("x")
    >>> code = send_fd(fd)
    >>> code is None or os.fstat(receive_fd(code)).st_ino == os.fstat(fd).st_ino
    True
    """
    pid, ns, dup, dev, ino = code[:5]
    if ns and ns != _pid_namespace():
        raise MemmapError(
            f"Cannot receive this anonymous shared memory: it was sent by process {pid} of another pid namespace "
            "(a container), which this process cannot reach through /proc. Memory-map the tensordict to a folder "
            "both can open (memmap_(prefix=...)) to share it across namespaces."
        )
    try:
        fd = os.open(f"/proc/{pid}/fd/{dup}", os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        gone = err.errno in (errno.ENOENT, errno.ESRCH)
        why = (
            "the process that sent it exited (and its memory with it) before it was received"
            if gone
            else f"the kernel refused to open it through /proc ({os.strerror(err.errno or 0)})"
        )
        raise MemmapError(
            f"Cannot receive this anonymous shared memory from process {pid}: {why}. Anonymous memory lives only as "
            "long as a process holds it, and is reachable only by processes of the same user; to hand data to "
            "processes that outlive the sender, memory-map it to a folder (memmap_(prefix=...), e.g. under /dev/shm)."
        ) from None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (dev, ino):
        os.close(fd)
        raise MemmapError(
            f"Cannot receive this anonymous shared memory from process {pid}: the sender released it before it "
            "was received (it was received already, or the process exited). Each pickle of an anonymous "
            "tensordict can be received once, while the sender lives; pickle it again to hand it to another process."
        )
    release(code)
    return fd


def unreleased() -> int:
    """How many duplicates this process holds for receivers that have not received them yet.

    >>> unreleased() >= 0
    True
    """
    table = _TABLE[0]
    if table is None:
        return 0
    table.reap()
    return len(table.held)


def release_thread_running() -> bool:
    """Whether this process's release thread runs (started by the first :func:`send_fd`).

    >>> isinstance(release_thread_running(), bool)
    True
    """
    table = _TABLE[0]
    return table is not None and table.thread is not None and table.thread.is_alive()


def _after_fork_in_child() -> None:
    # The duplicates are the parent's to release (its receivers ack its table); the child's copies
    # would keep the memory alive as long as the child lives.  Its own table is made on first use.
    table = _TABLE[0]
    _TABLE[0] = None
    _SENDERS.clear()
    global _SENDERS_LOCK, _TABLE_LOCK
    _SENDERS_LOCK = threading.Lock()
    _TABLE_LOCK = threading.Lock()
    if table is not None:
        for _, dup in table.held.values():
            try:
                os.close(dup)
            except OSError:
                pass
        try:
            os.close(table.fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
