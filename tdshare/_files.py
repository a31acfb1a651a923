"""File primitives: create leaf files, replace files atomically, reserve space, map files.

The rules every writer follows (DESIGN.md §8):

* a file another process may have mapped is never truncated or rewritten in place: a new file is
  written under a temporary name in the same directory and renamed over the old one (or, for a
  file known to exist, swapped with it by ``renameat2(RENAME_EXCHANGE)``, then the old one
  unlinked: ext4 flushes a file renamed over another to the disk at once, ~100-300 µs a call);
* files are created with their bytes written (or their space reserved with ``posix_fallocate``),
  so a full disk raises ``OSError`` naming the path now, instead of ``SIGBUS`` at a later write;
* temporary names are unique per call and recognisable (``.<name>.tdshare-<pid>-<hex>.tmp``).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import mmap
import operator
import os
import secrets
import stat
import weakref
from collections.abc import Sequence
from os import scandir
from typing import Any

import torch

from ._errors import CorruptDataError, FileExistsRuntimeError, MemmapError, NotSupportedError
from ._mapping_limits import is_limit_error, limit_error

__all__ = [
    "TMP_MARK",
    "tmp_name",
    "tensor_buffer",
    "tensor_memory",
    "is_zero_broadcast",
    "zero_broadcast",
    "shaped",
    "no_data_error",
    "write_file",
    "write_files_in",
    "replace_file",
    "reserve_file",
    "map_file",
    "map_archive",
    "exchange",
    "storage_filename",
    "from_file",
    "nested_from_buffer",
    "jagged_from_buffer",
    "may_write",
    "check_not_symlink",
]

TMP_MARK = ".tdshare-"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC


def tmp_name(path: str) -> str:
    head, sep, tail = path.rpartition(os.sep)
    return f"{head}{sep}.{tail}{TMP_MARK}{_PID}-{_TOKEN}{next(_COUNTER):x}.tmp"


# unique per call: the pid, a random token per process (a new one in a fork child) and a counter
_PID = os.getpid()
_TOKEN = secrets.token_hex(4)
_COUNTER = itertools.count()


def _after_fork_in_child() -> None:
    global _PID, _TOKEN
    _PID = os.getpid()
    _TOKEN = secrets.token_hex(4)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def tensor_buffer(tensor: torch.Tensor, dest: str | None = None) -> memoryview | bytes:
    """The C-order bytes of a tensor: a view of a contiguous CPU tensor's memory, else a CPU copy.

    Small ones (up to 64 KiB) come as ``bytes``: one C copy costs less than building a view.
    ``dest``, the file the bytes are for, names the tensor if it has no data (the meta device).
    """
    nbytes = tensor.nbytes
    if 0 < nbytes <= _SMALL and tensor.is_cpu and tensor.is_contiguous() and not tensor.is_conj():
        if not tensor.is_neg():  # the common small leaf, in few steps (a save of thousands)
            return ctypes.string_at(tensor.data_ptr(), nbytes)
    if nbytes > _SMALL and is_zero_broadcast(tensor):  # memmap_like's buffers: never in memory
        return _zero_pages(nbytes)
    t = tensor.detach() if tensor.requires_grad else tensor
    if not t.is_cpu:
        if t.is_meta:
            raise no_data_error(f"Cannot write {'the file ' + repr(dest) if dest is not None else 'a file'}")
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    if 0 < nbytes <= _SMALL:
        return ctypes.string_at(t.data_ptr(), nbytes)
    return tensor_memory(t)


_SMALL = 1 << 16


def is_zero_broadcast(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one zero element broadcast to its shape (every stride 0, all bytes of
    the element zero), as ``memmap_like`` builds its leaves: written without being materialized.

    >>> is_zero_broadcast(torch.zeros((), dtype=torch.int16).expand(4, 5)), is_zero_broadcast(torch.zeros(3))
    (True, False)
    """
    if tensor.dim() == 0 or tensor.layout != torch.strided or not tensor.is_cpu or any(tensor.stride()):
        return False
    if tensor.is_conj() or tensor.is_neg() or tensor.numel() == 0:
        return False
    size = tensor.element_size()
    return ctypes.string_at(tensor.data_ptr(), size) == bytes(size)  # -0.0 is not all zero bytes


