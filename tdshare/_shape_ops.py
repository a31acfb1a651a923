"""Shape operations on the batch dimensions: reshape, view, flatten, permute, expand, repeat... and
the ``torch.*`` forms of every shape operation.

A mixin of :class:`tdshare._tensordict_base.TensorDictBase` (through :class:`ShapeOps`, whose
base :class:`tdshare._shape_moves.MoveOps` holds the element-moving operations and the engine).
Every operation validates its arguments against the batch size first, then builds the result
level by level; results are plain in-memory tensordicts (views where torch gives views), locked
when the input is, and names follow the reference.  A lazy stack follows
:mod:`tdshare._shape_stack`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from . import _shape_stack as stack_rules
from ._errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError, MissingKeyError
from ._legacy_views import check_legacy_permute, legacy_source, remember_source
from ._shape_args import batch_dim, expanded_shape, inferred_shape, int_list, interleaved_size, shape_args
from ._shape_masks import MaskOps
from ._shape_moves import MoveOps, inner_collection
from ._shape_torch import shape_torch_function
from ._write_back import permuted_back, reshaped_back, transposed_back, writes_back

__all__ = ["ShapeOps"]

T = TypeVar("T", bound="ShapeOps")


class ShapeOps(MaskOps):
    """Batch-shape operations (``MaskOps`` adds the masking ones, ``MoveOps`` the element-moving ones
    and the engine)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """The shape functions (``torch.flatten(td)``...), then the next mixin's torch functions."""
        result = shape_torch_function(func, args, kwargs)
        if result is NotImplemented:
            following = getattr(super(), "__torch_function__", None)
            return NotImplemented if following is None else following(func, types, args, kwargs)
        return result

    # -- reshaping ------------------------------------------------------------------------------
    def reshape(self: T, *shape: Any, inplace: bool = False, **kwargs: Any) -> T:
        """A tensordict whose batch size is ``shape`` (each leaf reshaped on its batch dims).

        Args:
            *shape: the new batch size, as ints or one sequence (one dim may be -1); the
                keyword ``size=`` works too.
            inplace: change this tensordict instead of returning a new one.

        Returns the new tensordict (views where torch gives views; self when the shape is the
        same); dim names are dropped.

        Raises:
            BatchSizeError: the shape does not hold the batch's number of elements.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3, 5), batch_size=[2, 3]).reshape(-1)["a"].shape
        torch.Size([6, 5])
        """
        new = inferred_shape(shape_args(shape, kwargs, "size"), self.batch_size, "reshape")
        if new == self.batch_size:
            return self
        parts = self._stack_parts()
        if parts is not None:
            if inplace:
                return self._rebind_(None, "reshape")
            return stack_rules.reshape(self, new, view=False)
        bd = self.batch_dims
        result = self._rebuild(
            lambda t: t.reshape((*new, *t.shape[bd:])),
            lambda c: c.reshape(*new, *c.batch_size[bd:]),
            new,
            None,
            keep_status=False,
        )
        return self._rebind_(result, "reshape") if inplace else result

    @writes_back(reshaped_back)
    def view(self: T, *shape: Any, size: Any = None, batch_size: Any = None) -> T:
        """A view with batch size ``shape``, or with every leaf viewed as the dtype ``view(dtype)``.

        Args:
            *shape: the new batch size (ints or one sequence, one dim may be -1), or one
                ``torch.dtype``.
            size: the new batch size as a keyword.
            batch_size: with a dtype, the batch size of the result (default: unchanged).

        Returns the view (self when the shape is the same); dim names are dropped for a new shape.

        Raises:
            BatchSizeError: the shape does not hold the batch's elements, or a leaf cannot be
                viewed (torch's message is included).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3]).view(6).batch_size
        torch.Size([6])
        """
        if len(shape) == 1 and isinstance(shape[0], torch.dtype):
            return self._view_dtype(shape[0], batch_size)
        args = shape if size is None else (size,)
        new = inferred_shape(shape_args(args, {}, "size"), self.batch_size, "view")
        if new == self.batch_size:
            return self
        source = legacy_source(self, "view", new)
        if source is not None:
            return source
        if self._stack_parts() is not None:
            return remember_source(stack_rules.reshape(self, new, view=True), self, "view", new)
        bd = self.batch_dims

        def leaf(t: torch.Tensor) -> torch.Tensor:
            try:
                return t.view((*new, *t.shape[bd:]))
            except RuntimeError as exc:
                raise BatchSizeError(f"view({list(new)}): {exc} Use reshape() instead.") from None

        return remember_source(
            self._rebuild(leaf, lambda c: c.view(*new, *c.batch_size[bd:]), new, None), self, "view", new
        )

    def _view_dtype(self: T, dtype: torch.dtype, batch_size: Any) -> T:
        parts = self._stack_parts()
        if parts is not None:
            return self._restack([m.view(dtype) for m in parts[0]], parts[1])
        batch = self.batch_size if batch_size is None else torch.Size(batch_size)
        out = self._rebuild(lambda t: t.view(dtype), lambda c: c.view(dtype), self.batch_size, self._names_kept())
        out.batch_size = batch  # type: ignore[misc]  # checks every viewed leaf against the batch
        return out

    @writes_back(reshaped_back)
    def flatten(self: T, start_dim: int = 0, end_dim: int = -1, *, inplace: bool = False) -> T:
        """Merge the batch dims ``start_dim`` to ``end_dim`` (both included) into one.

        Args:
            start_dim: the first dim to merge (negative counts from the end).
            end_dim: the last dim to merge.
            inplace: change this tensordict instead of returning a new one.

        Returns the flattened tensordict; the merged dim has no name, the others keep theirs.
        A tensordict without batch dims gives one of batch size ``[1]``.

        Raises:
            DimensionError: a dim out of range (an ``IndexError``).
            InvalidArgumentError: ``end_dim`` before ``start_dim``.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3, 4), batch_size=[2, 3, 4]).flatten(1, 2).batch_size
        torch.Size([2, 12])
        """
        ndim = self.batch_dims
        if ndim == 0:
            return self.unsqueeze(0)
        start = batch_dim(start_dim, ndim, "flatten")
        end = batch_dim(end_dim, ndim, "flatten")
        if end < start:
            raise InvalidArgumentError(f"flatten: end_dim ({end_dim}) must not come before start_dim ({start_dim}).")
        batch = list(self.batch_size)
        new = torch.Size([*batch[:start], math.prod(batch[start : end + 1]), *batch[end + 1 :]])
        names = None if self._names is None else [*self.names[:start], None, *self.names[end + 1 :]]
        if self._stack_parts() is not None:
            if inplace:
                return self._rebind_(None, "flatten")
            return self if start == end else stack_rules.flatten(self, start, end)
        result = self._rebuild(lambda t: t.flatten(start, end), lambda c: c.flatten(start, end), new, names)
        return self._rebind_(result, "flatten") if inplace else result

    @writes_back(reshaped_back)
    def unflatten(self: T, dim: int, unflattened_size: Sequence[int], *, inplace: bool = False) -> T:
        """Split the batch dim ``dim`` into the dims ``unflattened_size`` (one of them may be -1).

        Args:
            dim: the dim to split (negative counts from the end).
            unflattened_size: the new dims; their product must be the size of ``dim`` (the
                reference's name, as ``Tensor.unflatten``'s ``sizes``).
            inplace: change this tensordict instead of returning a new one.

        Returns the new tensordict; the new dims have no name except the last, which keeps
        ``dim``'s.

        Raises:
            DimensionError: ``dim`` out of range.
            BatchSizeError: ``unflattened_size`` does not multiply to the size of ``dim``.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(6), batch_size=[6]).unflatten(0, (2, 3)).batch_size
        torch.Size([2, 3])
        """
        ndim = self.batch_dims
        d = batch_dim(dim, ndim, "unflatten")
        sizes = int_list(unflattened_size, "unflatten", "unflattened_size")
        if not sizes:
            raise InvalidArgumentError("unflatten: unflattened_size must hold at least one dim, e.g. (2, 3).")
        try:
            new_dims = list(torch.empty(self.batch_size[d], device="meta").unflatten(0, sizes).shape)
        except RuntimeError as exc:
            raise BatchSizeError(f"unflatten: {exc}") from None
        batch = list(self.batch_size)
        new = torch.Size([*batch[:d], *new_dims, *batch[d + 1 :]])
        names = None
        if self._names is not None:
            names = [*self.names[:d], *[None] * (len(new_dims) - 1), *self.names[d:]]
        if self._stack_parts() is not None:
            if inplace:
                return self._rebind_(None, "unflatten")
            return stack_rules.unflatten(self, d, new_dims)
        result = self._rebuild(lambda t: t.unflatten(d, new_dims), lambda c: c.unflatten(d, new_dims), new, names)
        return self._rebind_(result, "unflatten") if inplace else result

    @writes_back(reshaped_back)
    def squeeze(self: T, dim: int | None = None) -> T:
        """Remove the batch dim ``dim`` if its size is 1 (every size-1 batch dim when None).

        Args:
            dim: the dim (negative counts from the end), or None.

        Returns the squeezed tensordict (self when ``dim``'s size is not 1); names follow the dims.

        Raises:
            DimensionError: ``dim`` out of range.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(1, 3), batch_size=[1, 3]).squeeze().batch_size
        torch.Size([3])
        """
        batch = self.batch_size
        if dim is None:
            out: Any = self
            for d in reversed(range(len(batch))):
                if batch[d] == 1:
                    out = out.squeeze(d)
            return out
        d = batch_dim(dim, len(batch), "squeeze")
        if batch[d] != 1:
            return self
        if self._stack_parts() is not None:
            return stack_rules.squeeze(self, d)
        names = None if self._names is None else [n for i, n in enumerate(self.names) if i != d]
        new = torch.Size([s for i, s in enumerate(batch) if i != d])
        return self._rebuild(lambda t: t.squeeze(d), lambda c: c.squeeze(d), new, names, collapse=True)

    @writes_back(reshaped_back)
    def unsqueeze(self: T, dim: int) -> T:
        """Insert a batch dim of size 1 at ``dim`` (from ``-batch_dims - 1`` to ``batch_dims``).

        Returns the new tensordict (views of the leaves); the new dim has no name, and a
        non-tensor value becomes a ``NonTensorStack`` of the new batch, as in the reference.

        Raises:
            BatchSizeError: ``dim`` out of range (a ``RuntimeError``, as in the reference).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(3), batch_size=[3]).unsqueeze(-1).batch_size
        torch.Size([3, 1])
        """
        ndim = self.batch_dims
        if not -ndim - 1 <= dim <= ndim:
            raise BatchSizeError(
                f"unsqueeze: dim {dim} is out of range: a new dim goes between {-ndim - 1} and {ndim} for the batch "
                f"size {list(self.batch_size)}."
            )
        d = dim % (ndim + 1)
        if self._stack_parts() is not None:
            return stack_rules.unsqueeze(self, d)
        batch = list(self.batch_size)
        names = None if self._names is None else [*self.names[:d], None, *self.names[d:]]
        new = torch.Size([*batch[:d], 1, *batch[d:]])
        return self._rebuild(lambda t: t.unsqueeze(d), lambda c: c.unsqueeze(d), new, names, spread=True)

    def atleast_1d(self: T) -> T:
        """Self when it has a batch dim, else ``unsqueeze(0)``.

        >>> from tdshare import TensorDict
        >>> TensorDict(batch_size=[]).atleast_1d().batch_size
        torch.Size([1])
        """
        return self if self.batch_dims >= 1 else self.unsqueeze(0)

    def atleast_2d(self: T) -> T:
        """Self with leading size-1 dims added until it has 2 batch dims.

        >>> from tdshare import TensorDict
        >>> TensorDict(batch_size=[3]).atleast_2d().batch_size
        torch.Size([1, 3])
        """
        out = self
        while out.batch_dims < 2:
            out = out.unsqueeze(0)
        return out

    def atleast_3d(self: T) -> T:
        """Self with leading size-1 dims added until it has 3 batch dims.

        >>> from tdshare import TensorDict
        >>> TensorDict(batch_size=[2, 3]).atleast_3d().batch_size
        torch.Size([1, 2, 3])
        """
        out = self
        while out.batch_dims < 3:
            out = out.unsqueeze(0)
        return out

    # -- moving dims ----------------------------------------------------------------------------
    @writes_back(permuted_back)
    def permute(self: T, *dims: Any, **kwargs: Any) -> T:
        """Reorder the batch dims: dim ``i`` of the result is dim ``dims[i]`` of this tensordict.

        Args:
            *dims: a permutation of the batch dims (or of the first ``len(dims)`` of them, the
                others staying in place), as ints or one sequence; ``dims=`` works too.

        Returns the permuted tensordict (views); names move with their dims.

        Raises:
            InvalidArgumentError: ``dims`` is not such a permutation.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3, 4), batch_size=[2, 3]).permute(1, 0)["a"].shape
        torch.Size([3, 2, 4])
        """
        ndim = self.batch_dims
        raw = int_list(shape_args(dims, kwargs, "dims"), "permute", "dims")
        check_legacy_permute(raw, ndim)
        perm = [d + ndim if d < 0 else d for d in raw]
        if sorted(perm) != list(range(len(perm))) or len(perm) > ndim:
            raise InvalidArgumentError(
                f"permute: dims={raw} is not a permutation of the batch dims {list(range(ndim))} (or of their "
                "first len(dims))."
            )
        perm += list(range(len(perm), ndim))
        if perm == list(range(ndim)):
            return self
        source = legacy_source(self, "permute", perm)
        if source is not None:
            return source
        if self._stack_parts() is not None:
            return remember_source(stack_rules.permute(self, perm), self, "permute", perm)
        batch = self.batch_size
        names = None if self._names is None else [self.names[p] for p in perm]

        def leaf(t: torch.Tensor) -> torch.Tensor:
            return t.permute(*perm, *range(ndim, t.dim()))

        def nested(c: Any) -> Any:
            return c.permute(*perm, *range(ndim, c.batch_dims))

        return remember_source(self._rebuild(leaf, nested, [batch[p] for p in perm], names), self, "permute", perm)

    @writes_back(transposed_back)
    def transpose(self: T, dim0: int, dim1: int) -> T:
        """Swap the batch dims ``dim0`` and ``dim1`` (views; names swap too).

        Raises:
            InvalidArgumentError: a dim out of range (a ``ValueError``, as in the reference).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3]).transpose(0, 1).batch_size
        torch.Size([3, 2])
        """
        ndim = self.batch_dims
        a, b = (d + ndim if d < 0 else d for d in (dim0, dim1))
        if not (0 <= a < ndim and 0 <= b < ndim):
            raise InvalidArgumentError(
                f"transpose: dim0 and dim1 must be within the range of the number of dimensions: dim0={dim0} and "
                f"dim1={dim1} must be batch dims, in [{-ndim}, {ndim - 1}]."
            )
        perm = list(range(ndim))
        perm[a], perm[b] = b, a
        return self.permute(perm)

    swapaxes = transpose
    swapdims = transpose

    def movedim(self: T, source: int | Sequence[int], destination: int | Sequence[int]) -> T:
        """Move the batch dims ``source`` to the positions ``destination`` (as ``torch.movedim``).

        Raises:
            InvalidArgumentError: ``source`` and ``destination`` differ in length.
            BatchSizeError: a dim repeated in ``source`` or ``destination`` (a ``RuntimeError``).
            DimensionError: a dim out of range.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3, 4), batch_size=[2, 3, 4]).movedim(0, 2).batch_size
        torch.Size([3, 4, 2])
        """
        ndim = self.batch_dims
        src = [batch_dim(d, ndim, "movedim") for d in int_list(source, "movedim", "source")]
        dst = [batch_dim(d, ndim, "movedim") for d in int_list(destination, "movedim", "destination")]
        if len(src) != len(dst):
            raise InvalidArgumentError(
                f"movedim: source {src} and destination {dst} must have the same number of elements."
            )
        for name, dims in (("source", src), ("destination", dst)):
            if len(set(dims)) != len(dims):
                raise BatchSizeError(f"movedim: repeated dim in {name} {dims}; each dim can move once.")
        rest = iter(d for d in range(ndim) if d not in src)
        placed = dict(zip(dst, src, strict=True))
        return self.permute([placed[i] if i in placed else next(rest) for i in range(ndim)])

    moveaxis = movedim

    # -- expanding and repeating ----------------------------------------------------------------
    def expand(self: T, *shape: Any, **kwargs: Any) -> T:
        """Broadcast the batch dims to ``shape`` (new leading dims, size-1 dims grown); views.

        Args:
            *shape: the new batch size (ints or one sequence; -1 keeps a size); ``size=`` too.

        Returns the expanded tensordict; the new leading dims have no name, and a non-tensor
        value becomes a ``NonTensorStack`` of the new batch, as in the reference.

        Raises:
            BatchSizeError: ``shape`` has fewer dims than the batch, or changes a size that is not 1.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(3), batch_size=[3]).expand(2, 3)["a"].shape
        torch.Size([2, 3])
        """
        new = expanded_shape(int_list(shape_args(shape, kwargs, "size"), "expand", "shape"), self.batch_size, "expand")
        extra = len(new) - self.batch_dims
        names = None if self._names is None else [*[None] * extra, *self.names]
        return self._expand_to(new, names, spread=True)

    def _expand_to(self: T, new: torch.Size, names: list | None, spread: bool) -> T:
        if self._stack_parts() is not None:
            return stack_rules.expand(self, new, names, spread)
        bd = self.batch_dims

        def nested(c: Any) -> Any:
            full = [*new, *c.batch_size[bd:]]
            return c.expand(full) if spread else c.broadcast_to(full)

        return self._rebuild(
            lambda t: t.expand((*new, *t.shape[bd:])), nested, new, names, spread=spread, keep_status=False
        )

    def expand_as(self: T, other: Any) -> T:
        """Broadcast to ``other``: a tensor's shape, or a tensordict's batch size with every leaf
        expanded as the matching leaf of ``other`` (so its extra dims can grow too).

        Raises:
            ArgumentTypeError: ``other`` is neither a tensor nor a tensordict.
            MissingKeyError: an entry of this tensordict that ``other`` lacks.
            BatchSizeError: shapes that cannot be expanded.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(3), batch_size=[3]).expand_as(torch.zeros(2, 3)).batch_size
        torch.Size([2, 3])
        """
        theirs = other if isinstance(other, MoveOps) else inner_collection(other)
        if theirs is None:
            if not isinstance(other, torch.Tensor):
                raise ArgumentTypeError(f"expand_as expects a tensordict or a tensor, got {type(other).__name__}.")
            return self.expand(other.shape)
        if self._stack_parts() is not None:
            return self.to_tensordict().expand_as(theirs)
        target = theirs.batch_size
        new = expanded_shape(list(target), self.batch_size, "expand_as")
        leaves: dict[str, Any] = {}
        for key, value in self._tensordict.items():
            match = theirs.get(key, None)
            if match is None:
                raise MissingKeyError(f"expand_as: the entry {key!r} is missing from the target; add it there first.")
            if isinstance(value, MoveOps):
                leaves[key] = value.expand_as(match)
            elif isinstance(value, torch.Tensor):
                try:
                    leaves[key] = torch.Tensor.as_subclass(value, torch.Tensor).expand_as(match)
                except RuntimeError as exc:
                    raise BatchSizeError(f"expand_as: the entry {key!r} cannot be expanded: {exc}") from None
            else:
                leaves[key] = self.expand(new)._tensordict[key]
        out = type(self)._from_leaves(leaves, new, self._device, None)
        if self._is_locked:
            out.lock_()
        return out

    def broadcast_to(self: T, shape: Sequence[int]) -> T:
        """``expand`` to ``shape``, as ``torch.broadcast_to``; the result has no dim names.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(3), batch_size=[3]).broadcast_to((2, 3)).batch_size
        torch.Size([2, 3])
        """
        new = expanded_shape(int_list(shape, "broadcast_to", "shape"), self.batch_size, "broadcast_to")
        return self._expand_to(new, None, spread=False)

    def repeat(self: T, *repeats: Any, inplace: bool = False) -> T:
        """Tile the batch: batch dim ``i`` is repeated ``repeats[i]`` times (copies, as torch.repeat).

        Args:
            *repeats: one count per batch dim, as ints, one sequence or a tensor.
            inplace: change this tensordict instead of returning a new one.

        Raises:
            InvalidArgumentError: not one count per batch dim.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(2), batch_size=[2]).repeat(3)["a"].tolist()
        [0, 1, 0, 1, 0, 1]
        """
        reps = int_list(shape_args(repeats, {}, "repeats"), "repeat", "repeats")
        ndim = self.batch_dims
        if len(reps) != ndim or any(r < 0 for r in reps):
            raise InvalidArgumentError(
                f"repeat: got {len(reps)} repeats {reps}, but the tensordict has {ndim} batch dims: give one "
                "non-negative count per batch dim."
            )
        if self._stack_parts() is not None:
            if inplace:
                return self._rebind_(None, "repeat")
            return stack_rules.repeat(self, reps)
        new = [s * r for s, r in zip(self.batch_size, reps, strict=True)]
        result = self._rebuild(
            lambda t: t.repeat((*reps, *[1] * (t.dim() - ndim))),
            lambda c: c.repeat(*reps, *[1] * (c.batch_dims - ndim)),
            new,
            self._names_kept(),
            copy=True,
        )
        return self._rebind_(result, "repeat") if inplace else result

    def tile(self: T, dims: int | Sequence[int]) -> T:
        """Tile the batch as ``torch.tile``: fewer counts than batch dims apply to the last dims,
        more add leading dims.  The result has no dim names.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3]).tile((2,)).batch_size
        torch.Size([2, 6])
        """
        reps = int_list(dims, "tile", "dims")
        ndim = self.batch_dims
        out: Any = self
        if len(reps) > ndim:
            for _ in range(len(reps) - ndim):
                out = out.unsqueeze(0)
        reps = [1] * (out.batch_dims - len(reps)) + reps
        out = out.repeat(*reps)
        if out._stack_parts() is None:  # a lazy stack's names are its members': leave them
            out.names = None
        return out

    def repeat_interleave(
        self: T,
        repeats: int | torch.Tensor,
        dim: int | None = None,
        *,
        output_size: int | None = None,
        inplace: bool = False,
    ) -> T:
        """Repeat each element along batch dim ``dim`` (the flattened batch when None).

        Args:
            repeats: one count for every element, or a tensor of one count per element.
            dim: the batch dim (negative counts from the end); None flattens the batch first.
            output_size: the total size along ``dim``, as torch takes it.
            inplace: change this tensordict instead of returning a new one.

        Raises:
            DimensionError: ``dim`` out of range.
            BatchSizeError: a tensor of repeats whose length is not the size of ``dim``.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.arange(2), batch_size=[2]).repeat_interleave(2)["a"].tolist()
        [0, 0, 1, 1]
        """
        ndim = self.batch_dims
        if ndim == 0:
            return self.unsqueeze(0).repeat_interleave(repeats, dim, output_size=output_size)
        if dim is None:
            if inplace:
                raise InvalidArgumentError(
                    "repeat_interleave(inplace=True) needs a dim: without one the batch "
                    "is flattened, which changes its number of dims."
                )
            flat = self.reshape(-1) if ndim > 1 else self
            return flat.repeat_interleave(repeats, 0, output_size=output_size)
        d = batch_dim(dim, ndim, "repeat_interleave")
        size = self.batch_size[d]
        try:
            new_size = interleaved_size(repeats, size, output_size)
        except RuntimeError as exc:
            raise BatchSizeError(f"repeat_interleave: {exc}") from None
        if self._stack_parts() is not None:
            if inplace:
                return self._rebind_(None, "repeat_interleave")
            return stack_rules.repeat_interleave(self, repeats, d)
        new = list(self.batch_size)
        new[d] = new_size
        result = self._rebuild(
            lambda t: t.repeat_interleave(repeats, dim=d, output_size=output_size),
            lambda c: c.repeat_interleave(repeats, d, output_size=output_size),
            new,
            self._names_kept(),
            copy=True,
        )
        return self._rebind_(result, "repeat_interleave") if inplace else result
