"""LazyStackedTensorDict: tensordicts stacked along a batch dimension without copying them.

The members keep their own entries: they must agree on the batch size, but may differ in keys
and in the shapes beyond the batch dimensions.  Reading an entry all members share stacks it
(``ls["x"]``); indexing along the stack dimension gives a member itself (``ls[0] is member``);
writes go into the members.  On disk it is the reference's layout (:mod:`tdshare._format`,
``STACK``): a folder whose ``meta.json`` holds ``stack_dim`` and members in ``0/``, ``1/``...,
each a full level; every method of :class:`tdshare.TensorDictBase` works on it.

It derives from :class:`tdshare._tensordict_base.TensorDictBase`, so that a parent tensordict
recurses into it as into any child (lock, index, map, compare, pickle); every method that would
read the base class's single level of entries is overridden here, and the base class reaches a
lazy child only through the hooks it overrides (``_get_leaf``, ``_set``, ``_iter_keys``,
``_stored_tensors``, ``_index``, ``_map``, ``_propagate``, ``_compare``, ``_combine``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch

from ._errors import (
    ArgumentTypeError,
    BatchSizeError,
    ContainsKeyTypeError,
    InvalidArgumentError,
    LockedError,
    MissingKeyError,
    NotSupportedError,
)
from ._format import LAZY_STACK_TYPE, STACK
from ._indexing import is_key
from ._key_ops import NO_DEFAULT
from ._keys import NestedKey, unravel_key
from ._lazy_index import LazyIndexOps
from ._lazy_memmap import LazyStackMemmap
from ._lazy_ops import LazyStackOps
from ._nodes import NodeKind, kind_of, register
from ._nontensor import NonTensorData, NonTensorStack, stack_non_tensor
from ._private_compat import record_lock_parents
from ._ragged import RaggedReads
from ._setters import pop_missing
from ._tensordict import TensorDict
from ._tensordict import TensorDictBase as PublicTensorDictBase  # the model's TensorDictBase is imported too
from ._tensordict_base import TensorDictBase, device_set_refused

__all__ = ["LazyStackedTensorDict", "LAZY_STACK", "dense_compatible", "into"]

T = TypeVar("T", bound="LazyStackedTensorDict")
_NO_DEFAULT: Any = NO_DEFAULT  # the one marker TensorDictBase.get knows
_FULL = slice(None)


def into(out: Any, result: Any) -> Any:
    """``result``, or, with ``out``, ``result`` written into ``out``'s tensors in place and ``out`` (the
    ``out=`` of the stacking functions)."""
    if out is None:
        return result
    out.update_(result)
    return out


def wrapped_stack(values: Sequence[Any], dim: int, **kwargs: Any) -> Any:
    """Instances of one registered class around a collection (a tensorclass), stacked lazily: that
    class around a lazy stack of their tensordicts; None for anything else."""
    kind = kind_of(values[0]) if values else None
    if kind is None or kind.unwrap is None or kind.wrap is None or kind.layout == STACK:
        return None
    if any(kind_of(v) is not kind for v in values):
        return None
    parts = [kind.unwrap(v) for v in values]
    inner = [p[0] for p in parts]
    if not all(isinstance(i, TensorDictBase) for i in inner):
        return None
    return kind.wrap(LazyStackedTensorDict(*inner, stack_dim=dim, **kwargs), parts[0][1])


def _holds_collection(td: Any, key: str) -> bool:
    """Whether ``td``'s entry ``key`` is a tensordict (in every member, for a lazy stack)."""
    stack = td._stack_parts()
    if stack is not None:
        return all(_holds_collection(member, key) for member in stack[0])
    return isinstance(td._tensordict.get(key), TensorDictBase)


def dense_compatible(items: Sequence[Any]) -> bool:
    """Whether the tensordicts (or tensorclass instances) have the same keys and the same shapes, so
    that a dense stack of them exists (no lazy stack among them).

    >>> dense_compatible([TensorDict(a=torch.zeros(2)), TensorDict(a=torch.ones(2))])
    True
    """
    tds = [_collection(i) for i in items]
    if any(td._lazy_members() is not None for td in tds):
        return False
    keys = [set(td.keys(True, True)) for td in tds]
    if any(k != keys[0] for k in keys):
        return False
    for key in keys[0]:
        values = [td._get_leaf(unravel_key(key)) for td in tds]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if len(tensors) not in (0, len(values)) or len({tuple(t.shape) for t in tensors}) > 1:
            return False
    return True


