"""``from_pytree`` / ``to_pytree``: a pytree (nested lists, tuples, named tuples and dicts of
tensors) as a tensordict, and back, as a mixin of :class:`~tdshare.TensorDictBase`.

Each list, tuple, named tuple or dict becomes a nested level that records its type under
``"_pytree_type"`` (a non-tensor entry): a sequence's items are keys ``"0"``, ``"1"``...; a dict's
string keys stay keys, any other key is kept in a level ``{"key": ..., "value": ...}`` under a
generated name.  Numbers and arrays become tensors; tensors and tensor collections stay as they are.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import torch

from ._errors import InvalidArgumentError
from ._nontensor import NonTensorData

__all__ = ["PytreeOps"]

_TYPE = "_pytree_type"
_OTHER_KEY = "<NON_NESTED>"


def _to_level(level: Any, tree: Any) -> Any:
    if isinstance(tree, torch.Tensor) or hasattr(tree, "batch_size"):
        return tree
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a named tuple
        source: dict[str, Any] = {name: _to_level(level, getattr(tree, name)) for name in tree._fields}
    elif isinstance(tree, (list, tuple)):
        source = {str(i): _to_level(level, item) for i, item in enumerate(tree)}
    elif isinstance(tree, Mapping):
        source = {}
        for key, item in tree.items():
            if isinstance(key, str):
                source[key] = _to_level(level, item)
            else:
                pair = level(value=_to_level(level, item))
                pair.set("key", key if isinstance(key, torch.Tensor) else NonTensorData(key))
                source[f"{_OTHER_KEY}{uuid.uuid4()}"] = pair
    else:
        try:
            return torch.as_tensor(tree)
        except (TypeError, RuntimeError, ValueError):
            raise InvalidArgumentError(
                f"from_pytree: a leaf of type {type(tree).__name__} is not a tensor, number or array; "
                "convert it first, or store it with set_non_tensor()."
            ) from None
    out = level(source)
    out.set_non_tensor(_TYPE, type(tree))
    return out


def _from_level(td: Any) -> Any:
    if not hasattr(td, "batch_size") or isinstance(td, NonTensorData) or _TYPE not in td.keys():
        return td.data if isinstance(td, NonTensorData) else td
    kind = td.get_non_tensor(_TYPE)
    items: dict[str, Any] = {}
    pairs: list[tuple[Any, Any]] = []
    for key in td.keys():
        if key == _TYPE:
            continue
        value = td.get(key)
        if key.startswith(_OTHER_KEY):
            other = value.get("key")
            pairs.append((other.data if isinstance(other, NonTensorData) else other, _from_level(value.get("value"))))
        else:
            items[key] = _from_level(value)
    if hasattr(kind, "_fields"):
        return kind(**items)
    if issubclass(kind, (list, tuple)):
        return kind([items[str(i)] for i in range(len(items))])
    out = {**items, **dict(pairs)}
    return out if kind is dict else kind(out)


class PytreeOps:
    """``from_pytree`` and ``to_pytree``; the host provides the level class and the accessors."""

    @classmethod
    def from_pytree(
        cls, pytree: Any, *, batch_size: Any = None, auto_batch_size: bool = False, batch_dims: int | None = None
    ) -> Any:
        """A tensordict holding ``pytree``, which :meth:`to_pytree` converts back.

        Args:
            pytree: nested lists, tuples, named tuples and dicts whose leaves are tensors, tensor
                collections, numbers or arrays.
            batch_size: the batch size of the result (default ``[]``).
            auto_batch_size: find the largest batch size all entries share.
            batch_dims: with ``auto_batch_size``, the most batch dims to find.

        Returns:
            The tensordict (a tensor or tensor collection given alone comes back as is).

        Raises:
            InvalidArgumentError: a leaf that is not a tensor, number or array.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict.from_pytree({"a": torch.zeros(3), "b": (torch.ones(3), torch.ones(3, 2))})
        >>> td["b", "1"].shape, type(td.to_pytree()["b"]).__name__
        (torch.Size([3, 2]), 'tuple')
        """
        level: Any = cls._level_class()  # type: ignore[attr-defined]
        out = _to_level(level, pytree)
        if batch_size is not None and hasattr(out, "batch_size"):
            out.batch_size = batch_size
        elif auto_batch_size and hasattr(out, "auto_batch_size_"):
            out.auto_batch_size_(batch_dims)
        return out

    def to_pytree(self) -> Any:
        """The pytree that :meth:`from_pytree` made this tensordict from (this tensordict otherwise).

        Returns:
            The lists, tuples, named tuples and dicts rebuilt, with the tensors as leaves.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict.from_pytree([torch.zeros(1), {"x": torch.ones(1)}]).to_pytree()
        [tensor([0.]), {'x': tensor([1.])}]
        """
        return _from_level(self)
