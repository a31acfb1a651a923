"""``torch.utils.data.DataLoader`` over a tensordict: one indexing call per batch, and a collate.

``DataLoader(td, batch_size=256)`` fetches a batch with ``td.__getitems__(indices)``: one
indexing call that gathers the rows of every leaf (torch's ``_MapDatasetFetcher`` calls it when
the dataset has it).  The fetched batch is already a tensordict, so the default collate gets it
whole: the entry registered here in ``torch.utils.data._utils.collate.default_collate_fn_map``
returns such a batch as it is, and stacks a list of tensordicts (what a custom dataset, or
``DataLoader(td)`` without a batch size, gives) into one: densely when their keys and shapes
agree, as a lazy stack otherwise.  One key covers every tdshare collection (TensorDict, lazy
stack, tensorclass), through a marker class whose ``isinstance`` asks the node registry.
``pin_memory()`` is what ``DataLoader(pin_memory=True)`` calls on each batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data._utils.collate import default_collate_fn_map

from ._errors import ArgumentTypeError
from ._format import LAZY_STACK_TYPE, LEVEL, STACK, WRAPPED
from ._indexing import index_names
from ._nodes import kind_for_tag, kind_of

__all__ = ["LoaderOps", "collate_tensordicts", "is_tensor_collection"]

T = TypeVar("T", bound="LoaderOps")
_COLLECTIONS = (LEVEL, STACK, WRAPPED)


class LoaderOps:
    """``__getitems__`` and ``pin_memory``: a mixin of ``TensorDictBase``."""

    _tensordict: dict[str, Any]
    _batch_size: torch.Size
    _is_locked: bool

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the exact class too: torch's collate looks the element's type up before any isinstance
        default_collate_fn_map.setdefault(cls, collate_tensordicts)

    def __getitems__(self: T, indices: Any) -> T:
        """The rows ``indices`` of the first batch dimension, gathered in one indexing call.

        ``torch.utils.data.DataLoader`` calls it with the list of indices of each batch (from its
        ``BatchSampler``), and its default collate passes the result on unchanged.

        Args:
            indices: a list or tuple of row numbers (or of bools, a mask), or any index.

        Returns:
            A tensordict of ``len(indices)`` rows (the same class).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(x=torch.arange(10), batch_size=[10])
        >>> td.__getitems__([7, 2, 5])["x"].tolist()
        [7, 2, 5]
        """
        if isinstance(indices, (list, tuple)):
            indices = torch.as_tensor(indices)  # a sequence of rows, never a multi-dim index
        if (
            isinstance(indices, torch.Tensor)
            and indices.dim() == 1
            and indices.dtype in _ROW_DTYPES
            and _layout(self) == LEVEL
            and len(self._batch_size)
        ):
            return _gather(self, indices)
        return self[indices]

    def __getitem__(self, idx: Any) -> Any:
        raise NotImplementedError

    def _map(self: T, fn: Callable[[torch.Tensor], Any], *args: Any) -> T:
        raise NotImplementedError

    def pin_memory_(self: T, num_threads: int = 0) -> T:
        """Deprecated: ``pin_memory(num_threads, inplace=True)`` (pinning makes new storage, so the
        reference renames it and removes ``pin_memory_`` in its 0.17).  Emits a ``DeprecationWarning``.

        Raises:
            RuntimeError: no accelerator to pin memory for (raised by torch).

        >>> import torch, warnings
        >>> from tdshare import TensorDict
        >>> td = TensorDict(x=torch.zeros(2), batch_size=[2])
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     out = td.pin_memory_() if torch.cuda.is_available() else td
        >>> out is td
        True
        """
        warnings.warn(
            "pin_memory_() is deprecated (tensordict removes it in 0.17); use pin_memory(inplace=True) instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.pin_memory(num_threads, inplace=True)

    def pin_memory(self: T, num_threads: int | None = None, inplace: bool = False) -> T:
        """A copy whose tensor leaves are in pinned (page-locked) memory, for fast copies to a GPU.

        ``DataLoader(pin_memory=True)`` calls it on every batch (torch only pins where an
        accelerator is available). Pinning needs an accelerator: without one, torch's
        ``RuntimeError`` comes through, as with the reference.

        Args:
            num_threads: accepted for the reference's signature; the leaves are pinned in turn.
            inplace: replace the leaves of this (unlocked) tensordict by their pinned copies and
                return it; a locked tensordict keeps its leaves (a memory-mapped or shared leaf
                cannot move) and is returned as it is.

        Returns:
            The pinned copy (locked when this one is), or ``self`` with ``inplace=True``.

        Raises:
            RuntimeError: no accelerator to pin memory for (raised by torch).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(x=torch.zeros(2), batch_size=[2])
        >>> pinned = td.pin_memory() if torch.cuda.is_available() else td
        >>> pinned["x"].tolist()
        [0.0, 0.0]
        """
        if inplace:
            if not self._is_locked:
                _pin_in_place(self)
            return self
        out = self._map(_pinned)
        if self._is_locked:
            out.lock_()  # type: ignore[attr-defined]
        return out


_ROW_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _layout(value: Any) -> str | None:
    kind = kind_of(value)
    return None if kind is None else kind.layout


def _gather(node: Any, rows: torch.Tensor) -> Any:
    """``node[rows]`` for a 1-D tensor of row numbers: what ``_index`` gives, with the batch size
    known from the index (no probe tensor), level by level."""
    batch = torch.Size((rows.numel(), *node._batch_size[1:]))
    idx = (rows,)
    leaves: dict[str, Any] = {}
    for key, leaf in node._tensordict.items():
        if isinstance(leaf, torch.Tensor):
            leaves[key] = leaf[rows]
        elif _layout(leaf) == LEVEL:
            leaves[key] = _gather(leaf, rows)
        elif isinstance(leaf, LoaderOps) or hasattr(leaf, "_index"):  # a lazy stack, a non-tensor value
            leaves[key] = leaf._index(idx)
        else:  # a tensorclass instance indexes itself
            leaves[key] = leaf[rows]
    out = type(node)._from_leaves(leaves, batch, node._device, index_names(node._names, idx, len(batch)))
    out._is_memmap, out._is_shared, out._is_locked = node._is_memmap, node._is_shared, node._is_locked
    return out


def _pinned(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_pinned() else t.pin_memory()


def _pin_in_place(node: Any) -> None:
    kind = kind_of(node)
    if kind is not None and kind.layout in (STACK, WRAPPED) and kind.unwrap is not None:
        inner, _ = kind.unwrap(node)
        for member in inner if isinstance(inner, list) else [inner]:
            _pin_in_place(member)
        return
    entries = node._tensordict
    for key, value in entries.items():
        if isinstance(value, torch.Tensor):
            entries[key] = _pinned(value)
        elif is_tensor_collection(value):
            _pin_in_place(value)


def is_tensor_collection(value: Any) -> bool:
    """Whether ``value`` is a tdshare collection: a tensordict, a lazy stack or a tensorclass instance.

    >>> import torch
    >>> from tdshare import TensorDict
    >>> is_tensor_collection(TensorDict(batch_size=[])), is_tensor_collection(torch.zeros(1))
    (True, False)
    """
    kind = kind_of(value)
    return kind is not None and kind.layout in _COLLECTIONS


def collate_tensordicts(batch: Any, *, collate_fn_map: dict | None = None) -> Any:
    """Collate for torch's DataLoader: a fetched batch as it is, a list of tensordicts stacked.

    A batch that ``__getitems__`` fetched (a tensordict) is returned unchanged.  A list of
    tensordicts (or of instances of one tensorclass) becomes ``torch.stack(batch)``; tensordicts
    whose keys or shapes differ become a ``LazyStackedTensorDict``.

    Args:
        batch: a tensordict, or a sequence of them.
        collate_fn_map: torch's map of collate functions (unused: a tensordict has its own stack).

    Returns:
        One tensordict with the batch as its first dimension.

    Raises:
        TypeError: items that are not all tdshare collections, or that cannot be stacked even
            lazily (different tensorclasses, different numbers of batch dims).

    >>> import torch
    >>> from tdshare import TensorDict
    >>> rows = [TensorDict(x=torch.tensor(i)) for i in range(3)]
    >>> collate_tensordicts(rows)["x"].tolist()
    [0, 1, 2]
    """
    if is_tensor_collection(batch):
        return batch
    items: Sequence[Any] = list(batch)
    kinds = {kind_of(item) for item in items}
    if not items or not all(is_tensor_collection(item) for item in items):
        names = sorted({type(item).__name__ for item in items})
        raise ArgumentTypeError(f"Cannot collate a batch that mixes tensordicts with other types: got {names}.")
    dims = {len(item.batch_size) for item in items}
    if len(dims) > 1:
        raise ArgumentTypeError(
            f"Cannot collate tensordicts with different numbers of batch dims: got {sorted(dims)}; "
            "give every sample the same batch dims."
        )
    try:
        return torch.stack(list(items))
    except (KeyError, RuntimeError, ValueError) as err:
        lazy = kind_for_tag(LAZY_STACK_TYPE)
        if lazy is None or lazy.wrap is None or any(k is None or k.layout == WRAPPED for k in kinds):
            raise ArgumentTypeError(f"Cannot collate a batch of tensordicts that do not stack: {err}") from err
        return lazy.wrap(list(items), {"stack_dim": 0})


class _CollectionMeta(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        return is_tensor_collection(instance)


class TdshareCollection(metaclass=_CollectionMeta):
    """The key of torch's ``default_collate_fn_map`` for every tdshare collection (``isinstance`` asks
    the node registry, so tensorclasses, which derive from nothing, match too)."""


default_collate_fn_map.setdefault(TdshareCollection, collate_tensordicts)
