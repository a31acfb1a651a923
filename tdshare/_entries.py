"""Adding entries to a live memory-mapped tensordict: ``make_memmap``, ``make_memmap_from_tensor``,
``make_memmap_from_storage``.

Everything is validated before anything is written (key, file name, shape against the batch
size, storage), so a failing call leaves no trace on disk or in memory.  For a tensordict with a
folder, the whole addition runs under the tree's lock: the level's ``meta.json`` is re-read from
disk (another process may have added entries), the new data file is written first (a new inode:
stale bytes of an old file are never reused), then the metadata is replaced and the generation
bumped, so other processes see the entry after ``memmap_refresh_()``.
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._adder import prime_adder
from ._compaction import add_to_level, read_level
from ._coordination import SharedRegistry, level_in_tree, registry_of, unchanged_since
from ._errors import (
    ArgumentTypeError,
    BatchSizeError,
    InvalidArgumentError,
    MemmapError,
    NotMemmapError,
    NotSupportedError,
)
from ._files import nested_from_buffer, replace_file, reserve_file, storage_filename, tensor_buffer, write_file
from ._format import (
    LEAF_SUFFIX,
    LEVEL,
    META_FILE,
    NO_FILE_FIELD,
    PICKLE_FILE,
    STACK_PICKLE_FILE,
    entry_file_name,
    layout_of,
    leaf_entry,
    level_meta,
)
from ._indexing import contiguous_strides
from ._keys import NestedKey, encode_key, unravel_key
from ._memmap import MemoryMappedTensor
from ._nontensor import NonTensorData, NonTensorStack
from ._nontensor_files import encode_nontensor, encode_nontensor_stack
from ._nontensor_files import write_nontensor as write_nontensor_folder
from ._runtime import ensure_store, read_manifest, write_manifest
from ._shared_nontensor import is_shared_value
from ._store import user_stacklevel
from ._tensordict_base import TensorDictBase, is_collection

__all__ = [
    "add_entry",
    "build_empty",
    "build_from_tensor",
    "build_from_storage",
    "storage_entry_checks",
    "write_non_tensor",
    "insert_entry",
]


Builder = Callable[[str | None, torch.Size, torch.dtype], MemoryMappedTensor]


def size_table(shape: torch.Tensor, what: str = "shape") -> torch.Tensor:
    """A tensor of shapes (one row per piece of a nested tensor) as a checked int64 ``[pieces, ndim]`` table.

    Raises:
        MemmapError: not a 2-d table of non-negative integers.
    """
    if shape.dim() != 2 or shape.is_floating_point() or shape.is_complex() or shape.dtype is torch.bool:
        raise MemmapError(
            f"A tensor of shapes must be a 2-d integer tensor, one row per piece ([pieces, ndim]); got {what} "
            f"{shape.dtype} of shape {list(shape.shape)}."
        )
    table = shape.detach().cpu().to(torch.int64)
    if (table < 0).any():
        raise MemmapError(f"A tensor of shapes must not hold negative sizes, got {table.tolist()}.")
    return table


def _packed_numel(table: torch.Tensor) -> int:
    return int(table.prod(-1).sum()) if table.numel() else 0


def _parse_shape(shape: Any) -> torch.Size:
    if isinstance(shape, torch.Tensor):
        return torch.Size([_packed_numel(size_table(shape))])  # the packed elements of a nested entry
    size = torch.Size([shape]) if isinstance(shape, int) else torch.Size([int(s) for s in shape])
    if any(s < 0 for s in size):
        raise MemmapError(f"Cannot make a memmap tensor of shape {list(size)}: dimensions must not be negative.")
    return size


def _target_level(td: TensorDictBase, parts: tuple[str, ...], robust: bool) -> tuple[list[str], TensorDictBase | None]:
    """Encoded folder names down to the entry's level, and the deepest existing in-memory level."""
    names: list[str] = []
    node: TensorDictBase | None = td
    for part in parts[:-1]:
        names.append(entry_file_name(part, robust, "", "the tensordict", directory=True))
        child = node._tensordict.get(part) if node is not None else None
        if child is not None and not is_collection(child):
            raise MemmapError(f"Cannot add {parts!r}: {part!r} is a leaf, not a nested tensordict.")
        node = child
    return names, node


