"""The read path: ``load``/``load_memmap`` of a saved directory, with strict validation.

Loading reads metadata only (``meta.json`` files and one ``stat`` per leaf) and maps each leaf
file; no payload page is read until a leaf is used.  Everything is checked before it is trusted:
a missing or short leaf file, malformed metadata, an unknown dtype, a shape that disagrees with
the batch size or a path that leaves the directory raises an error naming the file, where the
reference would fill zeros or drop the key.  Pickled values load only as ``allow_pickle`` says.
"""

from __future__ import annotations

import math
import os
import pickle
import stat
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ._errors import (
    ArgumentTypeError,
    CorruptDataError,
    InvalidArgumentError,
    LockedError,
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
    loads_json,
    parse_level,
)
from ._keys import encode_key, is_safe_legacy_name, unravel_key
from ._memmap import MemoryMappedTensor
from ._nontensor import NonTensorData
from ._registry import SharedRegistry
from ._tensordict import TensorDictBase

__all__ = ["load_tree", "load_into", "check_load_args", "read_meta"]

T = TypeVar("T", bound=TensorDictBase)
_TENSORCLASS_DIR = "_tensordict"
_STACK_PICKLE = "pickle.pkl"


@dataclass(frozen=True)
class _Ctx:
    root: str  # real path of the loaded directory: nothing outside it is read
    robust: bool
    mode: str | None
    allow_pickle: bool | None
    # real paths of the symlinked folders being loaded (a symlink loop would recurse forever)
    active: set[str] = field(default_factory=set, compare=False)


def check_load_args(mode: object, allow_pickle: object) -> None:
    if mode not in (None, "r", "r+"):
        raise InvalidArgumentError(f"mode must be None, 'r' or 'r+', got {mode!r}.")
    if allow_pickle is not None and not isinstance(allow_pickle, bool):
        raise ArgumentTypeError(f"allow_pickle must be a bool or None, got {type(allow_pickle).__name__}.")


