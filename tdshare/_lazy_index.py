"""Indexing a lazy stack: ``ls[idx]`` and ``ls[idx] = value``, through its members where it can.

:class:`LazyIndexOps` is the indexing part of :class:`tdshare._lazy.LazyStackedTensorDict`.  An
index is split at the stack dim: an integer there picks a member, anything else a lazy stack of the
picked members, each indexed with the rest (``None`` adds a size-1 dim as a view).  Two or more
index sequences, which torch broadcasts together, and index tensors or masks of two dims or more
give what the dense stack gives (a copy, as torch's advanced indexing copies), and a write with one
goes through a dense copy back into the members.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ._errors import BatchSizeError, InvalidArgumentError, NotSupportedError
from ._indexing import index_dims, is_first_class_dim, normalize_index
from ._tensordict_base import TensorDictBase

__all__ = ["LazyIndexOps"]

_FULL = slice(None)


def _broadcast_indices(parts: tuple[Any, ...]) -> bool:
    """Whether the normalized index ``parts`` needs the dense stack: two or more index sequences
    (tensors, lists, ranges, arrays), which torch broadcasts together into one set of positions, or
    one index tensor or mask of two dims or more."""
    sequences = sum(
        1
        for p in parts
        if isinstance(p, range) or (getattr(p, "ndim", 0) > 0 and not is_first_class_dim(p))  # a tensor, an array
    )
    # an index tensor (or mask) of two dims or more too: it spans or multiplies dims of the stack
    return sequences > 1 or any(getattr(p, "ndim", 0) > 1 and not is_first_class_dim(p) for p in parts)


def _new_axes(parts: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[int]]:
    """``parts`` without its ``None`` items, and the dims of the result where those add a dim of size 1
    (as torch places them: after the dims that the items before them give)."""
    kept: list[Any] = []
    positions: list[int] = []
    dims = 0
    for p in parts:
        if p is None:
            positions.append(dims)
            dims += 1
            continue
        kept.append(p)
        if isinstance(p, int) or (isinstance(p, torch.Tensor) and p.dim() == 0):
            continue
        if isinstance(p, torch.Tensor) and p.dtype == torch.bool:
            dims += 1
        elif not is_first_class_dim(p):
            dims += getattr(p, "ndim", 1)  # a slice or a range: 1; an index tensor or array: its dims
    return tuple(kept), positions


class LazyIndexOps(TensorDictBase):
    """``_index``/``_set_at`` (``ls[idx]``, ``ls[idx] = value``) and iteration of a lazy stack."""

    _members: list[TensorDictBase]
    _stack_dim: int
    _stack_dim_name: str | None

    def _split_index(self, normalized: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...], int]:
        """(the index at the stack dimension, the members' index, the dimensions dropped before it), from
        an index that ``normalize_index`` gave."""
        parts = list(normalized)
        if any(p is None for p in parts) or any(index_dims(p) > 1 for p in parts):
            raise NotSupportedError(
                "A LazyStackedTensorDict is indexed with integers, slices, Ellipsis and one-dimensional index "
                "tensors; convert it with to_tensordict() for other indices."
            )
        parts += [_FULL] * (self.batch_dims - len(parts))
        d = self._stack_dim
        if is_first_class_dim(parts[d]):
            raise InvalidArgumentError(
                f"Cannot index a LazyStackedTensorDict with a first-class dimension at its stack dimension {d}: "
                "stack it densely first (to_tensordict()) or index the other dimensions."
            )
        dropped = sum(
            1
            for p in parts[:d]
            if isinstance(p, int) or (isinstance(p, torch.Tensor) and p.dim() == 0) or is_first_class_dim(p)
        )
        return parts[d], tuple(parts[:d] + parts[d + 1 :]), dropped

    def _index(self, idx: Any) -> Any:
        parts = normalize_index(idx, self.batch_dims)
        if _broadcast_indices(parts):
            # two or more index tensors broadcast together, pairing the members with their rows: the
            # result is a copy, as torch's advanced indexing gives, of the dense stack
            return self.to_tensordict()._index(idx)
        if any(p is None for p in parts):  # the rest indexed, then a new dim of size 1 for each None
            kept, positions = _new_axes(parts)
            out = self._index(kept)
            for pos in positions:
                out = out.unsqueeze(pos)
            return out
        at, rest, dropped = self._split_index(parts)
        trivial = all(isinstance(p, slice) and p == _FULL for p in rest)

        def pick(td: TensorDictBase) -> TensorDictBase:
            return td if trivial else td._index(rest)

        if isinstance(at, int) or (isinstance(at, torch.Tensor) and at.dim() == 0):
            return pick(self._members[int(at)])
        chosen = torch.arange(len(self._members))[at].tolist()
        members = [pick(self._members[j]) for j in chosen]
        stack: Any = type(self)  # the lazy stack's class (this is its mixin)
        empty: dict[str, Any] = {}
        if not members:  # an empty stack: its members' batch size is what the index leaves of theirs
            sample = pick(self._members[0]) if self._members else None
            empty = {"batch_size": sample.batch_size if sample is not None else None, "device": self.device}
        out = stack(*members, stack_dim=self._stack_dim - dropped, stack_dim_name=self._stack_dim_name, **empty)
        out._is_locked, out._is_memmap, out._is_shared = self._is_locked, self._is_memmap, self._is_shared
        return out

    def _set_at(self, idx: Any, value: Any) -> None:
        """``ls[idx] = value``: written into the members in place (``ls[i] = td`` updates member ``i``)."""
        parts = normalize_index(idx, self.batch_dims)
        if _broadcast_indices(parts):  # (see _index): written into a dense copy, then back
            dense = self.to_tensordict()
            dense._set_at(idx, value)
            self.update_(dense)
            return
        at, rest, _ = self._split_index(parts)
        trivial = all(isinstance(p, slice) and p == _FULL for p in rest)
        if isinstance(at, int) or (isinstance(at, torch.Tensor) and at.dim() == 0):
            member = self._members[int(at)]
            if isinstance(value, (TensorDictBase, Mapping)) and trivial:
                if isinstance(value, TensorDictBase) and value.batch_size != member.batch_size:
                    raise BatchSizeError(
                        f"ls[{int(at)}] = value: the value's batch size {list(value.batch_size)} differs from "
                        f"member {int(at)}'s {list(member.batch_size)}."
                    )
                member.update(value, inplace=True)
            else:
                member._set_at(rest, value)
            return
        chosen = torch.arange(len(self._members))[at].tolist()
        pieces = value.unbind(self._stack_dim) if isinstance(value, TensorDictBase) else [value] * len(chosen)
        if len(pieces) != len(chosen):
            raise BatchSizeError(
                f"ls[...] = value: the value's batch size {list(value.batch_size)} differs from the source batch "
                f"size that the index selects ({len(pieces)} pieces along the stack dim for {len(chosen)} members)."
            )
        for j, piece in zip(chosen, pieces, strict=True):
            if trivial and isinstance(piece, (TensorDictBase, Mapping)):
                self._members[j].update(piece, inplace=True)
            else:
                self._members[j]._set_at(rest, piece)

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.batch_size[0]):
            yield self._index(i)
