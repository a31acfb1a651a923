"""The schema of a tensor tree: what a peer needs to rebuild it, without the tensor bytes.

A schema is plain JSON (so it crosses a process group or a ``Store`` as text): the tree's node
kinds (``_type`` markers), batch sizes, keys, and for each tensor leaf its dtype and shape; a
non-tensor value is carried as JSON, or pickled (base64) only where the caller allows it.  The
tensor leaves are numbered depth first and grouped by dtype, in order of first appearance: a
transfer is one flat buffer per group, each leaf a slice of its group at a fixed offset.

A consolidated tree (``td.consolidate()``: every leaf a view of one ``uint8`` storage) may be
described with that storage (:func:`describe`'s ``storage``): its root then says the storage's
size (``"storage"``) and each tensor node its byte offset in it (``"at"``), and a transfer is that
one buffer, padding included.

Hashes identify a schema: :attr:`Schema.digest` covers everything (a changed non-tensor value or
byte layout changes it), :attr:`Schema.layout_digest` only what a receiving tree must match
(kinds, keys, dtypes, shapes), :attr:`Schema.wire_digest` that plus the buffers' layout (plain or
one storage, and the offsets) and :attr:`Schema.content_digest` the tree without the byte layout,
so a receiver can tell "same buffers, new values" from "different buffers".

>>> import torch
>>> from tdshare import TensorDict
>>> s = schema_of(TensorDict(a=torch.zeros(2), b=torch.ones(2, 3, dtype=torch.int8), batch_size=[2]))
>>> [(g.dtype, g.numel) for g in s.groups]
[(torch.float32, 2), (torch.int8, 6)]
"""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
from dataclasses import dataclass, field
from typing import Any

import torch

from ._errors import ArgumentTypeError, NotSupportedError, PickleRefusedError, UnsupportedFormatError
from ._format import LEVEL, STACK, VALUE, VALUE_STACK, WRAPPED
from ._nodes import kind_for_tag, kind_of
from ._nontensor import NonTensorData, NonTensorStack
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase

__all__ = [
    "DIRECT_BYTES",
    "Group",
    "storage_offsets",
    "Schema",
    "describe",
    "schema_of",
    "leaves_of",
    "build_tree",
    "dtype_from_name",
    "value_of",
]

_FORMAT = 1
#: a leaf of at least this many bytes travels as its own message, from and into its own memory
DIRECT_BYTES = 1 << 20


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``"float32"``); an ``UnsupportedFormatError`` for an unknown one."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedFormatError(f"Unknown dtype {name!r} in a received schema: this torch cannot hold it.")
    return dtype


@dataclass(frozen=True)
class Group:
    """One flat buffer of a transfer: every leaf of ``dtype``, ``numel`` elements in all."""

    dtype: torch.dtype
    numel: int


@dataclass
class Schema:
    """A tree's schema (``tree``: JSON), its leaves' places in the dtype groups, and its hashes.

    Attributes:
        tree: the JSON description (see the module docstring).
        groups: the flat buffers, in order.
        slots: per tensor leaf, depth first: ``(group index, element offset, shape)``; group -1
            for a leaf of at least :data:`DIRECT_BYTES`, sent as its own message.
        direct: ``(index in slots, dtype)`` of those leaves, in order.
        dtypes: per tensor leaf, its dtype.
        storage: the size in bytes of the one storage of a consolidated schema (its one group,
            ``uint8``; the slots' offsets are then byte offsets), else None.
        digest: hash of the whole schema (values included), as a non-negative 63-bit int.
        layout_digest: hash of the kinds, keys, dtypes and shapes only.
        wire_digest: hash of the layout and the buffers' byte layout.
        content_digest: hash of the tree without the byte layout (values included).
    """

    tree: dict[str, Any]
    groups: list[Group] = field(default_factory=list)
    slots: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    direct: list[tuple[int, torch.dtype]] = field(default_factory=list)
    dtypes: list[torch.dtype] = field(default_factory=list)
    storage: int | None = None
    digest: int = 0
    layout_digest: int = 0
    wire_digest: int = 0
    content_digest: int = 0

    def to_json(self) -> str:
        """The schema as compact JSON text (what a peer receives)."""
        return json.dumps({"format": _FORMAT, "tree": self.tree}, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Schema:
        """Read a schema written by :meth:`to_json`.

        Raises:
            UnsupportedFormatError: a newer schema format.
        """
        data = json.loads(text)
        if data.get("format") != _FORMAT:
            raise UnsupportedFormatError(f"Schema format {data.get('format')!r} is not {_FORMAT}: upgrade tdshare.")
        return _finish(data["tree"])


def _hash(obj: Any) -> int:
    raw = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "little") >> 1


