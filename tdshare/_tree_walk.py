"""Walking a tensor tree for element-wise work: one leaf function over every tensor leaf.

The shared engine of :mod:`tdshare._arithmetic`, :mod:`tdshare._pointwise` and
:mod:`tdshare._reduce_ops`.  :func:`walk` calls a function on every tensor leaf of a tree and
builds the result tree: a nested level recurses, a lazy stack goes member by member (a tensordict
operand is unbound along the stack dimension), a tensorclass entry is unwrapped and wrapped again,
and non-tensor values are kept (the reference's behaviour).  :func:`prepare` checks an operand
first: a number, a tensor (aligned with the batch dimensions of every leaf, as in the reference),
or a tensordict or tensorclass with the same tensor leaf keys (:func:`check_keys` raises
``MissingKeyError``, a ``KeyError``, naming the keys that differ).  Where a tree is plain levels
of tensors, :func:`foreach_leaves` and :func:`binary` make one ``torch._foreach_*`` call over all leaves.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._errors import ArgumentTypeError, BatchSizeError, MissingKeyError
from ._format import LEVEL, STACK, WRAPPED
from ._nodes import kind_of
from ._nontensor import NonTensorData, NonTensorStack

__all__ = [
    "binary",
    "check_keys",
    "foreach_leaves",
    "leaf_keys",
    "node_layout",
    "operand",
    "prepare",
    "unwrap_node",
    "walk",
]


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


def check_keys(td: Any, others: tuple[Any, ...]) -> None:
    """Raise ``MissingKeyError`` when a tensordict operand's tensor leaf keys differ from ``td``'s."""
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


def prepare(td: Any, name: str, other: Any) -> Any:
    """Check one operand of the operation ``name`` and turn it into what :func:`walk` expects."""
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

    ``others`` were checked by :func:`prepare`.  A lazy stack goes member by member; non-tensor
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
            if leaf._tensor_payload:  # an unbatched tensor: the operation applies to it, as to a leaf
                result = _payload_result(fn, leaf, tuple(_child(o, key) for o in others), inplace)
                if not inplace:
                    leaves[key] = result
            elif not inplace:
                leaves[key] = _value_result(fn, leaf, others, key, td._batch_size)
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


_VALUE_OPS: dict[Any, Callable[[Any, Any], Any]] = {torch.bitwise_or: operator.or_, torch.bitwise_xor: operator.xor}


def _value_result(fn: Any, leaf: NonTensorData, others: tuple[Any, ...], key: str, batch: torch.Size) -> Any:
    """A non-tensor value under ``fn``: ``|`` and ``^`` of two values give the truth of ``a | b`` /
    ``a ^ b`` over the batch (as the reference); any other operation keeps a copy of the value."""
    op = _VALUE_OPS.get(fn)
    if op is not None and len(others) == 1 and node_layout(others[0]) in (LEVEL, STACK):
        theirs = others[0]._get_leaf((key,), None)
        if isinstance(theirs, NonTensorData) and not isinstance(theirs, NonTensorStack):
            try:
                return torch.full(batch, bool(op(leaf.data, theirs.data)))
            except TypeError:  # values without the operator: kept, as any other operation keeps them
                pass
    return leaf.clone()


def _payload_result(fn: Any, leaf: NonTensorData, theirs: tuple[Any, ...], inplace: bool) -> Any:
    """``fn`` on the tensor of an unbatched entry (``leaf``) and the operands at its key: numbers, or
    the other tensordict's unbatched tensor.  A batch-shaped tensor operand has no dims to align
    with an unbatched tensor: the entry is kept then, as other non-tensor values are."""
    args = []
    for other in theirs:
        if isinstance(other, NonTensorData) and other._tensor_payload:
            args.append(other.data)
        elif isinstance(other, (numbers.Number, torch.Tensor)) and not isinstance(other, NonTensorData):
            args.append(other)
        else:
            return leaf if inplace else leaf.clone()
    if inplace:
        fn(leaf.data, *args)
        return leaf
    result = fn(leaf.data, *args)
    return leaf._mapped(lambda _: result) if isinstance(result, torch.Tensor) else leaf.clone()


def _has_payload(td: Any) -> bool:
    """Whether the tree holds an unbatched tensor (which the ``_foreach`` fast paths do not see)."""
    layout = node_layout(td)
    if layout in (STACK, WRAPPED):
        inner = unwrap_node(td)[0]
        return any(_has_payload(m) for m in inner) if layout == STACK else _has_payload(inner)
    for leaf in td._tensordict.values():
        if isinstance(leaf, NonTensorData):
            if leaf._tensor_payload:
                return True
        elif not isinstance(leaf, torch.Tensor) and node_layout(leaf) in (LEVEL, STACK, WRAPPED) and _has_payload(leaf):
            return True
    return False


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
        elif kind != "value" or leaf._tensor_payload:
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


def foreach_leaves(td: Any, name: str, args: tuple[Any, ...], inplace: bool) -> Any:
    """``torch._foreach_<name>(leaves, *args)`` over the whole tree, or None where it does not apply."""
    fn = getattr(torch, f"_foreach_{name}{'_' if inplace else ''}", None)
    if fn is None:
        return None
    if inplace:
        leaves = [t for t in td._stored_tensors() if not t.is_nested]
        if len(leaves) != sum(1 for _ in td._stored_tensors()) or _has_payload(td):
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
            if leaf._tensor_payload:
                return False
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


def binary(
    td: Any,
    name: str,
    fn: Callable[..., Any],
    others: tuple[Any, ...],
    inplace: bool = False,
    foreach: str | None = None,
    foreach_kwargs: dict[str, Any] | None = None,
) -> Any:
    """``fn(leaf, *operand leaves)`` over ``td`` for the operation ``name`` (a new tree, or ``td`` in place).

    ``foreach`` names the ``torch._foreach_*`` kernel to use when the tree and the operand allow.
    """
    prepared = tuple(prepare(td, name, o) for o in others)
    if foreach is not None and len(prepared) == 1:
        if _is_scalar(prepared[0]) and not foreach_kwargs:
            done = foreach_leaves(td, foreach, prepared, inplace)
        elif node_layout(prepared[0]) == LEVEL:
            done = _foreach_pair(td, foreach, prepared[0], inplace, foreach_kwargs or {})
        else:
            done = None
        if done is not None:
            return done
    check_keys(td, prepared)
    if inplace and any(node_layout(o) in (LEVEL, STACK) for o in prepared):
        walk(td, lambda *_: None, prepared, inplace=False)  # every leaf pairs up: checked before any write
    return walk(td, fn, prepared, inplace)
