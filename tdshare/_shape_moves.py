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
    NotSupportedError,
)
from ._nodes import kind_of
from ._nontensor import NonTensorData, NonTensorStack
from ._shape_args import batch_dim, gather_index, int_list

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
        def to_tensordict(self, *, retain_none: bool | None = None) -> Any: ...
        def unbind(self, dim: int = 0) -> tuple[Any, ...]: ...
        def keys(self, include_nested: bool = False, leaves_only: bool = False, *args: Any, **kwargs: Any) -> list: ...
        def update(self: T, *args: Any, **kwargs: Any) -> T: ...
        def empty(self: T, recurse: bool = False, *, batch_size: Any = None, device: Any = None) -> T: ...
        def get(self, key: Any, default: Any = ...) -> Any: ...
        def reshape(self: T, *shape: Any, inplace: bool = False, **kwargs: Any) -> T: ...
        def expand(self: T, *shape: Any, **kwargs: Any) -> T: ...
        def expand_as(self: T, other: Any) -> T: ...
        def _restack(self, members: Sequence[Any], stack_dim: int | None = None, keep_name: bool = True) -> Any: ...

    # -- hooks ----------------------------------------------------------------------------------
    def _stack_parts(self) -> tuple[list[Any], int] | None:
        """``(members, stack_dim)`` for a lazy stack; None for a tensordict with entries of its own."""
        return None

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
        keep_status: bool | None = None,
    ) -> T:
        """A new level: ``leaf`` on every tensor, ``nested`` on every child collection.

        ``spread`` turns a single non-tensor value into a ``NonTensorStack`` of the new batch
        (as the reference's expand and unsqueeze do); otherwise the value is kept.  ``collapse``
        turns a ``NonTensorStack`` whose values are all equal back into one value (squeeze).
        ``copy`` (operations whose tensors are copies) gives the result its own non-tensor values;
        otherwise a value is shared with this tensordict, as indexing shares it.  ``keep_status``
        (default: not ``copy``) says whether the result counts as shared or memory-mapped when
        this one does: views do, as in the reference, except ``reshape`` and ``expand``, which the
        reference reports as in memory (a reshape may copy).
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
                spread_it = spread and not value._keeps_whole
                leaves[key] = spread_value(value.data, batch) if spread_it else value.clone() if copy else value
            elif isinstance(value, torch.Tensor):
                leaves[key] = leaf(torch.Tensor.as_subclass(value, torch.Tensor))
            elif (kind := kind_of(value)) is not None and kind.unwrap is not None and kind.wrap is not None:
                inner, fields = kind.unwrap(value)  # a tensorclass: the op on its tensordict, wrapped again
                leaves[key] = kind.wrap(nested(inner), fields)
            else:
                leaves[key] = value
        out = type(self)._from_leaves(leaves, batch, self._device, _names_or_none(names))
        if (not copy) if keep_status is None else keep_status:
            out._is_shared, out._is_memmap = self._is_shared, self._is_memmap
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

    def rot90(self: T, k: int = 1, dims: Sequence[int] = (0, 1)) -> T:
        """Rotate the batch by 90 degrees ``k`` times in the plane of the batch dims ``dims``
        (as ``torch.rot90``: the first dim towards the second); names follow their dims.

        Raises:
            BatchSizeError: fewer than 2 batch dims, or ``dims`` not two distinct dims.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([[1, 2], [3, 4]]), batch_size=[2, 2]).rot90()["a"].tolist()
        [[2, 4], [1, 3]]
        """
        ndim = self.batch_dims
        if ndim < 2:
            raise BatchSizeError(f"rot90 requires at least 2 batch dims, the batch size is {list(self.batch_size)}.")
        plane = [batch_dim(d, ndim, "rot90") for d in int_list(dims, "rot90", "dims")]
        if len(plane) != 2 or plane[0] == plane[1]:
            raise BatchSizeError(f"rot90 requires exactly 2 distinct dims, got {list(dims)}.")
        a, b = plane
        turns = k % 4
        if turns == 0:
            return self
        if turns == 2:
            return self.flip([a, b])
        return self.flip([b if turns == 1 else a]).transpose(a, b)  # type: ignore[attr-defined]

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

    def tensor_split(self, indices_or_sections: int | Sequence[int] | torch.Tensor, dim: int = 0) -> tuple[Any, ...]:
        """Split along batch dim ``dim`` as ``torch.tensor_split``: into that many nearly equal
        pieces (an int), or at the given indices (a sequence or a 1-D tensor; clamped, negative
        counting from the end).

        Raises:
            InvalidArgumentError: no batch dim, a number of sections below 1, or a bad argument type.
            DimensionError: ``dim`` out of range.

        >>> from tdshare import TensorDict
        >>> [t.batch_size[0] for t in TensorDict(batch_size=[5]).tensor_split(3)]
        [2, 2, 1]
        """
        if isinstance(indices_or_sections, torch.Tensor):
            if indices_or_sections.dtype != torch.long or indices_or_sections.dim() > 1:
                raise InvalidArgumentError(
                    "tensor_split: a tensor indices_or_sections must be a 0-d or 1-d long tensor, got a "
                    f"{indices_or_sections.dim()}-d {indices_or_sections.dtype} tensor."
                )
            indices_or_sections = indices_or_sections.tolist()
        if self.batch_dims == 0:
            raise InvalidArgumentError("tensor_split needs a batch dim; this tensordict has none.")
        d = batch_dim(dim, self.batch_dims, "tensor_split")
        size = self.batch_size[d]
        if isinstance(indices_or_sections, int) and not isinstance(indices_or_sections, bool):
            if indices_or_sections < 1:
                raise InvalidArgumentError(
                    f"tensor_split: the number of sections must be positive, got {indices_or_sections}."
                )
            base, extra = divmod(size, indices_or_sections)
            return self.split([base + (i < extra) for i in range(indices_or_sections)], d)
        if not isinstance(indices_or_sections, Sequence):
            raise InvalidArgumentError(
                "tensor_split: indices_or_sections must be an int, a sequence of ints or a 1-d long tensor, got "
                f"{type(indices_or_sections).__name__}."
            )
        bounds = [
            0,
            *(
                min(max(i + size if i < 0 else i, 0), size)
                for i in int_list(list(indices_or_sections), "tensor_split", "indices")
            ),
            size,
        ]
        spans = list(itertools.pairwise(bounds))
        if all(b >= a for a, b in spans):
            return self.split([b - a for a, b in spans], d)
        return tuple(self.narrow(d, a, max(b - a, 0)) for a, b in spans)  # decreasing indices overlap

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
