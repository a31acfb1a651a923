"""Anonymous shared-memory segments (``prefix=None``).

A :class:`Segment` is a ``memfd_create`` file: it has no name in any file system, and the kernel
frees it when the last file descriptor and mapping go away, even after ``SIGKILL``, so nothing can
leak.  Many leaves share one segment (an *arena*): each leaf is a view at a 64-byte aligned
offset, so 10,000 leaves cost one descriptor and one mapping instead of two per leaf.

Segments cross processes by descriptor: inherited under fork, passed with ``SCM_RIGHTS`` by
:mod:`multiprocessing` to a process being spawned (spawn/forkserver arguments), and otherwise
(queues, pipes, plain pickle) opened by the receiver through ``/proc/<pid>/fd`` (see
:mod:`tdshare._fd_pass`), or through :mod:`multiprocessing`'s resource sharer where that cannot be.
"""

from __future__ import annotations

import errno
import os
import weakref
from multiprocessing import reduction
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch

from ._errors import MemmapError
from ._fd_pass import receive_fd, release, send_fd
from ._indexing import contiguous_strides

__all__ = ["Segment", "ALIGN", "align"]

ALIGN = 64

# Live segments by the address of their mapping, so that a bare storage of a segment (for
# ``MemoryMappedTensor.from_storage``) finds its segment again and stays picklable.  A mapping
# cannot be at the same address as another while it lives, so the key is unambiguous.
_BY_ADDRESS: weakref.WeakValueDictionary[int, Segment] = weakref.WeakValueDictionary()

# Live segments by the (device, inode) of their memfd: a segment received (unpickled) while this
# process already maps it (the same tensordict handed off again, or back) is the one mapped here,
# its new descriptor closed.  A memfd's inode is unique while it lives, and the segment holds it open.
_BY_INODE: weakref.WeakValueDictionary[tuple[int, int], Segment] = weakref.WeakValueDictionary()


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _map_fd(fd: int, size: int) -> torch.Tensor:
    # torch maps the path itself and owns the mapping: it lives as long as any tensor viewing it.
    return torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=size, dtype=torch.uint8)


class Segment:
    """One anonymous shared-memory region, mapped once per process."""

    __slots__ = ("__weakref__", "_typed", "buffer", "fd", "size")

    def __init__(self, fd: int, size: int, buffer: torch.Tensor) -> None:
        self.fd = fd
        self.size = size
        self.buffer = buffer  # flat uint8 tensor over the whole mapping
        self._typed: dict[torch.dtype, torch.Tensor] = {}
        weakref.finalize(self, os.close, fd)
        if size:
            _BY_ADDRESS[buffer.data_ptr()] = self
            st = os.fstat(fd)
            _BY_INODE[st.st_dev, st.st_ino] = self

    @classmethod
    def from_fd(cls, fd: int, size: int) -> Segment:
        """Map the memfd ``fd`` (``size`` bytes; the segment owns and closes ``fd``)."""
        return cls(fd, size, _map_fd(fd, size) if size else torch.empty(0, dtype=torch.uint8))

    @staticmethod
    def of_storage(storage: torch.UntypedStorage) -> Segment | None:
        """The live segment whose whole mapping is ``storage``, if any."""
        seg = _BY_ADDRESS.get(storage.data_ptr()) if storage.nbytes() else None
        if seg is None or seg.buffer.untyped_storage().nbytes() != storage.nbytes():
            return None
        return seg

    @classmethod
    def create(cls, size: int, name: str = "tdshare") -> Segment:
        """A new zero-filled segment of ``size`` bytes, its memory reserved up front."""
        size = align(size)  # whole multiple of every itemsize, so any dtype can view it
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            if size:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as err:
                    if err.errno == errno.ENOSPC:
                        raise OSError(
                            err.errno,
                            f"No space left in shared memory for a segment of {size} bytes; free "
                            "memory or memory-map to a directory instead (memmap_(prefix=...))",
                        ) from err
                    os.ftruncate(fd, size)
            buffer = _map_fd(fd, size) if size else torch.empty(0, dtype=torch.uint8)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, buffer)

    def view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """A C-contiguous ``dtype`` view of ``shape`` at byte ``offset`` (a multiple of the itemsize)."""
        numel = 1
        for s in shape:
            numel *= s
        k = dtype.itemsize
        nbytes = numel * k
        if offset + nbytes > self.size or offset % k:
            raise ValueError(f"A view of {nbytes} bytes at {offset} overruns a {self.size}-byte segment.")
        typed = self._typed.get(dtype)
        if typed is None:  # one reinterpretation per dtype: each leaf is then a single as_strided
            typed = self._typed[dtype] = self.buffer.view(dtype)
        return typed.as_strided(shape, contiguous_strides(torch.Size(shape)), offset // k)

    def offset_of(self, tensor: torch.Tensor) -> int:
        """Byte offset of the first element of ``tensor`` (a view of this segment)."""
        return tensor.data_ptr() - self.buffer.data_ptr()

    def __reduce__(self) -> tuple[Any, ...]:
        # To a process being spawned, DupFd sends the descriptor with SCM_RIGHTS along with the
        # spawn.  Otherwise the receiver opens it through /proc (see _fd_pass: ~20 µs, where
        # multiprocessing's resource sharer costs a socket connection and an HMAC hand-shake
        # with a thread of this process, ~1 ms); the resource sharer where /proc cannot serve.
        if get_spawning_popen() is None and self.size:
            code = send_fd(self.fd)
            if code is not None:
                return (_receive_segment, (code, self.size))
        return (_rebuild_segment, (reduction.DupFd(self.fd), self.size))


def _receive_segment(code: tuple[Any, ...], size: int) -> Segment:
    known = _BY_INODE.get((code[3], code[4]))
    if known is not None and known.size == size:
        release(code)  # already mapped here: the same memory, one mapping
        return known
    fd = receive_fd(code)
    try:
        buffer = _map_fd(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return Segment(fd, size, buffer)


def _rebuild_segment(dupfd: Any, size: int) -> Segment:
    try:
        fd = dupfd.detach()
    except OSError as err:  # the sender's resource sharer is gone: it exited before we received
        raise MemmapError(
            "Cannot receive this anonymous shared memory: the process that sent it exited (or closed it) before it "
            f"was received ({type(err).__name__}: {err}). Anonymous memory lives only as long as a process holds it; "
            "to hand data to processes that outlive the sender, memory-map it to a folder (for example under "
            "/dev/shm), which any process can open by path."
        ) from None
    try:
        st = os.fstat(fd)
        known = _BY_INODE.get((st.st_dev, st.st_ino))
        if known is not None and known.size == size:
            os.close(fd)  # already mapped here: the same memory, one mapping
            return known
        buffer = _map_fd(fd, size) if size else torch.empty(0, dtype=torch.uint8)
    except BaseException:
        os.close(fd)
        raise
    return Segment(fd, size, buffer)
