"""Writing entries into every tensor collection: ``set``, ``set_``, ``td[key] = value``,
``td[index] = value``, ``pop``, ``del_``, and how a value becomes a leaf (numbers and lists as
tensors or stacks, mappings as nested tensordicts, anything else as non-tensor data).

A mixin of :class:`tdshare._tensordict_base.TensorDictBase`, the only class that derives from it:
``isinstance(x, SetOps)`` here is the check for a tensordict (this module cannot import the
model class, which imports it).  A lazy stack writes into its members through its own ``_set``
and ``set_``; subclasses that persist non-tensor values override ``_write_non_tensor``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import torch

from ._errors import BatchSizeError, InvalidArgumentError, MemmapError, MissingKeyError
from ._format import LEVEL
from ._indexing import is_key, normalize_index
from ._key_ops import NO_DEFAULT
from ._keys import NestedKey, unravel_key
from ._nodes import kind_of
from ._nontensor import NonTensorData, NonTensorStack, assign_elements
from ._settings import list_to_stack
from ._sub_views import sub_view_entry
from ._unbatched import UnbatchedEntry, UnbatchedTensor

__all__ = ["SetOps", "is_level", "pop_missing", "selected_batch"]

T = TypeVar("T", bound="SetOps")


def is_level(value: Any) -> bool:
    """Whether ``value`` is a node whose folder holds entries of its own (a collection level)."""
    kind = kind_of(value)
    return kind is not None and kind.layout == LEVEL


def pop_missing(key: NestedKey, detail: str) -> MissingKeyError:
    """The error of ``pop(key)`` without a default for a missing ``key`` (``detail`` says what is there)."""
    return MissingKeyError(
        f"You are trying to pop key {key!r}, which is not in the tensordict: {detail}. Pass a default, "
        "e.g. td.pop(key, None), to get it back when the key is missing."
    )


def selected_batch(batch: torch.Size, idx: Any) -> torch.Size:
    """The batch shape that the normalized index ``idx`` selects: computed for integers and slices
    (``td[i] = row`` in a loop: ~1 µs), else read from a zero-stride view (~20 µs, nothing allocated).

    >>> selected_batch(torch.Size([10, 4]), (slice(2, 8, 2), 1))
    torch.Size([3])
    >>> selected_batch(torch.Size([3]), (torch.tensor([0, 2]),))
    torch.Size([2])
    """
    parts = idx if isinstance(idx, tuple) else (idx,)
    if len(parts) <= len(batch) and all(type(p) is int or type(p) is slice for p in parts):
        out = []
        for p, size in zip(parts, batch, strict=False):
            if type(p) is slice:
                out.append(len(range(*p.indices(size))))
        return torch.Size(out + list(batch[len(parts) :]))
    return torch.zeros(()).expand(batch)[idx].shape


def _check_broadcast(given: torch.Size, selected: torch.Size) -> None:
    """``td[idx] = value``: the value's batch size must be the one ``idx`` selects, or broadcast to it."""
    # the usual case, equal sizes, in one comparison; torch.broadcast_shapes costs ~40 µs a call
    fits = given == selected or (
        len(given) <= len(selected)
        and all(g in (1, s) for g, s in zip(reversed(given), reversed(selected), strict=False))
    )
    if not fits:
        raise BatchSizeError(
            f"td[index] = value: the indexed destination TensorDict batch size is {list(selected)}, which differs "
            f"from the source batch size {list(given)} (Cannot broadcast the tensordict to it). Index the value, "
            "or the tensordict, so that the two agree."
        )


