"""Leaf files: write a tensor's bytes to its own file and map the file back as a MemoryMappedTensor.

A saved folder holds one file per leaf, so saving ten thousand small leaves is mostly system
calls: per leaf, a create, a write, an ``fstat`` for the inode (handles and refreshes use it to
tell a file from its replacement), a close, and the mapping.  :func:`write_batch` writes the
leaves of a folder that was empty when the write began with one system call fewer each: it creates,
writes and closes every file, then lists the folder once and takes the inode numbers from the
listing, then maps the files.

A listing's inode numbers are not always ``st_ino`` (overlayfs and some FUSE file systems report
others), so a batch uses them only when they agree with ``fstat`` on its first file; when they do
not, every file of the batch is stat-ed instead, and the rest of the write uses :func:`write_leaf`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from os import scandir
from typing import cast

import torch
from torch import from_file

from ._files import tensor_buffer, write_file, write_files
from ._memmap import MemoryMappedTensor

__all__ = ["write_leaf", "write_batch", "Listing"]

_adopt = MemoryMappedTensor._adopt


def _map(src: torch.Tensor, path: str, ino: int) -> MemoryMappedTensor:
    flat = from_file(path, True, src.numel(), dtype=src.dtype)
    return _adopt(flat if src.dim() == 1 else flat.view(src.shape), path, ino)


def write_leaf(src: torch.Tensor, path: str, existsok: bool) -> MemoryMappedTensor:
    """Write the non-empty ``src`` as the file ``path`` (a new file, or a replacement) and map it."""
    ino = write_file(path, tensor_buffer(src), existsok=existsok)
    assert ino is not None
    return _map(src, path, ino)


class Listing:
    """Whether folder listings still look trustworthy in one write: False once one disagreed with ``fstat``."""

    __slots__ = ("trusted",)

    def __init__(self) -> None:
        self.trusted = True


def write_batch(
    folder: str, files: Sequence[tuple[torch.Tensor, str]], existsok: bool, listing: Listing
) -> list[MemoryMappedTensor]:
    """Write the non-empty leaves ``(tensor, path)`` into ``folder`` (empty when the write began); map them.

    Every file is written and closed before the first is mapped; their inode numbers come from
    one listing of ``folder`` (see the module docstring).  The loops are written out: they run
    once per leaf, and a function call costs about as much as a system call here.
    """
    if not listing.trusted or len(files) < 2:
        return [write_leaf(src, path, existsok) for src, path in files]
    first = write_file(files[0][1], tensor_buffer(files[0][0]), existsok=existsok)
    write_files(((path, tensor_buffer(src)) for src, path in files[1:]), existsok=existsok)
    cut = len(folder) + len(os.sep)
    try:
        with scandir(folder) as entries:
            listed = {entry.name: entry.inode() for entry in entries}
    except OSError:  # a folder we may write but not list: stat each file
        listed = {}
    if listed.get(files[0][1][cut:]) != first:
        listing.trusted = False
        return [_map(src, path, os.stat(path).st_ino) for src, path in files]
    get, mapped, cls = listed.get, from_file, MemoryMappedTensor
    out = []
    for src, path in files:
        flat = mapped(path, True, src.numel(), dtype=src.dtype)
        if src.dim() != 1:
            flat = flat.view(src.shape)
        flat.__class__ = cls  # what _adopt does, written out
        leaf = cast(MemoryMappedTensor, flat)
        leaf._filename = path
        ino = get(path[cut:])
        leaf._ino = os.stat(path).st_ino if ino is None else ino
        out.append(leaf)
    return out
