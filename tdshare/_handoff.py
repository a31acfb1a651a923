"""Handing a memory-mapped tree to another process in one piece: pickled once, rebuilt in one pass.

A tensordict pickled level by level costs, for 1,000 leaves in 100 levels, about 0.7 ms to dump
(each leaf's code checked, 101 levels reduced) and 0.7 ms to load (101 levels rebuilt one by one,
each with its own lock-parent walk).  When every level of a tree is of the root's class and
every leaf pickles as a compact code (a whole leaf file of its level, or a slice of an anonymous
segment: see :mod:`tdshare._reductions`), the root pickles instead as one *schema*:

- the levels in depth-first order, each with its attributes and its entries' codes, a child level
  standing as its index; pickled once into bytes (a segment stands as its index: the segments
  travel beside the bytes, each handed over afresh by every pickle);
- remembered on the root with what it depends on (the levels and values by identity, the
  memory-mapped leaves' version counters, each level's attributes), so a hand-off of an
  unchanged tree checks those (a few C-level passes over the whole tree) and sends the same bytes;
- rebuilt by the receiver in one pass: the levels made, then linked, then the lock parents
  recorded once per level that has children.  A receiver that gets the same bytes again (the
  same tree handed off again) copies the pending leaves it made the last time: a folder tree's
  are shared by every copy (they are never changed; each copy checks and maps its own file at
  first read); an anonymous tree's template is lent to one tree at a time, its leaves bound to
  that hand-off's segments and unbound when the tree is gone (see :class:`_Lent`), so that no
  cached template keeps a segment alive.

Anything else (a tensorclass, a lazy stack or a non-tensor value inside, a consolidated level,
plain tensors) pickles level by level as before.
"""

from __future__ import annotations

import io
import operator
import pickle
import sys
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain, count, repeat
from typing import Any

import torch

from ._lazy_leaves import LazyLeaves, PendingLeaf, new_lazy_leaves
from ._leaf_handle import LeafHandle
from ._memmap import MemoryMappedTensor
from ._private_compat import note_lock_parent
from ._reductions import decode_level, encode_level
from ._segments import Segment

__all__ = ["reduce_tree", "rebuild_tree"]

_MEMO = "_tdshare_tree"
_VERSION = operator.attrgetter("_version")
_PLAIN_TENSORS = torch._C.DisableTorchFunctionSubclass


def _attrs(node: Any) -> tuple[Any, ...]:
    names = node._names
    return (
        tuple(node._batch_size),
        node._device,
        None if names is None else tuple(names),
        node._is_locked,
        node._is_memmap,
        node._is_shared,
        node._memmap_prefix,
        node._anon_store,
        node._generation,
    )


