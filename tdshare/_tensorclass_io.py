"""The memory-mapping family of a tensorclass: ``memmap_``, ``memmap``, ``save``/``dumps``,
``load_memmap``/``load``, ``load_memmap_``, ``make_memmap*``, ``memmap_refresh_``, ``is_memmap``.

A tensorclass saved at ``prefix`` is the reference's wrapped layout: ``prefix/meta.json`` holds
``{"_type": "<class 'module.Name'>"}`` and ``prefix/_tensordict/`` is its tensordict, saved as
any collection level (non-tensor fields are ``NonTensorData`` entries in it).  The methods here
save that tensordict through the one save path (:func:`tdshare._save.save_tree`) into
``prefix/_tensordict`` and write the wrapper's ``meta.json`` after it, so the data is complete
before the marker names it; an atomic save writes both into a staging folder that replaces
``prefix`` whole; an archive is the same files packed (:func:`tdshare._archive.pack_memmap`).
Loading goes through the one loader (:func:`tdshare._read.load_tree`), which rebuilds the class
from the registered node kind.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import threading
import warnings
from collections.abc import Sequence
from typing import Any, TypeVar, cast

import torch

from ._archive import pack_memmap
from ._archive_store import ArchiveStore
from ._atomic import atomic_directory, make_staging
from ._coordination import SharedRegistry
from ._errors import InvalidArgumentError, MemmapError, UnsupportedFormatError
from ._format import META_FILE, WRAPPED, WRAPPED_DIR, dumps_json, layout_of
from ._future import TensorDictFuture
from ._keys import NestedKey
from ._lazy_leaves import is_pending, raw_items, track
from ._memmap import MemoryMappedTensor
from ._nodes import kind_for_tag, kind_of
from ._nontensor_files import write_nontensor
from ._options import SaveOptions
from ._progress import ProgressCallback
from ._read import load_into, load_tree
from ._save import save_tree
from ._shared_nontensor import is_shared_value
from ._store import read_meta
from ._tdz import Archive
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase, is_collection
from ._write_results import leaf_file, set_leaf_file

__all__ = ["TensorClassIO", "class_tag"]

T = TypeVar("T", bound="TensorClassIO")
PathLike = str | os.PathLike


def class_tag(cls: type) -> str:
    """The ``_type`` marker of a tensorclass's folder: ``"<class 'module.QualName'>"`` (``str(cls)``)."""
    return f"<class '{cls.__module__}.{cls.__qualname__}'>"


def _wrapper_meta(cls: type) -> bytes:
    return dumps_json({"_type": class_tag(cls)})


