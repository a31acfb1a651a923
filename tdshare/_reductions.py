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

from ._files import map_file
from ._format import LEAF_SUFFIX
from ._keys import encode_key
from ._memmap import MemoryMappedTensor
from ._segments import Segment

__all__ = ["encode_leaf", "decode_leaf"]

# Leaves of a TensorDict are tensors, tensordicts or NonTensorData, never tuples, so a plain tuple
# (the most compact pickle) marks an encoded leaf unambiguously:
#   (dtype, shape) or (dtype, shape, mode)   the level's whole <enc(key)>.memmap file
#   (segment, byte offset, dtype, shape)     a contiguous leaf of an anonymous segment


def _whole(t: MemoryMappedTensor) -> bool:
    nbytes = t.numel() * t.dtype.itemsize
    return t.storage_offset() == 0 and t.is_contiguous() and nbytes == t.untyped_storage().nbytes()


def encode_leaf(value: Any, folder: str | None, key: str) -> Any:
    if type(value) is not MemoryMappedTensor or value.numel() == 0:
        return value
    if value._filename is not None and folder is not None and _whole(value):
        if value._filename == os.path.join(folder, encode_key(key) + LEAF_SUFFIX):
            shape = tuple(value.shape)
            return (value.dtype, shape) if value._mode is None else (value.dtype, shape, value._mode)
        return value
    seg = value._segment
    if seg is not None and value.is_contiguous():
        return (seg, value.data_ptr() - seg.buffer.data_ptr(), value.dtype, tuple(value.shape))
    return value


def decode_leaf(code: Any, folder: str | None, key: str) -> Any:
    if not isinstance(code, tuple):
        return code
    if isinstance(code[0], Segment):
        seg, offset, dtype, shape = code
        return MemoryMappedTensor._wrap(seg.view(offset, dtype, torch.Size(shape)), None, seg, None)
    dtype, shape = code[0], code[1]
    mode = code[2] if len(code) > 2 else None
    assert folder is not None
    path = os.path.join(folder, encode_key(key) + LEAF_SUFFIX)
    numel = 1
    for s in shape:
        numel *= s
    return MemoryMappedTensor._wrap(map_file(path, dtype, numel, mode).view(shape), path, None, mode)
