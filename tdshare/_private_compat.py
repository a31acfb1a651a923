"""Private names of the reference that code written against it reads, given tdshare's behaviour.

``_has_names()``: whether any batch dimension is named.

``_fast_apply(fn, *others, named=, nested_keys=, ...)``: :meth:`apply` / :meth:`named_apply`.

``_has_non_tensor``: whether a non-tensor entry sits in the tree; ``_check_device()``: every leaf
on the tensordict's device.

``_lock_parents_weakrefs``: which locked ancestors hold a nested collection locked.

``_check_batch_size()``: every entry starts with the batch dimensions (raises otherwise).

``_values_list(include_nested, leaves_only)``: the values of ``values(...)`` as a list.

``_sync_all()``: wait for the copies queued on the accelerators (after ``non_blocking`` moves).

When a tensordict is locked (``lock_()``, ``memmap_()``, ``share_memory_()``, or rebuilt locked in
another process), every collection nested in it records a weak reference to it: a nested
tensordict that is locked *because its parent is* can tell so, while the tensordict that was
locked itself holds no such reference.  ``unlock_()`` forgets them.  The references are weak, so
a nested tensordict never keeps its parent alive.

The list is read as ``td._lock_parents_weakrefs`` (the reference's private name, mirrored for code
written against it); a lazy stack built on the fly (a nested entry read from a lazy stack) answers
with its members' references.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ._errors import BatchSizeError, DeviceError
from ._nontensor import NonTensorData

__all__ = ["PrivateCompatOps", "forget_lock_parents", "note_lock_parent", "record_lock_parents"]

_ATTR = "_lock_parent_refs"


def _refs_of(node: Any) -> list[weakref.ref]:
    refs = node.__dict__.get(_ATTR)
    if refs is None:
        refs = []
        node.__dict__[_ATTR] = refs
    return refs


def record_lock_parents(root: Any, propagate: Callable[[Callable[[Any], None]], None]) -> None:
    """Give every collection under ``root`` (not ``root`` itself) a weak reference to ``root``.

    Args:
        root: the collection being locked.
        propagate: ``root._propagate``: calls its argument on ``root`` and every nested collection.
    """

    root_ref = weakref.ref(root)

    def mark(node: Any) -> None:
        if node is root:
            return
        refs = node.__dict__.get(_ATTR)
        if refs is None:  # the common case (a tree just rebuilt or locked for the first time)
            node.__dict__[_ATTR] = [root_ref]
        elif not any(ref() is root for ref in refs):
            refs.append(root_ref)

    propagate(mark)


def note_lock_parent(parent: Any, values: Iterable[Any]) -> None:
    """Give each collection among ``values`` (the new children of a locked ``parent`` made by
    indexing it) a weak reference to ``parent``; one level only, as each level is indexed apart."""
    ref: weakref.ref | None = None
    for value in values:
        if hasattr(value, "_lazy_members"):  # a nested collection (tensors and values have no members)
            if ref is None:
                ref = weakref.ref(parent)
            _refs_of(value).append(ref)


def forget_lock_parents(node: Any) -> None:
    """Drop the references ``node`` holds to the ancestors that locked it (it is being unlocked)."""
    node.__dict__.pop(_ATTR, None)


class PrivateCompatOps:
    """``_has_names()``, ``_lock_parents_weakrefs``, ``_check_batch_size()`` and ``_values_list()``
    on every collection."""

    def _check_batch_size(self) -> None:
        """Check that every entry, nested ones included, starts with its level's batch dimensions.

        Raises:
            BatchSizeError: an entry whose leading dimensions are not the batch size (names it).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(3, 2), n={"b": torch.zeros(3, 4)}, batch_size=[3])._check_batch_size()
        """
        host: Any = self
        batch_size = host.batch_size
        for key, value in host.items():
            if isinstance(value, NonTensorData):  # one value (or one per element) over the batch
                continue
            shape = getattr(value, "batch_size", None)
            if shape is None:
                shape = getattr(value, "shape", None)
            if shape is None:  # a plain value (a non-tensor entry read as its data)
                continue
            if tuple(shape[: len(batch_size)]) != tuple(batch_size):
                raise BatchSizeError(
                    f"_check_batch_size: entry {key!r} has shape {list(shape)}, which does not start with the "
                    f"batch size {list(batch_size)}; set a batch size that every entry starts with."
                )
            check = getattr(value, "_check_batch_size", None)
            if check is not None:
                check()

    def _sync_all(self) -> None:
        """Wait until the copies queued on CUDA (and MPS) are done, as after ``to(device, non_blocking=True)``.

        Nothing to wait for on a machine without an initialised accelerator; tdshare's own copies
        between cpu tensors are synchronous.

        >>> from tdshare import TensorDict
        >>> TensorDict()._sync_all()
        """
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        mps = getattr(torch, "mps", None)
        if mps is not None and torch.backends.mps.is_available():
            mps.synchronize()

    def _values_list(self, include_nested: bool = False, leaves_only: bool = False, **kwargs: Any) -> list[Any]:
        """The values of ``values(include_nested, leaves_only, **kwargs)`` but the non-tensor ones, as a list.

        Args:
            include_nested: also the values of nested collections.
            leaves_only: only the leaves (no nested collections).
            kwargs: the other keywords of ``values()`` (``is_leaf``...).

        Returns:
            The list of values, in key order (a tensor entered under two keys appears twice; the
            non-tensor entries are left out, as in the reference).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> len(TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)})._values_list(True, True))
        2
        """
        host: Any = self
        return [v for v in host.values(include_nested, leaves_only, **kwargs) if not isinstance(v, NonTensorData)]

    def _fast_apply(
        self,
        fn: Callable[..., Any],
        *others: Any,
        named: bool = False,
        nested_keys: bool = False,
        filter_empty: bool | None = False,
        num_threads: int = 0,
        checked: bool = True,
        **kwargs: Any,
    ) -> Any:
        """The reference's private ``_fast_apply``: :meth:`apply` (``named=True``: :meth:`named_apply`,
        with ``nested_keys``), its ``filter_empty`` off by default; ``num_threads`` and ``checked``
        are accepted.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.ones(2), batch_size=[2])._fast_apply(lambda t: t * 3)["a"].tolist()
        [3.0, 3.0]
        """
        del num_threads, checked  # one thread; the results are always checked
        host: Any = self
        if named:
            return host.named_apply(fn, *others, nested_keys=nested_keys, filter_empty=filter_empty, **kwargs)
        return host.apply(fn, *others, filter_empty=filter_empty, **kwargs)

    @property
    def _has_non_tensor(self) -> bool:
        """Whether a non-tensor entry sits anywhere in the tree (the reference's private flag).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(1), n=TensorDict(s="x"))._has_non_tensor
        True
        """
        host: Any = self
        return any(isinstance(v, NonTensorData) for v in host.values(True, True))

    def _check_device(self, *, raise_exception: bool = True) -> bool:
        """Whether every leaf is on the tensordict's device (always, when it has none); else raise
        a ``RuntimeError`` naming both devices, or return False without ``raise_exception``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(1), device="cpu")._check_device()
        True
        """
        host: Any = self
        device = host.device
        if device is None:
            return True
        for value in host.values(True, True):
            where = getattr(value, "device", None)
            if isinstance(value, torch.Tensor) and where != device:
                if raise_exception:
                    raise DeviceError(f"devices are incongruent, got value with device {where}, -- expected {device}.")
                return False
        return True

    def _has_names(self) -> bool:
        """Whether any batch dimension has a name (``td.names`` holds something else than None).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> TensorDict(batch_size=[2])._has_names(), TensorDict(batch_size=[2], names=["t"])._has_names()
        (False, True)
        """
        names: list[Any] = list(getattr(self, "names", None) or ())
        return any(n is not None for n in names)

    @property
    def _lock_parents_weakrefs(self) -> list[weakref.ref]:
        """The live weak references to the locked ancestors that locked this collection.

        Empty for a collection that is not nested in a locked one (a root locked itself).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(sub=TensorDict(x=torch.zeros(2), batch_size=[2]), batch_size=[2]).lock_()
        >>> len(td["sub"]._lock_parents_weakrefs), len(td._lock_parents_weakrefs)
        (1, 0)
        """
        refs = [ref for ref in self.__dict__.get(_ATTR, ()) if ref() is not None]
        if refs:
            return refs
        lazy_members = getattr(self, "_lazy_members", None)
        members = lazy_members() if lazy_members is not None else None
        if members:  # a lazy stack read from a lazy stack: its members know their parents
            return [ref for member in members for ref in member._lock_parents_weakrefs if ref() is not self]
        return []
