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
import struct
from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

from ._crc import crc32_threaded
from ._errors import (
    CorruptDataError,
    MemmapError,
    MissingMetadataError,
    TdshareError,
)
from ._files import TMP_MARK, tmp_name
from ._format import JOURNAL_FILE, LEAF_SUFFIX, META_FILE, dumps_json, dumps_level
from ._options import ARCHIVE_UNSUPPORTED, SaveOptions, Unsupported, check_path
from ._plan import PlannedLevel, PlannedWrapper, TreeWriter, plan_tree
from ._progress import ProgressCallback, counted
from ._read import load_tree, read_meta
from ._tdz import Archive, Entry, inflate, parse_compression
from ._tdz_write import Source, archive_target, pwrite_all, write_archive
from ._tensordict_base import TensorDictBase

__all__ = [
    "is_memmap_archive",
    "pack_memmap",
    "refresh_archive_checksums",
    "ArchiveWriter",
    "unpack_memmap",
]

T = TypeVar("T", bound=TensorDictBase)
PathLike = str | os.PathLike


# -- writing ----------------------------------------------------------------------------------
def _tree_entries(level: PlannedLevel) -> Any:
    """The files of a planned tree (:func:`tdshare._plan.plan_tree` with the root ``""``) in archive order."""
    rel = "" if not level.path else level.path.replace(os.sep, "/") + "/"
    if level.stack is not None:  # a lazy stack: its meta.json, then its members 0/, 1/...
        yield rel + META_FILE, level.stack_meta
        for _, member in level.children:
            yield from _tree_entries(member)
        return
    yield rel + META_FILE, dumps_level(level.entries, level.texts, level.src.batch_size, level.names)
    files = [(leaf.path or "", leaf.src) for leaf in level.leaves if leaf.src.numel()]  # zero elements: no file
    files += [(path, src) for src, path, _ in level.plain]
    for path, src in sorted(files, key=lambda file: file[0]):
        yield path.replace(os.sep, "/"), src
    folders: list[tuple[str, Any]] = [(nt.path or "", nt) for nt in level.nontensors]
    folders += [(child.path or "", child) for _, child in level.children]
    folders += [(w.path or "", w) for w in level.wrapped]
    for path, item in sorted(folders, key=lambda x: x[0]):
        if isinstance(item, PlannedLevel):
            yield from _tree_entries(item)
        elif isinstance(item, PlannedWrapper):
            yield f"{path}/{META_FILE}".replace(os.sep, "/"), item.meta
            yield from _tree_entries(item.inner)
        else:
            yield f"{path}/{META_FILE}".replace(os.sep, "/"), item.meta
            if item.pickled is not None:
                yield f"{path}/{item.pickle_name}".replace(os.sep, "/"), item.pickled


class ArchiveWriter(TreeWriter):
    """The write half of a ``.tdz`` archive: always atomic, returned loaded (unlocked).

    The entries are the files a folder save would write, in archive order; the archive is
    written beside its path and renamed into place (:func:`tdshare._tdz_write.write_archive`).
    """

    name = "a .tdz archive"
    unsupported: ClassVar[Unsupported] = ARCHIVE_UNSUPPORTED

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path

    def save(self, td: T, opts: SaveOptions, *, inplace: bool) -> T:
        """Write the archive; ``inplace`` changes nothing (an archive is never mapped in place)."""
        method = parse_compression(opts.compression)
        path = archive_target(self.path, opts.existsok)
        try:
            plan = plan_tree(td, "", opts.robust_key, opts.copy_existing, True)
        except MemmapError as err:  # a leaf mapped to another file, with copy_existing=False
            raise type(err)(f"{err} (saving the archive {path!r})") from None
        entries: Iterator[tuple[str, Any]] = _tree_entries(plan)
        if opts.progress is not None:
            total = sum(sum(1 for leaf in lvl.leaves if leaf.src.numel()) + len(lvl.plain) for lvl in plan.walk())
            entries = counted(entries, total, opts.progress, _is_leaf_entry)
        write_archive(path, entries, method)
        return load_tree(type(td), path, robust_key=opts.robust_key, allow_pickle=True, num_threads=opts.num_threads)


