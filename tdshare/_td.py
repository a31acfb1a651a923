"""TensorDict: the in-memory model plus memory-mapping, saving and loading.

The methods here are thin: they check their arguments and delegate to :mod:`tdshare._write`
and :mod:`tdshare._read`, which do the work.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from ._errors import MemmapError
from ._future import TensorDictFuture
from ._keys import encode_key
from ._nontensor import NonTensorData
from ._read import load_tree
from ._tensordict import TensorDictBase
from ._write import encode_nontensor, memmap_tree, write_nontensor

__all__ = ["TensorDict", "load", "load_memmap", "save", "memmap"]

T = TypeVar("T", bound="TensorDict")
PathLike = str | os.PathLike


class TensorDict(TensorDictBase):
    """A dictionary of tensors with a common batch size that can be memory-mapped and shared.

    >>> td = TensorDict(obs=torch.zeros(3, 4), batch_size=[3])
    >>> td.memmap_(path).is_memmap()
    True
    """

    # -- memory-mapping -----------------------------------------------------------------------
    def memmap_(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        atomic: bool = False,
    ) -> T | TensorDictFuture[T]:
        """Write every leaf to a memory-mapped file (or anonymous shared memory) in place; lock.

        ``prefix=None`` writes into the tensordict's own directory if it has one, otherwise into
        anonymous shared memory that the kernel frees with the last process using it.  Leaves
        become :class:`MemoryMappedTensor`, the device becomes cpu, and ``is_memmap()`` is True
        until ``unlock_()``.  Every argument is the reference's; see the README.
        """
        return memmap_tree(
            self,
            prefix,
            inplace=True,
            copy_existing=copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            atomic=atomic,
        )

    def memmap(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        atomic: bool = False,
    ) -> T | TensorDictFuture[T]:
        """Like :meth:`memmap_`, but returns a new memory-mapped tensordict; ``self`` is unchanged."""
        return memmap_tree(
            self,
            prefix,
            inplace=False,
            copy_existing=copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            atomic=atomic,
        )

    def save(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        atomic: bool = False,
    ) -> T | TensorDictFuture[T]:
        """Save to ``prefix`` and return a memory-mapped copy: ``memmap(existsok=True)``."""
        return self.memmap(
            prefix,
            copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=True,
            robust_key=robust_key,
            atomic=atomic,
        )

    dumps = save

    def is_memmap(self) -> bool:
        """Whether the leaves are memory-mapped (True from ``memmap_()`` until ``unlock_()``)."""
        return self._is_memmap

    @property
    def saved_path(self) -> str:
        """The directory the tensordict is memory-mapped to."""
        if not self._is_memmap or self._memmap_prefix is None:
            raise AttributeError(
                f"The tensordict has no saved path (is_memmap()={self._is_memmap}, path={self._memmap_prefix})."
            )
        return self._memmap_prefix

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def load_memmap(
        cls: type[T],
        prefix: PathLike,
        device: Any = None,
        non_blocking: bool = False,
        *,
        out: TensorDictBase | None = None,
        robust_key: bool | None = True,
        subpath: Any = None,
        mode: str | None = None,
        num_threads: int = 0,
        allow_pickle: bool | None = None,
    ) -> T:
        """Load a saved tensordict, mapping its leaf files (no payload is read).

        ``mode``: None writes through where the file is writable, ``"r"`` keeps writes private to
        this process, ``"r+"`` writes through and raises ``PermissionError`` on a read-only file.
        ``allow_pickle``: None loads pickled non-tensor values with a ``FutureWarning``, False
        refuses them, True loads them.
        """
        return load_tree(
            cls, prefix, device, out=out, robust_key=robust_key, subpath=subpath, mode=mode, allow_pickle=allow_pickle
        )

    load = load_memmap

    def load_memmap_(
        self: T,
        prefix: PathLike,
        robust_key: bool | None = True,
        *,
        allow_pickle: bool | None = None,
        mode: str | None = None,
    ) -> T:
        """Load a saved tensordict into ``self`` (nested tensordicts reused, leaves replaced)."""
        was_memmap = self._is_memmap
        if was_memmap:
            self.unlock_()
            self._last_op.pop()
        load_tree(
            type(self), prefix, self.device, out=self, robust_key=robust_key, mode=mode, allow_pickle=allow_pickle
        )
        if was_memmap and self._memmap_prefix is not None:
            self.memmap_(self._memmap_prefix, robust_key=robust_key)
        return self

    # -- non-tensor writes persist ------------------------------------------------------------
    def _write_non_tensor(self, key: str, leaf: NonTensorData, value: Any) -> None:
        super()._write_non_tensor(key, leaf, value)
        if self._is_memmap and self._memmap_prefix is not None:
            folder = os.path.join(self._memmap_prefix, encode_key(key))
            if not os.path.isdir(folder) and os.path.isdir(os.path.join(self._memmap_prefix, key)):
                folder = os.path.join(self._memmap_prefix, key)  # legacy (robust_key=False) layout
            write_nontensor(folder, *encode_nontensor(value, f"key {key!r}"))

    def share_memory_(self: T) -> T:
        if self._is_memmap:
            raise MemmapError("memmap and shared memory are mutually exclusive features.")
        return super().share_memory_()


def load_memmap(prefix: PathLike, *args: Any, **kwargs: Any) -> TensorDict:
    """``TensorDict.load_memmap(prefix, ...)``."""
    return TensorDict.load_memmap(prefix, *args, **kwargs)


load = load_memmap


def save(td: TensorDict, prefix: PathLike | None = None, *args: Any, **kwargs: Any) -> Any:
    """``td.save(prefix, ...)``."""
    return td.save(prefix, *args, **kwargs)


def memmap(td: TensorDict, prefix: PathLike | None = None, *args: Any, **kwargs: Any) -> Any:
    """``td.memmap(prefix, ...)``."""
    return td.memmap(prefix, *args, **kwargs)
