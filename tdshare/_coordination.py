"""SharedRegistry: the lock and the generation counter of one shared tree, and where they live.

Every process that shares a tree (a saved folder, or an anonymous tensordict's runtime store)
finds the same two small control files in this user's private runtime folder
(:func:`runtime_root`), under ``.trees/``, named after the tree's *identity*: the device and
inode of the folder that holds the tree, and a hash of the tree's name in it.  That identity
survives an atomic re-save (which swaps the tree folder itself, not its parent), and nothing is
ever written beside or inside the tree for coordination:

``<key>.lock``
    An ``flock`` (:mod:`tdshare._flock`) that serialises metadata changes (``make_memmap*``, non-tensor
    writes, re-saves).  Readers never take it.
``<key>.gen``
    Two 8-byte little-endian counters, mapped by every process.  The *generation* is bumped after
    each committed metadata change; ``memmap_refresh_()`` reads it first: an unchanged value means
    nothing to do (one memory read), a changed one means "re-read the committed metadata".  The
    *file epoch* is bumped only when existing leaf files were replaced (a re-save): while it is
    unchanged, a refresh keeps every known leaf as it is and maps only the new ones, without a
    ``stat`` per leaf.  A bump wakes every :meth:`SharedRegistry.wait_for_change` (a futex on the
    generation's low word).
``<key>.path``
    The tree's path, for ``python -m tdshare gc`` and :meth:`SharedRegistry.describe`.
``<key>.changes``
    A ring of the last 64 generations and the one level each changed (written by ``make_memmap*``
    before its bump), so a refresh reads that level only; a generation missing from it (any
    other commit) means "read every level".

Commit order for writers: data files, then each ``meta.json`` replaced whole, then the bump.  A
reader that sees the new counter therefore finds the new metadata; one that reads the counter
just before a bump re-reads on its next refresh.  A torn read of the counter can only make a
reader refresh once more than needed.

The runtime folder is per user, so the processes of one user coordinate.  A process that maps a
tree owned by another user gets no counter (:meth:`SharedRegistry.state` is None) and re-reads
the metadata at every refresh, which is always correct.  ``gc`` removes the control files of
trees that no longer exist and that no live process maps.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import weakref
from typing import Any, ClassVar

from ._control_files import control_paths, reserve_blocks, tree_root
from ._errors import MissingMetadataError, NotMemmapError, NotSupportedError
from ._flock import InterProcessLock, lock_for
from ._futex import Futex

__all__ = ["EpochGuard", "SharedRegistry", "level_in_tree", "registry_of", "unchanged_since"]

_SLOT = 256  # one ring slot: the generation (8 bytes), the path's length (2), the path
_RING_SLOTS = 64
_RING_BYTES = _SLOT * _RING_SLOTS
_COUNTERS = struct.Struct("<QQ")  # the counter file: the generation, the file epoch
_GENERATION = struct.Struct("<Q")
_SLOT_HEAD = struct.Struct("<QH")  # a ring slot's generation and path length
_WRAP = 0xFFFFFFFFFFFFFFFF


def unchanged_since(seen: tuple[int, int] | None, state: tuple[int, int] | None) -> bool:
    """Whether nothing was committed between a tensordict's last look (``seen``) and ``state``.

    ``seen`` is None when the tensordict was written or loaded before any counter existed; the
    counter is then still absent or at its initial value unless a writer has bumped it since.
    """
    return seen == state or (seen is None and state in (None, (0, 0)))


class SharedRegistry:
    """The lock and the generation counter of one shared tree, the same object for every caller
    in a process.

    Get it with :meth:`for_path` (a saved folder, or any level in it) or :meth:`for_tensordict`
    (a memory-mapped tensordict, folder-backed or anonymous).

    >>> import tempfile, torch
    >>> from tdshare import TensorDict, SharedRegistry
    >>> td = TensorDict(a=torch.zeros(2), batch_size=[2]).memmap_(tempfile.mkdtemp())
    >>> reg = SharedRegistry.for_tensordict(td)
    >>> before = reg.generation
    >>> _ = td.make_memmap("b", [2])           # a committed change bumps the generation
    >>> reg.wait_for_change(before, timeout=1.0) == before + 1
    True
    """

    # weak: a registry (and its mapped counter's descriptor) lives only while something holds it
    _instances: ClassVar[weakref.WeakValueDictionary[str, SharedRegistry]] = weakref.WeakValueDictionary()
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, root: str) -> None:
        self.root = root
        self._paths: tuple[str, str] | None = None  # found on first use: loads pay one stat, not more
        self._lock: InterProcessLock | None = None  # made on first use: loads and refreshes never lock
        self._lock_pid = os.getpid()
        self._map: mmap.mmap | None = None
        self._futex: Futex | None = None
        self._ring: mmap.mmap | None = None  # the ring of changes, mapped on first use
        self._ring_pid = 0
        #: per level directory, this process's fast appender (:mod:`tdshare._adder`): it lives,
        #: with its open descriptors, as long as the tensordicts that hold this registry
        self.adders: dict[str, Any] = {}
        self.entry_gen = -1  # the generation after this process's last make_memmap* (see _adder)
        #: the guards of this process's leaves of the tree not read yet (see :meth:`rebase_guards`)
        self.guards: weakref.WeakSet[EpochGuard] = weakref.WeakSet()

    # -- finding the registry -------------------------------------------------------------------
    @classmethod
    def for_directory(cls, directory: str) -> SharedRegistry:
        """The registry of the tree that holds ``directory`` (one object per tree per process).

        Args:
            directory: the tree's top folder, or any folder inside it.

        Returns:
            The tree's :class:`SharedRegistry` (the same object while something holds it).

        >>> import os, tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     _ = TensorDict(a=torch.zeros(2), n=TensorDict(b=torch.zeros(2))).save(path)
        ...     reg = SharedRegistry.for_directory(os.path.join(path, "n"))
        ...     print(reg.root == path, reg is SharedRegistry.for_directory(path))
        True True
        """
        root = tree_root(directory)
        with cls._instances_lock:
            reg = cls._instances.get(root)
            if reg is None:
                reg = cls(root)
                cls._instances[root] = reg
            return reg

    @classmethod
    def for_path(cls, prefix: str | os.PathLike) -> SharedRegistry:
        """The registry of the saved tree at ``prefix`` (or of the tree a nested level belongs to).

        Args:
            prefix: a folder holding a saved tensordict (its top or a nested level).

        Returns:
            The tree's :class:`SharedRegistry`.

        Raises:
            MissingMetadataError: ``prefix`` holds no saved tensordict (a ``FileNotFoundError``).

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     _ = TensorDict(a=torch.zeros(2)).save(path)
        ...     print(SharedRegistry.for_path(path).root == path)
        True
        """
        path = os.path.abspath(os.fspath(prefix))
        if not os.path.isfile(os.path.join(path, "meta.json")):
            raise MissingMetadataError(
                f"No saved tensordict in {path!r}: meta.json is missing. Save one there first (td.memmap_(prefix))."
            )
        return cls.for_directory(path)

    @classmethod
    def for_tensordict(cls, td: Any) -> SharedRegistry:
        """The registry of a memory-mapped tensordict: its folder's tree, or its anonymous store.

        Args:
            td: a memory-mapped tensordict (``is_memmap()`` True).

        Returns:
            The :class:`SharedRegistry` its sharers use.

        Raises:
            NotMemmapError: ``td`` is not memory-mapped (``memmap_()`` it first; a ``RuntimeError``).

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     td = TensorDict(a=torch.zeros(2)).memmap_(path)
        ...     print(SharedRegistry.for_tensordict(td) is SharedRegistry.for_path(path))
        True
        """
        prefix = getattr(td, "_memmap_prefix", None)
        anon = getattr(td, "_anon_store", None)
        if getattr(td, "_is_memmap", False) and prefix is not None:
            return cls.for_directory(prefix)
        if getattr(td, "_is_memmap", False) and anon is not None:
            return cls.for_directory(anon[0])
        raise NotMemmapError(
            "This tensordict is not memory-mapped, so no other process shares it: call memmap_() first."
        )

    # -- the control files ----------------------------------------------------------------------
    def _control_paths(self) -> tuple[str, str]:
        if self._paths is None:
            self._paths = control_paths(self.root)
        return self._paths

    @property
    def lock_path(self) -> str:
        """The lock file (in the runtime folder, outside the tree: the tree's folder is never written).

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     reg = SharedRegistry.for_tensordict(TensorDict(a=torch.zeros(2)).memmap_(path))
        ...     print(reg.lock_path.endswith(".lock"), reg.lock_path.startswith(path))
        True False
        """
        return self._control_paths()[0]

    @property
    def gen_path(self) -> str:
        """The counter file (in the runtime folder), next to :attr:`lock_path`.

        >>> import os, tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     reg = SharedRegistry.for_tensordict(TensorDict(a=torch.zeros(2)).memmap_(path))
        ...     print(reg.gen_path.endswith(".gen"), os.path.dirname(reg.gen_path) == os.path.dirname(reg.lock_path))
        True True
        """
        return self._control_paths()[1]

    def _ours(self) -> bool:
        """Whether this user owns the tree (another user's writes would never bump our counter)."""
        try:
            owner = os.stat(self.root).st_uid
        except FileNotFoundError:
            return True  # an anonymous store not created yet, or a tree being created
        return owner == os.geteuid()

    def _counter(self, create: bool) -> mmap.mmap | None:
        if self._map is None:
            if not self._ours():
                return None
            try:
                gen_path = self.gen_path
                fd = os.open(gen_path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDWR, 0o600)
            except OSError:
                return None  # not created yet
            try:
                small = os.fstat(fd).st_size < 16
                if small:  # (its creator reserved them: a file reaches 16 bytes only that way)
                    reserve_blocks(fd, 16)  # blocks allocated: a full file system refuses here, never with SIGBUS later
                    with open(gen_path[: -len(".gen")] + ".path", "w", encoding="utf-8", errors="surrogateescape") as f:
                        f.write(os.path.realpath(self.root))
                self._map = mmap.mmap(fd, 16)
                self._futex = Futex(self._map, 0)
            except OSError:
                return None
            finally:
                os.close(fd)
        return self._map

    # -- reading and waiting --------------------------------------------------------------------
    def state(self, create: bool = False) -> tuple[int, int] | None:
        """(generation, file epoch), or None when the counters do not exist (yet) or cannot be read.

        ``create=True`` (a process that will refresh or write) makes the counter file, so that
        every later writer bumps it.

        Args:
            create: make the counter file if it does not exist.

        Returns:
            ``(generation, file_epoch)``, or None.

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     reg = SharedRegistry.for_path(TensorDict(a=torch.zeros(2)).save(path).saved_path)
        ...     print(reg.state(), reg.state(create=True))
        None (0, 0)
        """
        m = self._counter(create=create)
        if m is None:
            return None
        return _COUNTERS.unpack_from(m)

    @property
    def generation(self) -> int:
        """The number of metadata changes committed to the tree so far (0 before the first).

        For a tree owned by another user (no counter here) it is always 0.  Reading it creates
        the counter file.

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     td = TensorDict(a=torch.zeros(2), batch_size=[2]).memmap_(path)
        ...     reg = SharedRegistry.for_tensordict(td)
        ...     before = reg.generation
        ...     _ = td.make_memmap("b", [2])
        ...     print(before, reg.generation)
        0 1
        """
        state = self.state(create=True)
        return 0 if state is None else state[0]

    def wait_for_change(self, since: int | None = None, timeout: float | None = None) -> int:
        """Block until a process commits a change after generation ``since`` (default: now).

        Returns the new generation, or ``since`` when ``timeout`` seconds passed first.  The
        wait sleeps in the kernel (a futex on the counter) and wakes within microseconds of the
        commit; where futexes are not available it polls every millisecond at most.

        Args:
            since: the generation to wait past (None: the current one).
            timeout: the most seconds to wait (None: no limit).

        Returns:
            The generation after the change, or ``since`` on a timeout.

        Raises:
            NotSupportedError: the tree has no counter here (owned by another user).

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     reg = SharedRegistry.for_tensordict(TensorDict(a=torch.zeros(2)).memmap_(path))
        ...     print(reg.wait_for_change(timeout=0.01) == reg.generation)  # no change: timed out
        True
        """
        if self._counter(create=True) is None or self._futex is None:
            raise NotSupportedError(
                f"The tree {self.root!r} belongs to another user, so this process has no generation counter to "
                "wait on: poll with memmap_refresh_() instead."
            )
        current = self.generation
        since = current if since is None else since
        deadline = None if timeout is None else time.monotonic() + timeout
        while current == since:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._futex.wait(since, left)
            current = self.generation
        return current

    def describe(self) -> dict[str, Any]:
        """Where the tree's control files are and what they hold (for ``python -m tdshare status``).

        Returns:
            A dict: ``tree``, ``lock``, ``counter`` (paths), ``generation`` and ``file_epoch``
            (None before the counter exists), ``owned`` (this user owns the tree).

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     info = SharedRegistry.for_tensordict(TensorDict(a=torch.zeros(2)).memmap_(path)).describe()
        ...     print(info["tree"] == path, info["generation"], info["owned"], sorted(info))  # no counter yet
        True None True ['counter', 'file_epoch', 'generation', 'lock', 'owned', 'tree']
        """
        state = self.state()
        return {
            "tree": self.root,
            "lock": self.lock_path,
            "counter": self.gen_path,
            "generation": None if state is None else state[0],
            "file_epoch": None if state is None else state[1],
            "owned": self._ours(),
        }

    # -- writing --------------------------------------------------------------------------------
    def lock(self) -> InterProcessLock:
        """The inter-process lock for metadata changes (a context manager, reentrant).

        An ``flock`` on a descriptor kept open (:mod:`tdshare._flock`): it serialises threads and
        processes, survives ``fork`` (a child never inherits a held lock), and the death of its
        holder (the kernel releases a dead process's ``flock``).

        Returns:
            The tree's :class:`~tdshare._flock.InterProcessLock` (the same one on each call in a
            process).

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     reg = SharedRegistry.for_tensordict(TensorDict(a=torch.zeros(2)).memmap_(path))
        ...     with reg.lock(), reg.lock():  # reentrant
        ...         print(reg.lock() is reg.lock())
        True
        """
        if self._lock is None or self._lock_pid != os.getpid():  # a forked child never reuses the parent's
            os.makedirs(os.path.dirname(self.lock_path), mode=0o700, exist_ok=True)
            self._lock = lock_for(self.lock_path)  # shared with any other registry object of this tree
            self._lock_pid = os.getpid()
        return self._lock

    def _changes(self, create: bool) -> mmap.mmap | None:
        """The ring of recent changes (``<key>.changes``): which level each generation changed."""
        if self._ring is None or self._ring_pid != os.getpid():
            self._ring = None
            path = self.gen_path[: -len(".gen")] + ".changes"
            try:
                fd = os.open(path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDWR, 0o600)
            except OSError:
                return None
            try:
                if os.fstat(fd).st_size < _RING_BYTES:
                    if not create:
                        return None
                    reserve_blocks(fd, _RING_BYTES)
                self._ring = mmap.mmap(fd, _RING_BYTES)
                self._ring_pid = os.getpid()
            except OSError:
                return None
            finally:
                os.close(fd)
        return self._ring

    def changes_since(self, seen: int, now: int) -> list[str] | None:
        """The levels (paths relative to the tree's top, ``""`` for the top) that the commits after
        generation ``seen`` up to ``now`` changed, or None when unknown (a commit that did not say,
        one too far back, or no ring, or no commit at all): the caller then reads every level.

        Args:
            seen: the generation last read.
            now: the current generation.

        Returns:
            One level per commit, in order, or None.

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     td = TensorDict(a=torch.zeros(2), n=TensorDict(b=torch.zeros(2))).memmap_(path)
        ...     reg = SharedRegistry.for_tensordict(td)
        ...     seen = reg.generation
        ...     _ = td.make_memmap(("n", "c"), [])
        ...     print(reg.changes_since(seen, reg.generation))
        ['n']
        """
        if not 0 < now - seen <= _RING_SLOTS // 2:
            return None
        ring = self._changes(create=False)
        if ring is None:
            return None
        paths = []
        for gen in range(seen + 1, now + 1):
            at = (gen % _RING_SLOTS) * _SLOT
            slot = ring[at : at + _SLOT]
            size = int.from_bytes(slot[8:10], "little")
            if int.from_bytes(slot[:8], "little") != gen or size > _SLOT - 10:
                return None
            paths.append(slot[10 : 10 + size].decode("utf-8", "surrogateescape"))
        state = self.state()
        if state is None or state[0] - seen > _RING_SLOTS // 2:  # slots may have been reused while read
            return None
        return paths

    def mark_replacing(self) -> None:
        """Advance the file epoch alone, to the next odd number, just before files are swapped in
        (with the lock held).

        A leaf loaded before and mapped after the swap then sees a changed epoch (its
        :class:`EpochGuard` is stale), even where the swap is not finished by its next look;
        the :meth:`bump` after the swap advances the epoch again, to the next even number, with
        the generation.  An odd epoch therefore says a replacement may be under way: a load that
        reads one waits for the writer's lock and loads again (its metadata may be the old
        tree's, and its leaves found after the swap the new one's, with no epoch step between).

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     reg = SharedRegistry.for_tensordict(TensorDict(a=torch.zeros(2)).memmap_(path))
        ...     before = reg.state(create=True)
        ...     reg.mark_replacing()
        ...     print(before, reg.state())  # (generation, file epoch)
        (0, 0) (0, 1)
        """
        m = self._counter(create=True)
        if m is not None:
            epoch = int.from_bytes(m[8:16], "little")  # odd already: a writer killed before its bump
            m[8:16] = ((epoch + (2 if epoch & 1 else 1)) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")

    def rebase_guards(self, before: tuple[int, int] | None, after: tuple[int, int] | None) -> None:
        """After this process's own commit (``before``/``after``: the states around it, the lock
        still held), move the guards that were current before it to ``after``'s file epoch.

        Every save maps first this process's unread leaves whose files it replaces
        (:func:`tdshare._lazy_leaves.resolve_under`), so the leaves still unread after it read
        files it left alone: their guards must not see its epoch step as a replacement.  A guard
        already behind ``before`` (another process replaced files since) stays behind.

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> from tdshare._coordination import EpochGuard
        >>> with tempfile.TemporaryDirectory() as path:
        ...     reg = SharedRegistry.for_tensordict(TensorDict(a=torch.zeros(2)).memmap_(path))
        ...     mine, behind = EpochGuard(reg, reg.state(create=True)), EpochGuard(reg, (0, -1))
        ...     with reg.lock():
        ...         before = reg.state()
        ...         reg.rebase_guards(before, reg.bump(files_replaced=True))
        ...     print(mine.stale(), behind.stale())
        False True
        """
        if before is None or after is None or before[1] == after[1]:
            return
        for guard in list(self.guards):
            if (0 if guard.epoch is None else guard.epoch) == before[1]:
                guard.epoch = after[1]

    def bump(self, files_replaced: bool = False, level: str | None = None) -> tuple[int, int] | None:
        """Advance the generation after a commit (writers call it with the lock held).

        ``files_replaced``: existing leaf files got new content (a re-save), so readers must
        check every leaf, not only the new ones.  ``level``: the only level whose metadata
        changed (relative to the tree's top, ``""`` for it), recorded in the ring of changes so
        that a refresh reads that level alone.  The epoch and the ring are written before the
        generation, then every waiter is woken.

        Args:
            files_replaced: also advance the file epoch.
            level: the one level the commit changed (None: unknown, readers check every level).

        Returns:
            The new ``(generation, file_epoch)``, or None when the tree has no counter here.

        >>> import tempfile
        >>> from tdshare import TensorDict, SharedRegistry
        >>> with tempfile.TemporaryDirectory() as path:
        ...     reg = SharedRegistry.for_tensordict(TensorDict(a=torch.zeros(2)).memmap_(path))
        ...     with reg.lock():
        ...         print(reg.bump(level=""), reg.bump(files_replaced=True), reg.changes_since(0, 1))
        (1, 0) (2, 2) ['']
        """
        m = self._counter(create=True)
        if m is None:
            return None
        gen, epoch = _COUNTERS.unpack_from(m)
        value = (gen + 1) & _WRAP
        if level is not None:
            raw = level.encode("utf-8", "surrogateescape")
            ring = self._changes(create=True) if len(raw) <= _SLOT - 10 else None
            if ring is not None:
                at = (value % _RING_SLOTS) * _SLOT
                ring[at + 10 : at + 10 + len(raw)] = raw
                _SLOT_HEAD.pack_into(ring, at, value, len(raw))
        if files_replaced:  # to the next even epoch: no replacement in progress (see mark_replacing)
            epoch = (epoch + (1 if epoch & 1 else 2)) & _WRAP
            _COUNTERS.pack_into(m, 0, gen, epoch)
        _GENERATION.pack_into(m, 0, value)
        if self._futex is not None:
            self._futex.wake()
        return value, epoch


def level_in_tree(root: str, level: str) -> str | None:
    """``level``'s path inside the tree at ``root`` (``""`` for the top), None if it is not inside."""
    if level == root:
        return ""
    return level[len(root) + 1 :] if level.startswith(root + os.sep) else None


def registry_of(td: Any, directory: str) -> SharedRegistry:
    """The registry of ``directory``'s tree, cached on ``td`` (``td._registry``) so that it stays
    mapped, and its lock open, while ``td`` lives (a fresh lookup per call costs a path walk)."""
    cached = td._registry
    if cached is not None and cached[0] == directory and cached[2] == os.getpid():
        return cached[1]
    registry = SharedRegistry.for_directory(directory)
    td._registry = (directory, registry, os.getpid())
    return registry


def _reset_after_fork() -> None:
    # A forked child must not inherit "lock held" state from the parent's thread that forked.
    SharedRegistry._instances = weakref.WeakValueDictionary()
    SharedRegistry._instances_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


class EpochGuard:
    """Whether a tree's files were replaced since a load: its file epoch then and now.

    ``state`` is the registry state read before the load's metadata.  None: the tree had no
    counter yet, so every epoch step the counter shows now came after the load (a counter starts
    at epoch 0, and only replacing files advances it).

    >>> import tempfile, torch
    >>> from tdshare import TensorDict, SharedRegistry
    >>> from tdshare._coordination import EpochGuard
    >>> folder = tempfile.mkdtemp()
    >>> reg = SharedRegistry.for_directory(TensorDict(a=torch.ones(1)).memmap_(folder).saved_path)
    >>> guard = EpochGuard(reg, reg.state(create=True))
    >>> guard.stale(), (reg.mark_replacing(), guard.stale())[1]
    (False, True)
    """

    __slots__ = ("__weakref__", "epoch", "registry")

    def __init__(self, registry: SharedRegistry, state: tuple[int, int] | None) -> None:
        self.registry = registry
        self.epoch = None if state is None else state[1]
        registry.guards.add(self)  # this process's own saves move it along (rebase_guards)

    def stale(self) -> bool:
        """True if files of the tree may have been replaced since the load."""
        now = self.registry.state()
        if now is None:
            return False
        return now[1] != (0 if self.epoch is None else self.epoch)
