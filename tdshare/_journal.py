"""The append-only record of a level's new entries: ``meta.jsonl`` beside ``meta.json``.

Adding one entry to a level must not rewrite the level's whole ``meta.json`` (O(entries) per
addition, O(n²) for n).  A writer (under the tree's lock) appends one line instead, ``{"key":
{...entry...}}`` and a newline, with one ``write()``; every tdshare reader reads the record
*before* ``meta.json`` and lays its entries over it (a later line wins; an entry of both keeps
its place).  Compaction (:func:`compact_level`, under the lock) writes ``meta.json`` with
everything, then removes the record: a reader that read the old record before the swap finds
its entries again in the new ``meta.json``, and one that reads after finds them in
``meta.json`` only, so no committed entry is ever missed.

A writer killed mid-append leaves at most a partial last line, which has no newline: readers
ignore it and the next writer cuts it off before it appends.  tensordict reads ``meta.json``
only, so it sees the entries up to the last compaction.

Before a level's first line, the writer adds the field ``"_tdshare_journal": true`` to its
``meta.json`` (once: compaction keeps it).  So a ``meta.json`` without the field was written
when the level had no record, and a reader that has read it needs no probe for one: the load of
a lazy stack relies on that for its members (a record without the field, which only a hand or
another program leaves, is not read there).
"""

from __future__ import annotations

import os

from ._errors import CorruptDataError
from ._files import replace_file
from ._format import JOURNAL_FILE, META_FILE, dumps_json, loads_json

__all__ = [
    "JOURNAL_FILE",
    "Journal",
    "append_line",
    "compact_level",
    "drop_journal",
    "entry_line",
    "merge_entries",
    "parse_entries",
    "read_journal",
]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_APPEND = os.O_RDWR | os.O_APPEND | os.O_CREAT | _CLOEXEC


class Journal:
    """What a read of a level's record found: its complete lines and where they end.

    Attributes:
        raw: the complete lines read (from ``start``), newline-terminated.
        ino: the record's inode (a new one means it was removed and started again).
        end: the byte offset just after the last complete line.
        size: the file's size when read (larger than ``end`` after a torn append).
    """

    __slots__ = ("end", "ino", "raw", "size")

    def __init__(self, raw: bytes, ino: int, end: int, size: int) -> None:
        self.raw, self.ino, self.end, self.size = raw, ino, end, size


def read_journal(directory: str, start: int = 0) -> Journal | None:
    """The complete lines of ``directory``'s record from byte ``start`` on (None: no record).

    Raises:
        CorruptDataError: the record is not a regular file.
    """
    path = directory + os.sep + JOURNAL_FILE
    try:
        fd = os.open(path, os.O_RDONLY | _CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CorruptDataError(f"{path!r} cannot be read as a record of entries ({err.strerror}).") from None
    try:
        st = os.fstat(fd)
        chunks = []
        if start:
            os.lseek(fd, start, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    cut = data.rfind(b"\n") + 1  # a torn last line (a writer killed mid-append) is not committed
    return Journal(data[:cut], st.st_ino, start + cut, max(st.st_size, start + len(data)))


def parse_entries(raw: bytes, where: str) -> dict:
    """The entries of complete record lines, in order (a later line for a key wins).

    Raises:
        CorruptDataError: a line is not a JSON object (naming the record).
    """
    if not raw:
        return {}
    lines = [line.strip() for line in raw.split(b"\n")]
    inner = [line[1:-1] for line in lines if line]
    if any(not (line.startswith(b"{") and line.endswith(b"}")) for line in lines if line):
        raise CorruptDataError(f"{where}: a line is not a JSON object; the record is damaged. Save the tree again.")
    body = b"{" + b", ".join(part for part in inner if part.strip()) + b"}"
    return loads_json(body, where)


def merge_entries(meta: dict, entries: dict) -> dict:
    """``meta`` with the record's ``entries`` laid over it (a new dict when there are any)."""
    if not entries:
        return meta
    out = dict(meta)
    out.update(entries)
    return out


def entry_line(key: str, value: dict) -> bytes:
    """The record line that adds ``key: value``."""
    return dumps_json({key: value}) + b"\n"


def append_line(directory: str, line: bytes, expected_size: int | None) -> tuple[int, int]:
    """Append ``line`` to ``directory``'s record (caller holds the tree's lock); return (inode, new size).

    ``expected_size``: the size the caller last saw; a larger file that does not end with a
    newline (a writer killed mid-append) is cut back to its last complete line first.
    """
    path = directory + os.sep + JOURNAL_FILE
    fd = os.open(path, _APPEND, 0o666)
    try:
        st = os.fstat(fd)
        if st.st_size and st.st_size != expected_size:
            _cut_torn_line(fd, st.st_size)
        os.write(fd, line)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_ino, st.st_size


def _cut_torn_line(fd: int, size: int) -> None:
    tail = os.pread(fd, min(size, 1 << 16), max(0, size - (1 << 16)))
    if tail.endswith(b"\n"):
        return
    pos = size - 1
    while pos >= 0:
        block_start = max(0, pos - (1 << 16) + 1)
        block = os.pread(fd, pos - block_start + 1, block_start)
        found = block.rfind(b"\n")
        if found >= 0:
            os.ftruncate(fd, block_start + found + 1)
            return
        pos = block_start - 1
    os.ftruncate(fd, 0)


def drop_journal(directory: str) -> None:
    """Remove ``directory``'s record (after its entries were written into ``meta.json``)."""
    try:
        os.unlink(directory + os.sep + JOURNAL_FILE)
    except FileNotFoundError:
        pass


def compact_level(directory: str) -> bool:
    """Write the record's entries into ``meta.json`` and remove the record (caller holds the lock).

    Returns whether there was anything to compact.  The new ``meta.json`` holds the old one's
    bytes followed by the record's entries when no key repeats (no re-encoding), else the merge.

    Raises:
        CorruptDataError: ``meta.json`` or the record is damaged.
    """
    journal = read_journal(directory)
    if journal is None:
        return False
    path = directory + os.sep + META_FILE
    where = directory + os.sep + JOURNAL_FILE
    if journal.raw:
        with open(path, "rb") as f:
            raw = f.read()
        meta = loads_json(raw, path)
        entries = parse_entries(journal.raw, where)
        body = raw.rstrip()
        if entries and not any(k in meta for k in entries) and body.endswith(b"}") and meta:
            data = body[:-1] + b", " + dumps_json(entries)[1:-1] + b"}"
        else:
            data = dumps_json(merge_entries(meta, entries))
        replace_file(path, data, existing=True)  # it was just read: swapped in, not renamed over
    drop_journal(directory)
    return bool(journal.raw)
