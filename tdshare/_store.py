"""Where a saved tensordict is read from: one storage interface, with a folder and a ``.tdz`` archive behind it.

The loader (:mod:`tdshare._read`) walks a saved tree through :class:`Store` only, so a folder and
an archive are read by the same code, as in zarr-python v3.  A *level* is a store's handle for
one nesting level: a folder's absolute path, or an archive's entry prefix (``""``, ``"a/b/"``).
Each store keeps the checks of its medium: :class:`DirectoryStore` (here) refuses symbolic links that
leave the folder and files shorter than their metadata; :class:`ArchiveStore` refuses entries
whose size disagrees with it and defers decompression until the whole tree is known
(:mod:`tdshare._archive_store`).
"""

from __future__ import annotations

import errno
import math
import os
import pickle
import stat
import sys
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ._errors import (
    ArgumentTypeError,
    CorruptDataError,
    InvalidArgumentError,
    MissingMetadataError,
    PickleRefusedError,
)
from ._files import jagged_from_buffer, nested_from_buffer, shaped
from ._format import JOURNAL_FILE, LEAF_SUFFIX, META_FILE, LeafInfo, LevelMeta, loads_json, parse_level
from ._journal import merge_entries, parse_entries, read_journal
from ._keys import encode_key, is_safe_legacy_name
from ._lazy_leaves import PendingLeaf
from ._leaf_handle import LeafHandle
from ._memmap import MemoryMappedTensor
from ._tdz import Entry

__all__ = [
    "Store",
    "DirectoryStore",
    "STAT_AT_LOAD",
    "empty_leaf",
    "Deferred",
    "check_load_args",
    "member_without_meta",
    "read_meta",
    "checked_members",
    "member_entries",
]


def check_load_args(mode: object, allow_pickle: object) -> None:
    if mode not in (None, "r", "r+"):
        raise InvalidArgumentError(f"mode must be None, 'r' or 'r+', got {mode!r}.")
    if allow_pickle is not None and not isinstance(allow_pickle, bool):
        raise ArgumentTypeError(f"allow_pickle must be a bool or None, got {type(allow_pickle).__name__}.")


_CPU = torch.device("cpu")
_SEP = os.sep
_NOFOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


_FIRST_READ = 1 << 16


def _read_file(path: str, flags: int = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)) -> bytes:
    """The whole content of a small file, without the buffered file object's extra system calls.

    A read of a regular file that returns less than it asked for has reached the end (``meta.json``
    is only ever replaced by a rename, never extended in place), so a small file costs one
    ``read``; the first asks for 64 KiB, since the buffer ``os.read`` allocates costs more as it grows.
    """
    fd = os.open(path, flags)
    try:
        first = os.read(fd, _FIRST_READ)
        if len(first) < _FIRST_READ:
            return first
        chunks = [first]
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_meta(
    directory: str, *, nofollow: bool = False, parsed: dict[bytes, dict] | None = None, journal: bool = True
) -> dict:
    """The parsed ``meta.json`` of a saved folder (missing or malformed: an error naming it).

    ``nofollow``: refuse a symbolic link (``OSError`` ELOOP), so the caller can check where it leads.
    ``parsed``: a cache from file bytes to parsed metadata, for one load (the members of a lazy
    stack usually hold the same bytes); what it returns is shared and must not be changed.
    ``journal``: lay the level's record of new entries (``meta.jsonl``, :mod:`tdshare._journal`)
    over it, read first so that a compaction in between loses nothing (False: the caller reads it).
    """
    base = directory if directory.endswith(_SEP) else directory + _SEP  # os.path.join, for less
    path = base + META_FILE
    record = read_journal(directory) if journal and _may_exist(base + JOURNAL_FILE) else None
    try:
        raw = _read_file(path, _NOFOLLOW) if nofollow else _read_file(path)
    except FileNotFoundError:
        if not os.path.isdir(directory):
            raise MissingMetadataError(
                f"{directory!r} does not exist: there is no saved tensordict (folder or .tdz archive) there. "
                "Check the path, or save one there first (td.memmap(prefix) or td.save(prefix))."
            ) from None
        raise MissingMetadataError(
            f"No saved tensordict in {directory!r}: {META_FILE} is missing. Save one there first "
            "(td.memmap(prefix) or td.save(prefix))."
        ) from None
    except IsADirectoryError:
        raise CorruptDataError(f"{path} is a directory, not a metadata file.") from None
    if parsed is None:
        meta = loads_json(raw, path)
    else:
        hit = parsed.get(raw)
        if hit is None:
            hit = loads_json(raw, path)
            if len(raw) <= _CACHED_META_BYTES:
                parsed[raw] = hit
        meta = hit
    if record is not None and record.raw:
        meta = merge_entries(meta, parse_entries(record.raw, os.path.join(directory, JOURNAL_FILE)))
    return meta


