"""Small public helpers under the reference's names: telling non-tensor entries apart
(:func:`is_non_tensor`), comparing two tensordicts in tests (:func:`assert_close`, also named
:func:`assert_allclose_td`), and spelling out an index's ellipsis (:func:`convert_ellipsis_to_idx`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._errors import ArgumentTypeError, BatchSizeError, MissingKeyError
from ._indexing import index_dims
from ._keys import NestedKey, unravel_key
from ._lazy import LazyStackedTensorDict
from ._nontensor import NonTensorData
from ._tensorclass import is_tensorclass
from ._tensordict_base import TensorDictBase

__all__ = ["assert_allclose_td", "assert_close", "convert_ellipsis_to_idx", "is_non_tensor"]


def is_non_tensor(data: Any) -> bool:
    """Whether ``data`` is a non-tensor entry: a :class:`NonTensorData` or a :class:`NonTensorStack`.

    Args:
        data: any object, typically a value read with ``td.get(key)``.

    Returns:
        True for a non-tensor entry, False for anything else (tensors, tensordicts, plain values).

    >>> import tdshare
    >>> td = tdshare.TensorDict(s="text")
    >>> tdshare.is_non_tensor(td.get("s")), tdshare.is_non_tensor(td["s"])
    (True, False)
    """
    return isinstance(data, NonTensorData)


def _as_tree(value: Any, name: str) -> TensorDictBase:
    if is_tensorclass(value):
        return value._tensordict
    if not isinstance(value, TensorDictBase):
        raise ArgumentTypeError(
            f"assert_close: {name} must be a tensordict or a tensorclass, got {type(value).__name__}; "
            "compare plain tensors with torch.testing.assert_close."
        )
    return value


def assert_close(
    actual: Any,
    expected: Any,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
    intersection: bool = False,
    msg: str = "",
    prefix: NestedKey = (),
) -> bool:
    """Check that two tensordicts hold the same tensor keys with close values.

    Each pair of tensors goes through :func:`torch.testing.assert_close` (dtype, shape, device and
    values); non-tensor entries are not compared. Two lazy stacks are compared member by member.

    Args:
        actual: the tensordict (or tensorclass) to check.
        expected: the one with the expected values.
        rtol, atol: tolerances (None: torch's defaults for the dtype).
        equal_nan: whether two NaN compare equal.
        intersection: compare only the keys both hold instead of requiring the same keys.
        msg: text appended to the error message.
        prefix: a key put in front of the keys named in error messages.

    Returns:
        True when the check passes.

    Raises:
        ArgumentTypeError: ``actual`` or ``expected`` is not a tensordict or tensorclass.
        MissingKeyError: the key sets differ and ``intersection`` is False.
        AssertionError: two values are not close (names the key and the mean squared error).

    >>> import torch, tdshare
    >>> a = tdshare.TensorDict(x=torch.zeros(3))
    >>> tdshare.assert_close(a, a.clone())
    True
    """
    left, right = _as_tree(actual, "actual"), _as_tree(expected, "expected")
    start = unravel_key(prefix) if prefix else ()
    if isinstance(left, LazyStackedTensorDict) and isinstance(right, LazyStackedTensorDict):
        if len(left.tensordicts) == len(right.tensordicts) and left.stack_dim == right.stack_dim:
            for a, b in zip(left.tensordicts, right.tensordicts, strict=True):
                assert_close(a, b, rtol, atol, equal_nan, intersection, msg, start)
            return True
    keys_a, keys_b = set(left.keys()), set(right.keys())
    if keys_a != keys_b and not intersection:
        raise MissingKeyError(
            f"assert_close: the keys under {start} differ: only in actual {sorted(keys_a - keys_b)}, only in "
            f"expected {sorted(keys_b - keys_a)}; pass intersection=True to compare the common keys. {msg}".rstrip()
        )
    for key in sorted(keys_a & keys_b):
        a, b = left.get(key), right.get(key)
        if is_non_tensor(a) or is_non_tensor(b):
            continue
        if isinstance(a, TensorDictBase) or is_tensorclass(a):
            assert_close(a, b, rtol, atol, equal_nan, intersection, msg, (*start, key))
            continue
        try:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
        except AssertionError as err:
            diff = (a.double() - b.double()).pow(2).mean().item() if a.shape == b.shape else float("nan")
            raise AssertionError(f"key {(*start, key)} does not match, got mse = {diff:.4f}\n{err}\n{msg}") from None
    return True


assert_allclose_td = assert_close


def convert_ellipsis_to_idx(idx: Any, batch_size: Sequence[int]) -> Any:
    """Replace the ellipsis of an index with one ``slice(None)`` per dimension it stands for.

    Args:
        idx: an index (a tuple, or ``...``); any other index is returned as is.
        batch_size: the shape the index applies to.

    Returns:
        The index as a tuple without ellipsis.

    Raises:
        BatchSizeError: the index has more than one ellipsis, or uses more dimensions than
            ``batch_size`` has (a RuntimeError, as in the reference).

    >>> import tdshare
    >>> tdshare.convert_ellipsis_to_idx((..., 0), [1, 2, 3])
    (slice(None, None, None), slice(None, None, None), 0)
    """
    if idx is Ellipsis:
        idx = (idx,)
    elif not isinstance(idx, tuple):
        return idx
    where = [i for i, item in enumerate(idx) if item is Ellipsis]
    if len(where) > 1:
        raise BatchSizeError(f"An index can hold one ellipsis at most, got {idx!r}; drop the extra '...'.")
    if not where:
        return idx
    covered = len(batch_size) - sum(index_dims(item) for item in idx if item is not Ellipsis)
    if covered < 0:
        raise BatchSizeError(f"The index {idx!r} uses more dimensions than the batch size {list(batch_size)} has.")
    return idx[: where[0]] + (slice(None),) * covered + idx[where[0] + 1 :]