def zero_broadcast(tensor: torch.Tensor) -> torch.Tensor:
    """A zero of ``tensor``'s dtype broadcast to its shape, on the CPU: no memory of its size (a
    nested or sparse tensor, which cannot be broadcast, gives ``zeros_like`` of it).

    >>> z = zero_broadcast(torch.ones(1000, 1000))
    >>> z.shape, z.stride(), is_zero_broadcast(z)
    (torch.Size([1000, 1000]), (0, 0), True)
    """
    if tensor.layout != torch.strided or tensor.is_nested or tensor.dim() == 0:
        return torch.zeros_like(tensor, device="cpu")
    return torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)


class _ZeroPages(mmap.mmap):
    """A private, read-only anonymous mapping: reads give the kernel's shared zero page, nothing is
    allocated.  A write of one whole is a ``ftruncate`` (a sparse file) instead of copying zeros."""


def _zero_pages(nbytes: int) -> memoryview:
    return memoryview(_ZeroPages(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ))


def _is_zero_pages(data: memoryview | bytes) -> bool:
    return data.__class__ is memoryview and data.obj.__class__ is _ZeroPages


def no_data_error(what: str, fix: str = "") -> NotSupportedError:
    """The error for a tensor on the meta device, which has a shape and a dtype but no data to write."""
    return NotSupportedError(
        f"{what}: its tensor is on the meta device, which holds a shape and a dtype but no data. "
        + (fix or "Materialize it first (e.g. torch.zeros_like(t, device='cpu')) or leave it out.")
    )


