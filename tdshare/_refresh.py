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

from ._coordination import SharedRegistry, unchanged_since
from ._entries import insert_entry
from ._errors import CorruptDataError, MemmapError, NotMemmapError
from ._format import LEVEL, META_FILE, RESERVED_KEYS, VALUE, VALUE_STACK, layout_of, parse_level, str_to_dtype
from ._keys import encode_key
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
    _refresh_level(type(td), store, td, prefix, same_files)
    td._generation = state
    return td


def registry_of(td: TensorDictBase, directory: str) -> SharedRegistry:
    """The registry of ``directory``, cached on ``td`` so it stays mapped while ``td`` lives."""
    cached = td._registry
    if cached is not None and cached[0] == directory:
        return cached[1]
    registry = SharedRegistry.for_directory(directory)
    td._registry = (directory, registry)
    return registry


def _refresh_level(cls: Any, store: DirectoryStore, td: TensorDictBase, directory: str, same_files: bool) -> None:
    meta_path = os.path.join(directory, META_FILE)
    try:  # taken before reading: a change after it shows at the next refresh
        st = os.stat(meta_path)
        stamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = None
    # meta.json is only ever replaced (new inode): the same stamp means the same metadata
    unchanged = same_files and stamp is not None and stamp == td._meta_stamp and td._meta_seen is not None
    meta = td._meta_seen if unchanged and td._meta_seen is not None else read_meta(directory)
    if layout_of(meta) != LEVEL:
        raise CorruptDataError(f"{meta_path} no longer describes a TensorDict level: load the folder again.")
    seen = td._meta_seen if same_files else None
    if unchanged:
        changed: dict = {}  # only nested levels and non-tensor values (their own files) may have changed
        removed: list[str] = []
    elif seen is not None and all(meta.get(k) == seen.get(k) for k in RESERVED_KEYS):
        # Only entries whose metadata changed need work; unchanged nested levels are still read,
        # since their own meta.json may have changed.
        changed = {k: v for k, v in meta.items() if seen.get(k) != v}
        removed = [k for k in seen if k not in meta]
    else:
        changed, removed = meta, list(td._tensordict)
    level = parse_level({**changed, "shape": meta["shape"]}, meta_path)
    batch = tuple(level.batch_size or ())
    if batch != tuple(td.batch_size):
        raise CorruptDataError(
            f"{meta_path}: the batch size changed from {list(td.batch_size)} to {list(batch)}; load the folder again."
        )
    current = td._tensordict
    leaves: dict[str, Any] = {k: v for k, v in current.items() if k not in changed and k not in removed}
    for info in level.leaves:  # file-less entries are not among them: nothing of theirs is shared
        old = current.get(info.key)
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
        leaves[info.key] = open_checked_leaf(store, directory, info, batch, meta_path, old)
    child_keys = [k for k, _ in level.children]
    # unchanged nested levels and non-tensor values live in their own meta.json: read them again
    # (a value shared live re-reads itself on use)
    child_keys += [
        k
        for k, v in leaves.items()
        if k not in changed
        and (is_collection(v) or (kind_of(v) in (NONTENSOR, NONTENSOR_STACK) and not is_shared_value(v)))
    ]
    for key in child_keys:
        old = current.get(key)
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
                leaves[key] = old
                continue
        if is_collection(old) and old._memmap_prefix == path:
            _refresh_level(cls, store, old, path, same_files)
            leaves[key] = old
        else:
            value = load_level(cls, store, path, read_meta(path), None, batch, None)
            if is_collection(value):
                _mark_memmap(value, td._is_locked)
            leaves[key] = value
    td._tensordict = {k: leaves[k] for k in meta if k in leaves}
    td._meta_seen = meta
    td._meta_stamp = stamp


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
