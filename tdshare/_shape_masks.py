"""The masking shape operations: ``masked_fill``, ``masked_fill_``, ``masked_select`` and ``where``.

``MaskOps`` sits between :class:`tdshare._shape_moves.MoveOps` (the engine) and
:class:`tdshare._shape_ops.ShapeOps`.  A mask or condition covers the leading batch dims (the
batch size or its first dims) and is aligned to the right of each leaf; a lazy stack splits it
over its members (:mod:`tdshare._shape_stack`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from . import _shape_stack as stack_rules
from ._errors import ArgumentTypeError, MissingKeyError
from ._nontensor import NonTensorData
from ._shape_args import align_right, check_mask
from ._shape_moves import MoveOps, inner_collection

__all__ = ["MaskOps"]

T = TypeVar("T", bound="MaskOps")


class MaskOps(MoveOps):
    """Filling and selecting by a boolean mask over the batch dims."""

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
            inner = value_ if isinstance(value_, MaskOps) else inner_collection(value_)
            if inner is not None:
                inner.masked_fill_(mask, value)
            elif isinstance(value_, torch.Tensor):
                value_.masked_fill_(align_right(mask, value_, nd), value)
        return self

    def masked_select(self: T, mask: torch.Tensor, *, inplace: bool = False) -> T:
        """The elements of the batch where ``mask`` is True, as ``td[mask]`` selects them.

        The batch dims that ``mask`` covers become one dim of size ``mask.sum()``; the other
        batch dims are kept.  Tensors are copied, a ``NonTensorStack`` keeps the selected values,
        a single non-tensor value and an ``UnbatchedTensor`` are kept whole.  The result has no
        dim names, unless ``mask`` has one dim (then the names stay, as in the reference).  A lazy
        stack gives a dense ``TensorDict`` (its ``to_tensordict()`` masked).

        Args:
            mask: a bool tensor whose shape is the batch size or its first dims.
            inplace: make this tensordict hold the selection (its nested levels are kept) and
                return it.

        Returns:
            A new tensordict, or ``self`` with ``inplace=True``.

        Raises:
            ArgumentTypeError: ``mask`` is not a bool tensor.
            BatchSizeError: ``mask``'s shape is not the batch size or its first dims.
            NotSupportedError: ``inplace=True`` on a lazy stack (call ``to_tensordict()`` first).
            LockedError: ``inplace=True`` on a locked tensordict.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.arange(6).view(2, 3), batch_size=[2, 3])
        >>> td.masked_select(torch.tensor([[True, False, True], [False, True, False]]))["a"].tolist()
        [0, 2, 4]
        """
        check_mask(mask, self.batch_size, "masked_select")
        if mask.dtype != torch.bool:
            raise ArgumentTypeError(f"masked_select: the mask must be a bool tensor, got dtype {mask.dtype}.")
        if inplace:
            if self._stack_parts() is not None:
                return self._rebind_(None, "masked_select")
            return self._rebind_(self.masked_select(mask), "masked_select")
        if self._stack_parts() is not None:
            return self.to_tensordict().masked_select(mask)
        nd = mask.dim()
        batch = [int(mask.sum()), *self.batch_size[nd:]]
        return self._rebuild(
            lambda t: t[mask],
            lambda c: c.masked_select(mask),
            batch,
            self._names_kept() if nd == 1 else None,  # a one-dim mask keeps its dim (and name), as td[mask]
            lock=False,
            copy=True,
        )

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
        check_mask(condition, self.batch_size, "where", "condition")
        if self._stack_parts() is not None:
            result = stack_rules.where(self, condition, other, pad)
        elif isinstance(other, MaskOps) or inner_collection(other) is not None:
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


def _where_collections(td: Any, condition: torch.Tensor, other: Any, pad: Any) -> Any:
    other = other if isinstance(other, MaskOps) else inner_collection(other)
    out = td.empty()
    nd = condition.dim()
    keys = list(td._tensordict) + [k for k in other._tensordict if k not in td._tensordict]
    for key in keys:
        mine, theirs = td._tensordict.get(key), other._tensordict.get(key)
        if (mine is None or theirs is None) and pad is None:
            raise MissingKeyError(
                f"where: the entry {key!r} is not found on one side and no pad value provided: pass pad= to fill it."
            )
        if isinstance(mine, MaskOps) or isinstance(theirs, MaskOps):
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