def _collection(item: Any) -> Any:
    """A tensordict, or the one a registered wrapper (a tensorclass instance) holds."""
    kind = kind_of(item)
    if not isinstance(item, TensorDictBase) and kind is not None and kind.unwrap is not None:
        return kind.unwrap(item)[0]
    return item


class LazyStackedTensorDict(LazyStackOps, LazyStackMemmap, LazyIndexOps, RaggedReads, PublicTensorDictBase):
    """Tensordicts stacked along ``stack_dim`` lazily: the members stay as they are.

    Args:
        *tensordicts: the members (``TensorDict`` or lazy stacks), all of one batch size; none
            makes an empty stack (its stack dim of size 0).
        stack_dim: the position of the new batch dimension (negative counts from the end).
        stack_dim_name: the name of that dimension, if any.
        strict_shape: accepted as the reference takes it; the members must agree on the batch size
            whatever its value (the reference, without it, allows ragged batch dims).
        batch_size, device: for an empty stack, its members' batch size (default ``[]``) and the
            device (default None); with members, they are the members'.

    Returns a stack whose batch size is the members' with ``len(tensordicts)`` inserted at
    ``stack_dim``.

    Raises:
        InvalidArgumentError: ``stack_dim`` outside the batch dimensions.
        ArgumentTypeError: a member that is not a tensordict (the message names it).
        BatchSizeError: members whose batch sizes differ (the message names the member).

    >>> from tdshare import TensorDict, LazyStackedTensorDict
    >>> import torch
    >>> a = TensorDict(x=torch.zeros(3, 2), y=torch.ones(3), batch_size=[3])
    >>> b = TensorDict(x=torch.ones(3, 5), batch_size=[3])
    >>> ls = LazyStackedTensorDict(a, b)
    >>> ls.batch_size, ls.keys(), ls[0] is a
    (torch.Size([2, 3]), ['x'], True)
    """

    _members: list[TensorDictBase]
    _stack_dim: int
    _stack_dim_name: str | None

    def __init__(
        self,
        *tensordicts: TensorDictBase,
        stack_dim: int = 0,
        stack_dim_name: str | None = None,
        strict_shape: bool = False,
        batch_size: Sequence[int] | torch.Size | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        del strict_shape  # tdshare's members always agree on the batch size (see the class docstring)
        members = list(tensordicts)
        # an empty stack's own batch size and device (a stack with members follows them)
        self._empty_batch = torch.Size(batch_size or [])
        self._empty_device = None if device is None else torch.device(device)
        base = TensorDictBase
        if not all(isinstance(td, base) for td in members):  # (one pass each: a stack of a thousand members)
            i, td = next((i, td) for i, td in enumerate(members) if not isinstance(td, base))
            raise ArgumentTypeError(f"Member {i} of the lazy stack is a {type(td).__name__}, not a tensordict.")
        sizes = [td.batch_size for td in members] or [self._empty_batch]
        if sizes.count(sizes[0]) != len(sizes):
            i = next(i for i, size in enumerate(sizes) if size != sizes[0])
            raise BatchSizeError(
                f"Member {i} of the lazy stack has batch size {list(sizes[i])}, member 0 has {list(sizes[0])}: the "
                "batch sizes in tensordicts differs, and stacking tensordicts requires them to agree on the batch "
                "dimensions (tdshare has no ragged batch dims: pad or index the members first)."
            )
        ndim = len(sizes[0]) + 1
        if not -ndim <= stack_dim < ndim:
            raise InvalidArgumentError(f"stack_dim {stack_dim} is out of range for {ndim} batch dimension(s).")
        self._members = []  # before _init_empty: the batch size is computed from the members
        self._init_empty(torch.Size([]), None)
        self._members = members
        self._stack_dim = stack_dim % ndim
        self._stack_dim_name = stack_dim_name

    @classmethod
    def lazy_stack(cls: type[T], tds: Sequence[TensorDictBase], dim: int = 0, *, out: Any = None, **kwargs: Any) -> T:
        """``LazyStackedTensorDict(*tds, stack_dim=dim)`` (the reference's spelling); with ``out``, the
        stack is written into ``out``'s tensors in place (``out.update_``) and ``out`` returned.

        >>> from tdshare import TensorDict, LazyStackedTensorDict
        >>> LazyStackedTensorDict.lazy_stack([TensorDict(batch_size=[2])] * 3, 1).batch_size
        torch.Size([2, 3])
        """
        wrapped = wrapped_stack(list(tds), dim, **kwargs)
        if wrapped is not None:  # instances of one tensorclass: that class around a lazy stack of theirs
            return into(out, wrapped)
        return into(out, cls(*tds, stack_dim=dim, **kwargs))

    @classmethod
    def maybe_dense_stack(cls, tds: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
        """A dense stack when the tensordicts share keys and shapes (``TensorDict.stack``), else a lazy
        one; with ``out`` the result is written into ``out`` in place and ``out`` returned.

        >>> from tdshare import TensorDict, LazyStackedTensorDict
        >>> a = TensorDict(x=torch.zeros(2))
        >>> type(LazyStackedTensorDict.maybe_dense_stack([a, a])).__name__
        'TensorDict'
        >>> type(LazyStackedTensorDict.maybe_dense_stack([a, TensorDict(x=torch.zeros(3))])).__name__
        'LazyStackedTensorDict'
        """
        items = list(tds)
        if not dense_compatible(items):
            return cls.lazy_stack(items, dim, out=out, **kwargs)
        if all(isinstance(i, TensorDictBase) for i in items):
            return TensorDict.stack(items, dim, out=out)
        return into(out, torch.stack(items, dim))  # tensorclass instances: an instance of their class

    @classmethod
    def _new_stack(cls: type[T], members: Sequence[Any], stack_dim: int, name: str | None, **empty: Any) -> T:
        return cls(*members, stack_dim=stack_dim, stack_dim_name=name, **empty)

    @classmethod
    def _level_class(cls) -> type[TensorDictBase]:
        return TensorDict  # the members, and whatever a loader finds, are levels

    @classmethod
    def _from_leaves(cls, leaves: dict, batch_size: torch.Size, device: Any, names: list | None = None) -> Any:
        raise NotSupportedError("A LazyStackedTensorDict has no single level of entries to build.")

    # -- the members and the shape -----------------------------------------------------------
    @property
    def tensordicts(self) -> list[TensorDictBase]:
        """The members, in stack order (the list itself: replacing one changes the stack).

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> a, b = TensorDict(x=torch.zeros(2)), TensorDict(x=torch.ones(2))
        >>> ls = LazyStackedTensorDict(a, b)
        >>> ls.tensordicts[1] = TensorDict(x=torch.full((2,), 5.0))
        >>> ls.tensordicts[0] is a, ls["x"].tolist()
        (True, [[0.0, 0.0], [5.0, 5.0]])
        """
        return self._members

    @property
    def stack_dim(self) -> int:
        """The batch dimension the members are stacked along (non-negative).

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(*[TensorDict(batch_size=[2]) for _ in range(3)], stack_dim=-1)
        >>> ls.stack_dim, ls.batch_size
        (1, torch.Size([2, 3]))
        """
        return self._stack_dim

    @property
    def _batch_size(self) -> torch.Size:
        if not self._members:
            batch = list(self._empty_batch)
            if hasattr(self, "_stack_dim"):  # (not yet while __init__ runs)
                batch.insert(self._stack_dim, 0)
            return torch.Size(batch)
        batch = list(self._members[0].batch_size)
        batch.insert(self._stack_dim, len(self._members))
        return torch.Size(batch)

    @_batch_size.setter
    def _batch_size(self, value: torch.Size) -> None:
        if self._members and torch.Size(value) != self._batch_size:
            raise NotSupportedError("The batch size of a LazyStackedTensorDict follows its members; set theirs.")

    @property
    def _tensordict(self) -> dict[str, Any]:
        raise NotSupportedError(
            "This operation reads a single level of entries, which a LazyStackedTensorDict does not have; "
            "convert it with to_tensordict() first, or work on its members (ls.tensordicts)."
        )

    @_tensordict.setter
    def _tensordict(self, value: dict[str, Any]) -> None:
        if value:
            raise NotSupportedError("A LazyStackedTensorDict keeps its entries in its members.")

    @property
    def batch_size(self) -> torch.Size:
        """The members' batch size with the stack dimension inserted.

        Setting it is allowed only to the same value (:class:`NotSupportedError` otherwise): the batch
        size follows the members, so set theirs.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(*[TensorDict(batch_size=[4]) for _ in range(3)], stack_dim=1)
        >>> ls.batch_size, ls.tensordicts[0].batch_size
        (torch.Size([4, 3]), torch.Size([4]))
        """
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: Sequence[int] | torch.Size) -> None:
        self._batch_size = torch.Size(value)

    @property
    def names(self) -> list:
        """The dimension names: the members' with ``stack_dim_name`` at the stack dimension.

        Setting it names the stack dimension and the members' dimensions (None clears them all).

        Raises:
            InvalidArgumentError: setting a list whose length is not the number of batch dimensions.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> a, b = TensorDict(batch_size=[2], names=["n"]), TensorDict(batch_size=[2], names=["n"])
        >>> LazyStackedTensorDict(a, b, stack_dim_name="s").names
        ['s', 'n']
        """
        names = list(self._members[0].names) if self._members else [None] * len(self._empty_batch)
        names.insert(self._stack_dim, self._stack_dim_name)
        return names

    @names.setter
    def names(self, value: Sequence[str | None] | None) -> None:
        if value is None:
            self._stack_dim_name = None
            for td in self._members:
                td.names = None
            return
        value = list(value)
        if len(value) != self.batch_dims:
            raise InvalidArgumentError(
                f"names has {len(value)} entries but the lazy stack has {self.batch_dims} batch dimensions."
            )
        self._stack_dim_name = value.pop(self._stack_dim)
        for td in self._members:
            td.names = value

    @property
    def device(self) -> torch.device | None:
        """The members' common device (None when they differ or have none).

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> cpu = LazyStackedTensorDict(TensorDict(device="cpu"), TensorDict(device="cpu"))
        >>> cpu.device, LazyStackedTensorDict(TensorDict(device="cpu"), TensorDict()).device
        (device(type='cpu'), None)
        """
        if not self._members:
            return self._empty_device
        devices = {td.device for td in self._members}
        return devices.pop() if len(devices) == 1 else None

    @device.setter
    def device(self, value: Any) -> None:
        raise device_set_refused("tensordict")

    @property
    def is_locked(self) -> bool:
        """Whether structural changes are refused: locked itself, or every member locked.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> a, b = TensorDict().lock_(), TensorDict()
        >>> ls = LazyStackedTensorDict(a, b)
        >>> one_locked = ls.is_locked
        >>> _ = b.lock_()
        >>> one_locked, ls.is_locked
        (False, True)
        """
        return self._is_locked or (bool(self._members) and all(td.is_locked for td in self._members))

    def _propagate(self, fn: Callable[[TensorDictBase], None]) -> None:
        fn(self)
        for td in self._members:
            td._propagate(fn)

    def _stored_tensors(self) -> Iterator[torch.Tensor]:
        for td in self._members:
            yield from td._stored_tensors()

    # -- reading -----------------------------------------------------------------------------
    def _shared_keys(self) -> list[str]:
        if not self._members:
            return []
        first = self._members[0]
        others = [set(td.keys()) for td in self._members[1:]]
        return [k for k in first.keys() if all(k in o for o in others)]

    def _values_of(self, key: str) -> list[Any]:
        return [td._get_leaf((key,)) for td in self._members]

    def _stacked(self, key: str, values: list[Any]) -> Any:
        """The members' values of ``key`` stacked along the stack dimension."""
        d = self._stack_dim
        if all(isinstance(v, TensorDictBase) for v in values):
            return LazyStackedTensorDict(*values, stack_dim=d)
        wrapped = wrapped_stack(values, d)
        if wrapped is not None:
            return wrapped
        if all(isinstance(v, NonTensorData) for v in values):
            return stack_non_tensor(values, [td.batch_size for td in self._members], d, True)
        if all(isinstance(v, torch.Tensor) for v in values):
            shapes = {tuple(v.shape) for v in values}
            if len(shapes) > 1:
                raise NotSupportedError(
                    f"Failed to stack tensors within a tensordict under the key {key!r}: their shapes differ across "
                    f"the members ({[list(v.shape) for v in values]}). Read them with get({key!r}, "
                    "as_padded_tensor=True), as_nested_tensor=True or as_list=True, or from ls.tensordicts[i]."
                )
            return torch.stack([torch.Tensor.as_subclass(v, torch.Tensor) for v in values], d)
        raise NotSupportedError(
            f"Cannot stack the entry {key!r} of the lazy stack: it holds different kinds of values across the "
            f"members ({[type(v).__name__ for v in values]})."
        )

    def _get_leaf(self, key: tuple[str, ...], default: Any = _NO_DEFAULT) -> Any:
        part = key[0]
        missing = [i for i, td in enumerate(self._members) if part not in td.keys()]
        if missing:
            if default is not _NO_DEFAULT:
                return default
            raise MissingKeyError(
                f"key {part!r} is not in every member of the LazyStackedTensorDict (members {missing} lack it); "
                f"keys all members share: {self._shared_keys()}. Read it from ls.tensordicts[i]."
            )
        value = self._stacked(part, self._values_of(part))
        if len(key) == 1:
            return value
        if not isinstance(value, TensorDictBase):
            if default is not _NO_DEFAULT:
                return default
            raise MissingKeyError(f"Cannot read {key!r}: {part!r} is a leaf, not a nested tensordict.")
        return value._get_leaf(key[1:], default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, PublicTensorDictBase):  # `member in ls`: one of the members, itself
            return any(td is key for td in self._members)
        if not is_key(key):
            raise ContainsKeyTypeError(
                f"`key in td` takes a NestedKey (a string or a tuple of strings), got {type(key).__name__} {key!r}."
            )
        return all(key in td for td in self._members)

    def _iter_keys(self, include_nested: bool, leaves_only: bool, prefix: tuple[str, ...] = ()) -> Iterator[Any]:
        for key in self._shared_keys():
            full = (*prefix, key)
            is_td = all(_holds_collection(td, key) for td in self._members)  # no leaf is read (or stacked)
            if not (is_td and leaves_only):
                yield full if prefix else key
            if is_td and include_nested:
                values = [td._get_leaf((key,)) for td in self._members]
                yield from LazyStackedTensorDict(*values, stack_dim=self._stack_dim)._iter_keys(True, leaves_only, full)

    def _iter_items(
        self, include_nested: bool, leaves_only: bool, prefix: tuple[str, ...] = ()
    ) -> Iterator[tuple[Any, Any]]:
        for key in self._iter_keys(include_nested, leaves_only, prefix):
            yield key, self._get_leaf(key[len(prefix) :] if isinstance(key, tuple) else (key,))

    # -- writing -----------------------------------------------------------------------------
    def _pieces(self, key: Any, value: Any) -> list[Any]:
        """``value`` split into one piece per member along the stack dimension."""
        n, d = len(self._members), self._stack_dim
        if getattr(value, "_pass_through", False):
            return [value] * n  # an UnbatchedTensor: every member holds it whole
        if isinstance(value, (torch.Tensor, TensorDictBase, NonTensorStack)):
            if tuple(value.shape[: self.batch_dims]) != tuple(self.batch_size):
                raise BatchSizeError(
                    f"batch dimension mismatch for key {key!r}: the value has shape {list(value.shape)}, but the "
                    f"lazy stack's batch size is {list(self.batch_size)}."
                )
            return list(value.unbind(d))
        if isinstance(value, Mapping):
            return list(TensorDict(value, batch_size=self.batch_size).unbind(d))
        if isinstance(value, (bool, int, float, complex)):
            return list(torch.as_tensor(value).expand(self.batch_size).unbind(d))
        return [value] * n  # a non-tensor value: the same for every member

    def _set(self, key: tuple[str, ...], value: Any, inplace: bool = False) -> None:
        if self._is_locked and not (inplace and key in self):
            raise LockedError(f"Cannot modify a locked LazyStackedTensorDict (key {key!r}); unlock it first.")
        for td, piece in zip(self._members, self._pieces(key, value), strict=True):
            td._set(key, piece, inplace)

    def set_(self: T, key: NestedKey, value: Any) -> T:
        """Write ``value`` into the existing entry ``key`` of every member (allowed while locked).

        Args:
            key: the entry (a string or a tuple of strings for a nested one).
            value: the stacked value; it is split along the stack dimension, one piece per member.

        Returns:
            ``self``.

        Raises:
            MissingKeyError: a member has no entry ``key`` (``set()`` adds one).
            BatchSizeError: ``value`` does not have the stack's batch size.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(x=torch.zeros(2)), TensorDict(x=torch.ones(2)))
        >>> _ = ls.lock_().set_("x", torch.full((2, 2), 7.0))
        >>> ls.tensordicts[1]["x"].tolist()
        [7.0, 7.0]
        """
        parts = unravel_key(key)
        for td, piece in zip(self._members, self._pieces(parts, value), strict=True):
            td.set_(parts, piece)
        return self

    def pop(self, key: NestedKey, default: Any = _NO_DEFAULT) -> Any:
        """Remove ``key`` from every member; return the stacked value (or ``default``).

        Args:
            key: the entry (a string or a tuple of strings for a nested one).
            default: returned, and nothing removed, when some member lacks ``key``.

        Returns:
            The value stacked across the members (as ``ls.get(key)``), or ``default``.

        Raises:
            MissingKeyError: some member lacks ``key`` and no ``default`` is given.
            LockedError: the stack is locked.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(x=torch.zeros(2)), TensorDict(x=torch.ones(2)))
        >>> ls.pop("x").tolist(), ls.keys(), ls.pop("x", None)
        ([[0.0, 0.0], [1.0, 1.0]], [], None)
        """
        parts = unravel_key(key)
        lacking = [i for i, td in enumerate(self._members) if parts not in td]
        if lacking:
            if default is not _NO_DEFAULT:
                return default
            raise pop_missing(key, f"members {lacking} of the LazyStackedTensorDict lack it")
        value = self.get_non_tensor(parts)
        self.del_(parts)
        return value

    def del_(self: T, key: NestedKey) -> T:
        """Remove ``key`` from every member (no stacking, so any shapes may differ).

        Args:
            key: the entry (a string or a tuple of strings for a nested one).

        Returns:
            ``self``.

        Raises:
            MissingKeyError: a member lacks ``key``.
            LockedError: the stack is locked.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(x=torch.zeros(1), y=torch.ones(1)), TensorDict(x=torch.zeros(3)))
        >>> ls.del_("x").tensordicts[0].keys(), ls.tensordicts[1].keys()
        (['y'], [])
        """
        if self._is_locked:
            raise LockedError(f"Cannot modify a locked LazyStackedTensorDict (key {key!r}); unlock it first.")
        for td in self._members:
            td.del_(key)
        return self

    def __delitem__(self, key: NestedKey) -> None:
        self.del_(key)

    def rename_key_(self: T, old_key: NestedKey, new_key: NestedKey, safe: bool = False) -> T:
        """Rename the entry in every member (see ``TensorDict.rename_key_``).

        Args:
            old_key: the entry to rename.
            new_key: its new name.
            safe: refuse to overwrite an existing ``new_key``.

        Returns:
            ``self``.

        Raises:
            MissingKeyError: a member lacks ``old_key``, or has ``new_key`` already while ``safe``.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(x=torch.zeros(2)), TensorDict(x=torch.ones(2)))
        >>> ls.rename_key_("x", "z").keys(), ls.tensordicts[1]["z"].tolist()
        (['z'], [1.0, 1.0])
        """
        for td in self._members:
            td.rename_key_(old_key, new_key, safe=safe)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        state = (
            self._members or (self._empty_batch, self._empty_device),
            self._stack_dim,
            self._stack_dim_name,
            self._is_locked,
            self._is_memmap,
            self._is_shared,
            self._memmap_prefix,
            self._anon_store,
            self._generation,
        )
        return (_rebuild, (type(self), state))


def _rebuild(cls: type[LazyStackedTensorDict], state: tuple[Any, ...]) -> LazyStackedTensorDict:
    members, dim, name, locked, memmap, shared, prefix, anon_store, generation = state
    if isinstance(members, tuple):  # an empty stack: its members' batch size and its device
        out = cls(stack_dim=dim, stack_dim_name=name, batch_size=members[0], device=members[1])
    else:
        out = cls(*members, stack_dim=dim, stack_dim_name=name)
    out._is_locked, out._is_memmap, out._is_shared = locked, memmap, shared
    out._memmap_prefix, out._anon_store, out._generation = prefix, anon_store, generation
    if locked:
        record_lock_parents(out, out._propagate)
    return out


def _unwrap(ls: LazyStackedTensorDict) -> tuple[list[TensorDictBase], dict[str, Any]]:
    return ls.tensordicts, {"stack_dim": ls.stack_dim, "stack_dim_name": ls._stack_dim_name}


def _wrap(members: list[TensorDictBase], fields: dict[str, Any]) -> LazyStackedTensorDict:
    return LazyStackedTensorDict(*members, stack_dim=fields["stack_dim"], stack_dim_name=fields.get("stack_dim_name"))


LAZY_STACK = register(
    NodeKind(
        "LazyStackedTensorDict",
        STACK,
        "LazyStackedTensorDict",
        LazyStackedTensorDict,
        LAZY_STACK_TYPE,
        unwrap=_unwrap,
        wrap=_wrap,
    )
)