class TensorClassIO:
    """The memory-mapping, saving and loading methods that :func:`tdshare.tensorclass` gives a class.

    The tensor data lives in ``self._tensordict`` (a :class:`tdshare.TensorDict`); every method
    works on it and wraps the result in the tensorclass again.
    """

    _tensordict: TensorDict

    @classmethod
    def _from_tensordict(cls: type[T], td: TensorDictBase, fields: dict[str, Any] | None = None) -> T:
        raise NotImplementedError  # provided by the decorated class

    # -- saving -------------------------------------------------------------------------------
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
        """Write every tensor field to a memory-mapped file (or anonymous shared memory) in place; lock.

        ``prefix`` receives ``meta.json`` (the class marker) and ``_tensordict/`` (the fields);
        ``prefix=None`` writes into the instance's own folder, or into anonymous shared memory
        when it has none.  The arguments are :meth:`tdshare.TensorDict.memmap_`'s.

        Returns:
            ``self``, memory-mapped and locked (a :class:`tdshare.TensorDictFuture` with
            ``return_early=True`` and ``num_threads > 1``).

        Raises:
            MemmapError: a field already mapped to another file without ``copy_existing``, an
                existing file with ``existsok=False``, an instance in shared memory.
            InvalidArgumentError, NotSupportedError: options that cannot be honoured together.

        >>> import tempfile, torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs(x=torch.zeros(2), batch_size=[2]).memmap_(tempfile.mkdtemp()).is_memmap()
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
            archive=False,
            progress=progress,
        )
        return _save(self, prefix, opts, inplace=True)

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
        """Like :meth:`memmap_`, but returns a new memory-mapped instance; ``self`` is unchanged.

        A prefix ending with ``.tdz`` (or ``archive=True``) writes one archive file instead; the
        result then maps the archive, unlocked, and ``is_memmap()`` is False.

        Returns:
            A new instance of the class (or a :class:`tdshare.TensorDictFuture` of it).

        Raises:
            The errors of :meth:`memmap_`.

        >>> import tempfile, torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs(x=torch.ones(2), batch_size=[2]).memmap(tempfile.mkdtemp()).x.tolist()
        [1.0, 1.0]
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
        return _save(self, prefix, opts, inplace=False)

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
        """Save to ``prefix`` and return a memory-mapped copy: ``memmap(existsok=True)``.

        Returns:
            A new memory-mapped instance (or a future of it).

        Raises:
            The errors of :meth:`memmap_`.

        >>> import tempfile, torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs(x=torch.ones(1), batch_size=[1]).save(tempfile.mkdtemp()).is_memmap()
        True
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
        """Whether the fields are memory-mapped (True from ``memmap_()`` until ``unlock_()``).

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs(x=torch.ones(1), batch_size=[1]).is_memmap()
        False
        """
        return self._tensordict.is_memmap()

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def load_memmap(
        cls: type[T],
        prefix: PathLike,
        device: Any = None,
        non_blocking: bool = False,
        *,
        out: Any = None,
        robust_key: bool | None = True,
        subpath: Any = None,
        mode: str | None = None,
        num_threads: int = 0,
        allow_pickle: bool | None = None,
    ) -> T:
        """Load a saved tensorclass (a folder or a ``.tdz`` archive), mapping its files.

        The result is an instance of the class that was saved, found among the tensorclasses
        defined in this process (like the reference, loading a plain tensordict's folder gives a
        :class:`tdshare.TensorDict`).  A saved class that is not defined here loads as ``cls``
        when its name is ``cls``'s.  The arguments are :meth:`tdshare.TensorDict.load_memmap`'s;
        ``out`` may be an instance of the saved class, whose tensordict is then loaded into.

        Returns:
            The loaded instance.

        Raises:
            UnsupportedFormatError: the saved class is not defined in this process and is not ``cls``.
            MissingMetadataError, FormatError: nothing saved at ``prefix``, or damaged data.

        >>> import tempfile, torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> path = tempfile.mkdtemp()
        >>> _ = Obs(x=torch.ones(2), batch_size=[2]).memmap(path)
        >>> type(Obs.load_memmap(path)).__name__
        'Obs'
        """
        path = os.path.abspath(os.fspath(prefix))
        if out is not None and kind_of(out) is not None and not is_collection(out):
            return _load_into_instance(out, path, device, robust_key, mode, allow_pickle, num_threads)
        kwargs: dict[str, Any] = {
            "out": out,
            "robust_key": robust_key,
            "subpath": subpath,
            "mode": mode,
            "allow_pickle": allow_pickle,
            "num_threads": num_threads,
        }
        if subpath is not None:
            return load_tree(TensorDict, path, device, **kwargs)
        meta = _root_meta(path, mode)
        tag = meta.get("_type")
        if layout_of(meta) != WRAPPED or kind_for_tag(tag) is not None:
            return load_tree(TensorDict, path, device, **kwargs)  # it records the folder's state on the fields
        if tag != class_tag(cls) and not str(tag).endswith(f".{cls.__qualname__}'>"):
            raise UnsupportedFormatError(
                f"Could not find the tensorclass {tag} saved in {path!r}: no tensorclass of that name is defined in "
                f"this process. Import the module that defines it (its @tensorclass registers it), or call "
                f"ThatClass.load_memmap({path!r}) on it; TensorDict.load_memmap loads its fields as a TensorDict."
            )
        state = _state_before(path, mode)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*holds a tensorclass", category=UserWarning)
            inner = load_tree(TensorDict, path, device, **kwargs)
        inner._generation = state if os.path.isdir(path) else None
        return cls._from_tensordict(inner, {k: v for k, v in meta.items() if k != "_type"})

    load = load_memmap

    def load_memmap_(
        self: T,
        prefix: PathLike,
        robust_key: bool | None = True,
        *,
        allow_pickle: bool | None = None,
        mode: str | None = None,
    ) -> T:
        """Load a saved instance of this class into ``self`` (its tensordict's levels reused).

        A memory-mapped ``self`` ends memory-mapped into the loaded folder and locked; ``self``
        is unchanged if the load fails.

        Returns:
            ``self``.

        Raises:
            InvalidArgumentError: ``prefix`` holds another class.
            The errors of :meth:`load_memmap`.

        >>> import tempfile, torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> path = tempfile.mkdtemp()
        >>> _ = Obs(x=torch.ones(2), batch_size=[2]).memmap(path)
        >>> Obs(x=torch.zeros(2), batch_size=[2]).load_memmap_(path).x.tolist()
        [1.0, 1.0]
        """
        path = os.path.abspath(os.fspath(prefix))
        return _load_into_instance(self, path, None, robust_key, mode, allow_pickle, 0)

    # -- live entries and refresh ------------------------------------------------------------
    def make_memmap(
        self,
        key: NestedKey,
        shape: Sequence[int] | torch.Size,
        *,
        dtype: torch.dtype | None = None,
        robust_key: bool | None = True,
    ) -> MemoryMappedTensor:
        """Add a zero-filled memory-mapped field ``key`` (allowed while locked) and return it.

        Raises:
            FieldError: ``key`` is not a field of the class.
            NotMemmapError, MemmapError: as :meth:`tdshare.TensorDict.make_memmap`.

        >>> import tempfile, torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor = None
        >>> obs = Obs(batch_size=[2]).memmap_(tempfile.mkdtemp())
        >>> obs.make_memmap("x", [2, 3]).shape
        torch.Size([2, 3])
        """
        return self._tensordict.make_memmap(self._field_key(key), shape, dtype=dtype, robust_key=robust_key)

    def make_memmap_from_tensor(
        self, key: NestedKey, tensor: torch.Tensor, *, copy_data: bool = True, robust_key: bool | None = True
    ) -> MemoryMappedTensor:
        """Add a memory-mapped copy of ``tensor`` as the field ``key`` and return it.

        Raises:
            FieldError: ``key`` is not a field of the class.
            The errors of :meth:`tdshare.TensorDict.make_memmap_from_tensor`.

        >>> import tempfile, torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor = None
        >>> obs = Obs(batch_size=[2]).memmap_(tempfile.mkdtemp())
        >>> obs.make_memmap_from_tensor("x", torch.ones(2)).tolist()
        [1.0, 1.0]
        """
        return self._tensordict.make_memmap_from_tensor(
            self._field_key(key), tensor, copy_data=copy_data, robust_key=robust_key
        )

    def make_memmap_from_storage(
        self,
        key: NestedKey,
        storage: torch.UntypedStorage,
        shape: Sequence[int] | torch.Size,
        *,
        dtype: torch.dtype | None = None,
        robust_key: bool | None = True,
    ) -> MemoryMappedTensor:
        """Add the field ``key`` reading its data from ``storage`` (no copy) and return it.

        Raises:
            FieldError: ``key`` is not a field of the class.
            The errors of :meth:`tdshare.TensorDict.make_memmap_from_storage`.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor = None
        >>> obs = Obs(batch_size=[2]).memmap_()
        >>> obs.make_memmap_from_storage("x", torch.ones(2).untyped_storage(), [2]).tolist()
        [1.0, 1.0]
        """
        return self._tensordict.make_memmap_from_storage(
            self._field_key(key), storage, shape, dtype=dtype, robust_key=robust_key
        )

    def memmap_refresh_(self: T, *, allow_pickle: bool | None = None) -> T:
        """Map the fields other processes added or changed since this instance last looked.

        Returns:
            ``self``.

        Raises:
            NotMemmapError: the instance is not memory-mapped.

        >>> import tempfile, torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.ones(2), batch_size=[2]).memmap_(tempfile.mkdtemp())
        >>> obs.memmap_refresh_() is obs
        True
        """
        self._tensordict.memmap_refresh_(allow_pickle=allow_pickle)
        return self

    def _field_key(self, key: NestedKey) -> NestedKey:
        raise NotImplementedError  # provided by the decorated class


# -- saving -----------------------------------------------------------------------------------
def _save(tc: T, prefix: PathLike | None, opts: SaveOptions, *, inplace: bool) -> Any:
    td = tc._tensordict
    cls = type(tc)
    if opts.archive:
        assert prefix is not None  # SaveOptions.of refuses an archive without a prefix
        return _save_archive(tc, os.path.abspath(os.fspath(prefix)), opts)
    if prefix is None:
        own = td._memmap_prefix
        if own is None or os.path.basename(own) != WRAPPED_DIR:  # anonymous memory, or a bare tensordict's folder
            return _wrap_result(tc, save_tree(td, None, opts, inplace=inplace), inplace)
        prefix = os.path.dirname(own)
    folder = os.path.abspath(os.fspath(prefix))
    if opts.atomic:
        return _save_atomic(tc, folder, opts, inplace)
    result = save_tree(td, os.path.join(folder, WRAPPED_DIR), opts, inplace=inplace)
    if isinstance(result, TensorDictFuture):
        return _finish_later(result, folder, cls, tc if inplace else cls._from_tensordict(result.resulting_td))
    fresh = write_nontensor(folder, _wrapper_meta(cls), None)  # the marker last: it names complete data
    if fresh and opts.share_non_tensor:
        _rebase(result, None, None)
    return _wrap_result(tc, result, inplace)


def _wrap_result(tc: T, result: Any, inplace: bool) -> Any:
    if isinstance(result, TensorDictFuture):
        return TensorDictFuture(result.futures, tc if inplace else type(tc)._from_tensordict(result.resulting_td))
    return tc if inplace else type(tc)._from_tensordict(result)


def _finish_later(inner: TensorDictFuture[Any], folder: str, cls: type, out: Any) -> TensorDictFuture[Any]:
    """The future of a background save: the wrapper's marker is written once the fields are."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def finish() -> None:
        try:
            inner.result()
            write_nontensor(folder, _wrapper_meta(cls), None)
        except BaseException as err:  # delivered by TensorDictFuture.result()
            done.set_exception(err)
        else:
            done.set_result(None)

    threading.Thread(target=finish, name="tdshare-tensorclass-commit", daemon=True).start()
    return TensorDictFuture([*inner.futures, done], out)


