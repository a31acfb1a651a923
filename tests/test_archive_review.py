"""Review tests: hostile ``.tdz`` archives against the central-directory parser, the fused
``ArchiveStore.open_leaves`` (strided ``unbind`` views), and :mod:`tdshare._crc`.

Hostile archives are written by hand (:func:`build_zip`) or by patching a valid archive; every
one must raise a tdshare error naming the problem, never an IndexError, struct.error, ... .
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import random
import signal
import struct
import sys
import warnings
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import tdshare
import tdshare._crc
import tdshare._tdz
import tdshare._tdz_write
import tdshare._write
from tdshare import (
    CorruptDataError,
    MemoryMappedTensor,
    TensorDict,
    refresh_archive_checksums,
    unpack_memmap,
)
from tdshare._archive_store import ArchiveStore
from tdshare._errors import InvalidArgumentError, TdshareError, UnsupportedFormatError
from tdshare._store import Store
from tdshare._tdz import Archive, Entry

# -- a zip writer that writes whatever it is told ------------------------------------------------
_M32 = 0xFFFFFFFF


@dataclass
class Spec:
    """One entry of a hand-made zip; every field the parser reads can be set to a lie."""

    name: bytes
    data: bytes = b""
    method: int = 0
    flags: int | None = None  # None: 0x800 when the name is not ASCII
    crc: int | None = None  # None: the data's CRC-32
    csize: int | None = None  # None: len(data)
    usize: int | None = None  # None: len(data) (stored) / the given size
    local_name: bytes | None = None  # None: the same as the central name
    local_nlen: int | None = None
    local_elen: int | None = None  # None: the length of the local extra field written
    local_extra: bytes = b""
    local_sig: int = 0x04034B50
    central_extra: bytes = b""
    central_sig: int = 0x02014B50
    offset: int | None = None  # the central record's local header offset; None: where it was written
    align: int = 0  # pad the local extra field so that the payload starts at a multiple of this
    comment: bytes = b""
    written: dict[str, int] = field(default_factory=dict)


def build_zip(
    specs: list[Spec],
    *,
    count: int | None = None,
    cd_size_delta: int = 0,
    disk: int = 0,
    trailer: bytes = b"",
    order: list[int] | None = None,
) -> bytes:
    out = bytearray()
    for s in specs:
        flags = s.flags if s.flags is not None else (0 if s.name.isascii() else 0x800)
        crc = zlib.crc32(s.data) if s.crc is None else s.crc
        csize = len(s.data) if s.csize is None else s.csize
        usize = len(s.data) if s.usize is None else s.usize
        lname = s.name if s.local_name is None else s.local_name
        extra = s.local_extra
        if s.align:
            pad = (-(len(out) + 30 + len(lname) + len(extra) + 4)) % s.align
            extra = struct.pack("<HH", 0x6474, pad) + bytes(pad) + extra
        nlen = len(lname) if s.local_nlen is None else s.local_nlen
        s.written["header"] = len(out)
        head = struct.pack(
            "<IHHHHHIIIHH",
            s.local_sig,
            20,
            flags,
            s.method,
            0,
            0,
            crc,
            min(csize, _M32),
            min(usize, _M32),
            nlen,
            len(extra) if s.local_elen is None else s.local_elen,
        )
        out += head + lname + extra
        s.written["data"] = len(out)
        out += s.data
    cd_off = len(out)
    for i in order if order is not None else range(len(specs)):
        s = specs[i]
        flags = s.flags if s.flags is not None else (0 if s.name.isascii() else 0x800)
        crc = zlib.crc32(s.data) if s.crc is None else s.crc
        csize = len(s.data) if s.csize is None else s.csize
        usize = len(s.data) if s.usize is None else s.usize
        off = s.written["header"] if s.offset is None else s.offset
        rec = struct.pack(
            "<IHHHHHHIIIHHHHHII",
            s.central_sig,
            (3 << 8) | 20,
            20,
            flags,
            s.method,
            0,
            0,
            crc,
            csize,
            usize,
            len(s.name),
            len(s.central_extra),
            len(s.comment),
            0,
            0,
            0,
            off,
        )
        out += rec + s.name + s.central_extra + s.comment
    n = len(specs) if count is None else count
    cd_size = len(out) - cd_off + cd_size_delta
    out += struct.pack("<IHHHHIIH", 0x06054B50, disk, 0, n, n, cd_size, cd_off, len(trailer)) + trailer
    return bytes(out)


def write(tmp_path: Path, data: bytes, name: str = "h.tdz") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def meta_of(td: TensorDict, tmp_path: Path) -> dict[str, bytes]:
    """The files (relative POSIX name -> bytes) of ``td`` saved as a folder."""
    root = tmp_path / "folder"
    td.memmap(root)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


META = json.dumps({"_type": "TensorDict", "batch_size": [], "device": None, "names": None}).encode()


def plain(name: bytes, data: bytes = b"x", **kw: Any) -> Spec:
    return Spec(name, data, **kw)


# -- the parser: names ---------------------------------------------------------------------------
UNSAFE = [
    b"..",
    b"../",
    b"../x",
    b"a/../b",
    b"a/..",
    b"a/../",
    b"/",
    b"/etc/passwd",
    b"//x",
    b"a\\b",
    b"..\\x",
    b"C:x",
    b"c:/x",
    b"x:",
    b"x\0y",
    b"\0",
    b"",
    b".",
    b"./",
    b"./x",
    b"a/./b",
    b"a/.",
    b"a//b",
    b"a//",
]


@pytest.mark.parametrize("name", UNSAFE, ids=repr)
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_unsafe_names_are_refused_anywhere(tmp_path: Path, name: bytes, where: str) -> None:
    """File and directory entries, first, among many or last: each unsafe name is refused and named."""
    others = [plain(b"meta.json", META)] + [plain(f"k{i}.memmap".encode()) for i in range(40)]
    at = {"first": 0, "middle": 20, "last": len(others)}[where]
    specs = [*others[:at], plain(name), *others[at:]]
    path = write(tmp_path, build_zip(specs))
    with pytest.raises(CorruptDataError, match="not a safe relative path") as info:
        Archive(str(path))
    assert repr(name.decode("cp437")) in str(info.value)


@pytest.mark.parametrize("name", ["é/../x.memmap", "日本/../../x", "/日本", "é\\x", "日:x/y", "é//x"], ids=repr)
def test_unsafe_utf8_names_are_refused(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, build_zip([plain(b"meta.json", META), plain(name.encode())]))
    with pytest.raises(CorruptDataError, match="not a safe relative path") as info:
        Archive(str(path))
    assert repr(name) in str(info.value)


def test_cp437_names_without_the_utf8_flag_are_refused_when_unsafe(tmp_path: Path) -> None:
    raw = "é/../x".encode()  # no 0x800 flag: decoded as cp437, the /../ part stays
    path = write(tmp_path, build_zip([plain(b"meta.json", META), plain(raw, flags=0)]))
    with pytest.raises(CorruptDataError, match=r"not a safe relative path") as info:
        Archive(str(path))
    assert repr(raw.decode("cp437")) in str(info.value)


def test_lookalike_names_are_not_path_parts(tmp_path: Path) -> None:
    """Overlong UTF-8 for '.', '/' and odd bytes decode to U+FFFD, never to a separator or '..'."""
    names = [b"\xc0\xae\xc0\xae/x", b"a\xc0\xafb", b"\xe2\x88\x95x", b"a/b:c", b"\xff.memmap"]
    path = write(tmp_path, build_zip([plain(b"meta.json", META)] + [plain(n, flags=0x800) for n in names]))
    entries = Archive(str(path)).entries
    assert sorted(entries) == sorted(
        ["meta.json", "\ufffd\ufffd\ufffd\ufffd/x", "a\ufffd\ufffdb", "\u2215x", "a/b:c", "\ufffd.memmap"]
    )
    assert not any(".." in n.split("/") for n in entries)


def test_duplicates(tmp_path: Path) -> None:
    # two different invalid UTF-8 names that decode to the same text
    dup = [plain(b"meta.json", META), plain(b"\xff.memmap", flags=0x800), plain(b"\xfe.memmap", flags=0x800)]
    with pytest.raises(CorruptDataError, match=r"holds the entry '\ufffd\.memmap' twice"):
        Archive(str(write(tmp_path, build_zip(dup))))
    # a file twice among directory entries
    dup = [plain(b"d/"), plain(b"meta.json", META), plain(b"d/"), plain(b"meta.json", META)]
    with pytest.raises(CorruptDataError, match=r"'meta\.json' twice"):
        Archive(str(write(tmp_path, build_zip(dup))))
    # a directory entry twice, and a file of the same name as a folder: accepted, folders dropped
    ok = [plain(b"d/", b""), plain(b"meta.json", META), plain(b"d/", b""), plain(b"d", b"x"), plain(b"d/e", b"y")]
    entries = Archive(str(write(tmp_path, build_zip(ok)))).entries
    assert sorted(entries) == ["d", "d/e", "meta.json"]


# -- the parser: records, local headers, spans ---------------------------------------------------
def _specs() -> list[Spec]:
    return [plain(b"meta.json", META), plain(b"a.memmap", bytes(range(64)), align=64), plain(b"b.memmap", b"bb" * 8)]


def _case(**changes: Any) -> list[Spec]:
    specs = _specs()
    for key, value in changes.items():
        setattr(specs[1], key, value)
    return specs


HOSTILE: list[tuple[str, Any, type[Exception], str]] = [
    (
        "local signature",
        dict(local_sig=0x04034B51),
        CorruptDataError,
        r"local header of 'a\.memmap' \(byte \d+\) is missing",
    ),
    (
        "local name differs",
        dict(local_name=b"A.memmap"),
        CorruptDataError,
        r"'a\.memmap' disagrees with its local header",
    ),
    ("local nlen short", dict(local_nlen=7), CorruptDataError, r"'a\.memmap' disagrees with its local header"),
    ("local nlen long", dict(local_nlen=9), CorruptDataError, r"'a\.memmap' disagrees with its local header"),
    ("local extra overruns", dict(local_elen=1200), CorruptDataError, r"'a\.memmap' disagrees .* overruns the data"),
    ("local extra into next", dict(align=0, local_elen=40), CorruptDataError, r"'a\.memmap' and 'b\.memmap' overlap"),
    ("offset at cd", dict(offset=10_000), CorruptDataError, r"local header of 'a\.memmap' \(byte 10000\) is missing"),
    ("offset 0xFFFFFFFE", dict(offset=0xFFFFFFFE), CorruptDataError, r"local header of 'a\.memmap'.*missing"),
    ("offset into payload", dict(offset=3), CorruptDataError, r"local header of 'a\.memmap' \(byte 3\) is missing"),
    ("offset of meta.json", dict(offset=0), CorruptDataError, r"'a\.memmap' disagrees with its local header"),
    ("csize past cd", dict(csize=5000, usize=5000), CorruptDataError, "overruns the data"),
    ("stored, two sizes", dict(usize=65), CorruptDataError, r"stored entry 'a\.memmap' records two different sizes"),
    ("encrypted", dict(flags=0x1), CorruptDataError, r"'a\.memmap' is encrypted"),
    ("strong encryption", dict(flags=0x40), CorruptDataError, r"'a\.memmap' is encrypted"),
    ("aes", dict(flags=0x1, method=99), CorruptDataError, r"'a\.memmap' is encrypted"),
    ("zip64 field missing", dict(csize=_M32, usize=_M32), CorruptDataError, "zip64 sizes are missing or malformed"),
    ("zip64 offset missing", dict(offset=_M32), CorruptDataError, "zip64 sizes are missing or malformed"),
    (
        "zip64 field short",
        dict(csize=_M32, usize=_M32, central_extra=struct.pack("<HHQ", 1, 8, 64)),
        CorruptDataError,
        "zip64 sizes are missing",
    ),
    (
        "zip64 length past extra",
        dict(csize=_M32, usize=_M32, central_extra=struct.pack("<HHQQ", 1, 24, 64, 64)),
        CorruptDataError,
        "zip64 sizes are missing",
    ),
    (
        "zip64 length not whole",
        dict(csize=_M32, usize=_M32, central_extra=struct.pack("<HH", 1, 12) + bytes(12)),
        CorruptDataError,
        "zip64 sizes are missing",
    ),
    (
        "zip64 huge size",
        dict(csize=_M32, usize=_M32, central_extra=struct.pack("<HHQQ", 1, 16, 1 << 63, 1 << 63)),
        CorruptDataError,
        "overruns the data",
    ),
    (
        "zip64 huge offset",
        dict(offset=_M32, central_extra=struct.pack("<HHQ", 1, 8, (1 << 64) - 1)),
        CorruptDataError,
        r"local header of 'a\.memmap' \(byte 18446744073709551615\) is missing",
    ),
    (
        "zip64 field after a bad-length one",
        dict(csize=_M32, usize=_M32, central_extra=struct.pack("<HH", 7, 500) + struct.pack("<HHQQ", 1, 16, 64, 64)),
        CorruptDataError,
        "malformed",  # the extra length runs past the record
    ),
    (
        "central signature",
        dict(central_sig=0x02014B51),
        CorruptDataError,
        r"central directory record at byte \d+ is malformed",
    ),
]


@pytest.mark.parametrize(("what", "changes", "error", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_records(tmp_path: Path, what: str, changes: Any, error: type[Exception], message: str) -> None:
    path = write(tmp_path, build_zip(_case(**changes)))
    with pytest.raises(error, match=message) as info:
        Archive(str(path))
    assert type(info.value) is error


def test_zip64_field_that_fits_is_used(tmp_path: Path) -> None:
    """The control of the zip64 cases above: the same field with true values is accepted."""
    specs = _case(csize=_M32, usize=_M32, central_extra=struct.pack("<HHQQ", 1, 16, 64, 64))
    path = write(tmp_path, build_zip(specs))
    e = Archive(str(path)).entries["a.memmap"]
    assert (e.size, e.csize, e.data % 64, e.header) == (64, 64, 0, specs[1].written["header"])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(count=4), "the central directory is shorter than its 4 entries"),
        (dict(count=0xFFFF), "the central directory is shorter than its 65535 entries"),
        (dict(cd_size_delta=1), "the central directory lies outside the file"),
        (dict(cd_size_delta=-1), r"central directory record at byte \d+ is malformed"),
        (dict(disk=1), "multi-disk zip archive"),
    ],
)
def test_hostile_end_records(tmp_path: Path, kw: dict, message: str) -> None:
    path = write(tmp_path, build_zip(_specs(), **kw))
    with pytest.raises(CorruptDataError, match=message):
        Archive(str(path))


def test_hostile_zip64_end_records(tmp_path: Path) -> None:
    good = build_zip(_specs())
    end = good.rfind(b"PK\x05\x06")
    for z64 in (0, end - 20, 1 << 63, len(good)):  # the locator points at junk, at itself, far out
        loc = struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
        path = write(tmp_path, good[:end] + loc + good[end:])
        with pytest.raises(CorruptDataError, match="zip64 end record is missing or out of place"):
            Archive(str(path))


def test_comment_length_must_reach_the_end(tmp_path: Path) -> None:
    good = build_zip(_specs(), trailer=b"comment")
    assert len(Archive(str(write(tmp_path, good))).entries) == 3
    path = write(tmp_path, good + b"!")  # the comment does not reach the end: no end record
    with pytest.raises(CorruptDataError, match="truncated or damaged: its zip end record is missing"):
        Archive(str(path))


def test_entry_inside_another_is_an_overlap(tmp_path: Path) -> None:
    """A complete local header + payload hidden in another entry's payload, listed in either order."""
    inner = plain(b"b.memmap", b"inner!")
    inner_bytes = build_zip([inner])[: inner.written["data"] + len(inner.data)]
    outer = plain(b"a.memmap", b"<" + inner_bytes + b">")
    zipped = build_zip([plain(b"meta.json", META), outer])
    cd_off = struct.unpack_from("<I", zipped, len(zipped) - 6)[0]
    hidden = outer.written["data"] + 1
    rec = build_zip([Spec(b"b.memmap", b"inner!", offset=hidden)])
    rec = rec[rec.index(b"PK\x01\x02") : rec.rindex(b"PK\x05\x06")]
    body, cd = zipped[:cd_off], zipped[cd_off : zipped.rindex(b"PK\x05\x06")]
    for records in (cd + rec, rec + cd):
        end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 3, 3, len(records), cd_off, 0)
        path = write(tmp_path, body + records + end)
        with pytest.raises(CorruptDataError, match=r"the entries '.*' and '.*' overlap"):
            Archive(str(path))


