"""What a non-tensor value does as a leaf of a tensordict: where it lives, and its in-place updates.

A ``NonTensorData`` read (``td.get(key)``) from a locked tensordict (memory-mapped, shared, or
``lock_()``) records, as a weak reference, the tensordict and key it came from
(:func:`bind_owner`).  Its ``update_`` / ``update(..., inplace=True)`` then write the new value
where that tensordict keeps it (its folder when memory-mapped), ``update`` without ``inplace``
refuses (it is locked), and ``_is_shared`` / ``_is_memmap`` / ``_tensordict`` answer as the
reference's tensorclass layout does for code written against it.  ``td[key]`` of a
``NonTensorStack`` gives a :class:`LinkedList`: a list of the values whose item assignments
write back to the stack.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from ._errors import BatchSizeError, InvalidArgumentError, LockedError

__all__ = ["LinkedList", "NonTensorOps", "bind_owner", "set_value_classes"]

_CLASSES: dict[str, Any] = {}


def set_value_classes(data_cls: type, stack_cls: type) -> None:
    """Name the ``NonTensorData`` and ``NonTensorStack`` classes (set once by :mod:`tdshare._nontensor`)."""
    _CLASSES.update(data=data_cls, stack=stack_cls)


def _data() -> Any:
    return _CLASSES["data"]


def _stack() -> Any:
    return _CLASSES["stack"]


class NonTensorOps:
    """The leaf-side methods of a non-tensor value (a mixin of ``NonTensorData``)."""

    __slots__ = ()

    # provided by NonTensorData
    __dict__: dict[str, Any]
    data: Any

    if TYPE_CHECKING:

        @property
        def batch_size(self) -> torch.Size: ...

        def _persist(self) -> None: ...

    @classmethod
    def _tensordict_host(cls) -> Any:
        raise NotImplementedError

    def _is_stack(self) -> bool:
        raise NotImplementedError

    def _read_value(self) -> Any:
        """What ``td[key]`` gives for this entry: the value (a :class:`LinkedList` for a stack)."""
        if self._is_stack():
            value: Any = self
            return LinkedList(value.tolist(), td=value)
        return self.data

    def _holder(self) -> tuple[Any, tuple[str, ...]] | None:
        """The tensordict this value was last read from while locked, and its key there (or None)."""
        owner = getattr(self, "_owner", None)
        if owner is None:
            return None
        td = owner[0]()
        return None if td is None else (td, owner[1])

    def _flag(self, name: str) -> bool:
        held = self._holder()
        if held is not None:
            return bool(getattr(held[0], name, False))
        return bool(self.__dict__.get(name, False))

    @property
    def _is_shared(self) -> bool:
        """Whether the value lives in a shared tensordict (or was shared on its own)."""
        return self._flag("_is_shared")

    @property
    def _is_memmap(self) -> bool:
        """Whether the value lives in a memory-mapped tensordict (or was memory-mapped on its own)."""
        return self._flag("_is_memmap")

    @property
    def _is_locked(self) -> bool:
        """Whether the value lives in a locked tensordict (or was locked on its own)."""
        return self._flag("_is_locked")

    @property
    def is_locked(self) -> bool:
        """Whether the value can be replaced only in place (``update_``): its tensordict is locked."""
        return self._is_locked

    def is_shared(self) -> bool:
        """Whether the value lives in a shared tensordict (``share_memory_``)."""
        return self._is_shared

    def is_memmap(self) -> bool:
        """Whether the value lives in a memory-mapped tensordict (its folder holds it)."""
        return self._is_memmap

    @property
    def _tensordict(self) -> Any:
        """An empty tensordict of the value's batch size carrying its shared/memory-mapped flags
        (the reference's tensorclass layout, read by code written against it)."""
        host = self._tensordict_host()({}, batch_size=self.batch_size)
        host._is_shared, host._is_memmap = self._is_shared, self._is_memmap
        return host

    @property
    def _non_tensordict(self) -> dict[str, Any]:
        """The value's fields as the reference's tensorclass layout holds them (``data`` first)."""
        return {"data": self.data, "_metadata": None, "_is_non_tensor": True}

    def update_(self, input_dict_or_td: Any, *args: Any, non_blocking: bool = False, **kwargs: Any) -> Any:
        """Replace the value in place, where its tensordict keeps it (its folder when memory-mapped).

        Args:
            input_dict_or_td: the new value: a ``NonTensorData`` (its value is taken) or a plain value.
            non_blocking: accepted for the reference's signature.

        Returns:
            ``self``.

        >>> from tdshare import NonTensorData
        >>> v = NonTensorData("a")
        >>> v.update_(NonTensorData("b")).data
        'b'
        """
        new = input_dict_or_td
        if self._is_stack():
            if not isinstance(new, _stack()):  # one value for every element
                plain = new.data if isinstance(new, _data()) else new
                new = _stack()._make([plain] * self.batch_size.numel(), self.batch_size)
            value: Any = new.tolist()
        elif isinstance(new, _stack()):
            raise InvalidArgumentError(
                "Cannot update a NonTensorData with a NonTensorStack (one value per element): turn this value "
                "into a stack first, e.g. NonTensorStack.from_list(data.tolist(), data.batch_size)."
            )
        else:
            value = new.data if isinstance(new, _data()) else new
        held = self._holder()
        if held is not None and held[0]._get_leaf(held[1], None) is self:
            held[0].set_(held[1], value)  # written where the tensordict keeps it (and persisted)
        else:
            self.data = value
            self._persist()  # a value memory-mapped on its own rewrites its folder
        return self

    def update(self, input_dict_or_td: Any, *args: Any, inplace: bool = False, **kwargs: Any) -> Any:
        """Replace the value: in place with ``inplace=True`` (as :meth:`update_`).

        Args:
            input_dict_or_td: the new value (a ``NonTensorData`` or a plain value).
            inplace: write where the value's tensordict keeps it; needed when that tensordict is locked.

        Returns:
            ``self``.

        Raises:
            LockedError: the value's tensordict is locked and ``inplace`` is False.

        >>> from tdshare import NonTensorData
        >>> NonTensorData(1).update(NonTensorData(2)).data
        2
        """
        if inplace:
            return self.update_(input_dict_or_td)
        if self._is_locked:
            raise LockedError(
                "Cannot update a non-tensor value of a locked tensordict: it is locked (memory-mapped, shared "
                "or lock_()). Use update(..., inplace=True) or update_() to replace it in place."
            )
        self.data = input_dict_or_td.data if isinstance(input_dict_or_td, _data()) else input_dict_or_td
        return self

    def __setitem__(self, idx: Any, value: Any) -> None:
        """Give the indexed elements ``value``: a single value has one value for all its elements, so the
        whole value becomes ``value`` (an element read from a stack, ``stack[i]``, writes back to it).

        Raises:
            BatchSizeError: ``value`` is a ``NonTensorStack`` of values that differ (store a stack instead).
        """
        new = value
        if isinstance(new, _stack()):
            values = new._flat_values(new.batch_size)
            if any(_data()(v) != values[0] for v in values[1:]):
                raise BatchSizeError(
                    "Cannot give one non-tensor value several values: assign them to a NonTensorStack "
                    "(NonTensorStack.from_list(values)) instead."
                )
            new = values[0]
        elif isinstance(new, _data()):
            new = new.data
        self.update_(new)
        link = self.__dict__.get("_element_of")
        if link is not None and (stack := link[0]()) is not None:
            stack._set_flat([link[1]], [new])

    def _flat_values(self, batch: torch.Size) -> list[Any]:
        """The values of the elements of ``batch`` (row-major), this value broadcast over it."""
        if self._is_stack():
            values: list[Any] = self._values  # type: ignore[attr-defined]
            if self.batch_size == batch:
                return list(values)
            positions = torch.arange(len(values)).reshape(self.batch_size).expand(batch)
            return [values[i] for i in positions.reshape(-1).tolist()]
        return [self.data] * batch.numel()

    def where(self, condition: torch.Tensor, other: Any, *, out: Any = None, pad: Any = None) -> Any:
        """Per element, this value where ``condition`` holds, ``other``'s elsewhere.

        Args:
            condition: a bool tensor of the batch shape (or one that broadcasts to it).
            other: a ``NonTensorData``, ``NonTensorStack`` or plain value (one for every element).
            out: a ``NonTensorStack`` of the batch shape to write the result into (and return).
            pad: accepted for the reference's signature (every element has a value).

        Returns:
            A ``NonTensorStack`` of the batch shape (``out`` when given).

        Raises:
            BatchSizeError: ``condition`` does not broadcast to the batch shape.

        >>> from tdshare import NonTensorStack
        >>> import torch
        >>> NonTensorStack("a", "a").where(torch.tensor([True, False]), "b").tolist()
        ['a', 'b']
        """
        batch = self.batch_size
        cond = torch.as_tensor(condition, dtype=torch.bool)
        try:
            picks = cond.expand(batch).reshape(-1).tolist() if batch else [bool(cond.reshape(-1)[0])]
        except RuntimeError as err:
            raise BatchSizeError(
                f"where: the condition of shape {list(cond.shape)} does not broadcast to the batch size {list(batch)}."
            ) from err
        theirs = other if isinstance(other, _data()) else _data()(other)
        mine, alt = self._flat_values(batch), theirs._flat_values(batch)
        values = [a if keep else b for keep, a, b in zip(picks, mine, alt, strict=True)]
        if isinstance(out, _stack()):
            out._values, out._batch_size = values, batch
            out._persist()
            return out
        return _stack()._make(values, batch)


def bind_owner(td: Any, key: tuple[str, ...], leaf: Any) -> Any:
    """Record, on a non-tensor ``leaf`` of the locked tensordict ``td`` at ``key``, where it lives
    (a weak reference): its ``update_`` then writes through ``td``.  Returns ``leaf``."""
    if isinstance(leaf, NonTensorOps) and td._is_locked:
        leaf._owner = (weakref.ref(td), key)  # type: ignore[attr-defined]
    return leaf


class LinkedList(list):
    """The values of a ``NonTensorStack`` entry (``td[key]``): item assignments write back to the stack.

    Assigning an item or a slice (``values[0] = "z"``) writes it into the stack (and, for a
    stack of a memory-mapped tensordict, to its folder).  Methods that change the length
    (``append``, ``extend``, ``insert``, ``pop``, ``remove``, ``clear``, ``del``) change this list
    only and unlink it.  It compares equal to a list of the same items.

    Args:
        iterable: the items.
        td: the ``NonTensorStack`` to write back to (None: a plain, unlinked list).

    >>> from tdshare import TensorDict
    >>> td = TensorDict({"names": ["a", "b"]}, batch_size=[2])
    >>> values = td["names"]
    >>> values[0] = "z"
    >>> td.get("names").tolist(), values
    (['z', 'b'], LinkedList(['z', 'b']))
    """

    def __init__(self, iterable: Iterable[Any] = (), *, td: Any = None) -> None:
        super().__init__(iterable)
        self._td: Any = weakref.ref(td) if td is not None else _unlinked

    def __setitem__(self, key: Any, value: Any) -> None:
        stack = self._td()
        if stack is None:
            super().__setitem__(key, value)
            return
        old = list(self)
        super().__setitem__(key, value)
        try:
            stack[key] = value
        except Exception:
            super().__setitem__(slice(None), old)
            raise

    def tolist(self) -> list:
        """A plain ``list`` copy of the items (nested lists stay lists), not linked to the stack."""
        return [item.tolist() if isinstance(item, LinkedList) else item for item in self]

    def _unlink(self) -> None:
        self._td = _unlinked

    def append(self, item: Any) -> None:
        """Append ``item`` and unlink the list from the stack."""
        self._unlink()
        super().append(item)

    def extend(self, items: Iterable[Any]) -> None:
        """Extend the list with ``items`` and unlink it from the stack."""
        self._unlink()
        super().extend(items)

    def insert(self, index: Any, item: Any) -> None:
        """Insert ``item`` at ``index`` and unlink the list from the stack."""
        self._unlink()
        super().insert(index, item)

    def pop(self, index: Any = -1) -> Any:
        """Remove and return the item at ``index``, and unlink the list from the stack."""
        self._unlink()
        return super().pop(index)

    def remove(self, item: Any) -> None:
        """Remove the first ``item`` and unlink the list from the stack."""
        self._unlink()
        super().remove(item)

    def clear(self) -> None:
        """Remove every item and unlink the list from the stack."""
        self._unlink()
        super().clear()

    def __delitem__(self, key: Any) -> None:
        self._unlink()
        super().__delitem__(key)

    def __repr__(self) -> str:
        return f"LinkedList({list.__repr__(self)})"

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (LinkedList, (list(self),))  # a copy travels unlinked (the stack stays in this process)

    def __copy__(self) -> LinkedList:
        return LinkedList(self)  # unlinked, as a pickled copy

    __str__ = __repr__


def _unlinked() -> None:
    return None
