"""The read path: ``load``/``load_memmap`` of a saved directory or ``.tdz`` archive, with strict validation.

One walker reads both, through the storage interface of :mod:`tdshare._store`.  Loading a
folder reads metadata only (``meta.json`` files and one ``stat`` per leaf) and maps each leaf
file; no payload page is read until a leaf is used.  Everything is checked before it is trusted:
a missing or short leaf file, malformed metadata, an unknown dtype, a shape that disagrees with
the batch size or a path that leaves the directory raises an error naming the file, where the
reference would fill zeros or drop the key.  Pickled values load only as ``allow_pickle`` says.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, TypeVar

import torch

from ._archive_store import ArchiveStore
from ._atomic import swap_in_progress
from ._bulk import bulk
from ._coordination import EpochGuard, SharedRegistry
from ._errors import (
    ArgumentTypeError,
    BatchSizeError,
    CorruptDataError,
    InvalidArgumentError,
    LockedError,
    MissingMetadataError,
    TdshareError,
    UnsupportedFormatError,
)
from ._format import (
    LAZY_STACK_TYPE,
    LEVEL,
    META_FILE,
    PICKLE_FILE,
    STACK,
    STACK_PICKLE_FILE,
    VALUE,
    VALUE_STACK,
    WRAPPED,
    WRAPPED_DIR,
    LeafInfo,
    layout_of,
)
from ._keys import encode_key, unravel_key
from ._lazy_leaves import as_entries, is_pending, raw_get, raw_items, rebuilt, resolved, track
from ._nodes import kind_for_tag, kind_of
from ._nontensor import NonTensorData, NonTensorStack, nested_shape
from ._options import check_path
from ._stack_load import load_members, member_template, templates_apply
from ._store import Deferred, DirectoryStore, Store, check_load_args, member_without_meta, read_meta, user_stacklevel
from ._tdz import Archive
from ._tensordict_base import TensorDictBase, is_collection

__all__ = ["load_tree", "load_into", "load_level", "open_checked_leaf", "check_load_args", "read_meta"]

T = TypeVar("T", bound=TensorDictBase)


def _batch_mismatch(info: LeafInfo, batch: tuple[int, ...]) -> bool:
    """Whether a leaf's shape cannot start with the batch size (a nested leaf's shape is its size
    table's, ``[pieces, ndim]``: only the pieces count, the rest is checked when it is built)."""
    if info.is_nested:
        return bool(batch) and info.shape[0] != batch[0]
    return info.shape[: len(batch)] != batch


def open_checked_leaf(
    store: Store, level: str, info: LeafInfo, batch: tuple[int, ...] | None, meta_where: str, old: Any = None
) -> Any:
    """Open one leaf of ``level`` through ``store``; its shape must start with ``batch``.

    ``old`` (on a refresh) is kept when it still maps the same file.  Raises ``CorruptDataError``
    naming the metadata file when the shape does not start with the batch size."""
    if batch is not None and _batch_mismatch(info, batch):
        raise CorruptDataError(
            f"{meta_where}: the leaf {info.key!r} has shape {list(info.shape)}, which does not start with the "
            f"batch size {list(batch)}."
        )
    return store.open_leaf(level, info, meta_where, old)


def load_level(cls: type[T], store: Store, level: str, meta: dict, out: Any, parent_batch: Any, device: Any) -> Any:
    """Build one level (and everything under it) from its ``meta.json``, as its layout says.

    ``cls`` is the collection class to build, ``out`` the collection whose levels may be reused,
    ``parent_batch`` the batch size the level's must start with, ``device`` the target device."""
    return _LOADERS[layout_of(meta)](cls, store, level, meta, out, parent_batch, device)


