"""The ``.tdz`` container: a zip file whose stored tensor entries are 64-byte aligned.

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
import concurrent.futures
import functools
import itertools
import lzma
import operator
import os
import stat
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from ._crc import CHUNK, crc32, crc32_combine, pool, results
from ._debris import sweep_archive
from ._errors import CorruptDataError, InvalidArgumentError, UnsupportedFormatError
from ._files import tensor_buffer, tensor_memory, tmp_name
from ._format import LEAF_SUFFIX, META_FILE
from ._indexing import contiguous_strides

__all__ = [
    "ALIGN",
    "Archive",
    "Entry",
    "Source",
    "METHOD_NAMES",
    "crc32_combine",
    "inflate",
    "parse_compression",
    "pwrite_all",
    "write_archive",
]

ALIGN = 64
PAD_ID = 0x6474  # b"td"
_M32 = 0xFFFFFFFF
_LOCAL, _CENTRAL, _END, _END64, _LOC64 = 0x04034B50, 0x02014B50, 0x06054B50, 0x06064B50, 0x07064B50
_LOCAL_FMT, _CENTRAL_FMT = struct.Struct("<IHHHHHIIIHH"), struct.Struct("<IHHHHHHIIIHHHHHII")
_CHUNK = CHUNK  # bytes per write/CRC task
_SMALL = 1 << 20  # smaller payloads are written inline, in the calling thread
_COMPRESSION = {"stored": 0, "deflate": 8, "deflated": 8, "bzip2": 12, "lzma": 14}
METHOD_NAMES = {0: "stored", 8: "deflate", 12: "bzip2", 14: "lzma"}
_VERSION = {0: 45, 8: 45, 12: 46, 14: 63}
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def parse_compression(value: object) -> int:
    """The zip method of ``compression=``: None/"stored", "deflate(d)", "bzip2", "lzma" or 0/8/12/14."""
    if value is None:
        return 0
    if isinstance(value, str) and value.lower() in _COMPRESSION:
        return _COMPRESSION[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value in METHOD_NAMES:
        return value
    raise InvalidArgumentError(
        f"Unknown compression {value!r}. Expected one of {sorted(_COMPRESSION)} or a zipfile compression "
        f"constant ({', '.join(f'{k}={v}' for k, v in METHOD_NAMES.items())})."
    )


# -- writing ----------------------------------------------------------------------------------
def pwrite_all(fd: int, data: memoryview | bytes | bytearray, offset: int) -> None:
    view, done = memoryview(data), 0
    while done < len(view):
        done += os.pwrite(fd, view[done : done + (1 << 30)], offset + done)


def _blocks(t: torch.Tensor, size: int) -> list[tuple[int, Callable[[], memoryview]]]:
    """``(length, get)`` pieces of ``t``'s C-order bytes; only pieces of a non-contiguous ``t`` are copies."""
    if t.is_contiguous():
        mv = memoryview(tensor_buffer(t))
        return [(min(size, len(mv) - a), functools.partial(_piece, mv, a, size)) for a in range(0, len(mv), size)]
    row = t[0].numel() * t.element_size()
    step = max(1, size // max(row, 1))
    rows = range(0, t.shape[0], step)
    return [((min(r + step, t.shape[0]) - r) * row, functools.partial(_rows, t, r, step)) for r in rows]


def _piece(mv: memoryview, start: int, size: int) -> memoryview:
    return mv[start : start + size]


def _rows(t: torch.Tensor, start: int, step: int) -> memoryview:
    return memoryview(tensor_buffer(t[start : start + step]))


def _write_and_crc(fd: int, get: Callable[[], memoryview], offset: int) -> int:
    """Write a piece with one call and return its CRC-32.

    One large write lets the page cache keep the payload in large folios, which a mapping then
    reads markedly faster (many 256 KiB writes left small folios: open + sum ran ~30% slower).
    """
    data = get()
    crc = crc32(data)
    pwrite_all(fd, data, offset)
    return crc


class _LzmaZip:
    """LZMA as zip stores it: version 9.4, the 5 property bytes, then a raw LZMA1 stream."""

    def __init__(self, preset: int) -> None:
        self._head = bytes([9, 4, 5, 0, (2 * 5 + 0) * 9 + 3]) + struct.pack("<I", 1 << 23)  # lc=3 lp=0 pb=2
        spec = {"id": lzma.FILTER_LZMA1, "preset": preset, "dict_size": 1 << 23, "lc": 3, "lp": 0, "pb": 2}
        self._c = lzma.LZMACompressor(format=lzma.FORMAT_RAW, filters=[spec])

    def compress(self, data: memoryview) -> bytes:
        head, self._head = self._head, b""
        return head + self._c.compress(data)

    def flush(self) -> bytes:
        return self._head + self._c.flush()


def _compressor(method: int, level: int | None) -> Any:
    if method == 8:
        return zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION if level is None else level, zlib.DEFLATED, -15)
    if method == 12:
        return bz2.BZ2Compressor(9 if level is None else level)
    return _LzmaZip(6 if level is None else level)


