"""Non-tensor leaves: :class:`NonTensorData` (one value) and :class:`NonTensorStack` (one per element).

``td["label"] = "cat"`` stores ``NonTensorData("cat")``; reading ``td["label"]`` gives back
``"cat"``.  On disk the value is JSON inside the leaf's ``meta.json`` when JSON can hold it
exactly enough (the reference's rule, :func:`tdshare._format.is_json_value`), otherwise
pickled, and pickles are only ever loaded when the caller allows it.

Stacking values that differ (``torch.stack`` of ``NonTensorData``, or of tensordicts whose
non-tensor entries differ) gives a :class:`NonTensorStack`: one value per batch element, read as
nested lists (``tolist()``), indexed like a tensor (an element is a ``NonTensorData``).  It is
saved as the reference saves it: a folder whose ``meta.json`` holds the list (or names a pickle).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ._errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError
from ._format import NONTENSOR_STACK_TYPE, NONTENSOR_TYPE, VALUE, VALUE_STACK
from ._indexing import as_size, check_dim, normalize_index
from ._nodes import NodeKind, register
from ._nontensor_io import NonTensorFiles
from ._nontensor_ops import NonTensorOps, set_value_classes
from ._settings import capture_non_tensor_stack

__all__ = [
    "assign_elements",
    "flatten_values",
    "nest_values",
    "NonTensorData",
    "NonTensorStack",
    "NONTENSOR",
    "NONTENSOR_STACK",
    "stack_non_tensor",
    "nested_shape",
    "set_shape_host",
]

_SCALAR = torch.Size([])


class NonTensorData(NonTensorOps, NonTensorFiles):
    """A non-tensor leaf of a TensorDict: holds ``data``, shared by the views of its tensordict.

    Args:
        data: the value (a ``NonTensorData`` is unwrapped).
        batch_size: the batch the value stands for (the reference's argument; ``[]`` by default).
            Only stacking looks at it: ``torch.stack`` broadcasts the value over it.
        device: kept for the reference's signature; a non-tensor value lives on no device.
        names: accepted for the reference's signature (the tensordict holding it names the dims).

    >>> from tdshare import NonTensorData
    >>> NonTensorData("a", batch_size=[2]).tolist()
    ['a', 'a']
    """

    __slots__ = ("__dict__", "__weakref__", "_batch_size", "_device", "_owner", "data")
    data: Any
    _keeps_whole = False  # True: the batch operations carry the value whole (MetaData, an unbatched tensor)
    _tensor_payload = False  # True: the value is a tensor that element-wise operations apply to (not saved)

    def __init__(
        self,
        data: Any,
        _metadata: Any = None,
        _is_non_tensor: bool = True,
        *,
        batch_size: Sequence[int] | torch.Size | int | None = None,
        device: torch.device | str | int | None = None,
        names: Sequence[str | None] | None = None,
    ) -> None:
        if isinstance(data, NonTensorData):
            data = data.data
        self.data = data
        self._batch_size = as_size(batch_size)
        self._device = None if device is None else torch.device(device)

    @property
    def batch_size(self) -> torch.Size:
        """The batch the value is broadcast over (``torch.Size([])`` unless given).

        >>> from tdshare import NonTensorData
        >>> NonTensorData("a").batch_size, NonTensorData("a", batch_size=[2, 3]).batch_size
        (torch.Size([]), torch.Size([2, 3]))
        """
        return getattr(self, "_batch_size", _SCALAR)  # SharedNonTensorData sets none

    shape = batch_size

    @property
    def batch_dims(self) -> int:
        """The number of batch dimensions.

        >>> from tdshare import NonTensorData
        >>> NonTensorData("a").batch_dims, NonTensorData("a", batch_size=[2, 3]).batch_dims
        (0, 2)
        """
        return len(self.batch_size)

    @property
    def device(self) -> torch.device | None:
        """The device the value is said to be on (None: none given).

        >>> from tdshare import NonTensorData
        >>> NonTensorData("a").device, NonTensorData("a", device="cpu").device
        (None, device(type='cpu'))
        """
        return getattr(self, "_device", None)

    def tolist(self) -> Any:
        """The value, broadcast over ``batch_size`` as nested lists (the value itself without a batch).

        >>> from tdshare import NonTensorData
        >>> NonTensorData("a", batch_size=[2, 1]).tolist(), NonTensorData(5).tolist()
        ([['a'], ['a']], 5)
        """
        return nest_values([self.data] * self.batch_size.numel(), self.batch_size)

    # -- the tensordict holding the value ---------------------------------------------------
    @classmethod
    def _tensordict_host(cls) -> Any:
        return _SHAPE_HOST[0]

    def _is_stack(self) -> bool:
        return isinstance(self, NonTensorStack)

    def _take(self, other: NonTensorData) -> None:
        """Hold ``other``'s value (and, for a stack, its batch size)."""
        if isinstance(self, NonTensorStack) and isinstance(other, NonTensorStack):
            self._values, self._batch_size = list(other._values), other.batch_size
        else:
            self.data = other.data

    def clone(self) -> NonTensorData:
        """A new, unshared ``NonTensorData`` with the same value and batch size.

        The value itself is not copied: a mutable value is shared with the original.

        >>> from tdshare import NonTensorData
        >>> value = NonTensorData(["a"], batch_size=[2])
        >>> copy = value.clone()
        >>> copy is value, copy.data is value.data, copy.batch_size
        (False, True, torch.Size([2]))
        """
        return NonTensorData(self.data, batch_size=self.batch_size, device=self.device)

    def _index(self, idx: Any) -> NonTensorData:
        """Indexing a tensordict keeps its non-tensor values (the same object)."""
        return self

    def _mapped(self, fn: Any) -> NonTensorData:
        """This value in a tensordict whose tensors ``fn`` maps (``to``, ``clone``...): an own copy."""
        return self.clone()

    def __eq__(self, other: object) -> bool:
        other_data = other.data if isinstance(other, NonTensorData) else other
        try:
            return bool(self.data == other_data)
        except Exception:  # e.g. ambiguous truth values of array-likes
            return self.data is other_data

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        if self.batch_size:
            return f"NonTensorData(data={self.data!r}, batch_size={self.batch_size})"
        return f"NonTensorData(data={self.data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        if self.batch_size or self.device is not None:
            return (_rebuild_data, (self.data, tuple(self.batch_size), self.device))
        return (NonTensorData, (self.data,))

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """``torch.stack``/``torch.cat`` of non-tensor values give a :class:`NonTensorStack`."""
        kwargs = kwargs or {}
        if func in (torch.stack, torch.cat):
            values = list(args[0])
            dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
            return NonTensorStack._combine(values, [v.batch_size for v in values], dim, func is torch.stack)
        return NotImplemented


_SHAPE_HOST: list[Any] = []  # the tensordict class that runs shape operations for a value on its own


def set_shape_host(cls: type) -> None:
    """Name the tensordict class whose shape operations a non-tensor value on its own borrows."""
    _SHAPE_HOST[:] = [cls]


def _borrowed(name: str) -> Any:
    def op(self: NonTensorData, *args: Any, **kwargs: Any) -> Any:
        value = self.clone() if self._keeps_whole else self  # kept whole: the result takes a batch size of its own
        host = _SHAPE_HOST[0]({"value": value}, batch_size=self.batch_size)
        return getattr(host, name)(*args, **kwargs).get("value")

    op.__name__ = name
    op.__doc__ = f"""``{name}`` of the value's batch shape, as ``TensorDict.{name}`` does for its entries.

    Returns:
        A new ``NonTensorData`` or ``NonTensorStack`` (values are shared, not copied).

    >>> from tdshare import NonTensorStack
    >>> NonTensorStack("a", "b", "c", "d").{name}.__name__
    '{name}'
    """
    return op


for _name in (
    "expand",
    "flatten",
    "permute",
    "repeat",
    "repeat_interleave",
    "reshape",
    "squeeze",
    "transpose",
    "unflatten",
    "unsqueeze",
    "view",
):
    setattr(NonTensorData, _name, _borrowed(_name))
del _name


def _rebuild_data(data: Any, batch: tuple[int, ...], device: torch.device | None) -> NonTensorData:
    return NonTensorData(data, batch_size=batch, device=device)


class NonTensorStack(NonTensorData):
    """Non-tensor values with a batch shape: one value per element, like the reference's class.

    Args:
        *values: the members, stacked along ``stack_dim``: ``NonTensorData``, ``NonTensorStack``
            or plain values (a plain value is one element), all of one batch size.
        stack_dim: where the new batch dimension goes.

    Returns a stack whose ``tolist()`` is the nested list of the values and whose ``data`` is
    the same list; indexing gives a ``NonTensorData`` for one element, a ``NonTensorStack``
    otherwise; ``==`` compares element-wise into a bool tensor.

    Raises:
        InvalidArgumentError: no values.
        BatchSizeError: members with different batch sizes (the message names the member).

    >>> from tdshare import NonTensorStack
    >>> s = NonTensorStack("a", "b")
    >>> s.tolist(), s[1].data, s.batch_size
    (['a', 'b'], 'b', torch.Size([2]))
    """

    __slots__ = ("_values",)
    _values: list[Any]

    def __init__(self, *values: Any, stack_dim: int = 0, batch_size: Sequence[int] | torch.Size | None = None) -> None:
        if not values:
            raise InvalidArgumentError("NonTensorStack needs at least one value.")
        members = [v if isinstance(v, NonTensorData) else NonTensorData(v) for v in values]
        first = members[0].batch_size
        for i, m in enumerate(members):
            if m.batch_size != first:
                raise BatchSizeError(
                    f"Cannot stack the non-tensor value {i} of batch size {list(m.batch_size)} with value 0 of "
                    f"batch size {list(first)}: every member must have the same batch size."
                )
        built = NonTensorStack._combine(members, [first] * len(members), stack_dim, True)
        if batch_size is not None and as_size(batch_size) != built.batch_size:
            raise BatchSizeError(
                f"NonTensorStack: batch_size={list(as_size(batch_size))} does not match the {len(members)} stacked "
                f"values (batch size {list(built.batch_size)}); leave batch_size out or fix it."
            )
        self._values, self._batch_size, self._device = built._values, built._batch_size, None

    @classmethod
    def _make(cls, values: list[Any], batch: torch.Size) -> NonTensorStack:
        out = cls.__new__(cls)
        out._values, out._batch_size, out._device = values, batch, None
        return out

    @classmethod
    def from_list(cls, data: list, batch_size: Sequence[int] | torch.Size | None = None) -> NonTensorStack:
        """A stack from nested lists: ``batch_size`` levels of them (found by nesting when None).

        Raises:
            ArgumentTypeError: ``data`` is not a list.
            BatchSizeError: the nesting does not match ``batch_size``.

        >>> from tdshare import NonTensorStack
        >>> NonTensorStack.from_list([["a", "b"], ["c", "d"]]).batch_size
        torch.Size([2, 2])
        """
        if not isinstance(data, list):
            raise ArgumentTypeError(f"NonTensorStack.from_list expects a list, got {type(data).__name__}.")
        batch = nested_shape(data) if batch_size is None else as_size(batch_size)
        return cls._make(flatten_values(data, batch, "the list"), batch)

    # -- the value --------------------------------------------------------------------------
    @property
    def data(self) -> Any:
        """The values as nested lists (what ``tolist()`` gives); setting it takes nested lists of the
        stack's batch size.

        Raises:
            BatchSizeError: setting nested lists that do not match the batch size.

        >>> from tdshare import NonTensorStack
        >>> stack = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
        >>> stack.data = [["w", "x"], ["y", "z"]]
        >>> stack.data, stack[1, 0].data
        ([['w', 'x'], ['y', 'z']], 'y')
        """
        return self.tolist()

    @data.setter
    def data(self, value: Any) -> None:
        self._values = flatten_values(value, self._batch_size, "the new value")

    def tolist(self) -> Any:
        """The values as nested lists, one level per batch dimension.

        >>> from tdshare import NonTensorStack
        >>> NonTensorStack.from_list([["a", "b"], ["c", "d"]]).tolist()
        [['a', 'b'], ['c', 'd']]
        """
        return nest_values(list(self._values), self._batch_size)

    def clone(self) -> NonTensorStack:
        """A new stack of the same values (the values themselves are not copied).

        >>> from tdshare import NonTensorStack
        >>> stack = NonTensorStack.from_list(["a", "b"])
        >>> copy = stack.clone()
        >>> copy[0] = "z"
        >>> stack.tolist(), copy.tolist()
        (['a', 'b'], ['z', 'b'])
        """
        return NonTensorStack._make(list(self._values), self._batch_size)

    # -- indexing and shape -----------------------------------------------------------------
    def _index(self, idx: Any) -> NonTensorData:
        positions = torch.arange(len(self._values)).reshape(self._batch_size)[normalize_index(idx, self.batch_dims)]
        flat = positions.reshape(-1).tolist()
        picked = [self._values[i] for i in flat]
        part: NonTensorData = (
            NonTensorData(picked[0]) if positions.dim() == 0 else NonTensorStack._make(picked, positions.shape)
        )
        part.__dict__["_element_of"] = (weakref.ref(self), flat)  # its updates write back to this stack
        return part

    def __getitem__(self, idx: Any) -> NonTensorData:
        return self._index(idx)

    def __setitem__(self, idx: Any, value: Any) -> None:
        """Set the elements at ``idx``: a ``NonTensorStack`` gives one value per element (broadcast
        to the indexed shape), a list one per row, anything else one value for all of them.

        The stack of a memory-mapped or shared tensordict is written where that tensordict keeps it.

        Raises:
            BatchSizeError: a list or stack whose length does not match the indexed elements.
        """
        grid = torch.arange(len(self._values)).reshape(self._batch_size)
        try:
            positions = grid[idx]  # as a tensor of the batch shape indexes (None and True add a dim of 1)
        except (IndexError, TypeError):
            positions = grid[normalize_index(idx, self.batch_dims)]
        shape, at = positions.shape, positions.reshape(-1).tolist()
        if isinstance(value, NonTensorStack):
            new = value._flat_values(shape)
        elif isinstance(value, NonTensorData):
            new = [value.data] * len(at)
        elif isinstance(value, list) and shape:
            new = flatten_values(value, shape, "the assigned list")
        else:
            new = [value] * len(at)
        self._set_flat(at, new)

    def _set_flat(self, at: list[int], new: list[Any]) -> None:
        """Set the elements at the row-major positions ``at`` to ``new`` (written where the stack lives)."""
        values = list(self._values)
        for i, v in zip(at, new, strict=True):
            values[i] = v
        held = self._holder()
        if held is not None and held[0]._get_leaf(held[1], None) is self:
            held[0].set_(held[1], nest_values(values, self._batch_size))
        else:
            self._values = values
            self._persist()

    def __len__(self) -> int:
        return self._batch_size[0] if self._batch_size else 0

    def __iter__(self) -> Iterator[NonTensorData]:
        for i in range(len(self)):
            yield self._index(i)

    def unbind(self, dim: int = 0) -> tuple[NonTensorData, ...]:
        """The slices along ``dim`` (``NonTensorData`` when one dimension is left).

        Args:
            dim: the batch dimension to slice along (negative counts from the end).

        Returns:
            A tuple of ``batch_size[dim]`` slices.

        Raises:
            DimensionError: ``dim`` is outside the batch dimensions.

        >>> from tdshare import NonTensorStack
        >>> stack = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
        >>> [s.tolist() for s in stack.unbind(1)], stack.unbind(1)[0][1].data
        ([['a', 'c'], ['b', 'd']], 'c')
        """
        dim = check_dim(dim, self.batch_dims)
        return tuple(self._index((slice(None),) * dim + (i,)) for i in range(self._batch_size[dim]))

    # -- comparison, representation, pickling ---------------------------------------------
    def __eq__(self, other: object) -> torch.Tensor:  # type: ignore[override]
        """Element-wise equality: a bool tensor of the batch shape."""
        if isinstance(other, NonTensorStack):
            if other.batch_size != self._batch_size:
                raise BatchSizeError(
                    f"Cannot compare NonTensorStacks of batch sizes {list(self._batch_size)} and "
                    f"{list(other.batch_size)}."
                )
            pairs = list(zip(self._values, other._values, strict=True))
        else:
            theirs = other.data if isinstance(other, NonTensorData) else other
            pairs = [(v, theirs) for v in self._values]
        return torch.tensor([NonTensorData(a) == b for a, b in pairs], dtype=torch.bool).reshape(self._batch_size)

    def __ne__(self, other: object) -> torch.Tensor:  # type: ignore[override]
        return ~self.__eq__(other)

    __hash__ = NonTensorData.__hash__

    def __repr__(self) -> str:
        return f"NonTensorStack(\n    {self.tolist()!r},\n    batch_size={self._batch_size},\n    device=None)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_stack, (list(self._values), tuple(self._batch_size)))

    # -- stacking ---------------------------------------------------------------------------
    @classmethod
    def _combine(cls, values: Sequence[Any], batches: Sequence[torch.Size], dim: int, new_dim: bool) -> NonTensorStack:
        """Stack (``new_dim``) or concatenate non-tensor values, each broadcast over its batch."""
        if not values:
            raise InvalidArgumentError("Cannot stack an empty sequence of non-tensor values.")
        flat: list[Any] = []
        positions = []
        for value, batch in zip(values, batches, strict=True):
            batch = torch.Size(batch)
            if isinstance(value, NonTensorStack) and value.batch_size == batch:
                own = list(value._values)
            else:
                own = [value.data if isinstance(value, NonTensorData) else value] * batch.numel()
            positions.append(torch.arange(len(flat), len(flat) + len(own)).reshape(batch))
            flat.extend(own)
        ndim = positions[0].dim() + new_dim
        if ndim == 0:
            raise InvalidArgumentError("Cannot concatenate non-tensor values that have no batch dimension.")
        dim = check_dim(dim, ndim)
        joined = torch.stack(positions, dim) if new_dim else torch.cat(positions, dim)
        return NonTensorStack._make([flat[i] for i in joined.reshape(-1).tolist()], joined.shape)


def _rebuild_stack(values: list[Any], batch: tuple[int, ...]) -> NonTensorStack:
    return NonTensorStack._make(values, torch.Size(batch))


def stack_non_tensor(values: Sequence[NonTensorData], batches: Sequence[torch.Size], dim: int, new_dim: bool) -> Any:
    """The non-tensor entry of stacked (or concatenated) tensordicts of the given batch sizes.

    Equal plain values stay one ``NonTensorData``; values that differ (or stacks) become a
    :class:`NonTensorStack` of the combined batch shape."""
    first = values[0]
    own = getattr(type(first), "_stack_values", None)
    if own is not None:  # a value kind with its own stacking rule (an unbatched tensor's holder)
        return own(values, batches, dim, new_dim)
    plain = all(type(v) is not NonTensorStack and not isinstance(v, NonTensorStack) for v in values)
    if plain and capture_non_tensor_stack() and all(first == v for v in values[1:]):
        return NonTensorData(first.data)
    return NonTensorStack._combine(list(values), list(batches), dim, new_dim)


def assign_elements(leaf: NonTensorData, batch: torch.Size, idx: Any, value: Any) -> NonTensorStack | None:
    """``leaf`` with the elements at ``idx`` (of a tensordict of batch ``batch``) set to ``value``.

    What ``td[idx] = other`` does to a non-tensor entry, as in the reference: values equal to the
    entry's leave it alone (None is returned); others make it a :class:`NonTensorStack` holding one
    value per element.  ``value`` is a plain value, a ``NonTensorData``, or a ``NonTensorStack`` of
    the indexed shape.

    Raises:
        BatchSizeError: a ``NonTensorStack`` value whose element count is not the index's.
    """
    plain = not isinstance(value, NonTensorStack)
    one = value.data if isinstance(value, NonTensorData) and plain else value
    if plain and not isinstance(leaf, NonTensorStack) and NonTensorData(leaf.data) == one:
        return None  # the common case (a constant field written row by row): no index work at all
    full = leaf.batch_size if isinstance(leaf, NonTensorStack) else batch
    positions = torch.arange(math.prod(full)).reshape(full)[idx].flatten().tolist()
    if isinstance(value, NonTensorStack):
        new = list(value._values)
        if len(new) != len(positions):
            raise BatchSizeError(
                f"td[index] = value: the index selects {len(positions)} elements, but the non-tensor value "
                f"holds {len(new)}."
            )
    else:
        new = [one] * len(positions)
    if isinstance(leaf, NonTensorStack):
        values = list(leaf._values)
    elif all(NonTensorData(leaf.data) == v for v in new):
        return None
    else:
        values = [leaf.data] * math.prod(full)
    for at, v in zip(positions, new, strict=True):
        values[at] = v
    return NonTensorStack._make(values, full)


def nested_shape(data: Any) -> torch.Size:
    """The batch shape of nested lists: descend while every element is a list of one common length."""
    shape: list[int] = []
    level = [data]
    while all(isinstance(x, list) for x in level) and len({len(x) for x in level}) == 1:
        n = len(level[0])
        shape.append(n)
        level = [y for x in level for y in x]
        if n == 0:
            break
    return torch.Size(shape)


def nest_values(values: list[Any], batch: torch.Size) -> Any:
    """The flat, row-major ``values`` as nested lists, one level per dimension of ``batch``."""
    if not batch:
        return values[0]
    step = math.prod(batch[1:])
    return [nest_values(values[i * step : (i + 1) * step], batch[1:]) for i in range(batch[0])]


def flatten_values(data: Any, batch: torch.Size, what: str) -> list[Any]:
    """Nested lists of shape ``batch`` as one flat, row-major list.

    Raises:
        BatchSizeError: the nesting does not match ``batch`` (``what`` names the value).
    """
    if not batch:
        return [data]
    if not isinstance(data, (list, tuple)) or len(data) != batch[0]:
        raise BatchSizeError(
            f"{what} does not match the batch size {list(batch)}: expected a list of {batch[0]} elements, "
            f"got {type(data).__name__}{f' of {len(data)}' if isinstance(data, (list, tuple)) else ''}."
        )
    return [v for item in data for v in flatten_values(item, batch[1:], what)]


set_value_classes(NonTensorData, NonTensorStack)
NONTENSOR = register(NodeKind("NonTensorData", VALUE, "NonTensorData", NonTensorData, NONTENSOR_TYPE))
NONTENSOR_STACK = register(
    NodeKind("NonTensorStack", VALUE_STACK, "NonTensorStack", NonTensorStack, NONTENSOR_STACK_TYPE)
)
