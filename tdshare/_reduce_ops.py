"""Reductions of tensordicts: ``sum``, ``mean``, ``std``, ``max``, ``quantile``, ``all``... with the
reference's ``dim``/``keepdim``/``reduce=`` semantics.

A mixin of :class:`tdshare._tensordict_base.TensorDictBase`.  The rules (tensordict 0.15.3's):

- no ``dim`` (or ``dim=None``, or ``dim=()``): every leaf is reduced over all its elements; the
  result is a tensordict of batch size ``[]`` at every level (``max``/``min`` give the values);
- ``dim`` (an int or a tuple of batch dims, negative counting from the end of the batch dims):
  every leaf is reduced along those dims; each level's batch size loses them (``keepdim=True``:
  they become 1).  ``max``/``min``/``cummax``/``cummin`` with a dim give
  ``torch.return_types.max(values, indices)`` of two tensordicts (``return_indices=False``: the
  values); they and ``amax``/``amin`` reduce the first dim of a tuple only and give every nested
  level the root's new batch size, as the reference does;
- ``dim="feature"``: every leaf is reduced over its dims beyond its level's batch dims;
- ``reduce=True``: the tensor leaves are reduced together into one tensor (concatenated along
  ``dim`` first when a dim is given).

Non-tensor values are kept (the reference's), except in the two trees of a ``(values,
indices)`` result.  A lazy stack is reduced as its dense copy (a ``TensorDict``); members that
cannot be stacked densely raise ``NotSupportedError`` (a ``RuntimeError``, like the reference's)
unless ``reduce=True`` without a dim, which reduces every member's leaves together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ._errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError, MissingKeyError, NotSupportedError
from ._format import LEVEL, STACK, WRAPPED
from ._nontensor import NonTensorStack
from ._tree_walk import node_layout, unwrap_node, walk

__all__ = ["ReduceOps", "OMITTED"]


class _Omitted:
    """The default of ``dim`` and ``keepdim``: not given (false, like the reference's ``NO_DEFAULT``)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<omitted>"


OMITTED: Any = _Omitted()
_NO_EMPTY_DIM = frozenset({"max", "min", "cummax", "cummin", "quantile"})
LeafFn = Callable[[torch.Tensor, int], Any]


def _dense(td: Any, name: str) -> Any:
    """``td`` itself, or the dense copy of a lazy stack."""
    if node_layout(td) == LEVEL:
        return td
    try:
        return td.to_tensordict()
    except (MissingKeyError, NotSupportedError) as err:
        raise NotSupportedError(
            f"{name}() reduces the dense copy of a lazy stack, which this one cannot give ({err}). Reduce its "
            f"members (ls.tensordicts[i].{name}(...)), or pass reduce=True without a dim."
        ) from err


def _norm_dim(dim: int, ndim: int) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ArgumentTypeError(f"dim must be an int, a tuple of ints or 'feature', got {dim!r}.")
    new = dim + ndim if dim < 0 else dim
    if not 0 <= new < ndim:
        raise IndexError(f"dim {dim} is out of range for a tensordict with {ndim} batch dimension(s).")
    return new


def _rebuild(
    td: Any,
    name: str,
    leaf_fn: LeafFn,
    batch_of: Callable[[torch.Size], Sequence[int]],
    names_of: Callable[[list | None], list | None],
    n_out: int = 1,
    keep_lock: bool = False,
) -> list[Any]:
    """``leaf_fn(leaf, level batch dims)`` for every tensor leaf; ``n_out`` new trees (dense)."""
    td = _dense(td, name)
    outs: list[dict[str, Any]] = [{} for _ in range(n_out)]
    batch = torch.Size(batch_of(td._batch_size))
    for key, leaf in td._tensordict.items():
        kind = node_layout(leaf)
        if kind == "value":
            if n_out == 1 and not (isinstance(leaf, NonTensorStack) and batch != td._batch_size):
                outs[0][key] = leaf.clone()
            continue
        if kind == "tensor":
            result = leaf_fn(leaf, td.batch_dims)
            results = list(result) if n_out > 1 else [result]
        elif kind == WRAPPED:
            inner, fields, wrap = unwrap_node(leaf)
            results = [wrap(r, fields) for r in _rebuild(inner, name, leaf_fn, batch_of, names_of, n_out, keep_lock)]
        elif kind in (LEVEL, STACK):
            results = _rebuild(leaf, name, leaf_fn, batch_of, names_of, n_out, keep_lock)
        else:
            continue
        for out, value in zip(outs, results, strict=True):
            out[key] = value
    made = []
    for leaves in outs:
        level = type(td)._from_leaves(leaves, batch, td._device, names_of(td._names))
        level._is_locked = keep_lock and td._is_locked
        made.append(level)
    return made


def _tensor_leaves(td: Any, name: str) -> list[torch.Tensor]:
    leaves = [torch.Tensor.as_subclass(t, torch.Tensor) for t in td._stored_tensors()]
    if not leaves:
        raise InvalidArgumentError(
            f"{name}(reduce=True) reduces the tensor leaves together, and this tensordict has no tensor leaves."
        )
    return leaves


def _reduce_together(td: Any, name: str, dim: Any, keepdim: Any, q: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    """``reduce=True``: one tensor from every tensor leaf."""
    fn = getattr(torch, name)
    head = () if q is None else (q,)
    if dim is OMITTED:
        flat = torch.cat([t.contiguous().flatten() for t in _tensor_leaves(td, name)])
        return fn(flat, *head, **kwargs)
    td = _dense(td, name)
    leaves = _tensor_leaves(td, name)
    if dim == "feature":
        nd = td.batch_dims
        leaves = [t.flatten(nd, -1) if t.dim() > nd else t.unsqueeze(-1) for t in leaves]
        cat_dim, dim, keepdim = -1, -1, OMITTED
    else:
        cat_dim = dim[0] if isinstance(dim, tuple) else dim
    joined = torch.cat(leaves, cat_dim)
    if keepdim is not OMITTED:
        kwargs = {**kwargs, "keepdim": keepdim}
    return fn(joined, *head, dim=dim, **kwargs)


def _reduction(
    td: Any,
    name: str,
    dim: Any,
    keepdim: Any,
    reduce: bool | None,
    *,
    tuple_ok: bool = True,
    values_only: bool = True,
    call_on_nested: bool = True,
    keep_batch: bool = False,
    q: Any = None,
    **kwargs: Any,
) -> Any:
    if isinstance(dim, tuple) and not dim and name not in _NO_EMPTY_DIM:
        dim = None
    if dim is None and not keepdim:
        dim = OMITTED
    if reduce:
        return _reduce_together(td, name, dim, keepdim, q, kwargs)
    head = () if q is None else (q,)
    q_dims = [q.shape[0]] if isinstance(q, torch.Tensor) and q.dim() == 1 else []

    def with_q(names: list | None) -> list | None:
        return None if names is None else [None] * len(q_dims) + names

    if dim == "feature":
        if keepdim:
            raise ArgumentTypeError("dim='feature' is incompatible with keepdim=True.")
        if not call_on_nested:
            raise NotSupportedError(f"{name}() does not take dim='feature' (the reference's refusal too).")

        def feature_leaf(x: torch.Tensor, nd: int) -> torch.Tensor:
            x = x.flatten(nd, -1) if x.dim() > nd else x.unsqueeze(-1)
            return getattr(x, name)(*head, dim=-1, **kwargs)

        return _rebuild(td, name, feature_leaf, lambda b: [*q_dims, *b], with_q)[0]
    if dim is OMITTED and not keepdim:

        def whole(x: torch.Tensor, nd: int) -> torch.Tensor:
            return getattr(x, name)(*head, **kwargs)

        return _rebuild(td, name, whole, lambda b: [], lambda n: None)[0]
    ndim = td.batch_dims
    dims: tuple[int, ...] | None = None  # the batch dims reduced (None: all of them, keepdim without dim)
    if dim is not OMITTED:
        if isinstance(dim, tuple):
            if tuple_ok and name != "quantile":
                dims = tuple(_norm_dim(d, ndim) for d in dim)
                dim = dims
            else:  # the reference reduces the first dim of the tuple only, as given
                dim = dim[0]
                dims = (_norm_dim(dim, ndim),)
        else:
            dim = _norm_dim(dim, ndim)
            dims = (dim,)
            if tuple_ok and name != "quantile":
                dim = dims
    call: dict[str, Any] = dict(kwargs)
    if dim is not OMITTED:
        call["dim"] = dim
    elif name in ("sum", "mean", "nansum", "nanmean"):
        call["dim"] = None
    if keepdim is not OMITTED and not keep_batch:
        call["keepdim"] = keepdim
    n_out = 1 if values_only else 2

    def leaf(x: torch.Tensor, nd: int) -> Any:
        result = getattr(x, name)(*head, **call)
        if isinstance(result, tuple):  # a torch.return_types (values, indices)
            return result[0] if values_only else (result[0], result[1])
        return result

    def level_batch(batch: torch.Size) -> list[int]:
        if keep_batch:
            return list(batch)
        if dims is None:
            return [*q_dims, *([1] * len(batch))]
        return [*q_dims, *(1 if i in dims else b for i, b in enumerate(batch) if keepdim or i not in dims)]

    def level_names(names: list | None) -> list | None:
        if names is None or keep_batch or keepdim:
            return with_q(names)
        return with_q([n for i, n in enumerate(names) if dims is not None and i not in dims])

    if call_on_nested:
        results = _rebuild(td, name, leaf, level_batch, level_names, n_out)
    else:
        root = level_batch(td.batch_size)
        results = _rebuild(td, name, leaf, lambda b: root, level_names, n_out)
    if n_out == 1:
        return results[0]
    return getattr(torch.return_types, name)(results)


class ReduceOps:
    """Reductions over batch dims or leaves; the host class provides the tree (see the module)."""

    _batch_size: torch.Size
    _tensordict: dict[str, Any]

    @property
    def batch_size(self) -> torch.Size:
        raise NotImplementedError

    def _stored_tensors(self) -> Any:
        raise NotImplementedError

    def sum(self, dim: Any = OMITTED, keepdim: Any = OMITTED, *, dtype: torch.dtype | None = None,
            reduce: bool | None = None) -> Any:  # fmt: skip
        """The sum of every leaf, over all its elements or along batch dims (see the module for ``dim``).

        Args:
            dim: omitted/None/``()`` (every element), an int or tuple of batch dims, or ``"feature"``.
            keepdim: keep the reduced batch dims with size 1.
            dtype: the dtype of the sums.
            reduce: reduce all the leaves together into one tensor.

        Returns:
            A tensordict (batch size ``[]`` without a dim), or a tensor with ``reduce=True``.

        Raises:
            IndexError: a dim outside the batch dims.
            NotSupportedError: a lazy stack whose members cannot be stacked densely.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(3, 2), batch_size=[3])
        >>> td.sum()["a"].item(), td.sum(0)["a"].tolist(), td.sum(reduce=True).item()
        (6.0, [3.0, 3.0], 6.0)
        """
        return _reduction(self, "sum", dim, keepdim, reduce, dtype=dtype)

    def nansum(self, dim: Any = OMITTED, keepdim: Any = OMITTED, *, dtype: torch.dtype | None = None,
               reduce: bool | None = None) -> Any:  # fmt: skip
        """As :meth:`sum`, NaNs counting as zero.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([1.0, float("nan")]), batch_size=[2]).nansum()["a"].item()
        1.0
        """
        return _reduction(self, "nansum", dim, keepdim, reduce, dtype=dtype)

    def mean(self, dim: Any = OMITTED, keepdim: Any = OMITTED, *, dtype: torch.dtype | None = None,
             reduce: bool | None = None) -> Any:  # fmt: skip
        """The mean of every leaf (arguments as :meth:`sum`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(4.0), batch_size=[4]).mean()["a"].item()
        1.5
        """
        return _reduction(self, "mean", dim, keepdim, reduce, dtype=dtype)

    def nanmean(self, dim: Any = OMITTED, keepdim: Any = OMITTED, *, dtype: torch.dtype | None = None,
                reduce: bool | None = None) -> Any:  # fmt: skip
        """As :meth:`mean`, NaNs left out.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([1.0, float("nan")]), batch_size=[2]).nanmean()["a"].item()
        1.0
        """
        return _reduction(self, "nanmean", dim, keepdim, reduce, dtype=dtype)

    def prod(self, dim: Any = OMITTED, keepdim: Any = OMITTED, *, dtype: torch.dtype | None = None,
             reduce: bool | None = None) -> Any:  # fmt: skip
        """The product of every leaf (arguments as :meth:`sum`; a tuple dim reduces its first dim only).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([2.0, 3.0]), batch_size=[2]).prod()["a"].item()
        6.0
        """
        return _reduction(self, "prod", dim, keepdim, reduce, tuple_ok=False, dtype=dtype)

    def std(self, dim: Any = OMITTED, keepdim: Any = OMITTED, *, correction: int = 1,
            reduce: bool | None = None) -> Any:  # fmt: skip
        """The standard deviation of every leaf (``correction=1``: Bessel's; arguments as :meth:`sum`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([1.0, 3.0]), batch_size=[2]).std(correction=0)["a"].item()
        1.0
        """
        return _reduction(self, "std", dim, keepdim, reduce, correction=correction)

    def var(self, dim: Any = OMITTED, keepdim: Any = OMITTED, *, correction: int = 1,
            reduce: bool | None = None) -> Any:  # fmt: skip
        """The variance of every leaf (arguments as :meth:`std`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([1.0, 3.0]), batch_size=[2]).var()["a"].item()
        2.0
        """
        return _reduction(self, "var", dim, keepdim, reduce, correction=correction)

    def quantile(self, q: float | torch.Tensor, dim: Any = OMITTED, keepdim: Any = OMITTED, *,
                 interpolation: str = "linear", reduce: bool | None = None) -> Any:  # fmt: skip
        """The ``q`` quantile(s) of every leaf (a 1-d ``q`` adds a leading batch dim of ``len(q)``).

        Arguments as :meth:`sum`; a tuple dim reduces its first dim only.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(5.0), batch_size=[5]).quantile(0.5)["a"].item()
        2.0
        """
        return _reduction(self, "quantile", dim, keepdim, reduce, q=q, interpolation=interpolation)

    def max(self, dim: Any = OMITTED, keepdim: bool = False, *, reduce: bool | None = None,
            return_indices: bool = True) -> Any:  # fmt: skip
        """The maximum of every leaf; with a ``dim``, ``torch.return_types.max(values, indices)``.

        Args:
            dim: omitted (every element: a tensordict of maxima), or one batch dim.
            keepdim: keep the reduced dim with size 1.
            reduce: one tensor from all the leaves.
            return_indices: with a dim, give ``(values, indices)`` tensordicts (else the values).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([1.0, 5.0, 2.0]), batch_size=[3])
        >>> td.max()["a"].item(), td.max(0).indices["a"].item()
        (5.0, 1)
        """
        return _reduction(self, "max", dim, keepdim, reduce, tuple_ok=False, values_only=not return_indices,
                          call_on_nested=False)  # fmt: skip

    def min(self, dim: Any = OMITTED, keepdim: bool = False, *, reduce: bool | None = None,
            return_indices: bool = True) -> Any:  # fmt: skip
        """The minimum of every leaf (arguments as :meth:`max`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([1.0, 5.0]), batch_size=[2]).min(0).values["a"].item()
        1.0
        """
        return _reduction(self, "min", dim, keepdim, reduce, tuple_ok=False, values_only=not return_indices,
                          call_on_nested=False)  # fmt: skip

    def amax(self, dim: Any = OMITTED, keepdim: bool = False, *, reduce: bool | None = None) -> Any:
        """As :meth:`max` with ``return_indices=False``: the maxima only.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([[1.0, 5.0]]), batch_size=[1, 2]).amax(1)["a"].tolist()
        [5.0]
        """
        return _reduction(self, "amax", dim, keepdim, reduce, tuple_ok=False, call_on_nested=False)

    def amin(self, dim: Any = OMITTED, keepdim: bool = False, *, reduce: bool | None = None) -> Any:
        """As :meth:`min` with ``return_indices=False``: the minima only.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([[1.0, 5.0]]), batch_size=[1, 2]).amin(1)["a"].tolist()
        [1.0]
        """
        return _reduction(self, "amin", dim, keepdim, reduce, tuple_ok=False, call_on_nested=False)

    def cummax(self, dim: int, *, reduce: bool | None = None, return_indices: bool = True) -> Any:
        """The running maximum along the batch dim ``dim`` (``(values, indices)`` unless ``return_indices=False``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([1.0, 0.0, 3.0]), batch_size=[3]).cummax(0).values["a"].tolist()
        [1.0, 1.0, 3.0]
        """
        return _reduction(self, "cummax", dim, OMITTED, reduce, tuple_ok=False, values_only=not return_indices,
                          call_on_nested=False, keep_batch=True)  # fmt: skip

    def cummin(self, dim: int, *, reduce: bool | None = None, return_indices: bool = True) -> Any:
        """The running minimum along the batch dim ``dim`` (as :meth:`cummax`).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([1.0, 0.0, 3.0]), batch_size=[3]).cummin(0).values["a"].tolist()
        [1.0, 0.0, 0.0]
        """
        return _reduction(self, "cummin", dim, OMITTED, reduce, tuple_ok=False, values_only=not return_indices,
                          call_on_nested=False, keep_batch=True)  # fmt: skip

    def all(self, dim: int | None = None) -> Any:
        """Whether every element of every tensor leaf is true; with ``dim``, a tensordict of booleans.

        Raises:
            BatchSizeError: ``dim`` is not a batch dim (a ``RuntimeError``, as in the reference).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.tensor([[True, False], [True, True]]), batch_size=[2, 2])
        >>> td.all(), td.all(1)["a"].tolist()
        (False, [False, True])
        """
        if dim is None:
            return all(bool(t.all()) for t in self._stored_tensors())
        return _all_any(self, "all", dim)

    def any(self, dim: int | None = None) -> Any:
        """Whether any element of any tensor leaf is true; with ``dim``, a tensordict of booleans.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([False, True]), batch_size=[2]).any()
        True
        """
        if dim is None:
            return any(bool(t.any()) for t in self._stored_tensors())
        return _all_any(self, "any", dim)

    def logsumexp(self, dim: int | Sequence[int] | None = None, keepdim: bool = False, *, out: Any = None) -> Any:
        """``log(sum(exp(x)))`` of every leaf along batch dims (all of them without ``dim``), stably.

        Args:
            dim: batch dims to reduce (negative counts from the end of the batch dims).
            keepdim: keep them with size 1.
            out: a tensordict to write the result into, its tensors in place (returned; missing keys are added).

        Raises:
            InvalidArgumentError: a dim outside the batch dims (a ``ValueError``, as in the reference).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> round(TensorDict(a=torch.zeros(2), batch_size=[2]).logsumexp()["a"].item(), 4)
        0.6931
        """
        ndim = len(self.batch_size)
        if dim is None:
            dims = tuple(range(ndim))
        else:
            dims = tuple(d + ndim if d < 0 else d for d in ((dim,) if isinstance(dim, int) else dim))
        if any(not 0 <= d < ndim for d in dims):
            raise InvalidArgumentError(
                f"logsumexp: the dim {dim} is not a batch dim of a tensordict with batch size {list(self.batch_size)}."
            )

        def leaf(x: torch.Tensor, nd: int) -> torch.Tensor:
            return torch.logsumexp(x, dim=dims, keepdim=keepdim)

        def batch(b: torch.Size) -> list[int]:
            return [1 if i in dims else s for i, s in enumerate(b) if keepdim or i not in dims]

        def names(n: list | None) -> list | None:
            return n if n is None or keepdim else [x for i, x in enumerate(n) if i not in dims]

        result = _rebuild(self, "logsumexp", leaf, batch, names)[0]
        return result if out is None else out.update(result, inplace=True)  # into out's own tensors

    def norm(self, *, out: Any = None, dtype: torch.dtype | None = None) -> Any:
        """The 2-norm of every tensor leaf over all its elements (batch size ``[]``; the lock is kept).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.tensor([3.0, 4.0]), batch_size=[2]).norm()["a"].item()
        5.0
        """

        def leaf(x: torch.Tensor, nd: int) -> torch.Tensor:
            return torch.linalg.vector_norm(x, 2, dtype=dtype)

        result = _rebuild(self, "norm", leaf, lambda b: [], lambda n: None, keep_lock=True)[0]
        return result if out is None else out.update(result, inplace=True)  # into out's own tensors

    def softmax(self, dim: int, dtype: torch.dtype | None = None) -> Any:
        """``torch.softmax`` of every leaf along the batch dim ``dim`` (same batch size).

        A lazy stack gives a lazy stack: along another dim member by member, along the stack dim
        from its dense copy (members whose shapes differ: each leaf along its own ``dim``).

        Raises:
            InvalidArgumentError: ``dim`` is not an int.
            IndexError: ``dim`` is not a batch dim.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3), batch_size=[2]).softmax(0)["a"][0].tolist()
        [0.5, 0.5, 0.5]
        """
        if not isinstance(dim, int):
            raise InvalidArgumentError(f"softmax: expected dim of type int, got {type(dim).__name__}.")
        dim = _norm_dim(dim, len(self.batch_size))
        return _softmax(self, dim, dtype)


def _softmax(td: Any, dim: int, dtype: torch.dtype | None) -> Any:
    if node_layout(td) != STACK:
        return walk(td, lambda x: torch.softmax(x, dim, dtype=dtype), (), inplace=False, keep_lock=False)
    members, fields, wrap = unwrap_node(td)
    stack_dim = fields["stack_dim"]
    if dim != stack_dim:
        return wrap([_softmax(m, dim if dim < stack_dim else dim - 1, dtype) for m in members], fields)
    try:
        dense = td.to_tensordict()
    except (MissingKeyError, NotSupportedError):
        return walk(td, lambda x: torch.softmax(x, dim, dtype=dtype), (), inplace=False, keep_lock=False)
    return wrap([m.clone() for m in _softmax(dense, dim, dtype).unbind(stack_dim)], fields)


def _all_any(td: Any, name: str, dim: int) -> Any:
    ndim = len(td.batch_size)
    if not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise BatchSizeError(
            f"{name}(dim={dim!r}): dim must be greater than or equal to -tensordict.batch_dims and smaller than "
            f"tensordict.batch_dims ({ndim})."
        )
    dim = dim % ndim

    def leaf(x: torch.Tensor, nd: int) -> torch.Tensor:
        return getattr(x, name)(dim=dim)

    def batch(b: torch.Size) -> list[int]:
        return [s for i, s in enumerate(b) if i != dim]

    def names(n: list | None) -> list | None:
        return None if n is None else [x for i, x in enumerate(n) if i != dim]

    return _rebuild(td, name, leaf, batch, names)[0]
