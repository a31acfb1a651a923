"""Conversions of every tensor collection to and from plain Python: dicts (``from_dict``,
``to_dict``), nested lists (``tolist``), named tuples and ``fromkeys``.  A mixin of
:class:`tdshare._tensordict_base.TensorDictBase`; nested tensorclasses convert as their fields.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ._errors import ArgumentTypeError, InvalidArgumentError, NotSupportedError
from ._indexing import as_size
from ._key_ops import inner_collection, is_node
from ._keys import NestedKey, unravel_key
from ._nontensor import NonTensorData, NonTensorStack

__all__ = ["ConversionOps"]


class ConversionOps:
    """Conversions to and from dicts, lists and named tuples; the host provides the accessors."""

    @classmethod
    def from_dict(
        cls,
        input_dict: Mapping[Any, Any] | Any,
        *,
        auto_batch_size: bool | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
        device: torch.device | str | None = None,
        batch_dims: int | None = None,
        names: Sequence[str | None] | None = None,
    ) -> Any:
        """A tensordict of the (nested) dict ``input_dict``; nested dicts become nested tensordicts.

        Args:
            input_dict: a mapping (keys may be tuples) or a tensordict.
            auto_batch_size: find the largest batch size all entries share (``batch_dims`` limits it).
            batch_size: the batch size of every level (not with ``batch_dims``).
            device: the device of the result.
            batch_dims: the number of batch dims to find (implies ``auto_batch_size``).
            names: the batch dims' names.

        Raises:
            InvalidArgumentError: both ``batch_size`` and ``batch_dims``.

        >>> from tdshare import TensorDict
        >>> TensorDict.from_dict({"a": torch.zeros(3, 4), "b": {"c": torch.zeros(3)}}, auto_batch_size=True).batch_size
        torch.Size([3])
        """
        if batch_size is not None and batch_dims is not None:
            raise InvalidArgumentError("from_dict: pass batch_size or batch_dims, not both.")
        level: Any = cls._level_class()  # type: ignore[attr-defined]
        out = _build_from_dict(level, input_dict, None if batch_size is None else as_size(batch_size), device)
        if batch_size is None and (auto_batch_size or batch_dims is not None):
            _auto_batch(out, batch_dims)
        if names is not None:
            out.names = names
        return out

    def auto_batch_size_(self, batch_dims: int | None = None) -> Any:
        """Set the batch size to the longest one the entries share, in place (nested levels first).

        Tensors and ``NonTensorStack`` entries count; single non-tensor values (``NonTensorData``,
        ``MetaData``) and ``UnbatchedTensor`` entries have no batch and do not constrain it.

        Args:
            batch_dims: keep at most this many batch dimensions (None: as many as shared).

        Returns:
            ``self``.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(3, 4), b=torch.zeros(3)).auto_batch_size_().batch_size
        torch.Size([3])
        """
        _auto_batch(self, batch_dims)
        return self

    def from_dict_instance(
        self,
        input_dict: Mapping[Any, Any],
        *,
        auto_batch_size: bool | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
        device: torch.device | str | None = None,
        batch_dims: int | None = None,
        names: Sequence[str | None] | None = None,
    ) -> Any:
        """Like :meth:`from_dict`, with this instance's classes for nested entries it holds.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.from_dict_instance({"a": torch.ones(2)}, auto_batch_size=True).batch_size
        torch.Size([2])
        """
        td: Any = self
        kwargs = {
            "auto_batch_size": auto_batch_size,
            "batch_size": batch_size,
            "device": device,
            "batch_dims": batch_dims,
        }
        converted: dict[Any, Any] = {}
        for key, value in input_dict.items():
            mine = td.get(key, None) if isinstance(key, (str, tuple)) and key in td else None
            if isinstance(value, Mapping) and mine is not None and _is_wrapped(mine):
                value = _instance_from_dict(mine, value)  # through the class: its field options apply
            elif isinstance(value, Mapping) and mine is not None and hasattr(mine, "from_dict_instance"):
                value = mine.from_dict_instance(value, **kwargs)
            converted[key] = value
        return type(self).from_dict(converted, names=names, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def from_list(
        cls,
        input: Sequence[Any],
        *,
        auto_batch_size: bool | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
        device: torch.device | str | None = None,
        batch_dims: int | None = None,
        names: Sequence[str | None] | None = None,
        lazy: bool | None = None,
    ) -> Any:
        """A tensordict stacking the dicts (or tensor collections) of ``input`` along a new first dim.

        Each dict goes through :meth:`from_dict` (with ``batch_size[1:]``, ``auto_batch_size``,
        ``batch_dims - 1``); a tensordict or tensorclass in the list is stacked as it is.

        Args:
            input: the dicts or tensor collections, at least one.
            auto_batch_size: give each element the longest leading shape its entries share.
            batch_size: the result's batch size, the list's length first.
            device: the device of the result (its leaves are moved there).
            batch_dims: at most this many batch dims in the result (the list's included); turns
                ``auto_batch_size`` on when it is None.  Not with ``batch_size``.
            names: the names of the result's batch dims, the list's first.
            lazy: ``True`` a lazy stack, ``False`` a dense one; None: dense when the elements share
                keys and shapes, lazy otherwise.

        Raises:
            InvalidArgumentError: ``batch_size[0]`` is not the list's length, both ``batch_size`` and
                ``batch_dims``, or an empty list (a ``ValueError``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> rows = [{"a": torch.zeros(3)}, {"a": torch.ones(3)}]
        >>> td = TensorDict.from_list(rows, batch_size=[2, 3], names=["x", "y"])
        >>> td.batch_size, td.names
        (torch.Size([2, 3]), ['x', 'y'])
        """
        if batch_size is not None and batch_dims is not None:
            raise InvalidArgumentError("from_list: pass batch_size or batch_dims, not both.")
        items = list(input)
        if not items:
            raise InvalidArgumentError("from_list needs at least one element to stack; got an empty list.")
        size = None if batch_size is None else as_size(batch_size)
        if size is not None and (not size or size[0] != len(items)):
            raise InvalidArgumentError(
                f"from_list: the batch size {list(size)} does not match the length of the list ({len(items)}); "
                "its first dimension is the list's."
            )
        level: Any = cls._level_class()  # type: ignore[attr-defined]
        options: dict[str, Any] = {"auto_batch_size": auto_batch_size}
        if size is not None:
            options["batch_size"] = size[1:]
        if batch_dims is not None:
            options["batch_dims"] = max(batch_dims - 1, 0)
        elements = [
            level.from_dict(item, **options) if isinstance(item, Mapping) and inner_collection(item) is None else item
            for item in items
        ]
        if lazy:
            out = level.lazy_stack(elements)
        elif lazy is None:
            out = level.maybe_dense_stack(elements)
        else:
            out = torch.stack(elements)
        if device is not None:
            out = out.to(device)
        if names is not None:
            out.names = names
        return out

    @classmethod
    def from_schema(
        cls,
        schema: Mapping[NestedKey, tuple[Sequence[int] | torch.Size, torch.dtype]],
        *,
        batch_size: Sequence[int] | torch.Size | None = None,
        storage: str | None = None,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> Any:
        """A zero-filled tensordict with an entry ``[*batch_size, *shape]`` of ``dtype`` for each
        ``key: (shape, dtype)`` of ``schema``, stored where ``storage`` says.

        Args:
            schema: each key (a string or nested key) to its ``(element_shape, dtype)``.
            batch_size: the batch size, before every element shape (default ``[]``).
            storage: None (ordinary tensors), ``"memmap"`` (files in ``prefix=``, made by
                :meth:`memmap_like`: sparse, nothing of the data's size is allocated; without a
                prefix, anonymous shared memory) or ``"shared"`` (``share_memory_``).  The
                reference's ``"h5"``, ``"zarr"``, ``"redis"`` and ``"dragonfly"`` backends are not
                in tdshare.
            device: the device of the result (``"memmap"`` ignores it).
            **kwargs: for ``"memmap"``, the arguments of :meth:`memmap_like` (``prefix``,
                ``existsok``, ``num_threads``...).

        Returns:
            A new zero-filled :class:`tdshare.TensorDict`.

        Raises:
            InvalidArgumentError: an unknown ``storage`` ("Unknown storage backend"), or keywords
                that storage does not take (a ``ValueError``).
            NotSupportedError: a storage backend of the reference that tdshare does not have.
            ArgumentTypeError: a schema entry that is not an ``(element_shape, dtype)`` pair.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> schema = {"obs": ([84, 84, 3], torch.uint8), "reward": ([], torch.float32)}
        >>> td = TensorDict.from_schema(schema, batch_size=[1000])
        >>> td["obs"].shape, td["reward"].dtype
        (torch.Size([1000, 84, 84, 3]), torch.float32)
        """
        if storage not in (None, "memmap", "shared"):
            if storage in ("h5", "zarr", "redis", "dragonfly"):
                raise NotSupportedError(
                    f"from_schema(storage={storage!r}): tdshare has no {storage} backend; use storage='memmap' (files) "
                    "or 'shared' (shared memory)."
                )
            raise InvalidArgumentError(
                f"Unknown storage backend {storage!r} for from_schema: pass None, 'memmap' or 'shared'."
            )
        if kwargs and storage != "memmap":
            raise InvalidArgumentError(
                f"from_schema(storage={storage!r}) takes no further keywords, got {sorted(kwargs)}; they are for "
                "storage='memmap' (the arguments of memmap_like)."
            )
        batch = torch.Size([]) if batch_size is None else as_size(batch_size)
        level: Any = cls._level_class()  # type: ignore[attr-defined]
        out = level({}, batch_size=batch, device=None if storage == "memmap" else device)
        for key, entry in schema.items():
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[1], torch.dtype)):
                raise ArgumentTypeError(
                    f"from_schema: the entry of {key!r} must be a pair (element_shape, dtype), got {entry!r}."
                )
            shape = (*batch, *as_size(entry[0]))
            if storage == "memmap":  # a zero broadcast: memmap_like makes the file without writing it
                value = torch.zeros((), dtype=entry[1]).expand(shape)
            else:
                value = torch.zeros(shape, dtype=entry[1], device=device)
            out.set(key, value)
        if storage == "memmap":
            return out.memmap_like(**kwargs)
        if storage == "shared":
            out.share_memory_()
        return out

    @classmethod
    def fromkeys(cls, keys: Sequence[NestedKey], value: Any = 0) -> Any:
        """A tensordict of batch size ``[]`` with ``value`` at each of ``keys``.

        >>> from tdshare import TensorDict
        >>> TensorDict.fromkeys(["a", ("b", "c")], 1)["b", "c"].item()
        1
        """
        out: Any = cls._level_class()()  # type: ignore[attr-defined]
        for key in keys:
            out.set(key, value)
        return out

    def to_dict(
        self, *, retain_none: bool = True, convert_tensors: bool | str = False, tolist_first: bool = False
    ) -> dict[str, Any]:
        """A plain nested dict of the entries; non-tensor leaves give their values.

        Args:
            retain_none: keep entries whose value is None (else they are left out).
            convert_tensors: ``True`` turns tensors into lists, ``"numpy"`` into arrays.
            tolist_first: a nested tensordict with batch dims of its own beyond this one's becomes
                nested lists too (instead of one dict of tensors).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), n={"b": torch.zeros(2)}, batch_size=[2]).to_dict(convert_tensors=True)
        {'a': [1.0, 1.0], 'n': {'b': [0.0, 0.0]}}
        """
        _check_convert(convert_tensors)
        td: Any = self
        out: dict[str, Any] = {}
        for key in td.keys():
            value = td._get_leaf((key,))
            inner = inner_collection(value)
            if inner is not None and tolist_first and inner.batch_dims > td.batch_dims:
                out[key] = inner.tolist(convert_tensors=convert_tensors, tolist_first=True)
                continue
            if inner is not None:
                out[key] = inner.to_dict(
                    retain_none=retain_none, convert_tensors=convert_tensors, tolist_first=tolist_first
                )
                continue
            if isinstance(value, NonTensorData):
                value = value.data
            if value is None and not retain_none:
                continue
            out[key] = _convert_tensor(value, convert_tensors)
        return out

    def tolist(
        self,
        *,
        convert_nodes: bool = True,
        convert_tensors: bool | str = False,
        tolist_first: bool = False,
        as_linked_list: bool = False,
    ) -> Any:
        """Nested lists along the batch dims; each element a dict (``convert_nodes``) or a tensordict.

        Args:
            convert_nodes: give each element as a plain dict (see :meth:`to_dict`).
            convert_tensors: turn the tensors into lists (``"numpy"``: arrays); needs ``convert_nodes``.
            tolist_first: a nested tensordict with more batch dims than its parent becomes nested
                lists of dicts too (instead of one dict of tensors); see :meth:`to_dict`.
            as_linked_list: not supported.

        Raises:
            ArgumentTypeError: ``convert_tensors`` without ``convert_nodes`` (a ``TypeError``).
            NotSupportedError: ``as_linked_list=True``.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(2), batch_size=[2]).tolist(convert_tensors=True)
        [{'a': 0}, {'a': 1}]
        """
        if convert_tensors and not convert_nodes:
            raise ArgumentTypeError(
                "tolist: convert_tensors=True needs convert_nodes=True (tensors inside tensordicts stay tensors)."
            )
        if as_linked_list:
            raise NotSupportedError("tolist(as_linked_list=True) is not supported; use the nested lists.")
        td: Any = self
        if not td.batch_dims:
            return td.to_dict(convert_tensors=convert_tensors, tolist_first=tolist_first) if convert_nodes else td
        return [
            sub.tolist(convert_nodes=convert_nodes, convert_tensors=convert_tensors, tolist_first=tolist_first)
            if sub.batch_dims or convert_nodes
            else sub
            for sub in td.unbind(0)
        ]

    def to_namedtuple(self, dest_cls: type | None = None) -> Any:
        """The entries as a named tuple (nested tensordicts as nested named tuples).

        Args:
            dest_cls: the named-tuple class of the top level (default: one named ``GenericDict``).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2), batch_size=[2]).to_namedtuple().a.tolist()
        [0.0, 0.0]
        """
        td: Any = self
        values = {}
        for key in td.keys():
            value = td._get_leaf((key,))
            inner = inner_collection(value)
            values[key] = (
                inner.to_namedtuple()
                if inner is not None
                else (value.data if isinstance(value, NonTensorData) else value)
            )
        cls = dest_cls if dest_cls is not None else collections.namedtuple("GenericDict", list(values))
        return cls(**values)

    @classmethod
    def from_namedtuple(
        cls,
        named_tuple: Any,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device: torch.device | str | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
    ) -> Any:
        """A tensordict of a (nested) named tuple (see :meth:`from_dict` for the arguments).

        >>> from tdshare import TensorDict
        >>> nt = TensorDict(a=torch.zeros(2), batch_size=[2]).to_namedtuple()
        >>> TensorDict.from_namedtuple(nt, auto_batch_size=True).batch_size
        torch.Size([2])
        """

        def as_dict(value: Any) -> Any:
            if isinstance(value, tuple) and hasattr(value, "_fields"):
                return {k: as_dict(getattr(value, k)) for k in value._fields}
            return value

        return cls.from_dict(
            as_dict(named_tuple),
            auto_batch_size=auto_batch_size,
            batch_dims=batch_dims,
            device=device,
            batch_size=batch_size,
        )


def _check_convert(convert_tensors: Any) -> None:
    if convert_tensors not in (True, False, "numpy"):
        raise InvalidArgumentError(f"convert_tensors must be True, False or 'numpy', got {convert_tensors!r}.")


def _convert_tensor(value: Any, how: bool | str) -> Any:
    if not how or not isinstance(value, torch.Tensor):
        return value
    return value.numpy() if how == "numpy" else value.tolist()


def _build_from_dict(level: Any, source: Any, batch: torch.Size | None, device: Any) -> Any:
    out = level(batch_size=batch if batch is not None else [], device=device)
    items = source.items() if not is_node(source) else [(k, source.get(k)) for k in source.keys()]
    for key, value in items:
        parts = unravel_key(key)
        if isinstance(value, Mapping) and not isinstance(value, NonTensorData):
            existing = out._get_leaf(parts, None)
            sub = _build_from_dict(level, value, batch, device)
            if is_node(existing):
                existing.update(sub)
            else:
                _set_path(out, parts, sub, level, batch, device)
            continue
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            try:
                value = torch.as_tensor(value)
            except (TypeError, ValueError, RuntimeError):
                pass
        _set_path(out, parts, value, level, batch, device)
    return out


def _set_path(out: Any, parts: tuple[str, ...], value: Any, level: Any, batch: torch.Size | None, device: Any) -> None:
    node = out
    for part in parts[:-1]:
        child = node._get_leaf((part,), None)
        if child is None:
            child = level(batch_size=batch if batch is not None else [], device=device)
            node._tensordict[part] = child
        node = child
    if batch is None:
        node._tensordict[parts[-1]] = node._convert(parts[-1], value)
    else:
        node.set(parts[-1], value)


def _is_wrapped(value: Any) -> bool:
    """Whether ``value`` is a tensorclass instance (a collection that wraps a tensordict)."""
    return inner_collection(value) is not None and not is_node(value)


def _instance_from_dict(instance: Any, fields: Mapping[Any, Any]) -> Any:
    """A new instance of ``instance``'s tensorclass built from the dict ``fields`` by its constructor
    (so ``autocast`` and the other field options apply), nested instances and dicts alike."""
    values: dict[str, Any] = {}
    for name, value in fields.items():
        current = getattr(instance, name, None)
        if isinstance(value, Mapping) and current is not None and _is_wrapped(current):
            value = _instance_from_dict(current, value)
        elif isinstance(value, Mapping) and current is not None and hasattr(current, "from_dict_instance"):
            value = current.from_dict_instance(value)
        values[name] = value
    return type(instance)(**values, batch_size=instance.batch_size)


def _auto_batch(td: Any, batch_dims: int | None) -> None:
    """Give ``td`` (and every nested level first) the longest batch size its entries share."""
    shapes = []
    for key in td.keys():
        value = td._get_leaf((key,))
        if is_node(value):
            _auto_batch(value, batch_dims)
            shapes.append(list(value.batch_size))
        elif isinstance(value, torch.Tensor) and not value.is_nested:
            shapes.append(list(value.shape))
        elif isinstance(value, NonTensorStack):  # one value per element: its batch counts
            shapes.append(list(value.batch_size))
    if not shapes:
        return
    common: list[int] = []
    for dims in zip(*shapes, strict=False):
        if len(set(dims)) != 1:
            break
        common.append(dims[0])
    common = common[: min(len(s) for s in shapes)]
    if batch_dims is not None:
        common = common[:batch_dims]
    td.batch_size = torch.Size(common)
