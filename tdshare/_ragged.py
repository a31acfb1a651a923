"""Reading an entry whose shapes differ across the members of a lazy stack: padded or nested.

``ls.get(key)`` stacks the members' tensors and refuses shapes that differ; :class:`RaggedReads`
gives the lazy stack the reference's other answers: ``get(key, as_padded_tensor=True)`` pads every
member's tensor to the largest size of each dim (a lazy stack of lazy stacks across its levels
too), ``get(key, as_nested_tensor=True)`` and the older ``get_nestedtensor(key)`` give a
``torch.nested`` tensor.  Either puts the stack dim first.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ._errors import InvalidArgumentError, MissingKeyError, NotSupportedError
from ._key_ops import NO_DEFAULT
from ._keys import NestedKey, unravel_key

__all__ = ["RaggedReads", "pad_to_largest", "read_through_lazy"]

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
    node: Any = td
    for depth in range(len(parts)):
        if node._lazy_members() is not None:
            return node.get(parts[depth:], default, **ragged)
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
        values = self._member_values(key, default)
        if values is None:
            return default
        plain = [torch.Tensor.as_subclass(v, torch.Tensor) for v in values]
        return torch.nested.as_nested_tensor(plain, layout=torch.strided if layout is None else layout)
