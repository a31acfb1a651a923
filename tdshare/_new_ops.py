"""New tensordicts shaped like one: ``new_empty``, ``new_zeros``, ``new_ones``, ``new_full``, and
``to_lazystack``.

``td.new_zeros(4, 5)`` is a tensordict of batch ``[4, 5]`` with the same keys: every tensor entry
is ``tensor.new_zeros`` of the new batch followed by the entry's own (non-batch) dims, a nested
level is built the same way, a non-tensor value is kept (a ``NonTensorStack`` becomes its first
value over the new shape, as in the reference).  A lazy stack with ``empty_lazy=True`` gives a
lazy stack of copies of its first member's new form along its stack dimension.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._errors import ArgumentTypeError
from ._format import LAZY_STACK_TYPE
from ._indexing import check_dim
from ._nodes import kind_for_tag
from ._nontensor import NonTensorData, NonTensorStack
from ._unbatched import UnbatchedEntry

__all__ = ["NewOps"]


def _size(size: tuple[Any, ...]) -> torch.Size:
    if len(size) == 1 and isinstance(size[0], (Sequence, torch.Size)):
        size = tuple(size[0])
    if not all(isinstance(s, int) for s in size):
        raise ArgumentTypeError(f"new_*: the size must be ints or one sequence of ints, got {size!r}.")
    return torch.Size(size)


class NewOps:
    """The ``new_*`` constructors and ``to_lazystack`` (a mixin of ``TensorDictBase``)."""

    def _new_like(self, size: torch.Size, make: Callable[[torch.Tensor, torch.Size], torch.Tensor], lazy: bool) -> Any:
        td: Any = self
        members = td._lazy_members()
        if members is not None:
            d = td.stack_dim
            inner = torch.Size(size[:d] + size[d + 1 :]) if len(size) > d else torch.Size([])
            if lazy and len(size) > d:
                first = members[0]._new_like(inner, make, lazy)
                return type(td)(*[first.clone() for _ in range(size[d])], stack_dim=d)
            return members[0]._new_like(size, make, lazy)
        dims = td.batch_dims
        leaves: dict[str, Any] = {}
        for key, leaf in td._tensordict.items():
            if isinstance(leaf, NewOps):
                nested: Any = leaf
                leaves[key] = leaf._new_like(size + nested.batch_size[dims:], make, lazy)
            elif isinstance(leaf, NonTensorStack):
                shape = size + leaf.batch_size[dims:]
                leaves[key] = NonTensorStack._make([leaf._values[0]] * shape.numel(), shape)
            elif isinstance(leaf, UnbatchedEntry):
                leaves[key] = UnbatchedEntry(make(leaf.data, leaf.data.shape))
            elif isinstance(leaf, NonTensorData):
                leaves[key] = leaf.clone()
            elif isinstance(leaf, torch.Tensor):
                leaves[key] = make(torch.Tensor.as_subclass(leaf, torch.Tensor), size + leaf.shape[dims:])
            else:
                leaves[key] = leaf
        return type(td)._from_leaves(leaves, size, td._device, None)

    def new_empty(self, *size: Any, dtype: torch.dtype | None = None, empty_lazy: bool = False, **kwargs: Any) -> Any:
        """A tensordict of batch ``size`` with this one's keys and uninitialised tensors.

        Args:
            *size: the new batch size (ints, or one sequence).
            dtype: the tensors' dtype (default: each entry's own).
            empty_lazy: for a lazy stack, give a lazy stack (of copies of its first member's new form).

        Raises:
            ArgumentTypeError: a size that is not ints.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(x=torch.zeros(2, 3), batch_size=[2]).new_empty(4)["x"].shape
        torch.Size([4, 3])
        """
        return self._new_like(_size(size), lambda t, s: t.new_empty(s, dtype=dtype or t.dtype), empty_lazy)

    def new_zeros(self, *size: Any, dtype: torch.dtype | None = None, empty_lazy: bool = False, **kwargs: Any) -> Any:
        """As :meth:`new_empty`, with tensors of zeros.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(x=torch.ones(2), batch_size=[2]).new_zeros(3)["x"].tolist()
        [0.0, 0.0, 0.0]
        """
        return self._new_like(_size(size), lambda t, s: t.new_zeros(s, dtype=dtype or t.dtype), empty_lazy)

    def new_ones(self, *size: Any, dtype: torch.dtype | None = None, empty_lazy: bool = False, **kwargs: Any) -> Any:
        """As :meth:`new_empty`, with tensors of ones.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(x=torch.zeros(2), batch_size=[2]).new_ones(2)["x"].tolist()
        [1.0, 1.0]
        """
        return self._new_like(_size(size), lambda t, s: t.new_ones(s, dtype=dtype or t.dtype), empty_lazy)

    def new_full(
        self, size: Any, fill_value: Any, *, dtype: torch.dtype | None = None, empty_lazy: bool = False, **kwargs: Any
    ) -> Any:
        """As :meth:`new_empty`, with tensors filled with ``fill_value``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(x=torch.zeros(2), batch_size=[2]).new_full((2,), 7.0)["x"].tolist()
        [7.0, 7.0]
        """
        return self._new_like(
            _size((size,)), lambda t, s: t.new_full(s, fill_value, dtype=dtype or t.dtype), empty_lazy
        )

    def to_lazystack(self, dim: int = 0) -> Any:
        """A lazy stack of this tensordict's slices along batch dim ``dim`` (a lazy stack gives itself
        when stacked along ``dim`` already).

        Raises:
            DimensionError: ``dim`` is not a batch dimension.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> type(TensorDict(x=torch.zeros(3), batch_size=[3]).to_lazystack()).__name__
        'LazyStackedTensorDict'
        """
        td: Any = self
        d = check_dim(dim, td.batch_dims)
        if td._lazy_members() is not None and td.stack_dim == d:
            return td
        lazy = kind_for_tag(LAZY_STACK_TYPE)  # the lazy stack class, registered by its module
        assert lazy is not None
        return lazy.cls(*td.unbind(d), stack_dim=d)
