"""``memmap_refresh_``: bring a memory-mapped tensordict up to date with its folder.

A refresh never writes.  It reads the tree's registry counters first (one memory read): when
the generation is the one this tensordict last saw, it returns at once.  Otherwise it re-reads
the committed ``meta.json`` files and maps only what is new.  While the file epoch is unchanged
(no leaf file was replaced since), a known leaf with the same file, shape and dtype is kept as
it is, without a ``stat``; after a re-save every leaf is checked by inode and remapped if its file
changed.  Keys no longer in the metadata are dropped.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ._coordination import level_in_tree, registry_of, unchanged_since
from ._entries import insert_entry
from ._errors import CorruptDataError, MemmapError, NotMemmapError
from ._format import (
    JOURNAL_FIELD,
    JOURNAL_FILE,
    LEVEL,
    LEVEL_FIELDS,
    META_FILE,
    RESERVED_KEYS,
    VALUE,
    VALUE_STACK,
    layout_of,
    parse_level,
    str_to_dtype,
)
from ._journal import merge_entries, parse_entries, read_journal
from ._keys import encode_key
from ._lazy_leaves import PendingLeaf, is_pending, raw_get, raw_items, raw_values, rebuilt, with_pending
from ._leaf_handle import LeafHandle
from ._memmap import MemoryMappedTensor
from ._nodes import kind_of
from ._nontensor import NONTENSOR, NONTENSOR_STACK, NonTensorStack
from ._read import check_load_args, load_level, open_checked_leaf, read_meta
from ._runtime import read_manifest, register_user
from ._segments import Segment
from ._shared_nontensor import is_shared_value
from ._store import DirectoryStore
from ._tensordict_base import TensorDictBase, is_collection

__all__ = ["refresh"]


def refresh(td: TensorDictBase, allow_pickle: bool | None = None) -> TensorDictBase:
    check_load_args(None, allow_pickle)
    prefix = td._memmap_prefix
    if td._is_memmap and prefix is None and td._anon_store is not None:
        return _refresh_anonymous(td, td._anon_store)
    if not td._is_memmap or prefix is None:
        raise NotMemmapError(
            "Cannot refresh a TensorDict that is not memory mapped or has no path associated: memmap_() it to a "
            "folder first (a load_memmap() result needs td.memmap_(), which writes nothing if nothing changed)."
        )
    registry = registry_of(td, prefix)
    state = registry.state(create=True)
    if state is not None and unchanged_since(td._generation, state):
        td._generation = state
        return td
    seen = td._generation
    same_files = state is not None and seen is not None and state[1] == seen[1]
    store = DirectoryStore(prefix, True, None, allow_pickle)
    if not (
        same_files
        and seen is not None
        and state is not None
        and (paths := registry.changes_since(seen[0], state[0])) is not None
        and _refresh_changed(type(td), store, td, level_in_tree(registry.root, prefix), paths)
    ):
        _refresh_level(type(td), store, td, prefix, same_files)
    td._generation = state
    return td


def _refresh_changed(cls: Any, store: DirectoryStore, td: TensorDictBase, here: str | None, paths: list[str]) -> bool:
    """Refresh only the levels the ring of changes names (each alone, not its nested levels).

    ``here``: ``td``'s own level in the tree.  A change outside ``td``'s levels concerns it not;
    a level it cannot find (restructured meanwhile) makes it return False: read every level."""
    if here is None:
        return False
    nodes: list[TensorDictBase] = []
    for path in dict.fromkeys(paths):
        if path == here:
            parts: list[str] = []
        elif here == "" or path.startswith(here + os.sep):
            parts = (path if here == "" else path[len(here) + 1 :]).split(os.sep)
        else:
            continue
        node: TensorDictBase | None = td
        for name in parts:
            node = _child_level(node, name) if node is not None else None
        if node is None or node._memmap_prefix is None:
            return False
        nodes.append(node)
    for node in nodes:
        assert node._memmap_prefix is not None
        _refresh_level(cls, store, node, node._memmap_prefix, True, recurse=False)
    return True


def _child_level(node: TensorDictBase, name: str) -> TensorDictBase | None:
    """The nested level of ``node`` saved in its folder ``name`` (None if there is none)."""
    prefix = node._memmap_prefix
    if prefix is None:
        return None
    expected = prefix + os.sep + name
    child = raw_get(node._tensordict, name)
    if is_collection(child) and child._memmap_prefix == expected:
        return child
    for value in raw_values(node._tensordict):  # an encoded key: its folder name is not the key
        if is_collection(value) and value._memmap_prefix == expected:
            return value
    return None


_Stamp = tuple[tuple[int, int, int] | None, tuple[int, int] | None]
# the keys of a level's nested entries (their own folders), per metadata object a refresh last saw
_CHILDREN: dict[int, tuple[dict, list[str]]] = {}
_CHILDREN_SIZE = 256


def _stamps(directory: str) -> _Stamp:
    """(meta.json's inode, size, mtime) and (the record's inode, size), None where a file is absent."""
    try:  # taken before reading: a change after it shows at the next refresh
        st = os.stat(directory + os.sep + META_FILE)
        mstamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        mstamp = None
    try:
        jt = os.stat(directory + os.sep + JOURNAL_FILE)
        jstamp: tuple[int, int] | None = (jt.st_ino, jt.st_size)
    except OSError:
        jstamp = None
    return mstamp, jstamp


def _child_keys(meta: dict) -> list[str]:
    hit = _CHILDREN.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    keys = [k for k, v in meta.items() if isinstance(v, dict) and "type" in v]
    if len(_CHILDREN) >= _CHILDREN_SIZE:
        _CHILDREN.pop(next(iter(_CHILDREN)))
    _CHILDREN[id(meta)] = (meta, keys)  # holding meta: its id is not reused while cached
    return keys


def _extend_child_keys(old: dict, meta: dict, new: dict) -> None:
    """Register ``meta`` (``old`` with the ``new`` entries laid over) without scanning it whole."""
    hit = _CHILDREN.get(id(old))
    if hit is None or hit[0] is not old or any(k in old for k in new):
        return
    if len(_CHILDREN) >= _CHILDREN_SIZE:
        _CHILDREN.pop(next(iter(_CHILDREN)))
    _CHILDREN[id(meta)] = (meta, hit[1] + [k for k, v in new.items() if isinstance(v, dict) and "type" in v])


def _refresh_level(
    cls: Any, store: DirectoryStore, td: TensorDictBase, directory: str, same_files: bool, recurse: bool = True
) -> None:
    """Bring one level up to date with its metadata; ``recurse``: its unchanged nested levels too."""
    meta_path = os.path.join(directory, META_FILE)
    mstamp, jstamp = _stamps(directory)
    old_stamp = td._meta_stamp
    seen_meta = td._meta_seen
    # meta.json is only ever replaced (new inode) and its record only appended to: the same
    # stamps mean the same metadata, a longer record means only its new lines are new
    if same_files and seen_meta is not None and mstamp is not None and old_stamp is not None and old_stamp[0] == mstamp:
        old_j = old_stamp[1]
        if old_j == jstamp:
            _refresh_additions(cls, store, td, directory, same_files, seen_meta, {}, old_stamp, recurse)
            return
        if jstamp is not None and old_j is not None and old_j[0] == jstamp[0] and jstamp[1] > old_j[1]:
            tail = read_journal(directory, old_j[1])
            if tail is not None and tail.ino == jstamp[0]:
                entries = parse_entries(tail.raw, directory + os.sep + JOURNAL_FILE)
                if not any(k in RESERVED_KEYS for k in entries):
                    new = {k: v for k, v in entries.items() if seen_meta.get(k) != v}
                    meta = {**seen_meta, **new} if new else seen_meta
                    if new:
                        _extend_child_keys(seen_meta, meta, new)
                    grown: _Stamp = (mstamp, (tail.ino, tail.end))
                    _refresh_additions(cls, store, td, directory, same_files, meta, new, grown, recurse)
                    return
    journal = read_journal(directory)  # before meta.json, as every reader
    meta = read_meta(directory, journal=False)
    if journal is not None and journal.raw:
        meta = merge_entries(meta, parse_entries(journal.raw, directory + os.sep + JOURNAL_FILE))
    stamp: _Stamp = (mstamp, None if journal is None else (journal.ino, journal.end))
    if layout_of(meta) != LEVEL:
        raise CorruptDataError(f"{meta_path} no longer describes a TensorDict level: load the folder again.")
    seen = seen_meta if same_files else None
    if seen is not None and all(meta.get(k) == seen.get(k) for k in LEVEL_FIELDS):
        # Only entries whose metadata changed need work; unchanged nested levels are still read,
        # since their own meta.json may have changed.
        changed = {k: v for k, v in meta.items() if seen.get(k) != v and k != JOURNAL_FIELD}
        removed = [k for k in seen if k not in meta]
    else:
        changed, removed = meta, list(td._tensordict)
    if not removed and all(k not in td._tensordict for k in changed):
        _refresh_additions(cls, store, td, directory, same_files, meta, changed, stamp, recurse)
        return
    level = parse_level({**changed, "shape": meta["shape"]}, meta_path)
    batch = _checked_batch(td, level.batch_size, meta_path)
    current = td._tensordict
    leaves: dict[str, Any] = dict(raw_items(current, lambda k: k not in changed and k not in removed))
    for info in level.leaves:  # file-less entries are not among them: nothing of theirs is shared
        old = raw_get(current, info.key)
        if (
            same_files
            and isinstance(old, MemoryMappedTensor)
            and old.shape == info.shape
            and old.dtype == info.dtype
            and (old._filename is None or os.path.dirname(old._filename) == directory)
            and (old._filename is not None or info.numel == 0)
        ):
            leaves[info.key] = old
            continue
        if (
            same_files
            and isinstance(old, PendingLeaf)
            and old.shape == tuple(info.shape)
            and old.dtype == info.dtype
            and old.path is not None
            and os.path.dirname(old.path) == directory
        ):
            leaves[info.key] = old  # not mapped yet: it maps the same file when first read
            continue
        leaves[info.key] = open_checked_leaf(store, directory, info, batch, meta_path, old)
    child_keys = [k for k, _ in level.children]
    # unchanged nested levels and non-tensor values live in their own meta.json: read them again
    # (a value shared live re-reads itself on use)
    child_keys += [
        k
        for k, v in (raw_items(leaves, lambda k: k not in changed) if recurse else [])
        if is_collection(v) or (kind_of(v) in (NONTENSOR, NONTENSOR_STACK) and not is_shared_value(v))
    ]
    _refresh_children(cls, store, td, directory, child_keys, changed, leaves, same_files, batch)
    td._tensordict = rebuilt([(k, raw_get(leaves, k)) for k in meta if k in leaves])
    td._meta_seen = meta
    td._meta_stamp = stamp


def _checked_batch(td: TensorDictBase, batch_size: Any, meta_path: str) -> tuple[int, ...]:
    batch = tuple(batch_size or ())
    if batch != tuple(td.batch_size):
        raise CorruptDataError(
            f"{meta_path}: the batch size changed from {list(td.batch_size)} to {list(batch)}; load the folder again."
        )
    return batch


def _refresh_additions(
    cls: Any,
    store: DirectoryStore,
    td: TensorDictBase,
    directory: str,
    same_files: bool,
    meta: dict,
    new: dict,
    stamp: _Stamp,
    recurse: bool = True,
) -> None:
    """A level where only new keys appeared (``new``): they are mapped and added in place (in the
    metadata's order, at the end), and every nested level is refreshed in turn."""
    meta_path = directory + os.sep + META_FILE
    current = td._tensordict
    batch = tuple(td.batch_size)
    children: list[str] = []
    level = None
    if new:
        level = parse_level({**new, "shape": meta["shape"]}, meta_path)
        batch = _checked_batch(td, level.batch_size, meta_path)
        for info in level.leaves:  # the batch check first: it raises naming the leaf
            if batch and info.shape[: len(batch)] != batch and not info.is_nested:
                open_checked_leaf(store, directory, info, batch, meta_path, None)
        # one lstat per new leaf (no listing of a level of thousands); mapped when first read
        opened = store.open_leaves(directory, level.leaves, meta_path, {})
        if any(is_pending(v) for v in opened.values()):
            current = td._tensordict = with_pending(current)
        dict.update(current, opened)
        children = [k for k, _ in level.children]
    keys = [k for k in _child_keys(meta) if k not in new] if recurse else []
    if keys or children:
        old_keys = [
            k
            for k in keys
            if (v := raw_get(current, k)) is not None
            and (is_collection(v) or (kind_of(v) in (NONTENSOR, NONTENSOR_STACK) and not is_shared_value(v)))
        ]
        _refresh_children(cls, store, td, directory, children + old_keys, new, current, same_files, batch)
    if level is not None and level.leaves and children:  # both kinds were added: put them back in the metadata's order
        td._tensordict = rebuilt([(k, raw_get(current, k)) for k in meta if k in current])
    td._meta_seen = meta
    td._meta_stamp = stamp


def _refresh_children(
    cls: Any,
    store: DirectoryStore,
    td: TensorDictBase,
    directory: str,
    child_keys: list[str],
    changed: dict,
    out: dict[str, Any],
    same_files: bool,
    batch: tuple[int, ...],
) -> None:
    """Refresh (or load, when new or changed) the nested levels and non-tensor values ``child_keys`` into ``out``."""
    meta_path = directory + os.sep + META_FILE
    current = td._tensordict
    for key in child_keys:
        old = raw_get(current, key)
        if is_collection(old) and old._memmap_prefix is not None and key not in changed:
            _refresh_level(cls, store, old, old._memmap_prefix, same_files)
            continue
        path = store.child(directory, key)
        if path is None:
            raise CorruptDataError(
                f"{meta_path} lists the nested entry {key!r}, but its folder "
                f"{os.path.join(directory, encode_key(key))!r} is missing."
            )
        if is_shared_value(old) and os.path.normpath(old._folder) == os.path.normpath(path):
            layout = VALUE_STACK if isinstance(old, NonTensorStack) else VALUE
            if layout_of(read_meta(path)) == layout:  # still shared in the same folder: it re-reads itself on use
                out[key] = old
                continue
        if is_collection(old) and old._memmap_prefix == path:
            _refresh_level(cls, store, old, path, same_files)
            out[key] = old
        else:
            value = load_level(cls, store, path, read_meta(path), None, batch, None)
            if is_collection(value):
                _mark_memmap(value, td._is_locked)
            out[key] = value


def _mark_memmap(td: TensorDictBase, locked: bool) -> None:
    def fix(level: TensorDictBase) -> None:
        level._is_memmap = True
        level._is_locked = locked

    td._propagate(fix)


# -- anonymous trees: entries published in the runtime store ----------------------------------
def _refresh_anonymous(td: TensorDictBase, store: tuple[str, tuple[str, ...]]) -> TensorDictBase:
    path, level_key = store
    registry = registry_of(td, path)
    state = registry.state()  # None until some process adds an entry
    if state == td._generation:
        return td
    register_user(path)  # we are about to map through the store: keep it from being reaped
    for entry in read_manifest(path):
        key = tuple(entry["key"])
        if key[: len(level_key)] != level_key or len(key) == len(level_key):
            continue
        rel = key[len(level_key) :]
        if td._get_leaf(rel, None) is not None:
            continue
        insert_entry(td, rel, _attach(path, entry), None, True)
    td._generation = state
    return td


def _attach(store: str, entry: dict[str, Any]) -> MemoryMappedTensor:
    """Map an entry another process published: open its memfd through /proc and check it."""
    pid, fd, size = int(entry["pid"]), int(entry["fd"]), int(entry["size"])
    dtype = str_to_dtype(entry["dtype"], os.path.join(store, "manifest.json"))
    shape = torch.Size(entry["shape"])
    source = f"/proc/{pid}/fd/{fd}"
    try:
        new_fd = os.open(source, os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        raise MemmapError(
            f"Cannot map the anonymous entry {tuple(entry['key'])!r}: the process that added it (pid {pid}) has "
            f"exited or closed it ({err.strerror}). Anonymous entries are reachable through their creator until "
            "another process maps them; memory-map to a folder for entries that outlive their writer."
        ) from None
    st = os.fstat(new_fd)
    if st.st_ino != entry.get("ino") or st.st_size < size:
        os.close(new_fd)
        raise MemmapError(
            f"Cannot map the anonymous entry {tuple(entry['key'])!r}: descriptor {fd} of process {pid} no longer "
            "holds its memory (it was closed and reused)."
        )
    return LeafHandle.in_segment(Segment.from_fd(new_fd, size), 0, dtype, tuple(shape)).map()
