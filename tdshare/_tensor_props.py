"""Tensor properties of every tensor collection: gradients (``detach``, ``requires_grad_``, ``data``,
``grad``), dtypes, devices and copies (``to``, ``cpu``, ``cuda``, ``clone``, ``zero_``, ``fill_``)
and memory (``data_ptr``, ``bytes``).  A mixin of
:class:`tdshare._tensordict_base.TensorDictBase`, so a TensorDict, a lazy stack and (through its
forwarding) a tensorclass all get them.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from ._errors import InvalidArgumentError, NotSupportedError
from ._key_ops import is_node, leaves, place
from ._keys import NestedKey, unravel_key
from ._nontensor import NonTensorData

__all__ = ["TensorPropsOps"]

T = TypeVar("T", bound="TensorPropsOps")


def is_leaf_tensor(value: Any) -> bool:
    """Whether ``value`` is a tensor leaf (not a collection that is also a tensor subclass)."""
    return isinstance(value, torch.Tensor) and not is_node(value)


class TensorPropsOps:
    """The tensor-property operations (see the module docstring); the host class provides the accessors."""

    def detach(self: T) -> T:
        """A new collection whose tensors are detached from the autograd graph.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2, requires_grad=True), batch_size=[2]).detach()["a"].requires_grad
        False
        """
        td: Any = self
        return td._map(lambda t: t.detach())

    def detach_(self: T) -> T:
        """Detach every tensor from the autograd graph, in place; return self.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).detach_()["a"].requires_grad
        False
        """
        td: Any = self
        for leaf in td._stored_tensors():
            leaf.detach_()
        return self

    def requires_grad_(self: T, requires_grad: bool = True) -> T:
        """Set ``requires_grad`` on every tensor, in place; return self.

        Raises:
            RuntimeError: from torch, for a tensor that cannot require gradients (integers).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).requires_grad_()["a"].requires_grad
        True
        """
        td: Any = self
        for leaf in td._stored_tensors():
            leaf.requires_grad_(requires_grad)
        return self

    @property
    def data(self) -> Any:
        """A collection of the tensors' ``.data`` (detached views of the same memory); locked as this one is.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2, requires_grad=True), batch_size=[2]).data["a"].requires_grad
        False
        """
        td: Any = self
        out = td._map(lambda t: t.data)
        return out.lock_() if td.is_locked else out

    @property
    def grad(self) -> Any:
        """A collection of the tensors' gradients (tensors without one are left out), or None when none has one.

        >>> from tdshare import TensorDict
        >>> x = torch.ones(2, requires_grad=True)
        >>> x.sum().backward()
        >>> TensorDict(a=x, batch_size=[2]).grad["a"].tolist()
        [1.0, 1.0]
        """
        td: Any = self
        if not any(t.grad is not None for t in td._stored_tensors()):
            return None
        out = td._map(lambda t: t.grad)
        return out.lock_() if td.is_locked else out

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype all tensors share, or None when they differ (or there is none).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2), b=torch.ones(2), batch_size=[2]).dtype
        torch.float32
        """
        dtypes = {t.dtype for _, t in leaves(self) if is_leaf_tensor(t)}
        return dtypes.pop() if len(dtypes) == 1 else None

    def is_floating_point(self) -> bool:
        """Whether every tensor has a floating-point dtype (False when there is none).

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2), batch_size=[2]).is_floating_point()
        True
        """
        tensors = [t for _, t in leaves(self) if is_leaf_tensor(t)]
        return bool(tensors) and all(t.is_floating_point() for t in tensors)

    def to(self: T, *args: Any, inplace: bool = False, **kwargs: Any) -> T:
        """Move to a device and/or cast to a dtype, like ``torch.Tensor.to``.

        ``self`` comes back when nothing changes (same device, no dtype); a consolidated
        tensordict moves as its one storage and stays consolidated. ``inplace=True`` replaces the
        leaves of ``self`` (nested tensordicts keep their identity) and returns ``self``.

        Args:
            *args: what ``torch.Tensor.to`` takes: a device, a dtype, both, or an example tensor;
                or an example tensordict (also as ``other=``): its device, and its leaves' dtype
                when they share one.
            inplace: replace the leaves of ``self`` instead of making a new tensordict.
            **kwargs: ``device=``, ``dtype=``, ``non_blocking=``, as ``torch.Tensor.to`` takes them.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2), batch_size=[2]).to(torch.float64)["a"].dtype
        torch.float64
        """
        self_: Any = self
        other = kwargs.pop("other", args[0] if args and is_node(args[0]) else None)
        if other is not None:  # another tensordict as the example: its device, and its dtype if it has one
            dtypes = {t.dtype for _, t in leaves(other) if isinstance(t, torch.Tensor)}
            args = ()
            kwargs = {"device": other.device, "dtype": dtypes.pop() if len(dtypes) == 1 else None, **kwargs}
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        target = None if device is None else torch.device(device)
        if target is None and dtype is None:
            return self
        if dtype is None and target == self_._device:
            return self
        if inplace:
            return self_._to_inplace(target, dtype, non_blocking)
        if dtype is None and target is not None and self_.is_consolidated():
            return self_._consolidated_to(target, non_blocking)

        def fn(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=target, dtype=dtype, non_blocking=non_blocking)

        out = self_._map(fn, device=target if target is not None else self_._device)
        if self_._is_locked:  # like the reference: a locked tensordict moves to a locked one
            out._propagate(lambda td: setattr(td, "_is_locked", True))
        return out

    def cpu(self: T) -> T:
        """A copy on the cpu (``to("cpu")``); self when its device is already the cpu.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2], device="cpu")
        >>> td.cpu() is td
        True
        """
        return self.to("cpu")

    def clone(self: T, recurse: bool = True) -> T:
        """A copy; with ``recurse=False`` the leaves are shared and only the structure is new.

        Args:
            recurse: copy the tensors too (the default).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.clone()["a"].data_ptr() != td["a"].data_ptr(), td.clone(False)["a"] is td["a"]
        (True, True)
        """
        td: Any = self
        if recurse:
            return td._map(lambda t: torch.Tensor.clone(t))
        return td._map(lambda t: t)

    def zero_(self: T) -> T:
        """Fill every tensor leaf with zeros, in place; return self.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2]).zero_()["a"].tolist()
        [0.0, 0.0]
        """
        td: Any = self
        for leaf in td._stored_tensors():
            leaf.zero_()
        return self

    def fill_(self: T, key: NestedKey, value: float | bool) -> T:
        """Fill the tensor leaf (or every leaf of the nested tensordict) ``key`` with ``value``; return self.

        Args:
            key: the entry to fill.
            value: the number every element gets.

        Raises:
            InvalidArgumentError: ``key`` holds a non-tensor value.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(2), batch_size=[2]).fill_("a", 3)["a"].tolist()
        [3.0, 3.0]
        """
        td: Any = self
        leaf = td._get_leaf(unravel_key(key))
        if is_node(leaf):
            leaf.apply_(lambda t: t.fill_(value))
        elif isinstance(leaf, NonTensorData):
            raise InvalidArgumentError(
                f"fill_ writes a number into tensors, but {key!r} holds a non-tensor value; use set_({key!r}, value)."
            )
        else:
            leaf.fill_(value)
        return self

    def cuda(self: T, device: int | str | torch.device | None = None, **kwargs: Any) -> T:
        """A copy on a CUDA device (``to("cuda")``, or ``to(device)``).

        Raises:
            NotSupportedError: torch has no CUDA device here.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.cuda().device.type if torch.cuda.is_available() else "cuda"
        'cuda'
        """
        if not torch.cuda.is_available():
            raise NotSupportedError("cuda(): torch finds no CUDA device on this machine; keep the tensordict on cpu.")
        if isinstance(device, int):
            device = torch.device("cuda", device)
        td: Any = self
        return td.to(torch.device("cuda") if device is None else torch.device(device), **kwargs)

    def data_ptr(self, *, storage: bool = False) -> Any:
        """A tensordict of batch size ``[]`` with each tensor's data pointer (int64 scalars).

        Args:
            storage: the pointer of each tensor's storage instead of its first element.

        >>> from tdshare import TensorDict
        >>> t = torch.zeros(2)
        >>> TensorDict(a=t, batch_size=[2]).data_ptr()["a"].item() == t.data_ptr()
        True
        """
        td: Any = self
        if td._lazy_members() is not None:
            return td._per_member("data_ptr", storage=storage)
        out = type(td)._from_leaves({}, torch.Size([]), torch.device("cpu"))
        for key, leaf in leaves(td):
            if is_leaf_tensor(leaf):
                ptr = leaf.untyped_storage().data_ptr() if storage else leaf.data_ptr()
                place(out, unravel_key(key), torch.tensor(ptr, dtype=torch.int64))
        return out

    def bytes(self, *, count_duplicates: bool = True) -> int:
        """The number of bytes the tensors (and their gradients) hold.

        Args:
            count_duplicates: count a buffer that several entries share once per entry (``False``: once).

        >>> from tdshare import TensorDict
        >>> t = torch.zeros(4)
        >>> TensorDict(a=t, b=t, batch_size=[4]).bytes(count_duplicates=False)
        16
        """
        seen: set[tuple[int, int]] = set()
        total = 0
        for _, leaf in leaves(self):
            if not is_leaf_tensor(leaf):
                continue
            for part in _buffers(leaf):
                ident = (part.data_ptr(), part.nbytes)
                if count_duplicates or ident not in seen:
                    total += part.nbytes
                seen.add(ident)
        return total


def _buffers(t: torch.Tensor) -> list[torch.Tensor]:
    parts: list[torch.Tensor]
    if t.is_nested:
        parts = [t.values()]
        if t.layout == torch.jagged:
            jagged: Any = t
            parts += [p for p in (jagged.offsets(), jagged.lengths()) if p is not None]
    else:
        parts = [t]
    if t.grad is not None:
        parts += _buffers(t.grad)
    return parts
