"""Operations across tensordicts: element-wise comparison, ``stack`` and ``cat`` (also through
``torch.stack``/``torch.cat``).  A mixin of :class:`tdshare._tensordict.TensorDictBase`, kept
apart so each module reads in one sitting."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch

from ._errors import BatchSizeError, InvalidArgumentError, MissingKeyError, NotSupportedError
from ._format import WRAPPED
from ._indexing import check_dim
from ._keys import NestedKey, unravel_key
from ._nodes import kind_of
from ._nontensor import NonTensorData, stack_non_tensor
from ._settings import lazy_legacy

__all__ = ["CombineOps", "comparable"]

T = TypeVar("T", bound="CombineOps")


def comparable(other: object) -> bool:
    """Whether ``td == other`` compares leaf by leaf: a tensor collection (a tensorclass too), a
    mapping of keys to values, a tensor, a number or an array; anything else (a string, None, a
    list) is simply not equal to a tensordict."""
    kinds = CombineOps | Mapping | torch.Tensor | numbers.Number
    return isinstance(other, kinds) or kind_of(other) is not None or hasattr(other, "__array__")


def _unwrapped(other: Any) -> Any:
    """A tensorclass's tensordict (compared key by key), else ``other``."""
    kind = kind_of(other)
    if kind is not None and kind.layout == WRAPPED and kind.unwrap is not None:
        return kind.unwrap(other)[0]
    return other