def test_two_records_for_one_local_header(tmp_path: Path) -> None:
    specs = _specs()
    data = build_zip(specs, order=[0, 1, 2, 1], count=4)
    with pytest.raises(CorruptDataError, match=r"'a\.memmap' twice"):
        Archive(str(write(tmp_path, data)))


@pytest.mark.parametrize("compression", [None, "deflate"])
def test_every_truncation_is_refused(tmp_path: Path, compression: str | None) -> None:
    src = tmp_path / "full.tdz"
    TensorDict(a=torch.arange(6.0), n={"b": torch.ones(2, dtype=torch.int16)}, batch_size=[]).save(
        src, compression=compression
    )
    data = src.read_bytes()
    path = tmp_path / "cut.tdz"
    for length in range(len(data)):
        path.write_bytes(data[:length])
        if length < 4:  # not even a zip signature
            with pytest.raises(InvalidArgumentError, match="not a memory-mapped tensordict archive"):
                TensorDict.load(path)
        else:
            with pytest.raises(CorruptDataError, match="truncated or damaged"):
                TensorDict.load(path)


def test_unsupported_method_is_named(tmp_path: Path) -> None:
    files = meta_of(TensorDict(a=torch.arange(4.0), batch_size=[]), tmp_path)
    specs = [plain(b"meta.json", files["meta.json"]), plain(b"a.memmap", b"\0" * 16, method=93)]
    path = write(tmp_path, build_zip(specs))
    with pytest.raises(UnsupportedFormatError, match=r"'a\.memmap' uses zip method 93, which tdshare cannot read"):
        TensorDict.load(path)
    specs = [plain(b"meta.json", files["meta.json"], method=1), plain(b"a.memmap", b"\0" * 16)]
    with pytest.raises(UnsupportedFormatError, match=r"'meta\.json' uses zip method 1"):
        TensorDict.load(write(tmp_path, build_zip(specs)))


