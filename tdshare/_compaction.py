"""The writer's side of a level's record (``meta.jsonl``, :mod:`tdshare._journal`): append, compact.

``make_memmap*`` adds an entry in O(1): under the tree's lock it checks the level's two files
with two ``stat`` calls against what this process last read or wrote (kept here per level), and
appends one line (the first one after the level's ``meta.json`` got its record field, see
:mod:`tdshare._journal`).  A small level (under :data:`WRITE_THROUGH` entries, no record) gets its
``meta.json`` rewritten instead, so tensordict sees it at once.  A level's record is folded
into its ``meta.json`` (*compacted*):

- when it holds as many entries as ``meta.json`` (at least :data:`WRITE_THROUGH`): each
  compaction writes at most twice the bytes added since the last one, so the cost per entry is
  bounded (amortised O(1));
- when a process that appended exits normally (the exit hook of :mod:`multiprocessing`, which
  also runs in its worker processes);
- on :func:`compact_metadata`.

Until then tensordict 0.15.3 loads the folder as of the last compaction; tdshare always reads
every committed entry.
"""

from __future__ import annotations

import multiprocessing.util
import os
from collections.abc import Callable
from typing import Any

from ._coordination import SharedRegistry
from ._errors import ArgumentTypeError, MissingMetadataError
from ._files import replace_file
from ._format import JOURNAL_FIELD, JOURNAL_FILE, META_FILE, dumps_json, loads_json
from ._journal import append_line, compact_level, entry_line, merge_entries, parse_entries, read_journal
from ._store import read_meta

__all__ = [
    "WRITE_THROUGH",
    "LevelState",
    "add_to_level",
    "compact_metadata",
    "level_state",
    "read_level",
    "record_appended",
    "small_level",
    "write_through",
]

#: Levels with fewer entries than this (and no record) have their meta.json rewritten on each addition.
WRITE_THROUGH = 64


class LevelState:
    """What this process last read or wrote of one level: the files' stamps and the merged entries."""

    __slots__ = ("jstamp", "meta", "n_journal", "n_meta", "stamp")

    def __init__(
        self, stamp: tuple[int, int, int], jstamp: tuple[int, int] | None, meta: dict, n_meta: int, n_journal: int
    ) -> None:
        self.stamp, self.jstamp, self.meta, self.n_meta, self.n_journal = stamp, jstamp, meta, n_meta, n_journal


_LEVELS: dict[str, LevelState] = {}
_CACHE_SIZE = 256
_PENDING: dict[str, None] = {}  # levels this process appended to (compacted at its exit)
_HOOKED: list[int] = []  # the pid that registered the exit hook


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def _jstamp(directory: str) -> tuple[int, int] | None:
    try:
        st = os.stat(directory + os.sep + JOURNAL_FILE)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size


def read_level(directory: str) -> dict:
    """A level's entries as tdshare readers see them (``meta.json`` with its record laid over).

    Served from what this process last read or wrote when both files are unchanged.  The
    caller holds the tree's lock and must not change the dict it gets.

    Raises:
        MissingMetadataError, CorruptDataError: no or damaged metadata (naming the file).
    """
    path = directory + os.sep + META_FILE
    try:
        st = os.stat(path)
    except OSError:
        return read_meta(directory)  # raises the clear error
    stamp, jstamp = _stamp(st), _jstamp(directory)
    hit = _LEVELS.get(directory)
    if hit is not None and hit.stamp == stamp:
        if hit.jstamp == jstamp:
            return hit.meta
        if jstamp is not None and (hit.jstamp is None or (hit.jstamp[0] == jstamp[0] and hit.jstamp[1] < jstamp[1])):
            # another writer appended to the record this process knows: read its new lines only
            # (re-reading the whole record at each of its additions made n additions cost O(n^2))
            start = 0 if hit.jstamp is None else hit.jstamp[1]
            tail = read_journal(directory, start)
            if tail is not None and (hit.jstamp is None or tail.ino == hit.jstamp[0]):
                added = parse_entries(tail.raw, directory + os.sep + JOURNAL_FILE)
                hit.meta.update(added)
                hit.n_journal += len(added)
                hit.jstamp = (tail.ino, tail.end)
                return hit.meta
    journal = read_journal(directory)
    with open(path, "rb") as f:
        raw = f.read()
    meta = loads_json(raw, path)
    n_meta = len(meta)
    entries = parse_entries(journal.raw, directory + os.sep + JOURNAL_FILE) if journal is not None else {}
    merged = merge_entries(meta, entries)
    if merged is meta:
        merged = dict(meta)
    jst = None if journal is None else (journal.ino, journal.end)  # a torn last line is cut at the next append
    _keep(directory, LevelState(_stamp(os.stat(path)), jst, merged, n_meta, len(entries)))
    return merged


