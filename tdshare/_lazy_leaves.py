"""Leaves mapped on first use: :class:`PendingLeaf` and the dict that holds them, :class:`LazyLeaves`.

Loading a folder (or receiving a pickled memory-mapped tensordict) checks every leaf against
its metadata (in a level of many leaves, from the level's listing: the file's size is checked
at first read) but maps none: each leaf is a :class:`PendingLeaf` (a :class:`LeafHandle`: dtype,
shape, where its bytes are) until something reads it.  A pending leaf holds no descriptor and
no mapping, and about 200 bytes of Python memory.

:class:`LazyLeaves` is the ``_tensordict`` of such a level.  It is a ``dict`` whose every way
of reading a value gives the mapped tensor, never the placeholder: ``d[k]``, ``get``, ``pop``,
``setdefault``, ``values()``, ``items()``, ``copy()``, ``==``, ``|``, and also ``dict(d)``,
``{**d}`` and ``other.update(d)`` (it defines ``__iter__``, so CPython copies it through
``keys()`` and ``__getitem__`` instead of its raw slots).  Mapping happens once per leaf; the
check of the file (the same inode, regular and no symbolic link, large enough for shape x
dtype) runs just before it, and a failure names the file and the metadata that listed it.

Code that must not map (pickling handles, refreshing, walking nested levels) reads the raw
values with :func:`raw_items` / :func:`raw_get` and keeps pending leaves as they are.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ._errors import CorruptDataError, ResourceLimitError
from ._files import may_write
from ._leaf_handle import LeafHandle
from ._mapping_limits import check_mappings, max_mapped_leaves
from ._memmap import MemoryMappedTensor
from ._segments import Segment

__all__ = [
    "LazyLeaves",
    "as_entries",
    "PendingLeaf",
    "is_pending",
    "mapped_leaves",
    "new_lazy_leaves",
    "raw_get",
    "raw_items",
    "raw_values",
    "rebuilt",
    "resolve_under",
    "resolved",
    "track",
    "track_below",
    "with_pending",
]


class PendingLeaf(LeafHandle):
    """A leaf whose file (or segment slice) is known and checked, but not mapped yet.

    Attributes:
        where: the metadata file that listed the leaf (named in errors), or None.
        guard: for a leaf loaded from a folder, an object whose ``stale()`` says whether the
            tree's files were replaced since the load (:class:`tdshare._coordination.EpochGuard`),
            or None.
    """

    __slots__ = ("guard", "where")

    def __init__(
        self,
        dtype: Any,
        shape: tuple[int, ...],
        path: str | None = None,
        mode: str | None = None,
        segment: Segment | None = None,
        offset: int = 0,
        ino: int | None = None,
        where: str | None = None,
        guard: Any = None,
    ) -> None:
        # positional and the slots set one by one (no tuple built and unpacked): thousands of these
        # are made per load
        self.dtype = dtype
        self.shape = shape
        self.path = path
        self.mode = mode
        self.segment = segment
        self.offset = offset
        self.ino = ino
        self.where = where
        self.guard = guard

    @classmethod
    def from_handle(cls, handle: LeafHandle, where: str | None = None) -> PendingLeaf:
        """The pending form of ``handle``."""
        return cls(
            handle.dtype,
            handle.shape,
            path=handle.path,
            mode=handle.mode,
            segment=handle.segment,
            offset=handle.offset,
            ino=handle.ino,
            where=where,
        )

    def resolve(self) -> MemoryMappedTensor:
        """Check the leaf's file again and map it.

        Raises:
            CorruptDataError: the file is now missing, not a regular file, or too short (the
                message names the file and the metadata that listed it).
            ResourceLimitError: the kernel refuses the mapping (``vm.max_map_count``).
        """
        return self.resolve_shared()[0]

    def resolve_shared(self) -> tuple[MemoryMappedTensor, bool]:
        """:meth:`resolve`, and whether the result maps its file shared (then it may be unmapped
        and mapped again without losing a write: the file holds every byte written through it)."""
        if self.segment is not None or self.path is None or self.numel == 0:
            return self.map(), False
        st = self._checked()
        try:
            leaf = self.map(st)
        except (CorruptDataError, RuntimeError):
            # the folder was swapped (an atomic re-save elsewhere) between the stat and the mapping
            if not os.path.exists(self.path) or (self.guard is not None and self.guard.stale()):
                raise self._replaced() from None
            raise
        self._check_fresh()
        mode = self.mode
        return leaf, mode == "r+" or (mode is None and may_write(st))

    def copy_out(self) -> torch.Tensor:
        """The leaf's bytes as a new tensor, read from its file without mapping it (a large leaf,
        over 16 MiB, or a segment slice comes mapped instead): what a save to another place writes.

        Raises:
            CorruptDataError: the file is now missing, replaced, not a regular file, or too short.
        """
        if self.segment is not None or self.path is None or self.numel == 0 or self.nbytes > _READ_MAX:
            return self.resolve()
        self._checked()
        buf = bytearray(self.nbytes)
        with open(self.path, "rb", buffering=0) as f:
            got = f.readinto(buf)
        if got != self.nbytes:
            raise CorruptDataError(f"The file {self.path!r} holds {got} bytes but {self.nbytes} are expected.")
        self._check_fresh()
        flat = torch.frombuffer(buf, dtype=self.dtype)
        return flat.view(self.shape) if len(self.shape) != 1 else flat

    def _checked(self) -> os.stat_result:
        """The file's stat, after checking it still is the leaf's file (see :meth:`resolve`)."""
        path = self.path
        assert path is not None
        try:
            # a leaf whose inode is known was a regular file at load: a symbolic link now is refused
            # (lstat, not followed), as one that leads outside the folder would have been then
            st = os.lstat(path) if self.ino is not None else os.stat(path)
        except FileNotFoundError:
            listed = f" (listed in {self.where})" if self.where else ""
            raise CorruptDataError(
                f"The file {path!r}{listed} is missing: expected {self.nbytes} bytes of {self.dtype} data. "
                "It was removed after the tensordict was loaded; load the folder again."
            ) from None
        if self.ino is not None:
            if stat.S_ISLNK(st.st_mode):  # (its own inode number may be the old file's, reused)
                raise CorruptDataError(
                    f"The file {path!r}{f' (listed in {self.where})' if self.where else ''} was a regular file "
                    "when the tensordict was loaded and is now a symbolic link: refusing it. Load the folder again."
                )
            if st.st_ino != self.ino:
                raise self._replaced()
        self.check(st, self.where or path, os.path.basename(path))
        return st

    def _check_fresh(self) -> None:
        # After mapping (or reading): a writer marks the tree before it swaps files in, so a file
        # mapped after a swap (even one whose inode number was reused) shows as a stale guard here.
        if self.guard is not None and self.guard.stale():
            raise self._replaced()

    def _replaced(self) -> CorruptDataError:
        return CorruptDataError(
            f"The file {self.path!r} was replaced (by a re-save in another process) after this tensordict was "
            "loaded and before this leaf was first read, so its loaded content is gone: call memmap_refresh_() "
            "or load the folder again."
        )


_READ_MAX = 16 << 20


def is_pending(value: Any) -> bool:
    """Whether ``value`` is a leaf not mapped yet."""
    return type(value) is PendingLeaf


_MISSING = object()


class LazyLeaves(dict):
    """A level's entries, some of them :class:`PendingLeaf`: every read returns mapped tensors.

    >>> d = LazyLeaves(a=1)
    >>> dict(d), d.get("a"), list(d.values())
    ({'a': 1}, 1, [1])
    """

    __slots__ = ("__weakref__", "_lazy")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = True

    def _resolve(self, key: Any, value: PendingLeaf) -> MemoryMappedTensor:
        try:
            tensor, shared = value.resolve_shared()
        except ResourceLimitError:  # the memory map is full: give back what the bound holds, once
            if not _evict_all():
                raise
            tensor, shared = value.resolve_shared()
        dict.__setitem__(self, key, tensor)
        if shared:
            _remember(self, key, value, tensor)
        return tensor

    def resolve_all(self) -> None:
        """Map every pending leaf (what iterating the values needs).

        Raises:
            ResourceLimitError: the level has more pending leaves than the memory map has room
                for (checked before any is mapped).
        """
        if not self._lazy:
            return
        pending = [(k, v) for k, v in dict.items(self) if type(v) is PendingLeaf]
        if len(pending) > 1024:
            check_mappings(len(pending), f"Reading all {len(pending)} leaves of one level at once")
        _PROTECTED.add(id(self))  # none of this level's leaves is unmapped while it is mapped whole
        try:
            for key, value in pending:
                self._resolve(key, value)
        finally:
            _PROTECTED.discard(id(self))
        self._lazy = False

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        return self._resolve(key, value) if type(value) is PendingLeaf else value

    def __iter__(self) -> Iterator[Any]:  # defined so that dict(d) and {**d} go through __getitem__
        return dict.__iter__(self)

    def get(self, key: Any, default: Any = None) -> Any:
        value = dict.get(self, key, _MISSING)
        if value is _MISSING:
            return default
        return self._resolve(key, value) if type(value) is PendingLeaf else value

    def pop(self, key: Any, *default: Any) -> Any:
        value = dict.pop(self, key, *default)
        return value.resolve() if type(value) is PendingLeaf else value

    def popitem(self) -> tuple[Any, Any]:
        key, value = dict.popitem(self)
        return key, value.resolve() if type(value) is PendingLeaf else value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        dict.__setitem__(self, key, default)
        return default

    def values(self) -> Any:
        # a snapshot, not a view: it holds every tensor, so the bound unmaps none of them while
        # the caller walks it (a view could show a leaf put back to pending meanwhile)
        self.resolve_all()
        return list(dict.values(self))

    def items(self) -> Any:
        self.resolve_all()
        return list(dict.items(self))

    def copy(self) -> LazyLeaves:
        """A shallow copy that keeps the pending leaves pending (each copy maps its own on use)."""
        out = LazyLeaves()
        dict.update(out, dict.items(self))
        out._lazy = self._lazy
        return out

    def __eq__(self, other: object) -> bool:
        self.resolve_all()
        if isinstance(other, LazyLeaves):
            other.resolve_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __or__(self, other: Any) -> Any:
        out = self.copy()
        out.update(other)
        return out

    def __ror__(self, other: Any) -> Any:
        out = dict(other)
        out.update(self)
        return out

    def __repr__(self) -> str:
        self.resolve_all()
        return dict.__repr__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self.items()),))


_NEW_DICT = dict.__new__


def new_lazy_leaves() -> LazyLeaves:
    """An empty :class:`LazyLeaves`, for a loader to fill with ``dict.__setitem__``.

    Made without running ``__init__`` (a Python call that costs four times as much): a load makes
    one per level.

    >>> d = new_lazy_leaves()
    >>> type(d).__name__, d, d._lazy
    ('LazyLeaves', {}, True)
    """
    out = _NEW_DICT(LazyLeaves)
    out._lazy = True
    return out


# -- the bound on the leaves this library keeps mapped ----------------------------------------------
# (id(dict), key) -> (the dict, the key, the leaf's PendingLeaf, the mapped tensor), weakly, oldest
# first.  Past max_mapped_leaves() the oldest mapped leaf that nobody else references goes back to
# its PendingLeaf, which unmaps it; one that is referenced (the caller's) moves to the newest end.
_Entry = tuple["weakref.ref[LazyLeaves]", Any, PendingLeaf, "weakref.ref[Any]"]
_LRU: OrderedDict[tuple[int, Any], _Entry] = OrderedDict()
_LRU_LOCK = threading.Lock()
_PROTECTED: set[int] = set()  # dicts being mapped whole (resolve_all): not unmapped meanwhile
_UNREFERENCED = 3  # the refcount of a tensor only its dict holds, seen from _evict: dict, local, argument


_DEAD: list[tuple[tuple[int, Any], Any]] = []  # slots whose dict or tensor died while the lock was held


def _forget(slot: tuple[int, Any], ref: Any) -> None:
    """Drop ``slot`` once its dict or tensor is gone: its entry holds the leaf's PendingLeaf, and
    through it the tree's lock and counter (descriptors, mappings), which must not outlive the tree.

    Runs as a weakref callback, at any point of any thread (the garbage collector): it never
    blocks on the lock (a thread that holds it may be the one collecting); a slot it cannot drop
    now is dropped by the next :func:`_remember`.
    """
    if not _LRU_LOCK.acquire(blocking=False):
        _DEAD.append((slot, ref))
        return
    try:
        _drop(slot, ref)
    finally:
        _LRU_LOCK.release()


def _drop(slot: tuple[int, Any], ref: Any) -> None:
    entry = _LRU.get(slot)
    if entry is not None and (entry[0] is ref or entry[3] is ref):  # not a newer entry in a reused slot
        del _LRU[slot]


def _remember(d: LazyLeaves, key: Any, pending: PendingLeaf, tensor: Any) -> None:
    """Put a leaf just mapped at the newest end of the list; unmap the oldest past the bound."""
    with _LRU_LOCK:
        lru = _LRU
        while _DEAD:
            _drop(*_DEAD.pop())
        slot = (id(d), key)
        lru.pop(slot, None)
        forget = functools.partial(_forget, slot)
        lru[slot] = (weakref.ref(d, forget), key, pending, weakref.ref(tensor, forget))
        over = len(lru) - max_mapped_leaves()
        if over > 0:
            _evict(over)


def _evict(count: int) -> None:
    """Unmap up to ``count`` of the oldest listed leaves (the caller holds the lock); at most
    ``count + 8`` entries are looked at, so a list full of referenced leaves costs O(1) per call."""
    lru, getrefcount, get, setitem = _LRU, sys.getrefcount, dict.get, dict.__setitem__
    for _ in range(count + 8):
        if count <= 0 or not lru:
            return
        slot, entry = lru.popitem(last=False)
        d, t = entry[0](), entry[3]()
        if d is None or t is None or get(d, entry[1]) is not t:  # gone, or replaced since
            count -= 1
            continue
        if getrefcount(t) > _UNREFERENCED or id(d) in _PROTECTED:  # someone holds it: theirs, for now
            lru[slot] = entry
            continue
        setitem(d, entry[1], entry[2])
        d._lazy = True
        del t
        count -= 1


def _evict_all() -> int:
    """Unmap every listed leaf that nobody else references; return how many were unmapped."""
    with _LRU_LOCK:
        before = len(_LRU)
        _evict(before)
        return before - len(_LRU)


def mapped_leaves() -> int:
    """How many leaves mapped on first read are listed in the bound (at most :func:`max_mapped_leaves`
    plus those referenced elsewhere)."""
    return len(_LRU)


def _after_fork_in_child() -> None:
    global _LRU_LOCK, _TRACK_LOCK
    _LRU_LOCK = threading.Lock()
    _TRACK_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# This process's dicts with pending file leaves, by folder: a re-save of a folder here maps them
# first (:func:`resolve_under`), so that they keep the bytes they were loaded with, as eager ones do.
class _Tracked:
    """The dicts tracked for one folder, held weakly: ``id(dict)`` -> a plain weak reference.

    Not a ``WeakValueDictionary``: its ``__setitem__`` is Python code and builds a reference with
    a callback per dict (1 µs each, most of the cost of tracking the members of a lazy stack).
    Dead references are dropped when the table has doubled since its last sweep (an id reused by
    a new dict replaces the dead one), so it stays within twice its live dicts, plus 64.
    """

    __slots__ = ("limit", "refs")

    def __init__(self) -> None:
        self.refs: dict[int, weakref.ref[LazyLeaves]] = {}  # (a dict is unhashable: by id)
        self.limit = 64

    def add(self, dicts: Iterable[LazyLeaves]) -> None:
        ref = weakref.ref
        with _TRACK_LOCK:
            refs = self.refs
            refs.update({id(d): ref(d) for d in dicts})
            if len(refs) > self.limit:
                for key in [k for k, r in refs.items() if r() is None]:
                    del refs[key]
                self.limit = max(64, 2 * len(refs))

    def values(self) -> list[LazyLeaves]:
        with _TRACK_LOCK:
            refs = list(self.refs.values())
        return [d for d in (r() for r in refs) if d is not None]


_TRACK_LOCK = threading.Lock()  # the tables' changes (no weakref callback takes it: no re-entry)
_LIVE: dict[str, _Tracked] = {}
_SWEEP_AT = [1024]  # the size of _LIVE at which the folders whose dicts are all gone are forgotten


def _live_in(folder: str) -> _Tracked:
    live = _LIVE.get(folder)
    if live is None:
        if len(_LIVE) >= _SWEEP_AT[0]:  # forget the folders whose dicts are all gone
            for gone in [w for w, v in list(_LIVE.items()) if not v.values()]:
                del _LIVE[gone]
            # next sweep when the live ones have doubled: a tree of thousands of levels loaded
            # whole costs O(1) per level, not a sweep of all the others per level
            _SWEEP_AT[0] = max(1024, 2 * len(_LIVE))
        live = _LIVE[folder] = _Tracked()
    return live


def track(d: dict, folder: str) -> None:
    """Remember that ``d`` may hold pending leaves of files in ``folder``."""
    if type(d) is LazyLeaves:
        _live_in(folder).add((d,))


def track_below(dicts: Iterable[dict], folder: str) -> None:
    """Remember that the ``dicts`` may hold pending leaves of files in ``folder`` or below (the
    members of a lazy stack saved in ``folder``: one record for all of them, not one per member
    folder; a re-save of one member's folder maps the pending leaves of the dicts whose files
    are there).

    >>> d = LazyLeaves()
    >>> track_below([d, {}], "/nowhere")
    """
    lazy = [d for d in dicts if type(d) is LazyLeaves]
    if lazy:
        _live_in(folder).add(lazy)


def resolve_under(folder: str, files: set[str] | None = None) -> None:
    """Map every pending leaf of this process whose file is in ``folder`` or below (``files``: only
    those whose file is one of these), before those files are replaced; the leaves mapped so are
    never unmapped by the bound (their bytes are no longer in any file).

    A leaf whose file is already gone or replaced (another process re-saved the folder since) has
    lost its bytes whatever this save does: it stays pending and raises at its own first read, as
    it would have; this save goes on.

    Raises:
        ResourceLimitError: more such leaves than the memory map has room for (nothing mapped).
    """
    head = folder.rstrip(os.sep) + os.sep
    wheres = [w for w in _LIVE if w == folder or w.startswith(head)]
    above = [w for w in _LIVE if head.startswith(w.rstrip(os.sep) + os.sep)]  # tracked by track_below
    dicts = list({id(d): d for w in wheres + above for d in _LIVE[w].values()}.values())
    todo = [
        (d, k, v) for d in dicts for k, v in dict.items(d) if type(v) is PendingLeaf and _among(v.path, head, files)
    ]
    if len(todo) > 1024:
        check_mappings(
            len(todo),
            f"A save to {folder!r} replaces the files of {len(todo)} leaves that tensordicts of this process "
            "loaded from there and have not read yet (to keep their loaded bytes, each must be mapped first): it",
            "Delete those tensordicts first (del them, or load the folder again after the save)",
        )
    for d, k, v in todo:
        try:
            dict.__setitem__(d, k, v.resolve())
        except CorruptDataError:
            continue  # (see above) the stale leaf names its file when it is read
    with _LRU_LOCK:  # leaves mapped before whose files are replaced: kept mapped from now on
        for slot in [s for s, e in _LRU.items() if _among(e[2].path, head, files)]:
            del _LRU[slot]
    if files is None:
        for w in wheres:
            _LIVE.pop(w, None)


def _among(path: str | None, head: str, files: set[str] | None) -> bool:
    """Whether a leaf's file is one that a save under ``head`` replaces (``files``: only these)."""
    if path is None:
        return False
    return path.startswith(head) if files is None else path in files


