"""Reading a consolidated storage back: the views of its leaves, the tree a schema describes,
the file that ``consolidate(filename=...)`` writes, and the marks that tell a consolidated tensordict
from one changed since.  The layout is described in :mod:`tdshare._consolidate`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import torch

from ._errors import CorruptDataError, InvalidArgumentError, UnsupportedFormatError
from ._format import LAZY_STACK_TYPE, STACK, WRAPPED
from ._nodes import kind_for_tag, kind_of
from ._nontensor import NonTensorData, NonTensorStack

__all__ = [
    "LAZY_CLS",
    "NJT_PREFIXES",
    "NT_STACK_CLS",
    "SCHEMA_FIELDS",
    "TD_CLS",
    "Viewer",
    "describe_where",
    "file_identity",
    "intact",
    "level_views",
    "marks_of",
    "read_consolidated_file",
    "rebuild_consolidated",
    "unpickle_consolidated",
    "unpickle_consolidated_file",
]

#: the fields of a schema level; any other key names a nested level
SCHEMA_FIELDS = ("cls", "non_tensors", "leaves", "cls_metadata")
_IGNORED_FIELDS = ("size",)  # the reference may record the file size
TD_CLS, LAZY_CLS, NT_STACK_CLS = "TensorDict", "LazyStackedTensorDict", "NonTensorStack"
#: the leaves of a jagged nested tensor ``key``: ``<NJT_VALUES>key``, ``<NJT_LENGTHS>key``, ``<NJT_OFFSETS>key``
NJT_PREFIXES = ("<NJT_VALUES>", "<NJT_LENGTHS>", "<NJT_OFFSETS>")


def describe_where(where: tuple[str, ...]) -> str:
    """How messages name the entry at ``where`` (a key path)."""
    return "the tensordict" if not where else f"entry {where[0] if len(where) == 1 else where!r}"


class Viewer:
    """Makes the views of one storage: one ``as_strided`` call per leaf on a per-dtype view of it."""

    def __init__(self, storage: torch.Tensor) -> None:
        self.storage = storage
        self.size = storage.numel()
        self.bases: dict[torch.dtype, torch.Tensor | None] = {}

    def view(self, dtype: torch.dtype, shape: torch.Size, start: int, nbytes: int) -> torch.Tensor:
        itemsize = dtype.itemsize
        base = self.bases.get(dtype, _UNSET)
        if base is _UNSET:
            try:
                base = self.storage[: self.size - self.size % itemsize].view(dtype)
            except RuntimeError:  # a storage offset that this dtype cannot view
                base = None
            self.bases[dtype] = base
        if base is None or start % itemsize:
            return self.storage[start : start + nbytes].view(dtype).view(shape)
        strides, step = [], 1
        for dim in reversed(shape):
            strides.append(step)
            step *= max(dim, 1)
        return base.as_strided(shape, strides[::-1], base.storage_offset() + start // itemsize)


_UNSET: Any = object()
_DTYPES: dict[str, torch.dtype] = {}


def level_views(meta: dict[str, Any], viewer: Viewer) -> dict[str, torch.Tensor]:
    """The leaves of one schema level, as views of the storage (jagged leaves put back together)."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[str, Any]] = {}
    size = viewer.size
    for key, spec in meta["leaves"].items():
        try:
            dtype_name, shape, start, stop, pad = spec[:5]
            dtype = _DTYPES.get(dtype_name) or _dtype(dtype_name)
            shape = torch.Size(shape)
            nbytes = stop - start - pad
        except (TypeError, ValueError) as e:
            raise CorruptDataError(f"consolidated schema: the leaf {key!r} has a malformed entry {spec!r}.") from e
        if not 0 <= start <= stop <= size or nbytes != shape.numel() * dtype.itemsize:
            raise CorruptDataError(
                f"consolidated schema: the leaf {key!r} ({dtype_name}{list(shape)}, bytes {start}-{stop}) does not "
                f"fit the {size}-byte storage."
            )
        view = viewer.view(dtype, shape, start, nbytes)
        prefix = None if key[:1] != "<" else next((p for p in NJT_PREFIXES if key.startswith(p)), None)
        if prefix is None:
            out[key] = view
            continue
        name = key[len(prefix) :]
        parts.setdefault(name, {})[prefix] = view
        if prefix == NJT_PREFIXES[2]:
            got = parts.pop(name)
            ragged = spec[5] if len(spec) > 5 else 1
            out[name] = torch.nested.nested_tensor_from_jagged(
                got[NJT_PREFIXES[0]], offsets=view, lengths=got.get(NJT_PREFIXES[1]), jagged_dim=ragged
            )
    return out