def test_huge_declared_size_of_a_compressed_leaf(tmp_path: Path) -> None:
    """A compressed leaf whose sizes (central and meta.json) claim 2**50 bytes: a clean error, no allocation."""
    meta = json.loads(meta_of(TensorDict(a=torch.arange(4.0), batch_size=[]), tmp_path)["meta.json"])
    meta["a"]["shape"] = [1 << 48]
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    payload = comp.compress(b"\0" * 16) + comp.flush()
    z64 = struct.pack("<HHQ", 1, 8, 1 << 50)
    specs = [
        plain(b"meta.json", json.dumps(meta).encode()),
        Spec(b"a.memmap", payload, method=8, usize=_M32, central_extra=z64),
    ]
    path = write(tmp_path, build_zip(specs))
    assert Archive(str(path)).entries["a.memmap"].size == 1 << 50
    with pytest.raises(TdshareError) as info:
        TensorDict.load(path)
    assert isinstance(info.value, CorruptDataError | tdshare.MemmapError), info.value


# -- differential fuzzing against the previous parser (3b9575a) ----------------------------------
def _old_parse(buf: memoryview, where: str) -> dict[str, Entry]:
    """The loop of ``_parse`` as of 3b9575a (the end record code is unchanged and shared)."""
    t, central = tdshare._tdz, tdshare._tdz_write._CENTRAL_FMT
    n, cd_size, cd_off = t._end_record(buf, where)
    entries: dict[str, Entry] = {}
    spans: list[tuple[int, int, str]] = []
    cd, p = bytes(buf[cd_off : cd_off + cd_size]), 0
    for _ in range(n):
        if p + 46 > cd_size:
            raise CorruptDataError(f"{where}: the central directory is shorter than its {n} entries.")
        sig, _, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, _, _, _, off = central.unpack_from(cd, p)
        q = p + 46
        if sig != t.CENTRAL_SIG or q + nlen + elen + clen > cd_size:
            raise CorruptDataError(f"{where}: the central directory record at byte {cd_off + p} is malformed.")
        raw = cd[q : q + nlen]
        if _M32 in (usize, csize, off):
            usize, csize, off = t._zip64(cd[q + nlen : q + nlen + elen], [usize, csize, off], where)
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
        t._check_name(name, where)
        if flags & 0x41:
            raise CorruptDataError(f"{where}: the entry {name!r} is encrypted, which tdshare does not read.")
        if name in entries:
            raise CorruptDataError(f"{where} holds the entry {name!r} twice.")
        local = tdshare._tdz_write._LOCAL_FMT.unpack_from(buf, off) if off + 30 <= cd_off else (0,)
        if local[0] != t.LOCAL_SIG:
            raise CorruptDataError(f"{where}: the local header of {name!r} (byte {off}) is missing.")
        data = off + 30 + local[9] + local[10]
        if buf[off + 30 : off + 30 + local[9]] != raw or data + csize > cd_off:
            raise CorruptDataError(f"{where}: the entry {name!r} disagrees with its local header or overruns the data.")
        if method == 0 and csize != usize:
            raise CorruptDataError(f"{where}: the stored entry {name!r} records two different sizes.")
        rec, p = cd_off + p, q + nlen + elen + clen
        if not name.endswith("/"):
            entries[name] = Entry(name, method, flags, crc, csize, usize, off, data, rec)
            spans.append((off, data + csize, name))
    for (_, a_end, a), (b_start, _, b) in itertools.pairwise(sorted(spans)):
        if b_start < a_end:
            raise CorruptDataError(f"{where}: the entries {a!r} and {b!r} overlap; the archive is malformed.")
    return entries


