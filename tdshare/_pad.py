"""``pad``: grow (or, with negative sizes, crop) every entry of a collection along its batch
dims.  A mixin of :class:`tdshare._tensordict_base.TensorDictBase` (``tdshare.pad`` calls it).

Every size is checked before anything changes.  In place, each level keeps its identity and its
old tensors are dropped as their padded copies replace them; a lazy stack pads its members and,
along its stack dim, gains members filled with the value (or loses members).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.nn.functional as F  # noqa: N812

from ._errors import BatchSizeError, InvalidArgumentError
from ._key_ops import is_node
from ._nodes import kind_of
from ._nontensor import NonTensorData, NonTensorStack

__all__ = ["PadOps", "pad_non_tensor"]

T = TypeVar("T", bound="PadOps")


class PadOps:
    """Padding along the batch dims; the host class provides the storage and accessors."""

    def pad(self: T, pad_size: Sequence[int], value: float = 0.0, inplace: bool = False, safe: bool = True) -> T:
        """Pad every entry in the batch dims: ``pad_size = [dim0_before, dim0_after, dim1_before, ...]``.

        Args:
            pad_size: pairs of sizes from the first batch dim on (negative sizes crop).
            value: the padding value.
            inplace: change this collection (each nested level keeps its identity) and return it.
            safe: check every resulting size first (a crop below zero raises before anything changes);
                ``False`` leaves it to torch, which may fail half-way.

        Raises:
            InvalidArgumentError: an odd number of sizes, or more pairs than batch dims.
            BatchSizeError: a dim that would get a negative size (a ``RuntimeError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(3, 4, 1), batch_size=[3, 4])
        >>> td.pad([0, 1, 0, 2])["a"].shape
        torch.Size([4, 6, 1])
        """
        td: Any = self
        sizes = [int(s) for s in pad_size]
        if len(sizes) % 2 or len(sizes) // 2 > td.batch_dims:
            raise InvalidArgumentError(
                f"pad_size {sizes} must hold (before, after) pairs, at most one pair per batch dim "
                f"({td.batch_dims} here)."
            )
        pads = [(sizes[i], sizes[i + 1]) for i in range(0, len(sizes), 2)]
        if safe:
            for d, (before, after) in enumerate(pads):
                if td.batch_size[d] + before + after < 0:
                    raise BatchSizeError(
                        f"pad: dim {d} of size {td.batch_size[d]} with pad ({before}, {after}) would have a negative "
                        "output size; crop less."
                    )
        return _pad(td, pads, value, inplace)


def _pad(td: Any, pads: list[tuple[int, int]], value: float, inplace: bool) -> Any:
    members = td._lazy_members()
    if members is None:
        return _pad_level(td, pads, value, inplace)
    d = td.stack_dim
    inner = pads[:d] + pads[d + 1 :]
    while inner and inner[-1] == (0, 0):
        inner.pop()
    before, after = pads[d] if d < len(pads) else (0, 0)
    padded = [_pad(m, inner, value, inplace) for m in members]
    kept = padded[max(-before, 0) : len(padded) - max(-after, 0)]
    added = max(before, 0) + max(after, 0)
    fillers = [_filler(padded[0], value) for _ in range(added)]
    new = fillers[: max(before, 0)] + kept + fillers[max(before, 0) :]
    if not inplace:
        return td._restack(new)
    td.tensordicts[:] = new
    return td


def _pad_nested(data: Any, pads: list[tuple[int, int]], shape: list[int]) -> Any:
    """Nested lists of values padded with None (negative sizes crop), ``pads[0]`` along the outer list."""
    if not pads:
        return data
    (before, after), rest = pads[0], pads[1:]
    inner = [_pad_nested(x, rest, shape[1:]) for x in data]
    inner = inner[max(-before, 0) : len(inner) - max(-after, 0)]
    element = [s + b + a for s, (b, a) in zip(shape[1:], rest, strict=False)] + shape[1 + len(rest) :]

    def filler(dims: list[int]) -> Any:
        return None if not dims else [filler(dims[1:]) for _ in range(dims[0])]

    return [filler(element) for _ in range(max(before, 0))] + inner + [filler(element) for _ in range(max(after, 0))]


def pad_non_tensor(
    leaf: NonTensorData, pads: list[tuple[int, int]], inplace: bool, batch: torch.Size | None = None
) -> NonTensorStack:
    """A non-tensor entry padded along its batch dims, the new elements holding None.

    A ``NonTensorStack`` padded ``inplace`` keeps its identity; one ``NonTensorData`` value becomes a
    stack of it (``batch``: the batch size it spreads over), which cannot be done in place.
    """
    if not isinstance(leaf, NonTensorStack):
        if inplace and batch is None:
            raise BatchSizeError(
                "pad(NonTensorData, inplace=True) cannot preserve the identity of the value: padding turns it "
                "into a NonTensorStack; pass inplace=False."
            )
        shape = list(leaf.batch_size if batch is None else batch)
        stack = NonTensorStack.from_list(_nested_fill(leaf.data, shape), batch_size=shape)
        return pad_non_tensor(stack, pads, False)
    shape = list(leaf.batch_size)
    values = _pad_nested(leaf.tolist(), pads, shape)
    new_batch = [s + b + a for s, (b, a) in zip(shape, pads, strict=False)] + shape[len(pads) :]
    if not inplace:
        return NonTensorStack.from_list(values, batch_size=new_batch)
    leaf._batch_size = torch.Size(new_batch)
    leaf.data = values
    return leaf


def _nested_fill(value: Any, dims: list[int]) -> Any:
    return value if not dims else [_nested_fill(value, dims[1:]) for _ in range(dims[0])]


def _filler(member: Any, value: float) -> Any:
    """A new member of a padded lazy stack: tensors full of ``value``, non-tensor entries None."""
    out = member.apply(lambda t: torch.full_like(t, value))

    def blank(node: Any) -> None:
        for key, leaf in list(node._tensordict.items()):
            if is_node(leaf) and leaf._lazy_members() is None:
                blank(leaf)
            elif isinstance(leaf, NonTensorData):
                shape = list(node.batch_size)
                node._tensordict[key] = NonTensorStack.from_list(_nested_fill(None, shape), batch_size=shape)

    if out._lazy_members() is None:
        blank(out)
    return out


def _pad_level(td: Any, pads: list[tuple[int, int]], value: float, inplace: bool) -> Any:
    batch = [s + b + a for s, (b, a) in zip(td.batch_size, pads, strict=False)] + list(td.batch_size[len(pads) :])
    if inplace:
        td._check_unlocked("pad")
        out = td
    else:
        out = type(td)._from_leaves({}, torch.Size(batch), td._device, td._names)
    for key in list(td._tensordict):
        leaf = td._tensordict[key]
        if is_node(leaf):
            result = _pad(leaf, pads, value, inplace)
        elif (kind := kind_of(leaf)) is not None and kind.unwrap is not None and kind.wrap is not None:
            inner, fields = kind.unwrap(leaf)  # a tensorclass entry: pad its tensordict
            padded = _pad(inner, pads, value, inplace)
            result = leaf if inplace else kind.wrap(padded, fields)
        elif isinstance(leaf, NonTensorData) and any(p != (0, 0) for p in pads):
            result = pad_non_tensor(leaf, pads, inplace, td.batch_size)
        elif isinstance(leaf, torch.Tensor):
            flat: list[int] = [0, 0] * (leaf.dim() - len(pads))
            for before, after in reversed(pads):
                flat += [before, after]
            result = F.pad(leaf, flat, value=value)
        else:
            result = leaf
        del leaf
        out._tensordict[key] = result  # in place: the old tensor is released here
    out._batch_size = torch.Size(batch)
    return out
