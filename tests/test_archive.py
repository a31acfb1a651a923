""".tdz archives: format, zero-copy loading, modes, hostile input, pickling, CLI, compatibility."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import pickle
import shutil
import stat
import struct
import subprocess
import sys
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from _helpers import COMMON_DTYPES, FLOAT8_DTYPES, Point, as_other_user

import tdshare
from tdshare import (
    CorruptDataError,
    MemoryMappedTensor,
    NonTensorData,
    TensorDict,
    pack_memmap,
    refresh_archive_checksums,
    unpack_memmap,
)
from tdshare._crc import crc32_combine
from tdshare._tdz import Archive
from tdshare._tdz_write import write_archive

DTYPES = [*COMMON_DTYPES, *FLOAT8_DTYPES[:2]]


def raw(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    t = torch.Tensor.as_subclass(t, torch.Tensor).resolve_conj().resolve_neg().contiguous()
    return (str(t.dtype), tuple(t.shape), bytes(t.reshape(-1).view(torch.uint8).tolist()))


def describe(td: Any) -> dict:
    """Keys, batch sizes, raw leaf bytes and non-tensor values of a tensordict of either library."""
    out: dict[str, Any] = {"batch": list(td.batch_size)}
    for key in td.keys():
        v = td.get(key)
        if type(v).__name__ in ("NonTensorData", "NonTensorStack"):
            out[key] = ("value", v.data)
        elif isinstance(v, torch.Tensor):
            out[key] = raw(v)
        elif hasattr(v, "batch_size"):
            out[key] = describe(v)
        else:
            out[key] = ("value", v)
    return out


def sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    n = math.prod(shape)
    if dtype == torch.bool:
        return (torch.rand(n, generator=g) > 0.5).reshape(shape)
    if dtype.is_complex:
        return torch.randn(n, generator=g, dtype=dtype).reshape(shape)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g, dtype=torch.float32).to(dtype).reshape(shape)
    return torch.randint(0, 100, (n,), generator=g).to(dtype).reshape(shape)


def make_td() -> TensorDict:
    """Nested, every dtype, JSON and pickled non-tensor values, a zero-size and a non-contiguous leaf."""
    td = TensorDict({f"x_{str(d)[6:]}": sample(d, (3, 5)) for d in DTYPES}, batch_size=[3])
    td["nested", "deeper", "y"] = torch.arange(3.0)
    td["nested", "z"] = torch.ones(3, 2, dtype=torch.int16)
    td["empty"] = torch.zeros(3, 0)
    td["transposed"] = torch.arange(30.0).reshape(2, 15).t()[:3]
    td["text"] = "hello"
    td["nested", "cfg"] = NonTensorData({"lr": 0.1, "tags": ["a", "b"]})
    td["obj"] = Point(7)
    return td


def payload_offsets(path: Path) -> dict[str, int]:
    data = path.read_bytes()
    out = {}
    for info in zipfile.ZipFile(path).infolist():
        o = info.header_offset
        nlen, elen = struct.unpack_from("<HH", data, o + 26)
        out[info.filename] = o + 30 + nlen + elen
    return out


def patch(path: Path, old: bytes, new: bytes, count: int = -1) -> None:
    assert len(old) == len(new)
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, count))


def patch_at(path: Path, offset: int, value: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(value)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[TensorDict, Path]:
    td = make_td()
    path = tmp_path / "td.tdz"
    td.save(path)
    return td, path


# -- round trips and format -------------------------------------------------------------------
@pytest.mark.parametrize("compression", [None, "stored", "deflate", "DEFLATED", "bzip2", "lzma", zipfile.ZIP_DEFLATED])
def test_round_trip(tmp_path: Path, compression: Any) -> None:
    td = make_td()
    path = tmp_path / "td.tdz"
    out = td.save(path, compression=compression)
    assert describe(out) == describe(td)
    assert describe(TensorDict.load(path, allow_pickle=True)) == describe(td)
    assert zipfile.ZipFile(path).testzip() is None
    methods = {i.filename: i.compress_type for i in zipfile.ZipFile(path).infolist()}
    expected = tdshare._tdz.parse_compression(compression)
    assert all(m == (expected if name.endswith(".memmap") else 0) for name, m in methods.items())


def test_layout_matches_the_folder(tmp_path: Path) -> None:
    td = make_td()
    td.save(tmp_path / "td.tdz")
    names = [i.filename for i in zipfile.ZipFile(tmp_path / "td.tdz").infolist()]
    td.memmap(tmp_path / "folder")
    files = sorted(str(p.relative_to(tmp_path / "folder")) for p in (tmp_path / "folder").rglob("*") if p.is_file())
    assert sorted(names) == files
    assert not any(n.endswith("/") or "\\" in n for n in names)
    assert names == archive_order(tmp_path / "folder")


def archive_order(root: Path, rel: str = "") -> list[str]:
    """Per level: meta.json, the other files sorted, then each sub-folder sorted, recursively."""
    here = sorted(os.listdir(root / rel))
    files = [f for f in here if (root / rel / f).is_file()]
    out = [rel + f for f in sorted(files, key=lambda f: f != "meta.json")]
    for d in here:
        if (root / rel / d).is_dir():
            out += archive_order(root, f"{rel}{d}/")
    return out


def test_stored_payloads_are_aligned(saved: tuple[TensorDict, Path]) -> None:
    _, path = saved
    data = path.read_bytes()
    offsets = payload_offsets(path)
    leaves = [n for n in offsets if n.endswith(".memmap")]
    assert len(leaves) >= len(DTYPES)
    for info in zipfile.ZipFile(path).infolist():
        o = info.header_offset
        nlen, elen = struct.unpack_from("<HH", data, o + 26)
        extra = data[o + 30 + nlen : o + 30 + nlen + elen]
        assert struct.unpack_from("<HH", extra, len(extra) - 20) == (1, 16)  # zip64 sizes last
        if info.filename.endswith(".memmap"):
            assert offsets[info.filename] % 64 == 0
            assert struct.unpack_from("<H", extra)[0] == 0x6474 and set(extra[4 : elen - 20]) <= {0}
        else:
            assert elen == 20


def test_big_and_non_contiguous_leaves(tmp_path: Path) -> None:
    big = torch.randn(5_000_000)  # 20 MB: several write/CRC pieces combined
    td = TensorDict(big=big, t=torch.randn(700, 1000).t(), batch_size=[])
    out = td.save(tmp_path / "a.tdz")
    assert torch.equal(out["big"], big) and torch.equal(out["t"], td["t"])
    assert zipfile.ZipFile(tmp_path / "a.tdz").testzip() is None


def test_crc32_combine() -> None:
    a, b = os.urandom(1000), os.urandom(777)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b""), 0) == zlib.crc32(a)


def test_zip64_end_records(tmp_path: Path) -> None:
    path = tmp_path / "many.zip"
    n = 0x10000 + 5
    write_archive(str(path), ((f"e{i}", b"x") for i in range(n)), 0)
    assert len(zipfile.ZipFile(path).infolist()) == n
    assert len(Archive(str(path)).entries) == n


# -- loading: zero-copy and modes -------------------------------------------------------------
def test_leaves_view_one_mapping(saved: tuple[TensorDict, Path]) -> None:
    _, path = saved
    td = TensorDict.load(path, allow_pickle=True)
    assert not td.is_memmap() and not td.is_locked and td._memmap_prefix is None
    a, y = td["x_float32"], td["nested", "deeper", "y"]
    assert isinstance(a, MemoryMappedTensor) and a.filename == str(path)
    assert a.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    base = a.untyped_storage().data_ptr()
    offsets = payload_offsets(path)
    assert a.data_ptr() - base == offsets["x_float32.memmap"] == a._offset
    assert a.untyped_storage().nbytes() == path.stat().st_size


def test_many_leaves_are_exact_views(tmp_path: Path) -> None:
    """Runs of like leaves (one strided view cut by unbind), lone ones, other dtypes and shapes, a 0-d
    leaf, an empty one: every leaf is a view of the one mapping at its payload, equal to its source."""
    src: dict[str, torch.Tensor] = {f"f{i}": torch.randn(3, 2) for i in range(12)}
    src |= {f"i{i}": torch.arange(i, i + 5, dtype=torch.int64) for i in range(5)}
    src |= {"b": torch.tensor([True, False, True]), "s": torch.tensor(2.5), "e": torch.zeros(0, 3)}
    src |= {"h": torch.randn(7).half(), "long_name_" + "x" * 70: torch.randn(3, 2), "d": torch.randn(2, 2).double()}
    td = TensorDict(src, nested=TensorDict({f"n{i}": torch.full((4,), float(i)) for i in range(9)}), batch_size=[])
    path = tmp_path / "many.tdz"
    td.save(path)
    offsets = payload_offsets(path)
    for mode in (None, "r+"):
        loaded = TensorDict.load(path, mode=mode)
        base = loaded["f0"].untyped_storage().data_ptr()
        for key in [*src, *(("nested", f"n{i}") for i in range(9))]:
            leaf = loaded[key]
            name = (key if isinstance(key, str) else "/".join(key)) + ".memmap"
            assert isinstance(leaf, MemoryMappedTensor) and raw(leaf) == raw(td[key]), key
            if leaf.numel():  # an empty leaf has no entry: an unmapped empty tensor
                assert leaf._mode == ("r+" if mode else "r") and leaf.filename == str(path)
                assert leaf.data_ptr() - base == offsets[name] == leaf._offset and leaf.is_contiguous()
                assert leaf.untyped_storage().data_ptr() == base and leaf._ino == path.stat().st_ino
        again = pickle.loads(pickle.dumps(loaded["nested", "n5"]))
        assert again.tolist() == [5.0] * 4 and again._offset == offsets["nested/n5.memmap"]
    grad = torch.ones(3, 2, requires_grad=True)
    loaded = TensorDict.load(path)
    loaded["f3"].copy_(grad * 2)  # writing a grad-tracking value into a leaf works as for any tensor
    assert loaded["f3"].tolist() == [[2.0, 2.0]] * 3 and loaded["f4"].tolist() == td["f4"].tolist()


def test_default_and_r_modes_are_copy_on_write(saved: tuple[TensorDict, Path]) -> None:
    _, path = saved
    before = path.read_bytes()
    for mode in (None, "r"):
        td = TensorDict.load(path, mode=mode, allow_pickle=True)
        td["x_float32"][0, 0] = 1234.0
        assert td["x_float32"][0, 0] == 1234.0
    assert path.read_bytes() == before


def test_r_plus_writes_through_and_checksums_refresh(saved: tuple[TensorDict, Path]) -> None:
    _, path = saved
    td = TensorDict.load(path, mode="r+", allow_pickle=True)
    td["x_float32"][0, 0] = 1234.0
    td["nested", "deeper", "y"] += 1
    assert TensorDict.load(path, allow_pickle=True)["x_float32"][0, 0] == 1234.0
    assert zipfile.ZipFile(path).testzip() is not None  # stale CRC until refreshed
    assert refresh_archive_checksums(path) == 2
    assert zipfile.ZipFile(path).testzip() is None
    assert refresh_archive_checksums(path) == 0


def test_r_plus_refused_for_compressed_entries(tmp_path: Path) -> None:
    path = tmp_path / "c.tdz"
    TensorDict(a=torch.zeros(100), batch_size=[]).save(path, compression="deflate")
    with pytest.raises(RuntimeError, match=r"mode='r\+'.*compressed"):
        TensorDict.load(path, mode="r+")


def test_r_plus_refused_for_read_only_file(tmp_path: Path, shared_dir: Path) -> None:
    """As root the check runs as the user ``nobody`` (root may write any file)."""
    path = shared_dir / "ro.tdz"
    TensorDict(a=torch.zeros(4), batch_size=[]).save(path)
    path.chmod(0o444)

    def check() -> str:
        try:
            TensorDict.load(path, mode="r+")
        except PermissionError as err:
            return "permission-error" if str(path) in str(err) else f"unnamed: {err}"
        return "loaded"

    assert as_other_user(check) == "permission-error"
    assert TensorDict.load(path)["a"].tolist() == [0.0] * 4  # mode None still maps it


def test_foreign_unaligned_zip(tmp_path: Path) -> None:
    """A zip made without alignment (zipfile, or ``zip -0 -r``) loads; r+ is refused there."""
    td = TensorDict(a=torch.arange(5, dtype=torch.float64), b=torch.arange(3, dtype=torch.int32), batch_size=[])
    td.memmap(tmp_path / "f")
    path = tmp_path / "foreign.tdz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("meta.json", (tmp_path / "f" / "meta.json").read_bytes())
        z.writestr("x", b"12345")  # shifts the payloads off their alignment
        for name in ("a.memmap", "b.memmap"):
            z.writestr(name, (tmp_path / "f" / name).read_bytes())
    offsets = payload_offsets(path)
    assert offsets["a.memmap"] % 8 != 0
    loaded = TensorDict.load(path)
    assert describe(loaded) == describe(td)
    with pytest.raises(RuntimeError, match="not aligned"):
        TensorDict.load(path, mode="r+")
    if shutil.which("zip"):
        subprocess.run(["zip", "-q", "-r", str(tmp_path / "z.tdz"), "."], cwd=tmp_path / "f", check=True)
        assert describe(TensorDict.load(tmp_path / "z.tdz")) == describe(td)


def test_parallel_decompression(tmp_path: Path) -> None:
    td = TensorDict({f"k{i}": torch.randn(1000) for i in range(8)}, batch_size=[])
    td.save(tmp_path / "c.tdz", compression="deflate")
    loaded = TensorDict.load(tmp_path / "c.tdz", num_threads=4)
    assert describe(loaded) == describe(td)


def test_subpath(saved: tuple[TensorDict, Path]) -> None:
    td, path = saved
    assert describe(TensorDict.load(path, subpath="nested/deeper")) == describe(td["nested", "deeper"])
    assert describe(TensorDict.load(path, subpath=("nested",))) == describe(td["nested"])
    with pytest.raises(ValueError, match="No tensordict found under subpath"):
        TensorDict.load(path, subpath="missing")


def test_load_memmap_into_and_memmap_again(saved: tuple[TensorDict, Path], tmp_path: Path) -> None:
    td, path = saved
    target = TensorDict(other=torch.zeros(3), batch_size=[3])
    assert target.load_memmap_(path, allow_pickle=True) is target
    assert "other" not in target and not target.is_memmap() and not target.is_locked
    assert describe(target) == describe(td)
    copy = target.memmap(tmp_path / "folder")  # archive leaves are not "mapped elsewhere"
    assert describe(TensorDict.load(tmp_path / "folder", allow_pickle=True)) == describe(td)
    assert describe(target[1:].memmap()) == describe(copy[1:])
    target.save(path)  # over the archive its leaves map
    assert describe(TensorDict.load(path, allow_pickle=True)) == describe(td)


def test_pickles_load_as_allow_pickle_says(saved: tuple[TensorDict, Path]) -> None:
    _, path = saved
    with pytest.raises(tdshare.PickleRefusedError):
        TensorDict.load(path, allow_pickle=False)
    with pytest.warns(FutureWarning, match="pickled"):
        assert TensorDict.load(path)["obj"] == Point(7)


def test_archive_flag_and_names(tmp_path: Path) -> None:
    td = TensorDict(a=torch.ones(2), batch_size=[2])
    td.save(tmp_path / "plain.bin", archive=True)
    assert zipfile.is_zipfile(tmp_path / "plain.bin")
    td.save(tmp_path / "dir.tdz", archive=False)
    assert (tmp_path / "dir.tdz" / "meta.json").is_file()
    assert isinstance(td.memmap(str(tmp_path / "m.tdz"))["a"], MemoryMappedTensor)


# -- writing: errors and atomicity ------------------------------------------------------------
def test_argument_errors(tmp_path: Path) -> None:
    td = TensorDict(a=torch.ones(2), batch_size=[2])
    with pytest.raises(ValueError, match=r"Unknown compression 'zstd'.*bzip2.*deflate.*lzma.*stored"):
        td.save(tmp_path / "a.tdz", compression="zstd")
    with pytest.raises(ValueError, match="Unknown compression"):
        td.save(tmp_path / "a.tdz", compression=99)
    with pytest.raises(ValueError, match="archives only"):
        td.save(tmp_path / "folder", compression="deflate")
    with pytest.raises(NotImplementedError, match="return_early"):
        td.save(tmp_path / "a.tdz", num_threads=2, return_early=True)
    (tmp_path / "d.tdz").mkdir()
    with pytest.raises(ValueError, match="directory"):
        td.save(tmp_path / "d.tdz")
    td.save(tmp_path / "e.tdz")
    with pytest.raises(RuntimeError, match="already exists"):
        td.memmap(tmp_path / "e.tdz", existsok=False)
    assert not list(tmp_path.glob(".*"))


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.tdz"
    TensorDict(a=torch.ones(2), batch_size=[2]).save(path)
    path.chmod(0o640)
    before = path.read_bytes()

    def boom(self: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(tdshare._tdz_write._Writer, "finish", boom)
    with pytest.raises(OSError, match="disk full"):
        TensorDict(a=torch.zeros(2), big=torch.zeros(1 << 20), batch_size=[]).save(path)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["a.tdz"]
    monkeypatch.undo()
    TensorDict(a=torch.zeros(2), batch_size=[2]).save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # the replaced file's permissions are kept


# -- hostile archives -------------------------------------------------------------------------
@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "s.tdz"
    TensorDict(abc=torch.arange(4.0), n=TensorDict(q=torch.ones(4), batch_size=[4]), batch_size=[4]).save(path)
    return path


@pytest.mark.parametrize(
    "name", [b"../.memmap", b"/bc.memmap", b"a\\c.memmap", b"./c.memmap", b"a:c.memmap", b"ab\0.memmap", b"a//.memmap"]
)
def test_unsafe_names(small: Path, name: bytes) -> None:
    patch(small, b"abc.memmap", name)
    with pytest.raises(CorruptDataError, match="not a safe relative path"):
        TensorDict.load(small)


def test_unsafe_name_among_many(tmp_path: Path) -> None:
    """The names are checked all at once: one bad name among many is still found and named."""
    path = tmp_path / "many.tdz"
    TensorDict({f"k{i:03d}": torch.ones(2) for i in range(300)}, batch_size=[]).save(path)
    patch(path, b"k123.memmap", b"k/../memmap")
    with pytest.raises(CorruptDataError, match=r"'k/\.\./memmap'.*not a safe relative path"):
        TensorDict.load(path)


def test_directory_entries_and_non_ascii_names(tmp_path: Path) -> None:
    """Directory entries (``zip -r``) are skipped; names are UTF-8 when flagged 0x800, cp437 otherwise."""
    td = TensorDict({"é": torch.arange(3.0), "plain": torch.ones(2), "日本": torch.zeros(1)}, batch_size=[])
    td.memmap(tmp_path / "f")
    path = tmp_path / "d.tdz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("meta.json", (tmp_path / "f" / "meta.json").read_bytes())
        z.writestr(zipfile.ZipInfo("empty/"), b"")
        for name in sorted(os.listdir(tmp_path / "f")):
            if name.endswith(".memmap"):
                z.writestr(name, (tmp_path / "f" / name).read_bytes())
    ar = Archive(str(path))
    assert "empty/" not in ar.entries and "é.memmap" in ar.entries and "日本.memmap" in ar.entries
    assert describe(TensorDict.load(path)) == describe(td)
    entry = ar.entries["é.memmap"]
    del ar
    for at in (entry.header + 6, entry.central + 8):  # clear the UTF-8 flag in both headers
        flags = struct.unpack_from("<H", path.read_bytes(), at)[0]
        patch_at(path, at, struct.pack("<H", flags & ~0x800))
    names = Archive(str(path)).entries
    assert "é.memmap".encode().decode("cp437") in names and "é.memmap" not in names and "日本.memmap" in names


def test_out_of_range_and_overlapping_entries(small: Path) -> None:
    entry = Archive(str(small)).entries["abc.memmap"]
    good = small.read_bytes()
    patch_at(small, entry.central + 42, struct.pack("<I", len(good) + 10))  # local header offset beyond the file
    with pytest.raises(CorruptDataError, match="local header"):
        TensorDict.load(small)
    small.write_bytes(good)
    meta = Archive(str(small)).entries["meta.json"]
    patch_at(small, meta.central + 20, struct.pack("<II", meta.size + 200, meta.size + 200))  # runs into the next
    with pytest.raises(CorruptDataError, match="overlap"):
        TensorDict.load(small)


def test_central_directory_out_of_file_order(small: Path) -> None:
    """Entries listed in another order than the file's still load; an overlap among them is still refused."""
    data = small.read_bytes()
    n, _, cd_off = tdshare._tdz._end_record(memoryview(data), str(small))
    records, p = [], cd_off
    for _ in range(n):
        nlen, elen, clen = struct.unpack_from("<HHH", data, p + 28)
        records.append(data[p : p + 46 + nlen + elen + clen])
        p += len(records[-1])
    small.write_bytes(data[:cd_off] + b"".join(reversed(records)) + data[p:])
    assert list(Archive(str(small)).entries)[-1] == "meta.json"
    assert TensorDict.load(small)["n", "q"].tolist() == [1.0] * 4
    meta = Archive(str(small)).entries["meta.json"]
    patch_at(small, meta.central + 20, struct.pack("<II", meta.size + 200, meta.size + 200))
    with pytest.raises(CorruptDataError, match="overlap"):
        TensorDict.load(small)


