"""The ``.tdz`` container: a zip file whose stored tensor entries are 64-byte aligned; its format, and reading it.

Writing is in :mod:`tdshare._tdz_write`.

Format
------
A standard zip file (PKWARE APPNOTE 6.3) whose entries are the files of a saved folder
(:mod:`tdshare._format`) under their POSIX relative names.  Per folder: ``meta.json`` first, then
the folder's other files sorted by name, then its sub-folders sorted by name, recursively.  No
directory entries, no comment, no encryption, no data descriptors.  Every local header carries a
zip64 extra field (id ``0x0001``: uncompressed then compressed size, the 32-bit fields reading
``0xFFFFFFFF``); the central directory and the end records use zip64 only where a value does not
fit in 32 bits.  Entries are version 4.5 (bzip2 4.6, lzma 6.3), made on Unix, mode ``0644``.

A *tensor entry* (``*.memmap``) that is STORED is aligned: its local header carries, before the
zip64 field, an extra block with id ``0x6474`` (``b"td"``) of zero bytes sized so that the payload
starts at a multiple of 64 bytes in the file, so a reader can map the file once and view every
leaf in place.  Tensor entries may instead be compressed (deflate 8, bzip2 12, lzma 14 with the
zip LZMA header and an end marker); other entries are always STORED.  This is tensordict 0.15.3's
layout, so either library reads the other's archives.

Writing streams each tensor's bytes (8 MiB pieces written with ``pwrite`` and CRC-checked on
threads with :mod:`tdshare._crc`'s CRC-32, the CRCs then combined) into a temporary file next to
the target, renamed over it at the end.  Reading trusts nothing: names must be relative POSIX
paths without ``..``; every entry must lie inside the file, before the central directory, agree
with its local header and not overlap another; compressed entries and the small entries read
whole are CRC-checked, while stored tensor leaves, zero-copy views of the mapping, are not read
at all when loading (``python -m tdshare verify`` checks them); encrypted entries are refused.
Checking the central directory of ten thousand entries is one tight loop plus passes over all
the names at once.
"""

from __future__ import annotations

import bz2
import functools
import itertools
import lzma
import operator
import os
import stat
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from ._crc import crc32
from ._errors import CorruptDataError, InvalidArgumentError, UnsupportedFormatError
from ._files import tensor_memory
from ._format import META_FILE
from ._indexing import contiguous_strides

__all__ = [
    "ALIGN",
    "Archive",
    "CENTRAL_SIG",
    "COMPRESSION",
    "Entry",
    "LOCAL_SIG",
    "M32",
    "METHOD_NAMES",
    "PAD_ID",
    "inflate",
    "parse_compression",
]

ALIGN = 64
PAD_ID = 0x6474  # b"td"
M32 = 0xFFFFFFFF
LOCAL_SIG, CENTRAL_SIG = 0x04034B50, 0x02014B50
COMPRESSION = {"stored": 0, "deflate": 8, "deflated": 8, "bzip2": 12, "lzma": 14}
METHOD_NAMES = {0: "stored", 8: "deflate", 12: "bzip2", 14: "lzma"}


