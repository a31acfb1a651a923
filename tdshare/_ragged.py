"""Reading an entry whose shapes differ across the members of a lazy stack: padded or nested.

``ls.get(key)`` stacks the members' tensors and refuses shapes that differ; :class:`RaggedReads`
gives the lazy stack the reference's other answers: ``get(key, as_padded_tensor=True)`` pads every
member's tensor to the largest size of each dim (a lazy stack of lazy stacks across its levels
too), ``get(key, as_nested_tensor=True)`` and the older ``get_nestedtensor(key)`` give a
``torch.nested`` tensor.  Either puts the stack dim first.  :class:`DensifyOps` gives every kind
``densify``: its lazy stacks made dense, ragged entries as nested tensors.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ._errors import BatchSizeError, InvalidArgumentError, MissingKeyError, NotSupportedError
from ._key_ops import NO_DEFAULT
from ._keys import NestedKey, unravel_key

__all__ = ["DensifyOps", "RaggedReads", "pad_to_largest", "read_through_lazy"]

_NO_DEFAULT: Any = NO_DEFAULT


def pad_to_largest(tensors: Sequence[torch.Tensor], side: str = "right", value: float | bool = 0.0) -> torch.Tensor:
    """Pad tensors of one number of dims to the largest size of each dim and stack them along a new dim 0.

    Args:
        tensors: the tensors (one number of dims, one dtype).
        side: ``"right"`` (the default) pads after the values, ``"left"`` before them.
        value: the value of the padding.

    Returns:
        A tensor of shape ``[len(tensors), *largest]``.

    Raises:
        InvalidArgumentError: ``side`` is neither ``"left"`` nor ``"right"``; the tensors' numbers of
            dims differ.

    >>> pad_to_largest([torch.ones(2), torch.ones(3)]).tolist()
    [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    >>> pad_to_largest([torch.ones(1), torch.ones(2)], side="left", value=-1).tolist()
    [[-1.0, 1.0], [1.0, 1.0]]
    """
    if side not in ("left", "right"):
        raise InvalidArgumentError(f"padding_side must be 'left' or 'right', got {side!r}.")
    dims = {t.dim() for t in tensors}
    if len(dims) != 1:
        raise InvalidArgumentError(
            f"Cannot pad tensors of different numbers of dims ({[list(t.shape) for t in tensors]}) into one tensor."
        )
    largest = [max(sizes) for sizes in zip(*(t.shape for t in tensors), strict=True)]
    out = torch.full((len(tensors), *largest), value, dtype=tensors[0].dtype, device=tensors[0].device)
    for row, t in zip(out, tensors, strict=True):
        if side == "right":
            row[tuple(slice(0, n) for n in t.shape)] = t
        else:
            row[tuple(slice(m - n, m) for n, m in zip(t.shape, largest, strict=True))] = t
    return out


def read_through_lazy(td: Any, parts: tuple[str, ...], default: Any, ragged: dict[str, Any]) -> Any:
    """``td.get(key, as_list=/as_padded_tensor=/as_nested_tensor=...)`` of any collection: read by the
    lazy stack that ``parts`` runs through; a dense entry is read as usual, the options ignored as the
    reference does (with a ``FutureWarning`` for ``as_list`` and ``as_nested_tensor``)."""
    if ragged["as_list"] + ragged["as_padded_tensor"] + ragged["as_nested_tensor"] > 1:
        raise InvalidArgumentError("get(): as_list, as_padded_tensor and as_nested_tensor exclude each other.")
    node: Any = td
    for depth in range(len(parts)):
        members = node._lazy_members()
        if members is not None:  # the lazy stack the key runs through reads the rest
            rest = parts[depth:]
            if ragged["as_list"]:  # a lazy member gives its own list (a stack of stacks: nested lists)
                return [m.get(rest, default, as_list=m._lazy_members() is not None) for m in members]
            side, value = ragged["padding_side"], ragged["padding_value"]
            return node._ragged(rest, default, ragged["as_padded_tensor"], ragged["layout"], side, value)
        child = node._tensordict.get(parts[depth]) if depth < len(parts) - 1 else None
        if getattr(child, "_lazy_members", None) is None:  # a leaf, or the end of the key
            break
        node = child
    if ragged["as_list"] or ragged["as_nested_tensor"]:
        warnings.warn(
            f"get({parts!r}, as_list=/as_nested_tensor=True) of a dense entry gives the entry itself, as the "
            "reference does today; it plans to give a list or a nested tensor, as a lazy stack does.",
            FutureWarning,
            stacklevel=3,
        )
    return td.get(parts, default)


class RaggedReads:
    """``get(as_padded_tensor=, as_nested_tensor=)`` and ``get_nestedtensor`` of a lazy stack (a mixin
    of ``LazyStackedTensorDict``, which provides ``_members``, ``_stack_dim`` and ``get``)."""

    _members: list[Any]
    _stack_dim: int

    def _member_values(self, key: NestedKey, default: Any, pad: tuple[str, Any] | None = None) -> list[Any] | None:
        """Each member's value of ``key``: ``default`` where a member lacks it (None: that is not a
        tensor); with ``pad`` (side, value) a lazy member's own padded entry."""
        parts = unravel_key(key)
        lacking = [i for i, td in enumerate(self._members) if parts not in td]
        if lacking and default is _NO_DEFAULT:
            raise MissingKeyError(
                f"key {key!r} is not in every member of the LazyStackedTensorDict (members {lacking} lack it); "
                "pass a default to read it anyway."
            )
        if lacking and not isinstance(default, torch.Tensor):
            return None
        values = []
        for i, td in enumerate(self._members):
            if i in lacking:
                values.append(default)
            elif pad is not None and isinstance(td, RaggedReads):
                values.append(td._ragged(parts, _NO_DEFAULT, True, None, *pad))  # its own level padded first
            else:
                values.append(td.get(parts))
        return values

    def _ragged(self, key: NestedKey, default: Any, padded: bool, layout: Any, side: str, value: Any) -> Any:
        """``get(key, as_padded_tensor=True)`` (``padded``) or ``get(key, as_nested_tensor=True)``."""
        if not padded and any(isinstance(m, RaggedReads) for m in self._members):
            raise InvalidArgumentError(
                f"get({key!r}, as_nested_tensor=True) of a lazy stack of lazy stacks: a nested tensor has one nested "
                "level. Use as_padded_tensor=True, or read each member's entry."
            )
        values = self._member_values(key, default, (side, value) if padded else None)
        if values is None:
            return default
        if any(not isinstance(v, torch.Tensor) for v in values):
            raise NotSupportedError(
                f"get({key!r}, {'as_padded_tensor' if padded else 'as_nested_tensor'}=True) reads tensors; the "
                f"members hold {sorted({type(v).__name__ for v in values})}."
            )
        plain = [torch.Tensor.as_subclass(v, torch.Tensor) for v in values]
        if padded:
            return pad_to_largest(plain, side, value)
        return torch.nested.as_nested_tensor(plain, layout=torch.jagged if layout is None else layout)

    def get_nestedtensor(self, key: NestedKey, default: Any = _NO_DEFAULT, *, layout: Any = None) -> Any:
        """The entry ``key`` of every member as one nested tensor (the reference's older method).

        Prefer ``get(key, as_nested_tensor=True)``, which builds a ``torch.jagged`` nested tensor and
        works for any stack dim: this one builds a ``torch.strided`` one by default, takes a tensor
        ``default`` as the value of the members that lack ``key`` (any other default is returned
        as is), and needs the stack dim to be 0.

        Args:
            key: the entry.
            default: the value for the members that lack ``key`` (no default: they raise).
            layout: the layout of the nested tensor (default ``torch.strided``).

        Returns:
            A nested tensor of one component per member, or ``default``.

        Raises:
            NotSupportedError: the stack dim is not 0 (a ``RuntimeError``).
            MissingKeyError: a member lacks ``key`` and there is no default.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> ls = LazyStackedTensorDict(TensorDict(a=torch.zeros(4)), TensorDict(a=torch.ones(5)))
        >>> [t.shape for t in ls.get_nestedtensor("a").unbind()]
        [torch.Size([4]), torch.Size([5])]
        """
        if self._stack_dim != 0:
            raise NotSupportedError(
                "LazyStackedTensorDict.get_nestedtensor can only be called when the stack_dim is 0. "
                f"This stack's is {self._stack_dim}: use get(key, as_nested_tensor=True), which puts it first."
            )
        warnings.warn(
            "get_nestedtensor is deprecated in the reference: use get(key, as_nested_tensor=True).",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._ragged(key, default, False, torch.strided if layout is None else layout, "right", 0.0)


class DensifyOps:
    """``densify(layout)`` of every container kind: lazy stacks replaced by dense tensordicts."""

    def densify(self, layout: Any = torch.strided) -> Any:
        """The tensordict with its lazy stacks (itself, or nested ones) replaced by dense tensordicts.

        A lazy stack's entries are stacked into one tensor where their shapes agree, and into one
        ``torch.nested`` tensor (of ``layout``) along the stack dim where they differ; a key that
        only some members hold is filled, for the others, with an entry of zero rows (the feature
        dims of the members that hold it), so it appears although the stack's ``keys()`` leaves it
        out.  A tensordict without lazy stacks is returned as it is.

        Args:
            layout: ``torch.strided`` (the default) or ``torch.jagged``, for the nested tensors.

        Returns:
            A dense tensordict (``self`` when there is no lazy stack in it).

        Raises:
            NotSupportedError: entries that differ in shape when the stack dim is not 0 (a nested
                tensor nests along its first dim), or that differ in kind across the members.

        >>> from tdshare import LazyStackedTensorDict, TensorDict
        >>> stack = LazyStackedTensorDict(TensorDict(a=torch.zeros(3)), TensorDict(a=torch.ones(4)))
        >>> dense = stack.densify(layout=torch.jagged)
        >>> type(dense).__name__, dense["a"].is_nested, [t.tolist() for t in dense["a"].unbind()][1]
        ('TensorDict', True, [1.0, 1.0, 1.0, 1.0])
        """
        return _densified(self, layout)

    def to_padded_tensor(self, padding: float = 0.0, mask_key: NestedKey | None = None) -> Any:
        """A tensordict whose nested-tensor leaves are padded dense tensors
        (``torch.nested.to_padded_tensor``); the other leaves are kept.

        Args:
            padding: the value of the padding.
            mask_key: where the reference writes a mask of the valid elements when a batch dim is
                ragged; tdshare has no ragged batch dims, so any ``mask_key`` is refused.

        Raises:
            BatchSizeError: ``mask_key`` was given (a ``RuntimeError``, as the reference's without a
                ragged batch dim).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
        >>> TensorDict(a=nested, batch_size=[2]).to_padded_tensor(1.0)["a"].tolist()
        [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
        """
        if mask_key is not None:
            raise BatchSizeError(
                f"to_padded_tensor(mask_key={mask_key!r}): a mask is written only for a ragged batch dimension, "
                "and tdshare's batch dimensions are never ragged; read the nested leaves' lengths instead."
            )
        td: Any = self
        return td._map(lambda t: torch.nested.to_padded_tensor(t, padding) if t.is_nested else t)


def _densified(node: Any, layout: Any) -> Any:
    members = node._lazy_members()
    if members is None:
        changed = {}
        for key in list(node.keys()):
            value = node.get(key)
            if getattr(value, "_lazy_members", None) is not None:
                dense = _densified(value, layout)
                if dense is not value:
                    changed[key] = dense
        if not changed:
            return node
        out = node.copy()
        out.unlock_()
        for key, dense in changed.items():
            out.set(key, dense)
        return out
    dense_members = [_densified(m, layout) for m in members]
    dim = node.stack_dim
    keys: list[str] = []
    for m in dense_members:
        keys += [k for k in m.keys() if k not in keys]
    leaves: dict[str, Any] = {}
    for key in keys:
        values = [m.get(key) if key in m.keys() else None for m in dense_members]
        leaves[key] = _densified_entry(node, key, values, dense_members, dim, layout)
    return node._level_class()._from_leaves(leaves, node.batch_size, node.device)


def _densified_entry(node: Any, key: str, values: list[Any], members: list[Any], dim: int, layout: Any) -> Any:
    present = [v for v in values if v is not None]
    if all(getattr(v, "_lazy_members", None) is not None for v in present):  # nested levels: a stack of them
        blank = present[0]
        filled = [v if v is not None else blank._from_leaves({}, blank.batch_size, blank.device) for v in values]
        return _densified(type(node)(*filled, stack_dim=dim), layout)
    if all(isinstance(v, torch.Tensor) for v in present):
        if len(present) < len(values):
            features = {
                tuple(v.shape[m.batch_dims + 1 :]) for v, m in zip(values, members, strict=True) if v is not None
            }
            if len(features) != 1:
                raise NotSupportedError(
                    f"densify: the entry {key!r} is missing in some members, and the members that hold it differ "
                    "in feature dims, so no empty entry can stand in for it."
                )
            (feature,) = features
            values = [
                v if v is not None else present[0].new_zeros((*m.batch_size, 0, *feature))
                for v, m in zip(values, members, strict=True)
            ]
        plain = [torch.Tensor.as_subclass(v, torch.Tensor) for v in values]
        if len({tuple(v.shape) for v in plain}) == 1:
            return torch.stack(plain, dim)
        if dim != 0:
            raise NotSupportedError(
                f"densify: the entry {key!r} differs in shape across the members, and a nested tensor nests along its "
                f"first dim while this stack's dim is {dim}: transpose the stack dim first, or read it as a list."
            )
        return torch.nested.as_nested_tensor(plain, layout=layout)
    if len(present) == len(values):  # non-tensor values: as the stack gives them
        return node.get(key)
    raise NotSupportedError(f"densify: the entry {key!r} holds different kinds of values across the members.")
