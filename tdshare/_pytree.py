"""Tensordicts as pytree nodes: ``torch.utils._pytree`` (and so ``torch.vmap``, ``torch.func``...)
sees through a ``TensorDict`` or a lazy stack to its leaves.

A tensordict flattens to its tensor leaves (nested levels included) in key order; the context
holds the keys, the non-tensor entries, the batch size and the device.  ``torch.vmap(fn, in_dims=0)``
over a tensordict hands ``fn`` a tensordict whose leaves are the batched views of the original's:
when the leaves come back from vmap without their mapped dim, the rebuilt tensordict drops that
dim from its batch size too, and a tensordict that ``fn`` returns comes back with the mapped dim
put back (at ``out_dims``, found from the leaves' shapes, which the context records).  A lazy
stack flattens to its stacked leaves and comes back dense.

An ``UnbatchedTensor`` entry is no pytree leaf of its tensordict: it rides in the context, so vmap
leaves it whole (same memory) and the result holds it with the result's batch size.  Read inside
``fn``, it is a :class:`_VmapUnbatched` alias that remembers the batch outside vmap: a pytree node
without leaves, so that ``fn`` may return it and get it back as that batch's ``UnbatchedTensor``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from ._lazy import LazyStackedTensorDict
from ._nontensor import NonTensorData
from ._params import TensorDictParams
from ._tensordict import TensorDict
from ._unbatched import UnbatchedEntry, UnbatchedTensor

__all__ = ["register_pytree_nodes"]


class _VmapUnbatched(UnbatchedTensor):
    """An unbatched entry read inside ``torch.vmap``: it knows the batch size outside (``_outer``)."""

    _carry = ("_outer",)
    _outer: torch.Size


def _flatten(td: Any) -> tuple[list[torch.Tensor], Any]:
    keys: list[Any] = []
    leaves: list[torch.Tensor] = []
    others: dict[Any, Any] = {}
    for key, value in td.items(include_nested=True, leaves_only=True):
        if isinstance(value, torch.Tensor) and not isinstance(value, UnbatchedTensor):
            keys.append(key)
            leaves.append(value)
        else:
            others[key] = value
    nested = {
        k: v.batch_size
        for k, v in td.items(include_nested=True)
        if not isinstance(v, torch.Tensor) and hasattr(v, "batch_size") and not isinstance(v, NonTensorData)
    }
    shapes = tuple(tuple(leaf.shape) for leaf in leaves)
    return leaves, (keys, others, td.batch_size, td.device, nested, shapes)


def _vmapped_dim(batch: torch.Size, leaves: list[Any]) -> int | None:
    """The batch dim that vmap took away from the leaves, if it did (None: the leaves fit ``batch``)."""
    for leaf in leaves:
        if tuple(leaf.shape[: len(batch)]) == tuple(batch):
            continue
        bdim = torch._C._functorch.maybe_get_bdim(leaf)
        if 0 <= bdim < len(batch):
            return bdim
    return None


def _added_dim(batch: torch.Size, shapes: tuple[tuple[int, ...], ...], leaves: list[Any]) -> tuple[int, int] | None:
    """``(position, size)`` of the dim vmap put back into the leaves (a tensordict ``fn`` returned)."""
    if not leaves or any(leaf.dim() != len(shape) + 1 for leaf, shape in zip(leaves, shapes, strict=True)):
        return None
    for dim in range(len(batch) + 1):
        sizes = {leaf.shape[dim] for leaf in leaves}
        if len(sizes) == 1 and all(
            tuple(leaf.shape[:dim]) + tuple(leaf.shape[dim + 1 :]) == shape
            for leaf, shape in zip(leaves, shapes, strict=True)
        ):
            return dim, sizes.pop()
    return None


def _resize(size: torch.Size, dropped: int | None, added: tuple[int, int] | None) -> torch.Size:
    if added is not None:
        return torch.Size([*size[: added[0]], added[1], *size[added[0] :]])
    return size if dropped is None else torch.Size([*size[:dropped], *size[dropped + 1 :]])


def _unflatten(leaves: Any, context: Any) -> TensorDict:
    keys, others, batch, device, nested, shapes = context
    leaves = list(leaves)
    if leaves and all(isinstance(leaf, TensorDict) for leaf in leaves):
        # a tree of tensordicts over this structure (torch.func.jacrev/hessian: one per output leaf)
        # the batch: the one the leaves share (the recorded one may hold a dim vmap took away since)
        common: list[int] = []
        for sizes in list(zip(*(leaf.batch_size for leaf in leaves), strict=False))[: len(batch)]:
            if len(set(sizes)) != 1:
                break
            common.append(sizes[0])
        nested_out = TensorDict(batch_size=common, device=device)
        for key, leaf in zip(keys, leaves, strict=True):
            nested_out.set(key, leaf)
        return nested_out
    if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        # a tree of other values over this structure (vmap's in_dims broadcast): a plain dict of them
        return dict(zip(keys, leaves, strict=True))  # type: ignore[return-value]
    dropped = _vmapped_dim(batch, leaves)
    added = _added_dim(batch, shapes, leaves) if dropped is None else None
    out = TensorDict(batch_size=_resize(batch, dropped, added), device=device)
    for key, size in nested.items():  # the levels (empty ones too) with their batch sizes first
        out.set(key, TensorDict(batch_size=_resize(size, dropped, added), device=device))
    for key, leaf in zip(keys, leaves, strict=True):
        out.set(key, leaf)
    for key, value in others.items():
        if isinstance(value, UnbatchedEntry):  # kept whole: inside vmap, an alias that knows the outer batch
            tensor = value.data
            value = _inside(tensor, batch) if dropped is not None else UnbatchedTensor(tensor._payload())
        out.set(key, value)
    return out


def _inside(value: UnbatchedTensor, outer: torch.Size) -> UnbatchedTensor:
    alias = _VmapUnbatched(value._payload(), value.batch_size)
    alias._outer = torch.Size(outer)
    return alias


def _flatten_unbatched(value: _VmapUnbatched) -> tuple[list[torch.Tensor], Any]:
    return [], (value._payload(), value._outer)


def _unflatten_unbatched(leaves: Any, context: Any) -> UnbatchedTensor:
    payload, outer = context
    return UnbatchedTensor(payload, outer)


def _flatten_unbatched_with_keys(value: _VmapUnbatched) -> tuple[list[tuple[Any, torch.Tensor]], Any]:
    return [], _flatten_unbatched(value)[1]


def _flatten_with_keys(td: Any) -> tuple[list[tuple[Any, torch.Tensor]], Any]:
    leaves, context = _flatten(td)
    return [(pytree.MappingKey(k), v) for k, v in zip(context[0], leaves, strict=True)], context


def _flatten_params(module: Any) -> tuple[list[torch.Tensor], Any]:
    return _flatten(module._param_td)


def _flatten_params_with_keys(module: Any) -> tuple[list[tuple[Any, torch.Tensor]], Any]:
    return _flatten_with_keys(module._param_td)


def _unflatten_params(leaves: Any, context: Any) -> Any:
    out = _unflatten(leaves, context)
    return TensorDictParams(out, no_convert=True) if isinstance(out, TensorDict) else out


def register_pytree_nodes() -> None:
    """Register ``TensorDict``, ``LazyStackedTensorDict`` and ``TensorDictParams`` as pytree nodes
    (done when tdshare is imported; registering again does nothing).

    >>> import torch, torch.utils._pytree as pytree
    >>> from tdshare import TensorDict
    >>> leaves, spec = pytree.tree_flatten(TensorDict(a=torch.zeros(2), n={"b": torch.ones(2)}, batch_size=[2]))
    >>> len(leaves), pytree.tree_unflatten(leaves, spec)["n", "b"].tolist()
    (2, [1.0, 1.0])
    """
    for cls in (TensorDict, LazyStackedTensorDict):
        if cls not in pytree.SUPPORTED_NODES:
            pytree.register_pytree_node(cls, _flatten, _unflatten, flatten_with_keys_fn=_flatten_with_keys)
    if _VmapUnbatched not in pytree.SUPPORTED_NODES:
        pytree.register_pytree_node(
            _VmapUnbatched,
            _flatten_unbatched,
            _unflatten_unbatched,
            flatten_with_keys_fn=_flatten_unbatched_with_keys,
        )
    if TensorDictParams not in pytree.SUPPORTED_NODES:
        pytree.register_pytree_node(
            TensorDictParams, _flatten_params, _unflatten_params, flatten_with_keys_fn=_flatten_params_with_keys
        )


register_pytree_nodes()
