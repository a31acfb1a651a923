"""Entries without batch dimensions: :class:`UnbatchedTensor`, a tensor the batch leaves whole.

``TensorDict(table=UnbatchedTensor(torch.zeros(7, 11)), x=torch.zeros(3), batch_size=[3])`` holds
a ``(7, 11)`` entry in a tensordict of batch ``[3]``: its shape is not checked against the batch,
and the batch operations (indexing, ``reshape``, ``unsqueeze``, ``split``, ``gather``, stacking...)
give it back whole, sharing its memory.  Element-wise operations (``td.int()``, ``td.to(device)``,
``torch.ones_like(td)``) apply to it as to any tensor.

Inside a tensordict the tensor is held by an :class:`UnbatchedEntry` (a non-tensor value, so the
batch operations carry it over unchanged); reading the entry gives the tensor back with
``batch_size`` set to the batch of the tensordict it was read from (one alias per batch size,
so a tensordict that keeps its batch gives the very same object).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ._errors import BatchSizeError
from ._indexing import as_size
from ._nontensor import NonTensorData
from ._nontensor_ops import bind_owner

__all__ = ["UnbatchedEntry", "UnbatchedTensor", "is_unbatched", "share_unbatched", "surface_leaf"]

_EMPTY = torch.Size([])
_BASE_GETTER: Any = getattr(torch.Tensor._base, "__get__", None)  # reading ``._base`` is not rewrapped


class UnbatchedTensor(torch.Tensor):
    """A tensor entry that has no batch dimensions: the tensordict's batch operations leave it whole.

    Args:
        data: the payload (a tensor; anything else goes through :func:`torch.as_tensor`). The
            result shares its memory (``data_ptr()`` is the payload's).
        batch_size: the batch of the tensordict holding it (set by the tensordict when the entry
            is read; ``[]`` by default). It does not change the payload's shape.

    Operations on the tensor itself (arithmetic, ``clone``, ``to``) return ``UnbatchedTensor``
    results of the same batch size; Python conversions (``int``, ``float``, ``str``, ``format``,
    ``numpy``...) behave as they do for the payload.

    >>> from tdshare import UnbatchedTensor
    >>> import torch
    >>> from tdshare import TensorDict
    >>> td = TensorDict(a=UnbatchedTensor(torch.zeros(3, 4)), b=torch.zeros(2, 5), batch_size=[2])
    >>> td[0]["a"].shape, td.reshape(1, 2)["a"].batch_size
    (torch.Size([3, 4]), torch.Size([1, 2]))
    """

    _pass_through = True
    _carry: tuple[str, ...] = ()  # attributes that with_batch_size copies to the alias (subclasses)
    _batch_size: torch.Size

    @staticmethod
    def __new__(cls, data: Any, batch_size: Sequence[int] | torch.Size | None = None) -> UnbatchedTensor:
        if isinstance(data, UnbatchedTensor):
            if batch_size is None:
                return data
            data = data._payload()
        elif not isinstance(data, torch.Tensor):
            data = torch.as_tensor(data)
        out = torch.Tensor._make_subclass(cls, data, data.requires_grad)
        out._batch_size = as_size(batch_size) if batch_size is not None else _EMPTY
        return out

    def __init__(self, data: Any, batch_size: Sequence[int] | torch.Size | None = None) -> None:
        pass  # everything is set in __new__ (a torch.Tensor subclass)

    @property
    def batch_size(self) -> torch.Size:
        """The batch of the tensordict the tensor was read from (``torch.Size([])`` on its own).

        >>> from tdshare import TensorDict, UnbatchedTensor
        >>> td = TensorDict(a=UnbatchedTensor(torch.zeros(7)), b=torch.zeros(3, 2), batch_size=[3])
        >>> UnbatchedTensor(torch.zeros(7)).batch_size, td["a"].batch_size, td["a"].shape
        (torch.Size([]), torch.Size([3]), torch.Size([7]))
        """
        return getattr(self, "_batch_size", _EMPTY)

    @batch_size.setter
    def batch_size(self, value: Sequence[int] | torch.Size) -> None:
        self._batch_size = as_size(value)

    def with_batch_size(self, batch_size: Sequence[int] | torch.Size) -> UnbatchedTensor:
        """An alias of this tensor (same memory) whose ``batch_size`` is ``batch_size``.

        >>> from tdshare import UnbatchedTensor
        >>> UnbatchedTensor(torch.ones(2)).with_batch_size([3]).batch_size
        torch.Size([3])
        """
        out = type(self)(self._payload(), batch_size)
        for name in self._carry:  # what a subclass's alias must keep
            setattr(out, name, getattr(self, name))
        return out

    def _payload(self) -> torch.Tensor:
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.as_subclass(self, torch.Tensor)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict | None = None) -> Any:
        batch = _batch_of(args) if args else None
        if batch is None and kwargs:
            batch = _batch_of(list(kwargs.values()))
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*args, **(kwargs or {}))
        if func is torch.Tensor.data_ptr or func is _BASE_GETTER:
            return result
        return _rewrap(result, batch)

    # -- Python conversions behave as the payload's -------------------------------------------
    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        return f"UnbatchedTensor({self._payload()!r})"

    def __str__(self) -> str:
        return str(self._payload())

    def __format__(self, spec: str) -> str:
        return self._payload().__format__(spec)

    def __bool__(self) -> bool:
        return bool(self._payload())

    def __int__(self) -> int:
        return int(self._payload())

    def __float__(self) -> float:
        return float(self._payload())

    def __complex__(self) -> complex:
        return complex(self._payload())

    def __index__(self) -> int:
        return self._payload().__index__()

    def __round__(self, ndigits: int | None = None) -> Any:
        payload: Any = self._payload()
        return round(payload) if ndigits is None else round(payload, ndigits)

    def __trunc__(self) -> Any:
        payload: Any = self._payload()
        return math.trunc(payload)

    def __floor__(self) -> Any:
        return math.floor(self._payload())

    def __ceil__(self) -> Any:
        return math.ceil(self._payload())

    def __array__(self, dtype: Any = None) -> Any:
        return self._payload().__array__(dtype)

    def item(self) -> Any:
        """The single value of the payload as a Python number (as :meth:`torch.Tensor.item`).

        Raises:
            RuntimeError: the payload has more than one element (torch's error).

        >>> from tdshare import UnbatchedTensor
        >>> value = UnbatchedTensor(torch.tensor(3.5)).item()
        >>> value, type(value).__name__
        (3.5, 'float')
        """
        return self._payload().item()

    def tolist(self) -> Any:
        """The payload as nested Python lists (as :meth:`torch.Tensor.tolist`).

        >>> from tdshare import UnbatchedTensor
        >>> UnbatchedTensor(torch.arange(4).reshape(2, 2), batch_size=[5]).tolist()
        [[0, 1], [2, 3]]
        """
        return self._payload().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        """The payload as a numpy array (as :meth:`torch.Tensor.numpy`).

        Args:
            force: detach (and copy to the CPU) first, as torch's ``force``.

        Returns:
            A ``numpy.ndarray`` sharing the payload's memory (unless ``force`` copied it).

        Raises:
            RuntimeError: the payload requires grad (or is not on the CPU) and ``force`` is False (torch's error).

        >>> from tdshare import UnbatchedTensor
        >>> t = UnbatchedTensor(torch.zeros(3))
        >>> array = t.numpy()
        >>> array[0] = 5.0
        >>> type(array).__name__, t.tolist()
        ('ndarray', [5.0, 0.0, 0.0])
        """
        return self._payload().numpy(force=force)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (_rebuild, (self._payload(), tuple(self.batch_size)))


def _rebuild(payload: torch.Tensor, batch: tuple[int, ...]) -> UnbatchedTensor:
    return UnbatchedTensor(payload, batch)


def _batch_of(values: Sequence[Any]) -> torch.Size | None:
    for value in values:
        if isinstance(value, UnbatchedTensor):
            return value.batch_size
        if isinstance(value, (list, tuple)):
            found = _batch_of(value)
            if found is not None:
                return found
    return None


def _rewrap(result: Any, batch: torch.Size | None) -> Any:
    if isinstance(result, torch.Tensor):
        out = torch.Tensor._make_subclass(UnbatchedTensor, result, result.requires_grad)
        out._batch_size = _EMPTY if batch is None else batch
        return out
    if isinstance(result, (tuple, list)):
        return type(result)(_rewrap(r, batch) if isinstance(r, torch.Tensor) else r for r in result)
    return result


def is_unbatched(value: Any) -> bool:
    """Whether ``value`` is an :class:`UnbatchedTensor` or a tensordict's holder of one."""
    return isinstance(value, (UnbatchedTensor, UnbatchedEntry))


class UnbatchedEntry(NonTensorData):
    """How a tensordict holds an :class:`UnbatchedTensor`: a value the batch operations carry whole.

    ``data`` is the tensor; :meth:`for_batch` gives it with a batch size (one alias per size).

    >>> from tdshare import UnbatchedTensor
    >>> e = UnbatchedEntry(UnbatchedTensor(torch.ones(2)))
    >>> e.for_batch(torch.Size([3])).batch_size
    torch.Size([3])
    """

    __slots__ = ("_aliases",)
    _keeps_whole = True
    _tensor_payload = True

    def __init__(self, data: Any, *args: Any, **kwargs: Any) -> None:
        tensor = data if isinstance(data, UnbatchedTensor) else UnbatchedTensor(data)
        super().__init__(tensor)
        self._aliases: dict[torch.Size, UnbatchedTensor] = {tensor.batch_size: tensor}

    def for_batch(self, batch: torch.Size) -> UnbatchedTensor:
        """The tensor with ``batch_size`` ``batch`` (the same object for the same batch size)."""
        alias = self._aliases.get(batch)
        if alias is None:
            alias = self._aliases[batch] = self.data.with_batch_size(batch)
        return alias

    def clone(self) -> UnbatchedEntry:
        """A holder of the same tensor (the tensor is shared, as the batch operations share it)."""
        return UnbatchedEntry(self.data)

    def _index(self, idx: Any) -> UnbatchedEntry:
        return self

    def _mapped(self, fn: Any) -> UnbatchedEntry:
        """``fn`` applies to the tensor (kept, with this holder, when ``fn`` gives it back unchanged)."""
        result = fn(self.data)
        return self if result is self.data else UnbatchedEntry(result)

    def __eq__(self, other: object) -> bool:
        theirs = other.data if isinstance(other, NonTensorData) else other
        return isinstance(theirs, torch.Tensor) and theirs.data_ptr() == self.data.data_ptr()

    __hash__ = NonTensorData.__hash__

    def __repr__(self) -> str:
        return f"UnbatchedEntry({self.data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (UnbatchedEntry, (self.data,))

    @classmethod
    def _stack_values(
        cls, values: Sequence[Any], batches: Sequence[torch.Size], dim: int, new_dim: bool
    ) -> UnbatchedEntry:
        """Stacking tensordicts keeps the first member's tensor (a warning if the others differ)."""
        first = values[0]
        if not all(isinstance(v, UnbatchedEntry) for v in values):
            raise BatchSizeError(
                "Cannot stack an UnbatchedTensor entry with members whose entry is not one: every member "
                "must hold an UnbatchedTensor under that key."
            )
        ptr = first.data.data_ptr()
        if any(v is not first and v.data.data_ptr() != ptr for v in values[1:]):
            warnings.warn(
                "Stacking UnbatchedTensors with different data storage: only the first member's tensor is "
                "kept. An UnbatchedTensor is shared by the whole batch; use a regular tensor for values that "
                "differ per element.",
                UserWarning,
                stacklevel=3,
            )
        return first


def share_unbatched(node: Any) -> None:
    """Move the payload of every unbatched entry under the collection ``node`` to shared memory
    (what ``share_memory_`` does for its tensors), through nested levels, lazy stacks and tensorclasses."""
    members = node._lazy_members() if hasattr(node, "_lazy_members") else None
    if members is not None:
        for member in members:
            share_unbatched(member)
        return
    store = getattr(node, "_tensordict", None)
    if store is not None and not isinstance(store, dict):  # a tensorclass: its tensordict
        share_unbatched(store)
        return
    for leaf in (store or {}).values():
        if isinstance(leaf, UnbatchedEntry):
            for alias in leaf._aliases.values():
                alias.share_memory_()
        elif not isinstance(leaf, (NonTensorData, torch.Tensor)) and hasattr(leaf, "_tensordict"):
            share_unbatched(leaf)


def surface_leaf(td: Any, key: tuple[str, ...], leaf: Any) -> Any:
    """What reading ``leaf`` (at ``key`` of ``td``) gives: an unbatched holder's tensor, with the
    batch size of the level that holds it; a non-tensor value of a locked tensordict learns where
    it lives (:func:`tdshare._nontensor_ops.bind_owner`); any other leaf unchanged."""
    if not isinstance(leaf, NonTensorData):
        return leaf
    if not leaf._keeps_whole:
        return bind_owner(td, key, leaf)
    level = td if len(key) == 1 else td._get_leaf(key[:-1])
    if isinstance(leaf, UnbatchedEntry):
        return leaf.for_batch(level.batch_size)
    leaf._batch_size = level.batch_size  # MetaData: one value for the batch of the tensordict read from
    return bind_owner(td, key, leaf)