def _outcome(parse: Any, data: bytes) -> tuple[str, Any]:
    try:
        return "ok", list(parse(memoryview(data), "X").items())
    except TdshareError as err:
        return "error", type(err).__name__
    except Exception as err:  # anything else leaking out is a bug
        return "crash", f"{type(err).__name__}: {err}"


_FUZZ_NAMES = [
    b"..",
    b"../x",
    b"a/../b",
    b"/x",
    b"a\\b",
    b"x\0y",
    b"C:x",
    b"",
    b"./x",
    b"a//b",
    b"d/",
    b"../",
    b"/",
    b"a/.",
    "é/x".encode(),
    b"\xc0\xae\xc0\xae",
    b"\xff",
    b"meta.json",
    b"b.memmap",
    b"a/b:c",
]


def _mutate(rng: random.Random, base: list[Spec]) -> bytes:
    specs = [Spec(**{k: v for k, v in vars(s).items() if k != "written"}) for s in base]
    for _ in range(rng.randrange(1, 4)):
        s = rng.choice(specs)
        k = rng.randrange(11)
        if k == 0:
            s.flags = rng.choice([0, 1, 0x8, 0x40, 0x800, 0x808, 0x2000, 0xFFFF])
        elif k == 1:
            s.method = rng.choice([0, 1, 8, 12, 14, 99])
        elif k == 2:
            s.csize = rng.choice([0, 1, _M32, len(s.data) + 1, max(len(s.data) - 1, 0), 1 << 20])
        elif k == 3:
            s.usize = rng.choice([0, _M32, len(s.data) + 1, 1 << 20])
        elif k == 4:
            s.offset = rng.choice([0, 1, 29, 30, _M32, 0xFFFFFFFE, 100, 200, 1000])
        elif k == 5:
            s.central_extra = rng.choice(
                [
                    b"",
                    b"\x01",
                    struct.pack("<HHQ", 1, 8, rng.choice([0, 64, 1 << 63])),
                    struct.pack("<HH", 1, 100),
                    struct.pack("<HHQQQ", 1, 24, 64, 64, rng.choice([0, 1, 2**64 - 1])),
                    struct.pack("<HHI", 1, 4, 7),
                ]
            )
        elif k == 6:
            s.name = rng.choice(_FUZZ_NAMES)
            if rng.random() < 0.7:
                s.local_name = s.name
        elif k == 7:
            s.local_nlen = rng.choice([0, 1, len(s.name) + 1, 0xFFFF])
        elif k == 8:
            s.local_extra = rng.choice([b"", bytes(4), bytes(1000), struct.pack("<HH", 1, 16) + bytes(16)])
        elif k == 9:
            s.local_sig = rng.choice([0, 0x04034B51])
        else:
            specs.append(Spec(**{k2: v for k2, v in vars(s).items() if k2 != "written"}))
    order = list(range(len(specs)))
    if rng.random() < 0.2:
        rng.shuffle(order)
    count = None if rng.random() < 0.9 else rng.choice([0, len(specs) + 1, 0xFFFF])
    return build_zip(specs, order=order, count=count)