# the cache keeps a level's bytes until the load ends, beside the parsed dict they map to (several
# times larger, and kept by the level): equal levels of ~1,000 leaves (87 KiB each) share one parse
# and one dict, which halves the load and its memory per leaf; the bound only stops a huge level's
# bytes from being held twice over
_CACHED_META_BYTES = 1 << 22

if os.access in os.supports_follow_symlinks:

    def _may_exist(path: str) -> bool:
        """Whether ``path`` may exist (a symbolic link counts): most levels have no record, and one
        ``access`` costs less than a failed ``open`` and its exception."""
        return os.access(path, os.F_OK, follow_symlinks=False)

else:  # pragma: no cover - platforms without faccessat: let the open decide

    def _may_exist(path: str) -> bool:
        return True


def user_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside tdshare."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame = frame.f_back
        level += 1
    return level


def empty_leaf(info: LeafInfo) -> MemoryMappedTensor:
    """A zero-element leaf, which has no file or entry."""
    return LeafHandle(info.dtype, info.shape).map()


@dataclass
class Deferred:
    """A leaf the store fills in later (:meth:`Store.finish`): a compressed archive entry."""

    entry: Entry
    info: LeafInfo


class Store(ABC):
    """What the loader needs from a saved tree: metadata, leaves, pickles and sub-levels by key."""

    root: str  # the level handle of the tree's top
    defers = False  # whether open_leaf may return a Deferred (filled in by finish)
    guard: Any = None  # a folder store's swap guard, given to its pending leaves (see _read._load_folder)
    leaves_in_order = False  # whether open_leaves gives the leaves in the order of the infos it is given

    def __init__(self, robust: bool, allow_pickle: bool | None) -> None:
        self.robust = robust
        self.allow_pickle = allow_pickle
        self.pending: list[tuple[dict[str, Any], str, Deferred]] = []
        self.parsed_meta: dict[bytes, dict] = {}  # meta.json bytes -> parsed (equal levels parse once)
        self._levels: dict[int, tuple[dict, LevelMeta]] = {}  # id(meta) -> (meta, its parse)

    def parse(self, meta: dict, meta_where: str) -> LevelMeta:
        """``parse_level(meta)``, once per metadata object of this load."""
        hit = self._levels.get(id(meta))
        if hit is not None and hit[0] is meta:
            return hit[1]
        level = parse_level(meta, meta_where)
        self._levels[id(meta)] = (meta, level)
        return level

    # -- naming -----------------------------------------------------------------------------
    @abstractmethod
    def where(self, level: str, name: str = "") -> str:
        """How an error message names the entry ``name`` of ``level`` (or the level itself)."""

    @abstractmethod
    def sub(self, level: str, name: str) -> str:
        """The handle of the sub-level stored under the raw name ``name`` (no lookup)."""

    def candidates(self, key: str, suffix: str, folder: bool) -> list[str]:
        """The names ``key`` may be stored under: the robust encoding, then the legacy raw name."""
        names = [encode_key(key) + suffix] if self.robust else []
        if (not self.robust or names[0] != key + suffix) and is_safe_legacy_name(key, directory=folder):
            names.append(key + suffix)
        return names

    # -- reading ----------------------------------------------------------------------------
    @abstractmethod
    def read_meta(self, level: str) -> dict:
        """The level's parsed ``meta.json``; an error names it when missing or malformed."""

    @abstractmethod
    def has_level(self, level: str) -> bool:
        """Whether ``level`` holds a ``meta.json``."""

    @abstractmethod
    def child(self, level: str, key: str) -> str | None:
        """The sub-level of ``key`` (robust name, then legacy), None if absent; never outside the root."""

    @abstractmethod
    def open_leaf(self, level: str, info: LeafInfo, meta_where: str, old: Any = None) -> Any:
        """The tensor of one leaf (or a :class:`Deferred`); ``old``, the current leaf, may be reused."""

    def open_leaves(
        self, level: str, infos: list[LeafInfo], meta_where: str, current: dict[str, Any]
    ) -> dict[str, Any]:
        """Every leaf of a level (its batch-size check done); ``current`` holds reusable old leaves."""
        return {info.key: self.open_leaf(level, info, meta_where, current.get(info.key)) for info in infos}

    @abstractmethod
    def members(self, level: str) -> Iterator[str]:
        """The member levels ``0``, ``1``... of a stack (a gap in the numbering raises)."""

    @abstractmethod
    def _read_pickle(self, level: str, name: str) -> Any:
        """Unpickle the entry ``name`` of ``level`` (the policy is already checked)."""

    def enter(self, level: str) -> AbstractContextManager[None]:
        """Guard the descent into ``level`` (a folder refuses symlinks out of it and loops)."""
        return nullcontext()

    def default_device(self, meta: dict) -> torch.device | None:
        """The device of a level loaded without ``device``."""
        return _CPU if meta.get("device") not in (None, "None") else None

    @abstractmethod
    def annotate(self, td: Any, level: str, meta: dict) -> None:
        """Record on a loaded level where it lives."""

    @abstractmethod
    def finish(self, device: torch.device | None) -> None:
        """Fill in the :class:`Deferred` leaves once the whole tree is known (``device``: non-cpu target)."""

    def unpickle(self, level: str, name: str) -> Any:
        """A pickled value, as ``allow_pickle`` says: None warns, False refuses, True loads."""
        where = self.where(level, name)
        if self.allow_pickle is False:
            raise PickleRefusedError(
                f"Refusing to load the pickled non-tensor data {where!r}: pickle can execute arbitrary code. Pass "
                "allow_pickle=True only if the saved data is trusted."
            )
        if self.allow_pickle is None:
            warnings.warn(
                f"Running the code of a pickle: loading the pickled non-tensor data {where!r} executes whatever it "
                "holds, which is only safe for data you trust. Pass allow_pickle=False to refuse pickles, or "
                "allow_pickle=True to load them without this warning.",
                FutureWarning,
                stacklevel=user_stacklevel(),
            )
        return self._read_pickle(level, name)

    def missing_leaf(self, level: str, info: LeafInfo, meta_where: str) -> CorruptDataError:
        missing = self.where(level, encode_key(info.key) + LEAF_SUFFIX)
        return CorruptDataError(
            f"{meta_where} lists the leaf {info.key!r} ({info.nbytes} bytes of {info.dtype}), but its file "
            f"{missing!r} is missing."
        )


