"""The ``dict`` and autograd conveniences of the reference's surface, as a mixin of
:class:`~tdshare.TensorDictBase`: :meth:`popitem`, :meth:`clear`, :meth:`replace`,
:meth:`create_nested`, :meth:`entry_class`, :meth:`filter_non_tensor_data`, :meth:`numpy`,
:meth:`type`, :meth:`copy_at_`, :meth:`ndimension`, :attr:`requires_grad` and :meth:`zero_grad`.

Each is written with the collection's public operations (``keys``, ``pop``, ``set``, ``get``,
``exclude``, ``update_at_``, ...), so every container kind (a ``TensorDict``, a lazy stack, a
tensorclass through its tensordict) has them from this one place.
"""

from __future__ import annotations

import builtins
from typing import Any, TypeVar

import torch

from ._errors import ArgumentTypeError, MissingKeyError, NotSupportedError
from ._format import VALUE, VALUE_STACK
from ._key_ops import tensor_entries
from ._keys import unravel_key
from ._nodes import kind_of

__all__ = ["DictOps"]

T = TypeVar("T", bound="DictOps")


def _is_collection(value: Any) -> bool:
    return isinstance(value, DictOps)


def _leaves(node: Any) -> list[torch.Tensor]:
    return [v for v in node.values(True, True) if isinstance(v, torch.Tensor)]


def _plain(value: Any) -> Any:
    """A non-tensor entry's value (a ``NonTensorData``'s data, a ``NonTensorStack``'s list)."""
    kind = kind_of(value)
    if kind is not None and kind.layout == VALUE_STACK:
        return value.tolist()
    if kind is not None and kind.layout == VALUE:
        return value.data
    return value