def test_local_header_disagreeing_with_the_central_directory(small: Path) -> None:
    entry = Archive(str(small)).entries["abc.memmap"]
    patch_at(small, entry.central + 46, b"abd")
    with pytest.raises(CorruptDataError, match=r"'abd\.memmap' disagrees with its local header"):
        TensorDict.load(small)


def test_sizes_disagreeing_with_metadata(tmp_path: Path) -> None:
    TensorDict(a=torch.arange(8.0), batch_size=[]).memmap(tmp_path / "f")
    with open(tmp_path / "f" / "a.memmap", "r+b") as f:
        f.truncate(16)
    pack_memmap(tmp_path / "f", tmp_path / "short.tdz")
    with pytest.raises(CorruptDataError, match=r"holds 16 bytes but .* expects 32"):
        TensorDict.load(tmp_path / "short.tdz")


@pytest.mark.parametrize("cut", [1, 30, 0.5])
def test_truncated(small: Path, cut: float) -> None:
    data = small.read_bytes()
    small.write_bytes(data[: int(len(data) * cut) if cut < 1 else len(data) - int(cut)])
    with pytest.raises(CorruptDataError):
        TensorDict.load(small)


def test_bad_crc_and_corrupt_compressed_entries(tmp_path: Path) -> None:
    path = tmp_path / "c.tdz"
    TensorDict(a=torch.arange(10000.0), batch_size=[]).save(path, compression="deflate")
    good = path.read_bytes()
    entry = Archive(str(path)).entries["a.memmap"]
    patch_at(path, entry.central + 16, struct.pack("<I", entry.crc ^ 1))
    with pytest.raises(CorruptDataError, match="CRC"):
        TensorDict.load(path)
    path.write_bytes(good)
    patch_at(path, entry.data + entry.csize // 2, bytes(16))
    with pytest.raises(CorruptDataError, match=r"a\.memmap"):
        TensorDict.load(path)
    path.write_bytes(good)  # a declared size smaller than the data: never decompressed past it
    patch_at(path, entry.central + 24, struct.pack("<I", 100))
    with pytest.raises(CorruptDataError):
        TensorDict.load(path)


def test_bad_crc_on_metadata(small: Path) -> None:
    patch(small, b'"dtype": "torch.float32"', b'"dtype": "torch.float64"', count=1)
    with pytest.raises(CorruptDataError, match="CRC"):
        TensorDict.load(small)


def test_encrypted_and_duplicate_entries(small: Path, tmp_path: Path) -> None:
    entry = Archive(str(small)).entries["abc.memmap"]
    patch_at(small, entry.central + 8, struct.pack("<H", 1))
    with pytest.raises(CorruptDataError, match="encrypted"):
        TensorDict.load(small)
    dup = tmp_path / "dup.tdz"
    with warnings.catch_warnings(), zipfile.ZipFile(dup, "w") as z:
        warnings.simplefilter("ignore")
        z.writestr("meta.json", b"{}")
        z.writestr("meta.json", b"{}")
    with pytest.raises(CorruptDataError, match="twice"):
        TensorDict.load(dup)


def test_files_that_are_not_archives(tmp_path: Path) -> None:
    (tmp_path / "junk.tdz").write_bytes(b"not a zip at all" * 10)
    with pytest.raises(ValueError, match="not a memory-mapped tensordict archive"):
        TensorDict.load(tmp_path / "junk.tdz")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("hello.txt", b"hi")
    with pytest.raises(ValueError, match=r"no top-level meta\.json"):
        TensorDict.load(tmp_path / "other.zip")


# -- pickling ---------------------------------------------------------------------------------
def _child_sum(td: TensorDict, q: Any) -> None:
    a, b = td["a"], td["n", "b"]
    q.put((float(a.sum()), float(b.sum()), a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()))


def test_pickles_as_a_handle_to_a_spawned_process(tmp_path: Path) -> None:
    sizes = []
    for n in (10, 1 << 20):
        td = TensorDict(a=torch.ones(n), n=TensorDict(b=torch.full((3,), 2.0), batch_size=[]), batch_size=[])
        sizes.append(len(pickle.dumps(td.save(tmp_path / f"{n}.tdz"))))
    assert max(sizes) < 1500 and abs(sizes[1] - sizes[0]) < 64
    loaded = TensorDict.load(tmp_path / f"{1 << 20}.tdz")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_sum, args=(loaded, q))
    p.start()
    try:
        assert q.get(timeout=60) == (float(1 << 20), 6.0, True)
    finally:
        p.join(timeout=60)
    assert p.exitcode == 0
    again = pickle.loads(pickle.dumps(loaded))
    assert again["a"]._offset == loaded["a"]._offset and torch.equal(again["a"], loaded["a"])
    view = pickle.loads(pickle.dumps(loaded["a"][5:9]))
    assert (
        torch.equal(view, loaded["a"][5:9])
        and view.untyped_storage().data_ptr() == again["a"].untyped_storage().data_ptr()
    )
    handle = pickle.dumps(loaded)
    TensorDict(a=torch.zeros(3), batch_size=[]).save(tmp_path / f"{1 << 20}.tdz")  # replaced: the bytes moved
    with pytest.raises(RuntimeError, match="replaced"):
        pickle.loads(handle)