def test_new_parser_agrees_with_the_old_one_on_hostile_archives() -> None:
    """Byte flips, truncations and field lies: both parsers accept the same archives, with the same
    entries, refuse the same ones, and neither lets a non-tdshare exception out."""
    rng = random.Random(1234)
    base = [*_specs(), plain(b"d/", b""), plain(b"d/meta.json", META), plain("é.memmap".encode(), b"e" * 8)]
    valid = build_zip(base)
    cases = [valid[:n] for n in range(0, len(valid), 7)]
    for _ in range(3000):
        data = bytearray(valid)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        cases.append(bytes(data))
    cases += [_mutate(rng, base) for _ in range(5000)]
    kinds = {"ok": 0, "error": 0}
    for data in cases:
        new, old = _outcome(tdshare._tdz._parse, data), _outcome(_old_parse, data)
        assert new[0] != "crash", (new, data)
        assert new == old, (new, old, data)
        kinds[new[0]] += 1
    assert kinds["ok"] > 500 and kinds["error"] > 3000  # both sides exercised


@pytest.mark.parametrize("compression", [None, "deflate", "lzma"])
def test_loading_mangled_archives_raises_only_tdshare_errors(tmp_path: Path, compression: str | None) -> None:
    src = tmp_path / "src.tdz"
    td = TensorDict(a=torch.arange(40.0), n={"c": torch.ones(3, dtype=torch.int16), "s": "x"}, batch_size=[])
    td.save(src, compression=compression)
    valid, path, rng = src.read_bytes(), tmp_path / "m.tdz", random.Random(7)
    loaded = 0
    for _ in range(300):
        data = bytearray(valid)
        for _ in range(rng.randrange(1, 3)):
            pos = rng.randrange(len(data))
            data[pos] = rng.choice([0, 0xFF, data[pos] ^ (1 << rng.randrange(8))])
        path.write_bytes(bytes(data))
        try:
            out = TensorDict.load(path)
        except TdshareError:
            continue
        assert out["n", "c"].shape == (3,) and out["a"].shape == (40,)
        loaded += 1
    assert loaded > 0