def _is_leaf_entry(entry: tuple[str, Any]) -> bool:
    return entry[0].endswith(LEAF_SUFFIX)


def is_memmap_archive(path: PathLike) -> bool:
    """Whether ``path`` is a memory-mapped tensordict archive: a zip file, valid as tdshare reads
    archives, with a top-level ``meta.json`` (as ``save("x.tdz")`` and :func:`pack_memmap` write).

    A folder, a missing path, another file or a damaged archive gives False; nothing is loaded.

    Args:
        path: the path to check.

    >>> import os, tempfile, torch
    >>> from tdshare import TensorDict, is_memmap_archive
    >>> with tempfile.TemporaryDirectory() as path:
    ...     _ = TensorDict(a=torch.zeros(3)).save(os.path.join(path, "td.tdz"))
    ...     _ = TensorDict(a=torch.zeros(3)).save(os.path.join(path, "td"))
    ...     is_memmap_archive(os.path.join(path, "td.tdz")), is_memmap_archive(os.path.join(path, "td"))
    (True, False)
    """
    where = os.fspath(path)
    try:
        return os.path.isfile(where) and META_FILE in Archive(where).entries
    except (TdshareError, OSError, ValueError):
        return False


def pack_memmap(
    folder: PathLike,
    archive: PathLike,
    *,
    compression: str | int | None = None,
    compresslevel: int | None = None,
    existsok: bool = True,
    progress: ProgressCallback | None = None,
) -> str:
    """Pack a saved folder into a ``.tdz`` archive (every file, in archive order); return the archive path.

    Args:
        folder: the folder of a saved tensordict.
        archive: the archive file to write (written atomically).
        compression: the entries' compression: None or ``"stored"``, ``"deflate"``, ``"bzip2"``,
            ``"lzma"``, or a ``zipfile`` constant.
        compresslevel: the compression level (None: the method's default).
        existsok: False refuses an existing ``archive``; True (the default) replaces it.
        progress: ``progress(done, total)``, called after each file packed.

    Returns:
        The archive's absolute path.

    Raises:
        MissingMetadataError: ``folder`` holds no saved tensordict (a ``FileNotFoundError``).
        InvalidArgumentError: ``archive`` is a folder, or an unknown ``compression`` (a ``ValueError``).
        FileExistsRuntimeError: ``archive`` exists and ``existsok=False`` (a ``RuntimeError``).

    >>> import os, tempfile, zipfile
    >>> from tdshare import TensorDict, pack_memmap
    >>> with tempfile.TemporaryDirectory() as path:
    ...     _ = TensorDict(a=torch.arange(3.0), batch_size=[3]).save(os.path.join(path, "td"))
    ...     archive = pack_memmap(os.path.join(path, "td"), os.path.join(path, "td.tdz"))
    ...     print(os.path.basename(archive), zipfile.ZipFile(archive).namelist())
    td.tdz ['meta.json', 'a.memmap']
    """
    check_path(folder, "folder")
    check_path(archive, "archive")
    root = os.path.realpath(os.fspath(folder))
    if not os.path.isfile(os.path.join(root, META_FILE)):
        raise MissingMetadataError(f"No saved tensordict in {root!r}: {META_FILE} is missing.")
    method = parse_compression(compression)
    path = archive_target(archive, existsok)
    entries: Iterator[tuple[str, Source]] = _folder_entries(root)
    if progress is not None:
        files = list(entries)
        entries = counted(files, len(files), progress)
    write_archive(path, entries, method, compresslevel)
    return path


