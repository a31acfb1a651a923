"""The memory-mapping family: ``memmap_``, ``memmap``, ``save``/``dumps``, ``load_memmap``/``load``,
``load_memmap_``, ``make_memmap*``, ``memmap_refresh_``, ``is_memmap``, ``saved_path``.

:class:`MemmapFamily` is the one place these methods live: every tensor collection class
(``TensorDict`` today) gets them by deriving from it next to the in-memory model
(:class:`tdshare._tensordict_base.TensorDictBase`).  The methods check their arguments
(:class:`tdshare._options.SaveOptions` for the saves) and delegate to the I/O modules:
:mod:`tdshare._save` (every save, through one backend), :mod:`tdshare._read`,
:mod:`tdshare._entries` and :mod:`tdshare._refresh`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from ._entries import (
    add_entry,
    build_empty,
    build_from_storage,
    build_from_tensor,
    check_storage,
    storage_entry_checks,
    write_non_tensor,
)
from ._errors import NotMemmapError
from ._files import no_data_error
from ._future import TensorDictFuture
from ._keys import NestedKey
from ._memmap import MemoryMappedTensor
from ._nontensor import NonTensorData
from ._options import SaveOptions
from ._read import load_into, load_tree
from ._refresh import refresh
from ._save import save_tree
from ._tensordict_base import TensorDictBase

__all__ = ["MemmapFamily"]

T = TypeVar("T", bound="MemmapFamily")
PathLike = str | os.PathLike


class MemmapFamily(TensorDictBase):
    """The memory-mapping, saving and loading methods of every tensor collection class.

    >>> import tempfile, torch
    >>> from tdshare import TensorDict
    >>> td = TensorDict(obs=torch.zeros(3, 4), batch_size=[3]).memmap_(tempfile.mkdtemp())
    >>> td.is_memmap(), TensorDict.load_memmap(td.saved_path)["obs"].shape
    (True, torch.Size([3, 4]))
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
        opts = SaveOptions.of(
            prefix,
            copy_existing=copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            atomic=atomic,
            archive=False,
        )
        return save_tree(self, prefix, opts, inplace=True)

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
        opts = SaveOptions.of(
            prefix,
            copy_existing=copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            atomic=atomic,
            archive=archive,
            compression=compression,
        )
        return save_tree(self, prefix, opts, inplace=False)

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
        write_non_tensor(self, key, leaf, value)  # persisted in the folder, or shared, as the tree says
