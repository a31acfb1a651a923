"""Private names of the reference that code written against it reads, given tdshare's behaviour.

``_has_names()``: whether any batch dimension is named.

``_lock_parents_weakrefs``: which locked ancestors hold a nested collection locked.

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
    """``_has_names()`` and ``_lock_parents_weakrefs`` on every collection."""

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
