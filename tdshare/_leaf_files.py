"""Leaf files: write a tensor's bytes to its own file and hand back the leaf, mapped on first read.

A saved folder holds one file per leaf, so saving ten thousand small leaves is mostly system
calls: per leaf, a create, a write, an ``fstat`` for the inode (handles and refreshes use it to
tell a file from its replacement) and a close.  The file is not mapped: the result is a
:class:`~tdshare._lazy_leaves.PendingLeaf`, mapped on first read, as a loaded leaf is (a mapping
costs ~4.6 µs a leaf, a quarter of a small write, and one entry of ``vm.max_map_count``).  The
parts of a nested tensor, which a view joins at once, are mapped (``write_leaf(mapped=True)``).
:func:`write_batch` writes the leaves of a folder that was empty when the write began with one
system call fewer each: it creates, writes and closes every file, then lists the folder once and
takes the inode numbers from the listing.

A listing's inode numbers are not always ``st_ino`` (overlayfs and some FUSE file systems report
others), so a batch uses them only when they agree with ``fstat`` on its first file; when they do
not, every file of the batch is stat-ed instead, and the rest of the write uses :func:`write_leaf`.

A batch also takes the bytes of its small leaves in one step: runs of leaves that
``torch.cat`` can join (same dtype and trailing shape) are concatenated once and each file
gets a slice of the result.  The concatenation holds each leaf's C-order bytes in turn, with
conjugate and negative bits resolved, like :func:`~tdshare._files.tensor_buffer`, at about a
quarter of its cost per leaf (0.3 against 1.2 µs, 100 leaves a folder).  A run that
``torch.cat`` refuses (leaves on different devices) falls back to one leaf at a time.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Sequence
from ctypes import string_at
from typing import cast

import torch

from ._files import from_file, shaped, tensor_buffer, write_file, write_files_in
from ._format import META_FILE, shared_leaf_entry
from ._lazy_leaves import PendingLeaf
from ._memmap import MemoryMappedTensor

__all__ = ["LeafPlan", "Listing", "leaf_bytes", "plain_leaf", "write_batch", "write_leaf"]

_adopt = MemoryMappedTensor._adopt
# dtypes whose CPU concatenation is a plain byte copy in every torch we support
_JOINABLE = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128}
)
_JOIN_MAX_BYTES = 4096  # larger leaves are copied once, by themselves: joining saves nothing there
_JOIN_MAX_LEAVES = 1024  # at most 4 MiB joined at a time


class LeafPlan:
    """What the write path needs of a leaf's (shape, dtype), computed once for all leaves that share it."""

    __slots__ = ("dims", "dtype", "join", "nbytes", "numel", "shape")

    def __init__(self, shape: torch.Size, dtype: torch.dtype) -> None:
        self.shape = tuple(shape)  # one tuple for every pending leaf of this shape (see write_batch)
        self.numel = shape.numel()
        self.nbytes = self.numel * dtype.itemsize
        self.dtype = dtype
        self.dims: tuple[int, ...] | None = None if len(shape) == 1 else tuple(shape)
        # leaves with equal keys can be joined by torch.cat along their first dimension
        self.join = (
            (dtype, tuple(shape[1:]))
            if len(shape) >= 1 and dtype in _JOINABLE and 0 < self.nbytes <= _JOIN_MAX_BYTES
            else None
        )


@functools.lru_cache(maxsize=1024)
def plain_leaf(shape: torch.Size, dtype: torch.dtype) -> tuple[dict, str, LeafPlan]:
    """The metadata entry of a leaf, its JSON text and its :class:`LeafPlan`: one lookup per leaf."""
    entry, text = shared_leaf_entry(shape, dtype)
    return entry, text, LeafPlan(shape, dtype)


def _map(src: torch.Tensor, path: str, ino: int) -> MemoryMappedTensor:
    flat = from_file(path, True, src.numel(), src.dtype)
    return _adopt(flat if src.dim() == 1 else shaped(flat, tuple(src.shape)), path, ino)