def _load_value(cls: type[T], store: Store, level: str, meta: dict, out: Any, parent_batch: Any, device: Any) -> Any:
    """A non-tensor value: inline JSON ``data``, or ``other.pickle``."""
    if "data" in meta:
        return NonTensorData(meta["data"])
    stored = store.unpickle(level, PICKLE_FILE)
    if not isinstance(stored, dict) or "data" not in stored:
        raise CorruptDataError(f"{store.where(level, PICKLE_FILE)} holds no 'data' field.")
    return NonTensorData(stored["data"])


def _load_value_stack(
    cls: type[T], store: Store, level: str, meta: dict, out: Any, parent_batch: Any, device: Any
) -> Any:
    """A NonTensorStack: its values inline, in a pickle, or (older writers) as member folders.

    Its batch size is the parent's (a stack holds one value per element of its tensordict), or,
    saved on its own, the nesting of its lists."""
    data = meta.get("data")
    where = store.where(level, META_FILE)
    if data == STACK_PICKLE_FILE:
        data = store.unpickle(level, STACK_PICKLE_FILE)
    elif isinstance(data, str):
        raise CorruptDataError(f"{where}: invalid pickled NonTensorStack file name {data!r}.")
    elif data is None:  # older writers: no "data", one NonTensorData folder per member
        return _load_nontensor_members(cls, store, level, meta, device)
    if not isinstance(data, list):
        raise CorruptDataError(f"{where}: a NonTensorStack's data must be a list, found {type(data).__name__}.")
    batch = tuple(parent_batch) if parent_batch is not None else tuple(nested_shape(data))
    try:
        return NonTensorStack.from_list(data, batch)
    except BatchSizeError as err:
        raise CorruptDataError(
            f"{where}: the stacked values do not match the batch size {list(batch)}: {err}"
        ) from None


def _load_stack(cls: type[T], store: Store, level: str, meta: dict, out: Any, parent_batch: Any, device: Any) -> Any:
    """A lazy stack: its members ``0/``, ``1/``... along ``stack_dim``, as a LazyStackedTensorDict.

    The members must agree on their batch size (and, nested, start with the parent's)."""
    where = store.where(level, META_FILE)
    members = _load_members(cls, store, level, device)
    dim = meta.get("stack_dim", 0)
    ndim = members[0].batch_dims + 1
    if type(dim) is not int or not -ndim <= dim < ndim:
        raise CorruptDataError(f"{where}: stack_dim must be an integer below {ndim}, found {dim!r}.")
    first = members[0].batch_size
    sizes = [member.batch_size for member in members]
    if sizes.count(first) != len(sizes):  # (one pass in C: a stack of a thousand members)
        i = next(i for i, size in enumerate(sizes) if size != first)
        raise CorruptDataError(
            f"{where}: member {i} has batch size {list(sizes[i])}, member 0 has {list(first)}; the members of a "
            "stack must agree."
        )
    kind = kind_for_tag(LAZY_STACK_TYPE)
    if kind is None or kind.wrap is None:  # no lazy class registered: a dense stack
        return cls.stack(members, dim)
    name = meta.get("stack_dim_name")
    result = kind.wrap(members, {"stack_dim": dim, "stack_dim_name": name if isinstance(name, str) else None})
    batch = tuple(result.batch_size)
    if parent_batch is not None and batch[: len(parent_batch)] != tuple(parent_batch):
        raise CorruptDataError(
            f"{where}: batch size {list(batch)} does not start with the parent's {list(parent_batch)}."
        )
    store.annotate(result, level, meta)
    result._is_memmap = False
    return result


