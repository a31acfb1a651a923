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

from ._format import LEAF_SUFFIX
from ._keys import encode_key
from ._leaf_handle import LeafHandle
from ._memmap import MemoryMappedTensor

__all__ = ["encode_leaf", "decode_leaf"]

# Leaves of a TensorDict are tensors, tensordicts or NonTensorData, never tuples, so a plain tuple
# (the most compact pickle) marks an encoded leaf unambiguously:
#   (dtype, shape) or (dtype, shape, mode)   the level's whole <enc(key)>.memmap file
#   (segment, byte offset, dtype, shape)     a contiguous leaf of an anonymous segment


def encode_leaf(value: Any, folder: str | None, key: str) -> Any:
    """The compact pickled form of a leaf of the level saved in ``folder`` under ``key``."""
    if type(value) is not MemoryMappedTensor:
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
    path = None if folder is None else os.path.join(folder, encode_key(key) + LEAF_SUFFIX)
    return LeafHandle.from_code(code, path).map()