def write_leaf(
    src: torch.Tensor, path: str, existsok: bool, *, mapped: bool = False
) -> MemoryMappedTensor | PendingLeaf:
    """Write the non-empty ``src`` as the file ``path`` (a new file, or a replacement); return the
    :class:`PendingLeaf` that maps it on first read (``mapped``: the file mapped now instead)."""
    ino = write_file(path, tensor_buffer(src, path), existsok=existsok)
    assert ino is not None
    return _map(src, path, ino) if mapped else _pending(src, path, ino)


def _pending(src: torch.Tensor, path: str, ino: int) -> PendingLeaf:
    where = path[: path.rfind(os.sep) + 1] + META_FILE
    return PendingLeaf(src.dtype, tuple(src.shape), path, None, None, 0, ino, where)


def leaf_bytes(
    srcs: Sequence[torch.Tensor], infos: Sequence[LeafPlan], paths: Sequence[str]
) -> list[memoryview | bytes]:
    """The bytes of every leaf ``srcs[i]`` (of :class:`LeafPlan` ``infos[i]``, for the file
    ``paths[i]``), in order; runs of joinable leaves are concatenated once (see the module docstring).

    Raises:
        NotSupportedError: a leaf on the meta device (no data; the message names its path).

    >>> info = plain_leaf(torch.Size([2]), torch.float32)[2]
    >>> [len(d) for d in leaf_bytes([torch.ones(2), torch.zeros(2)], [info, info], ["a", "b"])]
    [8, 8]
    """
    out: list[memoryview | bytes] = []
    add = out.append
    i, n = 0, len(srcs)
    while i < n:
        info = infos[i]
        join = info.join
        j = i + 1
        if join is not None:
            stop = min(n, i + _JOIN_MAX_LEAVES)
            while j < stop and (infos[j] is info or infos[j].join == join):
                j += 1
        if j - i > 1:
            try:
                flat: torch.Tensor | None = torch.cat(list(srcs[i:j]))
            except RuntimeError:  # e.g. leaves on different devices
                flat = None
            if flat is None or flat.is_meta:  # one leaf at a time (a meta leaf is refused by name there)
                j = i + 1
            else:
                if not flat.is_cpu:
                    flat = flat.cpu()
                # bytes, not a memoryview: slicing a few KiB copies them faster than a view is made
                blob = string_at(flat.data_ptr(), flat.nbytes)
                size = info.nbytes
                if infos[i:j].count(info) == j - i:  # one (shape, dtype): the usual run
                    out += [blob[k : k + size] for k in range(0, size * (j - i), size)]
                else:
                    start = 0
                    for inf in itertools.islice(infos, i, j):
                        end = start + inf.nbytes
                        add(blob[start:end])
                        start = end
                i = j
                continue
        add(tensor_buffer(srcs[i], paths[i]))
        i = j
    return out


class Listing:
    """Whether folder listings still look trustworthy in one write: False once one disagreed with ``fstat``."""

    __slots__ = ("trusted",)

    def __init__(self) -> None:
        self.trusted = True


def write_batch(
    folder: str,
    files: Sequence[tuple[torch.Tensor, str, LeafPlan]],
    existsok: bool,
    listing: Listing,
    names: Sequence[str] | None = None,
) -> list[PendingLeaf]:
    """Write the non-empty leaves ``(tensor, path, info)`` into ``folder`` (empty when the write
    began); return their :class:`PendingLeaf` handles, mapped on first read.

    Every file is written and closed (:func:`tdshare._files.write_files_in`, relative to the
    folder's descriptor); their inode numbers come from one listing of ``folder`` (see the module
    docstring).  ``names``: the files' names in ``folder``, when the caller has them already.
    """
    if not listing.trusted or len(files) < 2:
        return [
            _pending(src, path, cast(int, write_file(path, tensor_buffer(src, path), existsok=existsok)))
            for src, path, _ in files
        ]
    srcs, paths, infos = zip(*files, strict=True)
    if names is None:
        cut = len(folder) + len(os.sep)
        names = [path[cut:] for path in paths]
    inos = write_files_in(folder, names, leaf_bytes(srcs, infos, paths), existsok=existsok)
    if inos is None:
        listing.trusted = False
        inos = [os.stat(path).st_ino for path in paths]
    where, pend = folder + os.sep + META_FILE, PendingLeaf
    return [
        pend(info.dtype, info.shape, path, None, None, 0, ino, where)
        for path, info, ino in zip(paths, infos, inos, strict=True)
    ]