# -- command line and tools -------------------------------------------------------------------
def test_cli_pack_info_unpack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tdshare.__main__ import main

    td = make_td()
    td.memmap(tmp_path / "folder")
    cmd = [sys.executable, "-m", "tdshare", "pack", str(tmp_path / "folder"), str(tmp_path / "p.tdz")]
    out = subprocess.run([*cmd, "--compression", "deflate"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / "p.tdz"), out.stderr
    assert main(["info", str(tmp_path / "p.tdz")]) == 0
    info = capsys.readouterr().out
    assert "nested/deeper/y  float32  [3]" in info and "obj  <pickled>" in info and "text  'hello'" in info
    assert main(["unpack", str(tmp_path / "p.tdz"), str(tmp_path / "back")]) == 0
    for p in (tmp_path / "folder").rglob("*"):
        if p.is_file():
            assert (tmp_path / "back" / p.relative_to(tmp_path / "folder")).read_bytes() == p.read_bytes()
    assert main(["pack", str(tmp_path / "folder"), str(tmp_path / "q.tdz"), "--compression", "zstd"]) == 1
    assert "Unknown compression" in capsys.readouterr().err


def test_pack_unpack_functions(saved: tuple[TensorDict, Path], tmp_path: Path) -> None:
    td, path = saved
    unpack_memmap(path, tmp_path / "out")
    assert describe(TensorDict.load(tmp_path / "out", allow_pickle=True)) == describe(td)
    pack_memmap(tmp_path / "out", tmp_path / "again.tdz")
    assert [i.filename for i in zipfile.ZipFile(path).infolist()] == [
        i.filename for i in zipfile.ZipFile(tmp_path / "again.tdz").infolist()
    ]
    assert describe(TensorDict.load(tmp_path / "again.tdz", allow_pickle=True)) == describe(td)
    with pytest.raises(FileNotFoundError):
        pack_memmap(tmp_path / "nothing", tmp_path / "x.tdz")


@pytest.mark.parametrize("compression", [None, "deflate"])
def test_unzip_accepts_it(saved: tuple[TensorDict, Path], tmp_path: Path, compression: str | None) -> None:
    td, _ = saved
    path = tmp_path / "u.tdz"
    td.save(path, compression=compression)
    assert zipfile.ZipFile(path).testzip() is None
    if shutil.which("unzip") is None:
        pytest.skip("no unzip binary: checked with zipfile.testzip only")
    out = subprocess.run(["unzip", "-t", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and "No errors detected" in out.stdout, out.stdout
    subprocess.run(["unzip", "-q", str(path), "-d", str(tmp_path / "x")], check=True)
    assert describe(TensorDict.load(tmp_path / "x", allow_pickle=True)) == describe(td)


# -- compatibility with tensordict 0.15.3 ------------------------------------------------------
def _compat_td(lib: Any) -> Any:
    td = lib.TensorDict(
        {"a": torch.arange(12.0).reshape(3, 4), "n": {"b": torch.ones(3, 2, dtype=torch.int16)}}, batch_size=[3]
    )
    td["n", "deeper", "c"] = torch.arange(3, dtype=torch.float64)
    td["text"] = "hello"
    td["n", "label"] = "x"
    td["obj"] = Point(3)
    return td


@pytest.mark.parametrize("compression", [None, "deflate"])
def test_tensordict_loads_ours(tmp_path: Path, compression: str | None) -> None:
    tensordict = pytest.importorskip("tensordict")
    path = tmp_path / "ours.tdz"
    ours = _compat_td(tdshare)
    ours["empty"] = torch.zeros(3, 0)
    ours.save(path, compression=compression)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        theirs = tensordict.TensorDict.load(path)
    assert describe(theirs) == describe(ours)


@pytest.mark.parametrize("compression", [None, "deflate"])
def test_we_load_tensordicts(tmp_path: Path, compression: str | None) -> None:
    tensordict = pytest.importorskip("tensordict")
    path = tmp_path / "theirs.tdz"
    theirs = _compat_td(tensordict)
    theirs.save(path, compression=compression)
    ours = TensorDict.load(path, allow_pickle=True)
    assert describe(ours) == describe(theirs)
    if compression is None:
        assert ours["a"].untyped_storage().data_ptr() == ours["n", "b"].untyped_storage().data_ptr()
    assert ours["text"] == "hello" and ours["obj"] == Point(3)


def test_cli_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """verify loads with every check (archive CRCs included) and unpickles only when allowed."""
    from tdshare.__main__ import main

    folder, archive = tmp_path / "f", tmp_path / "a.tdz"
    TensorDict(a=torch.arange(10.0), s={1, 2}, n={"b": torch.ones(10)}, batch_size=[10]).save(folder)
    TensorDict(a=torch.arange(10.0), batch_size=[10]).save(archive)
    assert main(["verify", str(folder)]) == 1  # a pickled value, not allowed
    assert "Refusing to load the pickled" in capsys.readouterr().err
    assert main(["verify", str(folder), "--allow-pickle"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok:") and "3 leaves" in out and "batch size [10]" in out
    assert main(["verify", str(archive)]) == 0
    assert "2 entry CRCs" in capsys.readouterr().out
    # flip one payload byte of the stored leaf: its CRC no longer matches
    data = bytearray(archive.read_bytes())
    at = bytes(data).index(bytes(torch.arange(10.0).numpy().tobytes()[:8]))
    data[at] ^= 0xFF
    archive.write_bytes(bytes(data))
    assert main(["verify", str(archive)]) == 1
    assert "CRC-32" in capsys.readouterr().err
    (folder / "a.memmap").write_bytes(b"\0" * 20)  # truncated leaf
    assert main(["verify", str(folder), "--allow-pickle"]) == 1
    assert "truncated" in capsys.readouterr().err


def test_copy_existing_false_refuses_leaves_mapped_elsewhere(tmp_path: Path) -> None:
    """The page: a leaf already memory-mapped to another file raises with copy_existing=False, for an
    archive too (tensordict 0.15.3 silently copies it); copy_existing=True copies."""
    td = make_td().memmap_(tmp_path / "folder")
    with pytest.raises(RuntimeError, match="copy_existing=True") as info:
        td.save(tmp_path / "a.tdz")
    assert str(tmp_path / "a.tdz") in str(info.value) and str(tmp_path / "folder") in str(info.value)
    assert not (tmp_path / "a.tdz").exists() and os.listdir(tmp_path) == ["folder"]
    out = td.save(tmp_path / "a.tdz", copy_existing=True)
    assert (out == td).all()
    loaded = TensorDict.load(tmp_path / "a.tdz", allow_pickle=True)
    assert (loaded.save(tmp_path / "b.tdz") == td).all()  # leaves of an archive are not "a file elsewhere"


def test_is_memmap_archive_recognises_archives_only(tmp_path: Path) -> None:
    TensorDict(a=torch.zeros(3)).save(tmp_path / "td.tdz")
    TensorDict(a=torch.zeros(3)).save(tmp_path / "folder")
    (tmp_path / "junk.tdz").write_bytes(b"PK\x03\x04 not a zip")
    cases = [tmp_path / "td.tdz", tmp_path / "folder", tmp_path / "junk.tdz", tmp_path / "missing.tdz"]
    assert [tdshare.is_memmap_archive(p) for p in cases] == [True, False, False, False]
    assert [tensordict.is_memmap_archive(p) for p in cases[:2]] == [True, False]  # as the reference
