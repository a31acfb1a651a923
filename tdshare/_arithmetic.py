"""Element-wise arithmetic, ordering comparisons and pointwise functions of tensordicts.

A mixin of :class:`tdshare._tensordict_base.TensorDictBase`, so a ``TensorDict``, a lazy stack and
(through its forwarding) a tensorclass all get the same methods.  Every operation walks the tree
once: a tensor leaf gets the torch function, a nested level recurses, a lazy stack works member by
member (a tensordict operand is unbound along the stack dimension), a tensorclass entry is
unwrapped and wrapped again, and non-tensor values are kept unchanged (the reference's
behaviour).  The operand may be a number, a tensor (aligned with the batch dimensions of every
leaf, as in the reference), or a tensordict or tensorclass with the same tensor leaf keys
(``MissingKeyError``, a ``KeyError``, names the keys that differ).

In-place forms (``add_``, ``td += 1``...) write into the stored leaves, so on a memory-mapped
tensordict they write into the mapped files, locked or not, and return ``self``.  The many
single-argument functions are generated from one table (``UNARY``) by :func:`_unary` and
:func:`_unary_`; each is a class attribute, so ``help()``, ``dir()`` and type checkers see it.
"""

from __future__ import annotations

import numbers
import operator
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ._errors import ArgumentTypeError, BatchSizeError, MissingKeyError
from ._format import LEVEL, STACK, WRAPPED
from ._nodes import kind_of
from ._nontensor import NonTensorData

__all__ = ["ArithmeticOps", "OPERATORS", "UNARY", "leaf_keys", "node_layout", "operand", "unwrap_node", "walk"]

# the single-argument functions: name -> what the result holds (for the generated docstring)
UNARY: dict[str, str] = {
    "abs": "absolute values",
    "acos": "arc cosines",
    "asin": "arc sines",
    "atan": "arc tangents",
    "ceil": "values rounded up",
    "cos": "cosines",
    "cosh": "hyperbolic cosines",
    "erf": "error function values",
    "erfc": "complementary error function values",
    "exp": "exponentials",
    "expm1": "``exp(x) - 1`` values",
    "floor": "values rounded down",
    "frac": "fractional parts",
    "lgamma": "log-gamma values",
    "log": "natural logarithms",
    "log10": "base-10 logarithms",
    "log1p": "``log(1 + x)`` values",
    "log2": "base-2 logarithms",
    "neg": "negated values",
    "reciprocal": "reciprocals",
    "round": "values rounded to the nearest integer",
    "sigmoid": "logistic sigmoids",
    "sign": "signs (-1, 0 or 1)",
    "sin": "sines",
    "sinh": "hyperbolic sines",
    "sqrt": "square roots",
    "tan": "tangents",
    "tanh": "hyperbolic tangents",
    "trunc": "values rounded toward zero",
}
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


def node_layout(value: Any) -> str:
    """What ``value`` is in a tree: ``"tensor"``, ``"value"`` (non-tensor), a node layout, or ``"other"``."""
    if isinstance(value, NonTensorData):
        return "value"
    if isinstance(value, torch.Tensor):
        return "tensor"
    kind = kind_of(value)
    return "other" if kind is None else kind.layout


def operand(value: Any) -> Any:
    """``value`` with a tensorclass replaced by its tensordict (other values unchanged)."""
    kind = kind_of(value)
    if kind is not None and kind.layout == WRAPPED and kind.unwrap is not None:
        return kind.unwrap(value)[0]
    return value


def unwrap_node(value: Any) -> tuple[Any, dict[str, Any], Callable[[Any, dict[str, Any]], Any]]:
    """(inner collection or members, fields, wrap) of a tensorclass or lazy stack ``value``."""
    kind = kind_of(value)
    assert kind is not None and kind.unwrap is not None and kind.wrap is not None
    inner, fields = kind.unwrap(value)
    return inner, fields, kind.wrap