def unpack_memmap(archive: PathLike, folder: PathLike, *, progress: ProgressCallback | None = None) -> str:
    """Extract an archive into ``folder`` (created if needed), checking every CRC; return the folder.

    Args:
        archive: the ``.tdz`` archive file.
        folder: the folder to write the files into.
        progress: ``progress(done, total)``, called after each entry extracted.

    Returns:
        The folder's absolute path.

    Raises:
        FileNotFoundError: ``archive`` does not exist.
        InvalidArgumentError: ``archive`` is a folder, or not a tensordict archive (a ``ValueError``).
        ArgumentTypeError: a path that is not a str or ``os.PathLike`` (a ``TypeError``).
        CorruptDataError: an entry fails its CRC-32 check (a ``ValueError``).

    >>> import os, tempfile
    >>> from tdshare import TensorDict, load_memmap, unpack_memmap
    >>> with tempfile.TemporaryDirectory() as path:
    ...     _ = TensorDict(a=torch.arange(3.0), batch_size=[3]).save(os.path.join(path, "td.tdz"))
    ...     folder = unpack_memmap(os.path.join(path, "td.tdz"), os.path.join(path, "td"))
    ...     print(sorted(os.listdir(folder)), load_memmap(folder)["a"].tolist())
    ['a.memmap', 'meta.json'] [0.0, 1.0, 2.0]
    """
    check_path(archive, "archive")
    check_path(folder, "folder")
    root = os.path.abspath(os.fspath(folder))
    _extract(os.path.abspath(os.fspath(archive)), root, progress)
    return root


def refresh_archive_checksums(path: PathLike, *, num_threads: int = 0) -> int:
    """Rewrite the zip CRC-32s of the stored entries changed through ``mode="r+"``; return how many changed.

    Afterwards ``zipfile.ZipFile(path).testzip()`` and ``unzip -t`` accept the archive again.

    Args:
        path: the ``.tdz`` archive file.
        num_threads: threads that read the entries (at least 2 are used).

    Returns:
        The number of entries whose CRC-32 was rewritten.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        InvalidArgumentError: ``path`` is a folder, or not a tensordict archive (a ``ValueError``).
        ArgumentTypeError: ``path`` is not a str or ``os.PathLike`` (a ``TypeError``).

    >>> import os, tempfile, zipfile
    >>> from tdshare import TensorDict, load_memmap, refresh_archive_checksums
    >>> with tempfile.TemporaryDirectory() as path:
    ...     archive = os.path.join(path, "td.tdz")
    ...     _ = TensorDict(a=torch.zeros(3), batch_size=[3]).save(archive)
    ...     load_memmap(archive, mode="r+")["a"][0] = 9.0  # written in place: the CRC is stale
    ...     print(zipfile.ZipFile(archive).testzip(), refresh_archive_checksums(archive))
    ...     print(zipfile.ZipFile(archive).testzip())
    a.memmap 1
    None
    """
    check_path(path, "path")
    return _refresh_crcs(os.path.abspath(os.fspath(path)), max(2, num_threads))


# -- where archives come from and go -----------------------------------------------------------
def _folder_entries(root: str, directory: str = "", rel: str = "") -> Iterator[tuple[str, Source]]:
    """Every file under the folder ``root``, in archive order (temporary files left out)."""
    directory = directory or root
    files: list[str] = []
    dirs: list[str] = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if TMP_MARK in entry.name:
            continue
        real = os.path.realpath(entry.path) if entry.is_symlink() else root
        if real != root and not real.startswith(root + os.sep):
            raise CorruptDataError(f"{entry.path!r} is a symbolic link that leads outside {root!r}: refusing it.")
        (dirs if entry.is_dir() else files).append(entry.name)
    journal = JOURNAL_FILE in files  # entries not compacted yet: the archive's meta.json holds them all
    for name in sorted(files, key=lambda n: n != META_FILE):  # meta.json first, the others stay sorted
        path = os.path.join(directory, name)
        if journal and name == JOURNAL_FILE:
            continue
        if journal and name == META_FILE:
            yield rel + name, dumps_json(read_meta(directory))
        elif name.endswith(LEAF_SUFFIX):
            yield rel + name, path
        else:
            with open(path, "rb") as f:
                yield rel + name, f.read()
    for name in dirs:
        yield from _folder_entries(root, os.path.join(directory, name), f"{rel}{name}/")


