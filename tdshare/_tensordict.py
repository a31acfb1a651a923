"""The public :class:`TensorDict` and the module-level ``load``/``load_memmap``/``save``/``memmap``."""

from __future__ import annotations

import os
import types
from typing import Any

from ._format import LAZY_STACK_TYPE
from ._memmap_family import MemmapFamily
from ._nodes import kind_for_tag
from ._nontensor import set_shape_host
from ._tensordict_base import rebuild_tensordict

__all__ = [
    "TensorDict",
    "TensorDictBase",
    "from_consolidated",
    "from_consolidated_parts",
    "load",
    "load_memmap",
    "save",
    "memmap",
    "open_memmap",
]

PathLike = str | os.PathLike


class TensorDictBase(MemmapFamily):
    """The base class of every tensordict class (``TensorDict``, ``LazyStackedTensorDict``,
    ``TypedTensorDict``): ``isinstance(x, TensorDictBase)`` tells a tensordict, and every method
    of the family (``memmap_``, ``save``, ``load_memmap_``, ``make_memmap_from_storage``...) is
    here, as in the reference.  It is abstract: make a :class:`TensorDict`; the class methods that
    load (``TensorDictBase.load_memmap(path)``) give the class the folder was saved from, a
    ``TensorDict`` for a plain one.

    The in-memory model (keys, indexing, locking, stacking, pickling) is
    :class:`tdshare._tensordict_base.TensorDictBase`; memory-mapping, saving and loading come from
    :class:`tdshare._memmap_family.MemmapFamily`.

    >>> import tempfile, torch
    >>> from tdshare import TensorDict, TensorDictBase
    >>> path = tempfile.mkdtemp()
    >>> _ = TensorDict(a=torch.ones(2), batch_size=[2]).save(path)
    >>> loaded = TensorDictBase.load_memmap(path)
    >>> type(loaded).__name__, isinstance(loaded, TensorDictBase), hasattr(TensorDictBase, "memmap_")
    ('TensorDict', True, True)
    >>> TensorDictBase()
    Traceback (most recent call last):
    ...
    TypeError: TensorDictBase is the abstract base of the tensordict classes: make a TensorDict instead.
    """

    _abstract_base = True  # TensorDictBase(...) itself is refused (see the model's __init__)

    @classmethod
    def _level_class(cls) -> type[Any]:
        return TensorDict if cls is TensorDictBase else cls  # what a load into the abstract base builds

    @classmethod
    def maybe_dense_stack(cls, tds: Any, dim: int = 0, *, out: Any = None, **kwargs: Any) -> Any:
        """A dense stack when the tensordicts share keys and shapes, else a lazy one (see
        ``LazyStackedTensorDict.maybe_dense_stack``, which this calls).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> a = TensorDict(x=torch.zeros(2))
        >>> type(TensorDict.maybe_dense_stack([a, TensorDict(x=torch.zeros(3))])).__name__
        'LazyStackedTensorDict'
        """
        lazy = kind_for_tag(LAZY_STACK_TYPE)  # the lazy stack sits above this module: found by its kind
        assert lazy is not None, "tdshare._lazy registers the lazy stack kind on import"
        stack: Any = lazy.cls
        return stack.maybe_dense_stack(tds, dim, out=out, **kwargs)


class TensorDict(TensorDictBase):
    """A dictionary of tensors with a common batch size that can be memory-mapped and shared.

    Every method comes from :class:`TensorDictBase`.

    >>> import tempfile, torch
    >>> from tdshare import TensorDict
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
    """Load the tensordict saved at ``prefix``: ``TensorDict.load_memmap(prefix, ...)`` (``load`` is the same).

    Args:
        prefix: the folder, or the ``.tdz`` archive file, that ``save``/``memmap`` wrote.
        *args, **kwargs: ``device``, ``mode``, ``allow_pickle``, ... as for
            :meth:`TensorDict.load_memmap`.

    Returns:
        The loaded tensordict, its leaves :class:`MemoryMappedTensor` views of the files.

    Raises:
        The errors of :meth:`TensorDict.load_memmap` (``FileNotFoundError`` when nothing is saved
        at ``prefix``).

    >>> import tempfile
    >>> from tdshare import TensorDict, load, save
    >>> with tempfile.TemporaryDirectory() as path:
    ...     _ = save(TensorDict(a=torch.arange(3), batch_size=[3]), path)
    ...     print(load(path)["a"].tolist(), load(path, mode="r").batch_size)
    [0, 1, 2] torch.Size([3])
    """
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
    >>> from tdshare import TensorDict, open_memmap
    >>> folder = tempfile.mkdtemp() + "/buffer"
    >>> open_memmap(folder, lambda: TensorDict(obs=torch.zeros(4, 2), batch_size=[4]))["obs"].shape
    torch.Size([4, 2])
    """
    return TensorDict.open_memmap(prefix, like, timeout=timeout, allow_pickle=allow_pickle)


