"""``apply``, ``apply_`` and ``named_apply`` of every tensor collection, with the reference's
keyword arguments.  A mixin of :class:`tdshare._tensordict_base.TensorDictBase`.

The function sees every tensor leaf (and the leaves at the same key of ``others``); non-tensor
values are carried over unchanged; a result of None drops the entry.  A lazy stack applies the
function member by member (``others`` unbound along its stack dimension) and stacks the results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from ._errors import ArgumentTypeError, NotSupportedError
from ._indexing import as_size
from ._key_ops import NO_DEFAULT, is_node
from ._nodes import kind_of
from ._nontensor import NonTensorData

__all__ = ["ApplyOps"]

T = TypeVar("T", bound="ApplyOps")
_ABSENT: Any = object()  # an ``other`` that lacks the key (its ``default`` stands in)


class ApplyOps:
    """``apply`` and its variants; the host class provides the storage and accessors."""

    def apply(
        self: T,
        fn: Callable[..., Any],
        *others: Any,
        batch_size: Sequence[int] | None = None,
        device: Any = NO_DEFAULT,
        names: Any = NO_DEFAULT,
        inplace: bool = False,
        default: Any = NO_DEFAULT,
        filter_empty: bool | None = None,
        propagate_lock: bool = False,
        call_on_nested: bool = False,
        is_leaf: Any = None,
        out: Any = None,
        **constructor_kwargs: Any,
    ) -> T:
        """A new collection with ``fn(leaf, *other_leaves)`` for every tensor leaf.

        Args:
            fn: called with each tensor and the tensors at the same key of ``others``; a result of
                None leaves the entry out.
            *others: tensordicts of the same structure.
            batch_size: the batch size of the result.
            device: the device of the result (default: this one's).
            names: the dim names of the result (default: this one's).
            inplace: write the results into this collection's tensors and return it.
            default: the value for a key that an ``other`` lacks (default: the key is required).
            filter_empty: leave out nested tensordicts that end up without leaves.
            propagate_lock: lock the result when this collection is locked.
            call_on_nested: call ``fn`` on nested tensordicts (and non-tensor entries) instead of
                walking into them.
            is_leaf: ignored beyond the default.
            out: write the results into this collection and return it.
            **constructor_kwargs: ``lock=True`` locks the result.

        Raises:
            MissingKeyError: an ``other`` lacks a key and no ``default`` is given.
            ArgumentTypeError: an unknown keyword argument.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), n={"b": torch.zeros(2)}, batch_size=[2])
        >>> td.apply(lambda x, y: x + y, td, batch_size=[]).batch_size
        torch.Size([])
        """
        return _apply(
            self,
            fn,
            others,
            False,
            False,
            (),
            batch_size,
            device,
            names,
            inplace,
            default,
            filter_empty,
            propagate_lock,
            call_on_nested,
            out,
            constructor_kwargs,
        )

    def named_apply(
        self: T,
        fn: Callable[..., Any],
        *others: Any,
        nested_keys: bool = False,
        prefix: tuple[str, ...] = (),
        batch_size: Sequence[int] | None = None,
        device: Any = NO_DEFAULT,
        names: Any = NO_DEFAULT,
        inplace: bool = False,
        default: Any = NO_DEFAULT,
        filter_empty: bool | None = None,
        propagate_lock: bool = False,
        call_on_nested: bool = False,
        is_leaf: Any = None,
        out: Any = None,
        **constructor_kwargs: Any,
    ) -> T:
        """Like :meth:`apply`, with the key first: ``fn(key, leaf, *other_leaves)``.

        Args:
            fn: called with each key, tensor and the tensors of ``others`` at that key.
            *others: tensordicts of the same structure.
            nested_keys: give the full nested key (a tuple) instead of the last part.
            prefix: parts put before every full key.
            batch_size, device, names, inplace, default, filter_empty, propagate_lock,
            call_on_nested, is_leaf, out, constructor_kwargs: as in :meth:`apply`.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(2), n={"b": torch.zeros(2)}, batch_size=[2])
        >>> seen = []
        >>> _ = td.named_apply(lambda k, x: seen.append(k), nested_keys=True)
        >>> seen
        ['a', ('n', 'b')]
        """
        return _apply(
            self,
            fn,
            others,
            True,
            nested_keys,
            tuple(prefix),
            batch_size,
            device,
            names,
            inplace,
            default,
            filter_empty,
            propagate_lock,
            call_on_nested,
            out,
            constructor_kwargs,
        )

    def apply_(self: T, fn: Callable[..., Any], *others: Any, **kwargs: Any) -> T:
        """Replace every tensor's values with ``fn(tensor, *other_tensors)``, in place; return self.

        Args:
            fn: called as in :meth:`apply`.
            *others: tensordicts of the same structure.
            **kwargs: the keyword arguments of :meth:`apply` (``inplace`` is always true).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).apply_(lambda t: t * 3)["a"].tolist()
        [3.0, 3.0]
        """
        kwargs["inplace"] = True
        return self.apply(fn, *others, **kwargs)


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every level of one ``apply`` does (the arguments that do not change on the way down)."""

    fn: Callable[..., Any]
    named: bool
    nested_keys: bool
    default: Any
    filter_empty: bool | None
    call_on_nested: bool
    inplace: bool


