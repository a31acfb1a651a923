"""Copies and updates of every tensor collection: ``copy``, ``copy_``, ``update`` (with the
reference's ``keys_to_update``, ``clone``, ``ignore_lock``, ``update_batch_size``), ``update_``
and ``update_at_``.  A mixin of :class:`tdshare._tensordict_base.TensorDictBase`; a lazy stack's
writes go into its members through its ``_set``/``set_``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch

from ._errors import ArgumentTypeError, BatchSizeError, LockedError, MissingKeyError
from ._key_ops import NO_DEFAULT, collection_of, inner_collection, is_node
from ._keys import NestedKey, unravel_key
from ._nodes import kind_of
from ._nontensor import NonTensorData

__all__ = ["UpdateOps"]

T = TypeVar("T", bound="UpdateOps")


class UpdateOps:
    """Copies and updates; the host class provides the storage and accessors."""

    def copy(self: T) -> T:
        """A shallow copy: a new structure over the same leaves (``clone(recurse=False)``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.copy()["a"] is td["a"]
        True
        """
        td: Any = self
        return td.clone(recurse=False)

    def copy_(self: T, tensordict: Any, non_blocking: bool = False) -> T:
        """Write every entry of ``tensordict`` into this one's existing entries (``update_``); return self.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.copy_(TensorDict(a=torch.ones(2), batch_size=[2]))["a"].tolist()
        [1.0, 1.0]
        """
        td: Any = self
        td.update_(tensordict, non_blocking=non_blocking)
        return self

    def update(
        self: T,
        input_dict_or_td: Any = None,
        clone: bool = False,
        inplace: bool = False,
        *,
        non_blocking: bool = False,
        keys_to_update: Sequence[NestedKey] | None = None,
        is_leaf: Any = None,
        update_batch_size: bool = False,
        ignore_lock: bool = False,
        **kwargs: Any,
    ) -> T:
        """Set every entry of ``input_dict_or_td`` (and of ``kwargs``), merging nested levels; return self.

        Args:
            input_dict_or_td: a mapping or a tensordict (None: only ``kwargs``).
            clone: copy the values before setting them.
            inplace: write into existing entries instead of replacing them.
            non_blocking: accepted for compatibility (cpu copies are synchronous).
            keys_to_update: only these keys (and the entries below them) are set.
            is_leaf: ignored beyond the default.
            update_batch_size: take the batch size of a tensordict source too.
            ignore_lock: set entries even though the tensordict is locked.
            **kwargs: more entries to set.

        Raises:
            LockedError: a new entry on a locked tensordict, or a new batch size for it (without
                ``ignore_lock``).
            BatchSizeError: a value whose leading dims disagree with the batch size (or a new batch
                size with ``inplace`` or ``keys_to_update``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.update({"b": torch.ones(2)}, keys_to_update=["b"]).keys()
        ['a', 'b']
        """
        td: Any = self
        selected = _key_filter(keys_to_update)
        if ignore_lock and td.is_locked:
            with td.unlock_():
                return td.update(
                    input_dict_or_td,
                    clone,
                    inplace,
                    keys_to_update=keys_to_update,
                    update_batch_size=update_batch_size,
                    **kwargs,
                )
        source = input_dict_or_td
        if is_node(source) and td.batch_size[: source.batch_dims] != source.batch_size[: td.batch_dims]:
            if not update_batch_size:
                raise BatchSizeError(
                    f"update() got a source with batch size {list(source.batch_size)} for a destination with batch "
                    f"size {list(td.batch_size)}. Pass update_batch_size=True to replace the batch size."
                )
            if inplace:
                raise BatchSizeError(
                    "update(update_batch_size=True, inplace=True): the batch sizes differ, so the entries cannot be "
                    "written in place; pass inplace=False."
                )
            if keys_to_update is not None:
                raise BatchSizeError(
                    "update(update_batch_size=True, keys_to_update=...): a new batch size needs every entry; drop "
                    "keys_to_update, or select the keys first (source.select(...))."
                )
            if td.is_locked:
                raise LockedError(
                    "update(update_batch_size=True) cannot change the batch size of a locked tensordict: unlock it "
                    "first (td.unlock_()) or pass ignore_lock=True."
                )
        if update_batch_size and is_node(source) and td._lazy_members() is None:
            td._batch_size = torch.Size([])  # the entries are replaced one by one, then the new size is set
            for key in [k for k in td.keys() if not is_node(td._get_leaf((k,)))]:
                td._tensordict.pop(key)
            td._batch_size = source.batch_size
        for key, value in _items_of(input_dict_or_td, kwargs):
            parts = unravel_key(key)
            if not selected(parts):
                continue
            current = td._get_leaf(parts, None)
            if (
                is_node(current)
                and (isinstance(value, Mapping) or is_node(value))
                and not isinstance(value, NonTensorData)
            ):
                sub = [k[len(parts) :] for k in map(unravel_key, keys_to_update or ()) if k[: len(parts)] == parts]
                current.update(
                    value,
                    clone,
                    inplace,
                    keys_to_update=[k for k in sub if k] or None,
                    update_batch_size=update_batch_size,
                )
                continue
            td._set(parts, _cloned(value) if clone else value, inplace=inplace)
        return self

    def update_(
        self: T,
        input_dict_or_td: Any = None,
        clone: bool = False,
        *,
        non_blocking: bool = False,
        keys_to_update: Sequence[NestedKey] | NestedKey | None = None,
        **kwargs: Any,
    ) -> T:
        """Write every entry of ``input_dict_or_td`` into the existing entries (allowed while locked).

        Args:
            input_dict_or_td: a mapping or a tensordict (nested levels are written into).
            clone: accepted for compatibility (values are copied into the entries anyway).
            non_blocking: accepted for compatibility.
            keys_to_update: only these keys (a key or a sequence of keys).
            **kwargs: more entries to write.

        Raises:
            MissingKeyError: an entry of the input that this tensordict lacks.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2]).lock_()
        >>> td.update_({"a": torch.ones(2)})["a"].tolist()
        [1.0, 1.0]
        """
        td: Any = self
        if isinstance(keys_to_update, (str, tuple)):
            keys_to_update = [keys_to_update]
        stack = td._stack_parts()
        source = collection_of(input_dict_or_td) if not kwargs else None
        if stack is not None and source is not None and source.batch_size == td.batch_size:
            members, dim = stack  # member by member: a ragged entry is never stacked
            for member, piece in zip(members, source.unbind(dim), strict=True):
                member.update_(piece, clone, keys_to_update=keys_to_update)
            return self
        selected = _key_filter(keys_to_update)
        for key, value in _items_of(input_dict_or_td, kwargs):
            parts = unravel_key(key)
            mine = td._get_leaf(parts, None)
            if type(value) is not torch.Tensor and not isinstance(value, NonTensorData):  # (tensors: no walk)
                theirs = collection_of(value)
                if theirs is None and isinstance(value, Mapping):
                    theirs = value
                if theirs is not None and (inner := collection_of(mine)) is not None and selected(parts):
                    sub = [k[len(parts) :] for k in map(unravel_key, keys_to_update or ()) if k[: len(parts)] == parts]
                    inner.update_(theirs, clone, keys_to_update=[k for k in sub if k] or None)  # level by level
                    continue
                if theirs is not None:
                    for sub_key, leaf in _leaf_items(theirs, {}):
                        _write_existing(td, (*parts, *sub_key), leaf, selected)
                    continue
            if selected(parts):
                if mine is None:
                    _missing_for_update_(parts)
                td.set_(parts, value)
        return self

    def update_at_(
        self: T,
        input_dict_or_td: Any,
        idx: Any,
        clone: bool = False,
        *,
        non_blocking: bool = False,
        keys_to_update: Sequence[NestedKey] | None = None,
    ) -> T:
        """Write every entry of ``input_dict_or_td`` at index ``idx`` of the existing entries; return self.

        Args:
            input_dict_or_td: a mapping or a tensordict of the values at ``idx``.
            idx: an index of the batch dims.
            clone: accepted for compatibility.
            non_blocking: accepted for compatibility.
            keys_to_update: only these keys.

        Raises:
            MissingKeyError: an entry of the input that this tensordict lacks.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> td.update_at_({"a": torch.ones(())}, 1)["a"].tolist()
        [0.0, 1.0, 0.0]
        """
        td: Any = self
        selected = _key_filter(keys_to_update)
        # a lazy stack's leaves are stacked copies of its members': the copy is written at idx, then
        # back into the members in place (set_), so any index and broadcast behave as on a tensor
        stacked = td._stack_parts() is not None
        for key, value in _leaf_items(input_dict_or_td, {}):
            if not selected(key):
                continue
            target = td._get_leaf(key, None)
            if target is None:
                raise MissingKeyError(f"update_at_: key {key!r} is not in the tensordict; add it first.")
            if isinstance(target, NonTensorData):  # as td[idx] = value: one value per element where they differ
                nested: Any = value
                for part in reversed(key):
                    nested = {part: nested}
                td._set_at(idx, nested)
                continue
            if stacked:
                target = target.clone()
                target[idx] = value
                td.set_(key, target)
                continue
            target[idx] = value
        return self

    def separates(
        self: T, *keys: NestedKey, default: Any = NO_DEFAULT, strict: bool = True, filter_empty: bool = True
    ) -> T:
        """Remove the entries ``keys`` from this tensordict and return them in a new one.

        The values are not copied; the result keeps the nested levels (and their batch sizes)
        that hold the removed entries.

        Args:
            *keys: the keys (nested keys too) to move out.
            default: with a default, a missing key does not raise: the result holds ``default``
                under it (None gives a None entry).
            strict: without a default, a missing key raises; ``strict=False`` gives a None entry.
            filter_empty: also remove the nested levels of ``self`` that the removal left empty.

        Returns:
            A new tensordict of the same kind with the removed entries.

        Raises:
            MissingKeyError: a missing key with ``strict`` and no ``default``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), b=torch.ones(2), batch_size=[2])
        >>> td.separates("a").keys(), td.keys()
        (['a'], ['b'])
        """
        td: Any = self
        strict = strict and default is NO_DEFAULT
        fill = None if default is NO_DEFAULT else default
        wanted = [unravel_key(k) for k in keys]
        for parts in wanted:  # check every key before anything moves
            if strict and td._get_leaf(parts, None) is None:
                raise MissingKeyError(
                    f"separates: key {parts if len(parts) > 1 else parts[0]!r} is not in the tensordict; pass a "
                    "default (or strict=False) to get a None entry for it."
                )
        out = td.empty(recurse=True)
        for parts in wanted:
            value = td._get_leaf(parts, None)
            if value is None:
                out._set(parts, fill)
                continue
            td.pop(parts)
            out._set(parts, value)
            if filter_empty:
                _drop_empty_levels(td, parts)
        _prune_empty(out)
        return out


def _cloned(value: Any) -> Any:
    if isinstance(value, torch.Tensor) or is_node(value):
        return value.clone()
    return value


def _items_of(source: Any, kwargs: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    if source is None:
        items: list[tuple[Any, Any]] = []
    elif is_node(source):
        items = [(k, source._get_leaf((k,))) for k in source.keys()]
    elif kind_of(source) is not None and kind_of(source).unwrap is not None:  # type: ignore[union-attr]
        inner = kind_of(source).unwrap(source)[0]  # type: ignore[union-attr, misc]
        items = [(k, inner._get_leaf((k,))) for k in inner.keys()]
    elif isinstance(source, Mapping):
        items = list(source.items())
    else:
        raise ArgumentTypeError(f"update takes a mapping or a tensordict, got {type(source).__name__}.")
    return items + list(kwargs.items())


def _leaf_items(source: Any, kwargs: Mapping[str, Any]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(nested key, value) for every leaf of a mapping or tensordict source."""
    for key, value in _items_of(source, kwargs):
        parts = unravel_key(key)
        inner = inner_collection(value)
        if inner is not None or (isinstance(value, Mapping) and not isinstance(value, NonTensorData)):
            for sub, leaf in _leaf_items(inner if inner is not None else value, {}):
                yield (*parts, *sub), leaf
        else:
            yield parts, value


