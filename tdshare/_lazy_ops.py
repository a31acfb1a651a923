"""The operations of a lazy stack that work member by member and stack the results again.

:class:`LazyStackOps` is the part of :class:`tdshare._lazy.LazyStackedTensorDict` that is not the
container itself (its members, batch size, reading, indexing and writing stay in
:mod:`tdshare._lazy`): the hooks the shared operation families call (``_stack_parts``,
``_restack``, ``_lazy_members``, ``_map``, ``_compare``, ``_combine``), the member-wise
``select``/``exclude``/``empty``/``fill_``/``unbind``, and the dense copies (``to_tensordict``,
``dense_stack``; ``contiguous()`` of a lazy stack is its dense copy, see
:meth:`tdshare._surface_ops.SurfaceOps.contiguous`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from ._errors import (
    ArgumentTypeError,
    BatchSizeError,
    InvalidArgumentError,
    LockedError,
    MissingKeyError,
    NotSupportedError,
)
from ._indexing import check_dim
from ._key_ops import NO_DEFAULT
from ._keys import NestedKey
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase

__all__ = ["LazyStackOps"]

T = TypeVar("T", bound="LazyStackOps")
_NO_DEFAULT: Any = NO_DEFAULT  # the one marker TensorDictBase.get knows


class LazyStackOps(TensorDictBase):
    """The member-wise operations of a lazy stack (a base of ``LazyStackedTensorDict``)."""

    _members: list[TensorDictBase]
    _stack_dim: int
    _empty_batch: torch.Size  # an empty stack's members' batch size (set by the class's constructor)
    _stack_dim_name: str | None

    @classmethod
    def _new_stack(cls: type[T], members: Sequence[Any], stack_dim: int, name: str | None, **empty: Any) -> T:
        """A stack of this class over ``members`` (the subclass builds it); ``empty``: the
        ``batch_size``/``device`` of a stack without members."""
        raise NotImplementedError

    def _empty_options(self, members: Sequence[Any]) -> dict[str, Any]:
        """What a stack built from ``members`` needs to keep this one's shape when it has none."""
        if members:
            return {}
        batch = self._members[0].batch_size if self._members else self._empty_batch
        host: Any = self
        return {"batch_size": batch, "device": host.device}

    # -- derived stacks -----------------------------------------------------------------------
    def _stack_parts(self) -> tuple[list[Any], int] | None:
        return self._members, self._stack_dim  # the shape operations work on the members

    def _restack(self, members: Sequence[Any], stack_dim: int | None = None, keep_name: bool = True) -> Any:
        dim = self._stack_dim if stack_dim is None else stack_dim
        out = self._new_stack(members, dim, self._stack_dim_name if keep_name else None, **self._empty_options(members))
        if self._is_locked:
            out.lock_()
        return out

    def _like(self: T, members: Sequence[TensorDictBase]) -> T:
        return self._new_stack(members, self._stack_dim, self._stack_dim_name, **self._empty_options(members))

    def _lazy_members(self) -> Sequence[TensorDictBase]:
        return self._members  # key operations run member by member (see tdshare._key_ops)

    def _map(
        self: T,
        fn: Callable[[torch.Tensor], Any],
        batch_size: torch.Size | None = None,
        device: Any = _NO_DEFAULT,
        keep_non_tensor: bool = True,
    ) -> T:
        if batch_size is not None:
            raise NotSupportedError("A LazyStackedTensorDict cannot change its batch size through apply().")
        if device is _NO_DEFAULT:
            return self._like([td._map(fn, None, keep_non_tensor=keep_non_tensor) for td in self._members])
        return self._like([td._map(fn, None, device, keep_non_tensor) for td in self._members])

    def select(self: T, *keys: NestedKey, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> T:
        """The members' ``select`` (see ``TensorDict.select``), stacked again (or in place).

        Args:
            *keys: the entries to keep.
            inplace: drop the other entries from the members and return ``self``.
            strict: raise for a key some member lacks (False: skip it).
            as_tensordict: accepted for the reference's signature; the result is a lazy stack.

        Returns:
            A lazy stack of the selected members (``self`` when ``inplace``).

        Raises:
            MissingKeyError: a member lacks one of ``keys`` and ``strict`` is True.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> td = TensorDict(x=torch.zeros(2), y=torch.ones(1))
        >>> ls = LazyStackedTensorDict(td, td.clone())
        >>> ls.select("x").keys(), ls.select("x", "q", strict=False).batch_size
        (['x'], torch.Size([2]))
        """
        if inplace:
            for td in self._members:
                td.select(*keys, inplace=True, strict=strict)
            return self
        return self._like([td.select(*keys, strict=strict) for td in self._members])

    def exclude(self: T, *keys: NestedKey, inplace: bool = False) -> T:
        """The members' ``exclude`` (see ``TensorDict.exclude``), stacked again (or in place).

        Args:
            *keys: the entries to drop (keys a member lacks are skipped).
            inplace: drop them from the members and return ``self``.

        Returns:
            A lazy stack of the members without ``keys`` (``self`` when ``inplace``).

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> td = TensorDict(x=torch.zeros(2), y=torch.ones(1))
        >>> ls = LazyStackedTensorDict(td, td.clone())
        >>> ls.exclude("x", "q").keys(), ls.keys()
        (['y'], ['x', 'y'])
        """
        if inplace:
            for td in self._members:
                td.exclude(*keys, inplace=True)
            return self
        return self._like([td.exclude(*keys) for td in self._members])

    def empty(self: T, recurse: bool = False, *, batch_size: Any = None, device: Any = None) -> T:
        """A lazy stack of the members emptied (see :meth:`TensorDictBase.empty`).

        Args:
            recurse: keep the nested tensordicts (emptied) instead of dropping them.
            batch_size: a new batch size (not supported for a lazy stack).
            device: a new device (not supported for a lazy stack).

        Returns:
            A new lazy stack, of the same batch size, whose members have no entries.

        Raises:
            NotSupportedError: ``batch_size`` or ``device`` is given.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> td = TensorDict(a=TensorDict(b=torch.ones(1)), c=torch.ones(1))
        >>> ls = LazyStackedTensorDict(td, td.clone())
        >>> type(ls.empty()).__name__, ls.empty().keys(), ls.empty(recurse=True).keys()
        ('LazyStackedTensorDict', [], ['a'])
        """
        if batch_size is not None or device is not None:
            return super().empty(recurse, batch_size=batch_size, device=device)
        return self._like([td.empty(recurse) for td in self._members])

    def fill_(self: T, key: NestedKey, value: float | bool) -> T:
        for td in self._members:
            td.fill_(key, value)
        return self

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """The slices along ``dim``: the members themselves along the stack dimension.

        Args:
            dim: the batch dimension to slice along (negative counts from the end).

        Returns:
            A tuple of ``batch_size[dim]`` tensordicts (lazy stacks along any other dimension).

        Raises:
            DimensionError: ``dim`` is outside the batch dimensions.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> a, b = TensorDict(x=torch.zeros(3), batch_size=[3]), TensorDict(x=torch.ones(3), batch_size=[3])
        >>> ls = LazyStackedTensorDict(a, b, stack_dim=1)
        >>> ls.unbind(1)[1] is b, len(ls.unbind(0)), ls.unbind(0)[2]["x"].tolist()
        (True, 3, [0.0, 1.0])
        """
        dim = check_dim(dim, self.batch_dims)
        if dim == self._stack_dim:
            return tuple(self._members)
        return super().unbind(dim)

    def to_tensordict(self, *, retain_none: bool | None = None) -> TensorDict:
        """A dense ``TensorDict`` copy: every entry stacked (the members must share keys and shapes).

        Args:
            retain_none: accepted for the reference's signature (no effect).

        Returns:
            A new ``TensorDict`` of the stack's batch size and dimension names.

        Raises:
            MissingKeyError: a key some members lack (names them).
            NotSupportedError: an entry whose shapes differ across the members.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> a, b = TensorDict(x=torch.zeros(2), batch_size=[2]), TensorDict(x=torch.ones(2), batch_size=[2])
        >>> dense = LazyStackedTensorDict(a, b, stack_dim=1).to_tensordict()
        >>> type(dense).__name__, dense.batch_size, dense["x"].tolist()
        ('TensorDict', torch.Size([2, 2]), [[0.0, 1.0], [0.0, 1.0]])
        """
        if not self._members:  # an empty stack: an empty tensordict of its batch size
            return TensorDict(
                batch_size=self.batch_size, device=self.device, names=self.names if self._has_names() else None
            )
        dense = [td.to_tensordict() if isinstance(td, LazyStackOps) else td for td in self._members]
        keys = [set(td.keys(True, True)) for td in dense]
        for i, k in enumerate(keys):
            if k != keys[0]:
                raise MissingKeyError(
                    f"Cannot make a dense TensorDict of the lazy stack: member {i} has keys {sorted(map(str, k))}, "
                    f"member 0 has {sorted(map(str, keys[0]))}."
                )
        for key in keys[0]:
            shapes = {tuple(v.shape) for v in (td.get(key) for td in dense) if isinstance(v, torch.Tensor)}
            if len(shapes) > 1:
                raise NotSupportedError(
                    f"Cannot make a dense TensorDict of the lazy stack (Failed to stack tensors within a tensordict): "
                    f"the entry {key!r} has shapes {sorted(shapes)} across the members. Read it with "
                    f"ls.get({key!r}, as_padded_tensor=True) or as_nested_tensor=True, or keep the lazy stack."
                )
        out = TensorDict.stack(dense, self._stack_dim)
        if self._stack_dim_name is not None:
            out.names = self.names
        return out

    def dense_stack(self, dim: int | None = None) -> TensorDict:
        """``to_tensordict()``: the members stacked densely (``dim`` must be the stack dimension).

        Args:
            dim: the stack dimension (None: the stack's own).

        Returns:
            A dense ``TensorDict`` copy.

        Raises:
            InvalidArgumentError: ``dim`` is not the stack dimension.
            MissingKeyError, NotSupportedError: as for :meth:`to_tensordict`.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(x=torch.zeros(2)), TensorDict(x=torch.ones(2)), stack_dim=0)
        >>> dense = ls.dense_stack(0)
        >>> type(dense).__name__, dense["x"].tolist()
        ('TensorDict', [[0.0, 0.0], [1.0, 1.0]])
        """
        if dim is not None and check_dim(dim, self.batch_dims) != self._stack_dim:
            raise InvalidArgumentError(f"dense_stack(dim={dim}): the stack dimension is {self._stack_dim}.")
        return self.to_tensordict()

    @classmethod
    def _combine(cls: type[T], tds: Sequence[Any], dim: int, new_dim: bool) -> T:
        """Stack lazily: a lazy stack of the tensordicts; cat joins members along the stack dimension."""
        if new_dim:
            return cls._new_stack(tds, dim, None)
        first = tds[0]
        if all(isinstance(td, LazyStackOps) for td in tds):
            d = check_dim(dim, first.batch_dims)
            if all(td._stack_dim == d for td in tds):
                return cls._new_stack([m for td in tds for m in td._members], d, None)
            s = first._stack_dim
            if all(td._stack_dim == s and len(td._members) == len(first._members) for td in tds):
                inner = d if d < s else d - 1  # members are joined pairwise, the stack stays lazy
                parts: list[Any] = [
                    torch.cat([td._members[i] for td in tds], inner) for i in range(len(first._members))
                ]
                return cls._new_stack(parts, s, None)
        raise NotSupportedError(
            "torch.cat of lazy stacks works along their common stack dimension only; convert them with "
            "to_tensordict() first."
        )

    # -- comparison ---------------------------------------------------------------------------
    def _compare(self: T, other: Any, op: Callable[[Any, Any], Any]) -> T:
        if isinstance(other, TensorDictBase):
            if other.batch_size != self.batch_size:
                raise BatchSizeError(
                    f"Cannot compare a lazy stack of batch size {list(self.batch_size)} with one of "
                    f"{list(other.batch_size)}."
                )
            theirs: list[Any] = list(other.unbind(self._stack_dim))
        elif isinstance(other, Mapping):  # a dict of the stack's values: split like a tensordict of them
            theirs = list(TensorDict(other, batch_size=self.batch_size).unbind(self._stack_dim))
        else:
            theirs = [other] * len(self._members)
        return self._like([td._compare(o, op) for td, o in zip(self._members, theirs, strict=True)])

    # -- adding members ---------------------------------------------------------------------
    def append(self, tensordict: Any) -> None:
        """Add ``tensordict`` as the last member (the stack's size at ``stack_dim`` grows by one).

        Args:
            tensordict: a tensor collection with the members' batch size (and device, where they
                have one).

        Raises:
            ArgumentTypeError: ``tensordict`` is not a tensor collection (a ``TypeError``).
            InvalidArgumentError: its batch size or device differs from the members' (a ``ValueError``).
            LockedError: the stack is locked.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(a=torch.zeros(2), batch_size=[2]))
        >>> ls.append(TensorDict(a=torch.ones(2), batch_size=[2]))
        >>> ls.batch_size, ls["a"][1].tolist()
        (torch.Size([2, 2]), [1.0, 1.0])
        """
        self.insert(len(self._members), tensordict)

    def insert(self, index: int, tensordict: Any) -> None:
        """Add ``tensordict`` as a member before position ``index`` (as ``list.insert``).

        Args:
            index: the position among the members (negative counts from the end).
            tensordict: as for :meth:`append`.

        Raises:
            ArgumentTypeError, InvalidArgumentError, LockedError: as for :meth:`append`.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(a=torch.zeros(2), batch_size=[2]))
        >>> ls.insert(0, TensorDict(a=torch.ones(2), batch_size=[2]))
        >>> ls["a"][:, 0].tolist()
        [1.0, 0.0]
        """
        if not isinstance(tensordict, TensorDictBase):
            raise ArgumentTypeError(
                f"Expected new value to be TensorDictBase instance (a tensordict or tensorclass to add as a "
                f"member), got {type(tensordict).__name__}."
            )
        if self.is_locked:
            raise LockedError("Cannot add a member to a locked LazyStackedTensorDict: unlock it first (unlock_()).")
        first = self._members[0]
        if tensordict.batch_size != first.batch_size:
            raise InvalidArgumentError(
                f"Batch sizes in tensordicts differs: the new member has {list(tensordict.batch_size)}, the "
                f"members have {list(first.batch_size)}."
            )
        if first.device is not None and tensordict.device is not None and tensordict.device != first.device:
            raise InvalidArgumentError(
                f"Devices differ: the new member is on {tensordict.device}, the members on {first.device}; move it "
                "with .to(device) first."
            )
        self._members.insert(index, tensordict)