def _apply(
    td: Any,
    fn: Callable[..., Any],
    others: tuple[Any, ...],
    named: bool,
    nested_keys: bool,
    prefix: tuple[str, ...],
    batch_size: Any,
    device: Any,
    names: Any,
    inplace: bool,
    default: Any,
    filter_empty: bool | None,
    propagate_lock: bool,
    call_on_nested: bool,
    out: Any,
    extra: dict[str, Any],
) -> Any:
    lock = extra.pop("lock", False)
    if extra:
        raise ArgumentTypeError(f"apply() got unexpected keyword argument(s) {sorted(extra)}.")
    if batch_size is not None and td._lazy_members() is not None:
        raise NotSupportedError("A LazyStackedTensorDict cannot change its batch size through apply().")
    job = _Job(fn, named, nested_keys, default, filter_empty, call_on_nested, inplace)
    result = _run(job, td, [_unwrapped(o) for o in others], prefix)
    if inplace:
        return td
    if _filtered_out(job, result, td):
        return None
    if batch_size is not None:
        _rebatch(result, as_size(batch_size), td.batch_dims)
    if device is not NO_DEFAULT:
        dev = None if device is None else torch.device(device)
        result._propagate(lambda level: setattr(level, "_device", dev))
    if names is not NO_DEFAULT:
        result.names = names
    if out is not None:
        return _write_out(out, result)
    if lock or (propagate_lock and td.is_locked):
        result.lock_()
    return result


def _run(job: _Job, td: Any, others: list[Any], prefix: tuple[str, ...]) -> Any:
    """``job`` on the collection ``td`` (a lazy stack member by member): the new collection, or None in place."""
    members = td._lazy_members()
    if members is not None:
        split = [o.unbind(td.stack_dim) for o in others]
        results = [_run(job, m, [s[i] for s in split], prefix) for i, m in enumerate(members)]
        return None if job.inplace else td._restack(results)
    leaves = _walk(job, td, others, prefix)
    return None if job.inplace else type(td)._from_leaves(leaves, td._batch_size, td._device, td._names)


def _unwrapped(value: Any) -> Any:
    kind = kind_of(value)
    if kind is not None and kind.unwrap is not None and not is_node(value) and not isinstance(value, NonTensorData):
        return kind.unwrap(value)[0]
    return value


def _lookup(other: Any, key: str, default: Any) -> Any:
    if other is _ABSENT:
        return _ABSENT
    found = other._get_leaf((key,)) if default is NO_DEFAULT else other._get_leaf((key,), _ABSENT)
    return found.data if isinstance(found, NonTensorData) else found


