"""The in-memory TensorDict model: nested leaves with a common batch size.

:class:`TensorDictBase` holds everything that does not touch files: construction, keys,
indexing, in-place writes, locking, shared memory, comparison, stacking and pickling.  The
public :class:`tdshare.TensorDict` (:mod:`tdshare._tensordict`) adds the memory-mapping and I/O
methods on top of it.

Leaves are ``torch.Tensor`` (``MemoryMappedTensor`` included), nested TensorDicts, or
:class:`NonTensorData`; reading a non-tensor leaf returns its value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeGuard, TypeVar

import torch

from ._apply import ApplyOps
from ._arithmetic import ArithmeticOps
from ._combine import CombineOps
from ._consolidate import ConsolidateOps
from ._conversions import ConversionOps
from ._dataloader import LoaderOps
from ._dict_ops import DictOps
from ._entry_queries import EntryQueryOps
from ._errors import (
    ArgumentTypeError,
    ContainsKeyTypeError,
    DeviceError,
    InvalidArgumentError,
    LockedError,
    MissingKeyError,
)
from ._format import LEVEL, TD_TYPE
from ._from_any import AnyConversions
from ._generic_ops import GenericOps
from ._handoff import reduce_tree
from ._indexing import as_size, check_dim, index_names, is_key, normalize_index
from ._key_ops import NO_DEFAULT, KeyOps
from ._keys import NestedKey, unravel_key
from ._lazy_leaves import PendingLeaf, raw_items, raw_values
from ._locking import LockOps
from ._names_ops import NameOps
from ._new_ops import NewOps
from ._nn import NnOps
from ._nodes import NodeKind, kind_of, register
from ._nontensor import NonTensorData
from ._pad import PadOps
from ._pointwise import PointwiseOps
from ._private_compat import PrivateCompatOps, note_lock_parent, record_lock_parents
from ._pytree_convert import PytreeOps
from ._ragged import DensifyOps, read_through_lazy
from ._reduce_ops import ReduceOps
from ._reductions import decode_level, encode_level
from ._rename_keys import RenameOps
from ._setters import SetOps
from ._shape_ops import ShapeOps
from ._sub_views import SubViewOps, pull_from_parent
from ._surface_ops import SurfaceOps
from ._tensor_props import TensorPropsOps
from ._unbatched import surface_leaf
from ._updates import UpdateOps

__all__ = ["TensorDictBase", "TENSORDICT", "is_collection", "rebuild_tensordict", "wrapped_collection"]

T = TypeVar("T", bound="TensorDictBase")
_LOCKED_MSG = (
    "Cannot modify locked TensorDict. For in-place modification, consider using the `set_()` "
    "method and make sure the key is present. To add or remove an entry, unlock it first "
    "(td.unlock_(), or `with td.unlock_(): ...`); a memory-mapped tensordict also takes new entries "
    "through make_memmap(), make_memmap_from_tensor() or make_memmap_from_storage() while locked."
)


# Leaves that are never collections nor wrap one: :meth:`TensorDictBase._propagate` skips them at once.
_PLAIN_LEAVES = (torch.Tensor, PendingLeaf)


class TensorDictBase(
    LockOps,
    ShapeOps,
    KeyOps,
    TensorPropsOps,
    SetOps,
    UpdateOps,
    ConversionOps,
    ApplyOps,
    NnOps,
    PadOps,
    ReduceOps,
    ArithmeticOps,
    PointwiseOps,
    CombineOps,
    ConsolidateOps,
    LoaderOps,
    PrivateCompatOps,
    SurfaceOps,
    DictOps,
    NameOps,
    DensifyOps,
    AnyConversions,
    GenericOps,
    SubViewOps,
    PytreeOps,
    NewOps,
    EntryQueryOps,
    RenameOps,
):
    """A dictionary of tensors whose leading dimensions all equal ``batch_size``.

    The base class of :class:`TensorDict` and :class:`LazyStackedTensorDict`: ``isinstance(x,
    TensorDictBase)`` tells a tensor collection from anything else.

    >>> from tdshare import TensorDict, TensorDictBase, lazy_stack
    >>> td = TensorDict(a=torch.zeros(2, 3), batch_size=[2])
    >>> isinstance(td, TensorDictBase), isinstance(lazy_stack([td, td]), TensorDictBase), td.shape
    (True, True, torch.Size([2]))
    """

    _tensordict: dict[str, Any]
    _batch_size: torch.Size
    _device: torch.device | None
    # Defaults every level starts with, read from the class until a level sets its own: a load
    # builds thousands of levels, and each attribute it need not set is saved there.
    _names: list | None = None
    _is_locked: bool = False
    _is_memmap: bool = False
    _is_shared: bool = False
    _memmap_prefix: str | None = None
    _generation: tuple[int, int] | None = None  # registry state last seen (memory-mapped folders)
    _meta_seen: dict | None = None  # this level's meta.json as the last refresh read it
    _meta_stamp: Any = None  # the stamps of its meta.json and meta.jsonl then (see _refresh)
    # anonymous memory-mapped trees: (runtime store path, this level's key from the root)
    _anon_store: tuple[str, tuple[str, ...]] | None = None
    _registry: Any = None  # (folder, SharedRegistry) held while this tensordict lives

    def __init__(
        self,
        source: Mapping[Any, Any] | None = None,
        batch_size: Sequence[int] | torch.Size | int | None = None,
        device: torch.device | str | int | None = None,
        names: Sequence[str | None] | None = None,
        lock: bool = False,
        **kwargs: Any,
    ) -> None:
        if type(self).__dict__.get("_abstract_base"):  # the public tdshare.TensorDictBase itself
            raise TypeError(
                f"{type(self).__name__} is the abstract base of the tensordict classes: make a TensorDict instead."
            )
        self._init_empty(as_size(batch_size), None if device is None else torch.device(device))
        items = dict(source.items()) if source is not None else {}
        if kwargs:
            items.update(kwargs)
        for key, value in items.items():
            self._set(unravel_key(key), value)
        if names is not None:
            self.names = names
        if lock:
            self.lock_()

    def _init_empty(self, batch_size: torch.Size, device: torch.device | None) -> None:
        self._tensordict = {}
        self._batch_size = batch_size
        self._device = device
        self._last_op: list[Any] = []  # the latest lock_/unlock_ (None: it changed nothing)
        self._op_queue: list[Any] = []  # the ops of the open ``with`` blocks

    @classmethod
    def _level_class(cls) -> type[TensorDictBase]:
        """The class a loader builds this family's levels with (a lazy stack's are TensorDicts)."""
        return cls

    @classmethod
    def _from_leaves(
        cls: type[T],
        leaves: dict[str, Any],
        batch_size: torch.Size,
        device: torch.device | None,
        names: list | None = None,
    ) -> T:
        """Build without validation (the caller guarantees consistency)."""
        out = cls.__new__(cls)
        out._init_empty(batch_size, device)
        out._tensordict = leaves
        out._names = names
        return out

    # -- batch size, names, device ------------------------------------------------------------
    @property
    def batch_size(self) -> torch.Size:
        """The leading dimensions every entry shares (a ``torch.Size``).

        Setting it checks every entry first (``BatchSizeError`` naming the key when one does not
        start with the new size); dim names are dropped when the number of dims changes.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2, 3), batch_size=[2])
        >>> td.batch_size = [2, 3]
        >>> td.batch_size, td[0].batch_size
        (torch.Size([2, 3]), torch.Size([3]))
        """
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: Sequence[int] | torch.Size) -> None:
        new = as_size(value)
        for key, leaf in self._tensordict.items():
            self._check_batch(key, leaf, new)
        self._batch_size = new
        if self._names is not None and len(self._names) != len(new):
            self._names = None

    @property
    def shape(self) -> torch.Size:
        """The batch size (``td.shape == td.batch_size``).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3), batch_size=[2]).shape
        torch.Size([2])
        """
        return self._batch_size

    @property
    def batch_dims(self) -> int:
        """The number of batch dimensions (``ndim`` is the same).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2, 3, 4), batch_size=[2, 3])
        >>> td.batch_dims, td.ndim
        (2, 2)
        """
        return len(self._batch_size)

    ndim = batch_dims

    def dim(self) -> int:
        """The number of batch dimensions (as :attr:`batch_dims`), not of the leaves' dimensions.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3, 4), batch_size=[2]).dim()
        1
        """
        return len(self._batch_size)

    def numel(self) -> int:
        """The number of elements of the batch size (its product; 1 for ``[]``).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3, 4), batch_size=[2, 3]).numel(), TensorDict().numel()
        (6, 1)
        """
        return self._batch_size.numel()

    @property
    def names(self) -> list:
        """The batch dimensions' names (None for an unnamed dimension).

        Setting them names every nested level's leading dims the same way; names must be unique
        (``ValueError`` otherwise) and one per batch dimension.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2, 3), n={"b": torch.zeros(2, 3)}, batch_size=[2, 3])
        >>> before = td.names
        >>> td.names = ["time", None]
        >>> before, td.names, td["n"].names
        ([None, None], ['time', None], ['time', None])
        """
        return list(self._names) if self._names is not None else [None] * self.batch_dims

    @names.setter
    def names(self, value: Sequence[str | None] | None) -> None:
        if value is None:
            self._names = None
            return
        value = list(value)
        if len(value) != self.batch_dims:
            raise InvalidArgumentError(
                f"names has {len(value)} entries but the tensordict has {self.batch_dims} batch dimensions."
            )
        named = [n for n in value if n is not None]
        if len(set(named)) != len(named):
            raise InvalidArgumentError(f"Some dimension names are non-unique: {value}.")
        self._names = value
        for leaf in self._tensordict.values():
            if isinstance(leaf, TensorDictBase):
                leaf.names = value + leaf.names[len(value) :]  # every nested level

    @property
    def device(self) -> torch.device | None:
        """The device every leaf is on, or None when the tensordict sets none.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2)).device, TensorDict(a=torch.zeros(2), device="cpu").device
        (None, device(type='cpu'))
        """
        return self._device

    @device.setter
    def device(self, value: Any) -> None:
        raise device_set_refused("tensordict")

    def __len__(self) -> int:
        return self._batch_size[0] if self._batch_size else 0

    def _propagate(self, fn: Callable[[TensorDictBase], None]) -> None:
        fn(self)
        for leaf in raw_values(self._tensordict):  # a pending leaf is no collection: it stays unmapped
            if isinstance(leaf, _PLAIN_LEAVES):  # the common leaves, in one C call (a rebuild walks them all)
                continue
            if isinstance(leaf, TensorDictBase):
                leaf._propagate(fn)
            elif type(leaf) is not torch.Tensor and (inner := wrapped_collection(leaf)) is not None:  # a tensorclass
                inner._propagate(fn)

    def _check_unlocked(self, key: str) -> None:
        if self._is_locked:
            raise LockedError(f"{_LOCKED_MSG} (key {key!r})")

    # -- reading ------------------------------------------------------------------------------
    def _get_leaf(self, key: tuple[str, ...], default: Any = NO_DEFAULT) -> Any:
        node: Any = self
        for depth, part in enumerate(key):
            if depth and isinstance(node, TensorDictBase) and not is_collection(node):
                return node._get_leaf(key[depth:], default)  # a lazy stack reads its members
            if not isinstance(node, TensorDictBase) or part not in node._tensordict:
                inner = None if isinstance(node, TensorDictBase) else wrapped_collection(node)
                if inner is not None:  # a tensorclass entry: its fields are the keys below it
                    return inner._get_leaf(key[depth:], default)
                if isinstance(node, TensorDictBase) and pull_from_parent(node, part):
                    node = node._tensordict[part]  # a key the parent of a sub-tensordict view got later
                    continue
                if default is not NO_DEFAULT:
                    return default
                where = "" if depth == 0 else f" (missing part {part!r})"
                raise MissingKeyError(
                    f"key {key if len(key) > 1 else key[0]!r} not found in the TensorDict{where}; "
                    f"existing keys: {_preview(self._tensordict)}."
                )
            node = node._tensordict[part]
        return node

    def get(
        self,
        key: NestedKey,
        default: Any = NO_DEFAULT,
        *,
        as_list: bool = False,
        as_padded_tensor: bool = False,
        as_nested_tensor: bool = False,
        layout: Any = None,
        padding_side: str = "right",
        padding_value: float | bool = 0.0,
    ) -> Any:
        """The entry at ``key`` as stored, or ``default`` (None if not given) if ``key`` is missing.

        As in the reference, a non-tensor entry comes back as its ``NonTensorData`` (or
        ``NonTensorStack``); ``td[key]`` and :meth:`get_non_tensor` give the value itself. A missing
        key returns ``default`` (``None`` without one, as ``dict.get`` and tensordict >= 0.7),
        while ``td[key]`` raises ``MissingKeyError``.

        Args:
            key: a key or nested key (tuple of keys).
            default: what a missing key returns (default None).
            as_list: for an entry of (or inside) a lazy stack, the members' values as a list.
            as_padded_tensor: ... padded to the largest size of each dim (across the levels of a
                stack of stacks too) and stacked along a new first dim (the stack's).
            as_nested_tensor: ... as one ``torch.nested`` tensor, its first dim the stack's.
            layout: with ``as_nested_tensor``, ``torch.jagged`` (the default) or ``torch.strided``.
            padding_side, padding_value: with ``as_padded_tensor``, where the padding goes
                (``"right"`` or ``"left"``) and its value.  A dense entry ignores these options, as
                the reference does (with a ``FutureWarning`` for ``as_list`` and ``as_nested_tensor``).

        Raises:
            InvalidArgumentError: without a ``default``, a nested key runs through a tensor or
                non-tensor leaf (e.g. ``("a", "b")`` where ``"a"`` is a tensor); more than one of
                ``as_list``, ``as_padded_tensor``, ``as_nested_tensor``.
            NotSupportedError: a lazy stack's entry whose shapes differ across its members, read
                without those options ("Failed to stack tensors within a tensordict").

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> td = TensorDict(s="x")
        >>> type(td.get("s")).__name__, td["s"], td.get("zz", 0), td.get("zz")
        ('NonTensorData', 'x', 0, None)
        >>> ragged = LazyStackedTensorDict(TensorDict(x=torch.ones(1)), TensorDict(x=torch.ones(3)))
        >>> ragged.get("x", as_padded_tensor=True).tolist()
        [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
        """
        parts = unravel_key(key)
        if as_list or as_padded_tensor or as_nested_tensor:
            ragged: dict[str, Any] = {"as_list": as_list, "as_padded_tensor": as_padded_tensor}
            ragged["as_nested_tensor"] = as_nested_tensor
            ragged |= {"layout": layout, "padding_side": padding_side, "padding_value": padding_value}
            return read_through_lazy(self, parts, default, ragged)
        try:
            leaf = self._get_leaf(parts)
        except MissingKeyError:
            if default is NO_DEFAULT:
                self._raise_through_leaf(parts)
                return None
            return default
        return surface_leaf(self, parts, leaf) if isinstance(leaf, NonTensorData) else leaf  # tensors: no call

    def _raise_through_leaf(self, parts: tuple[str, ...]) -> None:
        """Raise if a prefix of the nested key ``parts`` is a leaf (``get`` without a default)."""
        for cut in range(1, len(parts)):
            leaf = self._get_leaf(parts[:cut], None)
            if leaf is None:
                return
            if not isinstance(leaf, TensorDictBase) and wrapped_collection(leaf) is None:
                raise InvalidArgumentError(
                    f"{parts[cut - 1]!r} is a {type(leaf).__name__}, not a tensordict, so it has no entry "
                    f"{parts[cut]!r} (key {parts!r}); pass a default to get() to read None instead."
                )

    def get_non_tensor(self, key: NestedKey, default: Any = NO_DEFAULT) -> Any:
        """The value of the entry ``key`` (a non-tensor entry gives its value, as ``td[key]``).

        Args:
            key: the key (or nested key).
            default: returned when ``key`` is missing (no default: raise).

        Returns:
            The non-tensor value, or the tensor or tensordict stored at ``key``, or ``default``.

        Raises:
            MissingKeyError: a missing key and no default (a ``KeyError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2]).set_non_tensor("tag", "run-1")
        >>> td.get_non_tensor("tag"), type(td.get("tag")).__name__, td.get_non_tensor("missing", 0)
        ('run-1', 'NonTensorData', 0)
        """
        if default is not NO_DEFAULT:
            leaf = self.get(key, default)
        else:
            parts = unravel_key(key)
            leaf = self._get_leaf(parts)
            if not isinstance(leaf, NonTensorData):
                return leaf  # a tensor or a collection: as stored
            leaf = surface_leaf(self, parts, leaf)
        return leaf._read_value() if isinstance(leaf, NonTensorData) else leaf

    def __getitem__(self, idx: Any) -> Any:
        if is_key(idx):
            return self.get_non_tensor(idx)
        return self._index(idx)

    def __contains__(self, key: object) -> bool:
        if not is_key(key):
            raise ContainsKeyTypeError(
                f"`key in td` takes a NestedKey (a string or a tuple of strings), got {type(key).__name__} {key!r}."
            )
        return self._get_leaf(unravel_key(key), None) is not None

    def _iter_keys(self, include_nested: bool, leaves_only: bool, prefix: tuple[str, ...] = ()) -> Iterator[Any]:
        """The keys of :meth:`_iter_items`, without reading any value (a lazy stack's would be stacked,
        a pending leaf mapped)."""
        for key, leaf in raw_items(self._tensordict):
            full = (*prefix, key)
            node = None if type(leaf) is torch.Tensor else _walked(leaf)  # (the common leaf: no call)
            if node is None or not leaves_only:
                yield full if prefix else key
            if node is not None and include_nested:
                yield from node._iter_keys(True, leaves_only, full)

    def _stored_tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor this tree stores (a lazy stack's members' own), for in-place work on them."""
        for leaf in self._tensordict.values():
            if isinstance(leaf, TensorDictBase):
                yield from leaf._stored_tensors()
            elif isinstance(leaf, torch.Tensor):
                yield leaf
            elif (inner := wrapped_collection(leaf)) is not None:  # a tensorclass entry
                yield from inner._stored_tensors()

    def items(
        self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Any = None, *, sort: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        """Iterate over ``(key, value)`` pairs as stored (``td.get``): a non-tensor entry gives its
        ``NonTensorData``, as in the reference (``td[key]`` gives its value).

        Args:
            include_nested: also yield the entries of nested tensordicts, under tuple keys.
            leaves_only: leave out nested tensordicts themselves.
            is_leaf, sort: as in :meth:`keys`.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), n={"b": torch.ones(2)}, batch_size=[2])
        >>> [k for k, _ in td.items(include_nested=True, leaves_only=True)]
        ['a', ('n', 'b')]
        """
        if is_leaf is not None or sort:
            for key in self.keys(include_nested, leaves_only, is_leaf, sort=sort):
                yield key, self._get_leaf(unravel_key(key))
            return
        yield from self._iter_items(include_nested, leaves_only)

    def values(
        self, include_nested: bool = False, leaves_only: bool = False, is_leaf: Any = None, *, sort: bool = False
    ) -> Iterator[Any]:
        """Iterate over the values (as :meth:`items`, without the keys).

        Args:
            include_nested, leaves_only, is_leaf, sort: as for :meth:`items`.

        Returns:
            An iterator of the values (tensors, tensordicts, ``NonTensorData`` entries).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), n={"b": torch.ones(2)}, batch_size=[2])
        >>> [type(v).__name__ for v in td.values()], [v.tolist() for v in td.values(True, True)]
        (['Tensor', 'TensorDict'], [[0.0, 0.0], [1.0, 1.0]])
        """
        for _, value in self.items(include_nested, leaves_only, is_leaf, sort=sort):
            yield value

    def _iter_items(
        self, include_nested: bool, leaves_only: bool, prefix: tuple[str, ...] = ()
    ) -> Iterator[tuple[Any, Any]]:
        for key, leaf in self._tensordict.items():
            full = (*prefix, key)
            node = None if type(leaf) is torch.Tensor else _walked(leaf)  # (the common leaf: no call)
            if node is None or not leaves_only:
                yield (full if prefix else key), leaf
            if node is not None and include_nested:
                yield from node._iter_items(True, leaves_only, full)

    def __iter__(self) -> Iterator[Any]:
        if not self._batch_size:
            raise ArgumentTypeError("Cannot iterate over a tensordict with no batch dimension; iterate keys().")
        for i in range(self._batch_size[0]):
            yield self._index(i)

    # -- derived tensordicts ------------------------------------------------------------------
    def _index(self: T, idx: Any) -> T:
        idx = normalize_index(idx, self.batch_dims)
        batch = torch.zeros((), dtype=torch.uint8).expand(self._batch_size)[idx].shape
        leaves: dict[str, Any] = {}
        for key, leaf in self._tensordict.items():
            if isinstance(leaf, TensorDictBase):
                leaves[key] = leaf._index(idx)
            elif isinstance(leaf, NonTensorData):
                leaves[key] = leaf._index(idx)  # the same value; a NonTensorStack's elements
            else:
                leaves[key] = leaf[idx]
        out = type(self)._from_leaves(leaves, batch, self._device, index_names(self._names, idx, len(batch)))
        out._is_memmap = self._is_memmap
        out._is_shared = self._is_shared
        out._is_locked = self._is_locked
        if out._is_locked:
            note_lock_parent(out, leaves.values())
        return out

    def _map(
        self: T,
        fn: Callable[[torch.Tensor], Any],
        batch_size: torch.Size | None = None,
        device: Any = NO_DEFAULT,
        keep_non_tensor: bool = True,
    ) -> T:
        leaves: dict[str, Any] = {}
        for key, leaf in self._tensordict.items():
            if isinstance(leaf, TensorDictBase):
                leaves[key] = leaf._map(fn, None if batch_size is None else batch_size, device, keep_non_tensor)
                if batch_size is not None:
                    leaves[key]._batch_size = batch_size + leaf._batch_size[self.batch_dims :]
            elif isinstance(leaf, NonTensorData):
                if keep_non_tensor:
                    leaves[key] = leaf._mapped(fn)
            elif (kind := kind_of(leaf)) is not None and kind.unwrap is not None and kind.wrap is not None:
                inner, fields = kind.unwrap(leaf)  # a tensorclass: map its tensordict, wrap the result again
                mapped = inner._map(fn, batch_size, device, keep_non_tensor)
                if batch_size is not None:
                    mapped._batch_size = batch_size + inner._batch_size[self.batch_dims :]
                leaves[key] = kind.wrap(mapped, fields)
            else:
                result = fn(leaf)
                if result is not None:
                    leaves[key] = result
        dev = self._device if device is NO_DEFAULT else device
        return type(self)._from_leaves(leaves, self._batch_size if batch_size is None else batch_size, dev, self._names)

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """The tensordicts along batch dimension ``dim`` (views of the leaves where torch gives views).

        Args:
            dim: the batch dimension to remove.

        Returns:
            A tuple of ``batch_size[dim]`` tensordicts.

        Raises:
            IndexError: ``dim`` is out of range.

        >>> from tdshare import TensorDict
        >>> rows = TensorDict(a=torch.arange(6).reshape(2, 3), batch_size=[2, 3]).unbind(1)
        >>> len(rows), rows[2].batch_size, rows[2]["a"].tolist()
        (3, torch.Size([2]), [2, 5])
        """
        dim = check_dim(dim, self.batch_dims)
        return tuple(self._index((slice(None),) * dim + (i,)) for i in range(self._batch_size[dim]))

    # -- representation and pickling ----------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        # memory-mapped leaves travel as compact handles (see _reductions), never as bytes; a whole
        # tree of them as one schema, remembered while it is unchanged (see _handoff)
        if self._is_memmap and (whole := reduce_tree(self)) is not None:
            return whole
        prefix = self._memmap_prefix
        state = (
            encode_level(self._tensordict, prefix),  # pending leaves stay unmapped
            tuple(self._batch_size),
            self._device,
            self._names,
            self._is_locked,
            self._is_memmap,
            self._is_shared,
            self._memmap_prefix,
            self._anon_store,
            self._generation,
        )
        return (rebuild_tensordict, (type(self), state))


def _preview(keys: Any, limit: int = 10) -> str:
    names = sorted(keys)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{names[:limit]}{more}"


def rebuild_tensordict(cls: type[T], state: tuple[Any, ...]) -> T:
    """Rebuild a pickled tensordict of class ``cls`` from the state its ``__reduce__`` made."""
    leaves, batch, device, names, locked, memmap, shared, prefix, anon_store, generation = state
    leaves = decode_level(leaves, prefix)  # mapped on first read
    out = cls._from_leaves(leaves, torch.Size(batch), device, names)
    out._is_memmap, out._is_shared, out._memmap_prefix = memmap, shared, prefix
    out._anon_store, out._generation = anon_store, generation
    out._is_locked = locked
    if locked:
        record_lock_parents(out, out._propagate)
    return out


TENSORDICT = register(NodeKind("TensorDict", LEVEL, "TensorDict", TensorDictBase, TD_TYPE))


def device_set_refused(kind: str) -> DeviceError:
    """The error of ``x.device = ...`` (``kind``: the word the message calls ``x``), as the reference's."""
    return DeviceError(
        f"device cannot be set using {kind}.device = device, because device cannot be updated in-place. To update "
        f"device, use {kind}.to(new_device), which returns a new {kind} on the new device."
    )


def _walked(leaf: Any) -> TensorDictBase | None:
    """The collection that nested keys walk into at ``leaf``: a tensordict or lazy stack, or the
    tensordict of a tensorclass instance (as the reference's ``keys(True)``); None for a leaf."""
    if type(leaf) is torch.Tensor:  # the common leaf, in one comparison
        return None
    if isinstance(leaf, TensorDictBase):
        return leaf
    if isinstance(leaf, (torch.Tensor, NonTensorData)):
        return None
    return wrapped_collection(leaf)


def wrapped_collection(value: Any) -> TensorDictBase | None:
    """The collection inside a wrapped node (a tensorclass's tensordict), or None for any other value."""
    kind = kind_of(value)
    if kind is None or kind.unwrap is None:
        return None
    inner = kind.unwrap(value)[0]
    return inner if isinstance(inner, TensorDictBase) else None


def is_collection(value: Any) -> TypeGuard[TensorDictBase]:
    """Whether ``value`` is a node whose folder holds entries of its own (a collection level)."""
    kind = kind_of(value)
    return kind is not None and kind.layout == LEVEL