# -- open_leaves: the strided unbind views ---------------------------------------------------------
def _geometry(t: torch.Tensor) -> tuple:
    data = torch.Tensor.as_subclass(t, torch.Tensor).reshape(-1).view(torch.uint8).tolist() if t.numel() else []
    return (
        type(t).__name__,
        t.dtype,
        tuple(t.shape),
        t.stride(),
        t.storage_offset() if t.numel() else None,
        t.is_contiguous(),
        getattr(t, "_filename", None),
        getattr(t, "_offset", None),
        getattr(t, "_ino", None),
        getattr(t, "_mode", None),
        data,
    )


def _mixed() -> TensorDict:
    src: dict[str, torch.Tensor] = {}
    for i in range(6):  # like leaves, evenly spaced, alternating dtypes of one size
        src[f"f{i}"] = torch.randn(4)
        src[f"i{i}"] = torch.arange(4, dtype=torch.int32) + i
    for shape in [(2, 3), (3, 2), (6,), (1, 6), (6, 1)]:  # one size, several shapes
        src["s" + "x".join(map(str, shape))] = torch.arange(6.0).reshape(shape)
    src |= {
        "a b": torch.ones(3),
        "%": torch.arange(3),
        "1x": torch.tensor([1, 2]),
        "日本": torch.tensor([3.0]),
        "c64": torch.randn(3, dtype=torch.complex64),
        "c128": torch.randn(2, dtype=torch.complex128),
        "bool": torch.tensor([True, False, True]),
        "u8": torch.arange(7, dtype=torch.uint8),
        "scalar": torch.tensor(3),
        "scalar2": torch.tensor(4),
        "empty": torch.zeros(0, 2),
        "empty2": torch.zeros(3, 0),
        "bf16": torch.randn(5).bfloat16(),
        "f16": torch.randn(5).half(),
        "f8": torch.randn(9).to(torch.float8_e4m3fn),
        "big": torch.randn(3, 4, 5),
        "t": torch.arange(12.0).reshape(3, 4).t(),
        "i64": torch.arange(9).reshape(3, 3),
    }
    nested = TensorDict({f"n{i}": torch.full((2, 2), float(i)) for i in range(7)}, batch_size=[])
    nested["deeper"] = TensorDict({f"q{i}": torch.full((3,), i, dtype=torch.int8) for i in range(5)}, batch_size=[])
    return TensorDict(src, nested=nested, batch_size=[])


def _leaves(td: TensorDict) -> dict[Any, tuple]:
    return {k: _geometry(v) for k, v in td.items(include_nested=True, leaves_only=True)}


def _per_leaf(monkeypatch: pytest.MonkeyPatch, path: Path, **kw: Any) -> dict[Any, tuple]:
    """The leaves as the generic one-by-one ``open_leaf`` loop gives them."""
    with monkeypatch.context() as m:
        m.setattr(ArchiveStore, "open_leaves", Store.open_leaves)
        return _leaves(TensorDict.load(path, **kw))


@pytest.mark.parametrize("mode", [None, "r", "r+"])
def test_fused_open_leaves_equals_leaf_by_leaf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str | None
) -> None:
    td = _mixed()
    path = tmp_path / "mixed.tdz"
    td.save(path)
    fused = _leaves(TensorDict.load(path, mode=mode))
    assert fused == _per_leaf(monkeypatch, path, mode=mode)
    assert list(fused) == list(_leaves(td))
    offsets = {i.filename: i.header_offset for i in zipfile.ZipFile(path).infolist()}
    ar = Archive(str(path))
    views = 0
    for key, g in fused.items():
        name = "/".join((key,) if isinstance(key, str) else key)
        src = td[key].contiguous()
        assert g[1:3] == (src.dtype, tuple(src.shape)) and g[-1] == _geometry(src)[-1], key
        if src.numel():
            entry = next(v for n, v in ar.entries.items() if n.endswith(".memmap") and _key_of(n) == name)
            assert entry.header == offsets[entry.name]
            assert g[7] == entry.data and g[4] * src.element_size() == entry.data, key
            assert g[6] == str(path) and g[8] == path.stat().st_ino and g[9] == ("r+" if mode == "r+" else "r")
            views += 1
    assert views == len(fused) - 2  # all but the two empty leaves are views


def _key_of(entry_name: str) -> str:
    return "/".join(tdshare._keys.decode_key(p) for p in entry_name[: -len(".memmap")].split("/"))


