"""Element-wise arithmetic and ordering comparisons of tensordicts: ``+ - * / // % **`` (with
their reflected and in-place forms), ``-td``, ``abs``, ``~``, ``& | ^``, ``< <= > >=``, and the
reference's named methods (``add``, ``sub``, ``mul``, ``div``, ``pow``, ``lerp``, ``addcmul``,
``clamp``, ``maximum``...).

A mixin of :class:`tdshare._tensordict_base.TensorDictBase`, so a ``TensorDict``, a lazy stack and
(through its forwarding, see ``OPERATORS``) a tensorclass all get the same methods; the work is
done by :mod:`tdshare._tree_walk`.  Results keep the names and the lock (comparisons: neither, as
in the reference).  In-place forms (``add_``, ``td += 1``...) write into the stored leaves, so on
a memory-mapped tensordict they write into the mapped files, locked or not, and return ``self``;
a tensordict operand is checked against every leaf before anything is written.
"""

from __future__ import annotations

import numbers
import operator
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._errors import ArgumentTypeError
from ._format import LEVEL, STACK
from ._key_ops import tensor_entries
from ._tree_walk import binary, check_keys, node_layout, operand, prepare, walk

__all__ = ["ArithmeticOps", "OPERATORS"]

# the Python operators a tensorclass forwards to its tensordict (it has no __getattr__ for dunders)
OPERATORS = (
    "__abs__", "__neg__", "__invert__",
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__",
    "__mul__", "__rmul__", "__imul__", "__truediv__", "__rtruediv__", "__itruediv__",
    "__floordiv__", "__rfloordiv__", "__ifloordiv__", "__mod__", "__rmod__", "__imod__",
    "__pow__", "__rpow__", "__ipow__",
    "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
    "__lt__", "__le__", "__gt__", "__ge__",
)  # fmt: skip


