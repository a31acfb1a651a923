"""The write path: memmap_, memmap, save/dumps into folders and anonymous memory (issue 3).

Every test writes real files under ``tmp_path`` and checks values, not only that no error was
raised.  Failures are injected by monkeypatching ``tdshare._files._write_all``, which writes the bytes of
every file (leaf files one at a time, in batches and in threads; metadata too).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import COMMON_DTYPES, FLOAT8_DTYPES, assert_same_tensordict, plain

import tdshare
import tdshare._atomic
import tdshare._files
import tdshare._leaf_files
import tdshare._write
from tdshare import MemoryMappedTensor, TensorDict, TensorDictFuture


# -- helpers ------------------------------------------------------------------------------------
def _make(value: float = 0.0) -> TensorDict:
    return TensorDict(
        {
            "a": torch.arange(12, dtype=torch.float32).reshape(3, 4) + value,
            "b": torch.tensor([True, False, True]),
            "n": {
                "c": torch.arange(3, dtype=torch.int64) + int(value),
                "m": {"d": torch.full((3, 2), value, dtype=torch.float16)},
            },
            "s": "hello",
        },
        batch_size=[3],
    )


def _tensor_leaves(td: TensorDict) -> dict[Any, torch.Tensor]:
    return {k: v for k, v in td.items(True, True) if isinstance(v, torch.Tensor)}


def _assert_equal(a: TensorDict, b: TensorDict) -> None:
    assert_same_tensordict(a, b, ordered=False, bitwise=True)


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root``: (inode, bytes)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = (os.stat(path).st_ino, Path(path).read_bytes())
    return out


def _files(root: Path) -> set[str]:
    return set(_snapshot(root)) if root.exists() else set()


def _staging_left(parent: Path) -> list[str]:
    return [n for n in os.listdir(parent) if n.startswith(tdshare._atomic.STAGING_PREFIX)]


class _Failer:
    """Counts leaf writes; the third one while armed raises OSError."""

    def __init__(self) -> None:
        self.calls = 0
        self.armed = True


def _file_of(fd: int) -> str:
    """The path of the file open as ``fd`` (leaf files are written by more than one loop: a test
    that watches them patches ``os.write``)."""
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def fail_third_leaf(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Failer]:
    real = os.write
    failer = _Failer()

    def failing(fd: int, data: Any) -> int:
        if failer.armed and _file_of(fd).endswith(".memmap"):
            failer.calls += 1
            if failer.calls == 3:
                raise OSError("injected failure on the third leaf")
        return real(fd, data)

    monkeypatch.setattr(os, "write", failing)
    yield failer


# -- memmap_ ------------------------------------------------------------------------------------
def test_memmap_inplace_maps_every_leaf(tmp_path: Path) -> None:
    td = _make(1.0)
    expected = td.clone()
    ptrs = {k: v.data_ptr() for k, v in _tensor_leaves(td).items()}
    nested = td["n"]
    out = td.memmap_(tmp_path / "td")
    assert out is td and td["n"] is nested
    for key, leaf in _tensor_leaves(td).items():
        assert isinstance(leaf, MemoryMappedTensor), key
        assert leaf.data_ptr() != ptrs[key], key
        assert leaf.filename.startswith(str(tmp_path / "td") + os.sep)
    assert td["n", "m", "d"].filename == str(tmp_path / "td" / "n" / "m" / "d.memmap")
    assert td.device == torch.device("cpu") and td["n", "m"].device == torch.device("cpu")
    assert td.is_memmap() and td.is_locked
    assert td["n"].is_memmap() and td["n"].is_locked and td["n", "m"].is_locked
    assert td.saved_path == str(tmp_path / "td")
    _assert_equal(td, expected)


def test_memmap_inplace_on_cpu_device_td(tmp_path: Path) -> None:
    td = TensorDict(a=torch.ones(2), batch_size=[2], device="cpu")
    td.memmap_(tmp_path / "td")
    assert td.device == torch.device("cpu") and isinstance(td["a"], MemoryMappedTensor)


def test_locked_after_memmap_allows_in_place_writes_only(tmp_path: Path) -> None:
    td = _make().memmap_(tmp_path / "td")
    td["a"][0] = 100.0
    td.set_(("n", "c"), torch.tensor([7, 8, 9]))
    with pytest.raises(RuntimeError, match="set_"):
        td["new"] = torch.zeros(3)
    with pytest.raises(RuntimeError):
        td["a"] = torch.zeros(3, 4)
    with pytest.raises(RuntimeError):
        del td["b"]
    loaded = TensorDict.load(tmp_path / "td")
    assert loaded["a"][0].tolist() == [100.0] * 4
    assert loaded["n", "c"].tolist() == [7, 8, 9]


def test_unlock_clears_is_memmap_and_relock_keeps_it_false(tmp_path: Path) -> None:
    td = _make().memmap_(tmp_path / "td")
    assert td.is_memmap()
    td.unlock_()
    assert not td.is_memmap() and not td["n"].is_memmap() and not td.is_locked
    td.lock_()
    assert td.is_locked and not td.is_memmap()
    with pytest.raises(AttributeError):
        _ = td.saved_path
    with td.unlock_():
        pass
    assert td.is_locked and not td.is_memmap()


def test_memmap_returns_a_copy_and_leaves_the_original(tmp_path: Path) -> None:
    td = _make(2.0)
    before = {k: (v, v.data_ptr()) for k, v in _tensor_leaves(td).items()}
    copy = td.memmap(tmp_path / "td")
    assert copy is not td and copy["n"] is not td["n"]
    assert copy.is_memmap() and copy.is_locked and copy["n", "m"].is_memmap()
    assert not td.is_memmap() and not td.is_locked
    for key, (leaf, ptr) in before.items():
        assert td.get(key) is leaf and leaf.data_ptr() == ptr and not isinstance(leaf, MemoryMappedTensor)
        assert isinstance(copy.get(key), MemoryMappedTensor)
    _assert_equal(copy, td)
    copy["a"][0] = -1.0
    assert td["a"][0, 0] == 2.0
    assert TensorDict.load(tmp_path / "td")["a"][0, 0] == -1.0


@pytest.mark.parametrize("method", ["save", "dumps"])
def test_save_is_memmap_existsok_true(tmp_path: Path, method: str) -> None:
    _make(1.0).save(tmp_path / "td")
    td = _make(5.0)
    out = getattr(td, method)(tmp_path / "td")  # existing files: overwritten (existsok=True)
    assert out is not td and out.is_memmap() and not td.is_memmap()
    _assert_equal(TensorDict.load(tmp_path / "td"), td)
    with pytest.raises(TypeError):
        getattr(td, method)(tmp_path / "td", existsok=False)
    assert tdshare.save(td, tmp_path / "other").is_memmap()
    assert tdshare.memmap(td, tmp_path / "third")["a"].filename == str(tmp_path / "third" / "a.memmap")


def test_prefix_none_writes_into_the_own_folder(tmp_path: Path) -> None:
    td = TensorDict(a=torch.zeros(3), batch_size=[3]).memmap_(tmp_path / "td")
    with td.unlock_():
        td["new"] = torch.arange(3.0)
    td.memmap_()
    assert td.is_memmap() and td["new"].filename == str(tmp_path / "td" / "new.memmap")
    assert td["a"].filename == str(tmp_path / "td" / "a.memmap")
    assert TensorDict.load(tmp_path / "td")["new"].tolist() == [0.0, 1.0, 2.0]


def test_prefix_none_without_folder_uses_anonymous_memory(tmp_path: Path) -> None:
    td = _make(3.0)
    expected = td.clone()
    td.memmap_()
    assert td.is_memmap() and td.is_locked
    for leaf in _tensor_leaves(td).values():
        assert isinstance(leaf, MemoryMappedTensor) and leaf.is_anonymous
        with pytest.raises(RuntimeError):
            _ = leaf.filename
    assert td.saved_path is None  # as the reference's: memory-mapped, to no folder
    _assert_equal(td, expected)
    copy = _make().memmap()
    assert copy["a"].is_anonymous


# -- the folder format --------------------------------------------------------------------------
class _Opaque:
    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Opaque) and other.x == self.x


def test_folder_format(tmp_path: Path) -> None:
    td = _make(1.0)
    td["obj"] = {1, 2, 3}  # not JSON: pickled
    td.memmap_(tmp_path / "td")
    root = tmp_path / "td"
    assert _files(root) == {
        "meta.json",
        "a.memmap",
        "b.memmap",
        "n/meta.json",
        "n/c.memmap",
        "n/m/meta.json",
        "n/m/d.memmap",
        "s/meta.json",
        "obj/meta.json",
        "obj/other.pickle",
    }
    meta = json.loads((root / "meta.json").read_text())
    assert list(meta) == ["a", "b", "n", "s", "obj", "shape", "device", "_type", "_format_version", "_class"]
    assert meta["a"] == {"device": "cpu", "shape": [3, 4], "dtype": "torch.float32", "is_nested": False}
    assert meta["b"]["dtype"] == "torch.bool"
    assert meta["n"] == {"type": "TensorDict"} and meta["s"] == {"type": "NonTensorData"}
    assert meta["shape"] == [3] and meta["device"] == "cpu" and meta["_format_version"] == 1
    assert meta["_type"] == "<class 'tensordict._td.TensorDict'>" and meta["_class"] == "tensordict:TensorDict"
    assert json.loads((root / "n" / "m" / "meta.json").read_text())["d"]["shape"] == [3, 2]
    assert (root / "a.memmap").read_bytes() == (torch.arange(12, dtype=torch.float32) + 1).numpy().tobytes()
    assert (root / "b.memmap").read_bytes() == b"\x01\x00\x01"
    s_meta = json.loads((root / "s" / "meta.json").read_text())
    assert s_meta["data"] == "hello" and s_meta["_is_non_tensor"] is True
    obj_meta = json.loads((root / "obj" / "meta.json").read_text())
    assert "data" not in obj_meta
    assert pickle.loads((root / "obj" / "other.pickle").read_bytes()) == {"data": {1, 2, 3}}


@pytest.mark.parametrize("robust_key", [True, False])
def test_meta_json_is_exactly_what_json_dumps_writes(tmp_path: Path, robust_key: bool) -> None:
    # leaf entries are joined from cached text: the bytes must still be json.dumps' own
    keys = ["x", "x_1", "é", "with space", 'q"uote', "back\\slash", "tab\t", "名前", "a-b.c", "x" * 80, "_private"]
    if not robust_key:
        keys = [k for k in keys if "\\" not in k]
    leaves = {k: torch.full((2, i + 1), float(i)) for i, k in enumerate(keys)}
    half = len(keys) // 2  # a run of other entries between leaves, and another before the level's fields
    td = TensorDict(
        dict(list(leaves.items())[:half])
        | {"sub": TensorDict(y=torch.ones(2), batch_size=[2]), "note": "in between"}
        | dict(list(leaves.items())[half:])
        | {"zero_d": torch.zeros(2), "big": torch.zeros(2, 3, 4, 5, dtype=torch.int16), "s": "text"},
        batch_size=[2],
        names=["t"],
    )
    td.save(tmp_path / "td", robust_key=robust_key)
    raw = (tmp_path / "td" / "meta.json").read_bytes()
    meta = json.loads(raw)
    assert raw == json.dumps(meta).encode("utf-8")
    assert [k for k in meta if k in leaves] == keys
    assert list(meta)[half : half + 2] == ["sub", "note"]
    assert (tmp_path / "td" / "sub" / "meta.json").read_bytes() == json.dumps(
        json.loads((tmp_path / "td" / "sub" / "meta.json").read_bytes())
    ).encode("utf-8")
    assert meta["big"] == {"device": "cpu", "shape": [2, 3, 4, 5], "dtype": "torch.int16", "is_nested": False}
    assert meta["_names"] == ["t"]
    loaded = TensorDict.load(tmp_path / "td", robust_key=robust_key)
    assert [loaded[k][0, -1].item() for k in keys] == [float(i) for i in range(len(keys))]
    assert loaded["note"] == "in between" and loaded["sub", "y"].tolist() == [1.0, 1.0]


def _child_tmp_name(path: str, out: Any) -> None:
    out.put(tdshare._files.tmp_name(path))


def test_temporary_names_are_unique_per_call_and_in_forked_children(tmp_path: Path) -> None:
    # a fork child inherits the counter, so it must draw a token of its own
    import multiprocessing

    path = str(tmp_path / "meta.json")
    names = [tdshare._files.tmp_name(path) for _ in range(1000)]
    assert len(set(names)) == 1000
    assert {os.path.dirname(n) for n in names} == {str(tmp_path)}
    assert all(os.path.basename(n).startswith(f".meta.json.tdshare-{os.getpid()}-") for n in names)
    if "fork" not in multiprocessing.get_all_start_methods():
        return
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_child_tmp_name, args=(path, out))
    proc.start()
    child = out.get(timeout=60)
    proc.join(60)
    token = lambda name: name.rsplit("-", 1)[1][:8]  # noqa: E731
    assert proc.exitcode == 0 and child not in names
    assert token(child) != token(names[-1]) and token(names[0]) == token(names[-1])


def test_names_are_saved(tmp_path: Path) -> None:
    td = TensorDict(a=torch.zeros(2, 3), n={"b": torch.zeros(2)}, batch_size=[2], names=["time"])
    td.save(tmp_path / "td")
    assert json.loads((tmp_path / "td" / "meta.json").read_text())["_names"] == ["time"]
    loaded = TensorDict.load(tmp_path / "td")
    assert loaded.names == ["time"] and loaded["n"].names == ["time"]


def test_leaf_data_is_written_before_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_write, real_replace = os.write, os.replace

    metas: set[str] = set()

    def meta(path: str) -> None:
        if os.path.basename(path) == "meta.json" and path not in metas:
            metas.add(path)
            events.append("meta")

    def write(fd: int, data: Any) -> int:  # every file's bytes, whichever loop writes them
        path = _file_of(fd)
        if path.endswith(".memmap"):
            events.append("leaf")
        meta(path)  # a level below the root of a new tree writes its meta.json in place
        return real_write(fd, data)

    def replace(src: Any, dst: Any) -> None:
        meta(os.fspath(dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "replace", replace)
    _make().save(tmp_path / "td")
    monkeypatch.undo()
    assert events.count("leaf") == 4 and events.count("meta") == 4  # 3 levels and the non-tensor "s"
    assert max(i for i, e in enumerate(events) if e == "leaf") < events.index("meta")


def test_failed_write_leaves_no_metadata_and_td_unchanged(tmp_path: Path, fail_third_leaf: _Failer) -> None:
    td = _make()
    leaves = _tensor_leaves(td)
    with pytest.raises(OSError, match="third leaf"):
        td.memmap_(tmp_path / "td")
    assert not any(name.endswith("meta.json") for name in _files(tmp_path / "td"))
    assert not td.is_memmap() and not td.is_locked
    assert all(td.get(k) is v for k, v in leaves.items())


def test_failed_resave_keeps_the_old_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(1.0).save(tmp_path / "td")
    meta_before = {k: v for k, v in _snapshot(tmp_path / "td").items() if k.endswith("meta.json")}
    real = tdshare._files._write_all
    calls = [0]

    def failing(fd: int, data: Any, path: str) -> None:
        calls[0] += ".memmap" in path  # a staged leaf file: .<name>.memmap.tdshare-*.tmp
        if calls[0] == 3:
            raise OSError("injected")
        real(fd, data, path)

    monkeypatch.setattr(tdshare._files, "_write_all", failing)
    bigger = TensorDict({"a": torch.zeros(3, 9), "b": torch.zeros(3), "z": torch.zeros(3), "y": torch.ones(3)}, [3])
    with pytest.raises(OSError):
        bigger.save(tmp_path / "td")
    after = _snapshot(tmp_path / "td")
    assert {k: v for k, v in after.items() if k.endswith("meta.json")} == meta_before


# -- leaf files written as one batch per new folder -------------------------------------------------
def _batchable() -> TensorDict:
    # many small leaves per level, a large one, a complex one, an empty one and a reused one among them
    return TensorDict(
        {
            **{f"x{i}": torch.arange(4, dtype=torch.float32) + i for i in range(5)},
            "big": torch.arange(70_000, dtype=torch.float64),
            "cplx": torch.tensor([1 + 2j, 3 - 4j]).conj(),
            "empty": torch.zeros(0),
            "n": TensorDict({f"y{i}": torch.full((2, 3), i, dtype=torch.int16) for i in range(3)}, []),
        },
        batch_size=[],
    )


def _check_batchable(out: TensorDict) -> None:
    expected = _batchable()
    for key in [*(f"x{i}" for i in range(5)), "big", "cplx", "empty", ("n", "y0"), ("n", "y2")]:
        assert torch.equal(out[key], expected[key]), key
    for leaf in out.values(include_nested=True, leaves_only=True):
        if leaf.numel():  # the inode a handle or a refresh checks is the file's
            assert leaf._ino == os.stat(leaf.filename).st_ino, leaf.filename


def _memmap_listing(td: TensorDict, path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[TensorDict, list[str]]:
    """``td.memmap(path)`` and the folders listed for inode numbers meanwhile."""
    listings: list[str] = []
    real = os.scandir

    def scandir(folder: Any) -> Any:
        listings.append(os.fspath(folder))
        return real(folder)

    with monkeypatch.context() as patch:
        patch.setattr(tdshare._files, "scandir", scandir)
        out = td.memmap(path)
    return out, sorted(listings)


def test_batched_leaves_get_their_files_inodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, listings = _memmap_listing(_batchable(), tmp_path / "td", monkeypatch)
    assert listings == [str(tmp_path / "td"), str(tmp_path / "td" / "n")]  # one listing per new folder
    _check_batchable(out)
    _check_batchable(TensorDict.load(tmp_path / "td"))


def test_batched_leaves_when_listings_disagree_with_fstat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # overlayfs and some FUSE file systems list other inode numbers than fstat reports
    listings = [0]
    real = os.scandir

    class Wrong:
        def __init__(self, entry: os.DirEntry) -> None:
            self.name = entry.name
            self._ino = entry.inode() + 1_000_000

        def inode(self) -> int:
            return self._ino

    @contextlib.contextmanager
    def scandir(path: Any) -> Iterator[list[Wrong]]:
        listings[0] += 1
        with real(path) as entries:
            yield [Wrong(e) for e in entries]

    monkeypatch.setattr(tdshare._files, "scandir", scandir)
    out = _batchable().memmap(tmp_path / "td")
    monkeypatch.undo()
    assert listings[0] == 1  # the first disagreement settles it for the rest of the write
    _check_batchable(out)


def test_batched_leaves_in_a_folder_that_cannot_be_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def scandir(folder: Any) -> Any:  # a folder with write but no read permission (root ignores modes)
        raise PermissionError(13, "Permission denied", os.fspath(folder))

    monkeypatch.setattr(tdshare._files, "scandir", scandir)
    out = _batchable().memmap(tmp_path / "td")
    monkeypatch.undo()
    _check_batchable(out)


def test_failure_inside_a_batch_removes_the_half_written_file(tmp_path: Path, fail_third_leaf: _Failer) -> None:
    td = _batchable()  # the level "n" is written first: y0, y1, then y2 fails
    with pytest.raises(OSError, match="third leaf"):
        td.memmap_(tmp_path / "td")
    # a first write that fails removes what it wrote: no folder with leaf files but no meta.json
    assert not (tmp_path / "td").exists()
    assert not td.is_memmap() and not td.is_locked and type(td["n", "y0"]) is torch.Tensor


def test_batch_into_an_existing_empty_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "td").mkdir()  # as tempfile.mkdtemp() gives
    out, listings = _memmap_listing(_batchable(), tmp_path / "td", monkeypatch)
    assert listings == [str(tmp_path / "td"), str(tmp_path / "td" / "n")]
    _check_batchable(out)


def test_batch_into_a_folder_that_existed_uses_no_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "td").mkdir()
    (tmp_path / "td" / "x0.memmap").write_bytes(b"old")  # replaced by a new inode, never rewritten in place
    old_ino = os.stat(tmp_path / "td" / "x0.memmap").st_ino
    out, listings = _memmap_listing(_batchable(), tmp_path / "td", monkeypatch)
    assert listings == [str(tmp_path / "td" / "n")]  # only the new sub-folder is listed for inodes
    _check_batchable(out)
    assert out["x0"]._ino != old_ino


def _joinable_mix() -> dict[str, torch.Tensor]:
    # small leaves of one folder: runs that torch.cat can join, broken by every kind of leaf that cannot be
    base = torch.arange(12, dtype=torch.float32)
    return {
        "a0": base[:4] + 1,
        "a1": base[4:8].clone(),
        "a2": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # joins on shape[1:] only: a new run
        "m0": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "m1": torch.arange(9, dtype=torch.float32).reshape(3, 3) * -1,
        "m2": torch.ones(1, 3).expand(4, 3),  # expanded: no memory of its own
        "g0": torch.linspace(0, 1, 5, requires_grad=True),  # requires grad
        "g1": torch.full((5,), 7.0),
        "c0": torch.tensor([1 + 2j, 3 - 4j]).conj(),  # conjugate bit: the file holds the conjugate
        "c1": torch.tensor([5 + 6j]),
        "n0": torch.tensor([1.0, -2.0]).conj_physical()._neg_view(),  # negative bit
        "n1": torch.tensor([3.0, 4.0]),
        "b0": torch.tensor([True, False, True]),
        "b1": torch.tensor([False]),
        "s0": torch.tensor(3.5),  # 0-dim: never joined
        "s1": torch.tensor(4.5),
        "h0": torch.arange(3, dtype=torch.float16),
        "f8": torch.arange(4, dtype=torch.float32).to(torch.float8_e4m3fn),  # not in the joinable dtypes
        "f9": torch.arange(4, dtype=torch.float32).to(torch.float8_e4m3fn),
        "big0": torch.arange(2_000, dtype=torch.float32),  # over the join limit: one at a time
        "i0": torch.arange(3, dtype=torch.int64),
        "i1": torch.arange(5, dtype=torch.int64) * 3,
        "u0": torch.arange(4, dtype=torch.uint8),
    }


def test_joined_leaf_bytes_are_each_leafs_own(tmp_path: Path) -> None:
    leaves = _joinable_mix()
    expected = {k: v.detach().resolve_conj().resolve_neg().clone() for k, v in leaves.items()}

    def raw(t: torch.Tensor) -> bytes:
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

    td = TensorDict({**leaves, "n": TensorDict(dict(leaves), [])}, batch_size=[])
    td.memmap_(tmp_path / "td")
    back = TensorDict.load(tmp_path / "td")
    for prefix in ((), ("n",)):
        for key, want in expected.items():
            for got in (td[(*prefix, key)], back[(*prefix, key)]):
                assert got.shape == want.shape and got.dtype == want.dtype, key
                assert raw(got) == raw(want), key
            assert (tmp_path / "td" / Path(*prefix) / f"{key}.memmap").read_bytes() == raw(want), key


def test_leaves_joined_in_runs_of_at_most_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tdshare._leaf_files, "_JOIN_MAX_LEAVES", 3)
    joined: list[int] = []
    real = torch.cat

    def cat(tensors: list[torch.Tensor]) -> torch.Tensor:
        joined.append(len(tensors))
        return real(tensors)

    monkeypatch.setattr(tdshare._leaf_files.torch, "cat", cat)
    td = TensorDict({f"x{i}": torch.full((2,), float(i)) for i in range(8)}, batch_size=[])
    td.memmap_(tmp_path / "td")
    monkeypatch.undo()
    assert joined == [3, 3, 2]
    for i in range(8):
        assert (tmp_path / "td" / f"x{i}.memmap").read_bytes() == torch.full((2,), float(i)).numpy().tobytes()


def test_a_run_that_cannot_be_joined_is_written_leaf_by_leaf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cat(tensors: list[torch.Tensor]) -> torch.Tensor:  # as for leaves on different devices
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(tdshare._leaf_files.torch, "cat", cat)
    leaves = _joinable_mix()
    td = TensorDict(dict(leaves), batch_size=[])
    td.memmap_(tmp_path / "td")
    monkeypatch.undo()
    for key, value in leaves.items():
        want = value.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
        assert (tmp_path / "td" / f"{key}.memmap").read_bytes() == want.numpy().tobytes(), key


@pytest.mark.parametrize("count", [1, 3])  # one leaf; a batch joined by torch.cat
def test_a_leaf_on_the_meta_device_is_refused_by_file_name(tmp_path: Path, count: int) -> None:
    td = TensorDict({f"x{i}": torch.zeros(4, device="meta") for i in range(count)}, batch_size=[])
    with pytest.raises(NotImplementedError, match=r"x0\.memmap.*meta device.*no data"):
        td.memmap_(tmp_path / "td")
    assert not any(name.endswith(".memmap") or name == "meta.json" for name in _files(tmp_path / "td"))
    assert not td.is_memmap() and td["x0"].is_meta


# -- robust_key -----------------------------------------------------------------------------------
@pytest.mark.parametrize("robust_key", [True, None])
def test_robust_key_encodes_names(tmp_path: Path, robust_key: bool | None) -> None:
    td = TensorDict({"a/b": torch.ones(2), "50% x": torch.zeros(2), "n/m": {"c d": torch.ones(2)}}, batch_size=[2])
    td.save(tmp_path / "td", robust_key=robust_key)
    assert _files(tmp_path / "td") == {
        "meta.json",
        "a%2Fb.memmap",
        "50%25%20x.memmap",
        "n%2Fm/meta.json",
        "n%2Fm/c%20d.memmap",
    }
    _assert_equal(TensorDict.load(tmp_path / "td", robust_key=robust_key), td)


def test_robust_key_false_uses_raw_names(tmp_path: Path) -> None:
    td = TensorDict({"a b": torch.ones(2), "50%": torch.zeros(2), "n%": {"c": torch.ones(2)}}, batch_size=[2])
    td.save(tmp_path / "td", robust_key=False)
    assert _files(tmp_path / "td") == {"meta.json", "a b.memmap", "50%.memmap", "n%/meta.json", "n%/c.memmap"}
    _assert_equal(TensorDict.load(tmp_path / "td", robust_key=False), td)


@pytest.mark.parametrize(
    "entries",
    [
        {"a/b": torch.ones(2)},
        {"x\\y": torch.ones(2)},
        {"": {"c": torch.ones(2)}},
        {"..": {"c": torch.ones(2)}},
        {".": {"c": torch.ones(2)}},
        {"n": {"../evil": torch.ones(2)}},
        {"s/t": "text"},
    ],
)
def test_robust_key_false_refuses_unsafe_names(tmp_path: Path, entries: dict) -> None:
    td = TensorDict(entries, batch_size=[2])
    with pytest.raises(ValueError, match="robust_key"):
        td.save(tmp_path / "td", robust_key=False)
    assert not (tmp_path / "td").exists()


def test_keys_that_would_share_a_file_name_are_refused(tmp_path: Path) -> None:
    td = TensorDict({"a": torch.zeros(2), "a.memmap": {"b": torch.zeros(2)}}, batch_size=[2])
    with pytest.raises(ValueError, match=r"a\.memmap"):
        td.save(tmp_path / "td")
    assert not (tmp_path / "td").exists()


# -- copy_existing / existsok ---------------------------------------------------------------------
def test_leaf_mapped_elsewhere_needs_copy_existing(tmp_path: Path) -> None:
    td = _make(1.0).memmap_(tmp_path / "one")
    with pytest.raises(RuntimeError, match="copy_existing"):
        td.memmap_(tmp_path / "two")
    with pytest.raises(RuntimeError, match="copy_existing"):
        td.memmap(tmp_path / "two")
    assert not any(name.endswith(".memmap") for name in _files(tmp_path / "two"))
    assert td["a"].filename == str(tmp_path / "one" / "a.memmap")
    copy = td.memmap(tmp_path / "two", copy_existing=True)
    assert copy["a"].filename == str(tmp_path / "two" / "a.memmap")
    _assert_equal(copy, td)
    copy["a"][0] = -5.0  # an independent copy
    assert td["a"][0, 0] == 1.0
    td.memmap_(tmp_path / "three", copy_existing=True)
    assert td["n", "m", "d"].filename == str(tmp_path / "three" / "n" / "m" / "d.memmap")


def test_memmap_into_the_same_folder_reuses_mapped_leaves(tmp_path: Path) -> None:
    td = _make().memmap_(tmp_path / "td")
    leaves = _tensor_leaves(td)
    inodes = {k: os.stat(v.filename).st_ino for k, v in leaves.items()}
    td.memmap_(tmp_path / "td")  # existsok=True: nothing to write, every leaf kept as it is
    assert all(td.get(k) is v and os.stat(v.filename).st_ino == inodes[k] for k, v in leaves.items())


@pytest.mark.parametrize("prefix", ["same", None])
def test_existsok_false_refuses_the_leafs_own_file(tmp_path: Path, prefix: str | None) -> None:
    """The page: a file that exists at a leaf's path raises with existsok=False, its own file too
    (tensordict 0.15.3 does not raise there; tdshare follows the page)."""
    td = _make().memmap_(tmp_path / "td")
    leaves = _tensor_leaves(td)
    before = _snapshot(tmp_path / "td")
    with pytest.raises(RuntimeError, match=r"already exists and existsok=False.*already maps it.*existsok=True"):
        td.memmap_(tmp_path / "td" if prefix else None, existsok=False)
    assert _snapshot(tmp_path / "td") == before
    assert all(td.get(k) is v for k, v in leaves.items()) and td.is_memmap()


def test_existsok_false_refuses_existing_files_and_writes_nothing(tmp_path: Path) -> None:
    _make(1.0).save(tmp_path / "td")
    before = _snapshot(tmp_path / "td")
    td = _make(9.0)
    td["z"] = torch.zeros(3)
    with pytest.raises(RuntimeError, match="existsok"):
        td.memmap_(tmp_path / "td", existsok=False)
    with pytest.raises(RuntimeError, match="existsok"):
        td.memmap(tmp_path / "td", existsok=False, num_threads=2)
    assert _snapshot(tmp_path / "td") == before
    assert not td.is_memmap() and not isinstance(td["a"], MemoryMappedTensor)
    fresh = td.memmap(tmp_path / "fresh", existsok=False)
    _assert_equal(fresh, td)


# -- threads and futures --------------------------------------------------------------------------
def _wide(value: float = 0.0) -> TensorDict:
    leaves: dict[str, Any] = {f"k{i}": torch.full((3, 64), value + i) for i in range(6)}
    leaves["n"] = {"x": torch.full((3,), value)}
    return TensorDict(leaves, batch_size=[3])


def test_num_threads_writes_the_same_files(tmp_path: Path) -> None:
    out = _wide(1.0).memmap(tmp_path / "td", num_threads=3)
    assert isinstance(out, TensorDict) and out.is_memmap()
    _assert_equal(TensorDict.load(tmp_path / "td"), _wide(1.0))


def test_return_early_gives_a_future(tmp_path: Path) -> None:
    td = _wide(2.0)
    future = td.memmap_(tmp_path / "td", num_threads=2, return_early=True)
    assert isinstance(future, TensorDictFuture)
    result = future.result()
    assert result is td and td.is_memmap() and td.is_locked
    assert td["k5"].filename == str(tmp_path / "td" / "k5.memmap")
    _assert_equal(TensorDict.load(tmp_path / "td"), _wide(2.0))
    copy_future = _wide(3.0).memmap(tmp_path / "copy", num_threads=2, return_early=True)
    assert isinstance(copy_future, TensorDictFuture)
    _assert_equal(copy_future.result(), _wide(3.0))


def test_return_early_without_threads_returns_the_td(tmp_path: Path) -> None:
    td = _wide()
    assert td.memmap_(tmp_path / "td", num_threads=1, return_early=True) is td
    assert td.is_memmap()


def test_many_concurrent_early_writes(tmp_path: Path) -> None:
    futures = [_wide(float(i)).memmap(tmp_path / f"td{i}", num_threads=2, return_early=True) for i in range(8)]
    assert [f.result()["k0"][0, 0].item() for f in futures] == [float(i) for i in range(8)]


def test_worker_errors_are_raised_by_result(tmp_path: Path, fail_third_leaf: _Failer) -> None:
    td = _wide()
    future = td.memmap_(tmp_path / "td", num_threads=2, return_early=True)
    with pytest.raises(OSError, match="third leaf"):
        future.result()
    assert not (tmp_path / "td" / "meta.json").exists()
    assert not td.is_memmap() and not isinstance(td["k0"], MemoryMappedTensor)


def test_worker_errors_are_raised_without_return_early(tmp_path: Path, fail_third_leaf: _Failer) -> None:
    with pytest.raises(OSError, match="third leaf"):
        _wide().memmap(tmp_path / "td", num_threads=2)
    assert not (tmp_path / "td" / "meta.json").exists()


def test_worker_error_is_raised_once_every_thread_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tdshare._files._write_all
    running = [0]

    def slow(fd: int, data: Any, path: str) -> None:
        running[0] += 1
        try:
            if os.path.basename(path) == "k0.memmap":
                raise OSError("injected")
            time.sleep(0.05)
            real(fd, data, path)
        finally:
            running[0] -= 1

    monkeypatch.setattr(tdshare._files, "_write_all", slow)
    with pytest.raises(OSError, match="injected"):
        _wide().memmap(tmp_path / "td", num_threads=2)
    assert running[0] == 0  # no thread still writes into the folder after the error


# -- atomic=True ----------------------------------------------------------------------------------
def test_atomic_into_a_new_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    real = os.write

    def record(fd: int, data: Any) -> int:
        path = _file_of(fd)
        if path.endswith(".memmap"):
            written.append(path)
        assert not (tmp_path / "td").exists()  # nothing at the prefix until the rename
        return real(fd, data)

    monkeypatch.setattr(os, "write", record)
    out = _make(1.0).memmap(tmp_path / "td", atomic=True)
    assert len(written) == 4
    for path in written:  # staged next to the prefix (same file system), then renamed into place
        staging = Path(path).relative_to(tmp_path).parts[0]
        assert staging.startswith(tdshare._atomic.STAGING_PREFIX)
    assert out["n", "m", "d"].filename == str(tmp_path / "td" / "n" / "m" / "d.memmap")
    assert out.saved_path == str(tmp_path / "td")
    _assert_equal(TensorDict.load(tmp_path / "td"), _make(1.0))
    assert _staging_left(tmp_path) == []


def test_atomic_replaces_a_saved_folder_whole(tmp_path: Path) -> None:
    old = TensorDict({"a": torch.zeros(3), "gone": torch.ones(3), "g": {"x": torch.ones(3)}}, batch_size=[3])
    old.save(tmp_path / "td")
    held = TensorDict.load(tmp_path / "td")
    os.chmod(tmp_path / "td", 0o750)
    new = _make(4.0)
    new.memmap_(tmp_path / "td", atomic=True)
    names = _files(tmp_path / "td")
    assert "gone.memmap" not in names and "g/meta.json" not in names
    assert new.is_memmap() and new["a"].filename == str(tmp_path / "td" / "a.memmap")
    _assert_equal(TensorDict.load(tmp_path / "td"), _make(4.0))
    assert held["gone"].tolist() == [1.0, 1.0, 1.0]  # old mappings keep the old bytes
    assert os.stat(tmp_path / "td").st_mode & 0o777 == 0o750
    assert _staging_left(tmp_path) == []


@pytest.mark.parametrize("existsok", [True, False])
def test_atomic_into_an_empty_folder(tmp_path: Path, existsok: bool) -> None:
    (tmp_path / "td").mkdir()
    _make().memmap(tmp_path / "td", atomic=True, existsok=existsok)
    _assert_equal(TensorDict.load(tmp_path / "td"), _make())


def test_atomic_refuses_a_file(tmp_path: Path) -> None:
    (tmp_path / "td").write_text("not a folder")
    with pytest.raises(NotADirectoryError):
        _make().memmap(tmp_path / "td", atomic=True)
    assert (tmp_path / "td").read_text() == "not a folder"
    assert _staging_left(tmp_path) == []


def test_atomic_needs_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefix"):
        _make().memmap(atomic=True)
    td = _make()
    with pytest.raises(ValueError, match="prefix"):
        td.memmap_(atomic=True)
    assert not td.is_memmap()


def test_atomic_refuses_return_early(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="return_early"):
        _make().memmap(tmp_path / "td", atomic=True, num_threads=2, return_early=True)
    assert not (tmp_path / "td").exists()


def test_atomic_refuses_non_empty_with_existsok_false(tmp_path: Path) -> None:
    _make(1.0).save(tmp_path / "td")
    before = _snapshot(tmp_path / "td")
    with pytest.raises(RuntimeError, match="existsok"):
        _make(2.0).memmap(tmp_path / "td", atomic=True, existsok=False)
    assert _snapshot(tmp_path / "td") == before


def test_atomic_refuses_a_folder_without_meta_json(tmp_path: Path) -> None:
    (tmp_path / "td").mkdir()
    (tmp_path / "td" / "precious.txt").write_text("keep me")
    with pytest.raises(RuntimeError, match=r"meta\.json"):
        _make().memmap(tmp_path / "td", atomic=True)
    assert os.listdir(tmp_path / "td") == ["precious.txt"]
    assert _staging_left(tmp_path) == []


def test_atomic_error_half_way_changes_nothing(tmp_path: Path, fail_third_leaf: _Failer) -> None:
    fail_third_leaf.armed = False
    _make(1.0).save(tmp_path / "td")
    fail_third_leaf.armed = True
    before = _snapshot(tmp_path / "td")
    td = _make(2.0)
    leaves = _tensor_leaves(td)
    with pytest.raises(OSError, match="third leaf"):
        td.memmap_(tmp_path / "td", atomic=True)
    assert fail_third_leaf.calls == 3
    assert _snapshot(tmp_path / "td") == before
    assert _staging_left(tmp_path) == []
    assert not td.is_memmap() and not td.is_locked and all(td.get(k) is v for k, v in leaves.items())
    fail_third_leaf.calls = 0
    with pytest.raises(OSError):
        _make(2.0).memmap(tmp_path / "new", atomic=True)
    assert not (tmp_path / "new").exists() and _staging_left(tmp_path) == []


def test_atomic_rolls_back_when_the_final_rename_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(1.0).save(tmp_path / "td")
    before = _snapshot(tmp_path / "td")
    real_rename = os.rename

    def rename(src: Any, dst: Any) -> None:
        if os.path.basename(os.fspath(src)) == "new":
            raise OSError("injected rename failure")
        real_rename(src, dst)

    monkeypatch.setattr(tdshare._atomic.os, "rename", rename)
    monkeypatch.setattr(tdshare._atomic, "exchange", lambda a, b: False)  # the two-rename swap
    with pytest.raises(OSError, match="rename"):
        _make(2.0).memmap(tmp_path / "td", atomic=True)
    monkeypatch.undo()
    assert _snapshot(tmp_path / "td") == before
    assert _staging_left(tmp_path) == []


def test_atomic_over_the_own_folder_needs_copy_existing(tmp_path: Path) -> None:
    td = _make(1.0).memmap_(tmp_path / "td")
    with pytest.raises(RuntimeError, match="copy_existing") as info:
        td.memmap_(atomic=True)
    assert str(tmp_path / "td" / "a.memmap") in str(info.value)
    assert tdshare._atomic.STAGING_PREFIX not in str(info.value)
    assert _staging_left(tmp_path) == []
    with td.unlock_():
        td["extra"] = torch.ones(3)
    td.memmap_(atomic=True, copy_existing=True)
    assert td.is_memmap() and td["extra"].filename == str(tmp_path / "td" / "extra.memmap")
    td["a"][0] = 42.0
    assert TensorDict.load(tmp_path / "td")["a"][0, 0] == 42.0


def test_atomic_through_a_symlinked_prefix(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    out = _make(1.0).memmap(tmp_path / "link", atomic=True)
    assert (tmp_path / "link").is_symlink()
    assert out["a"].filename == str(tmp_path / "link" / "a.memmap")
    _assert_equal(TensorDict.load(tmp_path / "real"), _make(1.0))


# -- refusals -------------------------------------------------------------------------------------
def test_shared_memory_td_cannot_be_memmapped_in_place(tmp_path: Path) -> None:
    td = _make().share_memory_()
    with pytest.raises(RuntimeError, match="shared memory"):
        td.memmap_(tmp_path / "td")
    assert not (tmp_path / "td").exists()
    copy = td.memmap(tmp_path / "copy")
    assert copy.is_memmap() and isinstance(copy["a"], MemoryMappedTensor)


@pytest.mark.parametrize("key", ["shape", "device", "_type", "_format_version", "_class", "_names", "_tdshare_journal"])
@pytest.mark.parametrize("where", ["top", "nested", "non-tensor"])
def test_field_named_keys_are_refused(tmp_path: Path, key: str, where: str) -> None:
    if where == "top":
        td = TensorDict({key: torch.zeros(2)}, batch_size=[2])
    elif where == "nested":
        td = TensorDict({"n": {key: torch.zeros(2)}}, batch_size=[2])
    else:
        td = TensorDict({key: "text"}, batch_size=[2])
    with pytest.raises(ValueError, match=key) as info:
        td.save(tmp_path / "td")
    assert "rename" in str(info.value)
    assert not (tmp_path / "td").exists()


def test_share_non_tensor_in_anonymous_memory() -> None:
    td = _make()
    td.memmap_(share_non_tensor=True)
    assert td.is_memmap() and isinstance(td["a"], MemoryMappedTensor) and td["a"]._segment is not None
    assert td._anon_store is not None and os.path.isdir(os.path.join(td._anon_store[0], "values"))


# -- data round trips -----------------------------------------------------------------------------
DTYPES = [*COMMON_DTYPES, torch.complex32, *FLOAT8_DTYPES]


def _random_of(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Arbitrary bit patterns of ``dtype`` (0/1 for bool)."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), dtype=torch.uint8, generator=g)
    return raw.view(dtype)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips(tmp_path: Path, dtype: torch.dtype) -> None:
    value = _random_of(dtype, (3, 5))
    td = TensorDict({"x": value, "n": {"y": value[:, :2]}}, batch_size=[3])
    td.save(tmp_path / "td")
    assert json.loads((tmp_path / "td" / "meta.json").read_text())["x"]["dtype"] == str(dtype)
    loaded = TensorDict.load(tmp_path / "td")
    assert loaded["x"].dtype == dtype and loaded["n", "y"].dtype == dtype
    assert torch.equal(plain(loaded["x"]).view(torch.uint8), value.view(torch.uint8))
    assert torch.equal(plain(loaded["n", "y"]).view(torch.uint8), value[:, :2].contiguous().view(torch.uint8))
    assert (tmp_path / "td" / "x.memmap").stat().st_size == value.numel() * dtype.itemsize
    in_place = TensorDict({"x": value.clone()}, batch_size=[3]).memmap_(tmp_path / "inplace")
    assert torch.equal(plain(in_place["x"]).view(torch.uint8), value.view(torch.uint8))


def test_odd_layouts_round_trip(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    c = torch.randn(4, 3, dtype=torch.complex64)
    leaves = {
        "transposed": base.t().contiguous().t(),
        "strided": base[:, ::2],
        "expanded": torch.arange(6.0).expand(4, 6),
        "flipped": base.flip(0),
        "sliced": base[:, 1:4],
        "conj": c.conj(),
        "neg": torch._neg_view(c),
        "grad": torch.ones(4, requires_grad=True),
        "scalar_rows": torch.arange(4),
        "empty_tail": torch.zeros(4, 0),
    }
    td = TensorDict(leaves, batch_size=[4])
    expected = {k: v.detach().resolve_conj().resolve_neg().contiguous() for k, v in leaves.items()}
    td.save(tmp_path / "td")
    assert (tmp_path / "td" / "expanded.memmap").stat().st_size == 4 * 6 * 4  # materialized
    assert not (tmp_path / "td" / "empty_tail.memmap").exists()  # zero elements: no file
    loaded = TensorDict.load(tmp_path / "td")
    for key, value in expected.items():
        got = loaded[key]
        assert got.shape == value.shape and got.is_contiguous() and not got.is_conj() and not got.requires_grad, key
        assert torch.equal(plain(got), value), key
    td.memmap_(tmp_path / "inplace")
    for key, value in expected.items():
        assert torch.equal(plain(td[key]), value), key


def test_zero_size_batch_round_trips(tmp_path: Path) -> None:
    td = TensorDict({"z": torch.zeros(0, 4), "n": {"y": torch.zeros(0, dtype=torch.int64)}, "s": "x"}, batch_size=[0])
    td.save(tmp_path / "td")
    loaded = TensorDict.load(tmp_path / "td")
    assert loaded.batch_size == torch.Size([0]) and loaded["z"].shape == (0, 4)
    assert loaded["n", "y"].dtype == torch.int64 and loaded["s"] == "x"
    anonymous = td.clone().memmap_()
    assert anonymous["z"].shape == (0, 4) and anonymous.is_memmap()


KEYS = ["a/b", "50%", "%41", "sp ace", "ünï", "日本", ".", "..", "...", "", "t\tx", "x*?<>|", "meta", "a.b"]


@pytest.mark.parametrize("key", KEYS)
def test_odd_keys_round_trip_exactly(tmp_path: Path, key: str) -> None:
    td = TensorDict(
        {key: torch.arange(3.0), "n": {key: torch.ones(3)}, "d" + key: {key: torch.zeros(3)}, "s" + key: key},
        batch_size=[3],
    )
    td.save(tmp_path / "td")
    assert [n for n in os.listdir(tmp_path) if not n.startswith(".")] == ["td"]  # nothing escaped the folder
    for dirpath, dirnames, filenames in os.walk(tmp_path / "td"):
        for name in dirnames + filenames:
            full = os.path.realpath(os.path.join(dirpath, name))
            assert full.startswith(str(tmp_path / "td") + os.sep), full
    loaded = TensorDict.load(tmp_path / "td")
    assert list(loaded.keys()) == [key, "n", "d" + key, "s" + key]
    assert list(loaded["n"].keys()) == [key] and list(loaded["d" + key].keys()) == [key]
    assert loaded[key].tolist() == [0.0, 1.0, 2.0] and loaded["s" + key] == key
    _assert_equal(loaded, td)


def test_odd_keys_all_in_one_level(tmp_path: Path) -> None:
    td = TensorDict({k: torch.full((2,), float(i)) for i, k in enumerate(KEYS)}, batch_size=[2])
    td.memmap_(tmp_path / "td")
    loaded = TensorDict.load(tmp_path / "td")
    assert list(loaded.keys()) == KEYS
    assert [loaded[k][0].item() for k in KEYS] == [float(i) for i in range(len(KEYS))]


def test_non_json_values_round_trip(tmp_path: Path) -> None:
    td = TensorDict({"set": {1, 2}, "bytes": b"\x00\xff", "obj": _Opaque(3), "tuple": (1, "a")}, batch_size=[])
    td.save(tmp_path / "td")
    loaded = TensorDict.load(tmp_path / "td", allow_pickle=True)
    assert loaded["set"] == {1, 2} and loaded["bytes"] == b"\x00\xff" and loaded["obj"] == _Opaque(3)
    assert loaded["tuple"] == [1, "a"]  # JSON: tuples come back as lists, like the reference


# -- overwriting and non-tensor writes ------------------------------------------------------------
def test_resave_never_rewrites_a_mapped_file_in_place(tmp_path: Path) -> None:
    TensorDict(a=torch.zeros(4), n={"b": torch.zeros(4)}, batch_size=[4]).save(tmp_path / "td")
    held = TensorDict.load(tmp_path / "td")
    inode = os.stat(tmp_path / "td" / "a.memmap").st_ino
    TensorDict(a=torch.ones(4), n={"b": torch.ones(4)}, batch_size=[4]).save(tmp_path / "td")
    assert os.stat(tmp_path / "td" / "a.memmap").st_ino != inode
    assert held["a"].tolist() == [0.0] * 4 and held["n", "b"].tolist() == [0.0] * 4
    assert TensorDict.load(tmp_path / "td")["a"].tolist() == [1.0] * 4
    held["a"][0] = 5.0  # writes to the old inode: the new file is untouched
    assert TensorDict.load(tmp_path / "td")["a"].tolist() == [1.0] * 4


def test_resave_with_a_smaller_leaf_gives_an_exact_file(tmp_path: Path) -> None:
    TensorDict(a=torch.zeros(4, 100), batch_size=[4]).save(tmp_path / "td")
    held = TensorDict.load(tmp_path / "td")
    TensorDict(a=torch.ones(4, 2), batch_size=[4]).save(tmp_path / "td")
    assert (tmp_path / "td" / "a.memmap").stat().st_size == 4 * 2 * 4
    assert held["a"].sum() == 0 and held["a"].shape == (4, 100)


def test_memmap_in_place_over_a_loaded_copy_on_write_td(tmp_path: Path) -> None:
    TensorDict(a=torch.zeros(3), batch_size=[3]).save(tmp_path / "td")
    private = TensorDict.load(tmp_path / "td", mode="r")
    private["a"][0] = 7.0
    other = TensorDict.load(tmp_path / "td")
    private.memmap_(tmp_path / "td")  # the same path: writes the private data (new inode), no copy_existing
    assert TensorDict.load(tmp_path / "td")["a"].tolist() == [7.0, 0.0, 0.0]
    assert other["a"].tolist() == [0.0, 0.0, 0.0]


def test_non_tensor_set_persists(tmp_path: Path) -> None:
    td = TensorDict({"s": "old", "n": {"t": "one"}, "a": torch.zeros(2)}, batch_size=[2]).memmap_(tmp_path / "td")
    td.set_("s", "new")
    td.set_(("n", "t"), {"k": [1, 2]})
    assert td["s"] == "new"
    loaded = TensorDict.load(tmp_path / "td")
    assert loaded["s"] == "new" and loaded["n", "t"] == {"k": [1, 2]}
    td.set_("s", {3, 4})  # not JSON: pickled, then JSON again: the stale pickle goes away
    assert (tmp_path / "td" / "s" / "other.pickle").exists()
    assert TensorDict.load(tmp_path / "td", allow_pickle=True)["s"] == {3, 4}
    td.set_("s", "plain")
    assert not (tmp_path / "td" / "s" / "other.pickle").exists()
    assert TensorDict.load(tmp_path / "td", allow_pickle=False)["s"] == "plain"


def test_non_tensor_set_on_a_legacy_folder_persists(tmp_path: Path) -> None:
    td = TensorDict({"s t": "old"}, batch_size=[]).memmap_(tmp_path / "td", robust_key=False)
    td.set_("s t", "new")
    assert json.loads((tmp_path / "td" / "s t" / "meta.json").read_text())["data"] == "new"
    assert TensorDict.load(tmp_path / "td")["s t"] == "new"


# -- deep nesting -------------------------------------------------------------------------------------
def _deep(value: float) -> TensorDict:
    return TensorDict(
        {
            "x": torch.full((2, 3), value),
            "l1": {
                "y": torch.arange(2) + int(value),
                "l2": {
                    "z": torch.full((2, 1), value, dtype=torch.float64),
                    "l3": {"w": torch.full((2, 2, 2), value, dtype=torch.bfloat16), "label": f"v{value}"},
                },
            },
        },
        batch_size=[2],
    )


@pytest.mark.parametrize("num_threads", [0, 2])
def test_deep_nested_memmap_then_load(tmp_path: Path, num_threads: int) -> None:
    td = _deep(3.0)
    td.memmap_(tmp_path / "td", num_threads=num_threads)
    assert td["l1", "l2", "l3", "w"].filename == str(tmp_path / "td" / "l1" / "l2" / "l3" / "w.memmap")
    td["l1", "l2", "l3", "w"][1] = 9.0  # an in-place write after memmap_
    loaded = TensorDict.load(tmp_path / "td")
    expected = _deep(3.0)
    expected["l1", "l2", "l3", "w"][1] = 9.0
    _assert_equal(loaded, expected)
    assert loaded["l1", "l2", "l3"].batch_size == torch.Size([2]) and loaded["l1", "l2", "l3", "label"] == "v3.0"
