"""Module-level functions under the reference's names (``tdshare.stack``, ``tdshare.pad``, ...):
stacking and concatenating, padding, merging and the collection test.  They take tensordicts, lazy
stacks and tensorclass instances alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from ._errors import ArgumentTypeError, InvalidArgumentError, NotSupportedError
from ._keys import NestedKey, unravel_key
from ._lazy import LazyStackedTensorDict, dense_compatible, into
from ._nontensor import NonTensorData, NonTensorStack, stack_non_tensor
from ._pad import pad_non_tensor
from ._settings import set_lazy_legacy
from ._tensorclass import is_tensorclass
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase

__all__ = [
    "cat",
    "dense_stack_tds",
    "is_tensor_collection",
    "lazy_stack",
    "make_tensordict",
    "maybe_dense_stack",
    "merge_tensordicts",
    "pad",
    "pad_sequence",
    "stack",
]


def _check_list(input: Any, what: str) -> list[Any]:
    items = list(input)
    if not items:
        raise InvalidArgumentError(f"{what} needs at least one tensordict.")
    return items


def stack(
    input: Sequence[Any],
    dim: int = 0,
    *,
    out: Any = None,
    device: Any = None,
    strict: bool = False,
    contiguous: bool = False,
    maybe_dense_stack: bool | None = None,
) -> Any:
    """Stack tensordicts along a new batch dim ``dim`` (``torch.stack``); into ``out`` when given.

    Args:
        input: the tensordicts (or tensorclass instances), with equal batch sizes.
        dim: the position of the new batch dimension.
        out: a tensordict to write the result into (its entries are updated in place).
        device: the device of the result (default: that of the stacked leaves).
        strict: accepted as in the reference (the keys must always match).
        contiguous: ``True`` stacks densely (copies), also under ``set_lazy_legacy(True)``;
            ``False`` follows ``set_lazy_legacy`` as ``torch.stack`` does.
        maybe_dense_stack: ``True`` gives a lazy stack when the keys or shapes differ
            (:func:`maybe_dense_stack`).

    Returns:
        The stacked tensordict.

    >>> import tdshare
    >>> tdshare.stack([tdshare.TensorDict(a=torch.zeros(3), batch_size=[3])] * 2).batch_size
    torch.Size([2, 3])
    """
    del strict  # the keys of stacked tensordicts must always match
    items = _check_list(input, "stack")
    if maybe_dense_stack:
        result = _dense_or_lazy(items, dim)
    elif contiguous:
        with set_lazy_legacy(False):
            result = torch.stack(items, dim)
    else:
        result = torch.stack(items, dim)
    if device is not None:
        result = result.to(device)
    return into(out, result)


def cat(input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """Concatenate tensordicts along batch dim ``dim`` (``torch.cat``); into ``out`` when given.

    >>> import tdshare
    >>> tdshare.cat([tdshare.TensorDict(a=torch.zeros(3), batch_size=[3])] * 2).batch_size
    torch.Size([6])
    """
    return into(out, torch.cat(_check_list(input, "cat"), dim))


def lazy_stack(input: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
    """A :class:`LazyStackedTensorDict` of the tensordicts along ``dim`` (nothing is copied).

    Instances of one tensorclass give an instance of that class around a lazy stack of their
    tensordicts.

    >>> import tdshare
    >>> a = tdshare.TensorDict(x=torch.zeros(2), batch_size=[])
    >>> b = tdshare.TensorDict(x=torch.zeros(3), batch_size=[])
    >>> type(tdshare.lazy_stack([a, b])).__name__
    'LazyStackedTensorDict'
    """
    items = _check_list(input, "lazy_stack")
    return LazyStackedTensorDict.lazy_stack(items, dim, out=out, **kwargs)  # instances: their class around one


def maybe_dense_stack(input: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
    """A dense stack when the tensordicts share keys and shapes, else a lazy stack.

    >>> import tdshare
    >>> a = tdshare.TensorDict(x=torch.zeros(2), batch_size=[])
    >>> type(tdshare.maybe_dense_stack([a, a])).__name__, type(tdshare.maybe_dense_stack([a, a.empty()])).__name__
    ('TensorDict', 'LazyStackedTensorDict')
    """
    items = _check_list(input, "maybe_dense_stack")
    if dense_compatible(items):
        return stack(items, dim, out=out)
    return lazy_stack(items, dim, out=out, **kwargs)


_dense_or_lazy = maybe_dense_stack  # for stack(), whose keyword of the same name hides it


def dense_stack_tds(td_list: Sequence[Any] | LazyStackedTensorDict, dim: int | None = None) -> Any:
    """Stack densely at the top level; lazy stacks nested inside stay lazy (members stacked pairwise).

    Args:
        td_list: the tensordicts, or a lazy stack (its members, along its stack dim).
        dim: the new dim (default: the lazy stack's, else 0).

    Raises:
        InvalidArgumentError: a list without a dim-compatible structure (differing nested lazy stacks).

    >>> import tdshare
    >>> a = tdshare.TensorDict(x=torch.zeros(2), batch_size=[2])
    >>> tdshare.dense_stack_tds(tdshare.lazy_stack([a, a], 1)).batch_size
    torch.Size([2, 2])
    """
    if isinstance(td_list, LazyStackedTensorDict):
        dim = td_list.stack_dim if dim is None else dim
        td_list = td_list.tensordicts
    items = _check_list(td_list, "dense_stack_tds")
    return _dense_stack(items, 0 if dim is None else dim)


def _dense_stack(tds: list[Any], dim: int) -> Any:
    first = tds[0]
    ndim = first.batch_dims + 1
    dim = dim % ndim
    batch = list(first.batch_size)
    batch.insert(dim, len(tds))
    out = TensorDict(batch_size=batch, device=first.device)
    for key in first.keys():
        values = [td._get_leaf((key,)) for td in tds]
        if all(isinstance(v, LazyStackedTensorDict) for v in values):
            inner = values[0].stack_dim
            count = len(values[0].tensordicts)
            if any(v.stack_dim != inner or len(v.tensordicts) != count for v in values):
                raise InvalidArgumentError(f"dense_stack_tds: the lazy stacks at {key!r} differ in stack dim or size.")
            member_dim = dim if dim <= inner else dim - 1
            members = [_dense_stack([v.tensordicts[i] for v in values], member_dim) for i in range(count)]
            out._tensordict[key] = LazyStackedTensorDict(*members, stack_dim=inner + 1 if dim <= inner else inner)
        elif all(isinstance(v, TensorDictBase) for v in values):
            out._tensordict[key] = _dense_stack(values, dim)
        elif all(isinstance(v, NonTensorData) for v in values):
            out._tensordict[key] = stack_non_tensor(values, [td.batch_size for td in tds], dim, True)
        else:
            out._tensordict[key] = torch.stack(values, dim)
    return out


def pad(tensordict: Any, pad_size: Sequence[int], value: float = 0.0, inplace: bool = False, safe: bool = True) -> Any:
    """Pad every entry in the batch dims: ``pad_size = [dim0_before, dim0_after, dim1_before, ...]``.

    ``tensordict.pad(pad_size, value, inplace, safe)``, for tensordicts, lazy stacks and tensorclass
    instances (see ``TensorDict.pad``; negative sizes crop).

    Raises:
        InvalidArgumentError: an odd number of sizes, or more pairs than batch dims.
        BatchSizeError: a dim that would get a negative size (a ``RuntimeError``).

    >>> import tdshare
    >>> td = tdshare.TensorDict(a=torch.ones(3, 4, 1), batch_size=[3, 4])
    >>> tdshare.pad(td, [0, 1, 0, 2])["a"].shape
    torch.Size([4, 6, 1])
    """
    if isinstance(tensordict, NonTensorData):  # a non-tensor value on its own: new elements hold None
        sizes = [int(s) for s in pad_size]
        if len(sizes) % 2 or len(sizes) // 2 > len(tensordict.batch_size):
            raise InvalidArgumentError(
                f"pad_size {sizes} must hold (before, after) pairs, at most one per batch dim of the value."
            )
        return pad_non_tensor(tensordict, [(sizes[i], sizes[i + 1]) for i in range(0, len(sizes), 2)], inplace)
    return tensordict.pad(pad_size, value=value, inplace=inplace, safe=safe)


def _pad_dims(t: torch.Tensor, pads: list[tuple[int, int]], value: float) -> torch.Tensor:
    """``t`` padded in its leading dims: ``pads[d] = (before, after)`` for dim ``d``."""
    flat: list[int] = [0, 0] * (t.dim() - len(pads))
    for before, after in reversed(pads):
        flat += [before, after]
    return F.pad(t, flat, value=value)


def pad_sequence(
    list_of_tensordicts: Sequence[Any],
    pad_dim: int = 0,
    padding_value: float | Mapping[NestedKey, float] = 0.0,
    out: Any = None,
    return_mask: bool | NestedKey = False,
    padding_side: str = "right",
) -> Any:
    """Stack tensordicts whose entries differ in length along ``pad_dim``, padding them to the longest.

    Args:
        list_of_tensordicts: tensordicts (or tensorclass instances) with the same keys.
        pad_dim: the dim of each entry to pad (a batch dim pads the batch too).
        padding_value: the value, or a mapping of keys to values (others get 0).
        out: a tensordict to write the result into.
        return_mask: add boolean masks (True where a value is real) under ``"masks"`` or this key.
        padding_side: ``"right"`` or ``"left"``.

    Raises:
        InvalidArgumentError: an empty list, a bad ``padding_side``, a scalar entry, or ``padding_value``
            keys that name no entry.
        NotSupportedError: ``return_mask`` with tensorclass instances.

    >>> import tdshare
    >>> a = tdshare.TensorDict(x=torch.ones(2), batch_size=[])
    >>> b = tdshare.TensorDict(x=torch.ones(4), batch_size=[])
    >>> tdshare.pad_sequence([a, b])["x"].tolist()
    [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    """
    items = _check_list(list_of_tensordicts, "pad_sequence")
    if padding_side not in ("left", "right"):
        raise InvalidArgumentError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    wrapper = type(items[0]) if is_tensorclass(items[0]) else None
    if wrapper is not None and return_mask:
        raise NotSupportedError("pad_sequence(return_mask=...) of tensorclass instances: convert them to_tensordict().")
    tds = [i._tensordict if is_tensorclass(i) else i for i in items]
    masks_key = unravel_key(return_mask) if not isinstance(return_mask, bool) else ("masks",)
    keys = [unravel_key(k) for k in tds[0].keys(True, True)]
    values = dict(padding_value) if isinstance(padding_value, Mapping) else {}
    values = {unravel_key(k): v for k, v in values.items()}
    if set(values) - set(keys):
        raise InvalidArgumentError(f"padding_value names keys that no entry has: {sorted(set(values) - set(keys))}.")
    default = 0.0 if isinstance(padding_value, Mapping) else float(padding_value)
    batch = list(tds[0].batch_size)
    result: dict[tuple[str, ...], Any] = {}
    for key in keys:
        leaves = [td._get_leaf(key) for td in tds]
        if isinstance(leaves[0], NonTensorData):
            result[key] = NonTensorStack(*(NonTensorData(v.data) for v in leaves))
            continue
        if leaves[0].dim() == 0:
            raise InvalidArgumentError(f"pad_sequence cannot pad the scalar entry {key!r}.")
        pos = pad_dim % leaves[0].dim()
        longest = max(t.shape[pos] for t in leaves)
        padded, masks = [], []
        for td, t in zip(tds, leaves, strict=True):
            missing = longest - t.shape[pos]
            side = (0, missing) if padding_side == "right" else (missing, 0)
            padded.append(_pad_dims(t, [(0, 0)] * pos + [side], values.get(key, default)))
            mask_shape = list(td.batch_size) + ([t.shape[pos]] if pos >= td.batch_dims else [])
            mask_dim = min(pos, td.batch_dims)
            masks.append(_pad_dims(torch.ones(mask_shape, dtype=torch.bool), [(0, 0)] * mask_dim + [side], False))
        if pos < len(batch):
            batch[pos] = longest
        result[key] = torch.stack(padded)
        if return_mask:
            mask_key = (*masks_key, *key)
            result[mask_key] = torch.stack(masks)
    stacked = TensorDict(batch_size=[len(tds), *batch], device=tds[0].device)
    for key, value in result.items():
        stacked.set(key, value)
    if out is not None:
        out.update(stacked)
        stacked = out
    return wrapper.from_tensordict(stacked) if wrapper is not None and out is None else stacked


def merge_tensordicts(
    *tensordicts: Any,
    callback_exist: Callable[..., Any] | Mapping[NestedKey, Callable[..., Any]] | None = None,
) -> Any:
    """One tensordict with the entries of all; a key several hold takes the first one's value.

    Args:
        *tensordicts: at least two tensordicts.
        callback_exist: called with every tensordict's value of a key that all of them hold (a
            mapping gives one callable per key); its result is the merged value.

    Raises:
        InvalidArgumentError: fewer than two tensordicts.

    >>> import tdshare
    >>> a, b = tdshare.TensorDict(x=torch.zeros(()), y=torch.ones(())), tdshare.TensorDict(x=torch.ones(()))
    >>> merged = tdshare.merge_tensordicts(a, b, callback_exist=lambda *v: torch.stack(v))
    >>> merged["x"].tolist(), merged["y"].item()
    ([0.0, 1.0], 1.0)
    """
    if len(tensordicts) < 2:
        raise InvalidArgumentError(f"merge_tensordicts needs at least 2 tensordicts, got {len(tensordicts)}.")
    out = tensordicts[0].empty()
    seen: list[tuple[str, ...]] = []
    for td in tensordicts:
        seen += [k for k in map(unravel_key, td.keys(True, True)) if k not in seen]
    for key in seen:
        values = [td._get_leaf(key, None) for td in tensordicts]
        present = [v for v in values if v is not None]
        if isinstance(callback_exist, Mapping):
            callback = callback_exist.get(key if len(key) > 1 else key[0], callback_exist.get(key))
        else:
            callback = callback_exist
        if callback is not None and len(present) == len(values) and not isinstance(present[0], NonTensorData):
            out.set(key, callback(*present))
        else:
            out.set(key, present[0])
    return out


def is_tensor_collection(datatype: Any) -> bool:
    """Whether ``datatype`` (a class or an instance) is a tensor collection: a tensordict, a lazy
    stack, a tensorclass or a non-tensor value wrapper.

    >>> import tdshare
    >>> tdshare.is_tensor_collection(tdshare.TensorDict), tdshare.is_tensor_collection(torch.zeros(1))
    (True, False)
    """
    cls = datatype if isinstance(datatype, type) else type(datatype)
    if not isinstance(cls, type):
        raise ArgumentTypeError(f"is_tensor_collection takes a class or an instance, got {datatype!r}.")
    return issubclass(cls, (TensorDictBase, NonTensorData)) or is_tensorclass(cls)


def make_tensordict(
    input_dict: Mapping[NestedKey, Any] | TensorDictBase | None = None,
    batch_size: Sequence[int] | torch.Size | int | None = None,
    device: torch.device | str | int | None = None,
    auto_batch_size: bool | None = None,
    **kwargs: Any,
) -> TensorDict:
    """A :class:`TensorDict` of ``input_dict`` and the keyword entries (``input_dict`` wins on a shared
    key), as :meth:`TensorDict.from_dict` builds it: nested dicts become nested tensordicts, and with
    ``auto_batch_size=True`` (and no ``batch_size``) every level gets the longest leading shape its
    entries share.

    Args:
        input_dict: a mapping (tuple keys allowed) or a tensor collection.
        batch_size: the batch size (an int is one dim); default ``[]`` unless ``auto_batch_size``.
        device: the device of the result (leaves moved there).
        auto_batch_size: find the batch sizes from the entries.
        **kwargs: more entries.

    Raises:
        BatchSizeError: an entry that does not start with ``batch_size``.

    >>> import torch, tdshare
    >>> tdshare.make_tensordict(a=torch.zeros(3, 4), b=torch.zeros(3)).batch_size
    torch.Size([])
    >>> td = tdshare.make_tensordict({"a": torch.zeros(3), "b": {"c": torch.zeros(3, 4)}}, auto_batch_size=True)
    >>> td.batch_size, td["b"].batch_size
    (torch.Size([3]), torch.Size([3, 4]))
    """
    entries: dict[Any, Any] = dict(kwargs)
    if input_dict is not None:
        collection = isinstance(input_dict, TensorDictBase) or is_tensorclass(input_dict)
        source: Any = input_dict.to_dict() if collection else input_dict  # type: ignore[union-attr]
        entries.update(source.items())
    size = [batch_size] if isinstance(batch_size, int) else batch_size
    where = torch.device(device) if device is not None else None
    return TensorDict.from_dict(entries, batch_size=size, device=where, auto_batch_size=auto_batch_size)
