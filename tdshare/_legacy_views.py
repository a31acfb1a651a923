"""What the reference's lazy view classes did under ``set_lazy_legacy(True)``, for tdshare's views.

Before tensordict 0.5, ``td.view(shape)`` and ``td.permute(dims)`` gave lazy views that kept their
source: viewing back to the source's shape, or applying the inverse permutation, returned the
source object itself, and a permutation that is not one of every batch dim was an error.  tdshare's
views are plain tensordicts of views of the leaves; under ``set_lazy_legacy(True)`` they remember
their source here, so that the inverse operation gives it back (outside legacy mode nothing is
recorded and every call gives a new view, as in the reference).
"""

from __future__ import annotations

from typing import Any

from ._errors import BatchSizeError, DimensionError
from ._settings import lazy_legacy

__all__ = ["check_legacy_permute", "legacy_source", "remember_source"]

_ATTR = "_legacy_view_source"


def remember_source(result: Any, source: Any, op: str, arg: Any) -> Any:
    """Record on ``result`` (under legacy mode) that it is ``source`` after ``op(arg)``; return it."""
    if lazy_legacy() and result is not source:
        result.__dict__[_ATTR] = (source, op, arg)
    return result


def legacy_source(td: Any, op: str, arg: Any) -> Any:
    """The source of the legacy view ``td`` if ``op(arg)`` undoes the op that made it, else None.

    ``op`` is ``"view"`` (``arg``: the new batch size) or ``"permute"`` (``arg``: the full
    permutation of the batch dims).
    """
    if not lazy_legacy():
        return None
    record = td.__dict__.get(_ATTR)
    if record is None or record[1] != op:
        return None
    source, _, before = record
    if op == "view":
        return source if tuple(arg) == tuple(source.batch_size) else None
    # dim i of the result is dim arg[i] of td, which is dim before[arg[i]] of the source
    return source if all(before[p] == i for i, p in enumerate(arg)) else None


def check_legacy_permute(raw: list[int], ndim: int) -> None:
    """The legacy ``permute`` errors: one dim per batch dim, each once and in range.

    Raises:
        BatchSizeError: not one dim per batch dim, or a dim given twice (``RuntimeError``s, as in
            the reference's legacy mode).
        DimensionError: a dim out of range (an ``IndexError``).
    """
    if not lazy_legacy():
        return
    if len(raw) != ndim:
        raise BatchSizeError(
            f"permute: dims={raw} has {len(raw)} dims, the tensordict {ndim} batch dims; under "
            "set_lazy_legacy(True) give one dim per batch dim."
        )
    for d in raw:
        if not -ndim <= d < ndim:
            raise DimensionError(
                f"permute: dim {d} is out of range for {ndim} batch dims (expected -{ndim}..{ndim - 1})."
            )
    normalized = [d % ndim for d in raw]
    if len(set(normalized)) != ndim:
        raise BatchSizeError(f"permute: dims={raw} names a batch dim twice; give each batch dim once.")
