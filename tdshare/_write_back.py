"""Blocks over a changed view: ``with td.permute(1, 0) as p: p["new"] = x`` writes ``x`` back into ``td``.

As in the reference, the results of ``flatten_keys``/``unflatten_keys`` and of the shape views
(``view``, ``flatten``, ``unflatten``, ``squeeze``, ``unsqueeze``, ``permute``, ``transpose``) can be
used as a context manager: the entries set (added or replaced) on the result inside the block are
brought back to the source's form when the block closes and set there.  The result holds a
:class:`tdshare._key_ops.WriteBack` as its pending ``with`` action (see
:class:`tdshare._locking.LockOps`): it costs one small object per call and looks at the leaves only
if a block is opened.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ._key_ops import WriteBack

__all__ = ["permuted_back", "reshaped_back", "transposed_back", "writes_back"]

F = TypeVar("F", bound=Callable[..., Any])


def writes_back(back_of: Callable[..., Callable[[Any], Any] | None]) -> Callable[[F], F]:
    """Decorate a shape operation: its result, used as a context manager, writes back into ``self``.

    ``back_of(self, *args, **kwargs)`` gives the function that turns the result's form into
    ``self``'s (a reshape to ``self``'s batch size, the inverse permutation...), or None when the
    result cannot be written back (a dtype view).
    """

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = method(self, *args, **kwargs)
            if out is not self and not kwargs.get("inplace") and hasattr(out, "_last_op"):

                def back(view: Any) -> Any:  # worked out when a block closes, not at each call
                    way = back_of(self, *args, **kwargs)
                    return None if way is None else way(view)

                out._last_op[:] = [WriteBack(out, self, back)]
            return out

        return wrapper  # type: ignore[return-value]

    return decorate


def reshaped_back(self: Any, *args: Any, **kwargs: Any) -> Callable[[Any], Any] | None:
    """The way back of ``view``, ``flatten``, ``unflatten``, ``squeeze``, ``unsqueeze``: a reshape to
    ``self``'s batch size (None for a dtype view, ``view(torch.float16)``)."""
    if args and isinstance(args[0], torch.dtype):
        return None
    batch = self.batch_size
    return lambda out: out.reshape(batch)


def permuted_back(self: Any, *dims: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """The way back of ``permute(*dims)``: the inverse permutation."""
    raw = kwargs.get("dims", dims[0] if len(dims) == 1 and not isinstance(dims[0], int) else dims)
    ndim = self.batch_dims
    perm = [d % ndim for d in raw] if ndim else []
    inverse = [perm.index(i) for i in range(len(perm))]
    return lambda out: out.permute(*inverse)


def transposed_back(self: Any, dim0: int, dim1: int) -> Callable[[Any], Any]:
    """The way back of ``transpose(dim0, dim1)``: the same transpose."""
    return lambda out: out.transpose(dim0, dim1)