class SetOps:
    """Writes; the host class provides the storage (``_tensordict``, batch size, device, names)."""

    _tensordict: dict[str, Any]
    _batch_size: torch.Size
    _device: torch.device | None
    _names: list | None
    _is_memmap: bool
    _is_shared: bool

    def _check_batch(self, key: str, value: Any, batch: torch.Size | None = None) -> None:
        batch = self._batch_size if batch is None else batch
        if isinstance(value, (SetOps, NonTensorStack)):
            shape = value.batch_size  # type: ignore[union-attr]
        elif isinstance(value, torch.Tensor) and value.is_nested:
            # a nested tensor has no fixed shape: its first dims count where every piece agrees on them
            shape = torch.Size(_regular_dims(value, len(batch)))
        elif isinstance(value, torch.Tensor):
            shape = value.shape
        else:
            return
        if shape[: len(batch)] != batch:
            raise BatchSizeError(
                f"batch dimension mismatch for key {key!r}: the {type(value).__name__} {key} has shape "
                f"{torch.Size(shape)} which is incompatible with the batch-size {torch.Size(batch)}; every entry must "
                "start with the batch dimensions."
            )

    def _widened(self, key: str, value: Any) -> Any:
        """A tensordict value whose batch size is a leading part of this one's (``[]`` in ``[4, 3]``)
        is taken as a shallow copy with this batch size, as the reference takes it (the value itself is
        not changed); its leaves must then start with the batch dimensions."""
        short, batch = value.batch_size, self._batch_size
        if len(short) >= len(batch) or batch[: len(short)] != short or not is_level(value):
            return value
        wide = value.copy()  # a shallow copy, unlocked: its batch size can change
        try:
            wide.batch_size = batch
        except BatchSizeError as err:
            raise BatchSizeError(
                f"batch dimension mismatch for key {key!r}: the tensordict value has batch size {list(short)}, and "
                f"giving it this tensordict's {list(batch)} failed: {err}"
            ) from None
        return wide

    def _convert(self, key: str, value: Any) -> Any:
        if isinstance(value, UnbatchedTensor):
            return UnbatchedEntry(value)  # no batch dimensions: never checked against the batch
        if isinstance(value, SetOps):
            value = self._widened(key, value)
        elif isinstance(value, Mapping):
            cls: Any = type(self)
            value = cls(value, batch_size=self._batch_size, device=self._device)
        elif isinstance(value, NonTensorData):
            self._check_batch(key, value)  # a NonTensorStack holds one value per batch element
            return value
        elif isinstance(value, (bool, int, float, complex)) or type(value).__module__ == "numpy":
            value = torch.as_tensor(value)
        elif isinstance(value, (list, tuple)) and list_to_stack() and (as_tensor := _list_as_tensor(value)) is not None:
            value = as_tensor
        elif isinstance(value, list) and value and list_to_stack():  # as the reference: one value per element
            stack = NonTensorStack._make(list(value), torch.Size([len(value)]))
            self._check_batch(key, stack)
            return stack
        elif not isinstance(value, torch.Tensor):
            kind = kind_of(value)
            if kind is None or kind.unwrap is None:
                return NonTensorData(value)
            self._check_batch(key, kind.unwrap(value)[0])  # a registered class around a collection
            return value
        if self._device is not None and value.device != self._device:
            value = value.to(self._device)
        self._check_batch(key, value)
        if isinstance(value, SetOps) and self._names is not None:
            host: Any = self
            value.names = self._names + value.names[host.batch_dims :]  # type: ignore[attr-defined]
        return value

    def _set(self, key: tuple[str, ...], value: Any, inplace: bool = False) -> None:
        node: Any = self
        for depth, part in enumerate(key[:-1]):
            child = node._tensordict.get(part)
            if isinstance(child, SetOps) and not is_level(child):
                child._set(key[depth + 1 :], value, inplace)  # a lazy stack writes into its members
                return
            if child is None:
                node._check_unlocked(part)
                child = node._from_leaves({}, node._batch_size, node._device, node._names)
                node._tensordict[part] = child
            elif not isinstance(child, SetOps):
                if _is_wrapped(child):
                    rest = key[depth + 1 :]  # a tensorclass entry sets its own fields (and checks them)
                    child.set(rest if len(rest) > 1 else rest[0], value, inplace=inplace)
                    return
                raise MissingKeyError(f"Cannot set {key!r}: {part!r} is a leaf, not a nested tensordict.")
            node = child
        last = key[-1]
        if inplace and last in node._tensordict:
            node._set_inplace(last, value)
            return
        node._check_unlocked(last)
        node._tensordict[last] = sub_view_entry(node, last, node._convert(last, value))

    def set(self: T, key: NestedKey, value: Any, inplace: bool = False, *, non_blocking: bool = False) -> T:
        """Add or replace ``key``. ``inplace=True`` writes into an existing entry instead.

        Args:
            key: the key; a tuple creates the missing nested tensordicts.
            value: a tensor (or a dict, a tensordict, a non-tensor value) whose shape starts with
                the batch size.
            inplace: write into the existing entry (allowed while locked); a missing key is added.
            non_blocking: accepted as in the reference (cpu copies are synchronous).

        Returns:
            ``self``.

        Raises:
            LockedError: the tensordict is locked and ``inplace`` is False (a ``RuntimeError``).
            BatchSizeError: the value's shape does not start with the batch size (a ``RuntimeError``).
            KeyTypeError: a key that is not a string or tuple of strings (a ``TypeError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> a = td["a"]
        >>> td.set(("n", "b"), torch.ones(3)).set("a", torch.ones(3), inplace=True) is td
        True
        >>> a.tolist(), td["n"].batch_size, td["n", "b"].tolist()
        ([1.0, 1.0, 1.0], torch.Size([3]), [1.0, 1.0, 1.0])
        """
        self._set(unravel_key(key), value, inplace)
        return self

    def set_non_tensor(self: T, key: NestedKey, value: Any) -> T:
        """Store ``value`` as a non-tensor entry ``key`` over this tensordict's batch (never a tensor).

        Args:
            key: the entry (nested keys create the levels on the way).
            value: any value; a ``NonTensorData`` is unwrapped, a list stays one value.

        Returns:
            This tensordict.

        Raises:
            LockedError: the tensordict is locked and ``key`` is new.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2]).set_non_tensor(("meta", "ids"), [1, 2])
        >>> td["meta", "ids"], td[0]["meta", "ids"]
        ([1, 2], [1, 2])
        """
        data = value.data if type(value) is NonTensorData else value
        device = getattr(self, "device", None)
        batch = getattr(self, "batch_size", torch.Size([]))
        self._set(unravel_key(key), NonTensorData(data, batch_size=batch, device=device))
        return self

    def __setitem__(self, idx: Any, value: Any) -> None:
        if is_key(idx):
            self._set(unravel_key(idx), value)
        else:
            self._set_at(idx, value)

    def set_(self: T, key: NestedKey, value: Any) -> T:
        """Write ``value`` into the existing entry ``key`` (allowed while locked).

        The entry keeps its tensor (and memory: a memory-mapped leaf writes to its file).

        Args:
            key: the key (or nested key) of an existing entry.
            value: a tensor that fits the entry.

        Returns:
            ``self``.

        Raises:
            MissingKeyError: ``key`` is not in the tensordict (a ``KeyError``).
            BatchSizeError: the value's shape does not start with the batch size (a ``RuntimeError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3]).lock_()
        >>> a = td["a"]
        >>> td.set_("a", torch.full((3,), 2.0))["a"] is a, a.tolist()
        (True, [2.0, 2.0, 2.0])
        """
        parts = unravel_key(key)
        td: Any = self
        parent = td._get_leaf(parts[:-1]) if len(parts) > 1 else self
        if parent is not self and isinstance(parent, SetOps) and not is_level(parent):
            parent.set_(parts[-1], value)  # a lazy stack writes into its members
            return self
        if _is_wrapped(parent):  # a tensorclass entry writes its own field
            parent.set_(parts[-1], value)
            return self
        if not isinstance(parent, SetOps) or parts[-1] not in parent._tensordict:
            where = sorted(parent._tensordict, key=str) if isinstance(parent, SetOps) else []
            raise MissingKeyError(
                f"key {key!r} not found in TensorDict with keys {where}: set_() writes into existing entries; use "
                "set() to add one."
            )
        parent._set_inplace(parts[-1], value)
        return self

    def set_at_(self: T, key: NestedKey, value: Any, index: Any, *, non_blocking: bool = False) -> T:
        """Write ``value`` into the existing tensor entry ``key`` at the batch index ``index``; return self.

        Allowed while locked (an in-place write). The value is cast to the entry's dtype.

        Args:
            key: the key (or nested key) of an existing tensor entry.
            value: a tensor (or number) that fits ``entry[index]``.
            index: an index of the batch dimensions.
            non_blocking: accepted as in the reference (cpu copies are synchronous).

        Raises:
            MissingKeyError: ``key`` is not in the tensordict.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(3), batch_size=[3]).set_at_("a", 1.0, 1)["a"].tolist()
        [0.0, 1.0, 0.0]
        """
        td: Any = self
        leaf = td._get_leaf(unravel_key(key), None)
        if leaf is None:
            raise MissingKeyError(
                f"set_at_: key {key!r} not found in TensorDict with keys {sorted(td.keys(), key=str)}; set it first."
            )
        if isinstance(leaf, NonTensorData):
            raise InvalidArgumentError(f"set_at_: key {key!r} holds a non-tensor value; use td[index] = ... instead.")
        if td._stack_parts() is not None:  # a lazy stack's entry is stacked on read: write through its members
            parts = unravel_key(key)
            nested: Any = value
            for part in reversed(parts):
                nested = {part: nested}
            td[index] = nested
            return self
        if type(value).__module__ == "numpy":  # torch assigns tensors and numbers, not arrays
            value = torch.as_tensor(value)
        leaf[index] = value
        return self

    def _set_inplace(self, key: str, value: Any) -> None:
        leaf = self._tensordict[key]
        if isinstance(leaf, SetOps):
            leaf.update_(value)  # type: ignore[attr-defined]
        elif isinstance(leaf, NonTensorData):
            self._write_non_tensor(key, leaf, value.data if isinstance(value, NonTensorData) else value)
        else:
            value = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
            self._check_batch(key, value)
            leaf.copy_(value)

    def _write_non_tensor(self, key: str, leaf: NonTensorData, value: Any) -> None:
        """Hook for subclasses that persist non-tensor writes."""
        leaf.data = value

    def _set_at(self, idx: Any, value: Any) -> None:
        host: Any = self
        idx = normalize_index(idx, host.batch_dims)
        if isinstance(value, SetOps):
            _check_broadcast(value.batch_size, selected_batch(host.batch_size, idx))  # type: ignore[attr-defined]
        if isinstance(value, (Mapping, SetOps)):
            # non-tensor entries first: the one that cannot take the value raises before any tensor is written
            items = sorted(_items_of(value), key=lambda kv: not isinstance(self._tensordict.get(kv[0]), NonTensorData))
            for key, sub in items:
                if key not in self._tensordict:
                    self._add_for_index(key, idx, sub)
                self._assign_at(key, idx, sub)
        else:  # a scalar or tensor goes into every tensor leaf; non-tensor values are left alone
            for key, leaf in self._tensordict.items():
                if not isinstance(leaf, NonTensorData):
                    self._assign_at(key, idx, value)

    def _add_for_index(self, key: str, idx: Any, value: Any) -> None:
        """``td[idx] = other`` where ``other`` has a key this tensordict lacks: add the entry first,
        as the reference does (zeros for a tensor, an empty level for a collection, the value in
        every row for one non-tensor value), so that the write can fill the rows at ``idx``."""
        host: Any = self
        batch = host.batch_size
        # the batch shape that idx selects, read from a zero-stride view (nothing is allocated)
        selected = selected_batch(batch, idx)
        device = host.device
        entry: Any
        if isinstance(value, NonTensorData) and not isinstance(value, NonTensorStack):
            entry = NonTensorData(value.data, batch_size=batch, device=device)
        elif isinstance(value, SetOps) and is_level(value):
            sub: Any = value
            extra = sub.batch_size[len(selected) :] if sub.batch_dims >= len(selected) else torch.Size([])
            entry = type(host)._level_class()._from_leaves({}, batch + extra, device)
        elif isinstance(value, Mapping):
            entry = type(host)._level_class()._from_leaves({}, batch, device)
        elif isinstance(value, (torch.Tensor, int, float, bool)):
            tensor = torch.as_tensor(value)
            feature = tensor.shape[len(selected) :] if tensor.ndim >= len(selected) else torch.Size([])
            entry = torch.zeros(batch + feature, dtype=tensor.dtype, device=device or tensor.device)
        else:
            raise MissingKeyError(
                f"td[index] = value: key {key!r} of the value is not in the tensordict, and a "
                f"{type(value).__name__} cannot be added row by row; set the entry for the whole batch first."
            )
        host._set((key,), entry)

    def _assign_at(self, key: str, idx: Any, value: Any) -> None:
        leaf = self._tensordict[key]
        if isinstance(leaf, SetOps):
            leaf._set_at(idx, value)
        elif isinstance(leaf, NonTensorData):
            self._assign_non_tensor_at(key, leaf, idx, value)
        else:
            leaf[idx] = value

    def _assign_non_tensor_at(self, key: str, leaf: NonTensorData, idx: Any, value: Any) -> None:
        """``td[idx] = other`` for a non-tensor entry: per-element values where they differ, as the reference."""
        changed = assign_elements(leaf, self._batch_size, idx, value)
        if changed is None:
            return
        if isinstance(leaf, NonTensorStack):  # already one value per element: written (persisted, shared) whole
            self._write_non_tensor(key, leaf, changed.tolist())
            return
        first = changed._values[0]
        if all(NonTensorData(v) == first for v in changed._values):
            self._write_non_tensor(key, leaf, first)  # the whole entry takes one value (persisted as one)
            return
        if self._is_memmap or self._is_shared:
            raise MemmapError(
                f"td[index] = value would give the non-tensor entry {key!r} one value per element, which a "
                "memory-mapped or shared tensordict cannot change in place. Store it as a NonTensorStack "
                "(a list of one value per element) before memory-mapping, or work on an in-memory copy."
            )
        self._tensordict[key] = changed

    def pop(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        """Remove the entry ``key`` and return its value (``default`` if given and the key is missing).

        Args:
            key: the key (or nested key) to remove.
            default: returned when ``key`` is missing (no default: raise).

        Returns:
            The removed value (a non-tensor entry's value, unwrapped), or ``default``.

        Raises:
            MissingKeyError: a missing key and no default (a ``KeyError``: "You are trying to pop key ...").
            LockedError: the tensordict is locked (a ``RuntimeError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.arange(3), b=torch.zeros(3), batch_size=[3])
        >>> td.pop("a").tolist(), td.pop("missing", None), list(td.keys())
        ([0, 1, 2], None, ['b'])
        """
        parts = unravel_key(key)
        td: Any = self
        try:
            leaf = td._get_leaf(parts, default)
        except MissingKeyError as err:
            raise pop_missing(key, str(err).rstrip(".")) from None
        if leaf is default and default is not NO_DEFAULT:
            return default
        parent: Any = td._get_leaf(parts[:-1]) if len(parts) > 1 else self
        if parent is not self and isinstance(parent, SetOps) and not is_level(parent):
            return parent.pop(parts[-1], default)  # a lazy stack removes it from its members
        parent._check_unlocked(parts[-1])
        del parent._tensordict[parts[-1]]
        return leaf.data if isinstance(leaf, NonTensorData) else leaf

    def del_(self: T, key: NestedKey) -> T:
        """Remove the entry ``key`` and return self.

        Args:
            key: the key (or nested key) to remove.

        Returns:
            ``self``.

        Raises:
            MissingKeyError: ``key`` is not in the tensordict (a ``KeyError``).
            LockedError: the tensordict is locked (a ``RuntimeError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3)}, batch_size=[3])
        >>> list(td.del_(("n", "b")).del_("a").keys(include_nested=True))
        ['n']
        """
        self.pop(key)
        return self

    def __delitem__(self, key: NestedKey) -> None:
        self.pop(key)


def _items_of(value: Mapping[Any, Any] | SetOps) -> Iterator[tuple[Any, Any]]:
    if isinstance(value, SetOps):
        return iter(list(value._tensordict.items()))
    return iter(list(value.items()))


def _list_as_tensor(value: list | tuple) -> torch.Tensor | None:
    """A list or tuple of numbers (nested) or of equal-shaped tensors as one tensor; None otherwise."""
    if value and all(isinstance(v, torch.Tensor) for v in value):
        try:
            return torch.stack(list(value))
        except RuntimeError:
            return None
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _regular_dims(nested: torch.Tensor, count: int) -> list[int]:
    """The sizes of a nested tensor's first ``count`` dims (-1 for a dim whose pieces disagree)."""
    dims = []
    for d in range(min(count, nested.dim())):
        try:
            dims.append(nested.size(d))
        except RuntimeError:  # ragged: the pieces differ in this dim
            dims.append(-1)
    return dims


def _is_wrapped(value: Any) -> bool:
    """Whether ``value`` is a registered class around a collection (a tensorclass instance)."""
    kind = kind_of(value)
    return kind is not None and kind.unwrap is not None