def raw_items(d: dict, keep: Callable[[Any], bool] | None = None) -> Iterable[tuple[Any, Any]]:
    """The (key, value) pairs of ``d`` without mapping pending leaves (``keep``: a filter on keys)."""
    items = dict.items(d)
    return items if keep is None else [(k, v) for k, v in items if keep(k)]


def raw_values(d: dict) -> Iterable[Any]:
    """The values of ``d`` without mapping pending leaves."""
    return dict.values(d)


def raw_get(d: dict, key: Any, default: Any = None) -> Any:
    """``d.get(key)`` without mapping a pending leaf."""
    return dict.get(d, key, default)


def rebuilt(pairs: Iterable[tuple[Any, Any]]) -> dict:
    """A new ``_tensordict`` from ``pairs``: a :class:`LazyLeaves` when any value is pending."""
    pairs = list(pairs)
    if any(type(v) is PendingLeaf for _, v in pairs):
        return LazyLeaves(pairs)
    return dict(pairs)


def as_entries(d: dict) -> dict:
    """``d`` as a level's ``_tensordict``: a :class:`LazyLeaves` copy of it when a value is pending,
    else ``d`` itself (the caller gives up ``d``).  One C-level copy, not a pass per entry in Python.

    >>> as_entries({"a": 1})
    {'a': 1}
    """
    for value in dict.values(d):
        if type(value) is PendingLeaf:
            out = _NEW_DICT(LazyLeaves)
            out._lazy = True
            dict.update(out, d)
            return out
    return d


def with_pending(d: dict) -> LazyLeaves:
    """``d`` as a :class:`LazyLeaves` that pending leaves may be put into (converted when plain)."""
    if type(d) is LazyLeaves:
        d._lazy = True
        return d
    return LazyLeaves(dict.items(d))


def resolved(value: Any) -> Any:
    """``value``, mapped if it is a pending leaf."""
    return value.resolve() if type(value) is PendingLeaf else value
