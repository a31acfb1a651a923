"""Copies that change only the layout or dtype of the leaves: :meth:`contiguous` (with the
reference's ``canonical`` and ``inplace``), :meth:`empty` and the dtype casts (``float()``,
``int()``, ...), as a mixin of :class:`~tdshare.TensorDictBase`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from ._errors import NotSupportedError
from ._indexing import contiguous_strides
from ._nodes import kind_of

__all__ = ["DtypeCasts", "SurfaceOps"]

T = TypeVar("T", bound="SurfaceOps")


def _canonical(t: torch.Tensor) -> torch.Tensor:
    """``t`` with row-major strides: a copy where ``is_contiguous()`` holds but the strides differ."""
    t = t.contiguous()
    if t.ndim and list(t.stride()) != contiguous_strides(t.shape) and t.numel() > 1:
        return t.clone(memory_format=torch.contiguous_format).as_strided(t.shape, contiguous_strides(t.shape))
    return t


def _cast(dtype: torch.dtype, name: str) -> Any:
    def cast(self: T) -> T:
        return self._map(lambda t: t.to(dtype))  # type: ignore[attr-defined]

    cast.__name__ = name
    cast.__doc__ = f"""A copy with every tensor leaf cast to ``{dtype}`` (non-tensor entries are kept).

    Returns:
        A new tensordict of the same kind.

    >>> import torch, tdshare
    >>> tdshare.TensorDict(a=torch.zeros(2), batch_size=[2]).{name}().dtype
    {dtype}
    """
    return cast


def _dense(stack: Any, canonical: bool) -> Any:
    """The dense copy of a lazy stack (its ``to_tensordict()``), with row-major strides if ``canonical``."""
    dense = stack.to_tensordict()
    return dense._map(_canonical) if canonical else dense


def _densify_children(node: Any, canonical: bool) -> None:
    """Replace, in the fresh result ``node``, every nested lazy stack by its dense copy."""
    for key, leaf in list(node._tensordict.items()):
        if isinstance(leaf, SurfaceOps):
            inner: Any = leaf
            if inner._stack_parts() is not None:
                node._tensordict[key] = _dense(inner, canonical)
            else:
                _densify_children(inner, canonical)


class DtypeCasts:
    """``td.float()``, ``td.int()``, ...: a copy with every tensor leaf cast (as ``Tensor.float()``)."""

    float = _cast(torch.float32, "float")
    double = _cast(torch.float64, "double")
    half = _cast(torch.float16, "half")
    bfloat16 = _cast(torch.bfloat16, "bfloat16")
    int = _cast(torch.int32, "int")
    long = _cast(torch.int64, "long")
    bool = _cast(torch.bool, "bool")
    float16 = _cast(torch.float16, "float16")
    float32 = _cast(torch.float32, "float32")
    float64 = _cast(torch.float64, "float64")
    int8 = _cast(torch.int8, "int8")
    int16 = _cast(torch.int16, "int16")
    int32 = _cast(torch.int32, "int32")
    int64 = _cast(torch.int64, "int64")
    uint8 = _cast(torch.uint8, "uint8")
    uint16 = _cast(torch.uint16, "uint16")
    uint32 = _cast(torch.uint32, "uint32")
    uint64 = _cast(torch.uint64, "uint64")
    complex32 = _cast(torch.complex32, "complex32")
    complex64 = _cast(torch.complex64, "complex64")
    complex128 = _cast(torch.complex128, "complex128")


class SurfaceOps(DtypeCasts):
    """Layout and dtype copies shared by every container kind."""

    def contiguous(self: T, *, canonical: bool = False, inplace: bool = False) -> T:
        """The tensordict with contiguous tensor leaves.

        A leaf that is already contiguous is shared, the others are copied (``Tensor.contiguous``).

        Args:
            canonical: also copy a leaf whose strides are not the row-major strides of its shape,
                although ``is_contiguous()`` says True (as it may with dimensions of size 1).
            inplace: replace the non-contiguous leaves of ``self`` and return ``self`` (keeps its
                identity and keys).

        Returns:
            A new tensordict, or ``self`` with ``inplace=True``.

        Raises:
            NotSupportedError: ``inplace=True`` on a lazy stack (it has no leaves of its own: call
                ``contiguous()`` for a dense copy).
            MissingKeyError, NotSupportedError: a lazy stack whose members cannot be stacked densely
                (keys or shapes that differ; see ``LazyStackedTensorDict.to_tensordict``).

        A lazy stack (and a lazy stack nested in a tensordict) becomes a dense ``TensorDict``, as
        in the reference: its ``to_tensordict()`` copy, which keeps its non-tensor entries.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(3, 4)[:, ::2], batch_size=[3])
        >>> td.contiguous()["a"].is_contiguous(), td.contiguous(inplace=True) is td
        (True, True)
        """
        fix = _canonical if canonical else torch.Tensor.contiguous
        node: Any = self  # a TensorDictBase (this is its mixin)
        if not inplace:
            if node._stack_parts() is not None:
                return _dense(node, canonical)
            out = node._map(fix)
            _densify_children(out, canonical)
            return out
        if node._stack_parts() is not None:
            raise NotSupportedError(
                f"contiguous(inplace=True) is not supported by {type(self).__name__}: it stacks its members' "
                "leaves; call contiguous() for a dense TensorDict copy, or on each of ls.tensordicts."
            )
        for key, leaf in node._tensordict.items():
            kind = kind_of(leaf)
            inner = leaf if isinstance(leaf, SurfaceOps) else kind.unwrap(leaf)[0] if kind and kind.unwrap else None
            if isinstance(inner, SurfaceOps):
                inner.contiguous(canonical=canonical, inplace=True)
            elif isinstance(leaf, torch.Tensor):
                node._tensordict[key] = fix(leaf)
        return self

    def _to_inplace(self: T, device: torch.device | None, dtype: torch.dtype | None, non_blocking: bool) -> T:
        """``to(..., inplace=True)``: the leaves replaced level by level, the levels kept."""
        node: Any = self
        if node._stack_parts() is not None:
            for member in node._stack_parts()[0]:
                member._to_inplace(device, dtype, non_blocking)
            return self
        for key, leaf in node._tensordict.items():
            kind = kind_of(leaf)
            inner = leaf if isinstance(leaf, SurfaceOps) else kind.unwrap(leaf)[0] if kind and kind.unwrap else None
            if isinstance(inner, SurfaceOps):
                inner._to_inplace(device, dtype, non_blocking)
            elif isinstance(leaf, torch.Tensor):
                node._tensordict[key] = leaf.to(device=device, dtype=dtype, non_blocking=non_blocking)
        if device is not None:
            node._device = device
        return self

    def empty(self: T, recurse: bool = False, *, batch_size: Any = None, device: Any = None) -> T:
        """A tensordict with the same batch size, device and names, and no entries.

        Args:
            recurse: keep the nested tensordicts, each emptied the same way.
            batch_size: a batch size for the result instead of ``self``'s (drops the names).
            device: a device for the result instead of ``self``'s.

        Returns:
            A new tensordict of the same kind.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)}, batch_size=[2])
        >>> list(td.empty().keys()), list(td.empty(recurse=True).keys(True))
        ([], ['n'])
        """
        node: Any = self  # a TensorDictBase (this is its mixin)
        out = node._map(lambda t: None, keep_non_tensor=False)
        if not recurse:
            out._tensordict.clear()
        if batch_size is not None:
            out.batch_size = batch_size
        if device is not None:
            out = out.to(device)
        return out
