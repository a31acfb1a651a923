"""The write half of anonymous shared memory: :class:`AnonymousWriter`.

Every new leaf of the tree is copied into one ``memfd`` segment (an arena): one descriptor however
many leaves, no file names, freed by the kernel with the last process that uses it.  With
``share_non_tensor`` the non-tensor values go into the tree's runtime store, where every
process holding the tree reads them.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import ClassVar, TypeVar

import torch

from ._coordination import SharedRegistry
from ._errors import InvalidArgumentError
from ._files import is_zero_broadcast
from ._format import STACK, WRAPPED_DIR
from ._future import TensorDictFuture
from ._keys import encode_key
from ._lazy_leaves import raw_items
from ._memmap import MemoryMappedTensor
from ._nodes import kind_of
from ._nontensor_files import write_nontensor
from ._options import SaveOptions, Unsupported
from ._plan import PlannedLevel, TreeWriter, encode_value, plan_tree
from ._runtime import ensure_store, new_store_path
from ._segments import Segment, align
from ._tensordict_base import TensorDictBase, is_collection
from ._write_install import blank, install

__all__ = ["AnonymousWriter"]

T = TypeVar("T", bound=TensorDictBase)


def _write_anonymous(root: PlannedLevel) -> None:
    """Copy every new leaf of the tree into one shared segment (an arena)."""
    pending = []
    total = 0
    for level in root.walk():
        for leaf in level.leaves:
            if leaf.reuse is not None:
                leaf.result = leaf.reuse
            elif leaf.src.numel() == 0:
                leaf.result = MemoryMappedTensor._wrap(
                    torch.empty(leaf.src.shape, dtype=leaf.src.dtype), None, None, None
                )
            else:
                pending.append((leaf, total))
                total += align(leaf.src.numel() * leaf.src.dtype.itemsize)
    if not pending:
        return
    seg = Segment.create(total)
    for leaf, offset in pending:
        view = seg.view(offset, leaf.src.dtype, leaf.src.shape)
        src = leaf.src.detach()
        if not is_zero_broadcast(src):  # a new segment reads as zeros: memmap_like's leaves stay untouched
            view.copy_(src.resolve_conj().resolve_neg() if src.is_complex() else src)
        leaf.result = MemoryMappedTensor._wrap(view, None, seg, None)


def _assign_store(td: TensorDictBase, store: str, key: tuple[str, ...]) -> None:
    """Give every level of an anonymous tree the runtime store through which entries are shared."""
    td._anon_store = (store, key)
    kind = kind_of(td)
    if kind is not None and kind.layout == STACK and kind.unwrap is not None:
        for i, member in enumerate(kind.unwrap(td)[0]):
            _assign_store(member, store, (*key, str(i)))
        return
    for name, value in raw_items(td._tensordict):
        child = kind_of(value)
        if (child is not None and child.layout == STACK) or is_collection(value):
            _assign_store(value, store, (*key, name))


class AnonymousWriter(TreeWriter):
    """The write half of anonymous shared memory: every new leaf of the tree in one memfd segment."""

    name = "anonymous memory"
    unsupported: ClassVar[Unsupported] = {
        "atomic": (InvalidArgumentError, "atomic=True needs a prefix to write the directory to."),
    }

    def save(self, td: T, opts: SaveOptions, *, inplace: bool) -> T | TensorDictFuture[T]:
        """Write every new leaf into one segment; with ``share_non_tensor``, every non-tensor value
        into the tree's runtime store (``values/<key path>/``), shared by every process.

        With ``return_early`` and ``num_threads > 1`` the result is a :class:`TensorDictFuture`, as
        for a folder, already done: the copy into one segment is one pass that threads would not
        shorten."""
        root = plan_tree(td, None, opts.robust_key, opts.copy_existing, opts.existsok)
        store = td._anon_store[0] if inplace and td._anon_store is not None else new_store_path()
        if opts.share_non_tensor:
            root.share = True
            ensure_store(store)
            registry = SharedRegistry.for_directory(store)
            with registry.lock():
                if _write_shared_values(root, store, os.path.join(store, _VALUES)):
                    registry.bump()  # other processes holding the values read them again
        _write_anonymous(root)
        if opts.progress is not None:
            total = sum(len(level.leaves) for level in root.walk())
            opts.progress(total, total)  # one copy into one segment: done at once
        dest = td if inplace else blank(td)
        install(root, dest, None)
        _assign_store(dest, store, ())
        if opts.return_early and opts.num_threads > 1:
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_result(None)
            return TensorDictFuture([done], dest)
        return dest


_VALUES = "values"  # the folder of an anonymous tree's shared non-tensor values, in its runtime store


def _write_shared_values(level: PlannedLevel, store: str, folder: str) -> bool:
    """Write the non-tensor values of an anonymous tree into its store, one folder per key path;
    return whether any file changed (the caller holds the store's lock)."""
    changed = False
    for nt in level.nontensors:
        nt.path, nt.store = os.path.join(folder, encode_key(nt.key)), store
        nt.meta, nt.pickled, nt.pickle_name = encode_value(nt.value, f"key {nt.key!r}")
        changed = write_nontensor(nt.path, nt.meta, nt.pickled, nt.pickle_name) or changed
    for key, child in level.children:
        changed = _write_shared_values(child, store, os.path.join(folder, encode_key(key))) or changed
    for w in level.wrapped:
        changed = _write_shared_values(w.inner, store, os.path.join(folder, encode_key(w.key), WRAPPED_DIR)) or changed
    return changed
