"""TensorDict: the in-memory model plus memory-mapping, saving and loading.

The methods here are thin: they check their arguments and delegate to :mod:`tdshare._write`
and :mod:`tdshare._read`, which do the work.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from ._archive import archive_target, save_archive
from ._entries import (
    add_entry,
    build_empty,
    build_from_storage,
    build_from_tensor,
    check_storage,
    storage_entry_checks,
)
from ._errors import MemmapError, NotMemmapError
from ._files import no_data_error
from ._future import TensorDictFuture
from ._keys import NestedKey, encode_key
from ._memmap import MemoryMappedTensor
from ._nontensor import NonTensorData
from ._nontensor_files import encode_nontensor, write_nontensor
from ._read import load_into, load_tree
from ._refresh import refresh
from ._registry import SharedRegistry
from ._shared_nontensor import SharedNonTensorData
from ._tensordict import TensorDictBase
from ._write import memmap_tree

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
        archive: bool | None = None,
        compression: str | int | None = None,
        atomic: bool = False,
    ) -> T | TensorDictFuture[T]:
        """Like :meth:`memmap_`, but returns a new memory-mapped tensordict; ``self`` is unchanged.

        A prefix ending with ``.tdz`` (or ``archive=True``) writes one archive file instead, always
        atomically, with the tensor entries compressed as ``compression`` says; the result then maps
        the archive and is unlocked, and ``is_memmap()`` is False.
        """
        if archive_target(prefix, archive, compression):
            assert prefix is not None
            opts: dict[str, Any] = {"return_early": return_early, "share_non_tensor": share_non_tensor}
            opts.update(compression=compression, num_threads=num_threads, existsok=existsok, robust_key=robust_key)
            return save_archive(self, prefix, **opts)
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
        archive: bool | None = None,
        compression: str | int | None = None,
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
            archive=archive,
            compression=compression,
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
            cls,
            prefix,
            device,
            out=out,
            robust_key=robust_key,
            subpath=subpath,
            mode=mode,
            allow_pickle=allow_pickle,
            num_threads=num_threads,
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
        """Load a saved tensordict into ``self`` (nested tensordicts reused, leaves replaced).

        A memory-mapped ``self`` ends memory-mapped into the loaded folder and locked (nothing is
        written); ``self`` is unchanged if the load fails.
        """
        return load_into(self, prefix, robust_key, allow_pickle=allow_pickle, mode=mode)

    # -- live entries and refresh ------------------------------------------------------------
    def make_memmap(
        self,
        key: NestedKey,
        shape: Sequence[int] | torch.Size,
        *,
        dtype: torch.dtype | None = None,
        robust_key: bool | None = True,
    ) -> MemoryMappedTensor:
        """Add a zero-filled memory-mapped entry at ``key`` (allowed while locked) and return it.

        Other processes sharing the folder see it after ``memmap_refresh_()``.
        """
        return add_entry(self, key, shape, dtype, robust_key, build_empty)

    def make_memmap_from_tensor(
        self, key: NestedKey, tensor: torch.Tensor, *, copy_data: bool = True, robust_key: bool | None = True
    ) -> MemoryMappedTensor:
        """Add a memory-mapped copy of ``tensor`` at ``key`` (``copy_data=False``: zeros of its shape)."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"make_memmap_from_tensor expects a torch.Tensor, got {type(tensor).__name__}.")
        if copy_data and tensor.is_meta:
            raise no_data_error(
                f"make_memmap_from_tensor({key!r})",
                "Pass copy_data=False for an entry of its shape and dtype filled with zeros.",
            )
        return add_entry(self, key, tensor.shape, tensor.dtype, robust_key, build_from_tensor(tensor, copy_data))

    def make_memmap_from_storage(
        self,
        key: NestedKey,
        storage: torch.UntypedStorage,
        shape: Sequence[int] | torch.Size,
        *,
        dtype: torch.dtype | None = None,
        robust_key: bool | None = True,
    ) -> MemoryMappedTensor:
        """Add an entry at ``key`` that reads its data from ``storage`` (no copy) and return it.

        A storage with a file must be the entry's own file; a file-less one is used as it is and
        is dropped by ``load_memmap``/``memmap_refresh_`` (with a ``FutureWarning``) when the
        tensordict has a folder.
        """
        if not self._is_memmap:
            raise NotMemmapError(
                "Can only make a memmap tensor within a memory-mapped tensordict: call memmap_() first."
            )
        storage = check_storage(storage, shape, dtype)
        has_file = storage_entry_checks(self, key, storage, robust_key)
        return add_entry(
            self, key, shape, dtype, robust_key, build_from_storage(storage), has_file=has_file, creates_file=False
        )

    def memmap_refresh_(self: T, *, allow_pickle: bool | None = None) -> T:
        """Map the entries other processes added or changed since this tensordict last looked.

        Returns at once (one memory read) when nothing was committed since; never writes.
        """
        refresh(self, allow_pickle)
        return self

    # -- non-tensor writes persist ------------------------------------------------------------
    def _write_non_tensor(self, key: str, leaf: NonTensorData, value: Any) -> None:
        if isinstance(leaf, SharedNonTensorData):
            leaf.write(value)  # under the tree's lock, seen by every process at its next read
            return
        super()._write_non_tensor(key, leaf, value)
        if self._is_memmap and self._memmap_prefix is not None:
            folder = os.path.join(self._memmap_prefix, encode_key(key))
            if not os.path.isdir(folder) and os.path.isdir(os.path.join(self._memmap_prefix, key)):
                folder = os.path.join(self._memmap_prefix, key)  # legacy (robust_key=False) layout
            meta, pickled = encode_nontensor(value, f"key {key!r}")
            registry = SharedRegistry.for_directory(self._memmap_prefix)
            with registry.lock():
                if write_nontensor(folder, meta, pickled):
                    registry.bump()  # other processes see the new value after memmap_refresh_()

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
