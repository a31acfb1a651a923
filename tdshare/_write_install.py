"""Phase 3 of a write: the written leaves installed into a tensordict, which is then locked.

``memmap_`` installs into the source tensordict itself, ``memmap`` into a blank one of the same
class and shape (:func:`blank`).  The source is changed only here, after every file is written,
so a failed write leaves it as it was.  Folder leaves arrive as
:class:`~tdshare._lazy_leaves.PendingLeaf` handles or mapped tensors (:mod:`tdshare._write_results`);
a level holding handles gets a :class:`~tdshare._lazy_leaves.LazyLeaves` dict, remembered under
its folder so that a later save over that folder maps them first.
"""

from __future__ import annotations

import os
from typing import TypeVar, cast

import torch

from ._files import jagged_from_buffer, nested_from_buffer
from ._format import STACK, VALUE_STACK, WRAPPED_DIR
from ._lazy_leaves import LazyLeaves, is_pending, raw_items, rebuilt, track_below
from ._memmap import MemoryMappedTensor
from ._nodes import kind_of
from ._plan import PlannedLevel
from ._shared_nontensor import SharedNonTensorData, SharedNonTensorStack
from ._tensordict_base import TensorDictBase
from ._write_results import leaf_file, set_leaf_file

__all__ = ["blank", "install", "rebase_results"]

T = TypeVar("T", bound=TensorDictBase)
_CPU = torch.device("cpu")


def blank(td: T) -> T:
    """An empty tensordict of ``td``'s shape and class for ``memmap()`` to install into; a lazy
    stack's has one blank member per member."""
    kind = kind_of(td)
    if kind is not None and kind.layout == STACK and kind.unwrap is not None and kind.wrap is not None:
        members, fields = kind.unwrap(td)
        return cast(T, kind.wrap([blank(m) for m in members], fields))
    return type(td)._from_leaves({}, td.batch_size, None, td._names)


def install(level: PlannedLevel, dest: TensorDictBase, final_path: str | None, share: bool | None = None) -> None:
    """Put the written ``level`` into ``dest`` (its source for ``memmap_``, a blank one for ``memmap``),
    mapped under ``final_path`` (None: anonymous memory), and lock it; ``share``: non-tensor
    values become shared ones (default: the level's own choice).

    The levels that hold leaves not mapped yet are remembered once, under ``final_path`` (one
    record for the tree, not one per level folder: ~5 µs a level), so that a later save over any
    folder of the tree maps them first (:func:`~tdshare._lazy_leaves.resolve_under`).
    """
    made: list[dict] = []
    _install(level, dest, final_path, level.share if share is None else share, made)
    if final_path is not None and made:
        track_below(made, os.path.abspath(final_path))


def _install_stack(
    level: PlannedLevel, dest: TensorDictBase, final_path: str | None, share: bool, made: list[dict]
) -> None:
    """Install a lazy stack's members into ``dest``'s members (its own, for ``memmap_``)."""
    assert level.stack is not None and level.stack.unwrap is not None
    members, _ = level.stack.unwrap(dest)
    head = None if final_path is None else os.path.join(final_path, "")
    for (key, child), member in zip(level.children, members, strict=True):
        path = None if head is None else head + key
        src = child.src
        if child.stack is None and len(child.plain_out) == len(src._tensordict) and not child.leaves:
            # a member of written plain leaves only (the usual one): what _install would do, in short
            member._tensordict = rebuilt(zip(child.plain_keys, child.plain_out, strict=True))
            made.append(member._tensordict)
            member._device, member._names, member._memmap_prefix = _CPU, src._names, path
            member._is_memmap, member._is_shared, member._is_locked = True, False, True
            continue
        _install(child, member, path, share, made)
    dest._is_memmap = True
    dest._is_shared = False
    dest._memmap_prefix = final_path
    dest._is_locked = True


