"""Locking and shared memory of every tensor collection: ``lock_``, ``unlock_``, ``is_locked``, the
``with td.unlock_():`` block, ``share_memory_`` and ``is_shared``.  A mixin of
:class:`tdshare._tensordict_base.TensorDictBase`; the host class provides ``_propagate`` (apply a
function to every level of the tree) and the state attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import MemmapError
from ._private_compat import forget_lock_parents, record_lock_parents
from ._unbatched import share_unbatched

__all__ = ["LockOps"]

T = TypeVar("T", bound="LockOps")


class LockOps:
    """Locking and shared memory (see the module docstring)."""

    _is_locked: bool
    _is_memmap: bool
    _is_shared: bool
    _last_op: list[Any]
    _op_queue: list[Any]

    if TYPE_CHECKING:  # provided by the host class

        def _propagate(self, fn: Callable[[Any], None]) -> None: ...
        def _stored_tensors(self) -> Any: ...

    # -- locking ------------------------------------------------------------------------------
    @property
    def is_locked(self) -> bool:
        """Whether structural changes are refused (see :meth:`lock_`).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2))
        >>> td.is_locked, td.lock_().is_locked, td.unlock_().is_locked
        (False, True, False)
        """
        return bool(self._is_locked)

    def lock_(self: T) -> T:
        """Refuse structural changes (add, remove, replace) from now on; in-place writes still work.

        Nested tensordicts are locked too; a structural change raises :class:`LockedError` (a
        ``RuntimeError``).

        Returns:
            ``self``.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)}, batch_size=[2]).lock_()
        >>> td["c"] = torch.ones(2)
        Traceback (most recent call last):
        tdshare.LockedError: Cannot modify locked TensorDict...
        >>> td["n"].is_locked, td["a"].add_(1).tolist()  # in place: allowed
        (True, [1.0, 1.0])
        """
        changed = not self._is_locked
        self._propagate(lambda td: setattr(td, "_is_locked", True))
        self._propagate(lambda td: record_lock_parents(td, td._propagate))  # each level: all its ancestors
        self._last_op[:] = ["lock_" if changed else None]
        return self

    def unlock_(self: T) -> T:
        """Allow structural changes again; a memory-mapped or shared tensordict stops being one.

        Returns:
            ``self``.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2)).memmap_()
        >>> td.unlock_()["b"] = torch.ones(2)
        >>> td.is_locked, td.is_memmap(), sorted(td.keys())
        (False, False, ['a', 'b'])
        """

        def _unlock(td: Any) -> None:
            td._is_locked = False
            td._is_memmap = False
            td._is_shared = False
            forget_lock_parents(td)

        changed = self._is_locked
        self._propagate(_unlock)
        self._last_op[:] = ["unlock_" if changed else None]
        return self

    def __enter__(self: T) -> T:
        op = self._last_op.pop() if self._last_op else None
        enter = getattr(op, "enter", None)
        if enter is not None:  # a write-back (see tdshare._write_back): notes the leaves the block starts from
            enter()
        self._op_queue.append(op)
        return self

    def __exit__(self, *exc: object) -> None:
        """Undo the ``lock_()``/``unlock_()`` that opened the block, if it changed the state."""
        op = self._op_queue.pop() if self._op_queue else None
        if op == "unlock_":
            self.lock_()
        elif op == "lock_":
            self.unlock_()
        elif callable(op):  # an undo action (e.g. to_module's swap puts the old values back)
            op()
        self._last_op.clear()

    # -- shared memory ------------------------------------------------------------------------
    def share_memory_(self: T) -> T:
        """Move every leaf to shared memory (in place) and lock the tensordict.

        Returns:
            ``self``.

        Raises:
            MemmapError: the tensordict is memory-mapped (a ``RuntimeError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2)).share_memory_()
        >>> td.is_shared(), td["a"].is_shared(), td.is_locked
        (True, True, True)
        """
        if self._is_memmap:
            raise MemmapError("memmap and shared memory are mutually exclusive features.")
        for leaf in self._stored_tensors():
            leaf.share_memory_()
        share_unbatched(self)
        self._propagate(lambda td: setattr(td, "_is_shared", True))
        return self.lock_()

    def is_shared(self) -> bool:
        """Whether the leaves are in shared memory (``share_memory_()`` was called).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2))
        >>> td.is_shared(), td.share_memory_().is_shared(), td.unlock_().is_shared()
        (False, True, False)
        """
        return self._is_shared