def _load_wrapped(cls: type[T], store: Store, level: str, meta: dict, out: Any, parent_batch: Any, device: Any) -> Any:
    """A class around a collection (a tensorclass): the collection in ``_tensordict/``.

    A registered kind (:func:`tdshare._nodes.kind_for_tag`) rebuilds its own class; any other is
    loaded as its collection, with a warning that says so.
    """
    nested = store.sub(level, WRAPPED_DIR)
    tag = meta.get("_type")
    if not store.has_level(nested):
        raise UnsupportedFormatError(f"{store.where(level, META_FILE)} describes a {tag!r}, which tdshare cannot load.")
    with store.enter(nested):
        inner = load_level(cls, store, nested, store.read_meta(nested), out, parent_batch, device)
    kind = kind_for_tag(tag)
    if kind is not None and kind.wrap is not None:
        return kind.wrap(inner, {k: v for k, v in meta.items() if k != "_type"})
    warnings.warn(
        f"{store.where(level)!r} holds a tensorclass ({tag}); tdshare loads it as a TensorDict.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return inner


def _load_collection(
    cls: type[T], store: Store, level: str, meta: dict, out: Any, parent_batch: Any, device: Any
) -> Any:
    """A collection level: its leaves mapped, its child levels loaded, ``out``'s levels reused."""
    meta_path = store.where(level, META_FILE)
    parsed = store.parse(meta, meta_path)
    batch = parsed.batch_size if parsed.batch_size is not None else ()
    if parent_batch is not None and tuple(batch[: len(parent_batch)]) != tuple(parent_batch):
        raise CorruptDataError(
            f"{meta_path}: batch size {list(batch)} does not start with the parent's {list(parent_batch)}."
        )
    target = out if is_collection(out) else None
    current = target._tensordict if target is not None else {}
    nbatch = len(batch)
    if nbatch:
        for info in parsed.leaves:
            if _batch_mismatch(info, batch):
                open_checked_leaf(store, level, info, batch, meta_path)  # raises, naming the leaf
    leaves: dict[str, Any] = store.open_leaves(level, parsed.leaves, meta_path, current)
    for key, _ in parsed.children:
        sub = store.child(level, key)
        if sub is None:
            raise CorruptDataError(
                f"{meta_path} lists the nested entry {key!r}, but its folder "
                f"{store.where(level, encode_key(key))!r} is missing."
            )
        reuse = target._tensordict.get(key) if target is not None else None
        with store.enter(sub):
            leaves[key] = load_level(cls, store, sub, store.read_meta(sub), reuse, batch, device)
    device_obj = torch.device(device) if device is not None else None
    if device_obj is not None and device_obj.type != "cpu":
        leaves = {k: v.to(device_obj) if isinstance(v, torch.Tensor) else v for k, v in leaves.items()}
        leaves = {k: resolved(v).to(device_obj) if is_pending(v) else v for k, v in leaves.items()}
    # a new tensordict even with ``out``: load_tree moves the result into ``out`` only once all loaded
    result = cls._from_leaves({}, torch.Size(batch), None, None if parsed.names is None else list(parsed.names))
    if parsed.children or not store.leaves_in_order:  # the metadata's order: leaves and levels interleaved
        result._tensordict = rebuilt([(k, leaves[k]) for k in meta if k in leaves])
    else:  # leaves only: open_leaves kept the metadata's order (one C-level copy, no pass per leaf)
        result._tensordict = as_entries(leaves)
    track(result._tensordict, level)  # a re-save here maps its pending leaves first
    if store.defers:
        for k, v in result._tensordict.items():
            if isinstance(v, Deferred):  # filled in by store.finish once the whole tree is known
                store.pending.append((result._tensordict, k, v))
    result._device = device_obj if device_obj is not None else store.default_device(meta)
    result._is_memmap = False
    store.annotate(result, level, meta)
    return result


def _load_nontensor_members(cls: type[T], store: Store, level: str, meta: dict, device: Any) -> NonTensorData:
    """A NonTensorStack saved as member folders ``0/``, ``1/``...: a NonTensorStack of their values."""
    if meta.get("stack_dim", 0) != 0:
        raise UnsupportedFormatError(
            f"{store.where(level, META_FILE)}: a NonTensorStack stored as member folders with stack_dim "
            f"{meta.get('stack_dim')!r}; tdshare reads only stack_dim 0 in this layout."
        )
    values = []
    for member in _load_members(cls, store, level, device):
        if not isinstance(member, NonTensorData):
            raise CorruptDataError(f"{store.where(level)!r}: a NonTensorStack member is not non-tensor data.")
        values.append(member)
    return NonTensorStack(*values)


def _load_members(cls: type[T], store: Store, level: str, device: Any) -> list:
    """The members ``0/``, ``1/``... of a stack level (a gap in the numbering raises).

    A folder's members go through one fused loop (:func:`tdshare._stack_load.load_members`),
    which hands every member it cannot build from a template to :func:`_member`, in order."""

    def general(index: int, sub: str, meta: dict | None = None, plain: bool = False) -> Any:
        return _member(cls, store, level, index, sub, meta, plain, device)

    members = None
    if isinstance(store, DirectoryStore) and templates_apply(store, device):
        members = load_members(
            cls, store, level, lambda meta, where: member_template(store, meta, where, device), general
        )
    if members is None:
        members = [general(index, sub) for index, sub in enumerate(store.members(level))]
    if not members:
        raise CorruptDataError(f"{store.where(level)!r}: a stacked tensordict with no members.")
    return members


def _member(
    cls: type[T], store: Store, level: str, index: int, sub: str, meta: dict | None, plain: bool, device: Any
) -> Any:
    """Member ``index`` of the stack ``level``, in ``sub``, the general way: from ``meta`` when the
    caller read it, else from its ``meta.json`` (missing: an error naming the member); ``plain``:
    ``sub`` is known to be a real folder (no descent guard)."""
    with nullcontext() if plain else store.enter(sub):
        if meta is None:
            try:
                meta = store.read_meta(sub)
            except MissingMetadataError:
                raise member_without_meta(store, level, index) from None
        return load_level(cls, store, sub, meta, None, None, device)


Loader = Callable[[Any, Store, str, dict, Any, Any, Any], Any]
_LOADERS: dict[str, Loader] = {
    LEVEL: _load_collection,
    VALUE: _load_value,
    VALUE_STACK: _load_value_stack,
    STACK: _load_stack,
    WRAPPED: _load_wrapped,
}


def _resolve_subpath(store: Store, level: str, subpath: Any) -> str:
    """The level that ``subpath`` (``"a/b"`` or a nested key) names, looked up key by key."""
    if isinstance(subpath, str):
        parts: tuple[str, ...] = tuple(p for p in subpath.split("/") if p)
    else:
        try:
            parts = unravel_key(subpath)
        except TypeError:
            raise InvalidArgumentError(
                f"subpath must be a string path ('a/b') or a non-empty (nested) tuple of strings, got {subpath!r}."
            ) from None
    for part in parts:
        found = store.child(level, part)
        inner = store.sub(level, WRAPPED_DIR)
        if found is None and store.has_level(inner):
            found = store.child(inner, part)
        if found is None or not store.has_level(found):
            raise InvalidArgumentError(
                f"No tensordict found under subpath {subpath!r} (missing {META_FILE} in "
                f"{store.where(level, encode_key(part))!r})."
            )
        level = found
    return level


_SWAP_RETRIES = 20


def _stamp(path: str) -> tuple[int, int] | None:
    """The identity of the folder at ``path`` (None if missing): an atomic re-save changes it.

    Not its ctime: entries added in place (``make_memmap*``) change that, and are no swap.  Two
    swaps during one load could give the folder back its old inode number; the leaves' own
    guard (``EpochGuard``) still catches a leaf read across them.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _swapped(path: str, before: tuple[int, int] | None, store: DirectoryStore) -> bool:
    """Whether the folder at ``path`` was swapped since ``before`` (its :func:`_stamp`), asked of a
    load that failed: another identity, or, where the tree has a shared counter, another file
    epoch.  The epoch catches what the identity alone misses: a re-save whose new folder got the
    inode number the old one freed, which file systems hand out again at once.  (A load that
    succeeded across such a swap is caught by its pending leaves' guard on their first read.)"""
    if _stamp(path) != before:
        return True
    guard = store.guard
    return guard is not None and guard.stale()


def _load_folder(
    cls: type[T],
    path: str,
    robust: bool,
    mode: str | None,
    allow_pickle: bool | None,
    subpath: Any,
    out: Any,
    device: Any,
) -> tuple[str, Any]:
    """Load the folder ``path``; again if it was swapped for another (an atomic re-save) meanwhile.

    The metadata and the leaf files are found by path, so a load that overlapped a swap could
    pair one version's ``meta.json`` with the other's leaves: the folder's identity is compared
    before and after, and a load that saw it change (or failed while it changed) starts over.
    """
    waited = waited_epoch = False
    for _ in range(_SWAP_RETRIES):
        before = _stamp(path)
        store = DirectoryStore(path, robust, mode, allow_pickle)
        try:
            level = path if subpath is None else _resolve_subpath(store, path, subpath)
            # the registry state *before* the metadata: a later refresh re-reads anything newer
            registry = SharedRegistry.for_directory(level) if mode != "r" else None
            state = registry.state() if registry is not None else None
            if registry is not None and state is not None and state[1] & 1 and not waited_epoch:
                # an odd epoch: a writer is replacing files (see SharedRegistry.mark_replacing), and
                # this load could pair its old metadata with new files it finds after the swap but
                # before the writer's bump: wait for its lock, then load again (once: still odd
                # then, a writer was killed before its bump, and nobody is swapping now)
                waited_epoch = True
                with registry.lock():
                    pass
                continue
            if registry is not None:
                store.guard = EpochGuard(registry, state)  # a leaf first read after a swap raises
            result = load_level(cls, store, level, store.read_meta(level), out, None, device)
        except (TdshareError, OSError):  # OSError: a level's folder vanished in the swap
            if _swapped(path, before, store):
                continue  # it failed because the folder was swapped: load the new one
            if before is None and not waited and swap_in_progress(path):
                # between an atomic writer's two renames: it holds the tree's lock until the new
                # tree is in place, so wait on the lock (in the kernel), then load once more
                waited = True
                with SharedRegistry.for_directory(path).lock():
                    pass
                continue
            raise
        if _stamp(path) != before:  # (a swap that kept the inode number: the leaves' guard raises)
            continue
        if is_collection(result):
            result._generation = state
        else:  # a class around a collection (a tensorclass): on its collection
            kind = kind_of(result)
            if kind is not None and kind.layout == WRAPPED and kind.unwrap is not None:
                kind.unwrap(result)[0]._generation = state
        return level, result
    raise CorruptDataError(
        f"The folder {path!r} was replaced {_SWAP_RETRIES} times while it was being loaded (atomic re-saves "
        "by another process); load it again once the writer pauses."
    )


@bulk
def load_tree(
    cls: type[T],
    prefix: str | os.PathLike,
    device: Any = None,
    *,
    out: Any = None,
    robust_key: bool | None = True,
    subpath: Any = None,
    mode: str | None = None,
    allow_pickle: bool | None = None,
    num_threads: int = 0,
) -> Any:
    """Load the tensordict saved in the folder or ``.tdz`` archive ``prefix`` (see ``TensorDict.load_memmap``).

    A file is read through an :class:`ArchiveStore`, a folder through a :class:`DirectoryStore`;
    the same walker (:func:`_load_level`) reads both."""
    check_load_args(mode, allow_pickle)
    check_path(prefix)
    cls = cls._level_class()  # type: ignore[assignment]  # a lazy stack's levels are TensorDicts
    path = os.path.abspath(os.fspath(prefix))
    robust = True if robust_key is None else bool(robust_key)
    folder = not os.path.isfile(path)
    level = path
    if out is not None:
        _check_out(out, device)
        if device is None:
            device = out.device
    store: Store
    if not folder:
        store = ArchiveStore(Archive(path, mode), robust, allow_pickle, num_threads)
        level = store.root if subpath is None else _resolve_subpath(store, store.root, subpath)
        dev = torch.device(device) if device is not None else None
        result = load_level(cls, store, level, store.read_meta(level), out, None, device)
        store.finish(None if dev is None or dev.type == "cpu" else dev)
    else:
        level, result = _load_folder(cls, path, robust, mode, allow_pickle, subpath, out, device)
    if out is None:
        return result
    if not is_collection(result):
        shown = level if folder else path
        raise InvalidArgumentError(f"{shown!r} holds a {type(result).__name__}, which cannot be loaded into out.")
    _transplant(result, out)
    return out


def _check_out(out: Any, device: Any) -> None:
    if not is_collection(out):
        raise ArgumentTypeError(f"out must be a TensorDict, got {type(out).__name__}.")
    if device is not None and out.device is not None and torch.device(device) != out.device:
        raise InvalidArgumentError(
            f"Cannot load a tensordict on device {torch.device(device)} into a tensordict on device {out.device}."
        )
    for key, level in _levels(out):
        if level._is_locked:
            where = "" if key == "" else f" (at {key!r})"
            raise LockedError(
                f"Cannot load into a locked TensorDict{where}: unlock it first (td.unlock_()), or load a new one "
                "and write it in place with td.update_(TensorDict.load_memmap(prefix))."
            )


def _levels(td: TensorDictBase, key: Any = "") -> list[tuple[Any, TensorDictBase]]:
    """``td`` and its nested collection levels, with their keys (no lazy stack's entries are read)."""
    out: list[tuple[Any, TensorDictBase]] = [(key, td)]
    for name, value in td._tensordict.items():
        if is_collection(value):
            out.extend(_levels(value, name if key == "" else (*((key,) if isinstance(key, str) else key), name)))
    return out


def _transplant(loaded: TensorDictBase, out: TensorDictBase) -> None:
    """Move a loaded tree into ``out``, reusing ``out``'s nested tensordicts (same objects)."""
    values: dict[str, Any] = {}
    for key, value in raw_items(loaded._tensordict):
        old = raw_get(out._tensordict, key)
        if is_collection(value) and is_collection(old) and old is not out:
            _transplant(value, old)
            value = old
        values[key] = value
    out._tensordict = rebuilt(values.items())
    out._batch_size = loaded._batch_size
    out._names = loaded._names
    out._device = loaded._device
    out._is_memmap = False
    out._is_shared = False
    out._memmap_prefix = loaded._memmap_prefix
    out._meta_seen = loaded._meta_seen
    out._generation = loaded._generation


def load_into(
    td: TensorDictBase,
    prefix: str | os.PathLike,
    robust_key: bool | None = True,
    *,
    allow_pickle: bool | None = None,
    mode: str | None = None,
) -> Any:
    """``td.load_memmap_``: load into ``td`` (nested tensordicts reused); ``td`` is unchanged on error.

    A memory-mapped ``td`` is memory-mapped again into the loaded folder and locked, without
    writing anything (its leaves already map that folder's files); with ``mode="r"`` it stays
    unlocked and is no longer memory-mapped.
    """
    was_memmap = td._is_memmap
    if was_memmap:
        td._propagate(_set_unlocked)  # the tree is replaced anyway; restored below on error
    try:
        load_tree(type(td), prefix, td.device, out=td, robust_key=robust_key, mode=mode, allow_pickle=allow_pickle)
    except BaseException:
        if was_memmap:
            td._propagate(_set_memmap)
        raise
    if was_memmap and td._memmap_prefix is not None:
        td._propagate(_set_memmap)
    return td


def _set_unlocked(td: TensorDictBase) -> None:
    td._is_locked = False


def _set_memmap(td: TensorDictBase) -> None:
    td._is_memmap = True
    td._is_locked = True
    td._is_shared = False