def _walk(job: _Job, td: Any, others: list[Any], prefix: tuple[str, ...]) -> dict[str, Any]:
    """The results of ``job.fn`` for ``td``'s entries (copied into the leaves instead with ``job.inplace``)."""
    leaves: dict[str, Any] = {}
    for key, leaf in td._tensordict.items():
        full = (*prefix, key)
        name: Any = (full if len(full) > 1 else key) if job.nested_keys else key
        theirs = [_lookup(o, key, job.default) for o in others]
        kind = kind_of(leaf)
        wrapped = kind is not None and kind.unwrap is not None and kind.wrap is not None and not is_node(leaf)
        if job.call_on_nested and (is_node(leaf) or isinstance(leaf, NonTensorData) or wrapped):
            value = leaf.data if isinstance(leaf, NonTensorData) else leaf
            result = _call(job, name, value, theirs)
        elif is_node(leaf):
            sub_others = [t if is_node(t) else _ABSENT for t in theirs]
            if leaf._lazy_members() is not None and any(t is _ABSENT for t in sub_others):
                result = leaf  # a lazy child that an ``other`` lacks is carried over
            else:
                result = _run(job, leaf, sub_others, full)
            if job.inplace:
                continue
            if _filtered_out(job, result, leaf):
                continue
        elif isinstance(leaf, NonTensorData) and leaf._tensor_payload:  # an unbatched tensor: fn applies to it
            result = _call(job, name, leaf.data, theirs)
            if job.inplace:
                if result is not None and result is not leaf.data:
                    leaf.data.copy_(result)
                continue
            result = None if result is None else type(leaf)(result)
        elif isinstance(leaf, NonTensorData):
            result = leaf.clone()
        elif wrapped:
            assert kind is not None and kind.unwrap is not None and kind.wrap is not None
            inner, fields = kind.unwrap(leaf)
            sub = _run(job, inner, [_unwrapped(t) if t is not _ABSENT else t for t in theirs], full)
            if job.inplace:
                continue
            result = kind.wrap(sub, fields)
        else:
            result = _call(job, name, leaf, theirs)
            if job.inplace:
                if result is not None and result is not leaf:
                    leaf.copy_(result)
                continue
        if result is not None:
            leaves[key] = result
    return leaves


def _write_out(out: Any, result: Any) -> Any:
    """``apply(out=)``: each result written into ``out``'s entry in place (a memory-mapped ``out``'s
    files get it, locked or not); a result of another dtype or shape replaces the entry, as the
    reference sets it (``td.apply(lambda x: x.float(), out=td)``; a ``LockedError`` on a locked ``out``)."""
    replaced = []
    for key, value in result.items(True, True):
        old = out.get(key, None) if isinstance(value, torch.Tensor) else None
        if isinstance(old, torch.Tensor) and (old.dtype != value.dtype or old.shape != value.shape):
            replaced.append(key)
    for key in replaced:
        out.set(key, result.get(key))
    out.update(result.exclude(*replaced) if replaced else result, inplace=True)
    return out


def _filtered_out(job: _Job, result: Any, source: Any) -> bool:
    """Whether an applied collection is left out (as None), as the reference decides: with
    ``filter_empty=True`` when it holds no leaf; with ``None`` (the default) when ``fn`` gave None for
    every entry it had (an empty collection, or one holding an empty one, stays); with ``False`` never."""
    if job.filter_empty is False:
        return False
    if job.filter_empty is True:
        return not any(True for _ in result.keys(True, True))
    return not any(True for _ in result.keys()) and any(True for _ in source.keys())


def _call(job: _Job, name: Any, leaf: Any, theirs: list[Any]) -> Any:
    args = [job.default if t is _ABSENT else t for t in theirs]
    return job.fn(name, leaf, *args) if job.named else job.fn(leaf, *args)


def _rebatch(td: Any, batch: torch.Size, old_dims: int) -> None:
    """Give ``td`` the batch size ``batch`` and each nested level ``batch`` + its own extra dims."""
    for leaf in td._tensordict.values():
        if is_node(leaf) and leaf._lazy_members() is None:
            _rebatch(leaf, batch + leaf._batch_size[old_dims:], old_dims)
    td.batch_size = batch