def read_meta(directory: str) -> dict:
    path = os.path.join(directory, META_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise MissingMetadataError(
            f"No saved tensordict in {directory!r}: {META_FILE} is missing. Save one there first "
            "(td.memmap(prefix) or td.save(prefix))."
        ) from None
    except IsADirectoryError:
        raise CorruptDataError(f"{path} is a directory, not a metadata file.") from None
    return loads_json(raw, path)


def _inside(ctx: _Ctx, path: str, what: str) -> str:
    """The real path of ``path``, which must stay inside the loaded directory."""
    real = os.path.realpath(path)
    if real != ctx.root and not real.startswith(ctx.root + os.sep):
        raise CorruptDataError(f"{what} {path!r} is a symbolic link that leads outside {ctx.root!r}: refusing it.")
    return real


def _check_file_link(ctx: _Ctx, path: str) -> None:
    """Refuse a metadata or pickle file that is a symbolic link leading outside the loaded directory."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            _inside(ctx, path, "The file")
    except FileNotFoundError:
        pass


def _read_level_meta(ctx: _Ctx, directory: str) -> dict:
    _check_file_link(ctx, os.path.join(directory, META_FILE))
    return read_meta(directory)


def _user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside tdshare."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame = frame.f_back
        level += 1
    return level


def _locate(
    ctx: _Ctx, directory: str, names: dict[str, os.DirEntry], key: str, suffix: str, directory_entry: bool
) -> str | None:
    """The file name of ``key`` in ``directory`` (robust name, then legacy raw name), or None."""
    candidates = [encode_key(key) + suffix] if ctx.robust else []
    if (not ctx.robust or candidates[0] != key + suffix) and is_safe_legacy_name(key, directory=directory_entry):
        candidates.append(key + suffix)
    for name in candidates:
        entry = names.get(name)
        if entry is None:
            continue
        path = os.path.join(directory, name)
        if entry.is_symlink():
            _inside(ctx, path, "The entry")
        return path
    return None


def _load_leaf(
    ctx: _Ctx,
    directory: str,
    names: dict[str, os.DirEntry],
    info: LeafInfo,
    batch: tuple[int, ...] | None,
    meta_path: str,
    old: Any = None,
) -> torch.Tensor:
    """Map one leaf; ``old`` (the current leaf, on a refresh) is kept if its file is unchanged."""
    if batch is not None and info.shape[: len(batch)] != batch:
        raise CorruptDataError(
            f"{meta_path}: the leaf {info.key!r} has shape {list(info.shape)}, which does not start with the "
            f"batch size {list(batch)}."
        )
    if info.is_nested:
        return _load_nested(ctx, directory, names, info, meta_path)
    path = _locate(ctx, directory, names, info.key, LEAF_SUFFIX, False)
    if info.numel == 0:
        return MemoryMappedTensor._wrap(torch.empty(info.shape, dtype=info.dtype), None, None, None)
    if path is None:
        raise CorruptDataError(
            f"{meta_path} lists the leaf {info.key!r} ({info.nbytes} bytes of {info.dtype}), but its file "
            f"{os.path.join(directory, encode_key(info.key) + LEAF_SUFFIX)!r} is missing."
        )
    st = names[os.path.basename(path)].stat()
    size = st.st_size
    if not stat.S_ISREG(st.st_mode):
        raise CorruptDataError(
            f"{meta_path} lists the leaf {info.key!r}, but {path!r} is not a regular file (expected "
            f"{info.nbytes} bytes of {info.dtype})."
        )
    if size < info.nbytes:
        raise CorruptDataError(
            f"The file {path!r} holds {size} bytes but {meta_path} expects {info.nbytes} "
            f"(shape {list(info.shape)}, {info.dtype}): it is truncated."
        )
    mode = ctx.mode
    if (
        isinstance(old, MemoryMappedTensor)
        and old._ino == st.st_ino
        and old._filename == path
        and old._mode == mode
        and old.shape == info.shape
        and old.dtype == info.dtype
    ):
        return old  # same file, same inode: the mapping is current
    if mode == "r+" and not os.access(path, os.W_OK):
        raise PermissionError(f"Cannot open {path!r} with mode='r+': the file is not writable.")
    shared = mode == "r+" or (mode is None and os.access(path, os.W_OK))
    flat = torch.from_file(path, shared=shared, size=info.numel, dtype=info.dtype)
    out = MemoryMappedTensor._wrap(flat.view(info.shape), path, None, mode)
    out._ino = st.st_ino
    return out


def _load_nested(
    ctx: _Ctx, directory: str, names: dict[str, os.DirEntry], info: LeafInfo, meta_path: str
) -> torch.Tensor:
    """A strided nested tensor (reference layout): ``k.memmap`` values, ``k.shape.memmap`` sizes."""
    if len(info.shape) != 2:
        raise CorruptDataError(f"{meta_path}: nested leaf {info.key!r} needs a 2-d size table, got {info.shape}.")
    shape_path = _locate(ctx, directory, names, info.key, ".shape" + LEAF_SUFFIX, False)
    data_path = _locate(ctx, directory, names, info.key, LEAF_SUFFIX, False)
    if shape_path is None or data_path is None:
        raise CorruptDataError(f"{meta_path}: the files of nested leaf {info.key!r} are missing.")
    sizes = MemoryMappedTensor.from_filename(shape_path, torch.int64, info.shape, mode="r")
    counts = [math.prod(row) for row in sizes.tolist()]
    values = MemoryMappedTensor.from_filename(data_path, info.dtype, [sum(counts)], mode="r")
    parts = [
        torch.Tensor.as_subclass(v, torch.Tensor).reshape(row)
        for v, row in zip(torch.Tensor.split(values, counts), sizes.tolist(), strict=True)
    ]
    return torch.nested.nested_tensor(parts)


def _load_pickle(ctx: _Ctx, path: str) -> Any:
    if ctx.allow_pickle is False:
        raise PickleRefusedError(
            f"Refusing to load the pickled non-tensor data {path!r}: pickle can execute arbitrary code. Pass "
            "allow_pickle=True only if the saved data is trusted."
        )
    if ctx.allow_pickle is None:
        warnings.warn(
            f"Loading the pickled non-tensor data {path!r}. This is only safe for trusted data; pass "
            "allow_pickle=True to silence this warning, or allow_pickle=False to refuse pickles.",
            FutureWarning,
            stacklevel=_user_stacklevel(),
        )
    _check_file_link(ctx, path)
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        raise CorruptDataError(f"The pickled non-tensor value {path!r} is missing.") from None


@contextmanager
def _entering(ctx: _Ctx, path: str, is_link: bool) -> Iterator[None]:
    """Descend into the folder ``path``; a symlinked one must stay inside and must not loop."""
    if not is_link:
        yield
        return
    real = _inside(ctx, path, "The folder")
    if real in ctx.active:
        raise CorruptDataError(f"The folder {path!r} is a symbolic link that loops back to {real!r}: refusing it.")
    ctx.active.add(real)
    try:
        yield
    finally:
        ctx.active.discard(real)


def _load_level(cls: type[T], ctx: _Ctx, directory: str, meta: dict, out: Any, parent_batch: Any, device: Any) -> Any:
    meta_path = os.path.join(directory, META_FILE)
    kind = meta.get("_type")
    if meta.get("_is_non_tensor") or kind == NONTENSOR_TYPE:
        if "data" in meta:
            return NonTensorData(meta["data"])
        stored = _load_pickle(ctx, os.path.join(directory, PICKLE_FILE))
        if not isinstance(stored, dict) or "data" not in stored:
            raise CorruptDataError(f"{os.path.join(directory, PICKLE_FILE)} holds no 'data' field.")
        return NonTensorData(stored["data"])
    if kind == NONTENSOR_STACK_TYPE:
        data = meta.get("data")
        if data == _STACK_PICKLE:
            data = _load_pickle(ctx, os.path.join(directory, _STACK_PICKLE))
        elif isinstance(data, str):
            raise CorruptDataError(f"{meta_path}: invalid pickled NonTensorStack file name {data!r}.")
        elif data is None:  # older writers: no "data", one NonTensorData folder per member
            return _load_nontensor_members(cls, ctx, directory, meta, device)
        return NonTensorData(data)
    if kind == LAZY_STACK_TYPE:
        return _load_lazy_stack(cls, ctx, directory, meta, device)
    if "shape" not in meta:
        nested = os.path.join(directory, _TENSORCLASS_DIR)
        if os.path.isfile(os.path.join(nested, META_FILE)):
            warnings.warn(
                f"{directory!r} holds a tensorclass ({kind}); tdshare loads it as a TensorDict.",
                UserWarning,
                stacklevel=_user_stacklevel(),
            )
            return _load_level(cls, ctx, nested, _read_level_meta(ctx, nested), out, parent_batch, device)
        raise UnsupportedFormatError(f"{meta_path} describes a {kind!r}, which tdshare cannot load.")
    level = parse_level(meta, meta_path)
    batch = level.batch_size if level.batch_size is not None else ()
    if parent_batch is not None and tuple(batch[: len(parent_batch)]) != tuple(parent_batch):
        raise CorruptDataError(
            f"{meta_path}: batch size {list(batch)} does not start with the parent's {list(parent_batch)}."
        )
    names = {e.name: e for e in os.scandir(directory)}
    leaves: dict[str, Any] = {}
    target = out if isinstance(out, TensorDictBase) else None
    current = target._tensordict if target is not None else {}
    for info in level.leaves:
        if meta[info.key].get(NO_FILE_FIELD):
            continue  # added from a file-less storage: its data never reached the folder
        leaves[info.key] = _load_leaf(ctx, directory, names, info, batch, meta_path, current.get(info.key))
    for key, _ in level.children:
        path = _locate(ctx, directory, names, key, "", True)
        if path is None or not os.path.isdir(path):
            raise CorruptDataError(
                f"{meta_path} lists the nested entry {key!r}, but its folder "
                f"{os.path.join(directory, encode_key(key))!r} is missing."
            )
        reuse = target._tensordict.get(key) if target is not None else None
        with _entering(ctx, path, names[os.path.basename(path)].is_symlink()):
            leaves[key] = _load_level(cls, ctx, path, _read_level_meta(ctx, path), reuse, batch, device)
    device_obj = torch.device(device) if device is not None else None
    if device_obj is not None and device_obj.type != "cpu":
        leaves = {k: v.to(device_obj) if isinstance(v, torch.Tensor) else v for k, v in leaves.items()}
    order = [k for k in meta if k in leaves]
    # a new tensordict even with ``out``: load_tree moves the result into ``out`` only once all loaded
    result = cls._from_leaves({}, torch.Size(batch), None, level.names)
    result._tensordict = {k: leaves[k] for k in order}
    result._batch_size = torch.Size(batch)
    result._names = level.names
    result._device = (
        device_obj
        if device_obj is not None
        else (torch.device("cpu") if meta.get("device") not in (None, "None") else None)
    )
    result._is_memmap = False
    result._memmap_prefix = directory if ctx.mode != "r" else None
    result._meta_seen = meta
    return result


def _load_nontensor_members(cls: type[T], ctx: _Ctx, directory: str, meta: dict, device: Any) -> NonTensorData:
    """A NonTensorStack saved as member folders ``0/``, ``1/``...: a NonTensorData of their values."""
    if meta.get("stack_dim", 0) != 0:
        raise UnsupportedFormatError(
            f"{os.path.join(directory, META_FILE)}: a NonTensorStack stored as member folders with stack_dim "
            f"{meta.get('stack_dim')!r}; tdshare reads only stack_dim 0 in this layout."
        )
    values = []
    for member in _load_members(cls, ctx, directory, device):
        if not isinstance(member, NonTensorData):
            raise CorruptDataError(f"{directory!r}: a NonTensorStack member is not non-tensor data.")
        values.append(member.data)
    return NonTensorData(values)


def _load_lazy_stack(cls: type[T], ctx: _Ctx, directory: str, meta: dict, device: Any) -> Any:
    return cls.stack(_load_members(cls, ctx, directory, device), int(meta.get("stack_dim", 0)))


def _load_members(cls: type[T], ctx: _Ctx, directory: str, device: Any) -> list:
    """The members ``0/``, ``1/``... of a stack folder (a gap in the numbering raises)."""
    members = []
    i = 0
    while os.path.isdir(os.path.join(directory, str(i))):
        sub = os.path.join(directory, str(i))
        with _entering(ctx, sub, os.path.islink(sub)):
            members.append(_load_level(cls, ctx, sub, _read_level_meta(ctx, sub), None, None, device))
        i += 1
    if os.path.exists(os.path.join(directory, str(i + 1))):
        raise CorruptDataError(f"{directory!r}: the stacked member folder {i!r} is missing.")
    if not members:
        raise CorruptDataError(f"{directory!r}: a stacked tensordict with no members.")
    return members


def _resolve_subpath(ctx: _Ctx, directory: str, subpath: Any) -> str:
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
        names = {e.name: e for e in os.scandir(directory)}
        found = _locate(ctx, directory, names, part, "", True)
        if found is None and os.path.isfile(os.path.join(directory, _TENSORCLASS_DIR, META_FILE)):
            inner = os.path.join(directory, _TENSORCLASS_DIR)
            found = _locate(ctx, inner, {e.name: e for e in os.scandir(inner)}, part, "", True)
        if found is None or not os.path.isfile(os.path.join(found, META_FILE)):
            raise InvalidArgumentError(
                f"No tensordict found under subpath {subpath!r} (missing {META_FILE} in "
                f"{os.path.join(directory, encode_key(part))!r})."
            )
        directory = found
    return directory


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
    archive_loader: Callable[..., Any] | None = None,
) -> Any:
    """Load the tensordict saved in the directory (or ``.tdz`` archive) ``prefix`` (see ``TensorDict.load_memmap``).

    Archives are opened by ``archive_loader`` (:func:`tdshare._archive.load_archive`, which builds
    on this module and is passed in from above, so the two modules never import each other)."""
    check_load_args(mode, allow_pickle)
    directory = os.path.abspath(os.fspath(prefix))
    is_archive = os.path.isfile(directory)
    ctx = _Ctx(os.path.realpath(directory), True if robust_key is None else bool(robust_key), mode, allow_pickle)
    if subpath is not None and not is_archive:
        directory = _resolve_subpath(ctx, directory, subpath)
    if out is not None:
        _check_out(out, device)
        if device is None:
            device = out.device
    if is_archive:
        if archive_loader is None:
            raise NotSupportedError(f"{directory!r} is a file: pass an archive loader to read .tdz archives.")
        opts = {"robust_key": robust_key, "subpath": subpath, "mode": mode, "allow_pickle": allow_pickle}
        result = archive_loader(cls, directory, device, num_threads=num_threads, **opts)
    else:
        # the registry state *before* the metadata: a later refresh re-reads anything newer
        state = SharedRegistry.for_directory(directory).state() if ctx.mode != "r" else None
        result = _load_level(cls, ctx, directory, _read_level_meta(ctx, directory), out, None, device)
        if isinstance(result, TensorDictBase):
            result._generation = state
    if out is None:
        return result
    if not isinstance(result, TensorDictBase):
        raise InvalidArgumentError(f"{directory!r} holds a {type(result).__name__}, which cannot be loaded into out.")
    _transplant(result, out)
    return out


def _check_out(out: Any, device: Any) -> None:
    if not isinstance(out, TensorDictBase):
        raise ArgumentTypeError(f"out must be a TensorDict, got {type(out).__name__}.")
    if device is not None and out.device is not None and torch.device(device) != out.device:
        raise InvalidArgumentError(
            f"Cannot load a tensordict on device {torch.device(device)} into a tensordict on device {out.device}."
        )
    for key, level in [("", out), *((k, v) for k, v in out._iter_items(True, False) if isinstance(v, TensorDictBase))]:
        if level._is_locked:
            where = "" if key == "" else f" (at {key!r})"
            raise LockedError(
                f"Cannot load into a locked TensorDict{where}: unlock it first (td.unlock_()), or load a new one "
                "and write it in place with td.update_(TensorDict.load_memmap(prefix))."
            )


def _transplant(loaded: TensorDictBase, out: TensorDictBase) -> None:
    """Move a loaded tree into ``out``, reusing ``out``'s nested tensordicts (same objects)."""
    values: dict[str, Any] = {}
    for key, value in loaded._tensordict.items():
        old = out._tensordict.get(key)
        if isinstance(value, TensorDictBase) and isinstance(old, TensorDictBase) and old is not out:
            _transplant(value, old)
            value = old
        values[key] = value
    out._tensordict = values
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
    archive_loader: Callable[..., Any] | None = None,
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
        load_tree(
            type(td), prefix, td.device, out=td, robust_key=robust_key, mode=mode, allow_pickle=allow_pickle,
            archive_loader=archive_loader,
        )
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
