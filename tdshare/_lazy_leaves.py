"""Leaves mapped on first use: :class:`PendingLeaf` and the dict that holds them, :class:`LazyLeaves`.

Loading a folder (or receiving a pickled memory-mapped tensordict) checks every leaf against
its metadata but maps none: each leaf is a :class:`PendingLeaf` (a :class:`LeafHandle`: dtype,
shape, where its bytes are) until something reads it.  A pending leaf holds no descriptor and
no mapping, and about 200 bytes of Python memory.

:class:`LazyLeaves` is the ``_tensordict`` of such a level.  It is a ``dict`` whose every way
of reading a value gives the mapped tensor, never the placeholder: ``d[k]``, ``get``, ``pop``,
``setdefault``, ``values()``, ``items()``, ``copy()``, ``==``, ``|``, and also ``dict(d)``,
``{**d}`` and ``other.update(d)`` (it defines ``__iter__``, so CPython copies it through
``keys()`` and ``__getitem__`` instead of its raw slots).  Mapping happens once per leaf; the
check of the file (regular, large enough for shape x dtype) runs again just before it, and a
failure names the file and the metadata that listed it.

Code that must not map (pickling handles, refreshing, walking nested levels) reads the raw
values with :func:`raw_items` / :func:`raw_get` and keeps pending leaves as they are.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._errors import CorruptDataError
from ._leaf_handle import LeafHandle
from ._memmap import MemoryMappedTensor
from ._segments import Segment

__all__ = [
    "LazyLeaves",
    "PendingLeaf",
    "is_pending",
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
        # positional and the slots set here directly: thousands of these are made per load
        self.dtype, self.shape, self.path, self.mode = dtype, shape, path, mode
        self.segment, self.offset, self.ino, self.where, self.guard = segment, offset, ino, where, guard

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
        """
        if self.segment is not None or self.path is None or self.numel == 0:
            return self.map()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            listed = f" (listed in {self.where})" if self.where else ""
            raise CorruptDataError(
                f"The file {self.path!r}{listed} is missing: expected {self.nbytes} bytes of {self.dtype} data. "
                "It was removed after the tensordict was loaded; load the folder again."
            ) from None
        if self.ino is not None and st.st_ino != self.ino:
            raise self._replaced()
        self.check(st, self.where or self.path, os.path.basename(self.path))
        leaf = self.map(st)
        # After mapping: a writer marks the tree before it swaps files in, so a file mapped
        # after a swap (even one whose inode number was reused) shows as a stale guard here.
        if self.guard is not None and self.guard.stale():
            raise self._replaced()
        return leaf

    def _replaced(self) -> CorruptDataError:
        return CorruptDataError(
            f"The file {self.path!r} was replaced (by a re-save in another process) after this tensordict was "
            "loaded and before this leaf was first read, so its loaded content is gone: call memmap_refresh_() "
            "or load the folder again."
        )


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
        tensor = value.resolve()
        dict.__setitem__(self, key, tensor)
        return tensor

    def resolve_all(self) -> None:
        """Map every pending leaf (what iterating the values needs)."""
        if not self._lazy:
            return
        for key, value in list(dict.items(self)):
            if type(value) is PendingLeaf:
                self._resolve(key, value)
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
        self.resolve_all()
        return dict.values(self)

    def items(self) -> Any:
        self.resolve_all()
        return dict.items(self)

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


# This process's dicts with pending file leaves, by folder: a re-save of a folder here maps them
# first (:func:`resolve_under`), so that they keep the bytes they were loaded with, as eager ones do.
_LIVE: dict[str, weakref.WeakValueDictionary[int, LazyLeaves]] = {}  # (a dict is unhashable: by id)


def _live_in(folder: str) -> weakref.WeakValueDictionary[int, LazyLeaves]:
    live = _LIVE.get(folder)
    if live is None:
        if len(_LIVE) >= 1024:  # forget the folders whose dicts are all gone
            for gone in [w for w, v in _LIVE.items() if not len(v)]:
                del _LIVE[gone]
        live = _LIVE[folder] = weakref.WeakValueDictionary()
    return live


def track(d: dict, folder: str) -> None:
    """Remember that ``d`` may hold pending leaves of files in ``folder``."""
    if type(d) is LazyLeaves:
        _live_in(folder)[id(d)] = d


def track_below(dicts: Iterable[dict], folder: str) -> None:
    """Remember that the ``dicts`` may hold pending leaves of files in ``folder`` or below (the
    members of a lazy stack saved in ``folder``: one record for all of them, not one per member
    folder; a re-save of one member's folder maps the pending leaves of the dicts whose files
    are there).

    >>> d = LazyLeaves()
    >>> track_below([d, {}], "/nowhere")
    """
    live = None
    for d in dicts:
        if type(d) is LazyLeaves:
            if live is None:
                live = _live_in(folder)
            live[id(d)] = d


def resolve_under(folder: str) -> None:
    """Map every pending leaf of this process whose file is in ``folder`` or below (before its files
    are replaced).

    Raises:
        CorruptDataError: such a leaf's file is already missing or damaged.
    """
    head = folder.rstrip(os.sep) + os.sep
    for where in [w for w in _LIVE if w == folder or w.startswith(head)]:
        live = _LIVE.pop(where, None)
        for d in list(live.values()) if live is not None else []:
            d.resolve_all()
    for where in [w for w in _LIVE if head.startswith(w.rstrip(os.sep) + os.sep)]:  # tracked above (track_below)
        live = _LIVE.get(where)
        for d in list(live.values()) if live is not None else []:
            if any(type(v) is PendingLeaf and v.path is not None and v.path.startswith(head) for v in dict.values(d)):
                d.resolve_all()


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


def with_pending(d: dict) -> LazyLeaves:
    """``d`` as a :class:`LazyLeaves` that pending leaves may be put into (converted when plain)."""
    if type(d) is LazyLeaves:
        d._lazy = True
        return d
    return LazyLeaves(dict.items(d))


def resolved(value: Any) -> Any:
    """``value``, mapped if it is a pending leaf."""
    return value.resolve() if type(value) is PendingLeaf else value