# -- archives as files: checksums, extraction --------------------------------------------------
def _refresh_crcs(path: str, threads: int) -> int:
    """Recompute the CRC-32 of every stored entry and rewrite those that changed; return their number."""
    ar = Archive(path, "r")
    stored = [e for e in ar.entries.values() if e.method == 0]
    changed = [(e, crc) for e in stored if (crc := crc32_threaded(ar.payload(e), threads)) != e.crc]
    if changed:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            for e, crc in changed:
                value = struct.pack("<I", crc)
                where = _descriptor_crc(ar, e) if e.flags & 0x08 else e.header + 14
                pwrite_all(fd, value, e.central + 16)
                pwrite_all(fd, value, where)
        finally:
            os.close(fd)
    return len(changed)


def _descriptor_crc(ar: Archive, e: Entry) -> int:
    """The file offset of the CRC in the data descriptor after ``e``'s payload.

    The flag alone proves nothing: the descriptor must be there, with ``e``'s sizes, before the
    next local header or the central directory, or nothing is written (the bytes after the
    payload could be another record).
    """
    start = e.data + e.csize
    limit = min([x.header for x in ar.entries.values() if x.header >= start] + [x.central for x in ar.entries.values()])
    for sig in (4, 0):  # with or without its signature
        if sig and bytes(ar.buf[start : start + 4]) != b"PK\x07\x08":
            continue
        for fmt in ("<II", "<QQ"):  # 32-bit or zip64 sizes
            end = start + sig + 4 + struct.calcsize(fmt)
            if end <= limit and struct.unpack_from(fmt, ar.buf, start + sig + 4) == (e.csize, e.size):
                return start + sig
    raise CorruptDataError(
        f"{ar.path}: the entry {e.name!r} announces a data descriptor after its payload, but none with its sizes "
        "is there; refusing to rewrite its CRC."
    )


def _make_parents(root: str, real_root: str, parts: list[str], name: str) -> None:
    """Create the folders ``root/parts...`` one by one, never through a link that leaves ``root``."""
    here = root
    for part in parts:
        here = os.path.join(here, part)
        try:
            os.mkdir(here)
        except FileExistsError:
            pass
        if os.path.islink(here) or not os.path.isdir(here):
            real = os.path.realpath(here)
            if not os.path.isdir(here) or (real != real_root and not real.startswith(real_root + os.sep)):
                raise CorruptDataError(
                    f"Refusing to extract {name!r}: {here!r} is not a folder inside {root!r} (a file, or a link "
                    "that leads outside)."
                )


def _extract(path: str, root: str, progress: ProgressCallback | None = None) -> None:
    """Extract every entry of the archive under ``root``, checking every CRC."""
    ar = Archive(path, "r")
    os.makedirs(root, exist_ok=True)
    real_root = os.path.realpath(root)
    entries = list(ar.entries.values())
    for e in counted(entries, len(entries), progress):
        parts = e.name.split("/")
        target = os.path.join(root, *parts)
        _make_parents(root, real_root, parts[:-1], e.name)
        parent = os.path.realpath(os.path.dirname(target))
        if parent != real_root and not parent.startswith(real_root + os.sep):
            raise CorruptDataError(f"Refusing to extract {e.name!r}: {parent!r} leads outside {root!r}.")
        tmp = tmp_name(target)
        with open(tmp, "wb") as f:
            try:
                if e.method:
                    inflate(e, ar.payload(e), f.write, path)
                elif crc32_threaded(ar.payload(e), 2) != e.crc:
                    raise CorruptDataError(f"{path}: the entry {e.name!r} fails its CRC-32 check.")
                else:
                    f.write(ar.payload(e))
            except BaseException:
                f.close()
                os.unlink(tmp)
                raise
        os.replace(tmp, target)