def leaf_keys(td: Any) -> set[tuple[str, ...]]:
    """The keys of the tensor leaves of ``td`` (nested keys as tuples; non-tensor values left out).

    A lazy stack's are the keys every member holds.
    """
    layout = node_layout(td)
    if layout == STACK:
        members = unwrap_node(td)[0]
        keys = leaf_keys(members[0])
        for member in members[1:]:
            keys &= leaf_keys(member)
        return keys
    if layout == WRAPPED:
        return leaf_keys(unwrap_node(td)[0])
    out: set[tuple[str, ...]] = set()
    for key, leaf in td._tensordict.items():
        kind = node_layout(leaf)
        if kind == "tensor":
            out.add((key,))
        elif kind in (LEVEL, STACK, WRAPPED):
            out.update((key, *sub) for sub in leaf_keys(leaf))
    return out


def _check_keys(td: Any, others: tuple[Any, ...]) -> None:
    mine = None
    for other in others:
        if node_layout(other) not in (LEVEL, STACK):
            continue
        mine = leaf_keys(td) if mine is None else mine
        theirs = leaf_keys(other)
        if mine != theirs:
            extra, missing = sorted(mine - theirs), sorted(theirs - mine)
            raise MissingKeyError(
                "keys in tensordicts mismatch: the first has the keys "
                f"{[k if len(k) > 1 else k[0] for k in extra]} that the second does not have, and lacks "
                f"{[k if len(k) > 1 else k[0] for k in missing]}. Select the common keys first "
                "(td.select(...) / td.exclude(...))."
            )