def add_entry(
    td: TensorDictBase,
    key: NestedKey,
    shape: Any,
    dtype: torch.dtype | None,
    robust_key: bool | None,
    build: Builder,
    *,
    has_file: bool = True,
    creates_file: bool = True,
) -> MemoryMappedTensor:
    """Validate, write and register a new leaf; ``build(path, shape, dtype)`` makes its tensor.

    ``has_file``: the entry's data lives in its file (False for a file-less storage, which
    readers drop).  ``creates_file``: ``build`` writes that file (removed again on failure).
    """
    if not td._is_memmap:
        raise NotMemmapError(
            "Can only make a memmap tensor within a memory-mapped tensordict: call memmap_() first "
            "(is_memmap() is False, for example after unlock_() or for a load_memmap() result)."
        )
    parts = unravel_key(key)
    robust = True if robust_key is None else bool(robust_key)
    table = size_table(shape) if isinstance(shape, torch.Tensor) else None  # a nested entry
    shape_ = _parse_shape(shape)
    dtype_ = dtype or torch.get_default_dtype()
    folders, existing = _target_level(td, parts, robust)
    last = parts[-1]
    if existing is not None and last in existing._tensordict:
        raise MemmapError(
            f"The key {last!r} already exists within the target tensordict. Delete that entry before overwriting it."
        )
    batch = td.batch_size if existing is None else existing.batch_size
    if table is not None:
        _check_nested_batch(parts, table, batch)
    elif shape_[: len(batch)] != batch:
        raise BatchSizeError(
            f"batch dimension mismatch for key {parts!r}: shape {list(shape_)} does not start with the batch "
            f"size {list(batch)}."
        )
    prefix = td._memmap_prefix
    if prefix is None and table is not None:
        raise NotSupportedError(
            f"A nested entry {parts!r} needs a folder: make_memmap* with a tensor of shapes writes the size table "
            "next to the elements. Memory-map the tensordict to a folder, or save the nested tensor with memmap_()."
        )
    if prefix is None:
        anonymous = build(None, shape_, dtype_)
        if td._anon_store is not None and anonymous._segment is not None:
            _publish(td, td._anon_store, parts, anonymous)
        insert_entry(td, parts, anonymous, None, robust)
        return anonymous
    file_name = entry_file_name(last, robust, LEAF_SUFFIX, "the tensordict", directory=False) + LEAF_SUFFIX
    level_dir = os.path.join(prefix, *folders)
    path = os.path.join(level_dir, file_name)
    registry = registry_of(td, prefix)
    with registry.lock():
        before = registry.state()
        metas = _read_chain(prefix, folders, parts)
        on_disk = metas[-1].get(last) if metas[-1] is not None else None
        # a file-less entry (dropped by every reader) may be replaced, as in memory after a refresh
        if on_disk is not None and not (isinstance(on_disk, dict) and on_disk.get(NO_FILE_FIELD)):
            raise MemmapError(
                f"The key {last!r} already exists in {os.path.join(level_dir, META_FILE)} (added by another "
                "process): call memmap_refresh_() to see it."
            )
        created = _make_level_dirs(prefix, folders)
        tensor: MemoryMappedTensor | None = None
        sizes_path = path[: -len(LEAF_SUFFIX)] + ".shape" + LEAF_SUFFIX
        try:
            tensor = build(path if has_file else None, shape_, dtype_)
            if table is not None:  # the reference's layout: the pieces' shapes beside the packed elements
                write_file(sizes_path, table.numpy().tobytes(), existsok=True)
                entry = leaf_entry(table.shape, dtype_, is_nested=True)
            else:
                entry = leaf_entry(shape_, dtype_)
            if not has_file:
                entry[NO_FILE_FIELD] = True
            _commit_chain(prefix, folders, parts, metas, entry, batch, td)
            top = max(i for i, m in enumerate(metas) if m is not None)  # the shallowest level written
        except BaseException:
            if tensor is not None and has_file and creates_file and tensor.numel():
                os.unlink(path)
            if table is not None and os.path.exists(sizes_path):
                os.unlink(sizes_path)
            for folder in reversed(created):
                shutil.rmtree(folder, ignore_errors=True)
            raise
        after = registry.bump(level=level_in_tree(registry.root, os.path.join(prefix, *folders[:top])))
        prime_adder(registry, level_dir, before, after)  # the next additions to this level may take the fast path
    if table is not None:  # the entry: a nested tensor viewing the packed elements, a MemoryMappedTensor
        nested = nested_from_buffer(tensor, table).as_subclass(MemoryMappedTensor)
        nested._filename = tensor._filename
        tensor = nested
    insert_entry(td, parts, tensor, prefix, robust)
    if unchanged_since(td._generation, before) and has_file:
        # we were current: our own addition is all that changed (a file-less entry stays stale on
        # purpose, so that the next memmap_refresh_() drops it, as it does in every other process)
        td._generation = after
    return tensor