@dataclass
class _Out:
    name: bytes
    method: int
    header: int  # file offset of the local header
    pad: int | None  # zero bytes of the alignment block; None: no block
    crc: int = 0
    size: int = 0
    csize: int = 0
    parts: list[tuple[concurrent.futures.Future[int], int]] = field(default_factory=list)  # (CRC, length)

    @property
    def flags(self) -> int:
        return (0 if self.name.isascii() else 0x800) | (0x02 if self.method == 14 else 0)

    def local(self, when: tuple[int, int]) -> bytes:
        extra = b"" if self.pad is None else struct.pack("<HH", PAD_ID, self.pad) + bytes(self.pad)
        extra += struct.pack("<HHQQ", 1, 16, self.size, self.csize)
        v, n = _VERSION[self.method], len(self.name)
        head = _LOCAL_FMT.pack(_LOCAL, v, self.flags, self.method, *when, self.crc, _M32, _M32, n, len(extra))
        return head + self.name + extra

    def central(self, when: tuple[int, int]) -> bytes:
        big = [v for v in (self.size, self.csize, self.header) if v >= _M32]
        extra = struct.pack(f"<HH{len(big)}Q", 1, 8 * len(big), *big) if big else b""
        size, csize, header = (min(v, _M32) for v in (self.size, self.csize, self.header))
        v = _VERSION[self.method]
        fields = (_CENTRAL, (3 << 8) | v, v, self.flags, self.method, *when, self.crc, csize, size, len(self.name))
        return _CENTRAL_FMT.pack(*fields, len(extra), 0, 0, 0, 0o644 << 16, header) + self.name + extra


class _Writer:
    """Streams entries into ``fd``; big stored payloads are written and CRC-checked by threads."""

    def __init__(self, fd: int, method: int, level: int | None, threads: int) -> None:
        self.fd, self.method, self.level, self.threads = fd, method, level, max(2, threads)
        self.buf, self.start = bytearray(), 0  # pending small writes, and their file offset
        self.out: list[_Out] = []
        t = time.localtime()
        self.when = (
            (t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2),
            (max(t.tm_year - 1980, 0) << 9) | (t.tm_mon << 5) | t.tm_mday,
        )

    @property
    def pos(self) -> int:
        return self.start + len(self.buf)

    def _flush(self) -> None:
        pwrite_all(self.fd, self.buf, self.start)
        self.start += len(self.buf)
        self.buf = bytearray()

    def add_bytes(self, name: str, data: bytes) -> None:
        e = _Out(name.encode("utf-8"), 0, self.pos, None, crc32(data), len(data), len(data))
        self.out.append(e)
        self.buf += e.local(self.when) + data

    def add_tensor(self, name: str, t: torch.Tensor) -> None:
        t = t.detach().cpu().resolve_conj().resolve_neg()
        raw, size, method = name.encode("utf-8"), t.numel() * t.element_size(), self.method
        pad = None if method else (-(self.pos + 30 + len(raw) + 4 + 20)) % ALIGN
        e = _Out(raw, method, self.pos, pad, size=size, csize=size)
        self.out.append(e)
        if method == 0 and size < _SMALL:
            data = tensor_buffer(t)
            e.crc = crc32(data)
            self.buf += e.local(self.when) + data
            return
        self.buf += e.local(self.when)  # written again with the CRC (and compressed size) by finish()
        if method == 0:
            self._flush()
            for length, get in _blocks(t, _CHUNK):
                e.parts.append((pool(self.threads).submit(_write_and_crc, self.fd, get, self.start), length))
                self.start += length
            return
        begin, comp = self.pos, _compressor(method, self.level)
        for _, get in _blocks(t, _SMALL):
            data = get()
            e.crc = crc32(data, e.crc)
            self.buf += comp.compress(data)
            if len(self.buf) >= _CHUNK:
                self._flush()
        self.buf += comp.flush()
        e.csize = self.pos - begin

    def wait(self) -> list[int]:
        return results([f for e in self.out for f, _ in e.parts])

    def finish(self) -> None:
        self._flush()
        crcs = iter(self.wait())
        for e in self.out:
            if e.parts:
                e.crc = next(crcs)
                for _, length in e.parts[1:]:
                    e.crc = crc32_combine(e.crc, next(crcs), length)
            if e.parts or e.method:
                pwrite_all(self.fd, e.local(self.when), e.header)
        cd = b"".join(e.central(self.when) for e in self.out)
        start, n = self.pos, len(self.out)
        if n >= 0xFFFF or len(cd) >= _M32 or start >= _M32:
            self.buf += cd + struct.pack("<IQHHIIQQQQ", _END64, 44, (3 << 8) | 45, 45, 0, 0, n, n, len(cd), start)
            self.buf += struct.pack("<IIQI", _LOC64, 0, start + len(cd), 1)
        else:
            self.buf += cd
        n16, cd32, start32 = min(n, 0xFFFF), min(len(cd), _M32), min(start, _M32)
        self.buf += struct.pack("<IHHHHIIH", _END, 0, 0, n16, n16, cd32, start32, 0)
        self._flush()