class _Aligned:
    """A tensor operand aligned with the batch dimensions (leading dims) of every leaf."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def for_leaf(self, leaf: torch.Tensor) -> torch.Tensor:
        t = self.tensor
        return t.reshape((*t.shape, *([1] * (leaf.dim() - t.dim()))))


def _prepare(td: Any, name: str, other: Any) -> Any:
    """Check one operand of ``name`` and turn it into what the walk expects."""
    other = operand(other)
    if isinstance(other, torch.Tensor) and not isinstance(other, NonTensorData):
        if other.dim() == 0:
            return other
        try:
            shape = torch.broadcast_shapes(td.batch_size, other.shape)
        except RuntimeError as err:
            raise BatchSizeError(
                f"{name}: a tensor of shape {list(other.shape)} does not broadcast with the batch size "
                f"{list(td.batch_size)} (a tensor operand is aligned with the leading dims of every leaf)."
            ) from err
        if shape != td.batch_size:
            raise BatchSizeError(
                f"{name}: a tensor of shape {list(other.shape)} would grow the batch size {list(td.batch_size)} "
                f"to {list(shape)}; expand the tensordict first."
            )
        return _Aligned(other.expand(td.batch_size))
    if isinstance(other, numbers.Number) or node_layout(other) in (LEVEL, STACK):
        if node_layout(other) in (LEVEL, STACK) and other.batch_size != td.batch_size:
            raise BatchSizeError(
                f"{name}: the other tensordict's batch size {list(other.batch_size)} differs from "
                f"{list(td.batch_size)}."
            )
        return other
    raise ArgumentTypeError(
        f"{name}: unsupported operand of type {type(other).__name__}; pass a number, a tensor, a "
        "tensordict or a tensorclass with the same keys."
    )


def _member_pieces(other: Any, stack_dim: int, count: int) -> list[Any]:
    """``other`` as one operand per member of a lazy stack along ``stack_dim``."""
    if node_layout(other) in (LEVEL, STACK):
        return list(other.unbind(stack_dim))
    if isinstance(other, _Aligned) and other.tensor.dim() > stack_dim:
        return [_Aligned(t) for t in other.tensor.unbind(stack_dim)]
    return [other] * count


def _child(other: Any, key: str) -> Any:
    if node_layout(other) == LEVEL:
        leaf = other._tensordict.get(key)
        if leaf is None:
            raise MissingKeyError(f"key {key!r} is missing from the other tensordict of the operation.")
        return operand(leaf)
    if node_layout(other) == STACK:
        return operand(other._get_leaf((key,)))
    return other


def _at_leaf(other: Any, leaf: torch.Tensor) -> Any:
    if isinstance(other, _Aligned):
        return other.for_leaf(leaf)
    if isinstance(other, NonTensorData):
        raise ArgumentTypeError("A tensor leaf cannot be combined with a non-tensor value of the other tensordict.")
    return other


def walk(
    td: Any,
    fn: Callable[..., Any],
    others: tuple[Any, ...],
    inplace: bool,
    keep_lock: bool = True,
    keep_names: bool = True,
) -> Any:
    """``fn(leaf, *other_leaves)`` for every tensor leaf of ``td``; a new tree, or ``td`` when ``inplace``.

    ``others`` were checked by :func:`_prepare`.  A lazy stack goes member by member; non-tensor
    values are kept (copied).  The result keeps the names and the lock when asked to.
    """
    layout = node_layout(td)
    if layout == STACK:
        members, fields, wrap = unwrap_node(td)
        pieces = [_member_pieces(o, fields["stack_dim"], len(members)) for o in others]
        results = [
            walk(m, fn, tuple(p[i] for p in pieces), inplace, keep_lock, keep_names) for i, m in enumerate(members)
        ]
        if inplace:
            return td
        out = wrap(results, fields)
        out._is_locked = keep_lock and td._is_locked
        return out
    leaves: dict[str, Any] = {}
    for key, leaf in td._tensordict.items():
        kind = node_layout(leaf)
        if kind == "value":
            if not inplace:
                leaves[key] = leaf.clone()
            continue
        theirs = tuple(_child(o, key) for o in others)
        if kind == "tensor":
            result = fn(leaf, *(_at_leaf(o, leaf) for o in theirs))
        elif kind == WRAPPED:
            inner, fields, wrap = unwrap_node(leaf)
            result = walk(inner, fn, theirs, inplace, keep_lock, keep_names)
            result = leaf if inplace else wrap(result, fields)
        else:
            result = walk(leaf, fn, theirs, inplace, keep_lock, keep_names)
        if not inplace:
            leaves[key] = result
    if inplace:
        return td
    out = type(td)._from_leaves(leaves, td._batch_size, td._device, td._names if keep_names else None)
    out._is_locked = keep_lock and td._is_locked
    return out


# -- the fast path: one torch._foreach_* call over every leaf of a dense tree --------------------
def _flat(td: Any, out: list[torch.Tensor] | None = None) -> list[torch.Tensor] | None:
    """The tensor leaves of a tree of plain levels, in walk order; None if it holds other nodes."""
    out = [] if out is None else out
    for leaf in td._tensordict.values():
        kind = node_layout(leaf)
        if kind == "tensor":
            if leaf.is_nested:
                return None
            out.append(leaf)
        elif kind == LEVEL:
            if _flat(leaf, out) is None:
                return None
        elif kind != "value":
            return None
    return out


def _assemble(td: Any, results: Iterator[torch.Tensor], keep_lock: bool) -> Any:
    """A tree shaped like ``td`` whose tensor leaves are the next ``results`` (in :func:`_flat` order)."""
    leaves: dict[str, Any] = {}
    for key, leaf in td._tensordict.items():
        kind = node_layout(leaf)
        if kind == "tensor":
            leaves[key] = next(results)
        elif kind == LEVEL:
            leaves[key] = _assemble(leaf, results, keep_lock)
        else:
            leaves[key] = leaf.clone()
    out = type(td)._from_leaves(leaves, td._batch_size, td._device, td._names)
    out._is_locked = keep_lock and td._is_locked
    return out


def _foreach(td: Any, name: str, args: tuple[Any, ...], inplace: bool) -> Any:
    """``torch._foreach_<name>(leaves, *args)`` over the whole tree, or None where it does not apply."""
    fn = getattr(torch, f"_foreach_{name}{'_' if inplace else ''}", None)
    if fn is None:
        return None
    if inplace:
        leaves = [t for t in td._stored_tensors() if not t.is_nested]
        if len(leaves) != sum(1 for _ in td._stored_tensors()):
            return None
        if leaves:
            fn(leaves, *args)
        return td
    flat = _flat(td) if node_layout(td) == LEVEL else None
    if not flat:
        return None
    try:
        results = fn(flat, *args)
    except (RuntimeError, TypeError):  # a dtype the fused kernel lacks: the leaf-by-leaf walk decides
        return None
    return _assemble(td, iter(results), keep_lock=True)


def _flat_pairs(td: Any, other: Any, mine: list[torch.Tensor], theirs: list[torch.Tensor]) -> bool:
    """Fill ``mine``/``theirs`` with the paired tensor leaves of two plain trees; False where they differ."""
    for key, leaf in td._tensordict.items():
        kind = node_layout(leaf)
        if kind == "value":
            continue
        match = other._tensordict.get(key)
        if kind == "tensor" and node_layout(match) == "tensor" and not leaf.is_nested and not match.is_nested:
            mine.append(leaf)
            theirs.append(match)
        elif not (kind == LEVEL and node_layout(match) == LEVEL and _flat_pairs(leaf, match, mine, theirs)):
            return False
    return True


def _foreach_pair(td: Any, name: str, other: Any, inplace: bool, kwargs: dict[str, Any]) -> Any:
    """``torch._foreach_<name>(leaves, other_leaves)`` for two plain trees with the same keys, or None."""
    fn = getattr(torch, f"_foreach_{name}{'_' if inplace else ''}", None)
    mine: list[torch.Tensor] = []
    theirs: list[torch.Tensor] = []
    if fn is None or node_layout(td) != LEVEL or not _flat_pairs(td, other, mine, theirs) or not mine:
        return None
    flat_other = _flat(other)
    if flat_other is None or len(flat_other) != len(theirs):  # extra keys in other: the walk says which
        return None
    if any(a.shape != b.shape for a, b in zip(mine, theirs, strict=True)):  # broadcasting: leaf by leaf
        return None
    try:
        results = fn(mine, theirs, **kwargs)
    except (RuntimeError, TypeError):
        return None
    return td if inplace else _assemble(td, iter(results), keep_lock=True)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, numbers.Number) or (isinstance(value, torch.Tensor) and value.dim() == 0)


def _binary(
    td: Any,
    name: str,
    fn: Callable[..., Any],
    others: tuple[Any, ...],
    inplace: bool = False,
    foreach: str | None = None,
    foreach_kwargs: dict[str, Any] | None = None,
) -> Any:
    prepared = tuple(_prepare(td, name, o) for o in others)
    if foreach is not None and len(prepared) == 1:
        if _is_scalar(prepared[0]) and not foreach_kwargs:
            done = _foreach(td, foreach, prepared, inplace)
        elif node_layout(prepared[0]) == LEVEL:
            done = _foreach_pair(td, foreach, prepared[0], inplace, foreach_kwargs or {})
        else:
            done = None
        if done is not None:
            return done
    _check_keys(td, prepared)
    if inplace and any(node_layout(o) in (LEVEL, STACK) for o in prepared):
        walk(td, lambda *_: None, prepared, inplace=False)  # every leaf pairs up: checked before any write
    return walk(td, fn, prepared, inplace)


def _unary(name: str, what: str) -> Callable[[Any], Any]:
    fn = getattr(torch, name)

    def method(self: Any) -> Any:
        done = _foreach(self, name, (), inplace=False)
        return walk(self, fn, (), inplace=False) if done is None else done

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"A new tensordict whose tensor leaves are the {what} of this one's (``torch.{name}`` leaf by leaf).\n\n"
        "Non-tensor values are kept; the result keeps the names and the lock.  The in-place form is\n"
        f"``{name}_()``.\n\n"
        ">>> import torch\n>>> from tdshare import TensorDict\n"
        f">>> TensorDict(a=torch.tensor([0.5, 4.0]), batch_size=[2]).{name}()['a'].shape\n"
        "torch.Size([2])\n"
    )
    return method


def _unary_(name: str, what: str) -> Callable[[Any], Any]:
    def method(self: Any) -> Any:
        if _foreach(self, name, (), inplace=True) is None:
            for leaf in self._stored_tensors():
                getattr(leaf, name + "_")()
        return self

    method.__name__ = method.__qualname__ = name + "_"
    method.__doc__ = (
        f"Replace every tensor leaf by its {what} (``Tensor.{name}_``), in place; return ``self``.\n\n"
        "Memory-mapped leaves are written in their files (allowed while locked).\n\n"
        ">>> import torch\n>>> from tdshare import TensorDict\n"
        f">>> td = TensorDict(a=torch.tensor([0.5, 4.0]), batch_size=[2])\n>>> td.{name}_() is td\nTrue\n"
    )
    return method


def _predicate(name: str) -> Callable[[Any], Any]:
    fn = getattr(torch, name)

    def method(self: Any) -> Any:
        return walk(self, fn, (), inplace=False)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (
        f"A new tensordict of boolean leaves: ``torch.{name}`` of every tensor leaf.\n\n"
        ">>> import torch\n>>> from tdshare import TensorDict\n"
        f">>> TensorDict(a=torch.tensor([1.0, float('nan')]), batch_size=[2]).{name}()['a'].dtype\n"
        "torch.bool\n"
    )
    return method


class ArithmeticOps:
    """Element-wise arithmetic and comparison; the host class provides the tree (see the module)."""

    _tensordict: dict[str, Any]
    _batch_size: torch.Size
    _is_locked: bool

    def _stored_tensors(self) -> Any:
        raise NotImplementedError

    # -- named binary operations ----------------------------------------------------------------
    def add(self, other: Any, *, alpha: float | None = None) -> Any:
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
        if alpha is None:
            return _binary(self, "add", torch.add, (other,), foreach="add")
        fn = lambda x, y: torch.add(x, y, alpha=alpha)  # noqa: E731
        return _binary(self, "add", fn, (other,), foreach="add", foreach_kwargs={"alpha": alpha})

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
        return _binary(self, "add_", lambda x, y: x.add_(y, **kw), (other,), inplace=True, foreach=fast)

    def sub(self, other: Any, *, alpha: float | None = None) -> Any:
        """``self - alpha * other`` leaf by leaf (operands as :meth:`add`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).sub(3)["a"].tolist()
        [-2.0, -2.0]
        """
        if alpha is None:
            return _binary(self, "sub", torch.sub, (other,), foreach="sub")
        return _binary(self, "sub", lambda x, y: torch.sub(x, y, alpha=alpha), (other,))

    def sub_(self, other: Any, *, alpha: float | None = None) -> Any:
        """``self -= alpha * other`` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).sub_(1)["a"].tolist()
        [0.0, 0.0]
        """
        kw = {} if alpha is None else {"alpha": alpha}
        fast = "sub" if alpha is None else None
        return _binary(self, "sub_", lambda x, y: x.sub_(y, **kw), (other,), inplace=True, foreach=fast)

    def rsub(self, other: Any, *, alpha: float | None = None) -> Any:
        """``other - alpha * self`` leaf by leaf (``2 - td``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).rsub(3)["a"].tolist()
        [2.0, 2.0]
        """
        kw = {} if alpha is None else {"alpha": alpha}
        return _binary(self, "rsub", lambda x, y: torch.rsub(x, y, **kw), (other,))

    def mul(self, other: Any) -> Any:
        """``self * other`` leaf by leaf (operands as :meth:`add`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).mul(3)["a"].tolist()
        [3.0, 3.0]
        """
        return _binary(self, "mul", torch.mul, (other,), foreach="mul")

    def mul_(self, other: Any) -> Any:
        """``self *= other`` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).mul_(3)["a"].tolist()
        [3.0, 3.0]
        """
        return _binary(self, "mul_", lambda x, y: x.mul_(y), (other,), inplace=True, foreach="mul")

    def div(self, other: Any) -> Any:
        """``self / other`` leaf by leaf (true division; operands as :meth:`add`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).div(4)["a"].tolist()
        [0.25, 0.25]
        """
        return _binary(self, "div", torch.div, (other,), foreach="div")

    def div_(self, other: Any) -> Any:
        """``self /= other`` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).div_(4)["a"].tolist()
        [0.25, 0.25]
        """
        return _binary(self, "div_", lambda x, y: x.div_(y), (other,), inplace=True, foreach="div")

    def pow(self, other: Any) -> Any:
        """``self ** other`` leaf by leaf (operands as :meth:`add`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.full((2,), 3.0), batch_size=[2]).pow(2)["a"].tolist()
        [9.0, 9.0]
        """
        return _binary(self, "pow", torch.pow, (other,), foreach="pow")

    def pow_(self, other: Any) -> Any:
        """``self **= other`` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.full((2,), 3.0), batch_size=[2]).pow_(2)["a"].tolist()
        [9.0, 9.0]
        """
        return _binary(self, "pow_", lambda x, y: x.pow_(y), (other,), inplace=True, foreach="pow")

    def mod(self, other: Any) -> Any:
        """``self % other`` leaf by leaf (``torch.remainder``: the sign of the divisor).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([5.0, -1.0]), batch_size=[2]).mod(3)["a"].tolist()
        [2.0, 2.0]
        """
        return _binary(self, "mod", torch.remainder, (other,))

    def maximum(self, other: Any) -> Any:
        """The element-wise maximum of ``self`` and ``other`` (``torch.maximum``; a tensor or tensordict).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2])
        >>> td.maximum(td * 0 + 2)["a"].tolist()
        [2.0, 5.0]
        """
        return _binary(self, "maximum", torch.maximum, (other,), foreach="maximum")

    def maximum_(self, other: Any) -> Any:
        """``maximum`` written into the leaves; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2])
        >>> td.maximum_(td * 0 + 2)["a"].tolist()
        [2.0, 5.0]
        """
        fn = lambda x, y: torch.maximum(x, y, out=x)  # noqa: E731
        return _binary(self, "maximum_", fn, (other,), inplace=True, foreach="maximum")

    def minimum(self, other: Any) -> Any:
        """The element-wise minimum of ``self`` and ``other`` (``torch.minimum``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2])
        >>> td.minimum(td * 0 + 2)["a"].tolist()
        [1.0, 2.0]
        """
        return _binary(self, "minimum", torch.minimum, (other,), foreach="minimum")

    def minimum_(self, other: Any) -> Any:
        """``minimum`` written into the leaves; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2])
        >>> td.minimum_(td * 0 + 2)["a"].tolist()
        [1.0, 2.0]
        """
        fn = lambda x, y: torch.minimum(x, y, out=x)  # noqa: E731
        return _binary(self, "minimum_", fn, (other,), inplace=True, foreach="minimum")

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

    def clamp_min(self, other: Any) -> Any:
        """Every leaf clamped from below by ``other`` (a number, tensor or tensordict).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp_min(0)["a"].tolist()
        [0.0, 5.0]
        """
        return _clamp(self, other, None, inplace=False)

    def clamp_min_(self, other: Any) -> Any:
        """:meth:`clamp_min` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp_min_(0)["a"].tolist()
        [0.0, 5.0]
        """
        return _clamp(self, other, None, inplace=True)

    def clamp_max(self, other: Any) -> Any:
        """Every leaf clamped from above by ``other`` (a number, tensor or tensordict).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([-1.0, 5.0]), batch_size=[2]).clamp_max(2)["a"].tolist()
        [-1.0, 2.0]
        """
        return _clamp(self, None, other, inplace=False)

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
        return _binary(self, "lerp", torch.lerp, (end, weight))

    def lerp_(self, end: Any, weight: Any) -> Any:
        """:meth:`lerp` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.lerp_(td + 4, 0.25)["a"].tolist()
        [1.0, 1.0]
        """
        return _binary(self, "lerp_", lambda x, e, w: x.lerp_(e, w), (end, weight), inplace=True)

    def addcmul(self, other1: Any, other2: Any, *, value: float = 1) -> Any:
        """``self + value * other1 * other2`` leaf by leaf (``torch.addcmul``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.addcmul(td, td + 1, value=2)["a"].tolist()
        [5.0, 5.0]
        """
        return _binary(self, "addcmul", lambda x, a, b: torch.addcmul(x, a, b, value=value), (other1, other2))

    def addcmul_(self, other1: Any, other2: Any, *, value: float = 1) -> Any:
        """:meth:`addcmul` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.addcmul_(td + 0, td + 1, value=2)["a"].tolist()
        [5.0, 5.0]
        """
        fn = lambda x, a, b: x.addcmul_(a, b, value=value)  # noqa: E731
        return _binary(self, "addcmul_", fn, (other1, other2), inplace=True)

    def addcdiv(self, other1: Any, other2: Any, *, value: float = 1) -> Any:
        """``self + value * other1 / other2`` leaf by leaf (``torch.addcdiv``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.addcdiv(td, td + 1)["a"].tolist()
        [1.5, 1.5]
        """
        return _binary(self, "addcdiv", lambda x, a, b: torch.addcdiv(x, a, b, value=value), (other1, other2))

    def addcdiv_(self, other1: Any, other2: Any, *, value: float = 1) -> Any:
        """:meth:`addcdiv` in place; return ``self``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), batch_size=[2])
        >>> td.addcdiv_(td + 0, td + 1)["a"].tolist()
        [1.5, 1.5]
        """
        fn = lambda x, a, b: x.addcdiv_(a, b, value=value)  # noqa: E731
        return _binary(self, "addcdiv_", fn, (other1, other2), inplace=True)

    def logical_and(self, other: Any) -> Any:
        """``torch.logical_and`` of every leaf with ``other`` (boolean leaves).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([0.0, 2.0]), batch_size=[2]).logical_and(1)["a"].tolist()
        [False, True]
        """
        return _binary(self, "logical_and", lambda x, y: torch.logical_and(x, torch.as_tensor(y)), (other,))

    def bitwise_and(self, other: Any) -> Any:
        """``torch.bitwise_and`` of every (integer or boolean) leaf with ``other``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([6, 3]), batch_size=[2]).bitwise_and(2)["a"].tolist()
        [2, 2]
        """
        return _binary(self, "bitwise_and", torch.bitwise_and, (other,))

    # -- single-argument functions (generated from UNARY) ---------------------------------------
    abs = _unary("abs", UNARY["abs"])
    abs_ = _unary_("abs", UNARY["abs"])
    acos = _unary("acos", UNARY["acos"])
    acos_ = _unary_("acos", UNARY["acos"])
    asin = _unary("asin", UNARY["asin"])
    asin_ = _unary_("asin", UNARY["asin"])
    atan = _unary("atan", UNARY["atan"])
    atan_ = _unary_("atan", UNARY["atan"])
    ceil = _unary("ceil", UNARY["ceil"])
    ceil_ = _unary_("ceil", UNARY["ceil"])
    cos = _unary("cos", UNARY["cos"])
    cos_ = _unary_("cos", UNARY["cos"])
    cosh = _unary("cosh", UNARY["cosh"])
    cosh_ = _unary_("cosh", UNARY["cosh"])
    erf = _unary("erf", UNARY["erf"])
    erf_ = _unary_("erf", UNARY["erf"])
    erfc = _unary("erfc", UNARY["erfc"])
    erfc_ = _unary_("erfc", UNARY["erfc"])
    exp = _unary("exp", UNARY["exp"])
    exp_ = _unary_("exp", UNARY["exp"])
    expm1 = _unary("expm1", UNARY["expm1"])
    expm1_ = _unary_("expm1", UNARY["expm1"])
    floor = _unary("floor", UNARY["floor"])
    floor_ = _unary_("floor", UNARY["floor"])
    frac = _unary("frac", UNARY["frac"])
    frac_ = _unary_("frac", UNARY["frac"])
    lgamma = _unary("lgamma", UNARY["lgamma"])
    lgamma_ = _unary_("lgamma", UNARY["lgamma"])
    log = _unary("log", UNARY["log"])
    log_ = _unary_("log", UNARY["log"])
    log10 = _unary("log10", UNARY["log10"])
    log10_ = _unary_("log10", UNARY["log10"])
    log1p = _unary("log1p", UNARY["log1p"])
    log1p_ = _unary_("log1p", UNARY["log1p"])
    log2 = _unary("log2", UNARY["log2"])
    log2_ = _unary_("log2", UNARY["log2"])
    neg = _unary("neg", UNARY["neg"])
    neg_ = _unary_("neg", UNARY["neg"])
    reciprocal = _unary("reciprocal", UNARY["reciprocal"])
    reciprocal_ = _unary_("reciprocal", UNARY["reciprocal"])
    round = _unary("round", UNARY["round"])
    round_ = _unary_("round", UNARY["round"])
    sigmoid = _unary("sigmoid", UNARY["sigmoid"])
    sigmoid_ = _unary_("sigmoid", UNARY["sigmoid"])
    sign = _unary("sign", UNARY["sign"])
    sign_ = _unary_("sign", UNARY["sign"])
    sin = _unary("sin", UNARY["sin"])
    sin_ = _unary_("sin", UNARY["sin"])
    sinh = _unary("sinh", UNARY["sinh"])
    sinh_ = _unary_("sinh", UNARY["sinh"])
    sqrt = _unary("sqrt", UNARY["sqrt"])
    sqrt_ = _unary_("sqrt", UNARY["sqrt"])
    tan = _unary("tan", UNARY["tan"])
    tan_ = _unary_("tan", UNARY["tan"])
    tanh = _unary("tanh", UNARY["tanh"])
    tanh_ = _unary_("tanh", UNARY["tanh"])
    trunc = _unary("trunc", UNARY["trunc"])
    trunc_ = _unary_("trunc", UNARY["trunc"])
    isfinite = _predicate("isfinite")
    isnan = _predicate("isnan")
    isinf = _predicate("isinf")
    isneginf = _predicate("isneginf")
    isposinf = _predicate("isposinf")
    isreal = _predicate("isreal")

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
        return _binary(self, "__rtruediv__", lambda x, y: torch.div(y, x), (other,))

    def __itruediv__(self, other: Any) -> Any:
        return self.div_(other)

    def __floordiv__(self, other: Any) -> Any:
        return _binary(self, "__floordiv__", torch.floor_divide, (other,))

    def __rfloordiv__(self, other: Any) -> Any:
        return _binary(self, "__rfloordiv__", lambda x, y: torch.floor_divide(y, x), (other,))

    def __ifloordiv__(self, other: Any) -> Any:
        return _binary(self, "__ifloordiv__", lambda x, y: x.floor_divide_(y), (other,), inplace=True)

    def __mod__(self, other: Any) -> Any:
        return self.mod(other)

    def __rmod__(self, other: Any) -> Any:
        return _binary(self, "__rmod__", lambda x, y: torch.remainder(y, x), (other,))

    def __imod__(self, other: Any) -> Any:
        return _binary(self, "__imod__", lambda x, y: x.remainder_(y), (other,), inplace=True)

    def __pow__(self, other: Any) -> Any:
        return self.pow(other)

    def __rpow__(self, other: Any) -> Any:
        return _binary(self, "__rpow__", lambda x, y: torch.pow(y, x), (other,))

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
        return _binary(self, "__or__", torch.bitwise_or, (other,))

    __ror__ = __or__

    def __xor__(self, other: Any) -> Any:
        return _binary(self, "__xor__", torch.bitwise_xor, (other,))

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
    return _binary(td, "clamp_" if inplace else "clamp", fn, bounds, inplace=inplace, foreach=fast)


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
    prepared = _prepare(td, name, other)
    _check_keys(td, (prepared,))
    return walk(td, op, (prepared,), inplace=False, keep_lock=False, keep_names=False)