class ArithmeticOps:
    """Element-wise arithmetic and comparison; the host class provides the tree (see the module)."""

    _tensordict: dict[str, Any]
    _batch_size: torch.Size
    _is_locked: bool
    neg: Callable[..., Any]  # from PointwiseOps
    abs: Callable[..., Any]

    def _stored_tensors(self) -> Any:
        raise NotImplementedError

    # -- named binary operations ----------------------------------------------------------------
    def add(self, other: Any, *, alpha: float | None = None, default: Any = None) -> Any:
        """``self + alpha * other`` leaf by leaf (a new tensordict; names and lock kept).

        Args:
            other: a number, a tensor (aligned with the batch dims of every leaf), or a
                tensordict/tensorclass with the same tensor leaf keys.
            alpha: a multiplier for ``other``.

        Raises:
            MissingKeyError: the other tensordict's keys differ (a ``KeyError``).
            BatchSizeError: a tensor or tensordict whose shape does not fit the batch size.
            ArgumentTypeError: an operand of another type.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.add(td, alpha=2)["a"].tolist()
        [3.0, 3.0]
        """
        self_, other = with_default(self, other, default)
        if alpha is None:
            return binary(self_, "add", torch.add, (other,), foreach="add")
        fn = lambda x, y: torch.add(x, y, alpha=alpha)  # noqa: E731
        return binary(self_, "add", fn, (other,), foreach="add", foreach_kwargs={"alpha": alpha})

    def add_(self, other: Any, *, alpha: float | None = None) -> Any:
        """``self += alpha * other`` in place (memory-mapped leaves written in their files); ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.add_(1)["a"].tolist()
        [2.0, 2.0]
        """
        kw = {} if alpha is None else {"alpha": alpha}
        fast = "add" if alpha is None else None
        return binary(self, "add_", lambda x, y: x.add_(y, **kw), (other,), inplace=True, foreach=fast)

    def sub(self, other: Any, *, alpha: float | None = None, default: Any = None) -> Any:
        """``self - alpha * other`` leaf by leaf (operands as :meth:`add`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).sub(3)["a"].tolist()
        [-2.0, -2.0]
        """
        self_, other = with_default(self, other, default)
        if alpha is None:
            return binary(self_, "sub", torch.sub, (other,), foreach="sub")
        return binary(self_, "sub", lambda x, y: torch.sub(x, y, alpha=alpha), (other,))

    def sub_(self, other: Any, *, alpha: float | None = None) -> Any:
        """``self -= alpha * other`` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).sub_(1)["a"].tolist()
        [0.0, 0.0]
        """
        kw = {} if alpha is None else {"alpha": alpha}
        fast = "sub" if alpha is None else None
        return binary(self, "sub_", lambda x, y: x.sub_(y, **kw), (other,), inplace=True, foreach=fast)

    def rsub(self, other: Any, *, alpha: float | None = None) -> Any:
        """``other - alpha * self`` leaf by leaf (``2 - td``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).rsub(3)["a"].tolist()
        [2.0, 2.0]
        """
        kw = {} if alpha is None else {"alpha": alpha}
        return binary(self, "rsub", lambda x, y: torch.rsub(x, y, **kw), (other,))

    def mul(self, other: Any, *, default: Any = None) -> Any:
        """``self * other`` leaf by leaf (operands as :meth:`add`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).mul(3)["a"].tolist()
        [3.0, 3.0]
        """
        self_, other = with_default(self, other, default)
        return binary(self_, "mul", torch.mul, (other,), foreach="mul")

    def mul_(self, other: Any) -> Any:
        """``self *= other`` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).mul_(3)["a"].tolist()
        [3.0, 3.0]
        """
        return binary(self, "mul_", lambda x, y: x.mul_(y), (other,), inplace=True, foreach="mul")

    def div(self, other: Any, *, default: Any = None) -> Any:
        """``self / other`` leaf by leaf (true division; operands as :meth:`add`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).div(4)["a"].tolist()
        [0.25, 0.25]
        """
        self_, other = with_default(self, other, default)
        return binary(self_, "div", torch.div, (other,), foreach="div")

    def div_(self, other: Any) -> Any:
        """``self /= other`` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).div_(4)["a"].tolist()
        [0.25, 0.25]
        """
        return binary(self, "div_", lambda x, y: x.div_(y), (other,), inplace=True, foreach="div")

    def pow(self, other: Any, *, default: Any = None) -> Any:
        """``self ** other`` leaf by leaf (operands as :meth:`add`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.full((2,), 3.0), batch_size=[2]).pow(2)["a"].tolist()
        [9.0, 9.0]
        """
        self_, other = with_default(self, other, default)
        return binary(self_, "pow", torch.pow, (other,), foreach="pow")

    def pow_(self, other: Any) -> Any:
        """``self **= other`` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.full((2,), 3.0), batch_size=[2]).pow_(2)["a"].tolist()
        [9.0, 9.0]
        """
        return binary(self, "pow_", lambda x, y: x.pow_(y), (other,), inplace=True, foreach="pow")

    def mod(self, other: Any) -> Any:
        """``self % other`` leaf by leaf (``torch.remainder``: the sign of the divisor).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([5.0, -1.0]), batch_size=[2]).mod(3)["a"].tolist()
        [2.0, 2.0]
        """
        return binary(self, "mod", torch.remainder, (other,))

    def maximum(self, other: Any, *, default: Any = None) -> Any:
        """The element-wise maximum of ``self`` and ``other`` (``torch.maximum``; a tensor or tensordict).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2])
        >>> td.maximum(td * 0 + 2)["a"].tolist()
        [2.0, 5.0]
        """
        self_, other = with_default(self, other, default)
        return binary(self_, "maximum", torch.maximum, (other,), foreach="maximum")

    def maximum_(self, other: Any) -> Any:
        """``maximum`` written into the leaves; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2])
        >>> td.maximum_(td * 0 + 2)["a"].tolist()
        [2.0, 5.0]
        """
        fn = lambda x, y: torch.maximum(x, y, out=x)  # noqa: E731
        return binary(self, "maximum_", fn, (other,), inplace=True, foreach="maximum")

    def minimum(self, other: Any, *, default: Any = None) -> Any:
        """The element-wise minimum of ``self`` and ``other`` (``torch.minimum``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2])
        >>> td.minimum(td * 0 + 2)["a"].tolist()
        [1.0, 2.0]
        """
        self_, other = with_default(self, other, default)
        return binary(self_, "minimum", torch.minimum, (other,), foreach="minimum")

    def minimum_(self, other: Any) -> Any:
        """``minimum`` written into the leaves; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2])
        >>> td.minimum_(td * 0 + 2)["a"].tolist()
        [1.0, 2.0]
        """
        fn = lambda x, y: torch.minimum(x, y, out=x)  # noqa: E731
        return binary(self, "minimum_", fn, (other,), inplace=True, foreach="minimum")

    def clamp(self, min: Any = None, max: Any = None) -> Any:
        """Every leaf clamped into ``[min, max]`` (either may be None; numbers, tensors or tensordicts).

        Raises:
            ArgumentTypeError: neither bound is given.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp(0, 2)["a"].tolist()
        [0.0, 2.0]
        """
        return _clamp(self, min, max, inplace=False)

    def clamp_(self, min: Any = None, max: Any = None) -> Any:
        """:meth:`clamp` written into the leaves; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp_(0, 2)["a"].tolist()
        [0.0, 2.0]
        """
        return _clamp(self, min, max, inplace=True)

    def clamp_min(self, other: Any, *, default: Any = None) -> Any:
        """Every leaf clamped from below by ``other`` (a number, tensor or tensordict).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp_min(0)["a"].tolist()
        [0.0, 5.0]
        """
        self_, other = with_default(self, other, default)
        return _clamp(self_, other, None, inplace=False)

    def clamp_min_(self, other: Any) -> Any:
        """:meth:`clamp_min` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp_min_(0)["a"].tolist()
        [0.0, 5.0]
        """
        return _clamp(self, other, None, inplace=True)

    def clamp_max(self, other: Any, *, default: Any = None) -> Any:
        """Every leaf clamped from above by ``other`` (a number, tensor or tensordict).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp_max(2)["a"].tolist()
        [-1.0, 2.0]
        """
        self_, other = with_default(self, other, default)
        return _clamp(self_, None, other, inplace=False)

    def clamp_max_(self, other: Any) -> Any:
        """:meth:`clamp_max` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp_max_(2)["a"].tolist()
        [-1.0, 2.0]
        """
        return _clamp(self, None, other, inplace=True)

    def lerp(self, end: Any, weight: Any) -> Any:
        """``self + weight * (end - self)`` leaf by leaf (``torch.lerp``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.lerp(td + 4, 0.25)["a"].tolist()
        [1.0, 1.0]
        """
        return binary(self, "lerp", torch.lerp, (end, weight))

    def lerp_(self, end: Any, weight: Any) -> Any:
        """:meth:`lerp` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.lerp_(td + 4, 0.25)["a"].tolist()
        [1.0, 1.0]
        """
        return binary(self, "lerp_", lambda x, e, w: x.lerp_(e, w), (end, weight), inplace=True)

    def addcmul(self, other1: Any, other2: Any, *, value: float = 1) -> Any:
        """``self + value * other1 * other2`` leaf by leaf (``torch.addcmul``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.addcmul(td, td + 1, value=2)["a"].tolist()
        [5.0, 5.0]
        """
        return binary(self, "addcmul", lambda x, a, b: torch.addcmul(x, a, b, value=value), (other1, other2))

    def addcmul_(self, other1: Any, other2: Any, *, value: float = 1) -> Any:
        """:meth:`addcmul` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.addcmul_(td + 0, td + 1, value=2)["a"].tolist()
        [5.0, 5.0]
        """
        fn = lambda x, a, b: x.addcmul_(a, b, value=value)  # noqa: E731
        return binary(self, "addcmul_", fn, (other1, other2), inplace=True)

    def addcdiv(self, other1: Any, other2: Any, *, value: float = 1) -> Any:
        """``self + value * other1 / other2`` leaf by leaf (``torch.addcdiv``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.addcdiv(td, td + 1)["a"].tolist()
        [1.5, 1.5]
        """
        return binary(self, "addcdiv", lambda x, a, b: torch.addcdiv(x, a, b, value=value), (other1, other2))

    def addcdiv_(self, other1: Any, other2: Any, *, value: float = 1) -> Any:
        """:meth:`addcdiv` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.addcdiv_(td + 0, td + 1)["a"].tolist()
        [1.5, 1.5]
        """
        fn = lambda x, a, b: x.addcdiv_(a, b, value=value)  # noqa: E731
        return binary(self, "addcdiv_", fn, (other1, other2), inplace=True)

    def logical_and(self, other: Any) -> Any:
        """``torch.logical_and`` of every leaf with ``other`` (boolean leaves).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([0.0, 2.0]), batch_size=[2]).logical_and(1)["a"].tolist()
        [False, True]
        """
        return binary(self, "logical_and", lambda x, y: torch.logical_and(x, torch.as_tensor(y)), (other,))

    def bitwise_and(self, other: Any) -> Any:
        """``torch.bitwise_and`` of every (integer or boolean) leaf with ``other``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([6, 3]), batch_size=[2]).bitwise_and(2)["a"].tolist()
        [2, 2]
        """
        return binary(self, "bitwise_and", torch.bitwise_and, (other,))

    # -- operators ------------------------------------------------------------------------------
    def __add__(self, other: Any) -> Any:
        return self.add(other)

    __radd__ = __add__

    def __iadd__(self, other: Any) -> Any:
        return self.add_(other)

    def __sub__(self, other: Any) -> Any:
        return self.sub(other)

    def __rsub__(self, other: Any) -> Any:
        return self.rsub(other)

    def __isub__(self, other: Any) -> Any:
        return self.sub_(other)

    def __mul__(self, other: Any) -> Any:
        return self.mul(other)

    __rmul__ = __mul__

    def __imul__(self, other: Any) -> Any:
        return self.mul_(other)

    def __truediv__(self, other: Any) -> Any:
        return self.div(other)

    def __rtruediv__(self, other: Any) -> Any:
        return binary(self, "__rtruediv__", lambda x, y: torch.div(y, x), (other,))

    def __itruediv__(self, other: Any) -> Any:
        return self.div_(other)

    def __floordiv__(self, other: Any) -> Any:
        return binary(self, "__floordiv__", torch.floor_divide, (other,))

    def __rfloordiv__(self, other: Any) -> Any:
        return binary(self, "__rfloordiv__", lambda x, y: torch.floor_divide(y, x), (other,))

    def __ifloordiv__(self, other: Any) -> Any:
        return binary(self, "__ifloordiv__", lambda x, y: x.floor_divide_(y), (other,), inplace=True)

    def __mod__(self, other: Any) -> Any:
        return self.mod(other)

    def __rmod__(self, other: Any) -> Any:
        return binary(self, "__rmod__", lambda x, y: torch.remainder(y, x), (other,))

    def __imod__(self, other: Any) -> Any:
        return binary(self, "__imod__", lambda x, y: x.remainder_(y), (other,), inplace=True)

    def __pow__(self, other: Any) -> Any:
        return self.pow(other)

    def __rpow__(self, other: Any) -> Any:
        return binary(self, "__rpow__", lambda x, y: torch.pow(y, x), (other,))

    def __ipow__(self, other: Any) -> Any:
        return self.pow_(other)

    def __neg__(self) -> Any:
        return self.neg()

    def __abs__(self) -> Any:
        return self.abs()

    def __invert__(self) -> Any:
        return walk(self, torch.bitwise_not, (), inplace=False)

    def __and__(self, other: Any) -> Any:
        return self.bitwise_and(other)

    __rand__ = __and__

    def __or__(self, other: Any) -> Any:
        return binary(self, "__or__", torch.bitwise_or, (other,))

    __ror__ = __or__

    def __xor__(self, other: Any) -> Any:
        return binary(self, "__xor__", torch.bitwise_xor, (other,))

    __rxor__ = __xor__

    # -- ordering comparisons (== and != are in _combine) ---------------------------------------
    def __lt__(self, other: Any) -> Any:
        return _order(self, "__lt__", operator.lt, other)

    def __le__(self, other: Any) -> Any:
        return _order(self, "__le__", operator.le, other)

    def __gt__(self, other: Any) -> Any:
        return _order(self, "__gt__", operator.gt, other)

    def __ge__(self, other: Any) -> Any:
        return _order(self, "__ge__", operator.ge, other)


