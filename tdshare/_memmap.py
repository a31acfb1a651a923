"""MemoryMappedTensor: a ``torch.Tensor`` over a file or an anonymous shared-memory segment.

Operations return plain tensors (torch functions are disabled for the subclass), except basic
indexing, ``unbind``, ``chunk`` and ``split``, which return MemoryMappedTensor views of the same
memory.  Pickling sends a handle (file path or segment descriptor, dtype and view geometry),
never the bytes.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any, cast

import torch

from ._errors import ArgumentTypeError, InvalidArgumentError, MemmapError
from ._files import (
    map_archive,
    map_file,
    nested_from_buffer,
    no_data_error,
    reserve_file,
    storage_filename,
    tensor_buffer,
    write_file,
)
from ._indexing import contiguous_strides, has_first_class_dim
from ._memmap_args import check_cpu, check_mode, packed, parse_size, refuse_symlink, size_table
from ._memmap_factories import MemmapFactories
from ._memmap_views import MemmapViews
from ._segments import Segment

__all__ = ["already_mapped", "MemoryMappedTensor", "SharedMemoryHandle"]


class SharedMemoryHandle:
    """The anonymous shared memory of one MemoryMappedTensor: a segment and a byte range in it.

    It is what ``MemoryMappedTensor._handler`` returns for a tensor in anonymous memory, and what
    :meth:`MemoryMappedTensor.from_handler` maps again.  Views of a tensor share its handle.  A
    handle pickles by descriptor (with :mod:`multiprocessing`), like the tensor itself.
    """

    __slots__ = ("__weakref__", "nbytes", "offset", "segment")

    def __init__(self, segment: Segment, offset: int, nbytes: int) -> None:
        self.segment = segment
        self.offset = offset  # byte offset of the range in the segment
        self.nbytes = nbytes

    def __reduce__(self) -> tuple[Any, ...]:
        return (SharedMemoryHandle, (self.segment, self.offset, self.nbytes))

    def __repr__(self) -> str:
        return f"SharedMemoryHandle(fd={self.segment.fd}, offset={self.offset}, nbytes={self.nbytes})"


_PLAIN_INDEX = (int, slice, type(None), type(Ellipsis))


def already_mapped(what: str, existing: str, target: str) -> MemmapError:
    """The error for a leaf memory-mapped to ``existing`` that a write to ``target`` would copy while
    ``copy_existing=False`` (``what`` names it: "the tensor", "the entry key 'a'")."""
    return MemmapError(
        f"A filename was provided but the tensor already has a file associated: {what} is memory-mapped to "
        f"{existing!r}; writing it to {target!r} would duplicate the data on disk. Pass copy_existing=True to copy it."
    )


class MemoryMappedTensor(MemmapFactories, MemmapViews, torch.Tensor):
    """A tensor whose memory is a mapped file (``filename``) or an anonymous shared segment.

    Build one with the factories (``from_tensor``, ``zeros``, ``empty``, ``from_filename``, ...);
    writes go to the file, and every process mapping it sees them.

    >>> import os, tempfile
    >>> from tdshare import MemoryMappedTensor
    >>> with tempfile.TemporaryDirectory() as path:
    ...     t = MemoryMappedTensor.from_tensor(torch.arange(3.0), filename=os.path.join(path, "t.bin"))
    ...     t[0] = 7.0
    ...     print(MemoryMappedTensor.from_filename(t.filename, torch.float32, [3]).tolist())
    [7.0, 1.0, 2.0]
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    # Class defaults: ``MemoryMappedTensor(tensor)`` wraps a tensor without calling ``_wrap``.
    _filename: str | None = None
    _segment: Segment | None = None
    _mode: str | None = None
    _ino: int | None = None  # inode of the mapped file, when known: a refresh keeps unchanged leaves
    _offset: int | None = None  # byte offset of the payload when ``_filename`` is a .tdz archive
    _handle: SharedMemoryHandle | None = None  # made on first use of ``_handler``, shared by views
    _handle_base: MemoryMappedTensor | None = None  # the tensor a view was indexed from (anonymous memory)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def _wrap(
        cls, tensor: torch.Tensor, filename: str | None, segment: Segment | None, mode: str | None
    ) -> MemoryMappedTensor:
        # as_subclass is cheaper than _make_subclass here; both alias the tensor, which has no grad
        out = tensor.as_subclass(cls) if not tensor.requires_grad else torch.Tensor._make_subclass(cls, tensor)
        # the class defaults are None: set only what differs (this runs once per leaf on load)
        if filename is not None:
            out._filename = filename
        if segment is not None:
            out._segment = segment
        if mode is not None:
            out._mode = mode
        return out

    @classmethod
    def _adopt(cls, fresh: torch.Tensor, filename: str, ino: int) -> MemoryMappedTensor:
        """Make ``fresh``, a tensor just made and referenced nowhere else, this class in place.

        Changing its class costs a tenth of a microsecond; ``as_subclass`` builds an alias for
        two, once per leaf of a load or save of thousands.
        """
        fresh.__class__ = cls
        out = cast(MemoryMappedTensor, fresh)
        out._filename = filename
        out._ino = ino
        return out

    def _as_nested(self, table: torch.Tensor) -> MemoryMappedTensor:
        """This flat tensor's elements as the nested tensor whose pieces' shapes are ``table``'s rows."""
        out = nested_from_buffer(self, table).as_subclass(type(self))
        out._filename, out._segment, out._mode, out._ino = self._filename, self._segment, self._mode, self._ino
        if self._segment is not None:
            out._handle = self._handler
        return out

    @classmethod
    def _anonymous(cls, shape: torch.Size, dtype: torch.dtype) -> MemoryMappedTensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:  # nothing to share: no segment, no descriptor
            return cls._wrap(torch.empty(shape, dtype=dtype), None, None, None)
        seg = Segment.create(nbytes)
        return cls._wrap(seg.view(0, dtype, shape), None, seg, None)

    @classmethod
    def from_tensor(
        cls,
        input: torch.Tensor,
        *,
        filename: str | os.PathLike | None = None,
        existsok: bool = False,
        copy_existing: bool = False,
        copy_data: bool = True,
        shape: torch.Size | Sequence[int] | None = None,
    ) -> MemoryMappedTensor:
        """Copy ``input`` to a new file (``filename``) or anonymous memory, and map it.

        An input that already is a MemoryMappedTensor at the same place is returned unchanged.
        One with a file elsewhere raises unless ``copy_existing=True``.

        Args:
            input: the tensor to copy (any device; it is copied to the CPU mapping).
            filename: the file to write (None: anonymous shared memory).
            existsok: replace an existing ``filename`` (by a new file) instead of raising.
            copy_existing: copy a MemoryMappedTensor that has a file elsewhere.
            copy_data: False reserves zero-filled space of the right size without copying.
            shape: a shape that ``input`` broadcasts to (default: its own).

        Returns:
            A MemoryMappedTensor, or ``input`` itself when it already is one at that place.

        Raises:
            TypeError: ``input`` is not a tensor.
            MemmapError: ``input`` requires grad or is on the meta device, ``filename`` is a
                symbolic link (refused: it would write to the file the link points at), or
                ``input`` has another file and ``copy_existing`` is False.
            FileExistsRuntimeError: ``filename`` exists and ``existsok`` is False.

        Example:
            >>> from tdshare import MemoryMappedTensor
            >>> m = MemoryMappedTensor.from_tensor(torch.arange(3))
            >>> m.tolist(), m.is_anonymous
            ([0, 1, 2], True)
        """
        if not isinstance(input, torch.Tensor):
            raise ArgumentTypeError(f"from_tensor expects a torch.Tensor, got {type(input).__name__}.")
        if input.requires_grad:
            raise MemmapError("Cannot memory-map a tensor that requires grad: pass tensor.detach() instead.")
        path = None if filename is None else os.path.abspath(os.fspath(filename))
        if isinstance(input, MemoryMappedTensor) and shape is None:
            if path is None and input._filename is None and input._segment is not None:
                return input
            if path is not None and input._filename == path and input._mode != "r":
                return input
            if path is not None and input._filename not in (None, path) and input._offset is None and not copy_existing:
                raise already_mapped("the tensor", input._filename, path)
        if input.is_nested and shape is None:  # the pieces packed one after the other, and their shapes
            pieces = [p.detach().contiguous() for p in input.unbind()]
            table = torch.tensor([list(p.shape) for p in pieces], dtype=torch.int64).reshape(len(pieces), -1)
            packed = torch.cat([p.reshape(-1) for p in pieces]) if pieces else torch.empty(0, dtype=input.dtype)
            buffer = cls.from_tensor(packed, filename=filename, existsok=existsok, copy_data=copy_data)
            return buffer._as_nested(table)
        src = input.detach()
        if src.device.type == "meta":
            raise no_data_error(f"Cannot memory-map {'to ' + repr(path) if path is not None else 'anonymously'}")
        if src.device.type != "cpu":
            src = src.cpu()
        out_shape = src.shape if shape is None else torch.Size(shape)
        if shape is not None:
            src = src.expand(out_shape)
        if path is None:
            out = cls._anonymous(out_shape, src.dtype)
            if copy_data:
                torch.Tensor.copy_(out, src)
            return out
        refuse_symlink(path)
        numel = math.prod(out_shape)
        if numel == 0:
            return cls._wrap(torch.empty(out_shape, dtype=src.dtype), None, None, None)
        if copy_data:
            write_file(path, tensor_buffer(src, path), existsok=existsok)
        else:
            reserve_file(path, numel * src.dtype.itemsize, existsok=existsok)
        flat = map_file(path, src.dtype, numel, None)
        return cls._wrap(flat.view(out_shape), path, None, None)

    @classmethod
    def from_filename(
        cls,
        filename: str | os.PathLike,
        dtype: torch.dtype,
        shape: torch.Size | Sequence[int],
        index: Any = None,
        mode: str | None = None,
    ) -> MemoryMappedTensor:
        """Map an existing file of raw C-order elements.

        The file must hold at least ``prod(shape)`` elements (a shorter one raises, it is never
        grown).

        Args:
            filename: the file to map.
            dtype: the elements' dtype.
            shape: the tensor's shape, or a tensor of shapes (one row per piece) for a nested
                tensor.
            index: an index applied to the mapped tensor (None: the whole of it).
            mode: None writes through when the file is writable, ``"r"`` keeps writes private to
                this process, ``"r+"`` writes through and needs a writable file.

        Returns:
            The MemoryMappedTensor (``[index]`` of it when an index is given).

        Raises:
            ValueError: a ``mode`` other than None, ``"r"``, ``"r+"``; a file that is missing or
                shorter than ``shape`` needs (:class:`CorruptDataError`).

        >>> import os, tempfile
        >>> from tdshare import MemoryMappedTensor
        >>> with tempfile.TemporaryDirectory() as path:
        ...     file = os.path.join(path, "t.bin")
        ...     _ = MemoryMappedTensor.from_tensor(torch.arange(6.0), filename=file)
        ...     print(MemoryMappedTensor.from_filename(file, torch.float32, [2, 3], index=1).tolist())
        [3.0, 4.0, 5.0]
        """
        check_mode(mode)
        table = size_table(shape)
        if table is not None:  # the packed elements of a nested tensor
            nested = cls.from_filename(filename, dtype, (packed(table),), None, mode)._as_nested(table)
            return nested if index is None else nested[index]
        path = os.path.abspath(os.fspath(filename))
        shape = torch.Size(shape)
        flat = map_file(path, dtype, math.prod(shape), mode)
        out = cls._wrap(flat.view(shape), path, None, mode)
        return out if index is None else out[index]

    @classmethod
    def from_storage(
        cls,
        storage: torch.UntypedStorage | torch.TypedStorage,
        *,
        shape: torch.Size | Sequence[int] | None = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
        index: Any = None,
        filename: str | os.PathLike | None = None,
    ) -> MemoryMappedTensor:
        """Wrap ``storage`` without copying.

        Args:
            storage: a CPU ``torch.UntypedStorage`` or ``TypedStorage``.
            shape: the tensor's shape, or a tensor of shapes for a nested tensor (None: as many
                elements as the storage holds, in one dimension).
            dtype: the elements' dtype (None: the storage's, ``torch.int64`` if it is untyped).
            device: must be None or the CPU.
            index: an index applied to the result (None: the whole of it).
            filename: the file the storage maps, when it maps one (None: the storage's own file,
                if any).

        Returns:
            A MemoryMappedTensor that shares the storage's memory.

        Raises:
            TypeError: ``storage`` is not a torch storage.
            ValueError: the storage is smaller than ``shape`` needs (:class:`InvalidArgumentError`).
            RuntimeError: a device other than the CPU, or a ``filename`` other than the file the
                storage maps (:class:`MemmapError`).

        >>> from tdshare import MemoryMappedTensor
        >>> storage = torch.arange(4, dtype=torch.int32).untyped_storage()
        >>> t = MemoryMappedTensor.from_storage(storage, dtype=torch.int32, shape=[2, 2])
        >>> t.tolist(), t.data_ptr() == storage.data_ptr()
        ([[0, 1], [2, 3]], True)
        """
        check_cpu(device)
        if isinstance(storage, torch.TypedStorage):
            dtype = dtype or storage.dtype
            storage = storage.untyped()
        if not isinstance(storage, torch.UntypedStorage):
            raise ArgumentTypeError(f"from_storage expects a torch storage, got {type(storage).__name__}.")
        dtype = dtype or torch.int64
        stored = storage_filename(storage)
        path = None if filename is None else os.path.abspath(os.fspath(filename))
        if path is not None and stored is not None and stored != path:
            raise MemmapError(
                f"The storage is mapped to {stored!r}, which differs from filename={path!r}: pass the "
                "storage of that file, or filename=None."
            )
        numel = storage.nbytes() // dtype.itemsize
        table = size_table(shape)
        if table is not None:  # the packed elements of a nested tensor
            flat = cls.from_storage(storage, shape=(packed(table),), dtype=dtype, filename=filename)
            nested = flat._as_nested(table)
            return nested if index is None else nested[index]
        shape = torch.Size([numel]) if shape is None else torch.Size(shape)
        if math.prod(shape) > numel:
            raise InvalidArgumentError(
                f"A storage of {storage.nbytes()} bytes cannot hold shape {list(shape)} of {dtype}."
            )
        t = torch.empty(0, dtype=dtype).set_(storage, 0, shape, contiguous_strides(shape))
        segment = Segment.of_storage(storage) if path is None and stored is None else None
        out = cls._wrap(t, path or stored, segment, None)
        return out if index is None else out[index]

    @classmethod
    def from_handler(
        cls,
        handler: SharedMemoryHandle,
        dtype: torch.dtype,
        shape: torch.Size | Sequence[int],
        index: Any = None,
    ) -> MemoryMappedTensor:
        """Map again the anonymous shared memory of another MemoryMappedTensor, without copying.

        Deprecated, as in tensordict 0.15: pickling or sending the tensor itself does the same.

        Args:
            handler: the ``_handler`` of a MemoryMappedTensor in anonymous memory.
            dtype: the dtype to read the bytes as.
            shape: the shape of the result; it may cover fewer bytes than the handler holds
                (a prefix is mapped), not more.
            index: an index applied to the result (None: the whole shape).

        Returns:
            A MemoryMappedTensor over the same memory: writes through either are seen by both.

        Raises:
            ArgumentTypeError: ``handler`` is not a handle of anonymous memory (a file-backed
                tensor has ``_handler`` None: use :meth:`from_filename`).
            InvalidArgumentError: ``shape`` needs more bytes than the handler holds, or the
                handler's offset is not a multiple of the dtype's size.

        Example:
            >>> from tdshare import MemoryMappedTensor
            >>> t = MemoryMappedTensor.from_tensor(torch.arange(4.0))
            >>> u = MemoryMappedTensor.from_handler(t._handler, torch.float32, (2, 2))  # doctest: +SKIP
            >>> u[1, 1] = 9.0; t[3].item()  # doctest: +SKIP
            9.0
        """
        warnings.warn(
            "MemoryMappedTensor.from_handler() is deprecated (tensordict 0.15 removes it in 0.17): send or pickle "
            "the MemoryMappedTensor itself instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        if not isinstance(handler, SharedMemoryHandle):
            raise ArgumentTypeError(
                "from_handler expects the _handler of a MemoryMappedTensor in anonymous shared memory, got "
                f"{type(handler).__name__}; a file-backed tensor has no handler: use "
                "from_filename(tensor.filename, ...)."
            )
        table = size_table(shape)
        if table is not None:  # the packed elements of a nested tensor
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                nested = cls.from_handler(handler, dtype, (packed(table),))._as_nested(table)
            return nested if index is None else nested[index]
        shape = parse_size((shape,), None)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > handler.nbytes or handler.offset % dtype.itemsize:
            raise InvalidArgumentError(
                f"Shape {list(shape)} of {dtype} needs {nbytes} bytes at byte offset {handler.offset}, but the handler "
                f"holds {handler.nbytes} bytes there: pass a shape and dtype that fit the tensor it came from."
            )
        out = cls._wrap(handler.segment.view(handler.offset, dtype, shape), None, handler.segment, None)
        out._handle = handler
        return out if index is None else out[index]

    # -- factories (the public ones: MemmapFactories, tdshare._memmap_factories) ------------------
    @classmethod
    def _factory(
        cls, size: tuple, shape: Any, dtype: Any, device: Any, filename: Any, existsok: bool, fill: Any
    ) -> MemoryMappedTensor:
        check_cpu(device)
        table = size_table(shape if shape is not None else size[0] if len(size) == 1 else None)
        if table is not None:  # a nested tensor: its pieces' elements packed in one buffer
            flat = cls._factory((), (packed(table),), dtype, device, filename, existsok, fill)
            return flat._as_nested(table)
        shape = parse_size(size, shape)
        dtype = dtype or torch.get_default_dtype()
        if filename is None:
            out = cls._anonymous(shape, dtype)
        else:
            path = os.path.abspath(os.fspath(filename))
            refuse_symlink(path)
            numel = math.prod(shape)
            if numel == 0:
                return cls._wrap(torch.empty(shape, dtype=dtype), None, None, None)
            reserve_file(path, numel * dtype.itemsize, existsok=existsok)
            out = cls._wrap(map_file(path, dtype, numel, None).view(shape), path, None, None)
        if fill is not None and fill != 0:
            torch.Tensor.fill_(out, fill)
        return out

    # -- properties ---------------------------------------------------------------------------
    @property
    def filename(self) -> str:
        """The absolute path of the mapped file.

        Raises:
            RuntimeError: the tensor has no file: it is in anonymous shared memory, or wraps
                ordinary process memory (:class:`MemmapError`).

        >>> import os, tempfile
        >>> from tdshare import MemoryMappedTensor
        >>> with tempfile.TemporaryDirectory() as path:
        ...     t = MemoryMappedTensor.zeros(3, filename=os.path.join(path, "t.bin"))
        ...     print(os.path.basename(t.filename), os.path.getsize(t.filename))
        t.bin 12
        """
        if self._filename is None:
            where = "anonymous shared memory" if self._segment is not None else "ordinary process memory"
            raise MemmapError(f"The MemoryMappedTensor has no file associated (it is in {where}).")
        return self._filename

    @property
    def is_anonymous(self) -> bool:
        """Whether the tensor lives in anonymous shared memory (no file) rather than in a file.

        >>> from tdshare import MemoryMappedTensor
        >>> MemoryMappedTensor.zeros(2).is_anonymous
        True
        """
        return self._filename is None

    @property
    def _handler(self) -> SharedMemoryHandle | None:
        """The anonymous shared memory of this tensor (None when it has a file or no shared memory).

        Views share their base's handle.  For :meth:`from_handler` (deprecated) and code written for
        tensordict, which reads this private attribute.
        """
        seg = self._segment
        if seg is None:
            return None
        if self._handle is None and self._handle_base is not None:
            self._handle = self._handle_base._handler
        elif self._handle is None:
            # the range from our first element to our last, in bytes from the segment's start
            first = self.data_ptr() - seg.buffer.data_ptr()
            spans = ((n - 1) * st for n, st in zip(self.shape, self.stride(), strict=True))
            extent = 1 + sum(spans) if self.numel() else 0
            self._handle = SharedMemoryHandle(seg, first, extent * self.element_size())
        return self._handle

    def share_memory_(self) -> MemoryMappedTensor:
        """Return ``self`` with its memory shared between processes.

        A tensor mapped from a file, an archive or an anonymous segment is already shared and stays
        where it is; a ``MemoryMappedTensor(tensor)`` that wraps ordinary process memory has its
        storage moved into shared memory, as ``torch.Tensor.share_memory_`` does.

        Returns:
            ``self``.

        >>> from tdshare import MemoryMappedTensor
        >>> t = MemoryMappedTensor(torch.zeros(2))
        >>> t.is_shared(), t.share_memory_() is t, t.is_shared()
        (False, True, True)
        """
        if not self.is_shared():
            torch.Tensor.share_memory_(self)
        return self

    def is_shared(self) -> bool:
        """Whether the tensor's memory is shared between processes.

        True for a tensor mapped from a file, an archive or an anonymous segment; a
        ``MemoryMappedTensor(tensor)`` that wraps ordinary memory is not, until ``share_memory_()``.

        Returns:
            Whether another process can map the same memory.

        >>> from tdshare import MemoryMappedTensor
        >>> MemoryMappedTensor.zeros(2).is_shared(), MemoryMappedTensor(torch.zeros(2)).is_shared()
        (True, False)
        """
        if self._filename is not None or self._segment is not None or self._offset is not None:
            return True
        return torch.Tensor.is_shared(self)

    # -- views --------------------------------------------------------------------------------
    def _same_memory(self, out: Any) -> Any:
        # the result of indexing/splitting us is either a view of our memory or a fresh copy
        if isinstance(out, torch.Tensor) and out._is_view():
            view = MemoryMappedTensor._wrap(out, self._filename, self._segment, self._mode)
            view._offset = self._offset
            if self._segment is not None:  # a view shares its base's handle (made when first asked for)
                view._handle_base = self if self._handle_base is None else self._handle_base
            if self._offset is not None:
                view._ino = self._ino  # the archive's inode: a handle must not reach a replaced archive
            return view
        return out

    def __getitem__(self, index: Any) -> Any:
        if type(index) not in _PLAIN_INDEX and has_first_class_dim(index):
            raise InvalidArgumentError(
                "Using first class dimension indices with MemoryMappedTensor isn't supported: the result would "
                "not be a view of the mapped memory. Index a copy instead (tensor.clone()[dims])."
            )
        return self._same_memory(torch.Tensor.__getitem__(self, index))

    # -- pickling -----------------------------------------------------------------------------
    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return _reduce(self)


def _reduce(t: MemoryMappedTensor) -> tuple[Any, ...]:
    geometry = (t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())
    if t.numel() == 0:
        return (_rebuild_empty, (t.dtype, tuple(t.shape)))
    if t._segment is not None:
        return (
            _rebuild_segment_view,
            (t._segment, t.untyped_storage().data_ptr() - t._segment.buffer.data_ptr(), *geometry),
        )
    if t._filename is not None and t._offset is not None:  # a view into a .tdz archive
        where = (t._filename, t.untyped_storage().nbytes(), t._offset, t._ino, t._mode)
        return (_rebuild_archive_view, (*where, *geometry))
    if t._filename is not None:
        numel = t.untyped_storage().nbytes() // t.dtype.itemsize
        return (_rebuild_file_view, (t._filename, numel, t._mode, *geometry))
    raise MemmapError(
        "This MemoryMappedTensor has neither a file nor a shared segment, so it cannot be sent to another "
        "process by reference: create it with MemoryMappedTensor.from_tensor(...) instead."
    )


def _rebuild_empty(dtype: torch.dtype, shape: tuple[int, ...]) -> MemoryMappedTensor:
    return MemoryMappedTensor._wrap(torch.empty(shape, dtype=dtype), None, None, None)


def _rebuild_segment_view(
    seg: Segment, base: int, dtype: torch.dtype, shape: tuple, stride: tuple, offset: int
) -> MemoryMappedTensor:
    storage = seg.buffer[base:].view(dtype)
    return MemoryMappedTensor._wrap(storage.as_strided(shape, stride, offset), None, seg, None)


def _rebuild_file_view(
    path: str, numel: int, mode: str | None, dtype: torch.dtype, shape: tuple, stride: tuple, offset: int
) -> MemoryMappedTensor:
    flat = map_file(path, dtype, numel, mode)
    return MemoryMappedTensor._wrap(flat.as_strided(shape, stride, offset), path, None, mode)


def _rebuild_archive_view(
    path: str,
    nbytes: int,
    payload: int,
    ino: int | None,
    mode: str | None,
    dtype: torch.dtype,
    shape: tuple,
    stride: tuple,
    offset: int,
) -> MemoryMappedTensor:
    """A view into a mapping of a whole .tdz archive (``offset`` counts elements from the file start)."""
    if ino is not None and os.stat(path).st_ino != ino:
        raise MemmapError(
            f"The archive {path!r} was replaced after this tensor was loaded from it, so its bytes moved: load the "
            "archive again and send the new tensordict."
        )
    flat = map_archive(path, nbytes, mode)
    typed = flat[: nbytes - nbytes % dtype.itemsize].view(dtype)
    out = MemoryMappedTensor._wrap(typed.as_strided(shape, stride, offset), path, None, mode)
    out._offset, out._ino = payload, ino
    return out


ForkingPickler.register(MemoryMappedTensor, _reduce)