Source = bytes | torch.Tensor | str  # an entry's content: bytes, a tensor, or the path of a file


def write_archive(path: str, entries: Iterable[tuple[str, Source]], method: int, level: int | None = None) -> None:
    """Write ``entries`` (``*.memmap`` ones are tensor entries) to ``path``: temporary file, then rename."""
    tmp = tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o666)
    writer = _Writer(fd, method, level, 0)
    try:
        try:
            for name, src in entries:
                if name.endswith(LEAF_SUFFIX):
                    writer.add_tensor(name, _as_tensor(src))
                else:
                    writer.add_bytes(name, src if isinstance(src, bytes) else bytes(tensor_buffer(_as_tensor(src))))
        finally:
            writer.wait()  # no thread writes to the file once an error propagates
        writer.finish()
        if os.path.exists(path):
            os.fchmod(fd, stat.S_IMODE(os.stat(path).st_mode))  # keep the replaced file's permissions
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except OSError as err:
        written = os.fstat(fd).st_size if fd >= 0 else 0
        try:
            st = os.statvfs(os.path.dirname(os.path.abspath(path)))
            free = f"; the file system had {st.f_bavail * st.f_frsize} bytes free"
        except OSError:
            free = ""
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp)
        if err.errno is None or path in str(err):
            raise
        raise OSError(
            err.errno,
            f"{os.strerror(err.errno)}: writing the archive {path!r} failed after {written} bytes{free}",
            path,
        ) from err
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp)
        raise
    sweep_archive(path)  # temporary archives of writers that were killed


def _as_tensor(src: Source) -> torch.Tensor:
    if isinstance(src, torch.Tensor):
        return src
    if isinstance(src, bytes):
        return torch.frombuffer(bytearray(src), dtype=torch.uint8)
    size = os.stat(src).st_size  # a file: mapped, never read whole
    return torch.from_file(src, shared=False, size=size, dtype=torch.uint8) if size else torch.empty(0).byte()


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
            out = [next(it, -1) if v == _M32 else v for v in values]
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
        if sig != _CENTRAL or q + elen + clen > cd_size:
            raise CorruptDataError(f"{where}: the central directory record at byte {cd_off + p} is malformed.")
        raw = cd[p + 46 : q]
        if _M32 in (usize, csize, off):
            entry = f"{where}: the entry {_decode(raw, flags)!r}"
            usize, csize, off = _zip64(cd[q : q + elen], [usize, csize, off], entry)
        if flags & 0x41:
            name = _decode(raw, flags)
            raise CorruptDataError(f"{where}: the entry {name!r} is encrypted, which tdshare does not read.")
        data = off + 30 + nlen
        if data > cd_off:
            raise CorruptDataError(f"{where}: the local header of {_decode(raw, flags)!r} (byte {off}) is missing.")
        sig, local_nlen, local_elen, local_name = local_of[nlen].unpack_from(buf, off)
        if sig != _LOCAL:
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