def _keep(directory: str, level: LevelState) -> None:
    if directory not in _LEVELS and len(_LEVELS) >= _CACHE_SIZE:
        _LEVELS.pop(next(iter(_LEVELS)))
    _LEVELS[directory] = level


def add_to_level(
    directory: str,
    meta: dict | None,
    key: str,
    value: dict,
    new: dict | None = None,
    replace: Callable[[str, bytes], Any] = replace_file,
) -> None:
    """Commit ``key: value`` to the level in ``directory`` (the caller holds the tree's lock).

    ``meta``: what :func:`read_level` returned for it, or None for a level being created, whose
    ``meta.json`` is written whole from ``new`` (its batch fields).  ``replace`` replaces a
    file atomically (the caller's, so that its tests can stop a commit half-way).
    """
    if meta is None:
        assert new is not None
        body = {**new, key: value}
        replace(directory + os.sep + META_FILE, dumps_json(body))
        _forget(directory)
        return
    hit = _LEVELS.get(directory)
    if hit is None or hit.meta is not meta:
        read_level(directory)
        hit = _LEVELS[directory]
    if hit.jstamp is None and hit.n_meta < WRITE_THROUGH and key not in hit.meta:
        _rewrite(directory, hit, key, value, replace)
        return
    if JOURNAL_FIELD not in hit.meta:
        # before the level's first record line: a reader that finds meta.json without the field
        # knows the level had no record when it was written (a lazy stack's load probes no member)
        _rewrite(directory, hit, JOURNAL_FIELD, True, replace)
    ino, size = append_line(directory, entry_line(key, value), None if hit.jstamp is None else hit.jstamp[1])
    record_appended(directory, hit, key, value, ino, size)


def level_state(directory: str) -> LevelState | None:
    """What this process last read or wrote of the level in ``directory`` (None: nothing kept).

    The object stays the same while it is current: :mod:`tdshare._adder` keeps it and checks it
    is still this one before it appends on its own.
    """
    return _LEVELS.get(directory)


def small_level(directory: str, key: str) -> LevelState | None:
    """The level in ``directory`` as this process last read or wrote it, if that is still what is
    on disk and the level is small (no record, under :data:`WRITE_THROUGH` entries, ``key`` not
    among them): the state :func:`write_through` takes.  None otherwise (ask :func:`read_level`).

    The caller holds the tree's lock and knows that no other process committed to the tree since
    this process's last addition; the two ``stat`` calls (``meta.json`` still the file this
    process knows, no record since) cover a commit of this process that bypassed this module.
    """
    hit = _LEVELS.get(directory)
    if hit is None or hit.jstamp is not None or hit.n_meta >= WRITE_THROUGH or key in hit.meta:
        return None
    try:
        current = _stamp(os.stat(directory + os.sep + META_FILE)) == hit.stamp
    except OSError:
        return None
    return hit if current and _jstamp(directory) is None else None


def write_through(directory: str, hit: LevelState, key: str, value: dict) -> None:
    """Commit ``key: value`` to the small level :func:`small_level` returned ``hit`` for: its
    ``meta.json`` replaced atomically with the entry added (the caller holds the tree's lock)."""
    _rewrite(directory, hit, key, value, replace_file)


def record_appended(directory: str, hit: LevelState, key: str, value: dict, ino: int, size: int) -> bool:
    """Note that ``key: value`` was appended to the level's record (now ``size`` bytes, inode
    ``ino``), with the tree's lock held; compact the level when its record has grown as large as
    its ``meta.json`` (amortised O(1) per entry).  Returns whether it compacted (the record is gone).
    """
    hit.meta[key] = value
    hit.jstamp = (ino, size)
    hit.n_journal += 1
    _note_pending(directory)
    if hit.n_journal < max(WRITE_THROUGH, hit.n_meta):
        return False
    compact_level(directory)
    hit.stamp = _stamp(os.stat(directory + os.sep + META_FILE))
    hit.jstamp = None
    hit.n_meta = len(hit.meta)
    hit.n_journal = 0
    return True