def shaped(flat: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``flat.view(shape)``, faster: ``view(*ints)`` takes 1.2 µs here, a tuple 1.8 and a ``torch.Size`` 3.0.

    Saving or loading thousands of multi-dimensional leaves calls it once per leaf.
    """
    return flat.view(*shape) if shape else flat.view(())


def tensor_memory(t: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory, without a copy (or numpy).

    The view keeps ``t`` alive.
    """
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(bytearray())
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("tensor_memory needs a contiguous CPU tensor")
    raw = (ctypes.c_ubyte * nbytes).from_address(t.data_ptr())
    raw._owner = t  # type: ignore[attr-defined]  # the tensor outlives every view of its memory
    return memoryview(raw).cast("B")


def _write_all(fd: int, data: memoryview | bytes, path: str) -> None:
    total = len(data)
    done = 0
    try:
        if _is_zero_pages(data):  # the file is new and empty up to here: its end moved, no page written
            end = os.lseek(fd, 0, os.SEEK_CUR) + total
            os.ftruncate(fd, end)
            os.lseek(fd, end, os.SEEK_SET)
            return
        done = os.write(fd, data)  # whole, mostly: the kernel stops at ~2 GiB a call
        if done < total:
            view = memoryview(data)
            while done < total:
                done += os.write(fd, view[done:])
    except OSError as err:
        raise _write_failed(err, total, done, path) from err


def _write_failed(err: OSError, total: int, done: int, path: str) -> OSError:
    """The error of a failed write, naming the file and how far it got (its errno kept)."""
    return OSError(err.errno, f"{err.strerror or err}: writing {total} bytes to {path!r} failed after {done}")


def check_not_symlink(path: str, fix: str = "Remove the link, or save elsewhere.") -> None:
    """Refuse to write through ``path`` when it is a symbolic link (checked before anything is
    created or replaced: a link may point at a file the caller never meant to overwrite).

    Raises:
        MemmapError: ``path`` is a symbolic link; ``fix`` says what to do instead.
    """
    try:
        is_link = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:  # missing (the usual case), or an unreadable folder that the write reports
        return
    if is_link:
        raise MemmapError(
            f"Refusing to write through symlink {path!r}: the link would redirect the write to another file. {fix}"
        )


def write_file(path: str, data: memoryview | bytes, *, existsok: bool = True, stat: bool = True) -> int | None:
    """Write ``data`` as the whole content of ``path``; return the file's inode (None: ``stat=False``).

    A new path is created exclusively and written.  An existing path is replaced by a new inode
    (write to a temporary name, then rename), so processes that mapped the old file keep reading
    its old bytes instead of seeing it truncated.
    """
    try:
        fd = os.open(path, _NEW_FILE, 0o666)
    except FileExistsError:
        if not existsok:
            raise FileExistsRuntimeError(
                f"The file {path!r} already exists and existsok=False. Pass existsok=True to overwrite it."
            ) from None
        check_not_symlink(path)
        return replace_file(path, data, stat=stat)
    try:
        _write_all(fd, data, path)
        ino = os.fstat(fd).st_ino if stat else None
    except BaseException:
        os.close(fd)
        _unlink_quietly(path)
        raise
    os.close(fd)
    return ino


def write_files_in(
    folder: str, names: Sequence[str], blobs: Sequence[memoryview | bytes], *, existsok: bool = True
) -> list[int] | None:
    """:func:`write_file` for the files ``folder``/``names[i]`` with the bytes ``blobs[i]``, in one
    loop (thousands of small leaves), and their inodes from one listing of ``folder``.

    Past a few files they are created relative to one descriptor of ``folder``: the kernel then
    looks up one name per file instead of walking the whole path.  Returns None when the
    listing's inode numbers disagree with ``fstat`` on the first file (overlayfs and some FUSE
    file systems report others) or the folder cannot be listed: the caller stats the files.

    Raises:
        OSError: a file cannot be created or written (the error names its full path; files
            written before it stay, for the caller to remove).
    """
    head = folder + os.sep
    first = write_file(head + names[0], blobs[0], existsok=existsok)
    dfd = os.open(folder, _AT_FOLDER) if len(names) >= _AT_MIN else None
    targets = names if dfd is not None else [head + n for n in names]
    full = head.__add__ if dfd is not None else str  # a target's full path (for errors)
    open_, write, close, new = os.open, os.write, os.close, _NEW_FILE
    fd = -1
    target = ""
    try:
        for target, blob in zip(itertools.islice(targets, 1, None), itertools.islice(blobs, 1, None), strict=True):
            try:
                fd = open_(target, new, 0o666, dir_fd=dfd)
            except FileExistsError:
                write_file(full(target), blob, existsok=existsok, stat=False)
                continue
            try:
                done = 0 if _is_zero_pages(blob) else write(fd, blob)
            except OSError as err:
                raise _write_failed(err, len(blob), 0, full(target)) from err
            if done != len(blob):  # the kernel stops at ~2 GiB a call (or zero pages, never written)
                _write_all(fd, memoryview(blob)[done:], full(target))
            close(fd)
            fd = -1
    except OSError as err:
        path = full(target)
        if fd >= 0:
            os.close(fd)
            _unlink_quietly(path)
        if err.filename is not None and err.filename != path:  # relative to the folder's descriptor
            raise OSError(err.errno, err.strerror, path) from None
        raise
    except BaseException:
        if fd >= 0:
            os.close(fd)
            _unlink_quietly(full(target))
        raise
    finally:
        if dfd is not None:
            os.close(dfd)
    try:
        with scandir(folder) as it:
            entries = list(it)
        listed = dict(zip(map(_NAME, entries), map(_INODE, entries), strict=True))  # C loops, no Python one
    except OSError:  # a folder we may write but not list
        return None
    if listed.get(names[0]) != first:
        return None
    inos: list[Any] = list(map(listed.get, names))
    if None in inos:  # (removed meanwhile by someone else: stat-ing it reports that)
        inos = [os.stat(head + n).st_ino if i is None else i for n, i in zip(names, inos, strict=True)]
    return inos


_AT_FOLDER = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC
_NAME, _INODE = operator.attrgetter("name"), operator.methodcaller("inode")
_AT_MIN = 8  # files: below, the folder's own open and close cost more than the shorter lookups save


def replace_file(path: str, data: memoryview | bytes, *, stat: bool = False, existing: bool = False) -> int | None:
    """Atomically replace (or create) ``path`` with ``data`` (temporary file + rename).

    ``existing``: the caller knows ``path`` exists (a level's ``meta.json`` being rewritten): the
    new file is swapped with it (``renameat2(RENAME_EXCHANGE)``) and the old one unlinked, as
    atomic for readers as a rename; where the file system cannot swap (or ``path`` is gone) it is
    renamed over as usual.  On ext4 a rename over an existing file starts writing the new one to
    the disk at once (its ``auto_da_alloc`` heuristic), ~100-300 µs; the swap costs ~12 µs.

    Returns the new file's inode with ``stat=True``, else None.
    """
    tmp = tmp_name(path)
    fd = os.open(tmp, _NEW_FILE, 0o666)
    try:
        _write_all(fd, data, path)
        ino = os.fstat(fd).st_ino if stat else None
        os.close(fd)
        fd = -1
        if existing and exchange(tmp, path):
            _unlink_quietly(tmp)  # the old file, now under the temporary name
        else:
            os.replace(tmp, path)
        return ino
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _unlink_quietly(tmp)
        raise


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
_renameat2: list[Any] = []  # [libc's renameat2, or None where there is none], looked up on first use


def exchange(a: str, b: str) -> bool:
    """Swap the paths ``a`` and ``b`` (files or folders) atomically, with ``renameat2(RENAME_EXCHANGE)``;
    False (nothing changed) where that cannot be done (no such call, or a file system without it)."""
    if not _renameat2:
        fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        _renameat2.append(fn)
    fn = _renameat2[0]
    return fn is not None and fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def reserve_file(path: str, nbytes: int, *, existsok: bool = True) -> None:
    """Create ``path`` holding ``nbytes`` zero bytes with the space reserved on disk.

    An existing file is replaced by a new zero-filled inode: stale bytes are never reused.
    """
    target = path
    exists = os.path.lexists(path)
    if exists:
        if not existsok:
            raise FileExistsRuntimeError(
                f"The file {path!r} already exists and existsok=False. Pass existsok=True to overwrite it."
            )
        check_not_symlink(path)
        target = tmp_name(path)
    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o666)
    try:
        if nbytes:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as err:
                if err.errno in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
                    os.ftruncate(fd, nbytes)  # file systems without fallocate: best effort
                else:
                    raise OSError(
                        err.errno,
                        f"{os.strerror(err.errno or 0)}: cannot reserve {nbytes} bytes for {path!r}",
                    ) from err
        os.close(fd)
        fd = -1
        if exists:
            os.replace(target, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        _unlink_quietly(target)
        raise


def may_write(st: os.stat_result) -> bool:
    """Whether this process may write the file ``st`` describes, judged from its mode bits."""
    euid = os.geteuid()
    if euid == 0:
        return True
    if st.st_uid == euid:
        return bool(st.st_mode & stat.S_IWUSR)
    if st.st_gid in os.getgroups() or st.st_gid == os.getegid():
        return bool(st.st_mode & stat.S_IWGRP)
    return bool(st.st_mode & stat.S_IWOTH)


def map_file(
    path: str, dtype: torch.dtype, numel: int, mode: str | None, st: os.stat_result | None = None
) -> torch.Tensor:
    """Map ``numel`` elements of ``path`` as a flat tensor.

    ``mode`` None maps shared when this process may write the file (judged from the mode bits
    of ``st``, the file's stat when the caller has it), else copy-on-write; ``"r"`` maps
    copy-on-write (writes stay in this process); ``"r+"`` maps shared and needs a writable file.
    The file must already hold at least ``numel`` elements: it is never grown.

    Raises:
        CorruptDataError: the file is missing or shorter than ``numel`` elements.
        PermissionError: ``"r+"`` on a file this process may not write.
    """
    nbytes = numel * dtype.itemsize
    if st is None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise CorruptDataError(f"The file {path!r} is missing: expected {nbytes} bytes of {dtype} data.") from None
    if st.st_size < nbytes:
        raise CorruptDataError(
            f"The file {path!r} holds {st.st_size} bytes but {nbytes} are expected "
            f"({numel} elements of {dtype}): it is truncated. Save the tensordict again."
        )
    if mode == "r+" and not os.access(path, os.W_OK):
        raise PermissionError(f"Cannot open {path!r} with mode='r+': the file is not writable.")
    if numel == 0:
        return torch.empty(0, dtype=dtype)
    if mode == "r":
        return from_file(path, False, numel, dtype)
    if mode is None and not may_write(st):
        return from_file(path, False, numel, dtype)
    try:
        return from_file(path, True, numel, dtype)
    except RuntimeError:
        # opening for writing refused although the mode bits allow it (ACLs, a read-only mount):
        # mode None maps privately, as access() would have decided
        if mode == "r+" or os.access(path, os.W_OK):
            raise
        return from_file(path, False, numel, dtype)


def from_file(path: str, shared: bool, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """``torch.from_file(path, shared, numel, dtype=dtype)``; the kernel refusing the mapping or
    the descriptor (``vm.max_map_count``, ``RLIMIT_NOFILE``) raises :class:`ResourceLimitError`.

    Raises:
        ResourceLimitError: the mapping or the file's descriptor is refused by a kernel limit.
    """
    try:
        return _torch_from_file(path, shared, numel, dtype=dtype)
    except RuntimeError as err:
        if is_limit_error(err):
            raise limit_error(err, path) from err
        raise


_torch_from_file = torch.from_file


def nested_from_buffer(buffer: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """A strided nested tensor viewing ``buffer`` (its elements packed one after the other) as the
    pieces whose shapes are the rows of ``sizes`` (int64, ``[pieces, ndim]``): no copy."""
    table = torch.Tensor.as_subclass(sizes, torch.Tensor).to(torch.int64).clone()
    strides, offsets = torch._nested_compute_contiguous_strides_offsets(table)
    flat = torch.Tensor.as_subclass(buffer, torch.Tensor).reshape(-1)
    return torch._nested_view_from_buffer(flat, table, strides, offsets)


def jagged_from_buffer(buffer: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor viewing ``buffer`` as the pieces whose shapes are the rows of ``sizes``
    (they may differ in their first dim only): no copy."""
    table = torch.Tensor.as_subclass(sizes, torch.Tensor).to(torch.int64)
    rest = [int(d) for d in table[0, 1:]] if len(table) else []
    offsets = torch.zeros(len(table) + 1, dtype=torch.int64)
    torch.cumsum(table[:, 0], 0, out=offsets[1:])
    flat = torch.Tensor.as_subclass(buffer, torch.Tensor).reshape(-1, *rest)
    return torch.nested.nested_tensor_from_jagged(flat, offsets)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# (path, mode, size, inode) -> the storage mapping that archive: the leaves of one archive that a
# process receives share one mapping (one per leaf would exhaust the address space for big archives)
_ARCHIVE_MAPS: dict[tuple[str, str | None, int, int], weakref.ref[torch.UntypedStorage]] = {}


def map_archive(path: str, nbytes: int, mode: str | None) -> torch.Tensor:
    """A uint8 tensor over the first ``nbytes`` of the archive ``path``, one mapping per archive per process."""
    key = (path, mode, nbytes, os.stat(path).st_ino)
    ref = _ARCHIVE_MAPS.get(key)
    storage = ref() if ref is not None else None
    if storage is not None:
        return torch.empty(0, dtype=torch.uint8).set_(storage)
    flat = map_file(path, torch.uint8, nbytes, mode)

    def forget(r: weakref.ref[torch.UntypedStorage], key: tuple[str, str | None, int, int] = key) -> None:
        if _ARCHIVE_MAPS.get(key) is r:
            del _ARCHIVE_MAPS[key]

    _ARCHIVE_MAPS[key] = weakref.ref(flat.untyped_storage(), forget)
    return flat


def storage_filename(storage: torch.UntypedStorage) -> str | None:
    """The absolute path of the file behind ``storage``, or None (no file, or an anonymous segment)."""
    name = getattr(storage, "filename", None)
    if not name or name.startswith("/proc/self/fd/"):
        return None  # no file, or one of our anonymous segments
    return os.path.abspath(name)