# -- rebuilding from a schema --------------------------------------------------------------------
def rebuild_consolidated(storage: torch.Tensor, schema: dict[str, Any], level_class: Any) -> Any:
    """The tensordict whose leaves are views of ``storage``, as ``schema`` describes it.

    Args:
        storage: the flat ``uint8`` storage (e.g. received through ``torch.distributed``).
        schema: the schema :func:`consolidated_parts` gave (the reference's layout).
        level_class: the class of the schema's ``"TensorDict"`` levels (e.g. ``tdshare.TensorDict``).

    Returns:
        The rebuilt tree, consolidated over ``storage`` (not locked unless the schema says so).

    Raises:
        CorruptDataError: a malformed schema, or a leaf outside ``storage``.
        UnsupportedFormatError: a tensorclass the schema names is not defined in this process.

    >>> import torch
    >>> from tdshare import TensorDict, consolidated_parts
    >>> buffer, schema = consolidated_parts(TensorDict(a=torch.ones(2), batch_size=[2]))
    >>> rebuild_consolidated(buffer.clone(), schema, TensorDict)["a"].tolist()
    [1.0, 1.0]
    """
    if not isinstance(storage, torch.Tensor) or storage.dtype != torch.uint8 or storage.dim() != 1:
        raise InvalidArgumentError(
            f"rebuild_consolidated: storage must be a 1-D uint8 tensor, got {type(storage).__name__}"
            f"{'' if not isinstance(storage, torch.Tensor) else f' {storage.dtype}{list(storage.shape)}'}."
        )
    out = _build(schema, Viewer(storage), level_class, ())
    root = kind_of(out)
    target = out if root is None or root.layout != WRAPPED or root.unwrap is None else root.unwrap(out)[0]
    target._consolidated = {"storage": storage, "metadata": schema, "filename": None, "marks": marks_of(target)}
    return out


def _build(meta: Any, storage: Viewer, level_class: Any, where: tuple[str, ...]) -> Any:
    try:
        cls, non_tensors, leaves, cls_meta = (meta[f] for f in SCHEMA_FIELDS)
        subs = {k: v for k, v in meta.items() if k not in SCHEMA_FIELDS and k not in _IGNORED_FIELDS}
        cls_meta = dict(cls_meta)
    except (KeyError, TypeError) as e:
        raise CorruptDataError(f"consolidated schema: {describe_where(where)} is not a schema level ({e}).") from e
    del leaves  # read by level_views
    locked = bool(cls_meta.pop("is_locked", False))
    if cls in (LAZY_CLS, NT_STACK_CLS):
        members = []
        for i in range(len(subs) + len(non_tensors)):
            if str(i) in subs:
                members.append(_build(subs[str(i)], storage, level_class, (*where, str(i))))
            elif str(i) in non_tensors:
                members.append(NonTensorData(non_tensors[str(i)][0]))
            else:
                raise CorruptDataError(f"consolidated schema: the stack {describe_where(where)} has no member {i}.")
        if cls == NT_STACK_CLS:
            return NonTensorStack(*members)
        kind = kind_for_tag(LAZY_STACK_TYPE)
        if kind is None or kind.wrap is None or not members:
            raise UnsupportedFormatError(
                f"consolidated schema: {describe_where(where)} is a lazy stack that cannot be built."
            )
        fields = {"stack_dim": cls_meta.get("stack_dim", 0), "stack_dim_name": cls_meta.get("stack_dim_name")}
        out = kind.wrap(members, fields)
        return out.lock_() if locked else out
    entries: dict[str, Any] = {}
    level_batch = list(cls_meta.get("batch_size", []))
    for key, (data, batch, device) in non_tensors.items():
        # a value recorded with its level's batch size is tdshare's plain value (no batch of its own)
        entries[key] = NonTensorData(data, batch_size=None if list(batch) == level_batch else batch, device=device)
    entries.update(level_views(meta, storage))
    for key, sub in subs.items():
        entries[key] = _build(sub, storage, level_class, (*where, key))
    names = cls_meta.get("names")
    device = cls_meta.get("device")
    td = level_class._from_leaves(
        entries,
        torch.Size(cls_meta.get("batch_size", [])),
        None if device is None else torch.device(device),
        None if not names or all(n is None for n in names) else list(names),
    )
    if locked:
        td.lock_()
    if cls == TD_CLS:
        return td
    kind = kind_for_tag(cls)
    if kind is None or kind.wrap is None:
        raise UnsupportedFormatError(
            f"consolidated schema: {describe_where(where)} is a {cls}, which is not defined in this process; import "
            "the module that defines it (its @tensorclass registers it) before loading."
        )
    return kind.wrap(td, {})


def unpickle_consolidated(cls: type, storage: torch.Tensor, schema: dict[str, Any]) -> Any:
    return rebuild_consolidated(storage, schema, cls._level_class())  # type: ignore[attr-defined]


