"""The arguments of :class:`tdshare.MemoryMappedTensor`'s constructors, checked: mode, size, a
tensor of shapes (nested tensors), the file (no symlink) and the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._errors import ArgumentTypeError, InvalidArgumentError, MemmapError
from ._files import check_not_symlink

__all__ = ["check_cpu", "check_mode", "packed", "parse_size", "refuse_symlink", "size_table"]

_MODES = (None, "r", "r+")


def check_mode(mode: object) -> None:
    """Refuse a mapping mode other than None, "r" and "r+" (an ``InvalidArgumentError``)."""
    if mode not in _MODES:
        raise InvalidArgumentError(f"mode must be None, 'r' or 'r+', got {mode!r}.")


def parse_size(size: tuple[Any, ...], shape: Any) -> torch.Size:
    """The size a factory was given, as positional ints, one sequence, or ``shape=`` (exactly one of them)."""
    if shape is not None:
        if size:
            raise InvalidArgumentError("Pass the size either as positional arguments or as shape=, not both.")
        size = (shape,)
    elif not size:
        raise ArgumentTypeError(
            "A shape is required: pass it as ints (zeros(2, 3)), as one sequence (zeros((2, 3))) or as shape=; "
            "for a 0-dimensional tensor pass an empty one, zeros(()) or shape=()."
        )
    if len(size) == 1 and isinstance(size[0], (Sequence, torch.Size, torch.Tensor)):
        size = tuple(size[0])
    try:
        out = torch.Size([int(s) for s in size])
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"A size must be integers or one sequence of integers, got {size!r}.") from None
    if any(s < 0 for s in out):
        raise InvalidArgumentError(f"A size cannot be negative, got {list(out)}.")
    return out


def size_table(value: Any) -> torch.Tensor | None:
    """A tensor of shapes (2-d integers, one row per piece of a nested tensor), or None."""
    if isinstance(value, torch.Tensor) and value.dim() == 2 and not (value.is_floating_point() or value.is_complex()):
        table = value.detach().cpu().to(torch.int64)
        if (table < 0).any():
            raise InvalidArgumentError(f"A tensor of shapes must not hold negative sizes, got {table.tolist()}.")
        return table
    return None


def packed(table: torch.Tensor) -> int:
    """The number of elements of a nested tensor with this tensor of shapes."""
    return int(table.prod(-1).sum()) if table.numel() else 0


def refuse_symlink(path: str) -> None:
    """Refuse a ``filename`` that is a symbolic link (a ``MemmapError`` naming it)."""
    check_not_symlink(path, "Remove the link, or pass the path it points to as filename.")


def check_cpu(device: Any) -> None:
    """Refuse a device other than the cpu (a ``MemmapError``)."""
    if device is not None and torch.device(device).type != "cpu":
        raise MemmapError(f"Only CPU tensors are supported by MemoryMappedTensor, got device {device!r}.")
