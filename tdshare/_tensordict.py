"""The public :class:`TensorDict` and the module-level ``load``/``load_memmap``/``save``/``memmap``."""

from __future__ import annotations

import os
import types
from typing import Any

from ._memmap_family import MemmapFamily
from ._nontensor import set_shape_host
from ._tensordict_base import rebuild_tensordict

__all__ = [
    "TensorDict",
    "from_consolidated",
    "from_consolidated_parts",
    "load",
    "load_memmap",
    "save",
    "memmap",
    "open_memmap",
]

PathLike = str | os.PathLike


class TensorDict(MemmapFamily):
    """A dictionary of tensors with a common batch size that can be memory-mapped and shared.

    The in-memory model (keys, indexing, locking, stacking, pickling) is
    :class:`tdshare._tensordict_base.TensorDictBase`; memory-mapping, saving and loading come from
    :class:`tdshare._memmap_family.MemmapFamily`.

    >>> import tempfile, torch
    >>> td = TensorDict(obs=torch.zeros(3, 4), batch_size=[3])
    >>> td.memmap_(tempfile.mkdtemp()).is_memmap()
    True
    """

    def __class_getitem__(cls, item: Any) -> types.GenericAlias:
        """``TensorDict[str, torch.Tensor]``: an annotation that names the class (a generic alias of it),
        as in the reference; tensorclass fields so annotated hold a tensordict.

        >>> import torch
        >>> TensorDict[str, torch.Tensor].__origin__ is TensorDict
        True
        """
        return types.GenericAlias(cls, item)


def load_memmap(prefix: PathLike, *args: Any, **kwargs: Any) -> TensorDict:
    """``TensorDict.load_memmap(prefix, ...)``."""
    return TensorDict.load_memmap(prefix, *args, **kwargs)


load = load_memmap


def open_memmap(prefix: PathLike, like: Any, *, timeout: float | None = None, allow_pickle: bool | None = None) -> Any:
    """Open the tree saved at ``prefix``, or create it from ``like`` if there is none, race-free:
    ``TensorDict.open_memmap(prefix, like, ...)``.

    Of any number of processes calling it at once exactly one creates the tree (an atomic save,
    calling ``like`` if it is a function); the others wait on the tree's lock and attach.

    Args:
        prefix: the folder of the tree.
        like: a tensor collection (any kind, a tensorclass too), or a function of no arguments
            that returns one.
        timeout: the most seconds to wait for another process's creation (None: no limit).
        allow_pickle: passed to ``load_memmap`` when attaching.

    Returns:
        The memory-mapped collection saved at ``prefix``, of the saved kind.

    Raises:
        ArgumentTypeError, InvalidArgumentError, MemmapError, TimeoutError: see
        :func:`tdshare._open_memmap.open_with`.

    >>> import tempfile, torch
    >>> folder = tempfile.mkdtemp() + "/buffer"
    >>> open_memmap(folder, lambda: TensorDict(obs=torch.zeros(4, 2), batch_size=[4]))["obs"].shape
    torch.Size([4, 2])
    """
    return TensorDict.open_memmap(prefix, like, timeout=timeout, allow_pickle=allow_pickle)


def save(td: TensorDict, prefix: PathLike | None = None, *args: Any, **kwargs: Any) -> Any:
    """``td.save(prefix, ...)``."""
    return td.save(prefix, *args, **kwargs)


def memmap(td: TensorDict, prefix: PathLike | None = None, *args: Any, **kwargs: Any) -> Any:
    """``td.memmap(prefix, ...)``."""
    return td.memmap(prefix, *args, **kwargs)


def from_consolidated(filename: PathLike) -> Any:
    """``TensorDict.from_consolidated(filename)``: read a file that ``consolidate(filename=...)`` wrote."""
    return TensorDict.from_consolidated(filename)


def from_consolidated_parts(buffer: Any, schema: dict) -> Any:
    """``TensorDict.from_consolidated_parts(buffer, schema)``: rebuild from :func:`tdshare.consolidated_parts`."""
    return TensorDict.from_consolidated_parts(buffer, schema)


# Pickles made by tdshare 0.1.0 name ``tdshare._tensordict._rebuild`` (and ``tdshare._td.TensorDict``,
# see :mod:`tdshare._td`); both keep loading.
_rebuild = rebuild_tensordict

set_shape_host(TensorDict)  # a NonTensorData/NonTensorStack on its own reshapes through a TensorDict