_VALUES = ("json", "pickle")
_WIRE = ("at", "storage")


def _strip(node: dict[str, Any], drop: tuple[str, ...]) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if k not in drop}
    if "items" in out:
        out["items"] = [[k, _strip(v, drop)] for k, v in out["items"]]
    if "members" in out:
        out["members"] = [_strip(m, drop) for m in out["members"]]
    if "inner" in out:
        out["inner"] = _strip(out["inner"], drop)
    return out


def _tensor_nodes(node: dict[str, Any], out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tensor nodes under ``node``, in leaf (depth first) order."""
    if node["t"] == "tensor":
        out.append(node)
    for _, child in node.get("items", ()):
        _tensor_nodes(child, out)
    for member in node.get("members", ()):
        _tensor_nodes(member, out)
    if "inner" in node:
        _tensor_nodes(node["inner"], out)
    return out


def _finish(tree: dict[str, Any]) -> Schema:
    schema = Schema(tree)
    index: dict[str, int] = {}
    if "storage" in tree:
        _finish_storage(schema, int(tree["storage"]))

    def visit(node: dict[str, Any]) -> None:
        t = node["t"]
        if t == "tensor" and schema.storage is None:
            dtype = dtype_from_name(node["dtype"])
            schema.dtypes.append(dtype)
            if node["dtype"] not in index:
                index[node["dtype"]] = len(schema.groups)
                schema.groups.append(Group(dtype, 0))
            g = index[node["dtype"]]
            shape = tuple(node["shape"])
            numel = 1
            for n in shape:
                numel *= n
            if numel * dtype.itemsize >= DIRECT_BYTES:
                schema.direct.append((len(schema.slots), dtype))
                schema.slots.append((-1, 0, shape))
            else:
                schema.slots.append((g, schema.groups[g].numel, shape))
                schema.groups[g] = Group(dtype, schema.groups[g].numel + numel)
        for _, child in node.get("items", ()):
            visit(child)
        for member in node.get("members", ()):
            visit(member)
        if "inner" in node:
            visit(node["inner"])

    visit(tree)
    schema.digest = _hash(tree)
    schema.layout_digest = _hash(_strip(tree, _VALUES + _WIRE))
    schema.wire_digest = _hash(_strip(tree, _VALUES))
    schema.content_digest = _hash(_strip(tree, _WIRE))
    return schema


def _finish_storage(schema: Schema, nbytes: int) -> None:
    """The slots of a consolidated schema: byte offsets into one ``uint8`` group of ``nbytes``."""
    schema.storage = nbytes
    schema.groups.append(Group(torch.uint8, nbytes))
    for node in _tensor_nodes(schema.tree, []):
        dtype = dtype_from_name(node["dtype"])
        shape = tuple(node["shape"])
        at = int(node["at"])
        numel = 1
        for n in shape:
            numel *= n
        if at < 0 or at % dtype.itemsize or at + numel * dtype.itemsize > nbytes:
            raise UnsupportedFormatError(
                f"A received schema places a {node['dtype']} leaf at byte {at} of a {nbytes}-byte storage: a corrupt "
                "schema."
            )
        schema.dtypes.append(dtype)
        schema.slots.append((0, at, shape))


def storage_offsets(storage: torch.Tensor, leaves: list[torch.Tensor]) -> list[int] | None:
    """Each leaf's byte offset in ``storage`` (a flat ``uint8`` tensor), or None unless every leaf
    is a contiguous view inside it at an offset aligned to its dtype."""
    base = storage.data_ptr()
    end = base + storage.numel()
    same = storage.untyped_storage().data_ptr()
    out = []
    for leaf in leaves:
        at = leaf.data_ptr() - base
        if leaf.numel() == 0:
            out.append(0)
            continue
        if (
            not leaf.is_contiguous()
            or leaf.device != storage.device
            or leaf.untyped_storage().data_ptr() != same
            or at < 0
            or at % leaf.element_size()
            or base + at + leaf.numel() * leaf.element_size() > end
        ):
            return None
        out.append(at)
    return out


def _value_node(kind_t: str, batch: list[int], value: Any, where: str, allow_pickle: bool) -> dict[str, Any]:
    node: dict[str, Any] = {"t": kind_t, "batch": batch}
    try:
        text = json.dumps(value)
        faithful = json.loads(text) == value and type(json.loads(text)) is type(value)
    except (TypeError, ValueError):
        faithful = False
    if faithful:
        node["json"] = value
    elif allow_pickle:
        node["pickle"] = base64.b64encode(pickle.dumps(value)).decode("ascii")
    else:
        raise PickleRefusedError(
            f"The non-tensor value at {where!r} ({type(value).__name__}) is not JSON: pass allow_pickle=True to "
            "send it pickled (the receiver must allow it too), or store a JSON value."
        )
    return node


def _describe(value: Any, where: str, allow_pickle: bool, leaves: list[torch.Tensor] | None) -> dict[str, Any]:
    kind = kind_of(value)
    if kind is None:
        if not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(f"Cannot send {where!r}: a {type(value).__name__} is not a tensor or a node.")
        if value.is_nested or value.layout != torch.strided:
            raise NotSupportedError(
                f"Cannot send {where!r}: {value.layout} / nested tensors are not sent; send dense ones."
            )
        if leaves is not None:
            leaves.append(value)
        return {"t": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    if kind.layout == LEVEL:
        assert isinstance(value, TensorDictBase)
        return {
            "t": "level",
            "batch": list(value.batch_size),
            "items": [
                [k, _describe(v, f"{where}.{k}" if where else k, allow_pickle, leaves)]
                for k, v in value._tensordict.items()
            ],
        }
    if kind.layout == STACK:
        assert isinstance(value, TensorDictBase)
        members = value.tensordicts  # type: ignore[attr-defined]
        return {
            "t": "stack",
            "tag": kind.type_tag,
            "dim": value.stack_dim,  # type: ignore[attr-defined]
            "members": [_describe(m, f"{where}[{i}]", allow_pickle, leaves) for i, m in enumerate(members)],
        }
    if kind.layout == WRAPPED and kind.unwrap is not None:
        inner, fields = kind.unwrap(value)
        return {
            "t": "wrapped",
            "tag": kind.type_tag,
            "fields": fields,
            "inner": _describe(inner, where, allow_pickle, leaves),
        }
    if kind.layout == VALUE_STACK:
        assert isinstance(value, NonTensorStack)
        return _value_node("vstack", list(value.batch_size), value.tolist(), where, allow_pickle)
    if kind.layout == VALUE:
        assert isinstance(value, NonTensorData)
        return _value_node("value", list(value.batch_size), value.data, where, allow_pickle)
    raise NotSupportedError(f"Cannot send {where!r}: the node kind {kind.name} has no schema.")


_CACHE: dict[tuple[int, bool], tuple[list[Any], Schema]] = {}
_CACHE_SIZE = 64


def _signature(value: Any, sig: list[Any], leaves: list[torch.Tensor]) -> bool:
    """Append what ``value``'s schema depends on to ``sig`` (cheaply), its leaves to ``leaves``;
    False where only a full description can tell (a value JSON cannot hold)."""
    kind = kind_of(value)
    if kind is None:
        if not isinstance(value, torch.Tensor):
            return False
        sig.append((value.shape, value.dtype, value.is_nested))
        leaves.append(value)
        return True
    layout = kind.layout
    if layout == LEVEL:
        sig.append((kind.name, value.batch_size, len(value._tensordict)))
        for k, v in value._tensordict.items():
            sig.append(k)
            if not _signature(v, sig, leaves):
                return False
        return True
    if layout == STACK:
        members = value.tensordicts
        sig.append((kind.type_tag, value.stack_dim, len(members)))
        return all(_signature(m, sig, leaves) for m in members)
    if layout == WRAPPED and kind.unwrap is not None:
        inner, fields = kind.unwrap(value)
        sig.append((kind.type_tag, repr(fields)))
        return _signature(inner, sig, leaves)
    if layout in (VALUE, VALUE_STACK):
        data = value.tolist() if layout == VALUE_STACK else value.data
        try:
            sig.append((layout, value.batch_size, type(data), json.dumps(data)))
        except (TypeError, ValueError):
            return False
        return True
    return False


def describe(
    tree: Any, *, allow_pickle: bool = False, storage: torch.Tensor | None = None
) -> tuple[Schema, list[torch.Tensor]]:
    """The schema of ``tree`` and its tensor leaves (schema order) in one walk.

    A tree described before (the same object) whose keys, dtypes, shapes and values are unchanged
    reuses its schema: only a cheap signature is computed then.

    Args:
        tree: the tensor collection.
        allow_pickle: as for :func:`schema_of`.
        storage: the flat ``uint8`` storage every leaf is a view of (a consolidated tree): the
            schema is then of that one buffer (byte offsets); ignored where a leaf lies outside it.

    Raises:
        as :func:`schema_of`.
    """
    if kind_of(tree) is None:
        raise ArgumentTypeError(f"Expected a tensordict, tensorclass or lazy stack, got {type(tree).__name__}.")
    if storage is not None:
        found: list[torch.Tensor] = []
        node = _describe(tree, "", allow_pickle, found)
        offsets = storage_offsets(storage, found)
        if offsets is not None:
            for tensor_node, at in zip(_tensor_nodes(node, []), offsets, strict=True):
                tensor_node["at"] = at
            node["storage"] = storage.numel()
        return _finish(node), found
    sig: list[Any] = []
    leaves: list[torch.Tensor] = []
    key = (id(tree), allow_pickle)
    cacheable = _signature(tree, sig, leaves)
    if cacheable:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] == sig:
            return hit[1], leaves
    leaves = []
    schema = _finish(_describe(tree, "", allow_pickle, leaves))
    if cacheable:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (sig, schema)
    return schema, leaves


def schema_of(tree: Any, *, allow_pickle: bool = False) -> Schema:
    """The schema of ``tree`` (a tensordict, tensorclass or lazy stack).

    Args:
        tree: the tensor collection.
        allow_pickle: pickle non-tensor values that JSON cannot hold (else refuse them).

    Returns:
        the :class:`Schema`.

    Raises:
        PickleRefusedError: a non-JSON value without ``allow_pickle``.
        NotSupportedError: a nested or sparse tensor leaf.

    >>> import torch
    >>> from tdshare import TensorDict
    >>> schema_of(TensorDict(a=torch.zeros(3), batch_size=[3])).slots
    [(0, 0, (3,))]
    """
    return describe(tree, allow_pickle=allow_pickle)[0]


def leaves_of(tree: Any) -> list[torch.Tensor]:
    """The tensor leaves of ``tree`` in schema order (depth first), the stored tensors themselves.

    >>> import torch
    >>> from tdshare import TensorDict
    >>> [t.tolist() for t in leaves_of(TensorDict(a=torch.zeros(1), n={"b": torch.ones(1)}, batch_size=[1]))]
    [[0.0], [1.0]]
    """
    out: list[torch.Tensor] = []
    if not _signature(tree, [], out):
        out = []
        _describe(tree, "", True, out)
    return out


def value_of(node: dict[str, Any], allow_pickle: bool) -> Any:
    """The non-tensor value of a schema node (unpickled only with ``allow_pickle``)."""
    if "json" in node:
        return node["json"]
    if not allow_pickle:
        raise PickleRefusedError("A received non-tensor value is pickled: pass allow_pickle=True to load it.")
    return pickle.loads(base64.b64decode(node["pickle"]))


def build_tree(schema: Schema, tensors: list[torch.Tensor], *, allow_pickle: bool = False) -> Any:
    """A new tree of ``schema``'s kinds whose tensor leaves are ``tensors`` (in schema order).

    Raises:
        UnsupportedFormatError: a class marker (a tensorclass) not defined in this process.
        PickleRefusedError: a pickled value without ``allow_pickle``.
    """
    it = iter(tensors)

    def build(node: dict[str, Any]) -> Any:
        t = node["t"]
        if t == "tensor":
            return next(it)
        if t == "value":
            return NonTensorData(value_of(node, allow_pickle), batch_size=node["batch"])
        if t == "vstack":
            return NonTensorStack.from_list(value_of(node, allow_pickle), batch_size=node["batch"])
        if t == "level":
            return TensorDict._from_leaves({k: build(v) for k, v in node["items"]}, torch.Size(node["batch"]), None)
        kind = kind_for_tag(node["tag"])
        if kind is None:
            raise UnsupportedFormatError(
                f"The received tree holds the class {node['tag']}, which is not defined in this process: import "
                "its module before receiving."
            )
        if t == "stack":
            return kind.cls(*[build(m) for m in node["members"]], stack_dim=node["dim"])
        assert kind.wrap is not None
        return kind.wrap(build(node["inner"]), node["fields"])

    return build(schema.tree)