def test_fused_views_pickle_to_the_same_bytes_and_geometry(tmp_path: Path) -> None:
    path = tmp_path / "p.tdz"
    _mixed().save(path)
    loaded = TensorDict.load(path)
    for key, leaf in loaded.items(include_nested=True, leaves_only=True):
        again = pickle.loads(pickle.dumps(leaf))
        assert _geometry(again) == _geometry(leaf), key
        if leaf.numel():
            assert again.untyped_storage().nbytes() == path.stat().st_size
    whole = pickle.loads(pickle.dumps(loaded))
    assert _leaves(whole) == _leaves(loaded)


def test_r_plus_writes_of_run_leaves_reach_their_own_bytes(tmp_path: Path) -> None:
    """Leaves cut from one strided view: writing each reaches exactly its entry in the file."""
    path = tmp_path / "w.tdz"
    td = TensorDict({f"k{i:02d}": torch.zeros(5, dtype=torch.int16) for i in range(20)}, batch_size=[])
    td["x"] = torch.zeros(5, dtype=torch.float16)  # same size, other dtype, in the middle of the run
    td.save(path)
    loaded = TensorDict.load(path, mode="r+")
    for i in range(0, 20, 2):
        loaded[f"k{i:02d}"][:] = torch.arange(5, dtype=torch.int16) + 100 * i
    loaded["x"][1] = 2.0
    del loaded
    entries, data = Archive(str(path)).entries, path.read_bytes()  # the bytes in the file, CRCs stale

    def payload(name: str, dtype: torch.dtype) -> list:
        e = entries[name]
        return torch.frombuffer(bytearray(data[e.data : e.data + e.size]), dtype=dtype).tolist()

    for i in range(20):
        expected = [100 * i + j for j in range(5)] if i % 2 == 0 else [0] * 5
        assert payload(f"k{i:02d}.memmap", torch.int16) == expected, i
    assert payload("x.memmap", torch.float16) == [0, 2.0, 0, 0, 0]
    assert payload("meta.json", torch.uint8) == list(zipfile.ZipFile(path).read("meta.json"))
    assert refresh_archive_checksums(path) == 11
    assert zipfile.ZipFile(path).testzip() is None


def test_legacy_names_and_subpath(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    td = TensorDict({"a b": torch.ones(3), "c": torch.arange(3), "%x": torch.zeros(3)}, batch_size=[3])
    td["sub"] = TensorDict(
        {"d e": torch.full((3,), 7.0), "f": torch.arange(3.0), "g": torch.arange(3.0) + 1}, batch_size=[3]
    )
    path = tmp_path / "legacy.tdz"
    td.save(path, robust_key=False)
    names = set(zipfile.ZipFile(path).namelist())
    assert {"a b.memmap", "%x.memmap", "sub/d e.memmap"} <= names
    for robust in (True, False):
        loaded = TensorDict.load(path, robust_key=robust)
        assert _leaves(loaded) == _per_leaf(monkeypatch, path, robust_key=robust)
        assert loaded["sub", "d e"].tolist() == [7.0] * 3 and loaded["%x"].tolist() == [0.0] * 3
        sub = TensorDict.load(path, subpath="sub", robust_key=robust)
        assert (
            sub["g"].tolist() == [1.0, 2.0, 3.0]
            and sub["d e"]._offset == Archive(str(path)).entries["sub/d e.memmap"].data
        )
    robust = tmp_path / "robust.tdz"
    td.save(robust)
    sub = TensorDict.load(robust, subpath="sub", mode="r+")
    assert _leaves(sub) == _per_leaf(monkeypatch, robust, subpath="sub", mode="r+")


def test_foreign_zip_mixes_views_and_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zip written by zipfile (no alignment): the leaves that happen to be aligned are views,
    the others copies, and all hold the right bytes."""
    td = TensorDict({f"k{i}": torch.arange(i, i + 3, dtype=torch.float64) for i in range(12)}, batch_size=[])
    td["h"] = torch.arange(5, dtype=torch.int16)
    files = meta_of(td, tmp_path)
    path = tmp_path / "foreign.tdz"
    with zipfile.ZipFile(path, "w") as z:
        for i, (name, data) in enumerate(files.items()):
            z.writestr(name, data)
            if i % 3 == 0:
                z.writestr(f"pad{i}.bin", b"x" * (i + 1))  # shifts the following offsets
    loaded = TensorDict.load(path)
    assert _leaves(loaded) == _per_leaf(monkeypatch, path)
    kinds = {isinstance(v, MemoryMappedTensor) and v._offset is not None for _, v in loaded.items()}
    assert kinds == {True, False}
    for key in td.keys():
        assert loaded[key].tolist() == td[key].tolist()


@pytest.mark.parametrize("compression", ["deflate", "bzip2"])
def test_compressed_leaves_are_copies(tmp_path: Path, compression: str) -> None:
    path = tmp_path / "c.tdz"
    td = _mixed()
    td.save(path, compression=compression)
    loaded = TensorDict.load(path, num_threads=2)
    for key, leaf in loaded.items(include_nested=True, leaves_only=True):
        assert getattr(leaf, "_offset", None) is None and _geometry(leaf)[-1] == _geometry(td[key].contiguous())[-1]


# -- unpack and refresh on hostile archives -------------------------------------------------------
def test_refresh_with_a_fake_data_descriptor_keeps_the_archive(tmp_path: Path) -> None:
    """Flag 0x08 on an entry that has no descriptor after it: the 'descriptor' is the central
    directory, and refreshing its CRC overwrites the first central record's signature."""
    path = tmp_path / "dd.tdz"
    TensorDict(a=torch.arange(4.0), batch_size=[]).save(path)
    e = Archive(str(path)).entries["a.memmap"]
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, e.central + 8, e.flags | 0x08)
    struct.pack_into("<I", data, e.central + 16, e.crc ^ 1)  # a stale CRC, as after an r+ write
    path.write_bytes(bytes(data))
    try:
        refresh_archive_checksums(path)
    except CorruptDataError as err:  # refusing the archive is a fix too
        assert "descriptor" in str(err)
        return
    assert TensorDict.load(path)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_unpack_through_a_symlink_creates_nothing_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "sub").symlink_to(outside)
    path = write(tmp_path, build_zip([plain(b"meta.json", META), plain(b"sub/x/y/meta.json", META)]))
    with pytest.raises(CorruptDataError, match="leads outside"):
        unpack_memmap(path, root)
    assert os.listdir(outside) == []


