"""Batch-shape helpers: telling keys from indices, normalizing indices against the batch
dimensions, and the names and sizes they produce (pure functions of shapes and indices)."""

from __future__ import annotations

import operator
from typing import Any

import torch

from ._errors import DimensionError, InvalidArgumentError

__all__ = [
    "is_key",
    "has_first_class_dim",
    "is_first_class_dim",
    "index_dims",
    "normalize_index",
    "index_names",
    "as_size",
    "check_dim",
    "contiguous_strides",
]


def is_first_class_dim(part: object) -> bool:
    """Whether ``part`` is a functorch first-class dimension (``functorch.dim.Dim``)."""
    return type(part).__module__.startswith("functorch.dim")


def has_first_class_dim(index: object) -> bool:
    """Whether the index ``index`` (one part or a tuple of parts) holds a first-class dimension."""
    parts = index if type(index) is tuple else (index,)
    return any(is_first_class_dim(p) for p in parts)


def is_key(idx: object) -> bool:
    if isinstance(idx, str):
        return True
    return isinstance(idx, tuple) and bool(idx) and all(is_key(i) for i in idx)


def index_dims(item: object) -> int:
    if item is None:
        return 0
    if isinstance(item, torch.Tensor) and item.dtype == torch.bool:
        return max(item.ndim, 1)
    return 1


def normalize_index(idx: Any, ndim: int) -> Any:
    """Expand Ellipsis against the batch dimensions, so leaves with more dimensions index alike."""
    if isinstance(idx, list):
        idx = torch.as_tensor(idx)
    if not isinstance(idx, tuple):
        idx = (idx,)
    idx = tuple(torch.as_tensor(i) if isinstance(i, list) else i for i in idx)
    if any(i is Ellipsis for i in idx):
        pos = next(k for k, i in enumerate(idx) if i is Ellipsis)
        used = sum(index_dims(i) for i in idx if i is not Ellipsis)
        fill = (slice(None),) * max(ndim - used, 0)
        idx = idx[:pos] + fill + tuple(i for i in idx[pos + 1 :] if i is not Ellipsis)
    used = sum(index_dims(i) for i in idx)
    if used > ndim:
        raise IndexError(f"Too many indices ({used}) for a tensordict with {ndim} batch dimension(s).")
    return idx


def index_names(names: list | None, idx: tuple, ndim: int) -> list | None:
    """The dimension names after indexing with a normalized ``idx`` (None where they are unknown)."""
    if names is None:
        return None
    out: list = []
    pos = 0
    tensors = 0
    for item in idx:
        if item is None:
            out.append(None)
        elif isinstance(item, slice):
            out.append(names[pos])
            pos += 1
        elif isinstance(item, torch.Tensor) and item.ndim > 0:
            tensors += 1
            if item.dtype == torch.bool:  # a mask of k dims makes one
                out.append(names[pos] if item.ndim == 1 else None)
                pos += item.ndim
            else:  # an index tensor of k dims puts k dims in place of one: unnamed unless k == 1, as the reference
                out.extend([names[pos]] if item.ndim == 1 else [None] * item.ndim)
                pos += 1
        else:  # an integer removes its dimension
            pos += 1
    out += names[pos:]
    if tensors > 1 or len(out) != ndim or all(n is None for n in out):
        return None
    return out


def as_size(value: Any, name: str = "batch_size") -> torch.Size:
    """``value`` (None, an int, or a sequence of ints) as a ``torch.Size``.

    Raises:
        InvalidArgumentError: a string, a bool, a float or another non-integer (a ``ValueError``,
            as the reference raises for strings), or a negative dimension.
    """
    if value is None:
        return torch.Size([])
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(
            f"{name} must be an int or a sequence of ints (for example [3] or [3, 4]), got the string {value!r}."
        )
    items = [value] if isinstance(value, int) or (isinstance(value, torch.Tensor) and value.ndim == 0) else value
    try:
        dims = [_dim(v) for v in items]
    except TypeError:
        raise InvalidArgumentError(
            f"{name} must be an int or a sequence of ints (for example [3] or [3, 4]), got {value!r}."
        ) from None
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"{name} must not have negative dimensions, got {dims}.")
    return torch.Size(dims)


def _dim(v: Any) -> int:
    if isinstance(v, bool):
        raise TypeError("a bool is not a dimension")
    return operator.index(v)


def check_dim(dim: int, ndim: int) -> int:
    if not -ndim <= dim < max(ndim, 1) or ndim == 0:
        raise DimensionError(f"Dimension {dim} is out of range for {ndim} batch dimension(s).")
    return dim % ndim


def contiguous_strides(shape: torch.Size) -> list[int]:
    """The strides of a C-contiguous tensor of ``shape`` (zero-size dimensions count as 1)."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return strides[::-1]
