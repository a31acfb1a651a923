"""The shape operations that move elements (roll, flip, narrow, split, chunk, gather, masked_fill,
where) and the engine every shape operation builds its result with.

``MoveOps`` is the base of :class:`tdshare._shape_ops.ShapeOps`.  The engine (``_rebuild``)
makes a new level: each tensor leaf gets a torch operation on its leading (batch) dims, a nested
tensordict gets the same operation called with its extra batch dims appended, a
``NonTensorStack`` has its elements moved the way the operation moves positions, and a single
``NonTensorData`` value is kept.  A lazy stack (a host whose ``_stack_parts()`` hook gives its
members) follows :mod:`tdshare._shape_stack` instead.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from . import _shape_stack as stack_rules
from ._errors import (
    ArgumentTypeError,
    BatchSizeError,
    InvalidArgumentError,
    LockedError,
    MissingKeyError,
    NotSupportedError,
)
from ._nodes import kind_of
from ._nontensor import NonTensorData, NonTensorStack
from ._shape_args import align_right, batch_dim, check_mask, gather_index, int_list

__all__ = ["MoveOps", "inner_collection", "move_values", "spread_value"]

T = TypeVar("T", bound="MoveOps")
Leaf = Callable[[torch.Tensor], torch.Tensor]
Nested = Callable[[Any], Any]


class MoveOps:
    """The element-moving shape operations and the engine; the host provides the attributes below."""

    if TYPE_CHECKING:
        _tensordict: dict[str, Any]
        _batch_size: torch.Size
        _device: torch.device | None
        _names: list | None
        _is_locked: bool
        _is_memmap: bool
        _is_shared: bool

        @property
        def batch_size(self) -> torch.Size: ...
        @property
        def batch_dims(self) -> int: ...
        @property
        def names(self) -> list: ...
        @names.setter
        def names(self, value: Sequence[str | None] | None) -> None: ...
        @property
        def is_locked(self) -> bool: ...
        @classmethod
        def _from_leaves(
            cls: type[T],
            leaves: dict[str, Any],
            batch_size: torch.Size,
            device: torch.device | None,
            names: list | None = None,
        ) -> T: ...
        def lock_(self: T) -> T: ...
        def to_tensordict(self) -> Any: ...
        def unbind(self, dim: int = 0) -> tuple[Any, ...]: ...
        def keys(self, include_nested: bool = False, leaves_only: bool = False) -> list: ...
        def update(self: T, input: Any, inplace: bool = False) -> T: ...
        def empty(self: T) -> T: ...
        def get(self, key: Any, default: Any = ...) -> Any: ...
        def reshape(self: T, *shape: Any, inplace: bool = False, **kwargs: Any) -> T: ...
        def expand(self: T, *shape: Any, **kwargs: Any) -> T: ...
        def expand_as(self: T, other: Any) -> T: ...

    # -- hooks ----------------------------------------------------------------------------------
    def _stack_parts(self) -> tuple[list[Any], int] | None:
        """``(members, stack_dim)`` for a lazy stack; None for a tensordict with entries of its own."""
        return None

    def _restack(self, members: Sequence[Any], stack_dim: int, keep_name: bool = True) -> Any:
        """A lazy stack of ``members`` along ``stack_dim`` like this one (lazy stacks only)."""
        raise NotSupportedError(f"{type(self).__name__} is not a lazy stack.")

    # -- the engine -----------------------------------------------------------------------------
    def _rebuild(
        self: T,
        leaf: Leaf,
        nested: Nested,
        batch: Sequence[int],
        names: Sequence[str | None] | None,
        *,
        lock: bool = True,
        spread: bool = False,
        collapse: bool = False,
        copy: bool = False,
    ) -> T:
        """A new level: ``leaf`` on every tensor, ``nested`` on every child collection.

        ``spread`` turns a single non-tensor value into a ``NonTensorStack`` of the new batch
        (as the reference's expand and unsqueeze do); otherwise the value is kept.  ``collapse``
        turns a ``NonTensorStack`` whose values are all equal back into one value (squeeze).
        ``copy`` (operations whose tensors are copies) gives the result its own non-tensor values;
        otherwise a value is shared with this tensordict, as indexing shares it.
        """
        batch = torch.Size(batch)
        leaves: dict[str, Any] = {}
        for key, value in self._tensordict.items():
            if type(value) is torch.Tensor:  # the common case first
                leaves[key] = leaf(value)
            elif isinstance(value, MoveOps):
                leaves[key] = nested(value)
            elif isinstance(value, NonTensorStack):
                leaves[key] = move_values(value, leaf, collapse)
            elif isinstance(value, NonTensorData):
                leaves[key] = spread_value(value.data, batch) if spread else value.clone() if copy else value
            elif isinstance(value, torch.Tensor):
                leaves[key] = leaf(torch.Tensor.as_subclass(value, torch.Tensor))
            elif (kind := kind_of(value)) is not None and kind.unwrap is not None and kind.wrap is not None:
                inner, fields = kind.unwrap(value)  # a tensorclass: the op on its tensordict, wrapped again
                leaves[key] = kind.wrap(nested(inner), fields)
            else:
                leaves[key] = value
        out = type(self)._from_leaves(leaves, batch, self._device, _names_or_none(names))
        if lock and self._is_locked:
            out.lock_()
        return out

    def _rebind_(self: T, result: Any, op: str) -> T:
        """Make ``self`` hold ``result``'s entries and batch size (``inplace=True``); return self."""
        if self._stack_parts() is not None:
            raise NotSupportedError(
                f"{op}(inplace=True) is not supported on a lazy stack; call .to_tensordict() first or use "
                "inplace=False."
            )
        if self._is_locked:
            raise LockedError(f"{op}(inplace=True) changes the entries of a locked tensordict; unlock it first.")
        _rebind_level(self, result)
        return self

    def _names_kept(self) -> list | None:
        return None if self._names is None else list(self._names)

    # -- moving elements ------------------------------------------------------------------------
    def roll(
        self: T, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None, *, inplace: bool = False
    ) -> T:
        """Roll the elements along batch dims ``dims`` by ``shifts`` (the flattened batch when None).

        Args:
            shifts: one shift, or one per dim.
            dims: the batch dims (negative counts from the end), or None.
            inplace: change this tensordict instead of returning a new one.

        Raises:
            DimensionError: a dim out of range.
            InvalidArgumentError: shifts and dims of different lengths.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(3), batch_size=[3]).roll(1)["a"].tolist()
        [2, 0, 1]
        """
        ndim = self.batch_dims
        shift_list = int_list(shifts, "roll", "shifts")
        if dims is None or (not isinstance(dims, int) and not len(dims)):
            if len(shift_list) != 1:
                raise InvalidArgumentError(f"roll: without dims, shifts must be one int, got {shifts!r}.")
            flat = self.reshape(-1) if ndim != 1 else self
            rolled = flat.roll(shift_list[0], 0).reshape(self.batch_size)
            if rolled._stack_parts() is None:  # a lazy stack's names are its members': leave them
                rolled.names = self._names_kept()
            return self._rebind_(rolled, "roll") if inplace else rolled
        dim_list = [batch_dim(d, ndim, "roll") for d in int_list(dims, "roll", "dims")]
        if len(dim_list) != len(shift_list):
            raise InvalidArgumentError(f"roll: {len(shift_list)} shifts for {len(dim_list)} dims; give one per dim.")
        if self._stack_parts() is not None:
            if inplace:
                return self._rebind_(None, "roll")
            return stack_rules.roll(self, shift_list, dim_list)
        result = self._rebuild(
            lambda t: t.roll(shift_list, dim_list),
            lambda c: c.roll(shift_list, dim_list),
            self.batch_size,
            self._names_kept(),
            copy=True,
        )
        return self._rebind_(result, "roll") if inplace else result

    def flip(self: T, dims: int | Sequence[int]) -> T:
        """Reverse the order of the elements along the batch dims ``dims`` (copies, as torch.flip).

        Raises:
            DimensionError: a dim out of range.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(3), batch_size=[3]).flip(0)["a"].tolist()
        [2, 1, 0]
        """
        ndim = self.batch_dims
        dim_list = [batch_dim(d, ndim, "flip") for d in int_list(dims, "flip", "dims")]
        if self._stack_parts() is not None:
            return stack_rules.flip(self, dim_list)
        return self._rebuild(
            lambda t: t.flip(dim_list),
            lambda c: c.flip(dim_list),
            self.batch_size,
            self._names_kept(),
            copy=True,
        )

    def fliplr(self: T) -> T:
        """``flip(1)`` (needs 2 batch dims; ``BatchSizeError`` otherwise).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(2).expand(1, 2), batch_size=[1, 2]).fliplr()["a"].tolist()
        [[1, 0]]
        """
        if self.batch_dims < 2:
            raise BatchSizeError(f"fliplr requires at least 2 batch dims, the batch size is {list(self.batch_size)}.")
        return self.flip(1)

    def flipud(self: T) -> T:
        """``flip(0)`` (needs a batch dim; ``BatchSizeError`` otherwise).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(2), batch_size=[2]).flipud()["a"].tolist()
        [1, 0]
        """
        if self.batch_dims < 1:
            raise BatchSizeError("flipud requires at least 1 batch dim, the tensordict has none.")
        return self.flip(0)

    # -- selecting ------------------------------------------------------------------------------
    def narrow(self: T, dim: int, start: int, length: int) -> T:
        """The elements ``start`` to ``start + length`` along batch dim ``dim`` (views).

        Raises:
            DimensionError: ``dim`` out of range.
            BatchSizeError: ``start``/``length`` outside the dim.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(4), batch_size=[4]).narrow(0, 1, 2)["a"].tolist()
        [1, 2]
        """
        ndim = self.batch_dims
        d = batch_dim(dim, ndim, "narrow")
        size = self.batch_size[d]
        begin = start + size if start < 0 else start
        if not (0 <= begin <= size) or length < 0 or begin + length > size:
            raise BatchSizeError(
                f"narrow: start ({start}) + length ({length}) must lie within dim {dim} of size {size}."
            )
        index = (slice(None),) * d + (slice(begin, begin + length),)
        return self[index]  # type: ignore[index]

    def split(self, split_size: int | Sequence[int], dim: int = 0) -> tuple[Any, ...]:
        """Split along batch dim ``dim`` into pieces of ``split_size`` (the last may be smaller),
        or of the sizes in a list.

        Returns a tuple of tensordicts (views; names and lock kept).

        Raises:
            DimensionError: ``dim`` out of range.
            InvalidArgumentError: a non-positive ``split_size``.
            ArgumentTypeError: ``split_size`` is neither an int nor a sequence of ints.
            BatchSizeError: sizes that do not add up to the size of ``dim``.

        >>> from tdshare import TensorDict
        >>> [t.batch_size[0] for t in TensorDict(batch_size=[5]).split(2)]
        [2, 2, 1]
        """
        ndim = self.batch_dims
        d = batch_dim(dim, ndim, "split")
        size = self.batch_size[d]
        if isinstance(split_size, bool) or not isinstance(split_size, (int, Sequence, torch.Tensor)):
            raise ArgumentTypeError(f"split(): argument 'split_size' must be int or list of ints, got {split_size!r}.")
        if isinstance(split_size, int):
            if split_size < 0 or (split_size == 0 and size != 0):
                raise InvalidArgumentError(f"split: split_size must be positive, got {split_size}.")
            step = max(min(split_size, size), 1)
            sizes = [min(step, size - i) for i in range(0, size, step)] or [0]
        else:
            try:
                sizes = [operator.index(s) for s in split_size]
            except TypeError:
                raise ArgumentTypeError(
                    f"split(): argument 'split_size' must be int or list of ints, got {split_size!r}."
                ) from None
            if not sizes and size:
                raise BatchSizeError(f"split: Insufficient number of elements in split_size for a dim of {size}.")
            if sum(sizes) != size or any(s < 0 for s in sizes):
                raise BatchSizeError(
                    f"split expects split_size to sum exactly to {size} (the size of dim {dim}), got {sizes}."
                )
        if self._stack_parts() is not None:
            return tuple(self.narrow(d, a, b - a) for a, b in _spans(sizes))
        return self._split_level(sizes, d)

    def _split_level(self, sizes: list[int], d: int) -> tuple[Any, ...]:
        """The pieces of a level along dim ``d``: every leaf split by torch, nested levels by themselves."""
        count = len(sizes)
        columns: dict[str, Any] = {}
        for key, value in self._tensordict.items():
            if isinstance(value, MoveOps):
                columns[key] = value.split(sizes, d)
            elif isinstance(value, NonTensorStack):
                columns[key] = _split_values(value, sizes, d)
            elif isinstance(value, NonTensorData):
                columns[key] = (value,) * count
            elif isinstance(value, torch.Tensor):
                columns[key] = _split_tensor(value, sizes, d)
            elif (kind := kind_of(value)) is not None and kind.unwrap is not None and kind.wrap is not None:
                inner, fields = kind.unwrap(value)
                columns[key] = tuple(kind.wrap(piece, fields) for piece in inner.split(sizes, d))
            else:
                columns[key] = (value,) * count
        pieces = []
        for i, s in enumerate(sizes):
            batch = list(self.batch_size)
            batch[d] = s
            out = type(self)._from_leaves(
                {k: v[i] for k, v in columns.items()}, torch.Size(batch), self._device, self._names_kept()
            )
            out._is_memmap, out._is_shared, out._is_locked = self._is_memmap, self._is_shared, self._is_locked
            pieces.append(out)
        return tuple(pieces)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Any, ...]:
        """Split along batch dim ``dim`` into ``chunks`` pieces of equal size (the last may be smaller).

        Raises:
            InvalidArgumentError: ``chunks`` is not positive.
            DimensionError: ``dim`` out of range.

        >>> from tdshare import TensorDict
        >>> [t.batch_size[0] for t in TensorDict(batch_size=[5]).chunk(2)]
        [3, 2]
        """
        chunks = operator.index(chunks)
        if chunks < 1:
            raise InvalidArgumentError(f"chunk: chunks must be a positive integer, got {chunks}.")
        d = batch_dim(dim, self.batch_dims, "chunk")
        size = self.batch_size[d]
        if size == 0:
            return self.split([0] * chunks, d)
        return self.split(-(size // -chunks), d)

    def gather(self: T, dim: int, index: torch.Tensor, out: Any = None, *, inplace: bool = False) -> T:
        """Pick elements along batch dim ``dim`` as ``torch.gather`` (``index`` spans the batch dims).

        Args:
            dim: the batch dim to gather along.
            index: an integer tensor with as many dims as the batch; the result's batch size is
                its shape.
            out: a tensordict to write the result into.
            inplace: change this tensordict instead of returning a new one.

        Raises:
            BatchSizeError: ``dim`` out of range, or an index of the wrong number of dims.
            InvalidArgumentError: both ``out`` and ``inplace``.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([[1, 2], [3, 4]]), batch_size=[2, 2])
        >>> td.gather(1, torch.tensor([[1], [0]]))["a"].tolist()
        [[2], [3]]
        """
        if inplace and out is not None:
            raise InvalidArgumentError("gather: `out` and `inplace=True` are mutually exclusive; pass one.")
        ndim = self.batch_dims
        d = dim + ndim if dim < 0 else dim
        if not 0 <= d < ndim:
            raise BatchSizeError(f"Cannot gather a tensordict of batch size {list(self.batch_size)} along dim {dim}.")
        if not isinstance(index, torch.Tensor) or not 0 < index.dim() <= ndim:
            raise BatchSizeError(
                f"gather: index must be a tensor with 1 to {ndim} dims (one per leading batch dim), got "
                f"{getattr(index, 'shape', type(index).__name__)}."
            )
        if inplace and index.dim() != ndim:
            raise NotSupportedError(
                f"gather(inplace=True) needs index.ndim == batch_dims ({ndim}), got index.ndim={index.dim()}; "
                "use inplace=False."
            )
        if self._stack_parts() is not None:
            if inplace:
                return self._rebind_(None, "gather")
            result = stack_rules.gather(self, d, index)
        else:
            names = self._names_kept() if index.dim() == ndim else None

            expanded: dict[torch.Size, torch.Tensor] = {}  # one expanded index per leaf shape

            def leaf(t: torch.Tensor) -> torch.Tensor:
                idx = expanded.get(t.shape)
                if idx is None:
                    idx = expanded[t.shape] = gather_index(index, d, t.shape, self.batch_size)
                return torch.gather(t, d, idx)

            def nested(c: Any) -> Any:
                return c.gather(d, gather_index(index, d, c.batch_size, self.batch_size))

            result = self._rebuild(leaf, nested, index.shape, names, lock=False, copy=True)
        if inplace:
            return self._rebind_(result, "gather")
        if out is not None:
            out.update(result)
            return out
        return result

    # -- filling --------------------------------------------------------------------------------
    def masked_fill(self: T, mask: torch.Tensor, value: float | bool) -> T:
        """A copy with ``value`` written where ``mask`` is True (``mask`` covers the leading batch dims).

        Raises:
            BatchSizeError: a mask whose shape is not the batch size or its first dims.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> td.masked_fill(torch.tensor([True, False, True]), 1.0)["a"].tolist()
        [1.0, 0.0, 1.0]
        """
        check_mask(mask, self.batch_size, "masked_fill")
        if self._stack_parts() is not None:
            return stack_rules.masked(self, mask, lambda m, mask_i: m.masked_fill(mask_i, value))
        nd = mask.dim()

        aligned: dict[torch.Size, torch.Tensor] = {}  # one mask per leaf shape

        def leaf(t: torch.Tensor) -> torch.Tensor:
            m = aligned.get(t.shape)
            if m is None:
                m = aligned[t.shape] = align_right(mask, t, nd)
            return t.masked_fill(m, value)

        return self._rebuild(
            leaf,
            lambda c: c.masked_fill(mask, value),
            self.batch_size,
            self._names_kept(),
            lock=False,
            copy=True,
        )

    def masked_fill_(self: T, mask: torch.Tensor, value: float | bool) -> T:
        """Write ``value`` where ``mask`` is True into every tensor leaf, in place (allowed while locked).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.masked_fill_(torch.tensor([False, True]), 5.0)["a"].tolist()
        [0.0, 5.0]
        """
        check_mask(mask, self.batch_size, "masked_fill_")
        parts = self._stack_parts()
        if parts is not None:
            stack_rules.masked(self, mask, lambda m, mask_i: m.masked_fill_(mask_i, value))
            return self
        nd = mask.dim()
        for value_ in self._tensordict.values():
            inner = value_ if isinstance(value_, MoveOps) else inner_collection(value_)
            if inner is not None:
                inner.masked_fill_(mask, value)
            elif isinstance(value_, torch.Tensor):
                value_.masked_fill_(align_right(mask, value_, nd), value)
        return self

    def where(self: T, condition: torch.Tensor, other: Any, *, out: Any = None, pad: Any = None) -> T:
        """Elements of this tensordict where ``condition`` is True, of ``other`` elsewhere.

        Args:
            condition: a bool tensor covering the leading batch dims.
            other: a number, a tensor (broadcast against each leaf) or a tensordict (entry by
                entry; an entry only one side has takes ``pad`` on the other side).
            out: a tensordict to write the result into.
            pad: the value standing in for an entry missing on one side.

        Raises:
            MissingKeyError: an entry missing on one side and no ``pad``.
            BatchSizeError: a condition that does not cover the leading batch dims.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(3), batch_size=[3])
        >>> td.where(torch.tensor([True, False, True]), 0.0)["a"].tolist()
        [1.0, 0.0, 1.0]
        """
        check_mask(condition, self.batch_size, "where")
        if self._stack_parts() is not None:
            result = stack_rules.where(self, condition, other, pad)
        elif isinstance(other, MoveOps) or inner_collection(other) is not None:
            result = _where_collections(self, condition, other, pad)
        else:
            nd = condition.dim()

            def leaf(t: torch.Tensor) -> torch.Tensor:
                return torch.where(align_right(condition, t, nd), t, other)

            result = self._rebuild(
                leaf,
                lambda c: c.where(condition, other, pad=pad),
                self.batch_size,
                self._names_kept(),
                copy=True,
            )
        if out is not None:
            out.update(result)
            return out
        return result


# -- helpers --------------------------------------------------------------------------------
def _names_or_none(names: Sequence[str | None] | None) -> list | None:
    if names is None or all(n is None for n in names):
        return None
    return list(names)


def inner_collection(value: Any) -> Any:
    kind = kind_of(value)
    if kind is None or kind.unwrap is None:
        return None
    inner = kind.unwrap(value)[0]
    return inner if isinstance(inner, MoveOps) else None


def _rebind_level(target: Any, result: Any) -> None:
    """Move ``result``'s entries into ``target``, reusing ``target``'s nested levels."""
    for key, new in result._tensordict.items():
        old = target._tensordict.get(key)
        if (
            isinstance(old, MoveOps)
            and isinstance(new, MoveOps)
            and old._stack_parts() is None
            and new._stack_parts() is None
        ):
            _rebind_level(old, new)
        else:
            target._tensordict[key] = new
    target._batch_size = result.batch_size
    target._names = result._names


def _spans(sizes: list[int]) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive pieces of the given sizes."""
    stops = list(itertools.accumulate(sizes))
    return list(zip([0, *stops[:-1]], stops, strict=True))


def _split_tensor(t: torch.Tensor, sizes: list[int], d: int) -> tuple[torch.Tensor, ...]:
    if t.is_nested and d == 0:  # torch does not split a nested tensor along its first dim: regroup its pieces
        parts = list(t.unbind(0))
        return tuple(torch.nested.as_nested_tensor(parts[a:b], layout=t.layout) for a, b in _spans(sizes))
    return tuple(t.split(sizes, d))


def _split_values(stack: NonTensorStack, sizes: list[int], d: int) -> tuple[NonTensorData, ...]:
    def narrowed(start: int, stop: int) -> Leaf:
        return lambda t: t.narrow(d, start, stop - start)

    return tuple(move_values(stack, narrowed(a, b)) for a, b in _spans(sizes))


def move_values(stack: NonTensorStack, leaf: Leaf, collapse: bool = False) -> NonTensorData:
    """``stack``'s values moved the way ``leaf`` moves the elements of a tensor of its batch shape
    (one ``NonTensorData`` when ``collapse`` and the values are all equal)."""
    flat = _flat(stack.tolist(), stack.batch_dims)
    positions = leaf(torch.arange(len(flat)).reshape(stack.batch_size))
    picked = [flat[i] for i in positions.reshape(-1).tolist()]
    if collapse and picked and all(NonTensorData(v) == picked[0] for v in picked[1:]):
        return NonTensorData(picked[0])
    return NonTensorStack.from_list(_nest(picked, positions.shape), positions.shape)


def spread_value(value: Any, batch: torch.Size) -> NonTensorData:
    """One value repeated over ``batch`` (a ``NonTensorStack``; the value itself for no batch)."""
    if not batch:
        return NonTensorData(value)
    return NonTensorStack.from_list(_nest([value] * batch.numel(), batch), batch)


def _flat(values: Any, depth: int) -> list[Any]:
    if depth == 0:
        return [values]
    return [v for item in values for v in _flat(item, depth - 1)]


def _nest(values: list[Any], batch: Sequence[int]) -> Any:
    if not batch:
        return values[0]
    step = math.prod(batch[1:])
    return [_nest(values[i * step : (i + 1) * step], batch[1:]) for i in range(batch[0])]


def _where_collections(td: Any, condition: torch.Tensor, other: Any, pad: Any) -> Any:
    other = other if isinstance(other, MoveOps) else inner_collection(other)
    out = td.empty()
    nd = condition.dim()
    keys = list(td._tensordict) + [k for k in other._tensordict if k not in td._tensordict]
    for key in keys:
        mine, theirs = td._tensordict.get(key), other._tensordict.get(key)
        if (mine is None or theirs is None) and pad is None:
            raise MissingKeyError(f"where: the entry {key!r} is missing on one side and no pad value is given.")
        if isinstance(mine, MoveOps) or isinstance(theirs, MoveOps):
            if mine is None:
                out._tensordict[key] = theirs.where(~condition, theirs.empty(), pad=pad)
            else:
                out._tensordict[key] = mine.where(condition, theirs if theirs is not None else mine.empty(), pad=pad)
        elif isinstance(mine, NonTensorData) or isinstance(theirs, NonTensorData):
            out._tensordict[key] = mine if mine is not None else theirs
        elif mine is None:
            fill = torch.tensor(pad, dtype=theirs.dtype)
            out._tensordict[key] = torch.where(align_right(~condition, theirs, nd), theirs, fill)
        else:
            alt = theirs if theirs is not None else torch.tensor(pad, dtype=mine.dtype)
            out._tensordict[key] = torch.where(align_right(condition, mine, nd), mine, alt)
    return out