# -- _crc -------------------------------------------------------------------------------------------
def test_crc32_combine_many_lengths() -> None:
    rng = random.Random(5)
    for len_a, len_b in [(0, 0), (0, 5), (5, 0), (1, 1), (3, 4096), (4097, 3), (1 << 16, (1 << 16) + 1)]:
        a, b = rng.randbytes(len_a), rng.randbytes(len_b)
        for crc in (zlib.crc32, tdshare._crc.crc32):
            assert tdshare._crc.crc32_combine(crc(a), crc(b), len_b) == zlib.crc32(a + b)
    pieces = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(30)]
    value = 0
    for piece in pieces:
        value = tdshare._crc.crc32_combine(value, zlib.crc32(piece), len(piece))
    assert value == zlib.crc32(b"".join(pieces))


def test_crc32_threaded_on_odd_sizes() -> None:
    chunk = tdshare._crc.CHUNK
    data = memoryview(random.Random(3).randbytes(2 * chunk + 17))
    for length in (0, 1, chunk, chunk + 1, 2 * chunk + 17):
        for threads in (0, 1, 2, 3):
            assert tdshare._crc.crc32_threaded(data[:length], threads) == zlib.crc32(data[:length])


def _in_child(fn: Any, timeout: int = 20) -> int:
    """Run ``fn`` in a forked child (killed by SIGALRM after ``timeout`` s); its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # pytest-timeout's handler would raise instead
            signal.alarm(timeout)
            code = 0 if fn() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


needs_fork = pytest.mark.skipif(
    not hasattr(os, "fork"), reason="os.fork is not available on this platform; these tests fork the process"
)


@needs_fork
def test_pools_work_after_fork(tmp_path: Path) -> None:
    big = torch.randn((tdshare._crc.CHUNK * 2 + 100) // 4)  # written and checked on the pool's threads
    TensorDict(a=big, batch_size=[]).save(tmp_path / "parent.tdz")  # the parent's pool exists now

    def child() -> bool:
        torch.set_num_threads(1)  # torch's OpenMP pool does not survive fork: a parallel op would hang
        TensorDict(a=big, b=torch.ones(3), batch_size=[]).save(tmp_path / "child.tdz", compression="deflate")
        out = TensorDict.load(tmp_path / "child.tdz", num_threads=2)
        return bool(torch.equal(out["a"], big)) and zipfile.ZipFile(tmp_path / "child.tdz").testzip() is None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a multi-threaded process
        status = _in_child(child, timeout=60)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def _use_crc_pools() -> bool:
    tdshare._crc.pool(7).submit(int).result()
    return tdshare._crc.crc32_combine(1, 2, 3) == tdshare._crc.crc32_combine(1, 2, 3)


def _use_write_pool() -> bool:
    return tdshare._write._executor(3).submit(int).result() == 0


@needs_fork
@pytest.mark.parametrize(
    ("module", "lock", "child"),
    [
        (tdshare._crc, "_POOLS_LOCK", _use_crc_pools),
        (tdshare._crc, "_ZERO_LOCK", _use_crc_pools),
        (tdshare._write, "_EXECUTORS_LOCK", _use_write_pool),
    ],
    ids=["crc pools", "crc combine", "write pool"],
)
def test_locks_held_at_fork_do_not_deadlock_the_child(module: Any, lock: str, child: Callable[[], bool]) -> None:
    """Another thread inside a pool or crc32_combine() when the process forks (simulated by holding
    the lock across the fork): the child must still be able to use them."""
    held = getattr(module, lock)

    with held, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        status = _in_child(child, timeout=2)
    assert not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM), "the child deadlocked"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_isal_missing_falls_back_to_zlib_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "isal", None)
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)
    fallback = tdshare._crc.best_crc32()
    assert fallback is zlib.crc32
    monkeypatch.setattr(tdshare._crc, "crc32", fallback)
    monkeypatch.setattr(tdshare._tdz, "crc32", fallback)
    monkeypatch.setattr(tdshare._tdz_write, "crc32", fallback)
    path = tmp_path / "z.tdz"
    td = _mixed()
    td.save(path, compression="lzma")
    assert zipfile.ZipFile(path).testzip() is None
    assert _leaves(TensorDict.load(path))[("nested", "n3")][-1] == _geometry(td["nested", "n3"])[-1]
