"""LeafHandle: one saved leaf between its metadata and its tensor.

A handle says where a leaf's bytes are (a whole file, or a slice of an anonymous segment), what
they hold (dtype and shape), how they are checked against the metadata (:meth:`LeafHandle.check`),
how they are mapped (:meth:`LeafHandle.map`) and how the leaf travels to another process
(:meth:`LeafHandle.code` / :meth:`LeafHandle.from_code`: a few bytes, never the data).  The
loader, the refresher and the pickles of a tensordict go through it; mapping a leaf later than
its load (lazily) is a change to this class and to the one place that keeps the handles.

``.tdz`` archive leaves are views cut in bulk from one mapping of the archive
(:mod:`tdshare._archive_store`); they pickle through :class:`MemoryMappedTensor` itself.

>>> import tempfile, os, torch
>>> path = os.path.join(tempfile.mkdtemp(), "x.memmap")
>>> _ = open(path, "wb").write(torch.arange(6, dtype=torch.int16).numpy().tobytes())
>>> LeafHandle.file(path, torch.int16, (2, 3)).map().tolist()
[[0, 1, 2], [3, 4, 5]]
"""

from __future__ import annotations

import math
import os
import stat
from typing import Any

import torch

from ._errors import CorruptDataError
from ._files import map_file
from ._memmap import MemoryMappedTensor
from ._segments import Segment

__all__ = ["LeafHandle"]


class LeafHandle:
    """Where one leaf's bytes are and what they hold: a file, or a slice of a shared segment.

    Attributes:
        dtype, shape: what the bytes hold (C order, native byte order).
        path: the leaf's file (None for a segment slice).
        mode: how a file is mapped: None (shared where writable), ``"r"`` (private), ``"r+"``.
        segment, offset: the anonymous segment and the byte offset of the leaf in it.
        ino: the file's inode when known (a refresh keeps a leaf whose inode is unchanged).
    """

    __slots__ = ("dtype", "ino", "mode", "offset", "path", "segment", "shape")

    def __init__(
        self,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        *,
        path: str | None = None,
        mode: str | None = None,
        segment: Segment | None = None,
        offset: int = 0,
        ino: int | None = None,
    ) -> None:
        self.dtype, self.shape, self.path, self.mode = dtype, shape, path, mode
        self.segment, self.offset, self.ino = segment, offset, ino

    @classmethod
    def file(cls, path: str, dtype: torch.dtype, shape: tuple[int, ...], mode: str | None = None) -> LeafHandle:
        """The leaf that is the whole file ``path``."""
        return cls(dtype, shape, path=path, mode=mode)

    @classmethod
    def in_segment(cls, segment: Segment, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> LeafHandle:
        """The leaf at byte ``offset`` of the anonymous ``segment``."""
        return cls(dtype, shape, segment=segment, offset=offset)

    @classmethod
    def of(cls, t: MemoryMappedTensor) -> LeafHandle | None:
        """The handle of ``t`` when it is a whole leaf file or a contiguous segment slice, else None."""
        if t.numel() == 0 or not t.is_contiguous():
            return None
        shape = tuple(t.shape)
        if t._filename is not None and t._offset is None:
            if t.storage_offset() == 0 and t.numel() * t.dtype.itemsize == t.untyped_storage().nbytes():
                return cls(t.dtype, shape, path=t._filename, mode=t._mode, ino=t._ino)
            return None
        seg = t._segment
        if seg is not None:
            return cls(t.dtype, shape, segment=seg, offset=t.data_ptr() - seg.buffer.data_ptr())
        return None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    # -- validation ---------------------------------------------------------------------------
    def check(self, st: os.stat_result, meta_where: str, key: str) -> None:
        """Check the file ``st`` describes against the metadata ``meta_where`` lists for ``key``.

        Raises:
            CorruptDataError: not a regular file, or shorter than shape x itemsize.
        """
        if not stat.S_ISREG(st.st_mode):
            raise CorruptDataError(
                f"{meta_where} lists the leaf {key!r}, but {self.path!r} is not a regular file (expected "
                f"{self.nbytes} bytes of {self.dtype})."
            )
        if st.st_size < self.nbytes:
            raise CorruptDataError(
                f"The file {self.path!r} holds {st.st_size} bytes but {meta_where} expects {self.nbytes} "
                f"(shape {list(self.shape)}, {self.dtype}): it is truncated."
            )

    def maps(self, t: Any) -> bool:
        """Whether ``t`` already maps this leaf's file (same inode, mode, shape and dtype)."""
        return (
            isinstance(t, MemoryMappedTensor)
            and t._ino is not None
            and t._ino == self.ino
            and t._filename == self.path
            and t._mode == self.mode
            and t.shape == self.shape
            and t.dtype == self.dtype
        )

    # -- mapping ------------------------------------------------------------------------------
    def map(self, st: os.stat_result | None = None) -> MemoryMappedTensor:
        """The leaf as a :class:`MemoryMappedTensor` (``st``: the file's stat, when in hand).

        A file is mapped shared for ``"r+"``, privately for ``"r"``, and for None shared where
        this process may write it (judged from ``st``'s mode bits, or ``access()`` without it).

        Raises:
            CorruptDataError: the file is missing or shorter than the leaf.
            PermissionError: ``"r+"`` on a file this process may not write.
        """
        numel = self.numel
        if numel == 0:
            return MemoryMappedTensor._wrap(torch.empty(self.shape, dtype=self.dtype), None, None, None)
        if self.segment is not None:
            view = self.segment.view(self.offset, self.dtype, torch.Size(self.shape))
            return MemoryMappedTensor._wrap(view, None, self.segment, None)
        path = self.path
        assert path is not None
        if st is None:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise CorruptDataError(
                    f"The file {path!r} is missing: expected {self.nbytes} bytes of {self.dtype} data."
                ) from None
        flat = map_file(path, self.dtype, numel, self.mode, st)
        out = MemoryMappedTensor._wrap(flat if len(self.shape) == 1 else flat.view(self.shape), path, None, self.mode)
        out._ino = st.st_ino
        return out

    # -- pickling -----------------------------------------------------------------------------
    def code(self, default_path: str | None) -> tuple[Any, ...]:
        """The compact pickled form: ``(dtype, shape[, mode])`` for the file at ``default_path``,
        ``(segment, offset, dtype, shape)`` for a segment slice; anything else is not coded here."""
        if self.segment is not None:
            return (self.segment, self.offset, self.dtype, self.shape)
        assert self.path == default_path
        return (self.dtype, self.shape) if self.mode is None else (self.dtype, self.shape, self.mode)

    @classmethod
    def from_code(cls, code: tuple[Any, ...], default_path: str | None) -> LeafHandle:
        """The handle that :meth:`code` encoded (``default_path``: the file of a file leaf)."""
        if isinstance(code[0], Segment):
            seg, offset, dtype, shape = code
            return cls(dtype, tuple(shape), segment=seg, offset=offset)
        assert default_path is not None
        return cls(code[0], tuple(code[1]), path=default_path, mode=code[2] if len(code) > 2 else None)