def _install(level: PlannedLevel, dest: TensorDictBase, final_path: str | None, share: bool, made: list[dict]) -> None:
    if level.stack is not None:
        _install_stack(level, dest, final_path, share, made)
        return
    if level.schema is not None and not level.leaves:  # plain leaves only, written as such: the dict in one step
        dest._tensordict = rebuilt(zip(level.plain_keys, level.plain_out, strict=True))
        _finish(level, dest, final_path, made)
        return
    in_place = dest is level.src
    values: dict = {}
    if in_place:  # the copy has the source's key order, and every entry keeps its position
        pending = level.plain_out or any(is_pending(leaf.result) for leaf in level.leaves)
        values = (LazyLeaves if pending else dict)(raw_items(dest._tensordict))
    values.update(zip(level.plain_keys, level.plain_out, strict=True))
    for leaf in level.leaves:
        assert leaf.result is not None
        if not leaf.part:
            values[leaf.key] = leaf.result
    for key, data, table, jagged in level.nested:  # a nested tensor viewing its mapped, packed elements
        assert data.result is not None and table.result is not None
        assert not is_pending(data.result) and not is_pending(table.result)  # never lazy (see _write_leaf)
        values[key] = (jagged_from_buffer if jagged else nested_from_buffer)(
            cast(MemoryMappedTensor, data.result), cast(MemoryMappedTensor, table.result)
        )
    for nt in level.nontensors:
        folder, store = None, None
        if share and nt.store is not None and nt.path is not None:  # an anonymous tree's, in its store
            folder, store = nt.path, nt.store
        elif share and final_path is not None and nt.path is not None:
            folder = os.path.join(final_path, os.path.basename(nt.path))
        if folder is None:
            values[nt.key] = nt.value if in_place else nt.value.clone()
        elif kind_of(nt.value).layout == VALUE_STACK:  # type: ignore[union-attr]
            # the writer made these files, so it may read its own pickles back
            values[nt.key] = SharedNonTensorStack(nt.value.tolist(), nt.value.batch_size, folder, True, store)
        else:
            values[nt.key] = SharedNonTensorData(nt.value.data, folder, allow_pickle=True, store=store)
    for w in level.wrapped:
        wrapper_dir = None
        if final_path is not None and w.path is not None:
            wrapper_dir = os.path.join(final_path, os.path.basename(w.path))
        inner = _install_child(w.inner, type(w.inner.src), in_place, wrapper_dir, WRAPPED_DIR, share, made)
        assert w.kind.wrap is not None
        values[w.key] = w.value if in_place else w.kind.wrap(inner, w.fields)
    for key, child in level.children:
        values[key] = _install_child(child, type(dest), in_place, final_path, child.path, share, made)
    if in_place:
        dest._tensordict = values
    else:  # keep the source's key order
        dest._tensordict = rebuilt([(k, values[k]) for k in level.src._tensordict])
    _finish(level, dest, final_path, made)


def _finish(level: PlannedLevel, dest: TensorDictBase, final_path: str | None, made: list[dict]) -> None:
    """Mark ``dest``, which holds its written entries now, memory-mapped under ``final_path`` and lock it."""
    if final_path is not None and type(dest._tensordict) is LazyLeaves:
        made.append(dest._tensordict)
    dest._device = _CPU
    dest._names = level.src._names
    dest._is_memmap = True
    dest._is_shared = False
    dest._memmap_prefix = final_path
    dest._is_locked = True


def _install_child(
    child: PlannedLevel,
    cls: type[TensorDictBase],
    in_place: bool,
    parent: str | None,
    name: str | None,
    share: bool,
    made: list[dict],
) -> TensorDictBase:
    """Install a child level: into its source (``memmap_``) or a new ``cls`` (``memmap``), mapped
    under ``parent``/basename(``name``)."""
    src = child.src
    if in_place:
        dest = src
    elif child.stack is not None:
        dest = blank(src)
    else:
        dest = cls._from_leaves({}, src.batch_size, None, src._names)
    path = None if parent is None or name is None else os.path.join(parent, os.path.basename(name))
    _install(child, dest, path, share, made)
    return dest


def rebase_results(level: PlannedLevel, staging: str, final: str) -> None:
    """Point the written leaves of ``level``, written under ``staging`` (renamed since), at ``final``."""
    cut = len(staging)
    for lvl in level.walk():
        for out in lvl.plain_out:
            set_leaf_file(out, final + cast(str, leaf_file(out))[cut:])
        for leaf in lvl.leaves:
            r = leaf.result
            name = leaf_file(r) if r is not None and r is not leaf.reuse else None
            if name is not None:
                set_leaf_file(r, final + name[cut:])
