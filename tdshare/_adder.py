"""The fast path of ``make_memmap`` / ``make_memmap_from_tensor``: one entry into a level this
process was the last to change.

The general path (:func:`tdshare._entries.add_entry`) re-validates the level on every call: two
``stat`` calls against what this process last read, path joins, an ``lstat`` of the new name, the
record opened, ``fstat``-ed and closed again.  Once a level has a record (``meta.jsonl``), an
:class:`Adder` kept for it on the tree's :class:`~tdshare._coordination.SharedRegistry` holds what
stays true between two additions:

- the level's folder, open (the new file is created relative to it, ``O_EXCL | O_NOFOLLOW``: an
  existing name or a symbolic link there sends the call to the general path);
- the record, open with ``O_APPEND`` (one ``write`` appends the line).  At most
  :data:`MAX_OPEN_ADDERS` adders of the process hold their two descriptors at once (the oldest
  opened closes first); a closed adder keeps what it knows and opens the folder and the record
  again by path at its next addition, which then takes the fast path if the record is the same
  file (its inode) and the rest below holds;
- on the registry, the generation after this process's last addition to the tree
  (``entry_gen``), by either path.  Under the tree's lock, an unchanged generation means nobody
  committed anything but those additions since, so what this process knows of the level
  (:func:`tdshare._compaction.level_state`, the same object as when the adder was readied) is
  what is on disk.  One ``fstat`` of the record (the size this adder left, still linked) covers
  the rest: a line appended by this process's general path (linking a new nested level), a
  writer killed mid-append, a compaction at another process's exit.  A general addition that
  finds the chain broken (another commit came between) drops every adder of the tree;
- the record line's bytes after the key, per (shape, dtype).

A small level (no record yet, under :data:`~tdshare._compaction.WRITE_THROUGH` entries) has no
adder: with the generation unchanged, :func:`~tdshare._compaction.small_level` checks with two
``stat`` calls that its ``meta.json`` is still the file this process last wrote or read and that
no record appeared, then the data file is created by path and ``meta.json`` replaced with the
entry added (:func:`~tdshare._compaction.write_through`), the bytes the general path writes.

Anything else (another process committed, a nested key whose levels do not exist in memory, a
key that is not a plain ASCII identifier, a file-less or nested entry, an empty tensor, an
error from the file system) returns None before anything is written, and the caller takes the
general path, which raises the documented errors.  The commit order is the general path's: the
data file, then the line (the commit), then the generation bump.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from typing import Any, cast

import torch

from ._compaction import LevelState, level_state, record_appended, small_level, write_through
from ._coordination import SharedRegistry, level_in_tree, registry_of, unchanged_since
from ._files import tensor_buffer
from ._format import JOURNAL_FILE, LEAF_SUFFIX, leaf_entry, plain_key, shared_leaf_entry
from ._memmap import MemoryMappedTensor
from ._tensordict_base import TensorDictBase, is_collection

__all__ = ["Adder", "fast_add", "prime_adder"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_RECORD = os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
_SHAPES = (tuple, list)


def _open_adders_allowed() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 64
    if soft == resource.RLIM_INFINITY:
        return 512
    return max(16, min(512, soft // 8))


# Adders open in this process at once, over every tree (two descriptors each), oldest opened
# closed first: a quarter of the descriptors RLIMIT_NOFILE allows (128 adders under ulimit -n
# 1024), at most 512, so that a writer adding to thousands of levels never runs out of them.  A
# closed adder opens its descriptors again at its next addition (13 µs more on tmpfs).
MAX_OPEN_ADDERS = _open_adders_allowed()
# The adders whose descriptors are open, oldest first (weak: an adder goes with its registry).
_OPEN: weakref.WeakKeyDictionary[Adder, None] = weakref.WeakKeyDictionary()
# Held while an adder's descriptors are opened, used or closed: a thread adding to one tree may
# close (to make room) the adder of another tree that a second thread is writing through, and a
# descriptor closed under it could be reused by an unrelated file before its write.
_FDS = threading.RLock()


class Adder:
    """One level's open folder and record, and the record's size after this adder's last line."""

    __slots__ = ("__weakref__", "dfd", "hit", "ino", "jfd", "pid", "ring", "size", "tails")

    def __init__(self, ino: int, ring: str | None) -> None:
        self.dfd = self.jfd = -1
        self.ino, self.ring = ino, ring
        self.pid = os.getpid()
        self.size = -1
        self.hit: LevelState | None = None
        self.tails: dict[tuple[tuple[int, ...], torch.dtype], bytes] = {}

    def open(self, level: str) -> bool:
        """Open the level's folder and record (counted among the :data:`MAX_OPEN_ADDERS`, the
        oldest open adder closed to make room); False, nothing left open, when either is gone or
        the record is not the file this adder knew (compacted since, or the folder replaced)."""
        try:
            dfd = os.open(level, _DIR)
        except OSError:
            return False
        try:
            jfd = os.open(JOURNAL_FILE, _RECORD, dir_fd=dfd)
        except OSError:
            os.close(dfd)
            return False
        try:
            same = os.fstat(jfd).st_ino == self.ino
        except OSError:
            same = False
        if not same:
            os.close(jfd)
            os.close(dfd)
            return False
        with _FDS:
            self.close()
            while len(_OPEN) >= MAX_OPEN_ADDERS:
                oldest = next(iter(_OPEN))
                oldest.close()  # it stays its level's adder, closed
            self.dfd, self.jfd = dfd, jfd
            _OPEN[self] = None
        return True

    def close(self) -> None:
        """Close the descriptors (in a forked child, its own copies); the adder stays usable."""
        with _FDS:
            _OPEN.pop(self, None)
            for fd in (self.dfd, self.jfd):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            self.dfd = self.jfd = -1

    def __del__(self) -> None:
        if self.dfd >= 0 or self.jfd >= 0:
            try:
                self.close()
            except Exception:  # at interpreter exit, the module's lock may be gone already
                pass


