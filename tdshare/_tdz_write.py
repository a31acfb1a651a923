"""Writing a ``.tdz`` archive (the format is specified in :mod:`tdshare._tdz`).

Each tensor's bytes are streamed in 8 MiB pieces, written with ``pwrite`` and CRC-checked on threads
(:mod:`tdshare._crc`), into a temporary file next to the target that is renamed over it at the end.
"""

from __future__ import annotations

import bz2
import concurrent.futures
import functools
import lzma
import os
import stat
import struct
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._crc import CHUNK, crc32, crc32_combine, pool, results
from ._debris import sweep_archive
from ._errors import FileExistsRuntimeError, InvalidArgumentError
from ._files import tensor_buffer, tmp_name
from ._format import LEAF_SUFFIX
from ._tdz import ALIGN, CENTRAL_SIG, LOCAL_SIG, M32, PAD_ID

__all__ = ["Source", "archive_target", "pwrite_all", "write_archive"]

_END, _END64, _LOC64 = 0x06054B50, 0x06064B50, 0x07064B50
_LOCAL_FMT, _CENTRAL_FMT = struct.Struct("<IHHHHHIIIHH"), struct.Struct("<IHHHHHHIIIHHHHHII")
_CHUNK = CHUNK  # bytes per write/CRC task
_SMALL = 1 << 20  # smaller payloads are written inline, in the calling thread
_VERSION = {0: 45, 8: 45, 12: 46, 14: 63}
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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
        head = _LOCAL_FMT.pack(LOCAL_SIG, v, self.flags, self.method, *when, self.crc, M32, M32, n, len(extra))
        return head + self.name + extra

    def central(self, when: tuple[int, int]) -> bytes:
        big = [v for v in (self.size, self.csize, self.header) if v >= M32]
        extra = struct.pack(f"<HH{len(big)}Q", 1, 8 * len(big), *big) if big else b""
        size, csize, header = (min(v, M32) for v in (self.size, self.csize, self.header))
        v = _VERSION[self.method]
        fields = (CENTRAL_SIG, (3 << 8) | v, v, self.flags, self.method, *when, self.crc, csize, size, len(self.name))
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
        if n >= 0xFFFF or len(cd) >= M32 or start >= M32:
            self.buf += cd + struct.pack("<IQHHIIQQQQ", _END64, 44, (3 << 8) | 45, 45, 0, 0, n, n, len(cd), start)
            self.buf += struct.pack("<IIQI", _LOC64, 0, start + len(cd), 1)
        else:
            self.buf += cd
        n16, cd32, start32 = min(n, 0xFFFF), min(len(cd), M32), min(start, M32)
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


def archive_target(prefix: str | os.PathLike, existsok: bool) -> str:
    """The file an archive at ``prefix`` is written to (through a symbolic link: the file it names).

    Raises:
        InvalidArgumentError: ``prefix`` is a folder.
        FileExistsRuntimeError: a file exists there and ``existsok`` is False.
    """
    path = os.path.abspath(os.fspath(prefix))
    if os.path.isdir(path):
        raise InvalidArgumentError(
            f"{path!r} is a directory, but an archive is a single file: remove the folder or choose another name."
        )
    if os.path.lexists(path):
        if not existsok:
            raise FileExistsRuntimeError(f"A file already exists at {path!r}. Set existsok=True to overwrite.")
        path = os.path.realpath(path)  # through a symlink: replace the file it names
    return path