def _check_nested_batch(parts: tuple[str, ...], table: torch.Tensor, batch: torch.Size) -> None:
    """A nested entry's pieces are its first dim; every piece must start with the remaining batch dims."""
    pieces = table.shape[0]
    if batch and pieces != batch[0]:
        raise BatchSizeError(
            f"batch dimension mismatch for key {parts!r}: the tensor of shapes has {pieces} pieces, but the batch "
            f"size is {list(batch)}."
        )
    rest = list(batch[1:])
    if rest and (table.shape[1] < len(rest) or (table[:, : len(rest)] != torch.tensor(rest)).any()):
        raise BatchSizeError(
            f"The nested entry {parts!r} has a ragged dimension inside the batch {list(batch)}: every piece must "
            f"start with {rest}, got {table.tolist()}. Give the tensordict a batch size of [{pieces}]."
        )


def _publish(
    td: TensorDictBase, store: tuple[str, tuple[str, ...]], parts: tuple[str, ...], tensor: MemoryMappedTensor
) -> None:
    """Record an anonymous entry in the tree's runtime manifest, so other processes can map it."""
    seg = tensor._segment
    assert seg is not None
    path, level_key = store
    registry = SharedRegistry.for_directory(path)
    with registry.lock():
        ensure_store(path)
        before = registry.state()
        entries = read_manifest(path)
        key = [*level_key, *parts]
        if any(e.get("key") == key for e in entries):
            raise MemmapError(
                f"The key {parts!r} was already added by another process: call memmap_refresh_() to see it."
            )
        entries.append(
            {
                "key": key,
                "dtype": str(tensor.dtype),
                "shape": list(tensor.shape),
                "pid": os.getpid(),
                "fd": seg.fd,
                "ino": os.fstat(seg.fd).st_ino,
                "size": seg.size,
            }
        )
        write_manifest(path, entries)
        after = registry.bump()
    if unchanged_since(td._generation, before):
        td._generation = after


def _make_level_dirs(prefix: str, folders: list[str]) -> list[str]:
    """Create the missing folders of the entry's level; return those created (for cleanup)."""
    created = []
    path = prefix
    for name in folders:
        path = os.path.join(path, name)
        if not os.path.isdir(path):
            os.mkdir(path)
            created.append(path)
    return created


def _read_chain(prefix: str, folders: list[str], parts: tuple[str, ...]) -> list[dict | None]:
    """The on-disk meta.json of each level down to the target (None where it does not exist yet).

    A level exists only if its parent's meta.json lists it: a folder it does not list (left by a
    writer killed before it linked it) is a new level.  A level that another process made a leaf
    or a non-tensor value cannot hold the entry.
    """
    metas: list[dict | None] = [read_level(prefix)]
    path = prefix
    for name, part in zip(folders, parts[:-1], strict=True):
        path = os.path.join(path, name)
        parent = metas[-1]
        entry = parent.get(part) if parent is not None else None
        if entry is None:
            metas.append(None)
            continue
        child = read_level(path) if isinstance(entry, dict) and "type" in entry else None
        if child is None or layout_of(child) != LEVEL:
            raise MemmapError(
                f"Cannot add {parts!r}: another process added {part!r} as a leaf or a non-tensor value, not a "
                f"nested tensordict (see {os.path.join(os.path.dirname(path), META_FILE)!r}); call "
                "memmap_refresh_() to see it."
            )
        metas.append(child)
    return metas