def unpickle_consolidated_file(
    cls: type, path: str, file_id: tuple[int, int], size: int, schema: dict[str, Any]
) -> Any:
    """A consolidated tensordict whose storage is the first ``size`` bytes of ``path``, mapped shared."""
    try:
        same = file_identity(path) == tuple(file_id)
    except OSError:
        same = False
    if not same:
        raise CorruptDataError(
            f"{path}: the consolidated file this tensordict was pickled from was removed or replaced since; "
            "pickle it again (or consolidate without filename= to send the bytes)."
        )
    whole = torch.from_file(path, shared=True, size=os.path.getsize(path), dtype=torch.uint8)
    out = rebuild_consolidated(whole[:size], schema, cls._level_class())  # type: ignore[attr-defined]
    state = _state_of(out)
    state["filename"], state["file"] = path, (path, tuple(file_id), size)
    return out


def file_identity(path: str | os.PathLike) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _state_of(obj: Any) -> dict[str, Any]:
    kind = kind_of(obj)
    target = obj if kind is None or kind.layout != WRAPPED or kind.unwrap is None else kind.unwrap(obj)[0]
    state = target._consolidated
    assert state is not None
    return state


def read_consolidated_file(filename: str | os.PathLike) -> tuple[torch.Tensor, dict[str, Any]]:
    """``(storage, schema)`` of a file that ``consolidate(filename=...)`` wrote (mapped copy-on-write).

    Raises:
        CorruptDataError: the file is shorter than its footer says, or its schema is not JSON.

    >>> import tempfile, torch
    >>> from tdshare import TensorDict
    >>> path = tempfile.mkdtemp() + "/td.bin"
    >>> _ = TensorDict(a=torch.zeros(2), batch_size=[2]).consolidate(filename=path)
    >>> storage, schema = read_consolidated_file(path)
    >>> storage.numel(), schema["cls"]
    (8, 'TensorDict')
    """
    path = os.fspath(filename)
    size = os.path.getsize(path)
    if size < 8:
        raise CorruptDataError(f"{path}: {size} bytes, too short for a consolidated file (it ends with an int64).")
    whole = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    length = int.from_bytes(bytes(whole[-8:].tolist()), "little", signed=True)
    if not 0 < length <= size - 8:
        raise CorruptDataError(f"{path}: its footer gives a {length}-byte schema, but the file has {size} bytes.")
    try:
        schema = json.loads(bytes(whole[size - 8 - length : size - 8].numpy().data))
    except ValueError as e:
        raise CorruptDataError(f"{path}: the consolidated schema is not valid JSON ({e}).") from e
    if not isinstance(schema, dict):
        raise CorruptDataError(f"{path}: the consolidated schema is a {type(schema).__name__}, not an object.")
    return whole[: size - 8 - length], schema


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptDataError(f"consolidated schema: unknown dtype {name!r}.")
    _DTYPES[str(name)] = dtype
    return dtype


# -- staleness -----------------------------------------------------------------------------------
Mark = tuple[Any, ...]


def marks_of(node: Any) -> list[Mark]:
    """What :func:`intact` compares: every container and entry of the tree, by identity."""
    marks: list[Mark] = []
    _mark(node, marks)
    return marks


def _mark(node: Any, marks: list[Mark]) -> None:
    kind = kind_of(node)
    if kind is not None and kind.layout == STACK and kind.unwrap is not None:
        members, _ = kind.unwrap(node)
        marks.append((_same_len, members, len(members)))
        for i, m in enumerate(members):
            marks.append((_same_item, members, i, m))
            _mark(m, marks)
        return
    entries = node._tensordict
    marks.append((_same_attr, node, "_tensordict", entries))  # memmap_ may swap the whole dict
    marks.append((_same_len, entries, len(entries)))
    marks.append((_same_attr, node, "_batch_size", node._batch_size))
    if node._is_locked:
        marks.append((_same_attr, node, "_is_locked", True))
    for key, value in entries.items():
        marks.append((_same_item, entries, key, value))
        if isinstance(value, NonTensorStack):
            marks.append((_same_list, value, value.tolist()))
        elif isinstance(value, NonTensorData):
            marks.append((_same_attr, value, "data", value.data))
        elif not isinstance(value, torch.Tensor):
            sub = kind_of(value)
            if sub is not None and sub.layout == WRAPPED and sub.unwrap is not None:
                _mark(sub.unwrap(value)[0], marks)
            elif sub is not None:
                _mark(value, marks)


def _same_len(container: Any, n: int) -> bool:
    return len(container) == n


def _same_item(container: Any, key: Any, value: Any) -> bool:
    try:
        return container[key] is value
    except (KeyError, IndexError):
        return False


def _same_attr(obj: Any, name: str, value: Any) -> bool:
    return getattr(obj, name, None) is value


def _same_list(obj: Any, value: Any) -> bool:
    return bool(obj.tolist() == value)


def intact(marks: list[Mark]) -> bool:
    check: Callable[..., bool]
    for check, *args in marks:
        if not check(*args):
            return False
    return True
