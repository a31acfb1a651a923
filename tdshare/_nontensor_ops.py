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

from ._errors import BatchSizeError, InvalidArgumentError, LockedError, NotSupportedError

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

        def _mapped(self, fn: Any) -> Any: ...

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
        """Whether the value can be replaced only in place (``update_``): its tensordict is locked.

        >>> from tdshare import TensorDict
        >>> td = TensorDict({"s": "hello"})
        >>> td.get("s").is_locked, td.lock_().get("s").is_locked
        (False, True)
        """
        return self._is_locked

    def is_shared(self) -> bool:
        """Whether the value lives in a shared tensordict (``share_memory_``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict({"s": "hello"})
        >>> td.get("s").is_shared(), td.share_memory_().get("s").is_shared()
        (False, True)
        """
        return self._is_shared

    def is_memmap(self) -> bool:
        """Whether the value lives in a memory-mapped tensordict (its folder holds it).

        >>> import tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     td = TensorDict({"s": "hello"})
        ...     print(td.get("s").is_memmap(), td.memmap_(path).get("s").is_memmap())
        False True
        """
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

    def contiguous(self, *, canonical: bool = False, inplace: bool = False) -> Any:
        """The value in its contiguous form, as the reference gives it.

        A ``NonTensorStack`` is its own contiguous form (``self``: it holds no tensors, and the
        tensordict route would lose its values); a single value gives a new entry of its class
        over the same value and batch size (``self`` with ``inplace=True``).

        Args:
            canonical: accepted for the tensordict signature (a non-tensor value has no strides).
            inplace: return ``self``.

        Returns:
            ``self`` or a new entry sharing the value.

        >>> from tdshare import NonTensorData, NonTensorStack
        >>> s = NonTensorStack("a", "b")
        >>> s.contiguous() is s, NonTensorData("a").contiguous().data
        (True, 'a')
        """
        if inplace or self._is_stack():
            return self
        return self._mapped(torch.Tensor.contiguous)

    def update_(self, input_dict_or_td: Any, *args: Any, non_blocking: bool = False, **kwargs: Any) -> Any:
        """Replace the value in place, where it lives: the stack it was read from (``stack[i]``,
        also of a memory-mapped stack, whose folder is rewritten), or its tensordict (its folder
        when memory-mapped).

        Args:
            input_dict_or_td: the new value: a ``NonTensorData`` (its value is taken) or a plain value;
                for a ``NonTensorStack``, a stack of its batch size or one value for every element.
            non_blocking: accepted for the reference's signature.

        Returns:
            ``self``.

        Raises:
            InvalidArgumentError: a single value updated with a ``NonTensorStack``.

        >>> from tdshare import NonTensorStack
        >>> from tdshare import NonTensorData
        >>> v = NonTensorData("a")
        >>> v.update_(NonTensorData("b")).data
        'b'
        >>> s = NonTensorStack("a", "b")
        >>> s[1].update_("z") is not None, s.tolist()
        (True, ['a', 'z'])
        """
        new = input_dict_or_td
        if self._is_stack():
            if not isinstance(new, _stack()):  # one value for every element
                plain = new.data if isinstance(new, _data()) else new
                new = _stack()._make([plain] * self.batch_size.numel(), self.batch_size)
            value: Any = new.tolist()
            flat = new._flat_values(self.batch_size)
        elif isinstance(new, _stack()):
            raise InvalidArgumentError(
                "Cannot update a NonTensorData with a NonTensorStack (one value per element): make this value a "
                "stack first, value.maybe_to_stack().update(stack, inplace=True), or store the stack itself."
            )
        else:
            value = new.data if isinstance(new, _data()) else new
            flat = [value]
        link = self.__dict__.get("_element_of")
        if link is not None and (parent := link[0]()) is not None:  # a part of a stack: the stack takes them
            parent._set_flat(link[1], flat)  # (and persists them where it lives)
            self.data = value
            return self
        held = self._holder()
        if held is not None and held[0]._get_leaf(held[1], None) is self:
            held[0].set_(held[1], value)  # written where the tensordict keeps it (and persisted)
        else:
            self.data = value
            self._persist()  # a value memory-mapped on its own rewrites its folder
        return self

    def update(self, input_dict_or_td: Any, *args: Any, inplace: bool = False, **kwargs: Any) -> Any:
        """Replace the value: in place with ``inplace=True`` (as :meth:`update_`).

        A part of a stack (``stack[i]``) writes back to the stack, as :meth:`update_` does.

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
        if inplace or (self.__dict__.get("_element_of") is not None and not self._is_locked):
            return self.update_(input_dict_or_td)
        if self._is_locked:
            raise LockedError(
                "Cannot update a non-tensor value of a locked tensordict: it is locked (memory-mapped, shared "
                "or lock_()). Use update(..., inplace=True) or update_() to replace it in place."
            )
        if isinstance(input_dict_or_td, _stack()) and not self._is_stack():
            return self.update_(input_dict_or_td)  # refused there, with the fix
        self.data = input_dict_or_td.data if isinstance(input_dict_or_td, _data()) else input_dict_or_td
        return self

    def update_at_(self, input_dict_or_td: Any, idx: Any, clone: bool = False, *, non_blocking: bool = False) -> Any:
        """Give the elements at ``idx`` the new value, where the value lives (as ``value[idx] = new``).

        Args:
            input_dict_or_td: the new value (a ``NonTensorData``, a ``NonTensorStack`` or a plain value).
            idx: the batch index; a single value accepts only the whole batch (``()`` or ``slice(None)``).
            clone: accepted for the reference's signature (values are not copied).
            non_blocking: accepted for the reference's signature.

        Returns:
            ``self``.

        Raises:
            NotSupportedError: a part of a single value (make it a stack first: ``maybe_to_stack()``).

        >>> from tdshare import NonTensorStack
        >>> NonTensorStack("a", "b", "c").update_at_("z", slice(1, None)).tolist()
        ['a', 'z', 'z']
        """
        if self._is_stack():
            self[idx] = input_dict_or_td
            return self
        if not ((isinstance(idx, tuple) and not idx) or (isinstance(idx, slice) and idx == slice(None))):
            raise NotSupportedError(
                f"Cannot update a part ({idx!r}) of a NonTensorData: it holds one value for the whole batch. "
                "Make it a stack first (value.maybe_to_stack()) or update the whole value (update_)."
            )
        return self.update_(input_dict_or_td)

    def maybe_to_stack(self) -> Any:
        """This value as a ``NonTensorStack`` of its batch size, the value in every element (not
        copied); a value without batch dims is returned as is, a stack as a new stack of its values.

        >>> from tdshare import NonTensorData
        >>> NonTensorData("a", batch_size=[2]).maybe_to_stack().tolist()
        ['a', 'a']
        """
        if self._is_stack():
            return _stack()._make(self._flat_values(self.batch_size), self.batch_size)
        if not self.batch_size:
            return self
        return _stack()._make([self.data] * self.batch_size.numel(), self.batch_size)

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

    >>> from tdshare import LinkedList
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
        """A plain ``list`` copy of the items (nested lists stay lists), not linked to the stack.

        >>> from tdshare import TensorDict
        >>> values = TensorDict({"names": ["a", "b"]}, batch_size=[2])["names"]
        >>> plain = values.tolist()
        >>> plain[0] = "z"
        >>> type(plain).__name__, plain, values
        ('list', ['z', 'b'], LinkedList(['a', 'b']))
        """
        return [item.tolist() if isinstance(item, LinkedList) else item for item in self]

    def _unlink(self) -> None:
        self._td = _unlinked

    def append(self, item: Any) -> None:
        """Append ``item`` and unlink the list from the stack.

        Args:
            item: the value to append.

        >>> from tdshare import TensorDict
        >>> td = TensorDict({"names": ["a", "b"]}, batch_size=[2])
        >>> values = td["names"]
        >>> values.append("c")
        >>> values[0] = "z"  # unlinked: the stack keeps its value
        >>> values, td.get("names").tolist()
        (LinkedList(['z', 'b', 'c']), ['a', 'b'])
        """
        self._unlink()
        super().append(item)

    def extend(self, items: Iterable[Any]) -> None:
        """Extend the list with ``items`` and unlink it from the stack.

        Args:
            items: the values to append.

        >>> from tdshare import TensorDict
        >>> td = TensorDict({"names": ["a", "b"]}, batch_size=[2])
        >>> values = td["names"]
        >>> values.extend(["c", "d"])
        >>> values[0] = "z"  # unlinked: the stack keeps its value
        >>> values, td.get("names").tolist()
        (LinkedList(['z', 'b', 'c', 'd']), ['a', 'b'])
        """
        self._unlink()
        super().extend(items)

    def insert(self, index: Any, item: Any) -> None:
        """Insert ``item`` at ``index`` and unlink the list from the stack.

        Args:
            index: the position to insert before (as for :meth:`list.insert`).
            item: the value to insert.

        >>> from tdshare import TensorDict
        >>> td = TensorDict({"names": ["a", "b"]}, batch_size=[2])
        >>> values = td["names"]
        >>> values.insert(0, "c")
        >>> values[0] = "z"  # unlinked: the stack keeps its value
        >>> values, td.get("names").tolist()
        (LinkedList(['z', 'a', 'b']), ['a', 'b'])
        """
        self._unlink()
        super().insert(index, item)

    def pop(self, index: Any = -1) -> Any:
        """Remove and return the item at ``index``, and unlink the list from the stack.

        Args:
            index: the position of the item (the last by default).

        Returns:
            The removed item.

        Raises:
            IndexError: the list is empty or ``index`` is out of range.

        >>> from tdshare import TensorDict
        >>> td = TensorDict({"names": ["a", "b"]}, batch_size=[2])
        >>> values = td["names"]
        >>> last = values.pop()
        >>> values[0] = "z"  # unlinked: the stack keeps its value
        >>> last, values, td.get("names").tolist()
        ('b', LinkedList(['z']), ['a', 'b'])
        """
        self._unlink()
        return super().pop(index)

    def remove(self, item: Any) -> None:
        """Remove the first ``item`` and unlink the list from the stack.

        Args:
            item: the value to remove (compared with ``==``).

        Raises:
            ValueError: ``item`` is not in the list.

        >>> from tdshare import TensorDict
        >>> td = TensorDict({"names": ["a", "b"]}, batch_size=[2])
        >>> values = td["names"]
        >>> values.remove("a")
        >>> values[0] = "z"  # unlinked: the stack keeps its value
        >>> values, td.get("names").tolist()
        (LinkedList(['z']), ['a', 'b'])
        """
        self._unlink()
        super().remove(item)

    def clear(self) -> None:
        """Remove every item and unlink the list from the stack.

        >>> from tdshare import TensorDict
        >>> td = TensorDict({"names": ["a", "b"]}, batch_size=[2])
        >>> values = td["names"]
        >>> values.clear()
        >>> values.append("z")  # unlinked: the stack keeps its values
        >>> values, td.get("names").tolist()
        (LinkedList(['z']), ['a', 'b'])
        """
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