# -- a saved folder ------------------------------------------------------------------------------
def checked_members(
    store: Store, level: str, found: set[int], path_of: Callable[[int], str], check_meta: bool = True
) -> list[str]:
    """The member levels ``0``...``n-1`` of a stack whose numbered folders are ``found``: a gap in the
    numbering, or a member folder without ``meta.json``, raises naming it (never a shorter stack).

    ``check_meta=False``: the caller learns of a missing ``meta.json`` when it reads it (a folder
    saves a ``stat`` per member that way); see :func:`member_without_meta`."""
    for i in range(len(found)):
        if i not in found:
            raise CorruptDataError(
                f"{store.where(level)!r}: the stacked member folder {i!r} is missing (found {sorted(found)})."
            )
        if check_meta and not store.has_level(path_of(i)):
            raise member_without_meta(store, level, i)
    return [path_of(i) for i in range(len(found))]


def member_entries(entries: Iterable[os.DirEntry]) -> list[os.DirEntry]:
    """The entries of a folder's listing that are a stack's member folders: named ``0``, ``1``...
    (ASCII digits, no leading zero), directories or symbolic links to one.

    >>> member_entries([])
    []
    """
    return [
        e
        for e in entries
        if (name := e.name).isdigit() and name.isascii() and (name[0] != "0" or name == "0") and e.is_dir()
    ]


def member_without_meta(store: Store, level: str, index: int) -> CorruptDataError:
    """The error for a stacked member folder that holds no ``meta.json``."""
    return CorruptDataError(f"{store.where(level)!r}: the stacked member folder {index!r} has no {META_FILE}.")