def _rewrite(directory: str, hit: LevelState, key: str, value: Any, replace: Callable[[str, bytes], Any]) -> None:
    """A small level's new entry, or a level's record field: its meta.json replaced with
    ``key: value`` appended to its bytes (``key`` is in neither file yet)."""
    path = directory + os.sep + META_FILE
    with open(path, "rb") as f:
        body = f.read().rstrip()
    if body.endswith(b"}") and body != b"{}":
        data = body[:-1] + b", " + dumps_json({key: value})[1:-1] + b"}"
    else:
        data = dumps_json({**hit.meta, key: value})
    if replace is replace_file:  # the file exists: swapped in (see replace_file), not renamed over
        replace_file(path, data, existing=True)
    else:  # the caller's own (its tests stop a commit half-way)
        replace(path, data)
    hit.meta[key] = value
    hit.n_meta += 1
    hit.stamp = _stamp(os.stat(path))


def _forget(directory: str) -> None:
    _LEVELS.pop(directory, None)


def _note_pending(directory: str) -> None:
    if not _HOOKED or _HOOKED[0] != os.getpid():
        _PENDING.clear()  # a forked child: the parent's levels are the parent's to compact
        _HOOKED[:] = [os.getpid()]
        multiprocessing.util.Finalize(None, _compact_pending, exitpriority=0)
    _PENDING[directory] = None


def _compact_pending() -> None:
    """At normal exit: compact the levels this process appended to (each under its tree's lock)."""
    if not _HOOKED or _HOOKED[0] != os.getpid():
        return
    for directory in list(_PENDING):
        try:
            if os.path.isfile(directory + os.sep + JOURNAL_FILE):
                with SharedRegistry.for_directory(directory).lock():
                    compact_level(directory)
        except Exception:  # a folder removed meanwhile, a read-only file system: readers still see the record
            pass
    _PENDING.clear()


def compact_metadata(target: Any) -> int:
    """Write every level's pending entries into its ``meta.json``, so tensordict 0.15.3 sees them all.

    ``make_memmap*`` records new entries of a large level in its ``meta.jsonl`` and folds them
    into ``meta.json`` at a bounded cost, when the process exits normally, and here.  tdshare
    readers see every entry in any case; call this before another library reads a folder that
    is still being added to.

    Args:
        target: a saved folder (``str`` or path-like), or a memory-mapped tensordict with a folder.

    Returns:
        The number of levels whose ``meta.json`` was rewritten.

    Raises:
        ArgumentTypeError: ``target`` is neither a path nor a folder-backed tensordict.
        MissingMetadataError: the folder holds no saved tensordict.

    >>> import tempfile, torch, tdshare
    >>> td = tdshare.TensorDict({}, batch_size=[]).memmap_(tempfile.mkdtemp())
    >>> for i in range(100):
    ...     _ = td.make_memmap(f"x{i}", [2])
    >>> tdshare.compact_metadata(td)
    1
    """
    if isinstance(target, (str, os.PathLike)):
        root = os.path.abspath(os.fspath(target))
    else:
        prefix = getattr(target, "_memmap_prefix", None)
        if not isinstance(prefix, str):
            raise ArgumentTypeError(
                f"compact_metadata expects a folder path or a memory-mapped tensordict with a folder, got "
                f"{type(target).__name__}: memmap_(prefix) it first, or pass the folder."
            )
        root = prefix
    if not os.path.isfile(os.path.join(root, META_FILE)):
        raise MissingMetadataError(
            f"No saved tensordict in {root!r}: {META_FILE} is missing. Pass the folder that memmap_() wrote."
        )
    done = 0
    with SharedRegistry.for_directory(root).lock():
        for folder, _, files in os.walk(root):
            if JOURNAL_FILE in files and compact_level(folder):
                done += 1
                _forget(folder)
    return done