def _reset_after_fork() -> None:
    global _FDS  # a thread of the parent may have held it at the fork
    _FDS = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _drop(registry: SharedRegistry, level: str) -> None:
    adder = registry.adders.pop(level, None)
    if adder is not None:
        adder.close()


def prime_adder(
    registry: SharedRegistry, level: str, before: tuple[int, int] | None, after: tuple[int, int] | None
) -> None:
    """After the general path committed an entry to ``level`` (``before``, ``after``: the states
    read before and returned by its bump; the caller still holds the lock), ready the level's
    :class:`Adder` if the level now has a record, else drop it.  When another commit came
    between this process's last addition and this one, every adder of the tree is dropped."""
    if before is None or before[0] != registry.entry_gen:
        for other in list(registry.adders):
            _drop(registry, other)
    registry.entry_gen = -1 if after is None else after[0]
    hit = level_state(level)
    if after is None or hit is None or hit.jstamp is None:
        _drop(registry, level)
        return
    ino, size = hit.jstamp
    adder = registry.adders.get(level)
    if adder is None or adder.pid != os.getpid() or adder.ino != ino:
        _drop(registry, level)
        adder = Adder(ino, level_in_tree(registry.root, level))
        if not adder.open(level):
            return
        registry.adders[level] = adder
    adder.size, adder.hit = size, hit


def _current(registry: SharedRegistry, level: str, adder: Adder) -> bool:
    return registry.adders.get(level) is adder


def _tail(adder: Adder, shape: torch.Size, dtype: torch.dtype) -> bytes:
    """The record line after the key: ``": {entry}}`` and the newline (as ``entry_line`` writes it)."""
    key = (tuple(shape), dtype)
    tail = adder.tails.get(key)
    if tail is None:
        tail = b'": ' + shared_leaf_entry(key[0], dtype)[1].encode() + b"}\n"
        adder.tails[key] = tail
    return tail


