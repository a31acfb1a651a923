"""The shape operations of a lazy stack: on its members where the operation allows it.

A lazy stack (a host whose ``_stack_parts()`` gives ``(members, stack_dim)`` and whose
``_restack(members, stack_dim)`` builds a stack like it) keeps its members apart: an operation
that leaves the stack dimension alone runs on each member (with the dims renumbered around the
stack dimension) and gives a lazy stack back; one that moves elements along the stack dimension
reorders, selects or repeats the members themselves.  Only what cannot be said member by member
(a reshape that is neither a flatten nor an unflatten, a gather along the stack dimension,
growing a stack dimension of size 1) works on a dense copy, which refuses members whose shapes
differ instead of producing wrong data.  The arguments arrive checked and with non-negative dims.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._errors import BatchSizeError, NotSupportedError

__all__ = [
    "reshape",
    "flatten",
    "unflatten",
    "squeeze",
    "unsqueeze",
    "permute",
    "expand",
    "repeat",
    "repeat_interleave",
    "roll",
    "flip",
    "gather",
    "masked",
    "where",
]


def _parts(ls: Any) -> tuple[list[Any], int]:
    parts = ls._stack_parts()
    assert parts is not None
    return parts


def _inner(d: int, sd: int) -> int:
    """Dim ``d`` of the stack (not the stack dim) as a dim of its members."""
    return d - 1 if d > sd else d


def reshape(ls: Any, new: torch.Size, view: bool) -> Any:
    """A flatten or unflatten of dims regroups the members.  Any other ``reshape`` makes a dense
    copy, as the reference does, or, for members whose shapes differ, regroups every element as a
    member; ``view`` refuses it, as the reference does."""
    batch, shape = list(ls.batch_size), list(new)
    merged = _flattened_range(batch, shape)
    if merged is not None:
        return ls.flatten(*merged)
    split = _split_dim(batch, shape)
    if split is not None:
        return ls.unflatten(split, shape[split : split + len(shape) - len(batch) + 1])
    if view:
        raise BatchSizeError(
            f"view({shape}) of a lazy stack of batch size {batch}: only flattening or splitting dims keeps it a "
            "view; call reshape() instead."
        )
    try:
        return ls.to_tensordict().reshape(new)
    except NotSupportedError:  # members whose shapes differ: regroup them instead
        pass
    flat = ls.flatten(0, -1) if ls.batch_dims > 1 else ls
    if not shape:
        return flat.squeeze(0)
    return flat.unflatten(0, shape)


def _flattened_range(batch: list[int], shape: list[int]) -> tuple[int, int] | None:
    """``(first, last)`` when ``shape`` is ``batch`` with its dims ``first..last`` merged into one."""
    if len(shape) >= len(batch) or not shape:
        return None
    first = next((i for i in range(len(shape)) if batch[i] != shape[i]), len(shape) - 1)
    last = first + len(batch) - len(shape)
    if batch[:first] == shape[:first] and batch[last + 1 :] == shape[first + 1 :]:
        if math.prod(batch[first : last + 1]) == shape[first]:
            return first, last
    return None


def _split_dim(batch: list[int], shape: list[int]) -> int | None:
    """The dim of ``batch`` that ``shape`` splits into several (the others unchanged), if any."""
    if len(shape) <= len(batch) or not batch:
        return None
    first = next((i for i in range(len(batch)) if batch[i] != shape[i]), len(batch) - 1)
    count = len(shape) - len(batch) + 1
    if batch[:first] == shape[:first] and batch[first + 1 :] == shape[first + count :]:
        if math.prod(shape[first : first + count]) == batch[first]:
            return first
    return None


def flatten(ls: Any, start: int, end: int) -> Any:
    members, sd = _parts(ls)
    if sd < start:
        return ls._restack([m.flatten(start - 1, end - 1) for m in members], sd)
    if sd > end:
        return ls._restack([m.flatten(start, end) for m in members], sd - (end - start))
    pieces = [ls]  # the stack dim is merged: every element of the merged dims becomes a member
    for _ in range(start, end + 1):
        pieces = [p for piece in pieces for p in piece.unbind(start)]
    return ls._restack(pieces, start, keep_name=False)


def unflatten(ls: Any, d: int, sizes: Sequence[int]) -> Any:
    members, sd = _parts(ls)
    if d != sd:
        return ls._restack([m.unflatten(_inner(d, sd), sizes) for m in members], sd + (len(sizes) - 1) * (d < sd))
    if 0 in sizes:
        return ls.to_tensordict().unflatten(d, sizes)
    groups: list[Any] = list(members)
    for size in reversed(sizes[1:]):  # innermost first: groups of the last size become stacks
        groups = [ls._restack(groups[i : i + size], sd, keep_name=False) for i in range(0, len(groups), size)]
    return ls._restack(groups, sd, keep_name=False)


def squeeze(ls: Any, d: int) -> Any:
    members, sd = _parts(ls)
    if d == sd:
        return members[0]
    return ls._restack([m.squeeze(_inner(d, sd)) for m in members], sd - (d < sd))


def unsqueeze(ls: Any, d: int) -> Any:
    members, sd = _parts(ls)
    if d <= sd:
        return ls._restack([m.unsqueeze(d) for m in members], sd + 1)
    return ls._restack([m.unsqueeze(d - 1) for m in members], sd)


def permute(ls: Any, perm: list[int]) -> Any:
    members, sd = _parts(ls)
    inner = [_inner(p, sd) for p in perm if p != sd]
    return ls._restack([m.permute(inner) if inner else m for m in members], perm.index(sd))


def expand(ls: Any, new: torch.Size, names: list | None, spread: bool) -> Any:
    members, sd = _parts(ls)
    extra = len(new) - ls.batch_dims
    if new[extra + sd] != len(members):  # a stack dim of size 1 grows: the members would repeat
        return ls.to_tensordict()._expand_to(new, names, spread)
    inner = [s for i, s in enumerate(new) if i != extra + sd]
    return ls._restack([m.expand(inner) if spread else m.broadcast_to(inner) for m in members], sd + extra)


def repeat(ls: Any, reps: list[int]) -> Any:
    members, sd = _parts(ls)
    inner = [r for i, r in enumerate(reps) if i != sd]
    repeated = [m.repeat(*inner) for m in members] * reps[sd]
    if not repeated:
        return ls.to_tensordict().repeat(*reps)
    return ls._restack(repeated, sd)


def repeat_interleave(ls: Any, repeats: int | torch.Tensor, d: int) -> Any:
    members, sd = _parts(ls)
    if d != sd:
        return ls._restack([m.repeat_interleave(repeats, _inner(d, sd)) for m in members], sd)
    if isinstance(repeats, torch.Tensor) and repeats.numel() != 1:
        counts = [int(c) for c in repeats.reshape(-1).tolist()]
    else:
        counts = [int(repeats)] * len(members)
    chosen = [m for m, c in zip(members, counts, strict=True) for _ in range(c)]
    if not chosen:
        return ls.to_tensordict().repeat_interleave(repeats, d)
    return ls._restack(chosen, sd)


def roll(ls: Any, shifts: list[int], dims: list[int]) -> Any:
    members, sd = _parts(ls)
    out = list(members)
    inner_shifts, inner_dims = [], []
    for shift, d in zip(shifts, dims, strict=True):
        if d == sd:
            k = shift % len(out)
            out = out[-k:] + out[:-k] if k else out
        else:
            inner_shifts.append(shift)
            inner_dims.append(_inner(d, sd))
    if inner_dims:
        out = [m.roll(inner_shifts, inner_dims) for m in out]
    return ls._restack(out, sd)


def flip(ls: Any, dims: list[int]) -> Any:
    members, sd = _parts(ls)
    out = list(reversed(members)) if sd in dims else list(members)
    inner = [_inner(d, sd) for d in dims if d != sd]
    if inner:
        out = [m.flip(inner) for m in out]
    return ls._restack(out, sd)


def gather(ls: Any, d: int, index: torch.Tensor) -> Any:
    members, sd = _parts(ls)
    if d == sd or index.dim() <= sd or index.shape[sd] == 0:
        return ls.to_tensordict().gather(d, index)
    count = index.shape[sd]
    if d == sd or count == 0:
        return ls.to_tensordict().gather(d, index)
    if count > len(members):
        raise BatchSizeError(
            f"gather: the index has size {count} at dim {sd}, more than the tensordict's {len(members)}."
        )
    return ls._restack([members[i].gather(_inner(d, sd), index.select(sd, i)) for i in range(count)], sd)


def _split_mask(mask: torch.Tensor, sd: int, count: int) -> list[torch.Tensor]:
    """The part of a mask over the leading batch dims that concerns each member."""
    if mask.dim() > sd:
        return list(mask.unbind(sd))
    return [mask] * count


def masked(ls: Any, mask: torch.Tensor, fn: Callable[[Any, torch.Tensor], Any]) -> Any:
    """``fn(member, its part of mask)`` for every member, stacked again."""
    members, sd = _parts(ls)
    return ls._restack([fn(m, part) for m, part in zip(members, _split_mask(mask, sd, len(members)), strict=True)], sd)


def where(ls: Any, condition: torch.Tensor, other: Any, pad: Any) -> Any:
    members, sd = _parts(ls)
    parts = _split_mask(condition, sd, len(members))
    if hasattr(other, "batch_size") and not isinstance(other, torch.Tensor):
        if tuple(other.batch_size[: ls.batch_dims]) != tuple(ls.batch_size):
            raise BatchSizeError(
                f"where: the other tensordict has batch size {list(other.batch_size)}, this lazy stack "
                f"{list(ls.batch_size)}."
            )
        theirs: list[Any] = list(other.unbind(sd))
    elif isinstance(other, torch.Tensor) and other.dim() > 0:
        return ls.to_tensordict().where(condition, other, pad=pad)
    else:
        theirs = [other] * len(members)
    out = [m.where(c, o, pad=pad) for m, c, o in zip(members, parts, theirs, strict=True)]
    return ls._restack(out, sd)
