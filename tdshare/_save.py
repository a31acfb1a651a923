"""One save path: ``memmap_``, ``memmap`` and ``save``/``dumps`` all come through :func:`save_tree`.

It picks the backend for the target (a ``.tdz`` archive, a folder, or anonymous memory when
there is no prefix and the tensordict has no folder of its own), checks that the backend can
honour the options (:meth:`tdshare._plan.TreeWriter.check`), and hands it the tree.  The
backends plan the tree with :func:`tdshare._plan.plan_tree` and write it: a new backend is one
:class:`tdshare._plan.TreeWriter` and one line in :func:`writer_for`.
"""

from __future__ import annotations

import os
from typing import Any

from ._archive import ArchiveWriter
from ._bulk import bulk
from ._errors import MemmapError
from ._options import SaveOptions
from ._plan import TreeWriter
from ._sub_views import is_sub_view
from ._tensordict_base import TensorDictBase
from ._write import FolderWriter
from ._write_anon import AnonymousWriter

__all__ = ["save_tree", "writer_for"]


def writer_for(td: TensorDictBase, prefix: str | os.PathLike | None, opts: SaveOptions) -> TreeWriter:
    """The backend that a save of ``td`` to ``prefix`` with ``opts`` writes through."""
    if opts.archive:
        assert prefix is not None  # SaveOptions.of refuses archive=True without a prefix
        return ArchiveWriter(prefix)
    if prefix is None:
        prefix = td._memmap_prefix  # memmap_() of a memory-mapped tensordict: its own folder
    if prefix is None:
        return AnonymousWriter()
    return FolderWriter(os.path.abspath(os.fspath(prefix)))


@bulk
def save_tree(td: TensorDictBase, prefix: str | os.PathLike | None, opts: SaveOptions, *, inplace: bool) -> Any:
    """Save ``td`` to ``prefix`` as ``opts`` say; ``inplace``: ``memmap_`` rather than ``memmap``.

    Returns the memory-mapped tensordict (``td`` itself when ``inplace``), or a
    :class:`tdshare.TensorDictFuture` for ``return_early=True`` with ``num_threads > 1``.

    Raises:
        MemmapError: ``inplace`` on a tensordict in shared memory, or on a sub-tensordict view.
        NotSupportedError, InvalidArgumentError: an option the backend cannot honour.
    """
    if inplace and td._is_shared:
        raise MemmapError(
            "memmap and shared memory are mutually exclusive features: this tensordict is in shared memory "
            "(share_memory_()); use memmap() to make a memory-mapped copy instead."
        )
    if inplace and is_sub_view(td):
        raise MemmapError(
            "Converting a sub-tensordict values to memmap cannot be done: its leaves are views of its parent's rows, "
            "and memmap_ would replace them by files the parent never sees. memmap_ the parent, or use memmap() "
            "for a memory-mapped copy of the rows."
        )
    writer = writer_for(td, prefix, opts)
    writer.check(opts)
    return writer.save(td, opts, inplace=inplace)