def fast_add(
    td: TensorDictBase,
    key: Any,
    shape: Any,
    dtype: torch.dtype | None,
    robust_key: bool | None,
    src: torch.Tensor | None,
    storage: torch.UntypedStorage | None = None,
) -> MemoryMappedTensor | None:
    """Add the entry by the fast path and return it, or None (nothing done: take the general path).

    ``src``: the CPU tensor whose bytes the file gets (``make_memmap_from_tensor``), None for
    zeros (``make_memmap``).  ``storage``: the entry reads this storage, already mapped from the
    entry's own file (``make_memmap_from_storage``, after its checks): no file is created, only
    the record line is committed, as the general path does.
    """
    prefix = td._memmap_prefix
    if prefix is None or robust_key is False or not td._is_memmap:
        return None
    node: Any = td
    if type(key) is str:
        last = key
    elif type(key) is tuple and key and all(type(k) is str for k in key):
        for part in key[:-1]:
            node = node._tensordict.get(part)
            if node is None or not is_collection(node) or node._memmap_prefix is None:
                return None
        last = key[-1]
    else:
        return None
    level = node._memmap_prefix
    registry = registry_of(td, prefix)
    adder = registry.adders.get(level)
    if (adder is not None and adder.pid != os.getpid()) or last in node._tensordict:
        return None
    if not (last.isascii() and plain_key(last)):
        return None
    if isinstance(shape, torch.Tensor):
        return None  # a tensor of shapes: a nested entry, written with its size table by the general path
    try:
        size = shape if type(shape) is torch.Size else torch.Size(shape if type(shape) in _SHAPES else [shape])
    except (TypeError, ValueError):
        return None
    batch = node.batch_size
    if size[: len(batch)] != batch or (size and min(size) < 0):
        return None
    dtype_ = torch.get_default_dtype() if dtype is None else dtype
    if type(dtype_) is not torch.dtype:
        return None
    numel = math.prod(size)
    if not numel or (src is not None and (src.dtype != dtype_ or src.numel() != numel)):
        return None
    name = last + LEAF_SUFFIX
    path = level + os.sep + name
    lock = registry.lock()
    lock.acquire()
    try:
        state = registry.state()
        if state is None or state[0] != registry.entry_gen:
            return None  # another commit since this process's last addition: the general path
        if adder is None:  # a small level, if this process wrote it last: its meta.json rewritten
            if registry.adders.get(level) is not None:
                return None  # another thread readied one meanwhile
            hit = small_level(level, last)
            flat = None if hit is None else _entry_data(None, name, path, numel, dtype_, src, storage)
            if hit is None or flat is None:
                return None
            try:
                write_through(level, hit, last, leaf_entry(size, dtype_))
            except OSError:  # nothing committed (meta.json is replaced atomically): the general path
                if storage is None:
                    os.unlink(path)
                return None
            after = registry.bump(level=level_in_tree(registry.root, level))
            registry.entry_gen = -1 if after is None else after[0]
            return _install(td, node, last, flat, size, path, state, after)
        hit = level_state(level)
        if (
            not _current(registry, level, adder)  # another thread dropped it meanwhile
            or hit is None
            or hit is not adder.hit
            or last in hit.meta
        ):
            return None  # this process re-read the level: the general path
        with _FDS:
            if adder.jfd < 0 and not adder.open(level):
                return None  # the record is another file now: the general path
            st = os.fstat(adder.jfd)
            if st.st_size != adder.size or not st.st_nlink:
                return None
            made = _entry_data(adder.dfd, name, path, numel, dtype_, src, storage)
            if made is None:
                return None
            flat = made
            line = b'{"' + last.encode() + _tail(adder, size, dtype_)
            try:
                written = os.write(adder.jfd, line)
            except BaseException:
                if storage is None:
                    os.unlink(name, dir_fd=adder.dfd)
                adder.size = -1  # a torn line: the general path cuts it off
                raise
            if written != len(line):  # never for a regular file short of a full disk: the general path
                if storage is None:
                    os.unlink(name, dir_fd=adder.dfd)
                adder.size = -1
                return None
        adder.size += written
        if record_appended(level, hit, last, leaf_entry(size, dtype_), adder.ino, adder.size):
            _drop(registry, level)  # compacted: the record is gone; the next addition starts one
        after = registry.bump(level=adder.ring)
        registry.entry_gen = -1 if after is None else after[0]
    finally:
        lock.release()
    return _install(td, node, last, flat, size, path, state, after)


def _install(
    td: TensorDictBase,
    node: Any,
    last: str,
    flat: torch.Tensor,
    size: torch.Size,
    path: str,
    state: tuple[int, int],
    after: tuple[int, int] | None,
) -> MemoryMappedTensor:
    """The committed entry, put at ``last`` in ``node`` (although the tensordict is locked)."""
    fresh = flat if len(size) == 1 else flat.view(size)  # made here, referenced nowhere else:
    fresh.__class__ = MemoryMappedTensor  # its class changed in place (as_subclass makes an alias)
    tensor = cast(MemoryMappedTensor, fresh)
    tensor._filename = path
    node._tensordict[last] = tensor
    if unchanged_since(td._generation, state):
        td._generation = after  # we were current: our own addition is all that changed
    return tensor


def _entry_data(
    dfd: int | None,
    name: str,
    path: str,
    numel: int,
    dtype: torch.dtype,
    src: torch.Tensor | None,
    storage: torch.UntypedStorage | None,
) -> torch.Tensor | None:
    """The new entry's flat tensor: a view of ``storage`` (its file exists), else a new file (see
    :func:`_new_file`); None when the file cannot be made."""
    if storage is not None:
        return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))
    return _new_file(dfd, name, path, numel, dtype, src)


def _new_file(
    dfd: int | None, name: str, path: str, numel: int, dtype: torch.dtype, src: torch.Tensor | None
) -> torch.Tensor | None:
    """Create the entry's file (zeros, or ``src``'s bytes) and map it; None (nothing left behind)
    when the name exists or the file system refuses: the general path decides and names the error.
    ``dfd``: the level's folder, open (the file is created relative to it), or None (by ``path``)."""
    where = path if dfd is None else name
    try:
        fd = os.open(where, _NEW, 0o666, dir_fd=dfd)
    except OSError:
        return None  # the name exists (a dead writer's file, a link)
    try:
        try:
            if src is None:
                os.posix_fallocate(fd, 0, numel * dtype.itemsize)
            else:
                _write_tensor(fd, src, path)
        finally:
            os.close(fd)
        return torch.from_file(path, shared=True, size=numel, dtype=dtype)
    except (OSError, RuntimeError):
        os.unlink(where, dir_fd=dfd)
        return None


def _write_tensor(fd: int, src: torch.Tensor, path: str) -> None:
    data = tensor_buffer(src, path)
    done = os.write(fd, data)
    if done < len(data):
        view = memoryview(data)
        while done < len(data):
            done += os.write(fd, view[done:])