def _save_atomic(tc: T, folder: str, opts: SaveOptions, inplace: bool) -> T:
    """Write the wrapper into a staging folder beside ``folder`` and swap it in whole."""
    td = tc._tensordict
    cls = type(tc)
    os.makedirs(os.path.dirname(os.path.realpath(folder)), exist_ok=True)
    lock_owner = SharedRegistry.for_directory(folder)
    inner_opts = opts.but(atomic=False, existsok=True)
    with lock_owner.lock():  # a new tree too: concurrent atomic saves take turns (see _write)
        registry = lock_owner if os.path.isfile(os.path.join(folder, META_FILE)) else None
        with atomic_directory(folder, opts.existsok) as staging:
            try:
                result = save_tree(td, os.path.join(staging, WRAPPED_DIR), inner_opts, inplace=inplace)
            except MemmapError as err:  # name the target, not the staging folder
                raise type(err)(str(err).replace(staging, folder)) from None
            write_nontensor(staging, _wrapper_meta(cls), None)
            if registry is not None:
                registry.mark_replacing()  # before the swap: see EpochGuard
        gen = registry.bump(files_replaced=True) if registry is not None else None
    _rebase(result, staging, folder)
    result._generation = gen
    return tc if inplace else cls._from_tensordict(result)


def _rebase(td: TensorDictBase, old: str | None, new: str | None) -> None:
    """Point a tree written into ``old`` (a staging folder, renamed since) at ``new``; share its shared
    values through the registry of the whole tree (None, None: only that).

    A shared value made while the wrapper's ``meta.json`` did not exist yet took the registry of
    the ``_tensordict`` folder alone, which is not the one every other process finds."""

    def moved(path: str) -> str:
        if old is None or new is None or not (path == old or path.startswith(old + os.sep)):
            return path
        return new + path[len(old) :]

    if td._memmap_prefix is not None:
        td._memmap_prefix = moved(td._memmap_prefix)
        track(td._tensordict, td._memmap_prefix)  # its leaves not read yet are in the new folder now
    for key, value in list(raw_items(td._tensordict)):  # leaves not read yet are renamed, not mapped
        if is_pending(value) or (isinstance(value, MemoryMappedTensor) and value._filename is not None):
            set_leaf_file(value, moved(cast(str, leaf_file(value))))
        elif is_shared_value(value) and value._store is None:
            td._tensordict[key] = value.relocated(moved(value._folder))
        elif is_collection(value):
            _rebase(value, old, new)
        elif isinstance(getattr(value, "_tensordict", None), TensorDictBase) and kind_of(value) is not None:
            _rebase(value._tensordict, old, new)