class _Pickler(pickle.Pickler):
    def __init__(self, file: Any, segments: list[Segment], index: dict[int, int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.segments = segments
        self.index = index

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is Segment:
            i = self.index.get(id(obj))
            if i is None:
                i = self.index[id(obj)] = len(self.segments)
                self.segments.append(obj)
            return i
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, segments: tuple[Segment, ...]) -> None:
        super().__init__(file)
        self.segments = segments

    def persistent_load(self, pid: Any) -> Any:
        return self.segments[pid]


class _Memo:
    """What a tree's schema depends on, and the schema.

    The checks are flat over the whole tree (a handful of C-level passes, not a Python loop per
    level): the levels (weakly), the number of entries of each, every entry's key and the identity
    of its value, the memory-mapped leaves' version counters, and each level's attributes.
    """

    __slots__ = (
        "__weakref__",
        "attrs",
        "blob",
        "getter",
        "ids",
        "keys",
        "refs",
        "segments",
        "sizes",
        "valid",
        "versions",
    )

    def __init__(self) -> None:
        self.valid = True
        self.blob = b""
        self.segments: tuple[Segment, ...] = ()
        self.refs: tuple[weakref.ref[Any], ...] = ()
        self.sizes: tuple[int, ...] = ()
        self.ids: tuple[int, ...] = ()
        self.keys: tuple[str, ...] = ()
        self.getter: Callable[[list[Any]], Any] | None = None  # the memory-mapped leaves among the values
        self.versions: tuple[int, ...] = ()
        self.attrs: tuple[tuple[Any, ...], ...] = ()

    def root(self) -> Any:
        return self.refs[0]() if self.refs else None

    def still_valid(self) -> bool:
        if not self.valid:
            return False
        try:
            dicts = list(map(_TENSORDICT, map(_DEREF, self.refs)))
        except AttributeError:  # a level is gone (None has no _tensordict)
            return False
        if tuple(map(len, dicts)) != self.sizes or tuple(chain.from_iterable(map(dict.keys, dicts))) != self.keys:
            return False
        values = list(chain.from_iterable(map(dict.values, dicts)))
        if tuple(map(id, values)) != self.ids:
            return False
        if self.getter is not None:
            picked = self.getter(values)
            if type(picked) is not tuple:
                picked = (picked,)
            with _PLAIN_TENSORS():  # (half the cost of each attribute read on a tensor subclass)
                versions = tuple(map(_VERSION, picked))
            if versions != self.versions:
                return False
        return tuple(map(_snapshot, map(_DEREF, self.refs))) == self.attrs


_TENSORDICT = operator.attrgetter("_tensordict")
_DEREF = weakref.ref.__call__
_RAW_ATTRS = operator.attrgetter(
    "_batch_size",
    "_device",
    "_names",
    "_is_locked",
    "_is_memmap",
    "_is_shared",
    "_memmap_prefix",
    "_anon_store",
    "_generation",
)


def _snapshot(node: Any) -> tuple[Any, ...]:
    """A level's attributes as :class:`_Memo` compares them (its dim names copied: a list)."""
    raw = _RAW_ATTRS(node)
    names = raw[2]
    return raw if names is None else (*raw[:2], list(names), *raw[3:])


def _invalidate(memo_ref: weakref.ref[_Memo]) -> Callable[[Any], None]:
    def callback(_: Any) -> None:
        memo = memo_ref()
        if memo is not None:
            memo.valid = False

    return callback


def _build(root: Any) -> _Memo | None:
    """The schema of ``root``'s tree, or None when some part of it must pickle level by level."""
    cls = type(root)
    # the levels in depth-first order (a level's descendants follow it, contiguous), each with
    # its children's indices by key
    levels: list[Any] = []
    children_of: list[dict[str, int]] = []
    stack: list[tuple[Any, int, str]] = [(root, -1, "")]
    seen: set[int] = set()
    while stack:
        node, parent, key = stack.pop()
        if id(node) in seen:
            return None  # a level at two places (or a cycle): pickle's memo keeps it one object
        seen.add(id(node))
        if parent >= 0:
            children_of[parent][key] = len(levels)
        levels.append(node)
        children_of.append({})
        subs = [(k, v) for k, v in dict.items(node._tensordict) if type(v) is cls]
        for k, v in reversed(subs):
            stack.append((v, len(levels) - 1, k))
    schema: list[tuple[Any, ...]] = []
    memo = _Memo()
    invalidate = _invalidate(weakref.ref(memo))
    keep: list[Any] = []  # weak references (their callbacks invalidate the memo) and pending leaves
    segments: list[Segment] = []
    seg_index: dict[int, int] = {}
    interned: dict[Any, Any] = {}
    all_values: list[Any] = []
    for node, children in zip(levels, children_of, strict=True):
        if node._consolidated is not None:
            return None
        d = node._tensordict
        values = tuple(dict.values(d))
        leaves = {k: v for k, v in dict.items(d) if k not in children}
        codes = encode_level(leaves, node._memmap_prefix)
        if any(type(c) is not tuple for c in codes.values()):
            return None  # a plain tensor, a non-tensor, a tensorclass, a lazy stack...
        attrs = _attrs(node)
        columns = None
        if not children and all(len(c) == 4 and type(c[0]) is Segment and all(c[3]) for c in codes.values()):
            # slices of segments only (an anonymous tree's leaf level): as columns, which the
            # receiver turns into pending leaves in one pass
            columns = (
                tuple(codes),
                tuple(_segment_index(c[0], segments, seg_index) for c in codes.values()),
                tuple(c[1] for c in codes.values()),
                tuple(c[2] for c in codes.values()),
                tuple(interned.setdefault(c[3], c[3]) for c in codes.values()),
            )
            schema.append((attrs, None, (), columns))
        else:
            entries: dict[str, Any] = {}
            for key in dict.keys(d):  # (the level's own order)
                if key in children:
                    entries[key] = None
                    continue
                code = codes[key]
                try:  # equal codes as one object: pickle writes each once, then a reference
                    code = interned.setdefault(code, code)
                except TypeError:  # (a nested tensor's sizes: a list)
                    pass
                entries[key] = code
            schema.append((attrs, entries, tuple(children.items()), None))
        for v in values:
            if type(v) is PendingLeaf:
                keep.append(v)
            else:
                keep.append(weakref.ref(v, invalidate))
        all_values.extend(values)
    mapped = [j for j, v in enumerate(all_values) if type(v) is MemoryMappedTensor]
    memo.getter = operator.itemgetter(*mapped) if mapped else None
    memo.versions = tuple(all_values[j]._version for j in mapped)
    memo.ids = tuple(map(id, all_values))
    memo.refs = tuple(weakref.ref(node, invalidate) for node in levels)
    dicts = [node._tensordict for node in levels]
    memo.sizes = tuple(map(len, dicts))
    memo.keys = tuple(chain.from_iterable(map(dict.keys, dicts)))
    memo.attrs = tuple(map(_snapshot, levels))
    buf = io.BytesIO()
    _Pickler(buf, segments, seg_index).dump(schema)
    memo.blob = buf.getvalue()
    memo.segments = tuple(segments)
    root.__dict__[_MEMO] = (memo, keep)
    return memo


def _segment_index(seg: Segment, segments: list[Segment], index: dict[int, int]) -> int:
    j = index.get(id(seg))
    if j is None:
        j = index[id(seg)] = len(segments)
        segments.append(seg)
    return j


def reduce_tree(root: Any) -> tuple[Any, ...] | None:
    """``root.__reduce__()`` as one schema (see the module's description), or None when the tree
    must pickle level by level.

    Args:
        root: a tensordict being pickled.

    Returns:
        ``(rebuild_tree, (class, schema bytes, segments))`` or None.

    >>> import torch
    >>> from tdshare import TensorDict
    >>> reduce_tree(TensorDict(a=torch.zeros(2), batch_size=[2])) is None  # a plain tensor: level by level
    True
    """
    held = root.__dict__.get(_MEMO)
    memo = held[0] if held is not None else None
    # (refs[0] is the root's own: a memo copied along with a __dict__ is not this tree's)
    if memo is None or memo.root() is not root or not memo.still_valid():
        memo = _build(root)
        if memo is None:
            root.__dict__.pop(_MEMO, None)
            return None
    return (rebuild_tree, (type(root), memo.blob, memo.segments))


# An anonymous tree's template, cached per schema bytes but lent to one tree at a time: its pending
# leaves are bound to the segments of the hand-off that borrows it (one C-level pass), the tree's
# levels get copies of its entries, and when the last of those levels is gone the leaves are
# unbound again, so that a cached template holds no segment (the memory goes with the tree, as
# with a template made afresh) and waits in _ANON for the next equal bytes.  A leaf that something
# else still holds then (the level that is being freed, or another level it was moved into) is
# left as it is, with its segment, and the template takes a fresh unbound leaf in its place.
_ANON: dict[bytes, _Lent] = {}
_ANON_MAX = 8
_LENT: dict[int, _Lent] = {}  # the templates lent now (held here: only weak references lead to them)
# (the slot's own setter: a C call per leaf)
_SET_SEGMENT: Callable[[Any, Any], None] = LeafHandle.__dict__["segment"].__set__


class _Lent:
    """A template of an anonymous tree (see above), lent to one tree at a time."""

    __slots__ = ("base", "blob", "bound", "dead", "levels", "nsegments", "places", "refs", "slots")

    def __init__(self, blob: bytes, levels: list[tuple[Any, ...]], segments: tuple[Segment, ...]) -> None:
        self.blob = blob
        self.levels = levels
        self.nsegments = len(segments)
        self.places = [
            (entries, k)
            for _, entries, _ in levels
            for k, v in dict.items(entries)
            if type(v) is PendingLeaf and v.segment is not None
        ]
        self.bound: list[PendingLeaf] = [dict.__getitem__(d, k) for d, k in self.places]
        if len(segments) == 1:
            self.slots: tuple[int, ...] | None = None
        else:
            index = {id(seg): j for j, seg in enumerate(segments)}
            self.slots = tuple(index[id(v.segment)] for v in self.bound)
        # a leaf's reference count while only this template holds it (its entries and its list)
        self.base = self.counts()[0] if self.bound else 0
        self.refs: list[weakref.ref[LazyLeaves]] = []
        self.dead: Iterator[int] = count(1)

    def counts(self) -> list[int]:
        return list(map(sys.getrefcount, self.bound))

    def bind(self, segments: tuple[Segment, ...]) -> None:
        if self.slots is None:
            deque(map(_SET_SEGMENT, self.bound, repeat(segments[0])), 0)
        else:
            deque(map(_SET_SEGMENT, self.bound, map(segments.__getitem__, self.slots)), 0)

    def lend(self) -> list[dict]:
        """Copies of the levels' entries for one tree (its lazy levels watched)."""
        out: list[dict] = []
        refs = []
        returned = self._returned
        for _, entries, _ in self.levels:
            d: dict
            if type(entries) is LazyLeaves:
                d = new_lazy_leaves()
                dict.update(d, dict.items(entries))
                refs.append(weakref.ref(d, returned))
            else:
                d = dict(entries)
            out.append(d)
        self.refs, self.dead = refs, count(1)
        _LENT[id(self)] = self
        return out

    def _returned(self, _: Any) -> None:
        # (a weak reference's callback: any thread, any time; next() on a count is atomic)
        if next(self.dead) != len(self.refs):
            return
        self.refs = []
        base, bound = self.base, self.bound
        for i, n in enumerate(self.counts()):
            if n != base:  # held elsewhere too: it keeps its segment; the template takes a new leaf
                v = bound[i]
                fresh = PendingLeaf(v.dtype, v.shape, v.path, v.mode, None, v.offset, v.ino, v.where, v.guard)
                d, k = self.places[i]
                dict.__setitem__(d, k, fresh)
                bound[i] = fresh
                del v
        deque(map(_SET_SEGMENT, bound, repeat(None)), 0)
        _LENT.pop(id(self), None)
        if self.blob not in _ANON and len(_ANON) >= _ANON_MAX:
            _ANON.pop(next(iter(_ANON)), None)
        _ANON[self.blob] = self


def _anonymous(blob: bytes, segments: tuple[Segment, ...]) -> tuple[list[tuple[Any, ...]], list[dict]]:
    """The template of an anonymous tree and its levels' entries for this hand-off."""
    lent = _ANON.pop(blob, None)
    if lent is not None and lent.nsegments == len(segments):
        lent.bind(segments)
        return lent.levels, lent.lend()
    template = _template(blob, segments)
    if not _shareable(template):
        return template, [entries for _, entries, _ in template]  # (made for this call alone)
    lent = _Lent(blob, template, segments)
    return template, lent.lend()


# The trees this process rebuilt last from a folder (no segment): schema bytes -> the levels'
# attributes, entries (pending leaves) and children, to copy when the same bytes come again.
_TREES: dict[bytes, list[tuple[Any, ...]]] = {}
_TREES_MAX = 8
_TREE_LEAVES_MAX = 1 << 14  # per tree; all of them then hold at most 8 x 16,384 pending leaves (~34 MB)


def _from_folder(blob: bytes) -> tuple[list[tuple[Any, ...]], list[dict]]:
    """The template of a folder tree (cached per schema bytes) and its levels' entries for this
    hand-off: always copies of the cached template's, never its own dicts, since a level maps
    its leaves into its own dict and gets its child levels set there; a cached dict would keep
    the last tree's mapped leaves and levels alive after the tree is gone."""
    template = _TREES.get(blob)
    if template is None:
        template = _template(blob, ())
        if not _shareable(template):
            return template, [entries for _, entries, _ in template]  # (made for this call alone)
        if len(_TREES) >= _TREES_MAX:
            del _TREES[next(iter(_TREES))]
        _TREES[blob] = template
    return template, [entries.copy() if type(entries) is LazyLeaves else dict(entries) for _, entries, _ in template]


def _template(blob: bytes, segments: tuple[Segment, ...]) -> list[tuple[Any, ...]]:
    """Per level of the schema ``blob``: (attributes, entries with pending leaves, children)."""
    schema = _Unpickler(io.BytesIO(blob), segments).load()
    out = []
    for attrs, entries, children, columns in schema:
        if columns is not None:
            keys, segs, offsets, dtypes, shapes = columns
            n = len(keys)
            decoded: dict = LazyLeaves(
                zip(
                    keys,
                    map(
                        PendingLeaf,
                        dtypes,
                        shapes,
                        repeat(None, n),
                        repeat(None, n),
                        map(segments.__getitem__, segs),
                        offsets,
                    ),
                    strict=True,
                )
            )
        else:
            codes = {k: c for k, c in entries.items() if c is not None}
            done = decode_level(codes, attrs[6])
            decoded = LazyLeaves() if type(done) is LazyLeaves else {}
            for k in entries:  # (the level's own order: children where they stood)
                dict.__setitem__(decoded, k, dict.get(done, k))
        out.append((attrs, decoded, children))
    return out


def _shareable(template: list[tuple[Any, ...]]) -> bool:
    """Whether copies of ``template``'s entries may share its values: all pending leaves (never
    changed), not too many of them."""
    count = 0
    for _, entries, children in template:
        count += len(entries)
        if sum(type(v) is PendingLeaf for v in dict.values(entries)) != len(entries) - len(children):
            return False
    return count <= _TREE_LEAVES_MAX


def rebuild_tree(cls: type, blob: bytes, segments: tuple[Segment, ...]) -> Any:
    """Rebuild the tree that :func:`reduce_tree` pickled (its leaves mapped on first read).

    Args:
        cls: the class of every level.
        blob: the pickled schema.
        segments: the anonymous segments that the schema's leaves view.

    Returns:
        The root level.
    """
    template, dicts = _anonymous(blob, segments) if segments else _from_folder(blob)
    nodes = []
    for (attrs, _, _), d in zip(template, dicts, strict=True):
        batch, device, names, locked, memmap, shared, prefix, anon_store, generation = attrs
        node = cls._from_leaves(d, torch.Size(batch), device, None if names is None else list(names))  # type: ignore[attr-defined]
        node._is_memmap, node._is_shared, node._memmap_prefix = memmap, shared, prefix
        node._anon_store, node._generation = anon_store, generation
        node._is_locked = locked
        nodes.append(node)
    for node, (_, _, children) in zip(nodes, template, strict=True):
        d = node._tensordict
        for key, i in children:
            dict.__setitem__(d, key, nodes[i])
    # lock parents as a level-by-level rebuild records them: each locked level with children
    # gives every level below it (in depth-first order, the ones up to its last descendant) a
    # weak reference to it, deepest first, as pickle rebuilds them
    end = list(range(1, len(nodes) + 1))
    for i in range(len(nodes) - 1, -1, -1):
        attrs, _, children = template[i]
        if children:
            end[i] = end[children[-1][1]]
            if attrs[3]:
                note_lock_parent(nodes[i], nodes[i + 1 : end[i]])
    return nodes[0]
