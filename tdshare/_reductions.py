"""Compact pickling of memory-mapped leaves inside a TensorDict.

A leaf that is a whole file ``<level folder>/<enc(key)>.memmap`` pickles as ``(dtype, shape,
mode)``: the receiver rebuilds the path from the level's folder and the key, so a 1,000-leaf
tensordict costs a few dozen bytes per leaf, whatever the data size.  A leaf that is a
contiguous view of an anonymous segment pickles as ``(segment, byte offset, dtype, shape)``, the
segment itself once (pickle memoizes it).  Anything else (views, plain tensors, non-tensors)
pickles as itself.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ._files import jagged_from_buffer, nested_from_buffer, storage_filename
from ._format import LEAF_SUFFIX
from ._keys import encode_key
from ._lazy_leaves import LazyLeaves, PendingLeaf
from ._leaf_handle import LeafHandle
from ._memmap import MemoryMappedTensor
from ._segments import Segment

__all__ = ["decode_leaf", "decode_level", "encode_leaf", "encode_level"]

# Leaves of a TensorDict are tensors, tensordicts or NonTensorData, never tuples, so a plain tuple
# (the most compact pickle) marks an encoded leaf unambiguously:
#   (dtype, shape) or (dtype, shape, mode)   the level's whole <enc(key)>.memmap file
#   (segment, byte offset, dtype, shape)     a contiguous leaf of an anonymous segment
#   ("nested", jagged, dtype, sizes, mode)   a nested tensor viewing the level's <enc(key)>.memmap
#   ("nested", jagged, dtype, sizes, segment, offset)   a nested tensor viewing a slice of a segment
_NESTED = "nested"


def _encode_nested(value: torch.Tensor, folder: str | None, key: str) -> Any:
    """A nested tensor that views mapped memory (a leaf file, or a segment) pickles as a handle."""
    jagged = value.layout is torch.jagged
    try:
        buffer = value.values()
        sizes = [list(p.shape) for p in value.unbind()] if jagged else value._nested_tensor_size().tolist()
    except (RuntimeError, AttributeError):  # not a packed, contiguous nested tensor
        return value
    storage = buffer.untyped_storage()
    stored = storage_filename(storage)
    if stored is not None and folder is not None and stored == os.path.join(folder, encode_key(key) + LEAF_SUFFIX):
        if buffer.storage_offset() == 0:
            return (_NESTED, jagged, value.dtype, sizes, None)
        return value
    seg = Segment.of_storage(storage)
    if seg is not None:
        return (_NESTED, jagged, value.dtype, sizes, seg, buffer.data_ptr() - seg.buffer.data_ptr())
    return value


def _decode_nested(code: tuple[Any, ...], path: str | None) -> torch.Tensor:
    jagged, dtype, sizes = code[1], code[2], torch.tensor(code[3], dtype=torch.int64)
    build = jagged_from_buffer if jagged else nested_from_buffer
    numel = int(sizes.prod(-1).sum()) if sizes.numel() else 0
    if len(code) == 6:
        seg, offset = code[4], code[5]
        return build(seg.view(offset, dtype, torch.Size([numel])), sizes)
    assert path is not None
    return build(LeafHandle.file(path, dtype, (numel,), code[4]).map(), sizes)


def _leaf_path(folder: str, key: str) -> str:
    """``<folder>/<enc(key)>.memmap`` (an identifier is its own encoding: no call for it)."""
    return folder + os.sep + (key if key.isidentifier() else encode_key(key)) + LEAF_SUFFIX


def encode_leaf(value: Any, folder: str | None, key: str) -> Any:
    """The compact pickled form of a leaf of the level saved in ``folder`` under ``key``."""
    if (  # the common case, in few steps: a whole leaf file of this level, mapped
        type(value) is MemoryMappedTensor
        and folder is not None
        and value._offset is None
        and value._segment is None
        and value._filename is not None
        and value._filename == _leaf_path(folder, key)
        and value.storage_offset() == 0
        and value.is_contiguous()
        and 0 < value.numel() * value.dtype.itemsize == value.untyped_storage().nbytes()
    ):
        shape = tuple(value.shape)
        return (value.dtype, shape) if value._mode is None else (value.dtype, shape, value._mode)
    if type(value) is MemoryMappedTensor and value._segment is not None and value.numel() and value.is_contiguous():
        seg = value._segment  # a contiguous slice of an anonymous segment
        return (seg, value.data_ptr() - seg.buffer.data_ptr(), value.dtype, tuple(value.shape))
    if type(value) is PendingLeaf:  # not mapped here: its handle travels as it is
        if value.segment is not None:
            return value.code(None)
        if folder is not None and value.path == os.path.join(folder, encode_key(key) + LEAF_SUFFIX):
            return value.code(value.path)
        value = value.resolve()
    if type(value) is not MemoryMappedTensor:
        if isinstance(value, torch.Tensor) and value.is_nested:  # strided (a Tensor) or jagged (a subclass)
            return _encode_nested(value, folder, key)
        return value
    handle = LeafHandle.of(value)
    if handle is None:
        return value
    if handle.segment is not None:
        return handle.code(None)
    if folder is None or handle.path != os.path.join(folder, encode_key(key) + LEAF_SUFFIX):
        return value  # a file elsewhere: the tensor pickles itself
    return handle.code(handle.path)


def decode_leaf(code: Any, folder: str | None, key: str) -> Any:
    """The leaf that :func:`encode_leaf` encoded (mapped again in this process)."""
    if not isinstance(code, tuple):
        return code
    path = None if folder is None else _leaf_path(folder, key)
    if len(code) == 2 and path is not None and type(code[0]) is torch.dtype and all(code[1]):
        return PendingLeaf(code[0], tuple(code[1]), path)  # the common case: mapped when first read
    if len(code) == 4 and type(code[0]) is Segment and all(code[3]):
        return PendingLeaf(code[2], tuple(code[3]), None, None, code[0], code[1])
    if code[0] == _NESTED:
        return _decode_nested(code, path)
    handle = LeafHandle.from_code(code, path)
    if handle.numel == 0:
        return handle.map()
    return PendingLeaf.from_handle(handle)  # mapped (and its file checked) when first read


# A leaf's code, remembered on the tensor (``__dict__``) with what it depends on: the level's folder
# and key, the tensor's file / mode / segment / archive offset, and its version counter, which every
# in-place operation bumps, the ones that change its shape, strides or storage (``unsqueeze_``,
# ``t_``, ``set_``) too; a copy of the tensor is a new object, without the memo.  A second
# pickle of an unchanged leaf then costs two attribute reads instead of a dozen tensor calls.
_MEMO = "_tdshare_code"


def encode_level(d: dict, folder: str | None) -> dict:
    """The compact pickled form of a level's entries ``d`` (raw values: pending leaves stay unmapped).

    The same as :func:`encode_leaf` for every entry, with each memory-mapped leaf's code remembered
    on the leaf until the leaf changes (a hand-off of an unchanged tensordict re-checks nothing).
    """
    out = {}
    for key, value in dict.items(d):
        if type(value) is MemoryMappedTensor:
            memo = value.__dict__.get(_MEMO)
            state = (value._filename, value._mode, value._segment, value._offset)
            version = value._version
            if memo is not None and memo[0] == version and memo[1] == key and memo[2] == folder and memo[3] == state:
                out[key] = memo[4]
                continue
            code = encode_leaf(value, folder, key)
            if type(code) is tuple:
                value.__dict__[_MEMO] = (version, key, folder, state, code)
            out[key] = code
        else:
            out[key] = encode_leaf(value, folder, key)
    return out


# This process's last decoded levels by folder: (codes, entries).  Handing the same tensordict to a
# worker again (a DataLoader's batches, an actor's updates) sends equal codes, and the entries are
# then a copy of the ones made before (pending leaves are never changed, so copies share them).
_LEVELS: dict[str, tuple[dict, LazyLeaves]] = {}
_LEVELS_MAX = 4096


def decode_level(codes: dict, folder: str | None) -> dict:
    """The entries that :func:`encode_level` encoded: a :class:`LazyLeaves` when a leaf is pending.

    The common codes (a whole leaf file of this level, a contiguous slice of a segment) become
    pending leaves here directly; every other one goes through :func:`decode_leaf`.  The entries of
    a folder's level are remembered (for the next equal codes) when they are all its leaf files.
    """
    if folder is not None:
        known = _LEVELS.get(folder)
        # (only tuples compared: a tensor or a non-tensor value could answer == with anything)
        if known is not None and all(type(c) is tuple for c in codes.values()) and known[0] == codes:
            return known[1].copy()
    out: dict = {}
    pending = files = 0
    head = None if folder is None else folder + os.sep
    for key, code in codes.items():
        if type(code) is tuple:
            n = len(code)
            if n == 2 and head is not None and type(code[0]) is torch.dtype and all(code[1]):
                name = key if key.isidentifier() else encode_key(key)
                out[key] = PendingLeaf(code[0], code[1], head + name + LEAF_SUFFIX)
                files += 1
                continue
            if n == 4 and type(code[0]) is Segment and all(code[3]):
                out[key] = PendingLeaf(code[2], code[3], None, None, code[0], code[1])
                pending += 1
                continue
            code = decode_leaf(code, folder, key)
            pending += type(code) is PendingLeaf
        out[key] = code
    if not pending and not files:
        return out
    lazy = LazyLeaves(out)
    if folder is not None and files == len(out):  # (a segment's leaves are not kept alive here)
        if len(_LEVELS) >= _LEVELS_MAX:
            del _LEVELS[next(iter(_LEVELS))]
        _LEVELS[folder] = (codes, lazy.copy())
    return lazy
