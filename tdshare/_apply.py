"""``apply``, ``apply_`` and ``named_apply`` of every tensor collection, with the reference's
keyword arguments.  A mixin of :class:`tdshare._tensordict_base.TensorDictBase`.

The function sees every tensor leaf (and the leaves at the same key of ``others``); non-tensor
values are carried over unchanged; a result of None drops the entry.  A lazy stack applies the
function member by member (``others`` unbound along its stack dimension) and stacks the results.
"""

from __future__ import annotations

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
    theirs = [_unwrapped(o) for o in others]
    members = td._lazy_members()
    if members is not None:
        if batch_size is not None:
            raise NotSupportedError("A LazyStackedTensorDict cannot change its batch size through apply().")
        split = [o.unbind(td.stack_dim) for o in theirs]
        results = [
            _apply(
                m,
                fn,
                tuple(s[i] for s in split),
                named,
                nested_keys,
                prefix,
                None,
                device,
                NO_DEFAULT,
                False,
                default,
                filter_empty,
                False,
                call_on_nested,
                None,
                {},
            )
            for i, m in enumerate(members)
        ]
        result = td._restack(results)
    else:
        leaves = _walk(td, fn, theirs, named, nested_keys, prefix, default, filter_empty, call_on_nested)
        result = type(td)._from_leaves(leaves, td._batch_size, td._device, td._names)
        if batch_size is not None:
            _rebatch(result, as_size(batch_size), td.batch_dims)
    if device is not NO_DEFAULT:
        dev = None if device is None else torch.device(device)
        result._propagate(lambda level: setattr(level, "_device", dev))
    if names is not NO_DEFAULT:
        result.names = names
    if inplace:
        td.update_(result)
        return td
    if out is not None:
        out.update(result, inplace=True)
        return out
    if lock or (propagate_lock and td.is_locked):
        result.lock_()
    return result


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


def _walk(
    td: Any,
    fn: Callable[..., Any],
    others: list[Any],
    named: bool,
    nested_keys: bool,
    prefix: tuple[str, ...],
    default: Any,
    filter_empty: bool | None,
    call_on_nested: bool,
) -> dict[str, Any]:
    leaves: dict[str, Any] = {}
    for key, leaf in td._tensordict.items():
        full = (*prefix, key)
        name: Any = (full if len(full) > 1 else key) if nested_keys else key
        theirs = [_lookup(o, key, default) for o in others]
        kind = kind_of(leaf)
        wrapped = kind is not None and kind.unwrap is not None and kind.wrap is not None and not is_node(leaf)
        if call_on_nested and (is_node(leaf) or isinstance(leaf, NonTensorData) or wrapped):
            value = leaf.data if isinstance(leaf, NonTensorData) and not is_node(leaf) else leaf
            result = _call(fn, named, name, leaf if not isinstance(leaf, NonTensorData) else value, theirs, default)
        elif is_node(leaf):
            sub_others = [t if is_node(t) else _ABSENT for t in theirs]
            if leaf._lazy_members() is not None:
                result = (
                    _apply(
                        leaf,
                        fn,
                        tuple(sub_others),
                        named,
                        nested_keys,
                        full,
                        None,
                        NO_DEFAULT,
                        NO_DEFAULT,
                        False,
                        default,
                        filter_empty,
                        False,
                        False,
                        None,
                        {},
                    )
                    if not any(t is _ABSENT for t in sub_others)
                    else leaf
                )
            else:
                sub = _walk(leaf, fn, sub_others, named, nested_keys, full, default, filter_empty, call_on_nested)
                result = type(leaf)._from_leaves(sub, leaf._batch_size, leaf._device, leaf._names)
            if filter_empty and not any(True for _ in result.keys(True, True)):
                continue
        elif isinstance(leaf, NonTensorData):
            result = leaf.clone()
        elif wrapped:
            assert kind is not None and kind.unwrap is not None and kind.wrap is not None
            inner, fields = kind.unwrap(leaf)
            sub_others = [_unwrapped(t) if t is not _ABSENT else t for t in theirs]
            sub = _walk(inner, fn, sub_others, named, nested_keys, full, default, filter_empty, call_on_nested)
            result = kind.wrap(type(inner)._from_leaves(sub, inner._batch_size, inner._device, inner._names), fields)
        else:
            result = _call(fn, named, name, leaf, theirs, default)
        if result is not None:
            leaves[key] = result
    return leaves


def _call(fn: Callable[..., Any], named: bool, name: Any, leaf: Any, theirs: list[Any], default: Any) -> Any:
    args = [default if t is _ABSENT else t for t in theirs]
    return fn(name, leaf, *args) if named else fn(leaf, *args)


def _rebatch(td: Any, batch: torch.Size, old_dims: int) -> None:
    """Give ``td`` the batch size ``batch`` and each nested level ``batch`` + its own extra dims."""
    for leaf in td._tensordict.values():
        if is_node(leaf) and leaf._lazy_members() is None:
            _rebatch(leaf, batch + leaf._batch_size[old_dims:], old_dims)
    td.batch_size = batch
