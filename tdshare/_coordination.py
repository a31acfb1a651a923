"""SharedRegistry: the lock and the generation counter of one saved tensordict tree.

Every process that maps a saved folder finds the same two small control files *beside* it (the
reference ignores them, and an atomic re-save, which swaps the folder itself, keeps them):

``.<name>.tdshare.lock``
    A :mod:`filelock` lock that serialises metadata changes (``make_memmap*``, non-tensor
    writes, re-saves).  Readers never take it.  It is never deleted.
``.<name>.tdshare.gen``
    Two 8-byte little-endian counters, mapped by every process.  The *generation* is bumped after
    each committed metadata change; ``memmap_refresh_()`` reads it first: an unchanged value means
    nothing to do (one memory read), a changed one means "re-read the committed metadata".  The
    *file epoch* is bumped only when existing leaf files were replaced (a re-save): while it is
    unchanged, a refresh keeps every known leaf as it is and maps only the new ones, without a
    ``stat`` per leaf.

Commit order for writers: data files, then each ``meta.json`` replaced whole, then the bump.  A
reader that sees the new counter therefore finds the new metadata; one that reads the counter
just before a bump re-reads on its next refresh.  A torn read of the counter can only make a
reader refresh once more than needed.

When the folder's parent is read-only the control files cannot be created: the registry then
reports no generation, and a refresh re-reads the metadata every time.
"""

from __future__ import annotations

import inspect
import mmap
import os
import threading
import weakref
from typing import Any, ClassVar

from filelock import FileLock

__all__ = ["SharedRegistry", "control_paths", "remove_control_files", "tree_root", "unchanged_since"]

_SUFFIX_LOCK = ".tdshare.lock"
_SUFFIX_GEN = ".tdshare.gen"
_LOCK_KW: dict[str, Any] = (
    {"preserve_lock_file": True} if "preserve_lock_file" in inspect.signature(FileLock.__init__).parameters else {}
)


def control_paths(root: str) -> tuple[str, str]:
    """The lock file and the counter file of the tree saved at ``root``."""
    head, name = os.path.split(os.path.abspath(root).rstrip(os.sep))
    return os.path.join(head, f".{name}{_SUFFIX_LOCK}"), os.path.join(head, f".{name}{_SUFFIX_GEN}")


def remove_control_files(root: str) -> None:
    """Remove the lock and counter files of the tree at ``root`` (a tree nobody uses any more)."""
    for control in control_paths(root):
        try:
            os.unlink(control)
        except FileNotFoundError:
            pass


def unchanged_since(seen: tuple[int, int] | None, state: tuple[int, int] | None) -> bool:
    """Whether nothing was committed between a tensordict's last look (``seen``) and ``state``.

    ``seen`` is None when the tensordict was written or loaded before any counter existed; the
    counter is then still absent or at its initial value unless a writer has bumped it since.
    """
    return seen == state or (seen is None and state in (None, (0, 0)))


def tree_root(directory: str) -> str:
    """The top directory of the saved tree that ``directory`` belongs to.

    Walks up while the parent holds a ``meta.json`` too, so a nested level loaded on its own
    (``subpath=``) shares the registry of the whole tree.
    """
    current = os.path.abspath(directory)
    while True:
        parent = os.path.dirname(current)
        if parent == current or not os.path.isfile(os.path.join(parent, "meta.json")):
            return current
        current = parent


class SharedRegistry:
    """The lock and generation counter of one saved tree, shared by every process mapping it."""

    # weak: a registry (and its mapped counter's descriptor) lives only while something holds it
    _instances: ClassVar[weakref.WeakValueDictionary[str, SharedRegistry]] = weakref.WeakValueDictionary()
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, root: str) -> None:
        self.root = root
        self.lock_path, self.gen_path = control_paths(root)
        self._lock: FileLock | None = None  # made on first use: loads and refreshes never lock
        self._lock_pid = os.getpid()
        self._map: mmap.mmap | None = None

    @classmethod
    def for_directory(cls, directory: str) -> SharedRegistry:
        """The registry of the tree that holds ``directory`` (one object per tree per process)."""
        root = tree_root(directory)
        with cls._instances_lock:
            reg = cls._instances.get(root)
            if reg is None:
                reg = cls(root)
                cls._instances[root] = reg
            return reg

    def _counter(self, create: bool) -> mmap.mmap | None:
        if self._map is None:
            try:
                fd = os.open(self.gen_path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDWR, 0o666)
            except OSError:
                return None  # read-only location, or not created yet
            try:
                if os.fstat(fd).st_size < 16:
                    os.ftruncate(fd, 16)  # zero-extends: safe if two processes race to create it
                self._map = mmap.mmap(fd, 16)
            except OSError:
                return None
            finally:
                os.close(fd)
        return self._map

    def state(self, create: bool = False) -> tuple[int, int] | None:
        """(generation, file epoch), or None when the counters do not exist (yet) or cannot be read.

        ``create=True`` (a process that will refresh or write) makes the counter file, so that
        every later writer bumps it.
        """
        m = self._counter(create=create)
        if m is None:
            return None
        raw = m[:16]
        return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")

    def lock(self) -> FileLock:
        """The inter-process lock for metadata changes (a context manager, reentrant)."""
        if self._lock is None or self._lock_pid != os.getpid():  # a forked child never reuses the parent's
            self._lock = FileLock(self.lock_path, **_LOCK_KW)
            self._lock_pid = os.getpid()
        return self._lock

    def bump(self, files_replaced: bool = False) -> tuple[int, int] | None:
        """Advance the generation after a commit (call with the lock held).

        ``files_replaced``: existing leaf files got new content (a re-save), so readers must
        check every leaf, not only the new ones.  The epoch is written before the generation.
        """
        m = self._counter(create=True)
        if m is None:
            return None
        if files_replaced:
            epoch = (int.from_bytes(m[8:16], "little") + 1) & 0xFFFFFFFFFFFFFFFF
            m[8:16] = epoch.to_bytes(8, "little")
        value = (int.from_bytes(m[:8], "little") + 1) & 0xFFFFFFFFFFFFFFFF
        m[:8] = value.to_bytes(8, "little")
        return self.state()


def _reset_after_fork() -> None:
    # A forked child must not inherit "lock held" state from the parent's thread that forked.
    SharedRegistry._instances = weakref.WeakValueDictionary()
    SharedRegistry._instances_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