def save(td: TensorDict, prefix: PathLike | None = None, *args: Any, **kwargs: Any) -> Any:
    """Save ``td`` to ``prefix`` and return a memory-mapped copy: ``td.save(prefix, ...)``.

    Existing files are overwritten; ``td`` is unchanged.  A prefix ending with ``.tdz`` writes one
    archive file.

    Args:
        td: the tensordict (or tensorclass instance, or lazy stack) to save.
        prefix: the folder to write (None: anonymous shared memory).
        *args, **kwargs: as for :meth:`TensorDict.save`.

    Returns:
        The memory-mapped copy, or a :class:`TensorDictFuture` of it with ``return_early=True``.

    Raises:
        The errors of :meth:`TensorDict.save`.

    >>> import os, tempfile
    >>> from tdshare import TensorDict, save
    >>> with tempfile.TemporaryDirectory() as path:
    ...     saved = save(TensorDict(a=torch.ones(2), batch_size=[2]), os.path.join(path, "td.tdz"))
    ...     print(os.listdir(path), saved["a"].tolist())
    ['td.tdz'] [1.0, 1.0]
    """
    return td.save(prefix, *args, **kwargs)


def memmap(td: TensorDict, prefix: PathLike | None = None, *args: Any, **kwargs: Any) -> Any:
    """Write ``td``'s files to ``prefix`` and return a new memory-mapped tensordict: ``td.memmap(prefix, ...)``.

    ``td`` is unchanged (:meth:`TensorDict.memmap_` converts in place).

    Args:
        td: the tensordict (or tensorclass instance, or lazy stack) to write.
        prefix: the folder to write (None: anonymous shared memory).
        *args, **kwargs: ``existsok``, ``num_threads``, ``atomic``, ... as for
            :meth:`TensorDict.memmap`.

    Returns:
        The new memory-mapped tensordict, or a :class:`TensorDictFuture` of it with
        ``return_early=True``.

    Raises:
        The errors of :meth:`TensorDict.memmap` (``RuntimeError`` for an existing file with
        ``existsok=False``).

    >>> import tempfile
    >>> from tdshare import TensorDict, memmap
    >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
    >>> with tempfile.TemporaryDirectory() as path:
    ...     out = memmap(td, path)
    ...     print(out.is_memmap(), td.is_memmap(), out.saved_path == path)
    True False True
    """
    return td.memmap(prefix, *args, **kwargs)


def from_consolidated(filename: PathLike) -> Any:
    """``TensorDict.from_consolidated(filename)``: read a file that ``consolidate(filename=...)`` wrote.

    Args:
        filename: the file.

    Returns:
        The tensordict, its leaves views of one copy-on-write mapping of the file.

    Raises:
        The errors of :meth:`TensorDict.from_consolidated` (``ValueError`` for a damaged file).

    >>> import os, tempfile
    >>> from tdshare import TensorDict, from_consolidated
    >>> with tempfile.TemporaryDirectory() as path:
    ...     file = os.path.join(path, "td.bin")
    ...     _ = TensorDict(a=torch.arange(3), batch_size=[3]).consolidate(filename=file)
    ...     print(from_consolidated(file)["a"].tolist())
    [0, 1, 2]
    """
    return TensorDict.from_consolidated(filename)


def from_consolidated_parts(buffer: Any, schema: dict) -> Any:
    """``TensorDict.from_consolidated_parts(buffer, schema)``: rebuild from :func:`tdshare.consolidated_parts`.

    Args:
        buffer: the 1-D ``uint8`` storage (its leaves are views of it, no copy).
        schema: the schema that came with it.

    Returns:
        The tensordict (a lazy stack or a tensorclass instance where the schema says so).

    Raises:
        The errors of :meth:`TensorDict.from_consolidated_parts` (``ValueError`` for a buffer that
        is not a 1-D ``uint8`` tensor).

    >>> from tdshare import TensorDict, consolidated_parts, from_consolidated_parts
    >>> buffer, schema = consolidated_parts(TensorDict(a=torch.arange(2), batch_size=[2]))
    >>> td = from_consolidated_parts(buffer, schema)
    >>> td["a"].tolist(), td["a"].data_ptr() == buffer.data_ptr()  # a view of the buffer, no copy
    ([0, 1], True)
    """
    return TensorDict.from_consolidated_parts(buffer, schema)


# Pickles made by tdshare 0.1.0 name ``tdshare._tensordict._rebuild`` (and ``tdshare._td.TensorDict``,
# see :mod:`tdshare._td`); both keep loading.
_rebuild = rebuild_tensordict

set_shape_host(TensorDict)  # a NonTensorData/NonTensorStack on its own reshapes through a TensorDict