def _file_of(info: LeafInfo) -> str:
    """The robust file name of a non-empty, non-nested leaf; "" for any other (loaded the careful way)."""
    key, shape, _, nested = info
    if nested or not (shape[0] if len(shape) == 1 else math.prod(shape)):
        return ""
    return (key if key.isidentifier() else encode_key(key)) + LEAF_SUFFIX


#: a folder level of more leaves than this is checked at load from its listing, not a ``stat`` per
#: file: a file's size is then checked when its leaf is first read (see ``open_leaves``)
STAT_AT_LOAD = 64


class DirectoryStore(Store):
    """A saved folder: leaves are mapped files; nothing outside the folder's real path is read."""

    leaves_in_order = True

    def __init__(self, directory: str, robust: bool, mode: str | None, allow_pickle: bool | None) -> None:
        super().__init__(robust, allow_pickle)
        self.root = directory
        self._real: str | None = None  # the folder's real path, found at the first symbolic link
        self.mode = mode
        self._active: set[str] = set()  # real paths of the symlinked folders being loaded (loops)
        self._names: dict[str, dict[str, os.DirEntry]] = {}  # one scan per level, on first use
        self._links: set[str] = set()  # sub-levels child() found to be symbolic links
        self._plain: set[str] = set()  # and those it found to be real entries
        self.lazy = True  # leaves are checked at load and mapped on first read (:mod:`tdshare._lazy_leaves`)
        self._leaf_files: dict[int, tuple[list[LeafInfo], list[tuple[LeafInfo, str]]]] = {}  # see _pending_leaves

    def where(self, level: str, name: str = "") -> str:
        return level + _SEP + name if name else level  # levels are absolute and normalized: a plain join

    def sub(self, level: str, name: str) -> str:
        return level + _SEP + name

    def _scan(self, level: str) -> dict[str, os.DirEntry]:
        names = self._names.get(level)
        if names is None:
            names = self._names[level] = {e.name: e for e in os.scandir(level)}
        return names

    @property
    def real(self) -> str:
        """The loaded folder's real path (where its symbolic links must lead)."""
        if self._real is None:
            self._real = os.path.realpath(self.root)
        return self._real

    def _inside(self, path: str, what: str) -> str:
        """The real path of ``path``, which must stay inside the loaded directory."""
        real = os.path.realpath(path)
        top = self.real
        if real != top and not real.startswith(top + os.sep):
            raise CorruptDataError(f"{what} {path!r} is a symbolic link that leads outside {top!r}: refusing it.")
        return real

    def _check_file_link(self, path: str) -> None:
        """Refuse a metadata or pickle file that is a symbolic link leading outside the loaded directory."""
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                self._inside(path, "The file")
        except FileNotFoundError:
            pass

    def _find(self, level: str, key: str, suffix: str, folder: bool) -> tuple[str, os.DirEntry] | None:
        """The path and scan entry of ``key`` in ``level`` (robust name, then legacy raw name), or None.

        A symbolic link must lead inside the loaded directory."""
        names = self._scan(level)
        for name in self.candidates(key, suffix, folder):
            entry = names.get(name)
            if entry is not None:
                path = level + _SEP + name
                if entry.is_symlink():
                    self._inside(path, "The entry")
                return path, entry
        return None

    def _locate(self, level: str, key: str, suffix: str, folder: bool) -> str | None:
        found = self._find(level, key, suffix, folder)
        return None if found is None else found[0]

    def read_meta(self, level: str) -> dict:
        # not the level's scan: the scan must come after the metadata, so that every file the
        # committed metadata names (data is written before metadata) is in it
        try:
            return read_meta(level, nofollow=True, parsed=self.parsed_meta)
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
        self._check_file_link(os.path.join(level, META_FILE))  # a symbolic link: it must stay inside
        return read_meta(level, parsed=self.parsed_meta)

    def has_level(self, level: str) -> bool:
        return os.path.isfile(os.path.join(level, META_FILE))

    def child(self, level: str, key: str) -> str | None:
        found = self._find(level, key, "", True)
        if found is None:
            return None
        path, entry = found
        if entry.is_symlink():
            self._links.add(path)
            return path if os.path.isdir(path) else None
        self._plain.add(path)
        return path if entry.is_dir() else None

    @contextmanager
    def _entering(self, path: str) -> Iterator[None]:
        real = self._inside(path, "The folder")
        if real in self._active:
            raise CorruptDataError(f"The folder {path!r} is a symbolic link that loops back to {real!r}: refusing it.")
        self._active.add(real)
        try:
            yield
        finally:
            self._active.discard(real)

    def enter(self, level: str) -> AbstractContextManager[None]:
        if level in self._plain:  # found by child() as a real folder: no lstat
            return nullcontext()
        return self._entering(level) if level in self._links or os.path.islink(level) else nullcontext()

    def members(self, level: str) -> Iterator[str]:
        try:
            with os.scandir(level) as scan:
                entries = member_entries(scan)
        except OSError:
            entries = []
        for e in entries:  # a real folder needs no lstat when it is entered; a link is checked then
            (self._links if e.is_symlink() else self._plain).add(level + _SEP + e.name)
        found = {int(e.name) for e in entries}
        yield from checked_members(self, level, found, lambda i: level + _SEP + str(i), check_meta=False)

    def _read_pickle(self, level: str, name: str) -> Any:
        path = os.path.join(level, name)
        self._check_file_link(path)
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            raise CorruptDataError(f"The pickled non-tensor value {path!r} is missing.") from None

    def annotate(self, td: Any, level: str, meta: dict) -> None:
        """The folder (for ``memmap_``, unless ``mode="r"``) and the metadata read (for refresh)."""
        td._memmap_prefix = level if self.mode != "r" else None
        td._meta_seen = meta

    def finish(self, device: torch.device | None) -> None:
        """Nothing to do: a folder's leaves are mapped at once."""

    def open_leaves(
        self, level: str, infos: list[LeafInfo], meta_where: str, current: dict[str, Any]
    ) -> dict[str, Any]:
        """Every leaf of a level, with one fused loop for the common case.

        A fresh load of regular, robustly named files in mode None or "r" makes pending leaves
        after one ``lstat`` per file (size, type, inode), or, in a level of more than
        :data:`STAT_AT_LOAD` leaves, from one listing of the level and no ``stat`` per file (the
        listing says the file exists, is a regular file and no symbolic link, and gives its
        inode; the size is checked when the leaf is first read, by :meth:`PendingLeaf.resolve`,
        with the same error naming the file).  With ``lazy`` off they are mapped here.  Any
        other leaf (nested, empty, legacy name, symlink, short file, a reusable old leaf, "r+")
        goes through :meth:`open_leaf`, which raises the precise errors.
        """
        prefix = level + os.sep
        mode = self.mode
        robust = self.robust and mode != "r+"
        lazy = self.lazy
        if lazy and robust and len(infos) > STAT_AT_LOAD:
            return self._pending_leaves(level, infos, meta_where, current)
        pending, guard = PendingLeaf, self.guard
        from_file, adopt, isreg, lstat = torch.from_file, MemoryMappedTensor._adopt, stat.S_ISREG, os.lstat
        euid = os.geteuid()
        shared = mode is None
        out: dict[str, Any] = {}
        for info in infos:
            key, shape, dtype, nested = info
            if not robust or nested or (current and current.get(key) is not None):
                out[key] = self.open_leaf(level, info, meta_where, current.get(key))
                continue
            # one lstat per leaf, no listing of the level: a missing file, a legacy name or a
            # symbolic link (not S_ISREG under lstat) goes the careful way, which lists it
            path = prefix + (key if key.isidentifier() else encode_key(key)) + LEAF_SUFFIX
            try:
                st = lstat(path)
            except OSError:
                st = None
            numel = shape[0] if len(shape) == 1 else math.prod(shape)
            if st is None or not numel or st.st_size < numel * dtype.itemsize or not isreg(st.st_mode):
                out[key] = self.open_leaf(level, info, meta_where)
                continue
            if lazy:  # checked now, mapped when first read (the checks run again then)
                out[key] = pending(dtype, shape, path, mode, None, 0, st.st_ino, meta_where, guard)
                continue
            if shared and (euid == 0 or (st.st_uid == euid and st.st_mode & stat.S_IWUSR)):
                flat = from_file(path, shared=True, size=numel, dtype=dtype)
            elif mode == "r":
                flat = from_file(path, shared=False, size=numel, dtype=dtype)
            else:  # group/other permissions, ACLs: the careful path
                out[key] = LeafHandle.file(path, dtype, shape, mode).map(st)
                continue
            leaf = adopt(flat if len(shape) == 1 else shaped(flat, shape), path, st.st_ino)
            if mode is not None:
                leaf._mode = mode
            out[key] = leaf
        return out

    def _pending_leaves(
        self, level: str, infos: list[LeafInfo], meta_where: str, current: dict[str, Any]
    ) -> dict[str, Any]:
        """The lazy form of :meth:`open_leaves`: a pending leaf per regular file the level's
        listing holds, :meth:`open_leaf` for the rest (see there)."""
        prefix = level + os.sep
        names = self._scan(level)
        get, mode, guard, pending = names.get, self.mode, self.guard, PendingLeaf
        out: dict[str, Any] = {}
        plan = self._leaf_files.get(id(infos))
        if plan is None or plan[0] is not infos:  # equal levels share one parse, so one plan
            plan = self._leaf_files[id(infos)] = (infos, [(info, _file_of(info)) for info in infos])
        for info, name in plan[1]:
            old = current.get(info[0]) if current else None
            entry = get(name) if name and old is None else None
            # a reusable old leaf, a missing file, a symbolic link, anything but a regular file, a
            # nested or empty leaf: the careful way
            if entry is None or not entry.is_file(follow_symlinks=False):
                out[info[0]] = self.open_leaf(level, info, meta_where, old)
                continue
            out[info[0]] = pending(info[2], info[1], prefix + name, mode, None, 0, entry.inode(), meta_where, guard)
        return out

    def open_leaf(self, level: str, info: LeafInfo, meta_where: str, old: Any = None) -> Any:
        """Map one leaf file (size checked); ``old`` is kept if it maps the same inode the same way."""
        if info.is_nested:
            return self._nested(level, info, meta_where)
        dtype, shape = info.dtype, info.shape
        numel = math.prod(shape)
        if numel == 0:
            return empty_leaf(info)
        # fast path: the robust name exists and is no symlink (one dict lookup, no path parsing)
        name = encode_key(info.key) + LEAF_SUFFIX if self.robust else ""
        entry = self._scan(level).get(name) if name else None
        if entry is not None and not entry.is_symlink():
            path = level + os.sep + name
        else:
            found = self._locate(level, info.key, LEAF_SUFFIX, False)
            if found is None:
                raise self.missing_leaf(level, info, meta_where)
            path = found
            entry = self._scan(level)[os.path.basename(path)]
        handle = LeafHandle.file(path, dtype, shape, self.mode)
        st = entry.stat()
        handle.check(st, meta_where, info.key)
        handle.ino = st.st_ino
        if handle.maps(old):
            return old  # same file, same inode: the mapping is current
        return handle.map(st)

    def _nested(self, level: str, info: LeafInfo, meta_where: str) -> torch.Tensor:
        """A strided nested tensor (reference layout): ``k.memmap`` values, ``k.shape.memmap`` sizes."""
        if len(info.shape) != 2:
            raise CorruptDataError(f"{meta_where}: nested leaf {info.key!r} needs a 2-d size table, got {info.shape}.")
        shape_path = self._locate(level, info.key, ".shape" + LEAF_SUFFIX, False)
        data_path = self._locate(level, info.key, LEAF_SUFFIX, False)
        if shape_path is None or data_path is None:
            raise CorruptDataError(f"{meta_where}: the files of nested leaf {info.key!r} are missing.")
        sizes = LeafHandle.file(shape_path, torch.int64, info.shape, "r").map()
        if (torch.Tensor.as_subclass(sizes, torch.Tensor) < 0).any():
            raise CorruptDataError(f"{shape_path!r}: the size table of nested leaf {info.key!r} has negative sizes.")
        numel = int(torch.Tensor.as_subclass(sizes, torch.Tensor).prod(-1).sum()) if sizes.numel() else 0
        values = LeafHandle.file(data_path, info.dtype, (numel,), self.mode).map()  # shared where writable
        if info.is_nested == "jagged":
            return jagged_from_buffer(values, sizes)
        return nested_from_buffer(values, sizes)
