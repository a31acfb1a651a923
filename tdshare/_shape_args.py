"""Argument helpers of the shape operations: dims, shapes and indices checked against a batch size.

Pure functions of shapes (no tensordict in sight); each error names the operation, what it
expected and what it got, and derives from the builtin the reference raises there.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ._errors import ArgumentTypeError, BatchSizeError, DimensionError

__all__ = [
    "batch_dim",
    "int_list",
    "shape_args",
    "inferred_shape",
    "expanded_shape",
    "interleaved_size",
    "gather_index",
    "check_mask",
    "align_right",
]


def batch_dim(dim: Any, ndim: int, op: str) -> int:
    """``dim`` made non-negative against ``ndim`` dims (``DimensionError``, an IndexError, if outside)."""
    try:
        d = operator.index(dim)
    except TypeError:
        raise ArgumentTypeError(f"{op}: a dim must be an int, got {type(dim).__name__} {dim!r}.") from None
    if not -ndim <= d < ndim:
        raise DimensionError(
            f"{op}: Incompatible dim {dim}: it is out of range for a batch of {ndim} dim(s) (expected a dim in "
            f"[{-ndim}, {ndim - 1}])."
        )
    return d % ndim


def int_list(value: Any, op: str, name: str) -> list[int]:
    if isinstance(value, torch.Tensor):
        value = value.reshape(-1).tolist()
    if not isinstance(value, (list, tuple, torch.Size)):
        value = [value]
    try:
        return [operator.index(v) for v in value]
    except TypeError:
        raise ArgumentTypeError(f"{op}: {name} must be ints or a sequence of ints, got {value!r}.") from None


def shape_args(args: tuple, kwargs: dict[str, Any], kwarg: str) -> Any:
    """The shape of a call written ``f(2, 3)``, ``f((2, 3))`` or ``f(kwarg=(2, 3))``."""
    if kwargs:
        if args or set(kwargs) != {kwarg}:
            raise ArgumentTypeError(
                f"Pass the shape as ints, as one sequence or as the keyword {kwarg}=, not args={args} and "
                f"kwargs={kwargs}."
            )
        return kwargs[kwarg]
    if len(args) == 1 and not isinstance(args[0], int):
        return args[0]
    return args


def inferred_shape(shape: Any, batch: torch.Size, op: str) -> torch.Size:
    dims = int_list(shape, op, "shape")
    try:
        return torch.empty(batch, device="meta").reshape(dims).shape
    except RuntimeError as exc:
        raise BatchSizeError(f"{op}: invalid shape {dims} for a batch of {batch.numel()} elements ({exc}).") from None


def expanded_shape(shape: list[int], batch: torch.Size, op: str) -> torch.Size:
    ndim = len(batch)
    if len(shape) < ndim:
        raise BatchSizeError(
            f"{op}: the shape {shape} has fewer dims than the batch size {list(batch)}; give at least {ndim}."
        )
    extra = len(shape) - ndim
    out = list(shape)
    for i, old in enumerate(batch):
        new = shape[extra + i]
        if new == -1:
            out[extra + i] = old
        elif old != 1 and new != old:
            raise BatchSizeError(
                f"{op}: cannot expand the batch size {list(batch)} to {shape}: only dims of size 1 can grow."
            )
    if any(s < 0 for s in out):
        raise BatchSizeError(f"{op}: -1 is only allowed for existing dims, got {shape}.")
    return torch.Size(out)


def gather_index(index: torch.Tensor, dim: int, shape: torch.Size, batch: torch.Size) -> torch.Tensor:
    """``index`` (over the leading batch dims) expanded for a value of ``shape``, as torch.gather takes it."""
    k = index.dim()
    target = list(shape)
    target[:k] = [min(i, b) for i, b in zip(index.shape, batch, strict=False)]
    target[dim] = index.shape[dim]
    return index.reshape((*index.shape, *[1] * (len(shape) - k))).expand(target)


def interleaved_size(repeats: int | torch.Tensor, size: int, output_size: int | None) -> int:
    """The size of a dim of ``size`` elements after ``repeat_interleave(repeats)`` (torch's rules)."""
    if isinstance(repeats, torch.Tensor):
        if repeats.numel() == 1:
            total = size * int(repeats.reshape(-1)[0])
        elif repeats.dim() != 1 or repeats.numel() != size:
            raise RuntimeError(f"repeats must have one count per element ({size}), got shape {list(repeats.shape)}")
        else:
            total = int(repeats.sum())
        counts_ok = bool((repeats >= 0).all())
    else:
        total, counts_ok = size * operator.index(repeats), operator.index(repeats) >= 0
    if not counts_ok:
        raise RuntimeError("repeats can not be negative")
    if output_size is not None and output_size != total:
        raise RuntimeError(f"output_size {output_size} does not match the repeated size {total}")
    return total


def align_right(mask: torch.Tensor, t: torch.Tensor, nd: int) -> torch.Tensor:
    """``mask`` (over the first ``nd`` dims) shaped to broadcast against ``t``."""
    return mask.reshape((*mask.shape, *[1] * (t.dim() - nd))).expand(t.shape)


def check_mask(mask: Any, batch: torch.Size, op: str, name: str = "mask") -> None:
    """Check that ``mask`` (called ``name`` in messages) is a tensor over the leading dims of ``batch``."""
    if not isinstance(mask, torch.Tensor):
        raise ArgumentTypeError(f"{op}: the {name} must be a bool tensor, got {type(mask).__name__}.")
    if tuple(mask.shape) != tuple(batch[: mask.dim()]):
        raise BatchSizeError(
            f"{op}: the {name} has shape {list(mask.shape)}, but it must be the batch size {list(batch)} or its "
            "first dims."
        )
