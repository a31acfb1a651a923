"""Conversions from arbitrary Python and NumPy objects: ``from_any`` (dicts, tuples, named tuples,
dataclasses, lists, structured arrays, recursively), ``from_tuple``, ``from_dataclass`` and the
NumPy structured-array pair ``from_struct_array``/``to_struct_array``.  A mixin of
:class:`tdshare._tensordict_base.TensorDictBase`.
"""

from __future__ import annotations

import dataclasses
from collections import UserDict
from collections.abc import Sequence
from typing import Any

import torch

from ._errors import ArgumentTypeError, InvalidArgumentError
from ._key_ops import inner_collection
from ._nontensor import NonTensorData, NonTensorStack

__all__ = ["AnyConversions"]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _is_struct_array(obj: Any) -> bool:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch's wheels
        return False
    return isinstance(obj, np.ndarray) and obj.dtype.names is not None


def _list_value(obj: list) -> Any:
    """A list becomes a tensor when ``torch.tensor`` takes it, else a ``NonTensorStack``."""
    try:
        return torch.tensor(obj)
    except (TypeError, ValueError, RuntimeError):
        pass
    try:
        return NonTensorStack.from_list(obj)
    except (TypeError, ValueError, RuntimeError):  # ragged nesting: one level of elements
        return NonTensorStack.from_list(obj, batch_size=[len(obj)])