class CombineOps:
    """Comparison and concatenation; the host class provides the storage attributes below."""

    _tensordict: dict[str, Any]
    _batch_size: torch.Size
    _device: torch.device | None
    _names: list | None

    @property
    def batch_dims(self) -> int:
        return len(self._batch_size)

    @classmethod
    def _from_leaves(
        cls: type[T],
        leaves: dict[str, Any],
        batch_size: torch.Size,
        device: torch.device | None,
        names: list | None = None,
    ) -> T:
        raise NotImplementedError

    def _iter_items(self, include_nested: bool, leaves_only: bool, prefix: tuple[str, ...] = ()) -> Iterator[Any]:
        raise NotImplementedError

    # -- comparisons --------------------------------------------------------------------------
    def _compare(self: T, other: Any, op: Callable[[Any, Any], Any]) -> T:
        leaves: dict[str, Any] = {}
        keyed = isinstance(other, CombineOps | Mapping)  # a tensordict, or a (nested) dict of its values
        for key, leaf in self._tensordict.items():
            if isinstance(other, CombineOps):
                theirs = other._tensordict.get(key)
            else:
                theirs = other.get(key) if keyed else other
            if keyed and theirs is None:
                raise MissingKeyError(f"Cannot compare: key {key!r} is missing from the other tensordict.")
            if isinstance(leaf, CombineOps):
                leaves[key] = leaf._compare(theirs, op)
            elif isinstance(leaf, NonTensorData):
                if not keyed:
                    continue  # a value against a number or tensor: left out, as the reference leaves it empty
                equal = leaf == theirs  # a NonTensorStack compares element-wise
                if isinstance(equal, torch.Tensor):
                    leaves[key] = op(equal, True)
                else:
                    leaves[key] = torch.full(self._batch_size, bool(op(equal, True)))
            else:
                leaves[key] = op(leaf, theirs.data if isinstance(theirs, NonTensorData) else theirs)
        return type(self)._from_leaves(leaves, self._batch_size, self._device, self._names)

    def __eq__(self: T, other: object) -> T:  # type: ignore[override]
        if not comparable(other):
            return NotImplemented  # so ``td == "z"`` is False and ``td != "z"`` True, as in the reference
        return self._compare(_unwrapped(other), lambda a, b: a == b)

    def __ne__(self: T, other: object) -> T:  # type: ignore[override]
        if not comparable(other):
            return NotImplemented
        return self._compare(_unwrapped(other), lambda a, b: a != b)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise NotSupportedError(
            "Converting a tensordict to boolean value is not permitted: its truth value is ambiguous. Use "
            "td.all() or td.any() to reduce a comparison, td.is_empty() to test for leaves, len(td.keys()) for keys."
        )

    # -- torch functions ----------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.stack:
            lazy = getattr(cls, "lazy_stack", None) if lazy_legacy() else None
            return cls.stack(*args, **kwargs) if lazy is None else lazy(*args, **kwargs)
        if func is torch.cat:
            return cls.cat(*args, **kwargs)
        if func is torch.unbind:
            return args[0].unbind(*args[1:], **kwargs)
        return NotImplemented

    @classmethod
    def stack(cls: type[T], tds: Sequence[CombineOps], dim: int = 0, *, out: Any = None) -> T:
        """Stack tensordicts with equal batch sizes and keys along a new batch dimension.

        Args:
            tds: the tensordicts.
            dim: the position of the new batch dimension.
            out: a tensordict to write the result into (its entries are updated in place).

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> tdshare.TensorDict.stack([td, td], 1).batch_size
        torch.Size([3, 2])
        """
        return _into(out, cls._combine(tds, dim, new_dim=True))

    @classmethod
    def cat(cls: type[T], tds: Sequence[CombineOps], dim: int = 0, *, out: Any = None) -> T:
        """Concatenate tensordicts along an existing batch dimension (into ``out`` when given).

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> tdshare.TensorDict.cat([td, td]).batch_size
        torch.Size([6])
        """
        return _into(out, cls._combine(tds, dim, new_dim=False))

    def _leaf_tensors(self, sorted: bool | Sequence[NestedKey] | None, what: str) -> list[torch.Tensor]:
        td: Any = self
        if sorted is None or sorted is False:
            return list(td.values(True, True))
        if sorted is True:
            return list(td.values(True, True, sort=True))
        keys = [unravel_key(k) for k in sorted]
        have = {unravel_key(k) for k in td.keys(True, True)}
        if set(keys) != have:
            raise MissingKeyError(
                f"{what}(sorted=...): the keys given {sorted_keys(keys)} are not the leaf keys of the tensordict "
                f"{sorted_keys(have)}; list every leaf key once."
            )
        return [td.get(k) for k in keys]

    def cat_from_tensordict(
        self, dim: int = 0, *, sorted: bool | Sequence[NestedKey] | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Concatenate every tensor leaf into one tensor (``torch.cat`` along ``dim`` of the leaves).

        Args:
            dim: the dimension of the leaves to concatenate along.
            sorted: the order of the leaves: None/False the insertion order, True the sorted keys,
                or a list of every leaf key.
            out: a tensor to write the result into.

        Returns:
            The concatenated tensor.

        Raises:
            MissingKeyError: ``sorted`` is a list that is not exactly the leaf keys.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2, 1), b=torch.ones(2, 2), batch_size=[2])
        >>> td.cat_from_tensordict(dim=1).tolist()
        [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
        """
        return torch.cat(self._leaf_tensors(sorted, "cat_from_tensordict"), dim, out=out)

    def stack_from_tensordict(
        self, dim: int = 0, *, sorted: bool | Sequence[NestedKey] | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Stack every tensor leaf into one tensor (``torch.stack``: the leaves must share a shape).

        Args:
            dim: the position of the new dimension.
            sorted, out: as in :meth:`cat_from_tensordict`.

        Returns:
            The stacked tensor.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), b=torch.ones(2), batch_size=[2])
        >>> td.stack_from_tensordict(dim=1).tolist()
        [[0.0, 1.0], [0.0, 1.0]]
        """
        return torch.stack(self._leaf_tensors(sorted, "stack_from_tensordict"), dim, out=out)

    @classmethod
    def _combine(cls: type[T], tds: Sequence[CombineOps], dim: int, new_dim: bool) -> T:
        what = "stack" if new_dim else "cat"
        first = _check_same(tds, what, same_batch=new_dim)
        dim = check_dim(dim, first.batch_dims + new_dim)
        batch = list(first._batch_size)
        names = first._names if all(td._names == first._names for td in tds) else None
        if new_dim:
            batch.insert(dim, len(tds))
            names = None if names is None else [*names[:dim], None, *names[dim:]]
        else:
            batch[dim] = sum(td._batch_size[dim] for td in tds)
        op = torch.stack if new_dim else torch.cat
        leaves: dict[str, Any] = {}
        for key, leaf in first._tensordict.items():
            values = [td._tensordict[key] for td in tds]
            if isinstance(leaf, CombineOps):
                leaves[key] = type(leaf)._combine(values, dim, new_dim)  # a lazy stack combines its own way
            elif isinstance(leaf, NonTensorData):
                leaves[key] = _combine_non_tensor(key, values, [td._batch_size for td in tds], dim, new_dim)
            elif isinstance(leaf, torch.Tensor):
                leaves[key] = op([torch.Tensor.as_subclass(v, torch.Tensor) for v in values], dim)
            else:  # a registered wrapper (a tensorclass) stacks itself through its torch function
                leaves[key] = op(values, dim)
        return cls._from_leaves(leaves, torch.Size(batch), first._device, names)


def _into(out: Any, result: Any) -> Any:
    if out is None:
        return result
    out.update_(result)
    return out


def sorted_keys(keys: Any) -> list[Any]:
    return sorted(keys, key=str)


def _check_same(tds: Sequence[CombineOps], what: str, same_batch: bool = True) -> CombineOps:
    if not tds:
        raise InvalidArgumentError(f"Cannot {what} an empty sequence of tensordicts.")
    first = tds[0]
    keys = list(first._tensordict)
    for td in tds[1:]:
        if not isinstance(td, CombineOps):
            raise InvalidArgumentError(f"Cannot {what} a {type(td).__name__} with tensordicts.")
        if set(td._tensordict) != set(keys):
            raise MissingKeyError(f"Cannot {what}: keys differ ({sorted(keys)} vs {sorted(td._tensordict)}).")
        if same_batch and td._batch_size != first._batch_size:
            raise BatchSizeError(
                f"Cannot {what}: batch sizes differ ({list(first._batch_size)} vs {list(td._batch_size)})."
            )
        if not same_batch and td.batch_dims != first.batch_dims:
            raise BatchSizeError(f"Cannot {what}: the tensordicts have different numbers of batch dimensions.")
    return first


def _combine_non_tensor(key: str, values: list[Any], batches: list[torch.Size], dim: int, new_dim: bool) -> Any:
    """Equal values stay one NonTensorData; values that differ become a NonTensorStack."""
    if not all(isinstance(v, NonTensorData) for v in values):
        raise InvalidArgumentError(
            f"Cannot combine the entry {key!r}: it is a non-tensor value in some tensordicts and not in others."
        )
    return stack_non_tensor(values, batches, dim, new_dim)