def _clamp(td: Any, low: Any, high: Any, inplace: bool) -> Any:
    if low is None and high is None:
        raise ArgumentTypeError("clamp: at least one of min and max must be given (a number, tensor or tensordict).")
    bounds = tuple(b for b in (low, high) if b is not None)

    def fn(x: torch.Tensor, *b: Any) -> torch.Tensor:
        lo = b[0] if low is not None else None
        hi = b[-1] if high is not None else None
        lo = torch.as_tensor(lo, dtype=x.dtype) if lo is not None and not isinstance(lo, torch.Tensor) else lo
        hi = torch.as_tensor(hi, dtype=x.dtype) if hi is not None and not isinstance(hi, torch.Tensor) else hi
        return torch.clamp(x, lo, hi, out=x) if inplace else torch.clamp(x, lo, hi)

    fast = "clamp_min" if high is None else "clamp_max" if low is None else None
    return binary(td, "clamp_" if inplace else "clamp", fn, bounds, inplace=inplace, foreach=fast)


def _order(td: Any, name: str, op: Callable[[Any, Any], Any], other: Any) -> Any:
    """An ordering comparison: a new tensordict of booleans, unlocked and unnamed (the reference's)."""
    if isinstance(other, Mapping) and node_layout(other) not in (LEVEL, STACK):
        other = type(td)(dict(other), batch_size=td.batch_size) if node_layout(td) == LEVEL else dict(other)
    if not isinstance(other, (numbers.Number, torch.Tensor)) and node_layout(operand(other)) not in (LEVEL, STACK):
        warnings.warn(
            f"{name} of a tensordict with a {type(other).__name__} gives False (the reference's behaviour, which it "
            "will change to a TypeError).",
            FutureWarning,
            stacklevel=3,
        )
        return False
    prepared = prepare(td, name, other)
    check_keys(td, (prepared,))
    return walk(td, op, (prepared,), inplace=False, keep_lock=False, keep_names=False)