def _commit_chain(
    prefix: str,
    folders: list[str],
    parts: tuple[str, ...],
    metas: list[dict | None],
    entry: dict,
    batch: torch.Size,
    td: TensorDictBase,
) -> None:
    """Write the new levels' and the target level's meta.json, deepest first."""
    paths = [prefix]
    for name in folders:
        paths.append(os.path.join(paths[-1], name))
    names = td._names
    for depth in range(len(paths) - 1, -1, -1):
        meta = metas[depth]
        if depth == len(paths) - 1:
            key, value = parts[-1], entry
        elif metas[depth + 1] is None:
            key, value = parts[depth], {"type": "TensorDict"}
        else:
            continue  # this level is unchanged
        batch_fields = level_meta({}, batch, names) if meta is None else None
        add_to_level(paths[depth], meta, key, value, batch_fields, replace_file)


def insert_entry(
    td: TensorDictBase, parts: tuple[str, ...], tensor: torch.Tensor, prefix: str | None, robust: bool
) -> None:
    """Put ``tensor`` at ``parts`` in ``td`` although it is locked, making the missing levels
    (memory-mapped, under ``prefix`` when the tree has a folder)."""
    node = td
    path = prefix
    for part in parts[:-1]:
        if path is not None:
            path = os.path.join(path, entry_file_name(part, robust, "", "the tensordict", directory=True))
        child = node._tensordict.get(part)
        if child is None:
            child = type(td)._from_leaves({}, node.batch_size, torch.device("cpu"), node._names)
            child._is_memmap = True
            child._is_locked = node._is_locked
            child._memmap_prefix = path
            node._tensordict[part] = child  # entries are added although the tensordict is locked
        node = child
    node._tensordict[parts[-1]] = tensor


# -- builders ---------------------------------------------------------------------------------
def build_empty(path: str | None, shape: torch.Size, dtype: torch.dtype) -> MemoryMappedTensor:
    """Zero-filled storage for ``make_memmap`` (a fresh file or segment: never stale bytes)."""
    if path is None:
        return MemoryMappedTensor._anonymous(shape, dtype)
    numel = math.prod(shape)
    if numel == 0:
        return MemoryMappedTensor._wrap(torch.empty(shape, dtype=dtype), None, None, None)
    reserve_file(path, numel * dtype.itemsize, existsok=True)
    flat = torch.from_file(path, shared=True, size=numel, dtype=dtype)
    return MemoryMappedTensor._wrap(flat.view(shape), path, None, None)


def build_from_tensor(tensor: torch.Tensor, copy_data: bool) -> Builder:
    src = tensor.detach().cpu() if copy_data else None  # without data to copy, any device will do

    def build(path: str | None, shape: torch.Size, dtype: torch.dtype) -> MemoryMappedTensor:
        if src is None:
            return build_empty(path, shape, dtype)
        if path is None:
            out = MemoryMappedTensor._anonymous(shape, dtype)
            torch.Tensor.copy_(out, src)
            return out
        if src.numel() == 0:
            return MemoryMappedTensor._wrap(torch.empty(shape, dtype=dtype), None, None, None)
        write_file(path, tensor_buffer(src, path), existsok=True)
        flat = torch.from_file(path, shared=True, size=src.numel(), dtype=dtype)
        return MemoryMappedTensor._wrap(flat.view(shape), path, None, None)

    return build


def check_storage(storage: Any, shape: torch.Size | Sequence[int], dtype: torch.dtype | None) -> torch.UntypedStorage:
    if isinstance(storage, torch.TypedStorage):
        storage = storage.untyped()
    if not isinstance(storage, torch.UntypedStorage):
        raise ArgumentTypeError(
            f"make_memmap_from_storage expects a torch.UntypedStorage, got {type(storage).__name__}."
        )
    if storage.device.type != "cpu":
        raise MemmapError(f"The storage must be in physical (cpu) memory, got device {storage.device}.")
    need = math.prod(_parse_shape(shape)) * (dtype or torch.get_default_dtype()).itemsize
    if storage.nbytes() < need:
        raise MemmapError(f"The storage holds {storage.nbytes()} bytes but shape {list(shape)} needs {need}.")
    return storage


