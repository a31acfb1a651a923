"""A non-tensor value memory-mapped on its own: ``NonTensorData(...).memmap_(path)`` and back.

A ``NonTensorData`` saved alone is the folder its tensordict would give it: ``meta.json`` with
the value inline (or ``other.pickle`` beside it when JSON cannot hold it); a ``NonTensorStack``
is one ``meta.json`` holding the nested list (or naming ``pickle.pkl``).  That is the reference's
layout, so a folder saved by either library loads in the other.  After ``memmap_`` the value is
memory-mapped (``is_memmap()``) and locked: ``update_`` / ``update(..., inplace=True)`` rewrite
its folder, replacing a pickle that a JSON value no longer needs.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

from ._atomic import atomic_directory
from ._errors import (
    ArgumentTypeError,
    FileExistsRuntimeError,
    InvalidArgumentError,
    NotAFolderError,
    NotMemmapError,
    NotSupportedError,
)
from ._format import META_FILE, PICKLE_FILE, STACK_PICKLE_FILE
from ._future import TensorDictFuture
from ._nontensor_files import encode_nontensor, encode_nontensor_stack, write_nontensor
from ._options import ARCHIVE_UNSUPPORTED, SaveOptions
from ._tdz import parse_compression
from ._tdz_write import archive_target, write_archive

__all__ = ["NonTensorFiles"]

PathLike = str | os.PathLike


class NonTensorFiles:
    """The memory-mapping methods of a non-tensor value saved on its own (a mixin of ``NonTensorData``)."""

    __slots__ = ()

    # provided by NonTensorData
    __dict__: dict[str, Any]

    @classmethod
    def _tensordict_host(cls) -> Any:
        raise NotImplementedError

    def _is_stack(self) -> bool:
        raise NotImplementedError

    def _encode(self, where: str) -> tuple[bytes, bytes | None, str]:
        """This value's ``meta.json`` bytes, its pickle if JSON cannot hold it, the pickle's name."""
        value: Any = self
        if self._is_stack():
            return (*encode_nontensor_stack(value.tolist(), where), STACK_PICKLE_FILE)
        return (*encode_nontensor(value.data, where), PICKLE_FILE)

    def _write_folder(self, prefix: str) -> None:
        """Write this value's folder at ``prefix`` (its meta.json, and a pickle if needed)."""
        meta, pickled, name = self._encode(repr(prefix))
        write_nontensor(prefix, meta, pickled, name)

    def _persist(self) -> None:
        """Rewrite the folder of a value memory-mapped on its own (nothing for any other value)."""
        prefix = self.__dict__.get("_memmap_prefix")
        if prefix is not None and self.__dict__.get("_is_memmap"):
            self._write_folder(prefix)

    def _mark_mapped(self, folder: str | None) -> None:
        """Mark the value memory-mapped (to ``folder``, or to nothing) and locked."""
        if folder is not None:
            self.__dict__["_memmap_prefix"] = folder
        self.__dict__.update(_is_memmap=True, _is_locked=True)

    def _save(self, prefix: PathLike | None, opts: SaveOptions, inplace: bool) -> Any:
        """The one save of a value alone: an archive, a folder (atomically or not), or no file."""
        value: Any = self
        target: Any = value if inplace else value.clone()
        if opts.archive:
            assert prefix is not None  # SaveOptions.of refuses an archive without a prefix
            opts.refuse(ARCHIVE_UNSUPPORTED)  # as for a tensordict's archive
            path = archive_target(prefix, opts.existsok)
            meta, pickled, name = target._encode(repr(path))
            entries = ([(name, pickled)] if pickled is not None else []) + [(META_FILE, meta)]
            write_archive(path, entries, parse_compression(opts.compression))
            if not inplace:
                return type(self).load_memmap(path, allow_pickle=True)
            target._mark_mapped(None)  # as a tensordict's memmap_ to an archive: nothing mapped in place
            return target
        own = self.__dict__.get("_memmap_prefix")
        folder = os.path.abspath(os.fspath(prefix)) if prefix is not None else own
        if folder is None:
            if opts.atomic:
                raise InvalidArgumentError(
                    "atomic=True needs a folder to write to: this value has none; pass a prefix."
                )
            target._mark_mapped(None)  # nothing to map: the value is kept as it is
        elif opts.atomic:
            with atomic_directory(folder, opts.existsok) as staging:
                target._write_folder(staging)
            target._mark_mapped(folder)
        else:
            if os.path.lexists(folder) and not os.path.isdir(folder):
                raise NotAFolderError(
                    f"The prefix {folder!r} is a file, but a value is saved as a folder: remove the file or "
                    "choose another prefix, or end the prefix with '.tdz' to write one archive file."
                )
            if not opts.existsok:
                for name in (META_FILE, PICKLE_FILE, STACK_PICKLE_FILE):
                    if os.path.lexists(os.path.join(folder, name)):
                        raise FileExistsRuntimeError(
                            f"The file {os.path.join(folder, name)!r} already exists and existsok=False: pass "
                            "existsok=True to overwrite it, or choose another prefix."
                        )
            target._write_folder(folder)
            target._mark_mapped(folder)
        if opts.return_early and opts.num_threads > 1:
            done: Future[Any] = Future()
            done.set_result(None)  # one small file: written before the future is made
            return TensorDictFuture([done], target)
        return target

    def memmap_(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        atomic: bool = False,
    ) -> Any:
        """Write the value to the folder ``prefix`` (the reference's layout) and mark it memory-mapped.

        Args:
            prefix: the folder (created if missing), or a ``.tdz`` archive file. None writes into
                the value's own folder if it has one, else marks it memory-mapped without writing
                (there is nothing to map).
            copy_existing, share_non_tensor: accepted for the tensordict signature (a value has
                no leaf file mapped elsewhere; its folder is what other processes read).
            num_threads, return_early: with ``return_early=True`` and ``num_threads > 1``, a
                :class:`TensorDictFuture` of the result (the file is written before it returns).
            existsok: False refuses a folder that holds a saved value's files already.
            robust_key: accepted for the tensordict signature (a value has no key to encode).
            atomic: write the folder next to ``prefix`` and swap it in whole.

        Returns:
            ``self``, now locked: replace its value with ``update_``.

        Raises:
            RuntimeError: the files exist and ``existsok=False``; with ``atomic=True`` a folder
                that is not empty and holds no saved value.
            NotADirectoryError: ``prefix`` is a file.
            ValueError: ``atomic=True`` with no folder to write to; a value neither JSON nor
                picklable (:class:`InvalidArgumentError`; nothing is written).
            NotImplementedError: ``return_early=True`` with ``atomic=True``.

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> NonTensorData("cat").memmap_(tempfile.mkdtemp()).is_memmap()
        True
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
        )
        return self._save(prefix, opts, True)

    def memmap(
        self,
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
    ) -> Any:
        """A memory-mapped copy of the value, written to ``prefix``; ``self`` is unchanged.

        Args:
            prefix, copy_existing, num_threads, return_early, share_non_tensor, existsok,
                robust_key, atomic: as for :meth:`memmap_`.
            archive: True writes one ``.tdz`` archive file (None: when ``prefix`` ends with ``.tdz``).
            compression: the archive entries' compression (None: stored).

        Returns:
            The copy (for an archive: the value loaded back from it).

        Raises:
            The errors of :meth:`memmap_`.

        >>> import tempfile
        >>> from tdshare import NonTensorStack
        >>> NonTensorStack("a", "b").memmap(tempfile.mkdtemp()).tolist()
        ['a', 'b']
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
        )
        return self._save(prefix, opts, False)

    def memmap_like(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
    ) -> Any:
        """As :meth:`memmap`: a non-tensor value has no empty form, so its value is written too.

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> NonTensorData(3).memmap_like(tempfile.mkdtemp()).data
        3
        """
        return self.memmap(
            prefix,
            copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
        )

    def save(
        self,
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
    ) -> Any:
        """Write the value to ``prefix`` and return the memory-mapped copy (:meth:`memmap` with
        ``existsok=True``); ``dumps`` is the same method.

        >>> import os, tempfile
        >>> from tdshare import NonTensorData
        >>> path = os.path.join(tempfile.mkdtemp(), "value.tdz")
        >>> NonTensorData("x").save(path).data, NonTensorData.load(path).data
        ('x', 'x')
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
        )

    dumps = save

    @classmethod
    def load_memmap(
        cls,
        prefix: PathLike,
        device: Any = None,
        non_blocking: bool = False,
        *,
        out: Any = None,
        robust_key: bool | None = True,
        mode: str | None = None,
        num_threads: int = 0,
        allow_pickle: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Load a non-tensor value saved on its own (by tdshare or the reference), folder or archive.

        As for a tensordict, the result is unlocked and ``is_memmap()`` is False; a value loaded
        from a folder remembers it (``memmap_()`` without a prefix maps it there again). ``load``
        is the same method.

        Args:
            prefix: the value's folder, or ``.tdz`` archive file.
            device, non_blocking: accepted for the tensordict signature.
            out: a value to load into (see :meth:`load_memmap_`), returned.
            robust_key, mode, num_threads: as for ``TensorDict.load_memmap``.
            allow_pickle: None loads a pickled value with a ``FutureWarning``, False refuses it,
                True loads it.

        Returns:
            The value: a ``NonTensorData`` or a ``NonTensorStack``.

        Raises:
            ArgumentTypeError: the folder holds something else (a tensordict: use
                ``TensorDict.load_memmap``), or a stack where ``cls`` is not a stack class.
            PickleRefusedError: a pickled value and ``allow_pickle=False``.

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> path = tempfile.mkdtemp()
        >>> _ = NonTensorData("dog").memmap(path)
        >>> NonTensorData.load_memmap(path).data
        'dog'
        """
        if out is not None:
            return out.load_memmap_(prefix, robust_key, allow_pickle=allow_pickle, mode=mode)
        folder = os.path.abspath(os.fspath(prefix))
        loaded = cls._tensordict_host().load_memmap(
            folder, robust_key=robust_key, mode=mode, num_threads=num_threads, allow_pickle=allow_pickle, **kwargs
        )
        if not isinstance(loaded, cls):
            raise ArgumentTypeError(
                f"{cls.__name__}.load_memmap({folder!r}): the folder holds a {type(loaded).__name__}, not a "
                f"{cls.__name__}; load it with TensorDict.load_memmap()."
            )
        loaded.__dict__.update(_is_memmap=False, _is_locked=False)
        loaded.__dict__["_memmap_prefix"] = folder if os.path.isdir(folder) and mode != "r" else None
        return loaded

    load = load_memmap

    def load_memmap_(
        self,
        prefix: PathLike | None = None,
        robust_key: bool | None = True,
        *,
        allow_pickle: bool | None = None,
        mode: str | None = None,
    ) -> Any:
        """Replace this value by the one saved in ``prefix`` (default: the folder it was mapped to).

        A memory-mapped value ends memory-mapped into that folder and locked; with no folder (an
        archive, ``mode="r"``) it ends unlocked and not memory-mapped; any other value stays as
        it was, with the loaded value.

        Args:
            prefix: the folder or ``.tdz`` archive to read.
            robust_key, allow_pickle, mode: as for :meth:`load_memmap`.

        Returns:
            ``self``.

        Raises:
            InvalidArgumentError: no ``prefix`` and the value was never memory-mapped to a folder.
            The errors of :meth:`load_memmap`.

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> path = tempfile.mkdtemp()
        >>> _ = NonTensorData(1).memmap(path)
        >>> NonTensorData(0).load_memmap_(path).data
        1
        """
        if prefix is None:
            prefix = self.__dict__.get("_memmap_prefix")
            if prefix is None:
                raise InvalidArgumentError(
                    "load_memmap_() needs a prefix: this value was never memory-mapped to a folder."
                )
        loaded = type(self).load_memmap(prefix, robust_key=robust_key, allow_pickle=allow_pickle, mode=mode)
        value: Any = self
        value._take(loaded)
        if self.__dict__.get("_is_memmap"):
            folder = loaded.__dict__.get("_memmap_prefix")
            if folder is not None:
                self._mark_mapped(folder)
            else:
                self.__dict__.update(_memmap_prefix=None, _is_memmap=False, _is_locked=False)
        return self

    def memmap_refresh_(self, *, allow_pickle: bool | None = None) -> Any:
        """Read the value again from its folder (another process may have replaced it) and return ``self``.

        Raises:
            NotMemmapError: the value is not memory-mapped to a folder (a ``RuntimeError``).

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> path = tempfile.mkdtemp()
        >>> mine = NonTensorData("old").memmap_(path)
        >>> _ = NonTensorData("new").memmap(path)  # e.g. another process
        >>> mine.memmap_refresh_().data
        'new'
        """
        folder = self.__dict__.get("_memmap_prefix")
        if folder is None or not self.__dict__.get("_is_memmap"):
            raise NotMemmapError(
                f"Cannot refresh a {type(self).__name__} that is not memory-mapped to a folder: memmap_() it to "
                "one first."
            )
        value: Any = self
        value._take(type(self).load_memmap(folder, allow_pickle=allow_pickle))
        return self

    def _no_entries(self, method: str) -> NotSupportedError:
        return NotSupportedError(
            f"{type(self).__name__}.{method}: a {type(self).__name__} holds one non-tensor value, not entries. "
            "Put the value in a tensordict (TensorDict(value=...)) and add the entry there."
        )

    def make_memmap(self, key: Any, shape: Any, *, dtype: Any = None, robust_key: bool | None = True) -> Any:
        """Refused: a non-tensor value holds no entries (the tensordict method adds one).

        Raises:
            NotSupportedError: always (a ``RuntimeError``), before anything is written.

        >>> from tdshare import NonTensorData
        >>> NonTensorData("v").make_memmap("k", [1])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdshare.NotSupportedError: NonTensorData.make_memmap: a NonTensorData holds one non-tensor value, not ...
        """
        raise self._no_entries("make_memmap")

    def make_memmap_from_tensor(
        self, key: Any, tensor: Any, *, copy_data: bool = True, robust_key: bool | None = True
    ) -> Any:
        """Refused, as :meth:`make_memmap`.

        >>> import torch
        >>> from tdshare import NonTensorData
        >>> NonTensorData("v").make_memmap_from_tensor("k", torch.ones(1))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdshare.NotSupportedError: NonTensorData.make_memmap_from_tensor: ...
        """
        raise self._no_entries("make_memmap_from_tensor")

    def make_memmap_from_storage(
        self, key: Any, storage: Any, shape: Any, *, dtype: Any = None, robust_key: bool | None = True
    ) -> Any:
        """Refused, as :meth:`make_memmap`.

        >>> import torch
        >>> from tdshare import NonTensorData
        >>> NonTensorData("v").make_memmap_from_storage("k", torch.UntypedStorage(4), [1])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdshare.NotSupportedError: NonTensorData.make_memmap_from_storage: ...
        """
        raise self._no_entries("make_memmap_from_storage")
