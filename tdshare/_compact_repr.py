"""The compact ``repr`` of tensor collections, the form tensordict 0.15.3 prints by default::

    TensorDict(batch_size=[4], fields={a: f32[3], n: {b: i64[2]}, s: str})

It is built from metadata only (dtypes, shapes after the batch dims, devices): nothing is read,
and a lazy stack's leaves are never stacked.  An entry is a token (``f32[3]``, a non-tensor
value's type name) or a nested container (``{...}``, prefixed by the class name of a tensorclass or
lazy stack and by the batch dims it adds).  A container is printed on one line when the whole line
fits in 80 columns, else one entry per line, each by the same rule.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ._nodes import kind_of
from ._nontensor import NonTensorData, NonTensorStack

__all__ = ["compact_repr"]

_WIDTH = 80
_CPU = torch.device("cpu")
Node = Any  # a token (str) or a container: (prefix, [(key, Node), ...])


def _is_collection(value: Any) -> bool:
    return hasattr(value, "_lazy_members") and hasattr(value, "_get_leaf")


def _fields_of(value: Any) -> Any:
    """A tensorclass's field names, or None for any other value."""
    return getattr(type(value), "__tdshare_fields__", None)


def _wrapped(value: Any) -> Any:
    kind = kind_of(value)
    if kind is None or kind.unwrap is None or _is_collection(value) or isinstance(value, (torch.Tensor, NonTensorData)):
        return None
    return kind.unwrap(value)[0]


@functools.cache
def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    for long, short in (("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c")):
        name = name.replace(long, short)
    return name


def _shape(tensor: torch.Tensor, batch_dims: int) -> tuple[int, ...]:
    if tensor.is_nested:
        dims = []
        for d in range(tensor.dim()):
            try:
                dims.append(tensor.size(d))
            except RuntimeError:  # ragged
                dims.append(-1)
        return tuple(dims[batch_dims:])
    return tuple(tensor.shape[batch_dims:])


def _token(owner: Any, shape: Any, dtype: torch.dtype, devices: set[torch.device]) -> str:
    token = f"{_dtype_name(dtype)}[{','.join(map(str, shape))}]"
    if devices != {_CPU} and owner.device is None:
        token += "@" + ",".join(sorted(str(d) for d in devices))
    return token


def _value_token(value: Any) -> str | None:
    if isinstance(value, NonTensorStack):
        return "NonTensorStack"
    if isinstance(value, NonTensorData):
        return type(value.data).__name__
    return None


def _lazy_leaf(ls: Any, key: str) -> Any:
    """A token for a leaf of a lazy stack: dims that differ between members are -1, dtypes promoted."""
    shapes: set[tuple[int, ...]] = set()
    dtypes: set[torch.dtype] = set()
    devices: set[torch.device] = set()
    pending = [ls]
    while pending:
        node = pending.pop()
        members = node._lazy_members()
        if members is not None:
            pending.extend(members)
            continue
        value = node._get_leaf((key,))
        if not isinstance(value, torch.Tensor):
            return _entry(node, key)
        shapes.add(_shape(value, node.batch_dims))
        dtypes.add(value.dtype)
        devices.add(value.device)
    first, *others = shapes
    shape = list(first)
    for other in others:
        if len(other) != len(shape):
            shape = [-1]
            break
        shape = [s if s == o else -1 for s, o in zip(shape, other, strict=True)]
    return _token(ls, shape, functools.reduce(torch.promote_types, dtypes), devices)


def _entry(owner: Any, key: str) -> Node:
    first = owner
    while (members := first._lazy_members()) is not None and members:
        first = members[0]
    item = first._get_leaf((key,))
    token = _value_token(item)
    if token is not None:
        return token
    if isinstance(item, torch.Tensor) and not _is_collection(item):
        if first is owner:
            return _token(owner, _shape(item, owner.batch_dims), item.dtype, {item.device})
        return str(_lazy_leaf(owner, key))
    if not _is_collection(item) and _wrapped(item) is None:
        return type(item).__name__
    sub = item if first is owner else owner._get_leaf((key,))
    prefix = (
        ""
        if (
            _is_collection(item)
            and item._lazy_members() is None
            and _fields_of(item) is None
            and type(item).__name__ == "TensorDict"
        )
        else type(item).__name__
    )
    extra = sub.batch_size[owner.batch_dims :]
    if extra:
        prefix += f"[{','.join(map(str, extra))}]"
    return prefix, _body(sub)


def _entries(td: Any, keys: Any) -> list[tuple[str, Any]]:
    """The entries of ``keys``, sorted as the reference sorts them (by their flat text)."""
    return sorted(((key, _entry(td, key)) for key in keys), key=lambda e: f"{e[0]}: {_flat(e[1])}")


def _body(td: Any) -> list[tuple[str, Any]]:
    fields = _fields_of(td)
    if fields is None:
        return _entries(td, td.keys())
    inner = _wrapped(td)
    present = list(inner.keys())
    return _entries(inner, present) + [(name, "None") for name in fields if name not in present]


def _flat(node: Node) -> str:
    if isinstance(node, str):
        return node
    prefix, entries = node
    return prefix + "{" + ", ".join(f"{k}: {_flat(v)}" for k, v in entries) + "}"


def _render(node: Node, indent: str, used: int, tail: int) -> str:
    flat = _flat(node)
    if isinstance(node, str) or not node[1] or used + len(flat) + tail <= _WIDTH:
        return flat
    prefix, entries = node
    pad = indent + "    "
    lines = []
    for i, (key, value) in enumerate(entries):
        after = tail + 1 if i == len(entries) - 1 else 1
        lines.append(f"{pad}{key}: {_render(value, pad, len(pad) + len(key) + 2, after)}")
    return prefix + "{\n" + ",\n".join(lines) + "}"


def compact_repr(obj: Any) -> str:
    """The compact repr of a tensordict, lazy stack or tensorclass instance ``obj``.

    >>> from tdshare import TensorDict
    >>> compact_repr(TensorDict(a=torch.zeros(4, 3), s="x", batch_size=[4]))
    'TensorDict(batch_size=[4], fields={a: f32[3], s: str})'
    """
    header = [f"batch_size=[{','.join(map(str, obj.batch_size))}]"]
    if obj.device is not None:
        header.append(f"device={obj.device}")
    exclusive: list[tuple[str, Any]] = []
    members = obj._lazy_members() if _is_collection(obj) else None
    if members is not None:
        header.append(f"stack_dim={obj.stack_dim}")
        shared = set(obj.keys())
        for i, member in enumerate(members):
            own = [k for k in member.keys() if k not in shared]
            if own:
                exclusive.append((str(i), ("", _entries(member, own))))
    head = f"{type(obj).__name__}(" + "".join(f"{h}, " for h in header) + "fields="
    tail = 1 + len(", exclusive_fields={") if exclusive else 1
    out = head + _render(("", _body(obj)), "", len(head), tail)
    if exclusive:
        used = len(out.rsplit("\n", 1)[-1]) + len(", exclusive_fields=")
        out += ", exclusive_fields=" + _render(("", exclusive), "", used, 1)
    return out + ")"
