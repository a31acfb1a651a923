"""Questions about the entries and the device of every tensor collection, without copying data:
``get_at``, ``get_item_shape``, ``is_non_tensor``, ``non_tensor_items``, ``size``,
``is_contiguous``, ``is_cpu``/``is_cuda``/``is_meta``, and the device bookkeeping
``auto_device_``/``clear_device_`` (plus ``new_tensor`` and ``record_stream``, which follow the
leaves).  A mixin of :class:`tdshare._tensordict_base.TensorDictBase`; a tensorclass reaches them
through its forwarding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import torch

from ._errors import DimensionError, MissingKeyError
from ._key_ops import collection_of, inner_collection, leaves
from ._keys import NestedKey, unravel_key
from ._nontensor import NonTensorData, NonTensorStack

__all__ = ["EntryQueryOps"]

T = TypeVar("T", bound="EntryQueryOps")
_NO_DEFAULT: Any = object()


class EntryQueryOps:
    """Entry and device queries shared by every container kind (see the module docstring)."""

    def get_at(self, key: NestedKey, index: Any = None, default: Any = _NO_DEFAULT, **kwargs: Any) -> Any:
        """The entry at ``key`` indexed with ``index``: ``td.get(key)[index]``.

        A lazy stack indexes first and reads the entry of the selected members only.

        Args:
            key: the key (or nested key) to read.
            index: an index of the entry's leading (batch) dimensions: an int, slice, tensor or tuple.
            default: returned when ``key`` is missing (default None, as :meth:`get`).

        Returns:
            The indexed tensor, tensordict or ``NonTensorData``, or ``default``.

        Raises:
            InvalidArgumentError: without a default, the nested key runs through a leaf.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(x=torch.arange(3), batch_size=[3])
        >>> td.get_at("x", 1), td.get_at("x", torch.tensor([True, False, True])).tolist(), td.get_at("y", 1)
        (tensor(1), [0, 2], None)
        """
        index = kwargs.pop("idx", index)
        if kwargs:
            raise TypeError(f"get_at() got unexpected keyword arguments {sorted(kwargs)}.")
        td: Any = self
        if td._stack_parts() is not None and td._get_leaf(unravel_key(key), None) is not None:
            return td[index].get(key)  # only the selected members are read
        value = td.get(key) if default is _NO_DEFAULT else td.get(key, _NO_DEFAULT)
        if value is None or value is _NO_DEFAULT:
            return None if default is _NO_DEFAULT else default
        if isinstance(value, NonTensorData) and not isinstance(value, NonTensorStack):
            return value  # one value for the whole batch: every index holds it
        return value[index]

    def get_item_shape(self, key: NestedKey) -> torch.Size:
        """The shape of the entry at ``key``, without stacking a lazy stack's members.

        A dimension whose size differs across a lazy stack's members is ``-1``; a non-tensor or
        nested entry has its batch size as shape.

        Raises:
            MissingKeyError: no entry at ``key`` (a ``KeyError``).

        >>> import torch
        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> LazyStackedTensorDict(TensorDict(x=torch.zeros(2)), TensorDict(x=torch.zeros(3))).get_item_shape("x")
        torch.Size([2, -1])
        """
        td: Any = self
        parts = unravel_key(key)
        stack = td._stack_parts()
        if stack is None:
            leaf = td._get_leaf(parts)
            if isinstance(leaf, NonTensorData) and not isinstance(leaf, NonTensorStack):
                return td._get_leaf(parts[:-1]).batch_size if len(parts) > 1 else td.batch_size
            return torch.Size(leaf.shape)
        members, dim = stack
        shapes = [list(m.get_item_shape(parts)) for m in members]
        if len({len(s) for s in shapes}) != 1:
            raise MissingKeyError(f"get_item_shape: the entry {key!r} has a different number of dims across members.")
        merged = [s[0] if all(x[i] == s[0] for x in shapes) else -1 for i, s in enumerate(zip(*shapes, strict=True))]
        merged.insert(dim, len(members))
        return torch.Size(merged)

    def is_non_tensor(self, key: NestedKey) -> bool:
        """Whether the entry stored at ``key`` is non-tensor data (``NonTensorData`` or a stack of it).

        Unlike :func:`tdshare.is_non_tensor`, which looks at a value, this looks at the stored entry:
        a tensorclass's field reads as its content, but is stored as ``NonTensorData``.

        Raises:
            MissingKeyError: no entry at ``key`` (a ``KeyError``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(obs=torch.zeros(4)).set_non_tensor("label", "cat")
        >>> td.is_non_tensor("label"), td.is_non_tensor("obs")
        (True, False)
        """
        td: Any = self
        if td._stack_parts() is not None:
            members = td._stack_parts()[0]
            return bool(members) and all(m.is_non_tensor(key) for m in members)
        return isinstance(td._get_leaf(unravel_key(key)), NonTensorData)

    def non_tensor_items(self, include_nested: bool = False) -> tuple[tuple[Any, Any], ...]:
        """The ``(key, NonTensorData)`` pairs of the non-tensor entries, in key order.

        Args:
            include_nested: also those of nested tensordicts (and tensorclasses), under tuple keys.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), s="text", nested=TensorDict(t="more"))
        >>> [key for key, _ in td.non_tensor_items(include_nested=True)], td.non_tensor_items()[0][1].data
        (['s', ('nested', 't')], 'text')
        """
        td: Any = self
        found = []
        for key in td.keys(include_nested, leaves_only=True):
            if td.is_non_tensor(key):
                found.append((key, td.get(key)))
        return tuple(found)

    def size(self, dim: int | None = None) -> Any:
        """The batch size, or the size of the batch dimension ``dim``.

        Raises:
            DimensionError: ``dim`` is not a batch dimension (an ``IndexError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(batch_size=[3, 4])
        >>> td.size(), td.size(-1)
        (torch.Size([3, 4]), 4)
        """
        td: Any = self
        if dim is None:
            return td.batch_size
        if not -td.batch_dims <= dim < td.batch_dims:
            raise DimensionError(
                f"size({dim}): the tensordict has {td.batch_dims} batch dimension(s) {list(td.batch_size)}; pass a "
                f"dim in [{-td.batch_dims}, {td.batch_dims})."
            )
        return td.batch_size[dim]

    def is_contiguous(self) -> bool:
        """Whether every tensor leaf, nested ones included, is contiguous; a lazy stack, whose leaves
        are built when read, is never.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(3)).is_contiguous(), TensorDict(a=torch.zeros(3, 2).t()).is_contiguous()
        (True, False)
        """
        if _has_lazy(self):
            return False
        return all(t.is_contiguous() for _, t in leaves(self) if isinstance(t, torch.Tensor))

    @property
    def is_cpu(self) -> bool:
        """Whether the tensordict's device is the CPU (False when it has no device).

        >>> from tdshare import TensorDict
        >>> TensorDict(device="cpu").is_cpu, TensorDict().is_cpu
        (True, False)
        """
        return _device_type(self) == "cpu"

    @property
    def is_cuda(self) -> bool:
        """Whether the tensordict's device is a CUDA device (False when it has no device).

        >>> from tdshare import TensorDict
        >>> TensorDict(device="cpu").is_cuda
        False
        """
        return _device_type(self) == "cuda"

    @property
    def is_meta(self) -> bool:
        """Whether the tensordict's device is the meta device (False when it has no device).

        >>> from tdshare import TensorDict
        >>> TensorDict(device="meta").is_meta
        True
        """
        return _device_type(self) == "meta"

    def auto_device_(self: T) -> T:
        """Set the device of the tensordict (and its nested ones) to its leaves' device if they all
        share one, else to None; the leaves do not move.  Returns ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> td.device, td.auto_device_().device
        (None, device(type='cpu'))
        """
        devices = {t.device for _, t in leaves(self) if isinstance(t, torch.Tensor)}
        device = devices.pop() if len(devices) == 1 else None
        _set_device(self, device)
        return self

    def clear_device_(self: T) -> T:
        """Set the device of the tensordict and its nested ones to None (the leaves stay where they
        are, and leaves on any device can then be set).  Returns ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3], device="cpu").clear_device_()
        >>> td.device, td["a"].device
        (None, device(type='cpu'))
        """
        _set_device(self, None)
        return self

    def new_tensor(
        self,
        data: Any,
        *,
        dtype: torch.dtype | None = None,
        device: Any = _NO_DEFAULT,
        requires_grad: bool = False,
        pin_memory: bool = False,
    ) -> Any:
        """A tensordict whose every tensor leaf is ``leaf.new_tensor(data)``: a copy of ``data`` with
        the leaf's dtype (or ``dtype``); the batch size is ``data``'s shape.  With a tensor collection
        as ``data``, each leaf copies the matching leaf of ``data``.

        Args:
            data: a tensor, tensor collection, NumPy array, sequence or number.
            dtype: the dtype of every leaf (default: each leaf's own).
            device: the device of the result (default: ``data``'s, the default device for Python data).
            requires_grad: record operations on the new leaves.
            pin_memory: allocate the new leaves in pinned memory (needs an accelerator).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), b=torch.zeros(3, dtype=torch.int64), batch_size=[3])
        >>> out = td.new_tensor([1, 2])
        >>> out.batch_size, out["a"], out["b"]
        (torch.Size([2]), tensor([1., 2.]), tensor([1, 2]))
        """
        td: Any = self
        options: dict[str, Any] = {"requires_grad": requires_grad}
        if device is not _NO_DEFAULT:
            options["device"] = device

        def each(leaf: torch.Tensor, source: Any) -> torch.Tensor:
            out = leaf.new_tensor(source, dtype=dtype or leaf.dtype, **options)
            return out.pin_memory() if pin_memory else out

        if inner_collection(data) is not None:
            return td.apply(each, data, batch_size=data.batch_size)
        shape = torch.as_tensor(data).shape if not isinstance(data, torch.Tensor) else data.shape
        out_device = options.get("device", data.device if isinstance(data, torch.Tensor) else None)
        return td.apply(
            lambda leaf: each(leaf, data),
            batch_size=shape,
            device=out_device if out_device is not None else torch.get_default_device(),
        )

    def record_stream(self: T, stream: Any) -> T:
        """Mark every tensor leaf as used by the CUDA ``stream`` (``Tensor.record_stream``); returns ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2))
        >>> td.record_stream(torch.cuda.current_stream()) is td if torch.cuda.is_available() else True
        True
        """
        for _, t in leaves(self):
            if isinstance(t, torch.Tensor):
                t.record_stream(stream)
        return self


def _device_type(td: Any) -> str | None:
    device = td.device
    return None if device is None else torch.device(device).type


def _has_lazy(td: Any) -> bool:
    if td._stack_parts() is not None:
        return True
    return any(_has_lazy(node) for node in _nodes(td))


def _nodes(td: Any) -> Iterator[Any]:
    for key in td.keys():
        node = collection_of(td._get_leaf((key,)))
        if node is not None:
            yield node


def _set_device(td: Any, device: torch.device | None) -> None:
    def put(node: Any) -> None:
        if node._stack_parts() is None:
            node._device = device

    td._propagate(put)
