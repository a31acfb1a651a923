"""The batch and locking state of a tensorclass instance: :class:`TensorClassState`.

Batch size, names, device and dimensions, locking, and shared memory, each read from (or set on)
the instance's one tensordict, ``_tensordict``.  A base of
:class:`tdshare._tensorclass_ops.TensorClassOps`, whose methods :func:`tdshare.tensorclass` copies
onto the class it decorates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ._tensordict_base import device_set_refused

if TYPE_CHECKING:
    from ._tensordict import TensorDict

__all__ = ["TensorClassState"]

T = TypeVar("T", bound="TensorClassState")


class TensorClassState:
    """Batch, locking and shared-memory state, read from the instance's tensordict."""

    _tensordict: TensorDict

    # -- batch --------------------------------------------------------------------------------
    @property
    def batch_size(self) -> torch.Size:
        """The batch size (settable, like a TensorDict's).

        Setting it checks every field against it (a ``BatchSizeError``, a ``RuntimeError``, on a
        mismatch).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2, 3), batch_size=[2])
        >>> obs.batch_size = [2, 3]
        >>> obs.batch_size, obs[0].batch_size
        (torch.Size([2, 3]), torch.Size([3]))
        """
        return self._tensordict.batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        self._tensordict.batch_size = value

    @property
    def shape(self) -> torch.Size:
        """The batch size (the same as :attr:`batch_size`).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> Obs(x=torch.zeros(2, 3), batch_size=[2]).shape
        torch.Size([2])
        """
        return self._tensordict.batch_size

    @property
    def names(self) -> list:
        """The names of the batch dimensions (settable; None for an unnamed dimension).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2, 3), batch_size=[2])
        >>> before = obs.names
        >>> obs.names = ["time"]
        >>> before, obs.names
        ([None], ['time'])
        """
        return self._tensordict.names

    @names.setter
    def names(self, value: Any) -> None:
        self._tensordict.names = value

    @property
    def device(self) -> torch.device | None:
        """The device of the fields (None: mixed or unset).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> Obs(x=torch.zeros(2), batch_size=[2]).device, Obs(x=torch.zeros(2), batch_size=[2], device="cpu").device
        (None, device(type='cpu'))
        """
        return self._tensordict.device

    @device.setter
    def device(self, value: Any) -> None:
        raise device_set_refused("tensorclass")

    @property
    def batch_dims(self) -> int:
        """The number of batch dimensions (``ndim`` is the same).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2, 3, 4), batch_size=[2, 3])
        >>> obs.batch_dims, obs.ndim, obs.x.dim()
        (2, 2, 3)
        """
        return self._tensordict.batch_dims

    ndim = batch_dims

    def dim(self) -> int:
        """The number of batch dimensions (as :attr:`batch_dims`).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> Obs(x=torch.zeros(2, 3, 4), batch_size=[2]).dim()
        1
        """
        return self._tensordict.batch_dims

    def numel(self) -> int:
        """The number of elements of the batch (the product of the batch size).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> Obs(x=torch.zeros(2, 3, 4), batch_size=[2, 3]).numel()
        6
        """
        return self._tensordict.numel()

    def __len__(self) -> int:
        return len(self._tensordict)

    # -- locking and shared memory ------------------------------------------------------------
    @property
    def is_locked(self) -> bool:
        """Whether structural changes (setting a field) are refused.

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2), batch_size=[2])
        >>> obs.is_locked, obs.lock_().is_locked
        (False, True)
        """
        return self._tensordict.is_locked

    @property
    def _lock_parents_weakrefs(self) -> list[Any]:
        """Weak references to the locked collections this instance is nested in (its tensordict's)."""
        return self._tensordict._lock_parents_weakrefs

    def lock_(self: T) -> T:
        """Refuse setting fields from now on (in-place writes still work); return ``self``.

        Setting a field afterwards raises :class:`LockedError` (a ``RuntimeError``).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2), batch_size=[2]).lock_()
        >>> _ = obs.x.add_(1)  # in place: allowed
        >>> obs.x.tolist(), obs.is_locked
        ([1.0, 1.0], True)
        """
        self._tensordict.lock_()
        return self

    def unlock_(self: T) -> T:
        """Allow setting fields again (a memory-mapped instance stops being one); return ``self``.

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2), batch_size=[2]).lock_()
        >>> obs.unlock_().x = torch.ones(2)
        >>> obs.is_locked, obs.x.tolist()
        (False, [1.0, 1.0])
        """
        self._tensordict.unlock_()
        return self

    def __enter__(self: T) -> T:
        self._tensordict.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._tensordict.__exit__(*exc)

    def share_memory_(self: T) -> T:
        """Move every tensor to shared memory (in place) and lock; return ``self``.

        Returns:
            ``self``.

        Raises:
            MemmapError: the instance is memory-mapped (a ``RuntimeError``).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2), batch_size=[2])
        >>> obs.share_memory_() is obs, obs.x.is_shared(), obs.is_locked
        (True, True, True)
        """
        self._tensordict.share_memory_()
        return self

    def is_shared(self) -> bool:
        """Whether the tensors are in shared memory (``share_memory_()``).

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2), batch_size=[2])
        >>> obs.is_shared(), obs.share_memory_().is_shared()
        (False, True)
        """
        return self._tensordict.is_shared()