def parse_compression(value: object) -> int:
    """The zip method of ``compression=``: None/"stored", "deflate(d)", "bzip2", "lzma" or 0/8/12/14."""
    if value is None:
        return 0
    if isinstance(value, str) and value.lower() in COMPRESSION:
        return COMPRESSION[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value in METHOD_NAMES:
        return value
    raise InvalidArgumentError(
        f"Unknown compression {value!r}. Expected one of {sorted(COMPRESSION)} or a zipfile compression "
        f"constant ({', '.join(f'{k}={v}' for k, v in METHOD_NAMES.items())})."
    )


# -- reading ----------------------------------------------------------------------------------
class Entry(NamedTuple):
    name: str
    method: int
    flags: int
    crc: int
    csize: int
    size: int
    header: int  # offset of the local header
    data: int  # offset of the payload
    central: int  # offset of the central directory record


def _check_name(name: str, where: str) -> None:
    core = name[:-1] if name[-1:] == "/" else name  # a directory entry ends with /
    wrapped = f"/{core}/"  # an empty, ".", ".." or absolute part shows as //, /./ or /../
    bad = "//" in wrapped or "/./" in wrapped or "/../" in wrapped or ":" in core.partition("/")[0]
    if bad or "\\" in name or "\0" in name:
        raise CorruptDataError(f"{where} holds the entry {name!r}, which is not a safe relative path: refusing it.")


def _check_names(names: list[str], where: str) -> bool:
    """:func:`_check_name` for every name, in a few passes over all of them joined; True if some are folders.

    Joined as ``/a/\\0/b/``, a bad part still shows as //, /./ or /../ (the NUL ends it); anything
    unusual (a NUL, a colon, a backslash, a directory entry's trailing /) is checked name by name.
    """
    wrapped = "/" + "/\0/".join(names) + "/"
    if "//" in wrapped or "/./" in wrapped or "/../" in wrapped or ":" in wrapped or "\\" in wrapped:
        odd = True
    else:
        odd = wrapped.count("\0") != len(names) - 1
    if odd:
        for name in names:
            _check_name(name, where)
    return odd and any(name[-1:] == "/" for name in names)


def _decode(raw: bytes, flags: int) -> str:
    return raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")


def _decode_all(raws: list[bytes], rows: Sequence[tuple[int, ...]]) -> list[str]:
    """Every name: one ASCII decode of them all (the same in UTF-8 and cp437) when they allow it."""
    joined = b"\0".join(raws)
    if joined.isascii():
        names = joined.decode("ascii").split("\0")
        if len(names) == len(raws):
            return names
    return [_decode(raw, row[1]) for raw, row in zip(raws, rows, strict=True)]


def _zip64(extra: bytes, values: list[int], where: str) -> list[int]:
    """Replace the 0xFFFFFFFF ones of ``values`` (size, compressed size, offset) from the zip64 field."""
    i = 0
    while i + 4 <= len(extra):
        kind, n = struct.unpack_from("<HH", extra, i)
        if kind == 1 and i + 4 + n <= len(extra):
            it = iter(struct.unpack_from(f"<{n // 8}Q", extra, i + 4))
            out = [next(it, -1) if v == M32 else v for v in values]
            if -1 not in out:
                return out
        i += 4 + n
    raise CorruptDataError(f"{where}: its zip64 sizes are missing or malformed.")


def _end_record(buf: memoryview, where: str) -> tuple[int, int, int]:
    """The entry count, size and offset of the central directory, from the (zip64) end records."""
    size = len(buf)
    base = max(0, size - 22 - 0xFFFF)
    tail = bytes(buf[base:])
    i = tail.rfind(b"PK\x05\x06")
    while i >= 0 and (i + 22 > len(tail) or i + 22 + struct.unpack_from("<H", tail, i + 20)[0] != len(tail)):
        i = tail.rfind(b"PK\x05\x06", 0, i)
    if i < 0:
        if bytes(buf[:4]) == b"PK\x03\x04":
            raise CorruptDataError(f"{where} is truncated or damaged: its zip end record is missing.")
        raise InvalidArgumentError(
            f"{where!r} is a file but not a memory-mapped tensordict archive (expected a zip file with a top-level "
            f"{META_FILE} entry) nor a directory."
        )
    end = base + i
    disk, cd_disk, n_disk, n, cd_size, cd_off = struct.unpack_from("<HHHHII", buf, end + 4)
    if end >= 20 and bytes(buf[end - 20 : end - 16]) == b"PK\x06\x07":
        z64 = struct.unpack_from("<Q", buf, end - 12)[0]
        if z64 + 56 > end - 20 or bytes(buf[z64 : z64 + 4]) != b"PK\x06\x06":
            raise CorruptDataError(f"{where}: the zip64 end record is missing or out of place.")
        disk, cd_disk, n_disk, n, cd_size, cd_off = struct.unpack_from("<IIQQQQ", buf, z64 + 16)
        end = z64
    if disk or cd_disk or n_disk != n:
        raise CorruptDataError(f"{where} is a multi-disk zip archive, which is not supported.")
    if cd_off + cd_size > end:
        raise CorruptDataError(f"{where}: the central directory lies outside the file; it is truncated or damaged.")
    return n, cd_size, cd_off


class _LocalHeaders(dict[int, struct.Struct]):
    """Name length -> the struct of a local header's signature, name and extra lengths, and name."""

    def __missing__(self, nlen: int) -> struct.Struct:
        fmt = self[nlen] = struct.Struct(f"<I22xHH{nlen}s")
        return fmt


_LOCAL_NAMED = _LocalHeaders()
_CENTRAL_USED = struct.Struct("<I4xHH4xIIIHHH8xI")  # the central record's fields _parse reads
_new_entry = functools.partial(tuple.__new__, Entry)


def _parse(buf: memoryview, where: str) -> dict[str, Entry]:
    """Every entry of the archive, validated (loading many small leaves is bound by this loop)."""
    n, cd_size, cd_off = _end_record(buf, where)
    cd, p = bytes(buf[cd_off : cd_off + cd_size]), 0  # one copy of the central directory
    raws: list[bytes] = []
    rows: list[tuple[int, int, int, int, int, int, int, int]] = []
    unpack, local_of = _CENTRAL_USED.unpack_from, _LOCAL_NAMED
    for _ in range(n):
        if p + 46 > cd_size:
            raise CorruptDataError(f"{where}: the central directory is shorter than its {n} entries.")
        sig, flags, method, crc, csize, usize, nlen, elen, clen, off = unpack(cd, p)
        q = p + 46 + nlen
        if sig != CENTRAL_SIG or q + elen + clen > cd_size:
            raise CorruptDataError(f"{where}: the central directory record at byte {cd_off + p} is malformed.")
        raw = cd[p + 46 : q]
        if M32 in (usize, csize, off):
            entry = f"{where}: the entry {_decode(raw, flags)!r}"
            usize, csize, off = _zip64(cd[q : q + elen], [usize, csize, off], entry)
        if flags & 0x41:
            name = _decode(raw, flags)
            raise CorruptDataError(f"{where}: the entry {name!r} is encrypted, which tdshare does not read.")
        data = off + 30 + nlen
        if data > cd_off:
            raise CorruptDataError(f"{where}: the local header of {_decode(raw, flags)!r} (byte {off}) is missing.")
        sig, local_nlen, local_elen, local_name = local_of[nlen].unpack_from(buf, off)
        if sig != LOCAL_SIG:
            raise CorruptDataError(f"{where}: the local header of {_decode(raw, flags)!r} (byte {off}) is missing.")
        data += local_elen
        if local_nlen != nlen or local_name != raw or data + csize > cd_off:
            raise CorruptDataError(
                f"{where}: the entry {_decode(raw, flags)!r} disagrees with its local header or overruns the data."
            )
        if csize != usize and not method:
            raise CorruptDataError(f"{where}: the stored entry {_decode(raw, flags)!r} records two different sizes.")
        raws.append(raw)
        rows.append((method, flags, crc, csize, usize, off, data, cd_off + p))
        p = q + elen + clen
    names = _decode_all(raws, rows)
    made = map(_new_entry, map(operator.add, zip(names), rows))  # all in C: (name,) + row
    if _check_names(names, where):  # a directory entry (zip -r) holds nothing to load
        entries = {e.name: e for e in made if e.name[-1:] != "/"}
    else:
        entries = dict(zip(names, made, strict=True))
    if len(entries) != len(names):
        _check_unique(names, where)
    _check_spans(entries, where)
    return entries


def _check_unique(names: list[str], where: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen and name[-1:] != "/":
            raise CorruptDataError(f"{where} holds the entry {name!r} twice.")
        seen.add(name)


def _check_spans(entries: dict[str, Entry], where: str) -> None:
    """Refuse entries (local header to payload end) that overlap."""
    es = list(entries.values())
    starts = [e.header for e in es]
    if not all(map(operator.le, starts, starts[1:])):  # not in file order: sort
        es.sort(key=operator.attrgetter("header"))
        starts = [e.header for e in es]
    if all(map(operator.le, [e.data + e.csize for e in es], starts[1:])):
        return
    for a, b in itertools.pairwise(es):
        if b.header < a.data + a.csize:
            raise CorruptDataError(f"{where}: the entries {a.name!r} and {b.name!r} overlap; the archive is malformed.")


_IN, _OUT = 1 << 20, 16 << 20  # compressed bytes fed, and most bytes produced, per step


def _decompressor(e: Entry, src: memoryview, where: str) -> tuple[Any, memoryview]:
    if e.method == 8:
        return zlib.decompressobj(-15), src
    if e.method == 12:
        return bz2.BZ2Decompressor(), src
    if e.method == 14:
        if len(src) < 9 or struct.unpack_from("<H", src, 2)[0] != 5:
            raise CorruptDataError(f"{where}: the LZMA header of {e.name!r} is malformed.")
        d, dict_size = src[4], struct.unpack_from("<I", src, 5)[0]
        spec = {"id": lzma.FILTER_LZMA1, "lc": d % 9, "lp": d // 9 % 5, "pb": d // 45, "dict_size": dict_size}
        return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[spec]), src[9:]
    raise UnsupportedFormatError(
        f"{where}: the entry {e.name!r} uses zip method {e.method}, which tdshare cannot read."
    )


def inflate(e: Entry, src: memoryview, sink: Callable[[bytes], Any], where: str) -> None:
    """Decompress ``e`` into ``sink`` in bounded pieces, checking its size and CRC-32."""
    total = crc = 0
    try:
        d, src = _decompressor(e, src, where)
        for i in range(0, max(len(src), 1), _IN):
            data: Any = src[i : i + _IN]
            more = True
            while more:
                piece = d.decompress(data, _OUT)
                if e.method == 8:
                    data = d.unconsumed_tail
                    more = bool(data) or (len(piece) == _OUT and not d.eof)
                else:
                    data, more = b"", not d.eof and not d.needs_input
                total += len(piece)
                if total > e.size:
                    raise CorruptDataError(f"{where}: {e.name!r} decompresses to more than its {e.size} bytes.")
                crc = crc32(piece, crc)
                sink(piece)
            if d.eof:
                break
    except (zlib.error, OSError, lzma.LZMAError, EOFError) as err:
        raise CorruptDataError(f"{where}: the compressed entry {e.name!r} is corrupt ({err}).") from None
    if not d.eof or total != e.size:
        raise CorruptDataError(f"{where}: the compressed entry {e.name!r} is truncated ({total} of {e.size} bytes).")
    if crc != e.crc:
        raise CorruptDataError(f"{where}: the entry {e.name!r} fails its CRC-32 check; the archive is corrupt.")


class Archive:
    """A parsed, validated archive, mapped once (``mode="r+"``: shared; otherwise copy-on-write)."""

    def __init__(self, path: str, mode: str | None = None) -> None:
        self.path, self.mode = path, mode
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise InvalidArgumentError(f"{path!r} is a folder, not a .tdz archive: pass the archive's file.")
        size, self.ino = st.st_size, st.st_ino
        if mode == "r+" and not os.access(path, os.W_OK):
            raise PermissionError(f"Cannot open {path!r} with mode='r+': the file is not writable.")
        shared = mode == "r+"
        self.flat = (
            torch.from_file(path, shared=shared, size=size, dtype=torch.uint8) if size else torch.empty(0).byte()
        )
        self.buf = tensor_memory(self.flat)
        self.entries = _parse(self.buf, path)
        self._typed: dict[torch.dtype, torch.Tensor] = {}
        self._strides: dict[tuple[int, ...], tuple[int, ...]] = {}

    def payload(self, e: Entry) -> memoryview:
        return self.buf[e.data : e.data + e.csize]

    def read(self, name: str) -> bytes:
        """The content of a (small) entry, CRC-checked."""
        e = self.entries[name]
        pieces: list[bytes] = []
        if e.method == 0:
            pieces.append(bytes(self.payload(e)))
            if crc32(pieces[0]) != e.crc:
                raise CorruptDataError(
                    f"{self.path}: the entry {name!r} fails its CRC-32 check; the archive is corrupt."
                )
        else:
            inflate(e, self.payload(e), pieces.append, self.path)
        return b"".join(pieces)

    def typed(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole mapping as elements of ``dtype`` (the base of every view of that dtype)."""
        out = self._typed.get(dtype)
        if out is None:
            n, k = self.flat.numel(), dtype.itemsize
            out = self._typed[dtype] = self.flat[: n - n % k].view(dtype)
        return out

    def strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The C-contiguous strides of ``shape`` (cached: leaves share few shapes)."""
        out = self._strides.get(shape)
        if out is None:
            out = self._strides[shape] = tuple(contiguous_strides(torch.Size(shape)))
        return out

    def view(self, e: Entry, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor | None:
        """A view of a stored entry inside the mapping, or None if it is compressed or misaligned."""
        k = dtype.itemsize
        if e.method or e.data % k:
            return None
        return self.typed(dtype).as_strided(shape, self.strides(shape), e.data // k)

    def copy(self, e: Entry) -> torch.Tensor:
        """A new uint8 tensor holding the entry (compressed: decompressed and CRC-checked)."""
        if e.method == 0:
            return self.flat[e.data : e.data + e.size].clone()
        try:
            out = torch.empty(e.size, dtype=torch.uint8)
        except (RuntimeError, MemoryError):  # a size no machine has: a hostile or broken archive
            raise CorruptDataError(
                f"{self.path}: the entry {e.name!r} claims {e.size} bytes once decompressed, more than can be "
                "allocated; the archive is corrupt or hostile."
            ) from None
        mv, pos = tensor_memory(out), [0]

        def sink(piece: bytes) -> None:
            mv[pos[0] : pos[0] + len(piece)] = piece
            pos[0] += len(piece)

        inflate(e, self.payload(e), sink, self.path)
        return out
