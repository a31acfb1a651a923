"""A TensorDict saved as one ``.tdz`` archive file (the container is :mod:`tdshare._tdz`).

``memmap``/``save``/``dumps`` write an archive when the prefix ends with ``.tdz`` or
``archive=True``: the entries are the files a folder save would write (:mod:`tdshare._format`),
always written atomically.  Loading maps the archive once: each STORED leaf is a
:class:`MemoryMappedTensor` view of that one mapping whose ``_filename`` is the archive and
``_offset`` the payload's byte offset, so pickling it sends a handle, never the bytes.  ``mode``
None/``"r"`` maps copy-on-write, ``"r+"`` writes through (then :func:`refresh_archive_checksums`
updates the zip CRCs).  Compressed or misaligned leaves are decompressed or copied into ordinary
memory (compressed ones CRC-checked, on ``num_threads`` threads).  The result is unlocked and
``is_memmap()`` is False, as in the reference.  Reading is :mod:`tdshare._read`'s walker over
:class:`tdshare._archive_store.ArchiveStore`; this module writes, packs and unpacks.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, TypeVar

from ._errors import InvalidArgumentError, MissingMetadataError, NotSupportedError
from ._format import META_FILE, PICKLE_FILE, dumps_json, level_meta
from ._read import load_tree
from ._tdz import check_target, extract, folder_entries, parse_compression, refresh_crcs, write_archive
from ._tensordict import TensorDictBase
from ._write import _Level, _plan

__all__ = [
    "archive_target",
    "pack_memmap",
    "refresh_archive_checksums",
    "save_archive",
    "unpack_memmap",
]

T = TypeVar("T", bound=TensorDictBase)
PathLike = str | os.PathLike


# -- writing ----------------------------------------------------------------------------------
def archive_target(prefix: object, archive: bool | None, compression: object) -> bool:
    """Whether ``memmap``/``save`` write an archive (``archive=True``, or None and a ``.tdz`` prefix)."""
    if archive is None:
        archive = isinstance(prefix, (str, os.PathLike)) and pathlib.PurePath(os.fspath(prefix)).suffix == ".tdz"
    if archive and prefix is None:
        raise InvalidArgumentError("archive=True needs a prefix: the path of the archive file to write.")
    if not archive and compression is not None:
        raise InvalidArgumentError(
            f"compression={compression!r} applies to archives only: pass a prefix ending with '.tdz' or archive=True."
        )
    return bool(archive)


def _tree_entries(level: _Level) -> Any:
    """The files of a planned tree (``_write._plan`` with the root ``""``) in archive order."""
    rel = "" if not level.path else level.path.replace(os.sep, "/") + "/"
    yield rel + META_FILE, dumps_json(level_meta(level.entries, level.src.batch_size, level.names))
    for leaf in sorted(level.leaves, key=lambda leaf: leaf.path or ""):
        if leaf.src.numel():  # a zero-element leaf has no file
            yield (leaf.path or "").replace(os.sep, "/"), leaf.src
    folders: list[tuple[str, Any]] = [(nt.path or "", nt) for nt in level.nontensors]
    folders += [(child.path or "", child) for _, child in level.children]
    for path, item in sorted(folders, key=lambda x: x[0]):
        if isinstance(item, _Level):
            yield from _tree_entries(item)
        else:
            yield f"{path}/{META_FILE}".replace(os.sep, "/"), item.meta
            if item.pickled is not None:
                yield f"{path}/{PICKLE_FILE}".replace(os.sep, "/"), item.pickled


def save_archive(
    td: T,
    prefix: PathLike,
    *,
    compression: str | int | None = None,
    num_threads: int = 0,
    return_early: bool = False,
    share_non_tensor: bool = False,
    existsok: bool = True,
    robust_key: bool | None = True,
) -> T:
    """``td.memmap(prefix)`` to an archive: write it atomically, return it loaded (unlocked)."""
    if return_early:
        raise NotSupportedError("return_early=True is not supported for a .tdz archive, which is written in one go.")
    if share_non_tensor:
        raise NotSupportedError("share_non_tensor=True is not supported for a .tdz archive, a read-only snapshot.")
    method = parse_compression(compression)
    path = check_target(prefix, existsok)
    robust = True if robust_key is None else bool(robust_key)
    write_archive(path, _tree_entries(_plan(td, "", robust, True, True)), method)
    return load_tree(type(td), path, robust_key=robust_key, allow_pickle=True, num_threads=num_threads)


def pack_memmap(
    folder: PathLike,
    archive: PathLike,
    *,
    compression: str | int | None = None,
    compresslevel: int | None = None,
    existsok: bool = True,
) -> str:
    """Pack a saved folder into a ``.tdz`` archive (every file, in archive order); return the archive path."""
    root = os.path.realpath(os.fspath(folder))
    if not os.path.isfile(os.path.join(root, META_FILE)):
        raise MissingMetadataError(f"No saved tensordict in {root!r}: {META_FILE} is missing.")
    method = parse_compression(compression)
    path = check_target(archive, existsok)
    write_archive(path, folder_entries(root), method, compresslevel)
    return path


def unpack_memmap(archive: PathLike, folder: PathLike) -> str:
    """Extract an archive into ``folder`` (created if needed), checking every CRC; return the folder."""
    root = os.path.abspath(os.fspath(folder))
    extract(os.path.abspath(os.fspath(archive)), root)
    return root


def refresh_archive_checksums(path: PathLike, *, num_threads: int = 0) -> int:
    """Rewrite the zip CRC-32s of the stored entries changed through ``mode="r+"``; return how many changed.

    Afterwards ``zipfile.ZipFile(path).testzip()`` and ``unzip -t`` accept the archive again.
    """
    return refresh_crcs(os.path.abspath(os.fspath(path)), max(2, num_threads))