def with_default(td: Any, other: Any, default: Any) -> tuple[Any, Any]:
    """The two operands of a binary method called with ``default=``, their tensor keys made to agree.

    ``default=None`` changes nothing (keys that differ raise); ``"intersection"`` keeps the tensor
    entries both hold (and ``td``'s non-tensor ones); a value (a number or tensor) stands in, on
    either side, for a tensor entry only the other holds, broadcast to its shape.

    >>> from tdshare import TensorDict
    >>> a, b = TensorDict(x=torch.ones(2), y=torch.ones(2)), TensorDict(y=torch.ones(2), z=torch.ones(2))
    >>> mine, theirs = with_default(a, b, 0)
    >>> sorted(mine.keys()), sorted(theirs.keys())
    (['x', 'y', 'z'], ['x', 'y', 'z'])
    """
    if default is None or node_layout(other) is None:
        return td, other
    mine, theirs = tensor_entries(td), tensor_entries(other)
    if isinstance(default, str):
        if default != "intersection":
            raise ArgumentTypeError(f"default={default!r}: pass 'intersection', a number or a tensor.")
        drop_mine = [k for k in mine if k not in theirs]
        drop_theirs = [k for k in theirs if k not in mine]
        return (td.exclude(*drop_mine) if drop_mine else td), (other.exclude(*drop_theirs) if drop_theirs else other)
    value = torch.as_tensor(default)
    if all(k in theirs for k in mine) and all(k in mine for k in theirs):
        return td, other
    td, other = td.copy(), other.copy()
    for key, leaf in theirs.items():
        if key not in mine:
            td.set(key, value.to(leaf.device).expand_as(leaf))
    for key, leaf in mine.items():
        if key not in theirs:
            other.set(key, value.to(leaf.device).expand_as(leaf))
    return td, other