def _key_filter(keys: Sequence[NestedKey] | None) -> Callable[[tuple[str, ...]], bool]:
    """Whether a nested key is selected: it is one of ``keys``, above one or below one (None: all)."""
    if keys is None:
        return lambda parts: True
    wanted = [unravel_key(k) for k in keys]

    def selected(parts: tuple[str, ...]) -> bool:
        return any(parts[: len(w)] == w or w[: len(parts)] == parts for w in wanted)

    return selected


def _drop_empty_levels(td: Any, parts: tuple[str, ...]) -> None:
    """Remove the levels above ``parts`` that a removal left without entries."""
    for depth in range(len(parts) - 1, 0, -1):
        level = td._get_leaf(parts[:depth], None)
        if not is_node(level) or level.keys():
            return
        td.pop(parts[:depth])


def _prune_empty(td: Any) -> bool:
    """Remove the nested levels of ``td`` that hold no entry at any depth; whether ``td`` is left empty."""
    for key in list(td.keys()):
        value = td._get_leaf((key,))
        if is_node(value) and _prune_empty(value):
            td._tensordict.pop(key)
    return not td._tensordict


def _missing_for_update_(key: tuple[str, ...]) -> None:
    raise MissingKeyError(
        f"update_: key {key!r} was not found in the tensordict; update_ writes into existing entries, use update() "
        "to add it."
    )


def _write_existing(td: Any, key: tuple[str, ...], value: Any, selected: Callable[[tuple[str, ...]], bool]) -> None:
    if selected(key):
        if td._get_leaf(key, None) is None:
            _missing_for_update_(key)
        td.set_(key, value)