class DictOps:
    """``dict``-like and autograd conveniences shared by every container kind."""

    def popitem(self) -> tuple[str, Any]:
        """Remove the last top-level entry and return it as ``(key, value)``, as ``dict.popitem``.

        Returns:
            The key and the entry (a tensor, a nested tensordict, a non-tensor entry).

        Raises:
            MissingKeyError: the tensordict has no entries (a ``KeyError``).
            LockedError: the tensordict is locked (a ``RuntimeError``).

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), b=torch.ones(2), batch_size=[2])
        >>> key, value = td.popitem()
        >>> key, value.tolist(), list(td.keys())
        ('b', [1.0, 1.0], ['a'])
        """
        node: Any = self
        keys = list(node.keys())
        if not keys:
            raise MissingKeyError(f"popitem(): the {type(self).__name__} is empty.")
        key = keys[-1]
        return key, node.pop(key)

    def clear(self: T) -> T:
        """Remove every entry (the batch size, device and names stay) and return ``self``.

        Raises:
            LockedError: the tensordict is locked; nothing is removed.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)}, batch_size=[2])
        >>> td.clear() is td, list(td.keys()), td.batch_size
        (True, [], torch.Size([2]))
        """
        node: Any = self
        for key in list(node.keys()):
            del node[key]
        return self

    def replace(self: T, *args: Any, **kwargs: Any) -> T:
        """A shallow copy with some entries replaced: ``self`` is not changed.

        Args:
            *args: at most one mapping of keys (strings or tuples) to new entries.
            **kwargs: more entries, by key.

        Returns:
            A copy (its nested tensordicts copied too, the leaves shared) with the entries set.

        Raises:
            ArgumentTypeError: more than one positional argument, or one that is not a mapping.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), b=torch.zeros(2), batch_size=[2])
        >>> new = td.replace(a=torch.ones(2))
        >>> new["a"].tolist(), td["a"].tolist(), new["b"] is td["b"]
        ([1.0, 1.0], [0.0, 0.0], True)
        """
        if len(args) > 1 or (args and not hasattr(args[0], "items")):
            raise ArgumentTypeError(
                "replace() takes one mapping of keys to new entries and/or keyword arguments, got "
                f"{len(args)} positional argument(s){'' if not args else ' of type ' + type(args[0]).__name__}."
            )
        node: Any = self
        out = node.clone(False)
        if out.is_locked:
            out.unlock_()
        for key, value in [*(args[0].items() if args else ()), *kwargs.items()]:
            out.set(key, value)
        if node.is_locked:
            out.lock_()
        return out

    def create_nested(self: T, key: Any) -> T:
        """Add an empty nested tensordict at ``key``, with this one's batch size and device; returns ``self``.

        Args:
            key: a string or a tuple (the levels before the last must exist).

        Raises:
            LockedError: the tensordict is locked.
            KeyError: the key exists already, or a level before it is missing.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.create_nested("n") is td, td["n"].batch_size, list(td["n"].keys())
        (True, torch.Size([2]), [])
        """
        node: Any = self
        node.set(key, node._level_class()({}, batch_size=node.batch_size, device=node.device))
        return self

    def entry_class(self, key: Any) -> builtins.type:
        """The class of the entry at ``key``: ``torch.Tensor`` (or its subclass, such as
        ``MemoryMappedTensor``), a tensordict class, ``NonTensorData``, ``NonTensorStack``.

        Raises:
            MissingKeyError: no entry at ``key``.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)}, batch_size=[2])
        >>> td.entry_class("a").__name__, td.entry_class("n").__name__
        ('Tensor', 'TensorDict')
        """
        return type(self.get(key))  # type: ignore[attr-defined]

    def filter_non_tensor_data(self: T) -> T:
        """A copy without the non-tensor entries, at every level (the nested tensordicts stay).

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), n={"s": "text", "b": torch.zeros(2)}, batch_size=[2])
        >>> sorted(map(str, td.filter_non_tensor_data().keys(True, True)))
        ["('n', 'b')", 'a']
        """
        node: Any = self
        drop = [k for k in node.keys(True, True) if not isinstance(node.get(k), torch.Tensor | DictOps)]
        return node.exclude(*drop)

    def numpy(self) -> dict[str, Any]:
        """The entries as a nested ``dict`` of NumPy arrays (non-tensor entries as their values).

        Each array is ``tensor.detach().cpu().numpy()``: it shares memory with a CPU leaf.

        >>> import torch, tdshare
        >>> tdshare.TensorDict(a=torch.zeros(2), n={"s": "text"}, batch_size=[2]).numpy()
        {'a': array([0., 0.], dtype=float32), 'n': {'s': 'text'}}
        """
        node: Any = self
        out: dict[str, Any] = {}
        for key in node.keys():
            value = node.get(key)
            if isinstance(value, torch.Tensor):
                out[key] = value.detach().cpu().numpy()
            elif _is_collection(value):
                out[key] = value.numpy()
            else:
                out[key] = _plain(value)
        return out

    def type(self: T, dst_type: torch.dtype, *, cast_filter: Any = None) -> T:
        """A copy with the tensor leaves cast to ``dst_type`` (as ``Tensor.type``).

        Args:
            dst_type: the dtype.
            cast_filter: called with each leaf: only the leaves it returns true for are cast.

        >>> import torch, tdshare
        >>> tdshare.TensorDict(a=torch.zeros(2), batch_size=[2]).type(torch.float64)["a"].dtype
        torch.float64
        """
        node: Any = self
        if cast_filter is None:
            return node._map(lambda t: t.to(dst_type))
        return node._map(lambda t: t.to(dst_type) if cast_filter(t) else t)

    def copy_at_(self: T, tensordict: Any, idx: Any, non_blocking: bool = False, *, fast: bool = True) -> T:
        """Copy ``tensordict`` into ``self[idx]`` in place and return ``self`` (``update_at_``).

        Args:
            tensordict: the values, shaped like ``self[idx]``.
            idx: the index.
            non_blocking: as for ``Tensor.copy_``.
            fast: accepted for the reference's signature.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> td.copy_at_(tdshare.TensorDict(a=torch.tensor(7.0)), 1)["a"].tolist()
        [0.0, 7.0, 0.0]
        """
        return self.update_at_(tensordict, idx, non_blocking=non_blocking)  # type: ignore[attr-defined]

    def ndimension(self) -> int:
        """The number of batch dimensions (``batch_dims``), as ``Tensor.ndimension``.

        >>> import torch, tdshare
        >>> tdshare.TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3]).ndimension()
        2
        """
        return int(self.batch_dims)  # type: ignore[attr-defined]

    @property
    def requires_grad(self) -> bool:
        """Whether any tensor leaf requires grad.

        >>> import torch, tdshare
        >>> tdshare.TensorDict(a=torch.zeros(2, requires_grad=True), batch_size=[2]).requires_grad
        True
        """
        return any(t.requires_grad for t in _leaves(self))

    def zero_grad(self: T, set_to_none: bool = True) -> T:
        """Reset the ``.grad`` of every tensor leaf (to None, or to zeros in place), and return ``self``.

        Args:
            set_to_none: drop the gradients (True) or fill them with zeros.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2, requires_grad=True), batch_size=[2])
        >>> (td["a"] * 2).sum().backward()
        >>> td.zero_grad(set_to_none=False)["a"].grad.tolist(), td.zero_grad()["a"].grad
        ([0.0, 0.0], None)
        """
        for leaf in _leaves(self):
            if leaf.grad is None:
                continue
            if set_to_none:
                leaf.grad = None
            else:
                leaf.grad.detach_().zero_()
        return self

    def stack_tensors(self: T, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False) -> T:
        """Stack the entries ``keys`` into the new entry ``out_key`` (``torch.stack``), removing them
        unless ``keep_entries``; return ``self``.

        Args:
            *keys: the tensor entries to stack (nested keys too).
            out_key: the key of the result.
            dim: the new dim, counted in the result's dims (beyond the batch dims counts too:
                ``-1`` is the last).
            keep_entries: keep the entries of ``keys`` (by default they are removed once the result
                is written; if the stack or the write fails every entry is kept as it was).

        Raises:
            MissingKeyError: a key that is not there.
            LockedError: a locked tensordict.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2), b=torch.ones(2), batch_size=[2])
        >>> td.stack_tensors("a", "b", out_key="ab", dim=-1)["ab"].tolist(), sorted(td.keys())
        ([[0.0, 1.0], [0.0, 1.0]], ['ab'])
        """
        return self._join_entries(torch.stack, keys, out_key, dim, keep_entries)

    def cat_tensors(self: T, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False) -> T:
        """Concatenate the entries ``keys`` into the new entry ``out_key`` (``torch.cat``), removing
        them unless ``keep_entries``; return ``self``.

        Args:
            *keys: the tensor entries to concatenate (nested keys too).
            out_key: the key of the result.
            dim: the dim to concatenate along, counted in the entries' dims.
            keep_entries: keep the entries of ``keys`` (see :meth:`stack_tensors`).

        Raises:
            MissingKeyError: a key that is not there.
            BatchSizeError: a result whose leading dims are not the batch size (``dim`` inside it).

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(2, 1), b=torch.ones(2, 2), batch_size=[2])
        >>> td.cat_tensors("a", "b", out_key="ab", dim=-1, keep_entries=True)["ab"].tolist(), len(td.keys())
        ([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]], 3)
        """
        return self._join_entries(torch.cat, keys, out_key, dim, keep_entries)

    def _join_entries(self: T, join: Any, keys: tuple[Any, ...], out_key: Any, dim: int, keep: bool) -> T:
        node: Any = self
        joined = join([node[k] for k in keys], dim)  # a missing key raises before anything changes
        node.set(out_key, joined)
        if not keep:
            written = unravel_key(out_key)
            for key in keys:
                if unravel_key(key) != written:
                    node.del_(key)
        return self

    def filter_empty_(self: T) -> T:
        """Remove, in place, the nested tensordicts that hold no leaf (also those holding only empty
        ones), and return ``self``.

        Raises:
            LockedError: a locked tensordict with an empty nested one to remove.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(3), b={}, c={"d": {}}, batch_size=[3])
        >>> sorted(td.filter_empty_().keys())
        ['a']
        """
        node: Any = self
        for key in list(node.keys()):
            value = node.get(key)
            if _is_collection(value):
                value.filter_empty_()
                if not any(True for _ in value.keys(True, True)):
                    node.del_(key)
        return self

    def as_tensor(self: T) -> T:
        """A tensordict whose leaves are converted with their own ``as_tensor()`` where they have one
        (no tensor type has it, so the leaves are the same: ``MemoryMappedTensor`` ones included);
        locked when ``self`` is.

        >>> import torch, tdshare
        >>> td = tdshare.TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> td.as_tensor()["a"] is td["a"]
        True
        """
        node: Any = self
        return node.apply(lambda t: t.as_tensor() if hasattr(t, "as_tensor") else t, propagate_lock=True)

    def backward(
        self,
        gradient: Any = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        inputs: Any = None,
    ) -> None:
        """Back-propagate from every leaf that requires grad, in one ``torch.autograd.backward`` call.

        Without ``gradient`` each such leaf must have one element (its gradient is 1), so
        ``losses.backward()`` is ``losses.sum(reduce=True).backward()``.

        Args:
            gradient: a tensordict of the leaves' gradients, under the same keys.
            retain_graph: keep the graph (None: as ``create_graph``).
            create_graph: build the graph of the derivative.
            inputs: a tensordict or sequence of the tensors whose ``.grad`` receives gradients.

        Raises:
            NotSupportedError: no leaf requires grad, or a leaf of more than one element without
                ``gradient`` (a ``RuntimeError``).
            MissingKeyError: ``gradient`` lacks the key of a leaf that requires grad.

        >>> import torch, tdshare
        >>> x = torch.ones(3, requires_grad=True)
        >>> tdshare.TensorDict(actor=x.sum(), critic=x.pow(2).sum()).backward()
        >>> x.grad.tolist()
        [3.0, 3.0, 3.0]
        """
        graded = {k: t for k, t in tensor_entries(self).items() if t.requires_grad}
        if not graded:
            raise NotSupportedError("backward(): no leaf of the tensordict requires grad.")
        keys, tensors = list(graded), list(graded.values())
        grads: list[torch.Tensor] | None = None
        if gradient is None:
            big = [k for k, t in zip(keys, tensors, strict=True) if t.numel() != 1]
            if big:
                raise NotSupportedError(
                    f"backward() without a gradient needs single-element leaves; {big} have more elements: pass "
                    "gradient= (a tensordict of their gradients), or reduce them first (td.sum(reduce=True))."
                )
        else:
            lacking = [k for k in keys if gradient.get(k, None) is None]
            if lacking:
                raise MissingKeyError(f"backward(gradient=): the gradient lacks the leaves {lacking}.")
            grads = [gradient.get(k) for k in keys]
        if inputs is not None and _is_collection(inputs):
            inputs = _leaves(inputs)
        torch.autograd.backward(tensors, grads, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)
