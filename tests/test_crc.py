"""The zip CRC-32: ISA-L's and zlib's agree, the fallback works, threaded pieces combine right."""

from __future__ import annotations

import itertools
import os
import random
import sys
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

import tdshare
import tdshare._crc
import tdshare._tdz
from tdshare import TensorDict, refresh_archive_checksums
from tdshare._crc import CHUNK, best_crc32, crc32, crc32_combine, crc32_threaded

LENGTHS = [0, 1, 2, 3, 7, 15, 16, 17, 31, 63, 64, 65, 255, 4095, 4097, 65_537, (1 << 20) + 3]


def test_isal_is_used_when_installed() -> None:
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    assert crc32 is isal_zlib.crc32
    assert best_crc32() is isal_zlib.crc32


@pytest.mark.parametrize("length", LENGTHS)
def test_isal_and_zlib_agree(length: int) -> None:
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    data = random.Random(length).randbytes(length)
    start = random.Random(length + 1).getrandbits(32)
    for value in (0, 1, 0xFFFFFFFF, start):
        assert isal_zlib.crc32(data, value) == zlib.crc32(data, value)
    assert isal_zlib.crc32(data) == zlib.crc32(data)
    assert isal_zlib.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])  # odd start, odd length
    assert isal_zlib.crc32(bytearray(data)) == zlib.crc32(data)


def test_chained_values_equal_one_pass() -> None:
    data = random.Random(0).randbytes(100_003)
    cuts = [0, 1, 5, 64, 4099, 50_000, 100_003]
    value = 0
    for a, b in itertools.pairwise(cuts):
        value = crc32(data[a:b], value)
    assert value == zlib.crc32(data)
    assert crc32(b"") == 0 and crc32(b"", 1234) == 1234
    assert crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value


def test_crc_of_tensor_memory() -> None:
    t = torch.arange(1001, dtype=torch.float64)
    view = memoryview(t.numpy()).cast("B")
    assert crc32(view) == zlib.crc32(t.numpy().tobytes())


@pytest.mark.parametrize("length", [CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 12_345])
def test_threaded_pieces_combine(length: int) -> None:
    data = memoryview(os.urandom(length))
    expected = zlib.crc32(data)
    assert crc32_threaded(data, 2) == expected
    assert crc32_threaded(data, 3) == expected
    assert crc32_threaded(data, 1) == expected
    half = length // 2
    assert crc32_combine(zlib.crc32(data[:half]), zlib.crc32(data[half:]), length - half) == expected


def test_fallback_without_isal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "isal.isal_zlib", None)  # importing it now raises ImportError
    assert best_crc32() is zlib.crc32


def test_a_broken_isal_is_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    monkeypatch.setattr(isal_zlib, "crc32", lambda data, value=0: 0)  # imports, answers wrong
    assert best_crc32() is zlib.crc32


@pytest.fixture(params=["best", "zlib"])
def crc_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the CRC-32 tdshare picked, and again with the zlib fallback everywhere."""
    if request.param == "zlib":
        monkeypatch.setattr(tdshare._crc, "crc32", zlib.crc32)
        monkeypatch.setattr(tdshare._tdz, "crc32", zlib.crc32)
    return str(request.param)


def test_archives_check_with_either_crc(tmp_path: Path, crc_impl: str) -> None:
    big = torch.randn((CHUNK * 2 + 4096) // 4)  # several write/CRC pieces on threads
    td = TensorDict(big=big, small=torch.arange(10), nested={"x": torch.ones(3, 5)}, batch_size=[])
    path = tmp_path / f"{crc_impl}.tdz"
    td.save(path)
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        assert z.read("big.memmap") == big.numpy().tobytes()
    loaded = TensorDict.load(path, mode="r+")
    assert torch.equal(loaded["big"], big) and loaded["nested", "x"].sum() == 15
    loaded["big"][7] = 123.0
    loaded["small"][0] = 99
    del loaded
    assert refresh_archive_checksums(path) == 2
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
    deflated = tmp_path / f"{crc_impl}-deflate.tdz"
    td.save(deflated, compression="deflate")
    again = TensorDict.load(deflated)
    assert torch.equal(again["big"], big) and again["small"].tolist() == list(range(10))
    out = tdshare.unpack_memmap(path, tmp_path / f"{crc_impl}-folder")
    assert TensorDict.load(out)["big"][7] == 123.0


def test_corruption_is_caught_with_either_crc(tmp_path: Path, crc_impl: str) -> None:
    path = tmp_path / "c.tdz"
    TensorDict(a=torch.arange(5000.0), batch_size=[]).save(path, compression="deflate")
    entry = tdshare._tdz.Archive(str(path)).entries["meta.json"]
    data = bytearray(path.read_bytes())
    data[entry.data + 2] ^= 0x01  # one flipped bit in the stored metadata
    path.write_bytes(bytes(data))
    with pytest.raises(tdshare.CorruptDataError, match="CRC"):
        TensorDict.load(path)
