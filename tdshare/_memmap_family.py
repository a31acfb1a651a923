"""The memory-mapping family: ``memmap_``, ``memmap``, ``save``/``dumps``, ``load_memmap``/``load``,
``load_memmap_``, ``make_memmap*``, ``memmap_refresh_``, ``is_memmap``, ``saved_path``
(the live-entry methods, ``make_memmap*`` and ``memmap_refresh_``, come from
:class:`tdshare._live_entries.LiveEntryOps`).

:class:`MemmapFamily` is the one place these methods live: every tensor collection class
(``TensorDict`` today) gets them by deriving from it next to the in-memory model
(:class:`tdshare._tensordict_base.TensorDictBase`).  The methods check their arguments
(:class:`tdshare._options.SaveOptions` for the saves) and delegate to the I/O modules:
:mod:`tdshare._save` (every save, through one backend), :mod:`tdshare._read`,
:mod:`tdshare._entries` and :mod:`tdshare._refresh`.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal, TypeVar, overload

from ._files import zero_broadcast
from ._future import TensorDictFuture
from ._live_entries import LiveEntryOps
from ._map import MapOps
from ._open_memmap import OpenOps
from ._options import SaveOptions
from ._progress import ProgressCallback
from ._read import load_into, load_tree
from ._save import save_tree
from ._tensordict_base import TensorDictBase

__all__ = ["MemmapFamily"]

T = TypeVar("T", bound="MemmapFamily")
PathLike = str | os.PathLike


class MemmapFamily(
    MapOps,  # map, map_iter
    OpenOps,  # open_memmap (create-or-attach)
    LiveEntryOps,  # make_memmap*, memmap_refresh_
    TensorDictBase,
):
    """The memory-mapping, saving and loading methods of every tensor collection class.

    >>> import tempfile, torch
    >>> from tdshare import TensorDict
    >>> td = TensorDict(obs=torch.zeros(3, 4), batch_size=[3]).memmap_(tempfile.mkdtemp())
    >>> td.is_memmap(), TensorDict.load_memmap(td.saved_path)["obs"].shape
    (True, torch.Size([3, 4]))
    """

    # -- memory-mapping -----------------------------------------------------------------------
    @overload
    def memmap_(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: Literal[False] = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T: ...

    @overload
    def memmap_(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T | TensorDictFuture[T]: ...

    def memmap_(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T | TensorDictFuture[T]:
        """Write every leaf to a memory-mapped file in place, lock the tensordict, and return it.

        Each leaf becomes a :class:`MemoryMappedTensor` (its ``data_ptr()`` changes), the device
        becomes cpu, and the tensordict is locked: in-place writes work, adding, removing or
        replacing an entry does not (except through ``make_memmap*``).  ``is_memmap()`` is True
        until ``unlock_()``.

        Args:
            prefix: the folder to write. None (the default) writes into the tensordict's own
                folder if it is memory-mapped there, else into anonymous shared memory, which has
                no file name and is freed with the last process using it.
            copy_existing: False (the default) refuses a leaf already memory-mapped to a file at
                another path; True copies it.
            num_threads: threads that write the files (0 and 1: the calling thread).
            return_early: with ``num_threads > 1``, return a :class:`TensorDictFuture` at once.
            share_non_tensor: non-tensor values written in place in one process are seen by the
                others at their next read.
            existsok: False refuses a file that exists at a leaf's path (its own file included);
                True (the default) overwrites it.
            robust_key: True (the default; None too) percent-encodes keys in file names; False
                uses keys as file names unchanged (the legacy layout).
            atomic: write next to ``prefix`` and rename into place, so a crash leaves the old
                folder.
            progress: a callable ``progress(done, total)``, called as leaf files are written
                (not with ``return_early``); :class:`tdshare.TerminalProgress` draws it on a terminal.

        Returns:
            ``self``, or a :class:`TensorDictFuture` of it for ``return_early=True`` with
            ``num_threads > 1``.

        Raises:
            RuntimeError: a leaf mapped elsewhere with ``copy_existing=False``, an existing file
                with ``existsok=False``, a tensordict in shared memory; with ``atomic=True`` a
                non-empty folder and ``existsok=False``, or a folder with no saved tensordict.
            NotADirectoryError: ``prefix`` is a file.
            ValueError: a key that cannot be saved; ``atomic=True`` with nowhere to write.
            NotImplementedError: ``return_early=True`` with ``atomic=True``.
            TypeError: an argument of the wrong type (named in the message).

        >>> import tempfile, torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(obs=torch.zeros(3, 4), batch_size=[3])
        >>> td.memmap_(tempfile.mkdtemp()) is td, td.is_memmap(), td.is_locked
        (True, True, True)
        """
        opts = SaveOptions.of(
            prefix,
            copy_existing=copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            atomic=atomic,
            archive=False,
            progress=progress,
        )
        return save_tree(self, prefix, opts, inplace=True)

    def memmap_like(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        existsok: bool = True,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        archive: bool | None = None,
    ) -> Any:
        """A new memory-mapped tensordict with this one's structure, shapes and dtypes, its tensors zeroed.

        Nothing of the size of the data is allocated or copied: each tensor becomes one zero
        broadcast to its shape, and a folder's files are created at their size without writing a
        page (sparse files), an anonymous tree's leaves are fresh zeroed shared memory.  So
        ``td.expand(10**7).memmap_like(path)`` preallocates a replay buffer larger than RAM, to be
        filled with :meth:`update_` or by indexing.  Non-tensor values are kept.  The tensordict is
        not changed.  The result is locked, as :meth:`memmap_` leaves it.

        Args:
            prefix: the folder to write (None: anonymous shared memory); a path ending in
                ``".tdz"`` (or ``archive=True``) writes a zero-filled archive there and returns it
                loaded with ``load_memmap(prefix, mode="r+")``, so that in-place writes reach it.
            copy_existing: accepted as :meth:`memmap` takes it; no value is copied, so it has no effect.
            existsok: False refuses a file that exists at a leaf's path; True (the default)
                replaces it with a zeroed one (a process that mapped the old file keeps its bytes).
            num_threads, return_early, share_non_tensor, robust_key: as in :meth:`memmap_`.
            archive: True writes an archive; None (the default) does so when ``prefix`` ends in ``".tdz"``.

        Returns:
            The new memory-mapped tensordict (a lazy stack stays a lazy stack), or a
            :class:`TensorDictFuture` of it for ``return_early=True`` with ``num_threads > 1``.

        Raises:
            RuntimeError: an existing file with ``existsok=False``.
            NotImplementedError: ``return_early=True`` for an archive.
            ValueError: ``archive=True`` without a prefix.
            TypeError, ValueError: an argument of the wrong type or value (named in the message).

        >>> import tempfile, torch
        >>> from tdshare import TensorDict
        >>> like = TensorDict(a=torch.ones(3), batch_size=[3]).memmap_like()
        >>> like.is_memmap(), like["a"].tolist()
        (True, [0.0, 0.0, 0.0])
        >>> big = TensorDict(obs=torch.ones(84, 84, dtype=torch.uint8)).expand(100_000)  # 706 MB
        >>> buffer = big.memmap_like(tempfile.mkdtemp())  # allocates nothing in memory, writes no page
        >>> buffer["obs"].shape, int(buffer["obs"][-1].sum())
        (torch.Size([100000, 84, 84]), 0)
        """
        del copy_existing  # nothing is copied (see the docstring)
        like: Any = self.apply(zero_broadcast, call_on_nested=False)
        if archive and prefix is None:
            like.memmap(None, archive=True)  # refused by name
        if prefix is not None and (archive or (archive is None and os.fspath(prefix).endswith(".tdz"))):
            like.memmap(  # return_early is refused by name for an archive
                prefix,
                existsok=existsok,
                num_threads=num_threads,
                return_early=return_early,
                robust_key=robust_key,
                archive=True,
            )
            return type(self).load_memmap(prefix, robust_key=robust_key, mode="r+")
        return like.memmap_(
            prefix,
            existsok=existsok,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            robust_key=robust_key,
        )

    @overload
    def memmap(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: Literal[False] = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        archive: bool | None = None,
        compression: str | int | None = None,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T: ...

    @overload
    def memmap(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        archive: bool | None = None,
        compression: str | int | None = None,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T | TensorDictFuture[T]: ...

    def memmap(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        archive: bool | None = None,
        compression: str | int | None = None,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T | TensorDictFuture[T]:
        """Write the files :meth:`memmap_` writes and return a new memory-mapped tensordict.

        ``self`` is unchanged.  A prefix ending with ``.tdz`` (or ``archive=True``) writes one
        archive file instead, always atomically, its tensor entries compressed as
        ``compression`` says (None, ``"stored"``, ``"deflate"``, ``"bzip2"``, ``"lzma"``); the
        result then maps the archive, is unlocked, and ``is_memmap()`` is False.

        Args:
            prefix, copy_existing, num_threads, return_early, share_non_tensor, existsok,
            robust_key, atomic, progress: as for :meth:`memmap_`.
            archive: True writes an archive; None (the default) when ``prefix`` ends with ``.tdz``.
            compression: the archive entries' compression (archives only).

        Returns:
            The new tensordict, or a :class:`TensorDictFuture` of it (see :meth:`memmap_`).

        Raises:
            The errors of :meth:`memmap_`; ``ValueError`` for ``compression`` without an archive
            or a folder at an archive's path; ``NotImplementedError`` for ``return_early`` or
            ``share_non_tensor`` with an archive.

        >>> import tempfile, torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(obs=torch.zeros(3), batch_size=[3])
        >>> out = td.memmap(tempfile.mkdtemp())
        >>> out is td, out.is_memmap(), td.is_memmap()
        (False, True, False)
        """
        opts = SaveOptions.of(
            prefix,
            copy_existing=copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            atomic=atomic,
            archive=archive,
            compression=compression,
            progress=progress,
        )
        return save_tree(self, prefix, opts, inplace=False)

    @overload
    def save(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: Literal[False] = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        archive: bool | None = None,
        compression: str | int | None = None,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T: ...

    @overload
    def save(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        archive: bool | None = None,
        compression: str | int | None = None,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T | TensorDictFuture[T]: ...

    def save(
        self: T,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        archive: bool | None = None,
        compression: str | int | None = None,
        atomic: bool = False,
        progress: ProgressCallback | None = None,
    ) -> T | TensorDictFuture[T]:
        """Save the tensordict to ``prefix`` and return a memory-mapped copy (``dumps`` is the same).

        It is :meth:`memmap` with ``existsok=True``: existing files are overwritten.

        Args:
            prefix, copy_existing, num_threads, return_early, share_non_tensor, robust_key,
            archive, compression, atomic, progress: as for :meth:`memmap`.

        Returns:
            The memory-mapped copy, or a :class:`TensorDictFuture` of it.

        Raises:
            The errors of :meth:`memmap`.

        >>> import tempfile, torch
        >>> from tdshare import TensorDict
        >>> saved = TensorDict(obs=torch.ones(2), batch_size=[2]).save(tempfile.mkdtemp())
        >>> saved["obs"].tolist(), saved.is_memmap()
        ([1.0, 1.0], True)
        """
        return self.memmap(
            prefix,
            copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=True,
            robust_key=robust_key,
            archive=archive,
            compression=compression,
            atomic=atomic,
            progress=progress,
        )

    dumps = save

    def is_memmap(self) -> bool:
        """Whether the leaves are memory-mapped (True from ``memmap_()`` until ``unlock_()``).

        Returns:
            True for a tensordict memory-mapped in place (to a folder or anonymous shared memory)
            and still locked; False otherwise, a ``load_memmap()`` result included.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
        >>> td.is_memmap(), td.memmap_().is_memmap(), td.unlock_().is_memmap()
        (False, True, False)
        """
        return self._is_memmap

    @property
    def saved_path(self) -> str | None:
        """The directory the tensordict is memory-mapped to; None when it is in anonymous shared memory.

        Raises:
            AttributeError: the tensordict is not memory-mapped (never was, or was unlocked since).

        >>> import os, tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     td = TensorDict(a=torch.zeros(2), batch_size=[2]).memmap_(path)
        ...     print(td.saved_path == path, sorted(os.listdir(td.saved_path)))
        True ['a.memmap', 'meta.json']
        >>> print(TensorDict(a=torch.zeros(2), batch_size=[2]).memmap_().saved_path)
        None
        """
        if not self._is_memmap:
            raise AttributeError(
                f"The tensordict has no saved path (is_memmap()={self._is_memmap}, path={self._memmap_prefix})."
            )
        return self._memmap_prefix

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def load_memmap(
        cls: type[T],
        prefix: PathLike,
        device: Any = None,
        non_blocking: bool = False,
        *,
        out: TensorDictBase | None = None,
        robust_key: bool | None = True,
        subpath: Any = None,
        mode: str | None = None,
        num_threads: int = 0,
        allow_pickle: bool | None = None,
    ) -> T:
        """Load a saved tensordict, mapping its leaf files (no payload is read).

        The result holds :class:`MemoryMappedTensor` leaves, is unlocked and ``is_memmap()`` is
        False; ``memmap_()`` on it (no argument) makes it memory-mapped there without writing.
        ``load`` is the same method.

        Args:
            prefix: the folder, or the ``.tdz`` archive file, to read.
            device: the device of the result (None: the saved device).
            non_blocking: accepted for the reference's signature, and ignored.
            out: a tensordict to load into (see :meth:`load_memmap_`).
            robust_key: the key encoding the data was saved with (see :meth:`memmap_`).
            subpath: the key of a nested tensordict to load alone.
            mode: None writes through where the file is writable, ``"r"`` keeps writes private
                to this process, ``"r+"`` writes through and raises ``PermissionError`` on a
                read-only file.
            num_threads: threads that read an archive's entries (0: the calling thread).
            allow_pickle: None loads pickled non-tensor values with a ``FutureWarning``, False
                refuses them, True loads them.

        Returns:
            The loaded tensordict (``out`` when it is given).

        Raises:
            FileNotFoundError: no saved tensordict at ``prefix`` (:class:`MissingMetadataError`).
            ValueError: a ``mode`` other than None, ``"r"``, ``"r+"``; damaged files
                (:class:`CorruptDataError`).
            RuntimeError: a format version or dtype this version does not read; pickled data
                with ``allow_pickle=False``; a locked ``out``.

        >>> import tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     _ = TensorDict(a=torch.arange(3.0), batch_size=[3]).save(path)
        ...     loaded = TensorDict.load_memmap(path)
        ...     print(loaded["a"].tolist(), type(loaded["a"]).__name__, loaded.is_memmap())
        [0.0, 1.0, 2.0] MemoryMappedTensor False
        """
        return load_tree(
            cls,
            prefix,
            device,
            out=out,
            robust_key=robust_key,
            subpath=subpath,
            mode=mode,
            allow_pickle=allow_pickle,
            num_threads=num_threads,
        )

    load = load_memmap

    def load_memmap_(
        self: T,
        prefix: PathLike,
        robust_key: bool | None = True,
        *,
        allow_pickle: bool | None = None,
        mode: str | None = None,
    ) -> T:
        """Load a saved tensordict into ``self`` (nested tensordicts reused, leaves replaced).

        Keys that are not in the saved data are removed; the old leaves' storage is not written
        (``td.update_(TensorDict.load_memmap(prefix))`` does that).  A memory-mapped ``self`` ends
        memory-mapped into the loaded folder and locked (nothing is written); with no folder (an
        archive, ``mode="r"``) it ends unlocked and not memory-mapped.  ``self`` is unchanged if
        the load fails.

        Args:
            prefix: the folder, or the ``.tdz`` archive file, to read.
            robust_key: the key encoding the data was saved with (see :meth:`memmap_`).
            allow_pickle, mode: as for :meth:`load_memmap`.

        Returns:
            ``self``.

        Raises:
            RuntimeError: ``self`` is locked and not memory-mapped (:class:`LockedError`).
            The errors of :meth:`load_memmap`.

        >>> import tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     _ = TensorDict(a=torch.ones(3), batch_size=[3]).save(path)
        ...     td = TensorDict(a=torch.zeros(3), b=torch.zeros(3), batch_size=[3])
        ...     print(td.load_memmap_(path) is td, list(td.keys()), td["a"].tolist())
        True ['a'] [1.0, 1.0, 1.0]
        """
        return load_into(self, prefix, robust_key, allow_pickle=allow_pickle, mode=mode)

    def load_(self: T, prefix: PathLike, *args: Any, **kwargs: Any) -> T:
        """Deprecated alias of :meth:`load_memmap_` (as in the reference, removed in its 0.17).

        Emits a ``DeprecationWarning``, then calls ``load_memmap_(prefix, *args, **kwargs)``.

        >>> import tempfile, warnings
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path, warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     _ = TensorDict(a=torch.ones(3), batch_size=[3]).save(path)
        ...     TensorDict(a=torch.zeros(3), batch_size=[3]).load_(path)["a"].tolist()
        [1.0, 1.0, 1.0]
        """
        warnings.warn(
            "load_() is deprecated (tensordict removes it in 0.17); use load_memmap_() instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.load_memmap_(prefix, *args, **kwargs)