def _convert(obj: Any) -> Any:
    """``obj`` with every container inside it turned into a mapping, list or leaf the constructor takes."""
    if isinstance(obj, torch.Tensor) or inner_collection(obj) is not None or isinstance(obj, NonTensorData):
        return obj
    if isinstance(obj, (dict, UserDict)):
        return {key: _convert(value) for key, value in obj.items()}
    if _is_struct_array(obj):
        return _struct_to_dict(obj)
    if _is_namedtuple(obj):
        return {name: _convert(getattr(obj, name)) for name in obj._fields}
    if isinstance(obj, tuple):
        return {str(i): _convert(value) for i, value in enumerate(obj)}
    if isinstance(obj, list):
        return _list_value(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _convert(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


def _struct_to_dict(array: Any) -> dict[str, Any]:
    """The fields of a structured array: numbers as tensors sharing its memory, strings as values."""
    out: dict[str, Any] = {}
    for name in array.dtype.names:
        column = array[name]
        if column.dtype.names is not None:
            out[name] = _struct_to_dict(column)
        elif column.dtype.kind in "USO":
            values = column.tolist()
            out[name] = NonTensorStack.from_list(values) if isinstance(values, list) else NonTensorData(values)
        else:
            out[name] = torch.from_numpy(column)
    return out


class AnyConversions:
    """``from_any`` and its helpers; the host class provides ``from_dict`` and the accessors."""

    @classmethod
    def from_any(
        cls,
        obj: Any,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device: torch.device | str | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
    ) -> Any:
        """Convert ``obj`` to a tensordict, recursively, choosing the conversion from its type.

        A dict (or ``UserDict``) gives its entries; a named tuple its fields; a tuple the keys
        ``"0"``, ``"1"``, ...; a dataclass instance its fields; a NumPy structured array its fields
        (see :meth:`from_struct_array`). The values inside are converted the same way. A list becomes
        a tensor when ``torch.tensor`` takes it, else a :class:`NonTensorStack`. Tensors and
        tensordicts come back as they are, any other object unchanged.

        Args:
            obj: the object to convert.
            auto_batch_size: find the largest batch size all entries share.
            batch_dims: with ``auto_batch_size``, the most batch dims to find.
            device: the device of the result.
            batch_size: the batch size of the result.

        Returns:
            A tensordict, a tensor or ``NonTensorStack`` (for a list), or ``obj`` itself.

        >>> import tdshare
        >>> td = tdshare.TensorDict.from_any({"a": (1, 2), "b": [[0, 1], [2, 3]]})
        >>> sorted(td.keys(True, True), key=str), td["b"].shape
        ([('a', '0'), ('a', '1'), 'b'], torch.Size([2, 2]))
        """
        if isinstance(obj, list):
            return _list_value(obj)
        converted = _convert(obj)
        if not isinstance(converted, dict):
            return converted
        host: Any = cls
        return host.from_dict(
            converted,
            auto_batch_size=auto_batch_size or None,
            batch_dims=batch_dims if auto_batch_size else None,
            device=device,
            batch_size=batch_size,
        )

    @classmethod
    def from_tuple(
        cls,
        obj: tuple,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device: torch.device | str | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
    ) -> Any:
        """A tensordict of a tuple, under the keys ``"0"``, ``"1"``, ... (see :meth:`from_any`).

        Raises:
            ArgumentTypeError: ``obj`` is not a tuple.

        >>> import torch, tdshare
        >>> tdshare.TensorDict.from_tuple((torch.zeros(2), torch.ones(2))).keys()
        ['0', '1']
        """
        if not isinstance(obj, tuple):
            raise ArgumentTypeError(f"from_tuple expects a tuple, got {type(obj).__name__}; use from_any.")
        return cls.from_any(
            tuple(obj), auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device, batch_size=batch_size
        )

    @classmethod
    def from_dataclass(
        cls,
        dataclass: Any,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device: torch.device | str | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
    ) -> Any:
        """A tensordict of the fields of a dataclass instance (nested values converted as :meth:`from_any`).

        Raises:
            ArgumentTypeError: ``dataclass`` is not a dataclass instance.

        >>> import dataclasses, torch, tdshare
        >>> @dataclasses.dataclass
        ... class Point:
        ...     x: torch.Tensor
        >>> tdshare.TensorDict.from_dataclass(Point(x=torch.zeros(3)), auto_batch_size=True).batch_size
        torch.Size([3])
        """
        if not dataclasses.is_dataclass(dataclass) or isinstance(dataclass, type):
            raise ArgumentTypeError(
                f"from_dataclass expects a dataclass instance, got {type(dataclass).__name__}; use from_any."
            )
        return cls.from_any(
            dataclass, auto_batch_size=auto_batch_size, batch_dims=batch_dims, device=device, batch_size=batch_size
        )

    @classmethod
    def from_struct_array(
        cls,
        struct_array: Any,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device: torch.device | str | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
    ) -> Any:
        """A tensordict of the fields of a NumPy structured array; its shape is the batch size.

        Numeric fields become tensors that share the array's memory (a write into one shows in the
        other); string fields become non-tensor values; nested fields become nested tensordicts.

        Args:
            struct_array: a structured ``numpy.ndarray`` (its dtype has field names).
            auto_batch_size, batch_dims, device: as in :meth:`from_any`.
            batch_size: the batch size (default: the array's shape).

        Raises:
            ArgumentTypeError: ``struct_array`` is not a structured array.

        >>> import numpy as np, tdshare
        >>> x = np.array([("Rex", 9), ("Fido", 3)], dtype=[("name", "U10"), ("age", "i4")])
        >>> td = tdshare.TensorDict.from_struct_array(x)
        >>> td.batch_size, td["age"].tolist(), list(td["name"])
        (torch.Size([2]), [9, 3], ['Rex', 'Fido'])
        """
        if not _is_struct_array(struct_array):
            raise ArgumentTypeError(
                f"from_struct_array expects a NumPy structured array, got {type(struct_array).__name__}."
            )
        host: Any = cls
        shape = None if auto_batch_size else (batch_size if batch_size is not None else struct_array.shape)
        return host.from_dict(
            _struct_to_dict(struct_array),
            auto_batch_size=auto_batch_size or None,
            batch_dims=batch_dims if auto_batch_size else None,
            device=device,
            batch_size=shape,
        )

    def to_struct_array(self) -> Any:
        """A NumPy structured array of the entries, shaped as the batch size (a copy).

        Tensors become fields of their dtype and feature shape, nested tensordicts nested fields,
        and string values ``U`` fields as long as the longest string.

        Returns:
            A ``numpy.ndarray`` with one field per entry.

        Raises:
            InvalidArgumentError: an entry that a structured array cannot hold (a non-string value).

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.arange(2), b=torch.zeros(2, 3), batch_size=[2])
        >>> arr = td.to_struct_array()
        >>> arr.dtype.names, arr["b"].shape
        (('a', 'b'), (2, 3))
        """
        import numpy as np

        td: Any = self
        dtype = _struct_dtype(td, td.batch_dims)
        out = np.empty(tuple(td.batch_size), dtype=dtype)
        _fill_struct(out, td, td.batch_dims)
        return out


def _struct_dtype(td: Any, ndim: int) -> list[tuple[Any, ...]]:
    fields: list[tuple[Any, ...]] = []
    for key in td.keys():
        value = td._get_leaf((key,))
        inner = inner_collection(value)
        if inner is not None:
            fields.append((key, _struct_dtype(inner, ndim)))
        elif isinstance(value, NonTensorData):
            strings = _strings(value, key)
            fields.append((key, f"U{max((len(s) for s in strings), default=1)}"))
        else:
            array = value.detach().cpu().numpy()
            fields.append((key, array.dtype, tuple(value.shape[ndim:])))
    return fields


def _strings(value: NonTensorData, key: str) -> list[str]:
    data = value.tolist() if isinstance(value, NonTensorStack) else [value.data]
    flat: list[Any] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        else:
            flat.append(item)
    if not all(isinstance(s, str) for s in flat):
        raise InvalidArgumentError(
            f"to_struct_array: the entry {key!r} holds non-string values, which a structured array cannot store; "
            "exclude it first (td.exclude(key))."
        )
    return flat


def _fill_struct(out: Any, td: Any, ndim: int) -> None:
    import numpy as np

    for key in td.keys():
        value = td._get_leaf((key,))
        inner = inner_collection(value)
        if inner is not None:
            _fill_struct(out[key], inner, ndim)
        elif isinstance(value, NonTensorStack):
            out[key] = np.array(value.tolist(), dtype=out.dtype[key])
        elif isinstance(value, NonTensorData):
            out[key] = value.data
        else:
            out[key] = value.detach().cpu().numpy()
