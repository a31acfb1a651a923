"""Sub-tensordict views that write new entries through to their parent, as the reference's
``_SubTensorDict`` does.

``td._get_sub_tensordict(idx)`` gives a tensordict of views of ``td``'s leaves at ``idx``, marked
here with its parent and index.  A new key set on the view is added to the parent (zeros in the
rows the view does not cover, as ``td[idx] = other`` adds one) and the view holds a view of it, so
the parent sees the write; a key added to the parent later is read through the view too.
Replacing an existing entry of the view with ``set()`` is refused (``set_()`` writes into it in
place).  ``get_parent_tensordict()`` returns the parent.
"""

from __future__ import annotations

from typing import Any

from ._errors import LockedError, NotSupportedError

__all__ = ["SubViewOps", "is_sub_view", "mark_sub_view", "pull_from_parent", "sub_view_entry"]

_ATTR = "_sub_view_parent"


def mark_sub_view(view: Any, parent: Any, idx: Any) -> Any:
    """Record that ``view`` is ``parent`` at ``idx`` (new keys set on it reach the parent); return it."""
    view.__dict__[_ATTR] = (parent, idx)
    return view


def is_sub_view(td: Any) -> bool:
    """Whether ``td`` is a sub-tensordict view (``parent._get_sub_tensordict(idx)``)."""
    return _ATTR in getattr(td, "__dict__", {})


def sub_view_entry(view: Any, key: str, value: Any) -> Any:
    """The value ``view`` stores for its top-level ``key`` set to ``value``.

    A plain tensordict stores ``value`` as is.  A sub-tensordict view adds ``key`` to its parent,
    writes ``value`` into the rows at its index, and stores the parent's entry at that index.

    Raises:
        LockedError: ``key`` already is an entry of the sub-tensordict view (use ``set_``).
    """
    record = view.__dict__.get(_ATTR)
    if record is None:
        return value
    if key in view._tensordict:
        raise LockedError(
            f"set({key!r}, ...) on a sub-tensordict (a view of its parent's rows) is prohibited for existing "
            f"tensors: write into the entry with set_({key!r}, value), or clone the sub-tensordict first."
        )
    parent, idx = record
    if key not in parent._tensordict:
        parent._add_for_index(key, idx, value)
    parent._assign_at(key, idx, value)
    return parent._tensordict[key][idx]


def pull_from_parent(view: Any, key: str) -> bool:
    """For a sub-tensordict view that lacks ``key``: take the parent's entry ``key`` at the view's
    index, if the parent has one (added after the view was made); whether it did."""
    record = view.__dict__.get(_ATTR)
    if record is None:
        return False
    parent, idx = record
    entry = parent._get_leaf((key,), None)
    if entry is None:
        return False
    view._tensordict[key] = entry[idx]
    return True


class SubViewOps:
    """``_get_sub_tensordict(idx)`` and the ``get_parent_tensordict()`` of its views."""

    def _get_sub_tensordict(self, idx: Any) -> Any:
        """A view of the rows at ``idx`` whose in-place writes land in this collection's memory.

        The reference's sub-tensordict: ``sub.set_(key, value)``, ``sub.update_(other)`` and
        ``sub[i] = value`` write into this collection, here or, when it is shared or memory-mapped,
        from another process that received ``sub``.

        Args:
            idx: integers, slices, Ellipsis and None (indices that give views).

        Returns:
            The view (a member itself for an integer at a lazy stack's stack dimension).

        Raises:
            NotSupportedError: an index tensor, list or mask (these give copies, not views).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(x=torch.zeros(2, 3), batch_size=[2, 3])
        >>> sub = td._get_sub_tensordict(1)
        >>> _ = sub.set_("x", torch.ones(3))
        >>> td["x"][1].tolist()
        [1.0, 1.0, 1.0]
        """
        parts = idx if isinstance(idx, tuple) else (idx,)
        for part in parts:
            if isinstance(part, bool) or not (part is None or part is Ellipsis or isinstance(part, (int, slice))):
                raise NotSupportedError(
                    f"_get_sub_tensordict({idx!r}): only integers, slices, Ellipsis and None give a view that "
                    "writes into this tensordict; index with td[idx] for a copy."
                )
        host: Any = self
        view = host[idx]
        members = host._lazy_members()
        if members is not None and any(view is m for m in members):
            return view  # a lazy stack's member itself
        return mark_sub_view(view, self, idx)

    def get_parent_tensordict(self) -> Any:
        """The tensordict this sub-tensordict view was made from (``parent._get_sub_tensordict(idx)``).

        Returns:
            The parent tensordict.

        Raises:
            NotSupportedError: this tensordict is not a sub-tensordict view.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3, 2), batch_size=[3])
        >>> td._get_sub_tensordict(1).get_parent_tensordict() is td
        True
        """
        record = self.__dict__.get(_ATTR)
        if record is None:
            raise NotSupportedError(
                "get_parent_tensordict(): this tensordict is not a sub-tensordict view; make one with "
                "td._get_sub_tensordict(idx)."
            )
        return record[0]
