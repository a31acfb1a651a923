"""The ``torch.*`` forms of the shape operations: ``torch.flatten(td, 0, 1)``, ``torch.where(cond, td,
other)``, ``torch.split(td, 2)``...

``shape_torch_function`` answers a torch function whose input is a tensordict (or a
tensorclass) by calling the method of the same name; the collections' ``__torch_function__``
ask it first and fall back to their other torch functions (stack, cat, unbind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._shape_moves import MoveOps, inner_collection

__all__ = ["shape_torch_function", "SHAPE_TORCH_FUNCTIONS"]


def _is_collection(value: Any) -> bool:
    return isinstance(value, MoveOps) or inner_collection(value) is not None


def _method(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(args[0], name)(*args[1:], **kwargs)

    return call


def _torch_where(condition: Any, input: Any, other: Any, *, out: Any = None) -> Any:
    if _is_collection(input):
        return input.where(condition, other, out=out)
    return other.where(condition.logical_not(), input, out=out)


def _torch_flatten(td: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    return td.flatten(start_dim, end_dim)


def _torch_masked_select(td: Any, mask: torch.Tensor) -> Any:
    return td[mask]


SHAPE_TORCH_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    torch.flatten: _torch_flatten,
    torch.masked_select: _torch_masked_select,
    torch.where: _torch_where,
    **{
        getattr(torch, name): _method(name)
        for name in (
            "reshape",
            "unflatten",
            "squeeze",
            "unsqueeze",
            "permute",
            "transpose",
            "swapaxes",
            "swapdims",
            "movedim",
            "moveaxis",
            "broadcast_to",
            "tile",
            "repeat_interleave",
            "roll",
            "flip",
            "fliplr",
            "flipud",
            "narrow",
            "split",
            "chunk",
            "gather",
            "rot90",
            "tensor_split",
            "atleast_1d",
            "atleast_2d",
            "atleast_3d",
        )
    },
}


def shape_torch_function(func: Any, args: tuple, kwargs: dict[str, Any] | None) -> Any:
    """The result of the torch function ``func`` on a tensordict argument, or NotImplemented.

    >>> from tdshare import TensorDict
    >>> torch.flatten(TensorDict(batch_size=[2, 3])).batch_size
    torch.Size([6])
    """
    handler = SHAPE_TORCH_FUNCTIONS.get(func)
    if handler is None:
        return NotImplemented
    if func is not torch.where and not (args and _is_collection(args[0])):
        return NotImplemented  # the tensordict is not the input (e.g. passed as a keyword)
    return handler(*args, **(kwargs or {}))