def _save_archive(tc: T, path: str, opts: SaveOptions) -> T:
    """Write the wrapper's files into a scratch folder beside ``path`` and pack them into the archive."""
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    scratch = make_staging(parent)
    try:
        inner_opts = opts.but(archive=False, compression=None, atomic=False, existsok=True, num_threads=0)
        try:
            save_tree(tc._tensordict, os.path.join(scratch, WRAPPED_DIR), inner_opts, inplace=False)
        except MemmapError as err:
            raise type(err)(f"{str(err).replace(scratch, path)} (saving the archive {path!r})") from None
        write_nontensor(scratch, _wrapper_meta(type(tc)), None)
        written = pack_memmap(scratch, path, compression=opts.compression, existsok=opts.existsok)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return type(tc).load_memmap(written, robust_key=opts.robust_key, allow_pickle=True, num_threads=opts.num_threads)


# -- loading ----------------------------------------------------------------------------------
def _root_meta(path: str, mode: str | None) -> dict:
    if os.path.isfile(path):
        store = ArchiveStore(Archive(path), True, None)
        return store.read_meta(store.root)
    return read_meta(path)


def _state_before(path: str, mode: str | None) -> tuple[int, int] | None:
    if mode == "r" or not os.path.isdir(path):
        return None
    return SharedRegistry.for_directory(path).state()


