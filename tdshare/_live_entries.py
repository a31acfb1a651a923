"""Entries added to a memory-mapped tensordict while it is shared, and seeing those of others:
``make_memmap``, ``make_memmap_from_tensor``, ``make_memmap_from_storage``, ``memmap_refresh_``, and
the persistence of in-place non-tensor writes.  :class:`LiveEntryOps` is a base of
:class:`tdshare._memmap_family.MemmapFamily`; the work is done by :mod:`tdshare._entries` and
:mod:`tdshare._refresh`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from ._adder import fast_add
from ._entries import (
    add_entry,
    build_empty,
    build_from_storage,
    build_from_tensor,
    check_storage,
    storage_entry_checks,
    write_non_tensor,
)
from ._errors import ArgumentTypeError, NotMemmapError, NotSupportedError
from ._files import no_data_error
from ._keys import NestedKey
from ._memmap import MemoryMappedTensor
from ._nontensor import NonTensorData
from ._refresh import refresh
from ._tensordict_base import TensorDictBase

__all__ = ["LiveEntryOps"]

T = TypeVar("T", bound="LiveEntryOps")


class LiveEntryOps(TensorDictBase):
    """``make_memmap*`` and ``memmap_refresh_`` (see the module docstring)."""

    def make_memmap(
        self,
        key: NestedKey,
        shape: Sequence[int] | torch.Size,
        *,
        dtype: torch.dtype | None = None,
        robust_key: bool | None = True,
    ) -> MemoryMappedTensor:
        """Add a zero-filled memory-mapped entry at ``key`` (allowed while locked) and return it.

        Its file is written in the tensordict's folder (none in anonymous shared memory). Other
        processes sharing the folder see it after ``memmap_refresh_()``.

        Args:
            key: the new entry's key; a tuple creates the missing nested tensordicts.
            shape: its shape, starting with the batch size.
            dtype: its dtype (None: ``torch.get_default_dtype()``).
            robust_key: as for :meth:`memmap_`.

        Returns:
            The new :class:`MemoryMappedTensor`.

        Raises:
            RuntimeError: the tensordict is not memory-mapped (:class:`NotMemmapError`), the key
                exists (:class:`MemmapError`), or ``shape`` does not start with the batch size
                (:class:`BatchSizeError`).
            TypeError: a key that is not a string or tuple of strings.

        >>> import os, tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     td = TensorDict(a=torch.ones(3), batch_size=[3]).memmap_(path)
        ...     b = td.make_memmap("b", [3, 2], dtype=torch.int64)
        ...     print(b.shape, b.dtype, b.sum().item(), td.is_locked, sorted(os.listdir(path)))
        torch.Size([3, 2]) torch.int64 0 True ['a.memmap', 'b.memmap', 'meta.json']
        """
        fast = fast_add(self, key, shape, dtype, robust_key, None)
        if fast is not None:
            return fast
        return add_entry(self, key, shape, dtype, robust_key, build_empty)

    def make_memmap_from_tensor(
        self, key: NestedKey, tensor: torch.Tensor, *, copy_data: bool = True, robust_key: bool | None = True
    ) -> MemoryMappedTensor:
        """Add a memory-mapped copy of ``tensor`` at ``key`` and return it (allowed while locked).

        A nested (jagged) tensor is stored packed, with its pieces' shapes.  Other processes
        sharing the folder see the entry after ``memmap_refresh_()``.

        Args:
            key: the new entry's key; a tuple creates the missing nested tensordicts.
            tensor: the data to copy; its shape must start with the batch size.
            copy_data: False writes zeros of the tensor's shape and dtype instead of its data.
            robust_key: as for :meth:`memmap_`.

        Returns:
            The new :class:`MemoryMappedTensor`.

        Raises:
            TypeError: ``tensor`` is not a ``torch.Tensor``.
            NotImplementedError: a nested tensor with a layout other than ``torch.strided``, or a
                meta tensor (it has no data) with ``copy_data=True``.
            RuntimeError: as for :meth:`make_memmap`.

        >>> import tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     td = TensorDict(a=torch.ones(3), batch_size=[3]).memmap_(path)
        ...     print(td.make_memmap_from_tensor("b", torch.arange(3.0)).tolist(),
        ...           td.make_memmap_from_tensor("c", torch.ones(3), copy_data=False).tolist())
        [0.0, 1.0, 2.0] [0.0, 0.0, 0.0]
        """
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError(f"make_memmap_from_tensor expects a torch.Tensor, got {type(tensor).__name__}.")
        if tensor.is_nested:  # the packed elements, with the pieces' shapes as the tensor of shapes
            if tensor.layout is not torch.strided:
                raise NotSupportedError(
                    f"make_memmap_from_tensor({key!r}): a nested tensor with the {tensor.layout} layout has no "
                    "layout on disk; convert it with torch.nested.nested_tensor(list(t.unbind()), "
                    "layout=torch.strided)."
                )
            pieces = [p.detach().contiguous() for p in tensor.unbind()]
            table = torch.tensor([list(p.shape) for p in pieces], dtype=torch.int64).reshape(len(pieces), -1)
            packed = torch.cat([p.reshape(-1) for p in pieces]) if pieces else torch.empty(0, dtype=tensor.dtype)
            return add_entry(self, key, table, tensor.dtype, robust_key, build_from_tensor(packed, copy_data))
        if copy_data and tensor.is_meta:
            raise no_data_error(
                f"make_memmap_from_tensor({key!r})",
                "Pass copy_data=False for an entry of its shape and dtype filled with zeros.",
            )
        if not copy_data or tensor.is_cpu:
            fast = fast_add(self, key, tensor.shape, tensor.dtype, robust_key, tensor if copy_data else None)
            if fast is not None:
                return fast
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

        Allowed while locked. A storage with a file must be the entry's own file; a file-less one
        is used as it is, its data is not written to the folder, and ``load_memmap`` and
        ``memmap_refresh_`` drop the entry: when the tensordict has a folder and the storage is
        not empty, the call emits a ``FutureWarning`` saying so (use
        :meth:`make_memmap_from_tensor` to copy the data into the folder).

        Args:
            key: the new entry's key; a tuple creates the missing nested tensordicts.
            storage: the ``torch.UntypedStorage`` to read, in physical memory.
            shape: the entry's shape, or a tensor of shapes for a nested tensor.
            dtype: its dtype (None: ``torch.get_default_dtype()``).
            robust_key: as for :meth:`memmap_`.

        Returns:
            The new :class:`MemoryMappedTensor`.

        Raises:
            RuntimeError: the tensordict is not memory-mapped, the key exists, the storage is
                smaller than ``shape`` needs, or its file is not the new entry's file.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.ones(3), batch_size=[3]).memmap_()  # anonymous: no warning
        >>> storage = torch.arange(3.0).untyped_storage()
        >>> entry = td.make_memmap_from_storage("b", storage, [3])
        >>> entry.tolist(), entry.untyped_storage().data_ptr() == storage.data_ptr()
        ([0.0, 1.0, 2.0], True)
        """
        if not self._is_memmap:
            raise NotMemmapError(
                "Can only make a memmap tensor within a memory-mapped tensordict: call memmap_() first."
            )
        storage = check_storage(storage, shape, dtype)
        has_file = storage_entry_checks(self, key, storage, robust_key)
        if has_file and storage.nbytes():
            fast = fast_add(self, key, shape, dtype, robust_key, None, storage)
            if fast is not None:
                return fast
        return add_entry(
            self, key, shape, dtype, robust_key, build_from_storage(storage), has_file=has_file, creates_file=False
        )

    def memmap_refresh_(self: T, *, allow_pickle: bool | None = None) -> T:
        """Map the entries other processes added or changed since this tensordict last looked.

        Returns at once (one memory read) when nothing was committed since; never writes.

        Args:
            allow_pickle: as for :meth:`load_memmap`, for the non-tensor values it reads.

        Returns:
            ``self``.

        Raises:
            RuntimeError: the tensordict is not memory-mapped (:class:`NotMemmapError`);
                ``memmap_()`` a ``load_memmap()`` result first.  An anonymous tree (``memmap_()``
                without a prefix) refreshes from its shared runtime store, where the reference
                raises.

        >>> import tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     writer = TensorDict(a=torch.ones(3), batch_size=[3]).memmap_(path)
        ...     reader = TensorDict.load_memmap(path).memmap_()  # another process, usually
        ...     _ = writer.make_memmap_from_tensor("b", torch.arange(3.0))
        ...     print("b" in reader, reader.memmap_refresh_()["b"].tolist())
        False [0.0, 1.0, 2.0]
        """
        refresh(self, allow_pickle)
        return self

    # -- non-tensor writes persist ------------------------------------------------------------
    def _write_non_tensor(self, key: str, leaf: NonTensorData, value: Any) -> None:
        write_non_tensor(self, key, leaf, value)  # persisted in the folder, or shared, as the tree says
