"""A TensorDict saved as one ``.tdz`` archive file (the container is :mod:`tdshare._tdz`).

``memmap``/``save``/``dumps`` write an archive when the prefix ends with ``.tdz`` or
``archive=True``: the entries are the files a folder save would write (:mod:`tdshare._format`),
always written atomically.  Loading maps the archive once: each STORED leaf is a
:class:`MemoryMappedTensor` view of that one mapping whose ``_filename`` is the archive and
``_offset`` the payload's byte offset, so pickling it sends a handle, never the bytes.  ``mode``
None/``"r"`` maps copy-on-write, ``"r+"`` writes through (then :func:`refresh_archive_checksums`
updates the zip CRCs).  Compressed or misaligned leaves are decompressed or copied into ordinary
memory (compressed ones CRC-checked, on ``num_threads`` threads).  The result is unlocked and
``is_memmap()`` is False, as in the reference.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import warnings
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ._errors import (
    CorruptDataError,
    InvalidArgumentError,
    MemmapError,
    MissingMetadataError,
    NotSupportedError,
    PickleRefusedError,
    UnsupportedFormatError,
)
from ._format import (
    LAZY_STACK_TYPE,
    LEAF_SUFFIX,
    META_FILE,
    NO_FILE_FIELD,
    NONTENSOR_STACK_TYPE,
    NONTENSOR_TYPE,
    PICKLE_FILE,
    LeafInfo,
    dumps_json,
    level_meta,
    loads_json,
    parse_level,
)
from ._keys import encode_key, is_safe_legacy_name, unravel_key
from ._memmap import MemoryMappedTensor
from ._nontensor import NonTensorData
from ._read import _user_stacklevel
from ._tdz import (
    METHOD_NAMES,
    Archive,
    Entry,
    check_target,
    extract,
    folder_entries,
    parse_compression,
    pool,
    refresh_crcs,
    results,
    write_archive,
)
from ._tensordict import TensorDictBase
from ._write import _Level, _plan

__all__ = [
    "archive_target",
    "load_archive",
    "pack_memmap",
    "refresh_archive_checksums",
    "save_archive",
    "unpack_memmap",
]

T = TypeVar("T", bound=TensorDictBase)
PathLike = str | os.PathLike


# -- writing ----------------------------------------------------------------------------------
def archive_target(prefix: object, archive: bool | None, compression: object) -> bool:
    """Whether ``memmap``/``save`` write an archive (``archive=True``, or None and a ``.tdz`` prefix)."""
    if archive is None:
        archive = isinstance(prefix, (str, os.PathLike)) and pathlib.PurePath(os.fspath(prefix)).suffix == ".tdz"
    if archive and prefix is None:
        raise InvalidArgumentError("archive=True needs a prefix: the path of the archive file to write.")
    if not archive and compression is not None:
        raise InvalidArgumentError(
            f"compression={compression!r} applies to archives only: pass a prefix ending with '.tdz' or archive=True."
        )
    return bool(archive)


def _tree_entries(level: _Level) -> Any:
    """The files of a planned tree (``_write._plan`` with the root ``""``) in archive order."""
    rel = "" if not level.path else level.path.replace(os.sep, "/") + "/"
    yield rel + META_FILE, dumps_json(level_meta(level.entries, level.src.batch_size, level.names))
    for leaf in sorted(level.leaves, key=lambda leaf: leaf.path or ""):
        if leaf.src.numel():  # a zero-element leaf has no file
            yield (leaf.path or "").replace(os.sep, "/"), leaf.src
    folders: list[tuple[str, Any]] = [(nt.path or "", nt) for nt in level.nontensors]
    folders += [(child.path or "", child) for _, child in level.children]
    for path, item in sorted(folders, key=lambda x: x[0]):
        if isinstance(item, _Level):
            yield from _tree_entries(item)
        else:
            yield f"{path}/{META_FILE}".replace(os.sep, "/"), item.meta
            if item.pickled is not None:
                yield f"{path}/{PICKLE_FILE}".replace(os.sep, "/"), item.pickled


def save_archive(
    td: T,
    prefix: PathLike,
    *,
    compression: str | int | None = None,
    num_threads: int = 0,
    return_early: bool = False,
    share_non_tensor: bool = False,
    existsok: bool = True,
    robust_key: bool | None = True,
) -> T:
    """``td.memmap(prefix)`` to an archive: write it atomically, return it loaded (unlocked)."""
    if return_early:
        raise NotSupportedError("return_early=True is not supported for a .tdz archive, which is written in one go.")
    if share_non_tensor:
        raise NotSupportedError("share_non_tensor=True is not supported for a .tdz archive, a read-only snapshot.")
    method = parse_compression(compression)
    path = check_target(prefix, existsok)
    robust = True if robust_key is None else bool(robust_key)
    write_archive(path, _tree_entries(_plan(td, "", robust, True, True)), method)
    return load_archive(type(td), path, robust_key=robust_key, allow_pickle=True, num_threads=num_threads)


def pack_memmap(
    folder: PathLike,
    archive: PathLike,
    *,
    compression: str | int | None = None,
    compresslevel: int | None = None,
    existsok: bool = True,
) -> str:
    """Pack a saved folder into a ``.tdz`` archive (every file, in archive order); return the archive path."""
    root = os.path.realpath(os.fspath(folder))
    if not os.path.isfile(os.path.join(root, META_FILE)):
        raise MissingMetadataError(f"No saved tensordict in {root!r}: {META_FILE} is missing.")
    method = parse_compression(compression)
    path = check_target(archive, existsok)
    write_archive(path, folder_entries(root), method, compresslevel)
    return path


def unpack_memmap(archive: PathLike, folder: PathLike) -> str:
    """Extract an archive into ``folder`` (created if needed), checking every CRC; return the folder."""
    root = os.path.abspath(os.fspath(folder))
    extract(os.path.abspath(os.fspath(archive)), root)
    return root


def refresh_archive_checksums(path: PathLike, *, num_threads: int = 0) -> int:
    """Rewrite the zip CRC-32s of the stored entries changed through ``mode="r+"``; return how many changed.

    Afterwards ``zipfile.ZipFile(path).testzip()`` and ``unzip -t`` accept the archive again.
    """
    return refresh_crcs(os.path.abspath(os.fspath(path)), max(2, num_threads))


# -- reading ----------------------------------------------------------------------------------
@dataclass
class _Pending:  # a compressed leaf, decompressed once the whole tree is known
    entry: Entry
    info: LeafInfo


@dataclass
class _Ctx:
    ar: Archive
    robust: bool
    allow_pickle: bool | None
    device: torch.device | None  # None: cpu
    pending: list[tuple[dict[str, Any], str, _Pending]] = field(default_factory=list)

    def where(self, name: str) -> str:
        return f"{self.ar.path}:{name}"

    def locate(self, d: str, key: str, suffix: str = "", folder: bool = False) -> str | None:
        """The entry of ``key`` in the folder ``d`` (robust name, then the legacy raw one); a folder ends with /."""
        names = [encode_key(key)] if self.robust else []
        if (not names or names[0] != key) and is_safe_legacy_name(key, directory=folder):
            names.append(key)
        for name in names:
            probe = f"{d}{name}/{META_FILE}" if folder else f"{d}{name}{suffix}"
            if probe in self.ar.entries:
                return f"{d}{name}/" if folder else probe
        return None

    def unpickle(self, name: str) -> Any:
        where = self.where(name)
        if self.allow_pickle is False:
            raise PickleRefusedError(
                f"Refusing to load the pickled non-tensor data {where!r}: pickle can execute arbitrary code. Pass "
                "allow_pickle=True only if the saved data is trusted."
            )
        if self.allow_pickle is None:
            warnings.warn(
                f"Loading the pickled non-tensor data {where!r}. This is only safe for trusted data; pass "
                "allow_pickle=True to silence this warning, or allow_pickle=False to refuse pickles.",
                FutureWarning,
                stacklevel=_user_stacklevel(),
            )
        if name not in self.ar.entries:
            raise CorruptDataError(f"The pickled non-tensor value {where!r} is missing.")
        return pickle.loads(self.ar.read(name))


def _leaf(ctx: _Ctx, d: str, info: LeafInfo, where: str) -> Any:
    ar = ctx.ar
    if info.is_nested:
        return _nested_leaf(ctx, d, info, where)
    if info.numel == 0:
        return MemoryMappedTensor._wrap(torch.empty(info.shape, dtype=info.dtype), None, None, None)
    name = ctx.locate(d, info.key, LEAF_SUFFIX)
    if name is None:
        missing = ctx.where(d + encode_key(info.key) + LEAF_SUFFIX)
        raise CorruptDataError(f"{where} lists the leaf {info.key!r} ({info.nbytes} bytes), but {missing} is missing.")
    e = ar.entries[name]
    if e.size != info.nbytes:
        raise CorruptDataError(
            f"{ctx.where(name)} holds {e.size} bytes but {where} expects {info.nbytes} "
            f"(shape {list(info.shape)}, {info.dtype})."
        )
    view = ar.view(e, info.dtype, info.shape)
    if view is not None:
        out = MemoryMappedTensor._wrap(view, ar.path, None, "r+" if ar.mode == "r+" else "r")
        out._offset, out._ino = e.data, ar.ino
        return out
    if ar.mode == "r+":
        why = f"compressed ({METHOD_NAMES.get(e.method, e.method)})" if e.method else "not aligned for its dtype"
        raise MemmapError(
            f"Cannot open {ar.path!r} with mode='r+': entry {name!r} is {why}, so writes could not reach the file. "
            "Load it with mode='r', or save the archive uncompressed."
        )
    return _Pending(e, info) if e.method else ar.copy(e).view(info.dtype).view(info.shape)


def _nested_leaf(ctx: _Ctx, d: str, info: LeafInfo, where: str) -> torch.Tensor:
    """A nested tensor (reference layout: values in ``k.memmap``, sizes in ``k.shape.memmap``), copied."""
    sizes_name = ctx.locate(d, info.key, ".shape" + LEAF_SUFFIX)
    values_name = ctx.locate(d, info.key, LEAF_SUFFIX)
    if ctx.ar.mode == "r+" or len(info.shape) != 2 or sizes_name is None or values_name is None:
        raise CorruptDataError(
            f"{where}: the nested leaf {info.key!r} is malformed or cannot be opened with mode='r+'."
        )
    raw_sizes = ctx.ar.copy(ctx.ar.entries[sizes_name])
    if raw_sizes.numel() != info.numel * 8:
        raise CorruptDataError(f"{ctx.where(sizes_name)} holds {raw_sizes.numel()} bytes, expected {info.numel * 8}.")
    sizes = raw_sizes.view(torch.int64).view(info.shape).tolist()
    values = ctx.ar.copy(ctx.ar.entries[values_name]).view(info.dtype)
    counts = [int(torch.Size(row).numel()) for row in sizes]
    if sum(counts) != values.numel():
        raise CorruptDataError(f"{ctx.where(values_name)} does not hold the {sum(counts)} elements its sizes need.")
    return torch.nested.nested_tensor([v.reshape(row) for v, row in zip(values.split(counts), sizes, strict=True)])


def _level(cls: type[T], ctx: _Ctx, d: str, parent_batch: tuple[int, ...] | None) -> Any:
    where = ctx.where(d + META_FILE)
    meta = loads_json(ctx.ar.read(d + META_FILE), where)
    kind = meta.get("_type")
    if meta.get("_is_non_tensor") or kind == NONTENSOR_TYPE:
        if "data" in meta:
            return NonTensorData(meta["data"])
        stored = ctx.unpickle(d + PICKLE_FILE)
        if not isinstance(stored, dict) or "data" not in stored:
            raise CorruptDataError(f"{ctx.where(d + PICKLE_FILE)} holds no 'data' field.")
        return NonTensorData(stored["data"])
    if kind == NONTENSOR_STACK_TYPE:
        data = meta.get("data")
        return NonTensorData(ctx.unpickle(d + "pickle.pkl") if data == "pickle.pkl" else data)
    if kind == LAZY_STACK_TYPE:
        members: list[Any] = []
        while f"{d}{len(members)}/{META_FILE}" in ctx.ar.entries:
            members.append(_level(cls, ctx, f"{d}{len(members)}/", None))
        if not members:
            raise CorruptDataError(f"{where}: a stacked tensordict with no members.")
        return cls.stack(members, int(meta.get("stack_dim", 0)))
    if "shape" not in meta:
        if f"{d}_tensordict/{META_FILE}" in ctx.ar.entries:
            msg = f"{where} holds a tensorclass ({kind}); tdshare loads it as a TensorDict."
            warnings.warn(msg, UserWarning, stacklevel=_user_stacklevel())
            return _level(cls, ctx, d + "_tensordict/", parent_batch)
        raise UnsupportedFormatError(f"{where} describes a {kind!r}, which tdshare cannot load.")
    level = parse_level(meta, where)
    batch = level.batch_size if level.batch_size is not None else ()
    if parent_batch is not None and tuple(batch[: len(parent_batch)]) != tuple(parent_batch):
        raise CorruptDataError(
            f"{where}: batch size {list(batch)} does not start with the parent's {list(parent_batch)}."
        )
    values: dict[str, Any] = {}
    for info in level.leaves:
        if meta[info.key].get(NO_FILE_FIELD):
            continue
        if info.shape[: len(batch)] != batch:
            raise CorruptDataError(
                f"{where}: the leaf {info.key!r} has shape {list(info.shape)}, which does not start with the batch "
                f"size {list(batch)}."
            )
        values[info.key] = _leaf(ctx, d, info, where)
    for key, _ in level.children:
        sub = ctx.locate(d, key, folder=True)
        if sub is None:
            missing = ctx.where(f"{d}{encode_key(key)}/{META_FILE}")
            raise CorruptDataError(f"{where} lists the nested entry {key!r}, but {missing} is missing.")
        values[key] = _level(cls, ctx, sub, batch)
    result = cls._from_leaves({}, torch.Size(batch), None, level.names)
    result._tensordict = {k: values[k] for k in meta if k in values}
    result._device = ctx.device or torch.device("cpu")
    for k, v in result._tensordict.items():
        if isinstance(v, _Pending):
            ctx.pending.append((result._tensordict, k, v))
        elif ctx.device is not None and isinstance(v, torch.Tensor):
            result._tensordict[k] = v.to(ctx.device)
    return result


def _subpath(ctx: _Ctx, subpath: Any) -> str:
    if isinstance(subpath, str):
        parts: tuple[str, ...] = tuple(p for p in subpath.split("/") if p)
    else:
        try:
            parts = unravel_key(subpath)
        except TypeError:
            raise InvalidArgumentError(
                f"subpath must be a string path ('a/b') or a non-empty (nested) tuple of strings, got {subpath!r}."
            ) from None
    d = ""
    for part in parts:
        found = ctx.locate(d, part, folder=True)
        if found is None and f"{d}_tensordict/{META_FILE}" in ctx.ar.entries:
            found = ctx.locate(d + "_tensordict/", part, folder=True)
        if found is None:
            missing = ctx.where(d + encode_key(part))
            raise InvalidArgumentError(
                f"No tensordict found under subpath {subpath!r} (missing {META_FILE} in {missing!r})."
            )
        d = found
    return d


def load_archive(
    cls: type[T],
    path: str,
    device: Any = None,
    *,
    robust_key: bool | None = True,
    subpath: Any = None,
    mode: str | None = None,
    allow_pickle: bool | None = None,
    num_threads: int = 0,
) -> Any:
    """Load a ``.tdz`` archive: stored leaves view one mapping, compressed ones are decompressed."""
    ar = Archive(path, mode)
    dev = torch.device(device) if device is not None else None
    robust = True if robust_key is None else bool(robust_key)
    ctx = _Ctx(ar, robust, allow_pickle, None if dev is None or dev.type == "cpu" else dev)
    d = "" if subpath is None else _subpath(ctx, subpath)
    if d + META_FILE not in ar.entries:
        raise InvalidArgumentError(
            f"{path!r} is a zip file but not a memory-mapped tensordict archive: it has no top-level {META_FILE} entry."
        )
    result = _level(cls, ctx, d, None)
    entries = [p.entry for _, _, p in ctx.pending]
    if num_threads > 1 and len(entries) > 1:
        data = results([pool(num_threads).submit(ar.copy, e) for e in entries])
    else:
        data = [ar.copy(e) for e in entries]
    for (values, key, p), raw in zip(ctx.pending, data, strict=True):
        t = raw.view(p.info.dtype).view(p.info.shape)
        values[key] = t if ctx.device is None else t.to(ctx.device)
    return result
