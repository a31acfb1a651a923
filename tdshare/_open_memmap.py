"""Create-or-attach: ``open_memmap(prefix, like)`` opens the tree saved at ``prefix``, creating it
from ``like`` when it does not exist yet, safely when many processes race to do the same.

The reference has no such call: choosing between ``load_memmap`` and ``memmap_`` by whether
``meta.json`` exists is racy (two processes both see no tree and both write; a third loads a
folder half written).  Here:

- a process that finds ``meta.json`` attaches at once (``load_memmap``, then ``memmap_()`` into
  the same folder, which writes nothing);
- otherwise it takes the tree's lock (the ``flock`` of :class:`tdshare.SharedRegistry`, which the
  kernel drops if its holder dies) and looks again: the first holder creates the tree through an
  atomic save (every file written in a staging folder beside ``prefix``, then one ``rename``), the
  others wait on the lock (in the kernel, not in a sleep loop), find the tree and attach.

So exactly one process writes, nobody ever sees a half-made folder, and all end with the same
contents.  :class:`OpenOps` puts the call on ``TensorDict`` and ``LazyStackedTensorDict`` as a
classmethod; ``tdshare.open_memmap`` is the same call for any container kind (a tensorclass too).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from ._coordination import SharedRegistry
from ._dataloader import is_tensor_collection
from ._errors import ArgumentTypeError, InvalidArgumentError
from ._format import META_FILE

__all__ = ["OpenOps", "open_with"]

T = TypeVar("T")
PathLike = str | os.PathLike


def _check(prefix: Any, like: Any, timeout: Any) -> str:
    """Validate the arguments (before anything is created); return the absolute prefix."""
    if not isinstance(prefix, (str, os.PathLike)):
        raise ArgumentTypeError(
            f"open_memmap: prefix must be a folder path (str or os.PathLike), got {type(prefix).__name__}."
        )
    path = os.path.abspath(os.fspath(prefix))
    if path.endswith(".tdz"):
        raise InvalidArgumentError(
            f"open_memmap: prefix {path!r} names an archive (.tdz), which is read-only once written; "
            "give a folder path, or use td.save(path) and TensorDict.load(path) for archives."
        )
    if not is_tensor_collection(like) and not callable(like):
        raise ArgumentTypeError(
            "open_memmap: like must be a tensor collection (a TensorDict, a lazy stack, a tensorclass "
            f"instance) or a function of no arguments that returns one, got {type(like).__name__}."
        )
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ArgumentTypeError(f"open_memmap: timeout must be a number of seconds or None, got {timeout!r}.")
        if timeout < 0:
            raise InvalidArgumentError(f"open_memmap: timeout must be >= 0 seconds or None, got {timeout!r}.")
    return path


def open_with(
    cls: Any,
    prefix: PathLike,
    like: Any | Callable[[], Any],
    *,
    timeout: float | None = None,
    allow_pickle: bool | None = None,
) -> Any:
    """Open the tree saved at ``prefix``, or create it from ``like`` if there is none (race-free).

    Exactly one of any number of processes (or threads) calling this at once creates the tree;
    the creation is an atomic save (staging folder, then one rename), so no process ever sees a
    half-made folder; the others wait on the tree's lock and attach to what it wrote. Every
    caller gets a memory-mapped, locked collection of ``like``'s kind backed by ``prefix``
    (``make_memmap*`` and ``memmap_refresh_()`` work on it).

    Args:
        cls: the collection class whose ``load_memmap`` attaches (``TensorDict``: any saved kind).
        prefix: the folder of the tree (its parent folders are created if missing). An existing
            empty folder counts as missing.
        like: the content to create it with: a tensor collection, or a function of no arguments
            that returns one (called only by the process that creates, so the others build
            nothing).
        timeout: the most seconds to wait for another process's creation (None: no limit).
        allow_pickle: passed to ``load_memmap`` when attaching (None, the default, loads pickled
            non-tensor values with a ``FutureWarning``).

    Returns:
        The memory-mapped collection saved at ``prefix``.

    Raises:
        ArgumentTypeError: ``prefix`` is not a path, ``like`` is neither a collection nor a
            function, ``timeout`` is not a number; or ``like()`` did not return a collection.
        InvalidArgumentError: ``prefix`` names a ``.tdz`` archive, or ``timeout`` is negative.
        MemmapError: ``prefix`` is a non-empty folder that holds no saved tensordict.
        TimeoutError: another process held the tree's lock for longer than ``timeout``.

    >>> import tempfile, torch
    >>> from tdshare import TensorDict
    >>> folder = tempfile.mkdtemp() + "/buffer"
    >>> first = open_with(TensorDict, folder, lambda: TensorDict(obs=torch.zeros(4, 2), batch_size=[4]))
    >>> second = open_with(TensorDict, folder, lambda: TensorDict(obs=torch.ones(9), batch_size=[9]))
    >>> second["obs"].shape, first.saved_path == second.saved_path
    (torch.Size([4, 2]), True)
    """
    path = _check(prefix, like, timeout)
    meta = os.path.join(path, META_FILE)
    if os.path.isfile(meta):  # created atomically: a meta.json means a whole tree
        return cls.load_memmap(path, allow_pickle=allow_pickle).memmap_()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    registry = SharedRegistry.for_directory(path)
    lock = registry.lock()
    lock.acquire(timeout)
    try:
        if os.path.isfile(meta):  # another process created it while we waited
            return cls.load_memmap(path, allow_pickle=allow_pickle).memmap_()
        source: Any = like if is_tensor_collection(like) else like()
        if not is_tensor_collection(source):
            raise ArgumentTypeError(
                f"open_memmap: like() must return a tensor collection to save at {path!r}, got {type(source).__name__}."
            )
        return source.memmap(path, atomic=True, existsok=True)
    finally:
        lock.release()


class OpenOps:
    """``open_memmap`` as a classmethod of the tensor collection classes.

    >>> import tempfile, torch
    >>> from tdshare import TensorDict
    >>> td = TensorDict.open_memmap(tempfile.mkdtemp() + "/t", TensorDict(a=torch.ones(2), batch_size=[2]))
    >>> td.is_memmap(), td["a"].tolist()
    (True, [1.0, 1.0])
    """

    @classmethod
    def open_memmap(
        cls,
        prefix: PathLike,
        like: Any | Callable[[], Any],
        *,
        timeout: float | None = None,
        allow_pickle: bool | None = None,
    ) -> Any:
        """Open the tree saved at ``prefix``, or create it from ``like`` (see :func:`open_with`).

        Args:
            prefix: the folder of the tree.
            like: a tensor collection, or a function of no arguments that returns one.
            timeout: the most seconds to wait for another process's creation (None: no limit).
            allow_pickle: passed to ``load_memmap`` when attaching.

        Returns:
            The memory-mapped collection saved at ``prefix`` (of the saved kind).

        Raises:
            ArgumentTypeError, InvalidArgumentError, MemmapError, TimeoutError: as
            :func:`open_with`.

        >>> import tempfile, torch
        >>> from tdshare import TensorDict
        >>> TensorDict.open_memmap(tempfile.mkdtemp() + "/t", TensorDict(a=torch.ones(2), batch_size=[2])).batch_size
        torch.Size([2])
        """
        return open_with(cls, prefix, like, timeout=timeout, allow_pickle=allow_pickle)