def _load_into_instance(
    tc: Any,
    path: str,
    device: Any,
    robust_key: bool | None,
    mode: str | None,
    allow_pickle: bool | None,
    num_threads: int,
) -> Any:
    """Load the tensorclass saved at ``path`` into the instance ``tc`` (its tensordict reused)."""
    tag = _root_meta(path, mode).get("_type")
    cls = type(tc)
    if tag != class_tag(cls):
        saved = tag if isinstance(tag, str) else "a tensordict"
        raise InvalidArgumentError(
            f"Cannot load {saved} saved in {path!r} in place into an instance of {class_tag(cls)}: load it with "
            "load_memmap() instead."
        )
    td = tc._tensordict
    if os.path.isdir(path):
        load_into(td, os.path.join(path, WRAPPED_DIR), robust_key, allow_pickle=allow_pickle, mode=mode)
    else:
        was_memmap = td._is_memmap
        if was_memmap:
            td.unlock_()
        try:
            load_tree(
                TensorDict,
                path,
                device,
                out=td,
                robust_key=robust_key,
                subpath=WRAPPED_DIR,
                mode=mode,
                allow_pickle=allow_pickle,
                num_threads=num_threads,
            )
        except BaseException:
            if was_memmap:
                td.lock_()._propagate(_set_memmap)
            raise
    return tc


def _set_memmap(td: TensorDictBase) -> None:
    td._is_memmap = True