def build_from_storage(storage: torch.UntypedStorage) -> Builder:
    """Wrap ``storage`` without copying."""
    stored = storage_filename(storage)

    def build(path: str | None, shape: torch.Size, dtype: torch.dtype) -> MemoryMappedTensor:
        t = torch.empty(0, dtype=dtype).set_(storage, 0, shape, contiguous_strides(shape))
        return MemoryMappedTensor._wrap(t, stored, None, None)

    return build


def storage_entry_checks(
    td: TensorDictBase, key: NestedKey, storage: torch.UntypedStorage, robust_key: bool | None
) -> bool:
    """Check the storage's file against the entry's; return whether the entry has a file."""
    stored = storage_filename(storage)
    prefix = td._memmap_prefix
    parts = unravel_key(key)
    robust = True if robust_key is None else bool(robust_key)
    if stored is None:
        if prefix is not None and storage.nbytes():
            warnings.warn(
                f"make_memmap_from_storage: the storage of {parts!r} has no file, so its data is not written to "
                f"{prefix!r}; load_memmap() and memmap_refresh_() drop this entry. Use make_memmap_from_tensor() to "
                "copy the data into the directory. Starting with TensorDict 0.17 this will raise a RuntimeError.",
                FutureWarning,
                stacklevel=user_stacklevel(),
            )
        return not storage.nbytes()  # an empty entry needs no file: readers keep it, as the reference does
    expected = None
    if prefix is not None:
        try:
            folders, _ = _target_level(td, parts, robust)
            name = entry_file_name(parts[-1], robust, LEAF_SUFFIX, "the tensordict", False) + LEAF_SUFFIX
        except InvalidArgumentError as err:  # the page: a storage file that cannot be the entry's is a RuntimeError
            raise MemmapError(
                f"The storage's file {stored!r} cannot be the file of the entry {parts!r}: {err}"
            ) from None
        expected = os.path.join(prefix, *folders, name)
    if stored != expected:
        raise MemmapError(
            "Providing a storage with an associated filename that differs from the filename argument is not "
            f"permitted: the entry's file is {expected!r}, storage.filename is {stored!r}."
        )
    return True


# -- non-tensor values written in place ---------------------------------------------------------
def write_non_tensor(td: TensorDictBase, key: str, leaf: NonTensorData, value: Any) -> None:
    """``td[key] = value`` for an existing non-tensor leaf of ``td``: persisted where ``td`` is saved.

    A shared leaf (``share_non_tensor=True``) writes its own files; a leaf of a memory-mapped
    folder rewrites its level (under the tree's lock, with a generation bump, so other processes
    see it after ``memmap_refresh_()``); any other leaf just takes the value.
    """
    if is_shared_value(leaf):
        leaf.write(value)  # under the tree's lock, seen by every process at its next read
        return
    leaf.data = value
    prefix = td._memmap_prefix
    if not td._is_memmap or prefix is None:
        return
    folder = os.path.join(prefix, encode_key(key))
    if not os.path.isdir(folder) and os.path.isdir(os.path.join(prefix, key)):
        folder = os.path.join(prefix, key)  # legacy (robust_key=False) layout
    if isinstance(leaf, NonTensorStack):  # one value per element: the stack's layout
        meta, pickled = encode_nontensor_stack(leaf.tolist(), f"key {key!r}")
        pickle_name = STACK_PICKLE_FILE
    else:
        (meta, pickled), pickle_name = encode_nontensor(value, f"key {key!r}"), PICKLE_FILE
    registry = SharedRegistry.for_directory(prefix)
    with registry.lock():
        if write_nontensor_folder(folder, meta, pickled, pickle_name):
            registry.bump()  # other processes see the new value after memmap_refresh_()
