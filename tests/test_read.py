"""The read path: load / load_memmap / load_memmap_ with strict validation (issue 4).

Every test loads real folders under ``tmp_path``; corrupt folders are made by editing the files a
save wrote, and every error must name the file at fault.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import shutil
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import as_other_user, assert_same_tensordict

import tdshare
from tdshare import MemoryMappedTensor, TensorDict


# -- helpers ------------------------------------------------------------------------------------
def _make(value: float = 0.0) -> TensorDict:
    return TensorDict(
        {
            "a": torch.arange(12, dtype=torch.float32).reshape(3, 4) + value,
            "n": {"b": torch.ones(3) * value, "m": {"c": torch.arange(6, dtype=torch.int32).reshape(3, 2)}},
            "s": "hello",
        },
        batch_size=[3],
    )


def _saved(tmp_path: Path, name: str = "td", value: float = 0.0) -> Path:
    path = tmp_path / name
    _make(value).save(path)
    return path


def _edit_meta(path: Path, fn: Callable[[dict], None]) -> None:
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class _Marker:
    """Unpickling it creates a folder: proof that pickle ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _pickled_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A saved folder whose other.pickle, when unpickled, creates ``marker``."""
    path, marker = tmp_path / "td", tmp_path / "marker"
    TensorDict({"a": torch.ones(2), "n": {"obj": {1, 2}}}, batch_size=[2]).save(path)
    (path / "n" / "obj" / "other.pickle").write_bytes(pickle.dumps({"data": _Marker(str(marker))}))
    return path, marker


# -- signatures ---------------------------------------------------------------------------------
def test_signatures_match_the_reference() -> None:
    params = inspect.signature(TensorDict.load_memmap).parameters
    assert list(params) == [
        "prefix",
        "device",
        "non_blocking",
        "out",
        "robust_key",
        "subpath",
        "mode",
        "num_threads",
        "allow_pickle",
    ]
    assert params["device"].default is None and params["non_blocking"].default is False
    assert params["out"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["robust_key"].default is True and params["num_threads"].default == 0
    assert params["mode"].default is None and params["allow_pickle"].default is None
    assert TensorDict.load == TensorDict.load_memmap
    inplace = inspect.signature(TensorDict.load_memmap_).parameters
    assert list(inplace) == ["self", "prefix", "robust_key", "allow_pickle", "mode"]
    assert inplace["allow_pickle"].kind is inspect.Parameter.KEYWORD_ONLY
    assert tdshare.load is tdshare.load_memmap


# -- loading ------------------------------------------------------------------------------------
def test_load_round_trip(tmp_path: Path) -> None:
    path = _saved(tmp_path, value=2.0)
    for loaded in (
        TensorDict.load(path),
        TensorDict.load_memmap(str(path)),
        tdshare.load(path),
        tdshare.load_memmap(path, None, False, num_threads=2),
    ):
        assert_same_tensordict(loaded, _make(2.0))
        assert isinstance(loaded["a"], MemoryMappedTensor) and isinstance(loaded["n", "m", "c"], MemoryMappedTensor)
        assert loaded["n", "m", "c"].filename == str(path / "n" / "m" / "c.memmap")
        assert not loaded.is_locked and not loaded.is_memmap()
        assert loaded.device == torch.device("cpu")
        assert loaded._memmap_prefix == str(path)


@pytest.mark.parametrize("keys", [10, 3_000, 12_000])
def test_metadata_of_any_size_is_read_whole(tmp_path: Path, keys: int) -> None:
    # meta.json is read with one 64 KiB read when it fits: these span one read, several, and > 1 MiB
    td = TensorDict({f"a_rather_long_leaf_name_number_{i:06d}": torch.tensor([i]) for i in range(keys)}, [])
    td.memmap_(tmp_path / "t")
    size = os.path.getsize(tmp_path / "t" / "meta.json")
    assert (size < 1 << 16) == (keys == 10)
    loaded = TensorDict.load_memmap(tmp_path / "t")
    assert len(loaded.keys()) == keys
    assert int(loaded[f"a_rather_long_leaf_name_number_{keys - 1:06d}"]) == keys - 1


def test_load_then_memmap_in_place_writes_nothing_new(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    inodes = {p.name: p.stat().st_ino for p in path.rglob("*") if p.is_file()}
    loaded = TensorDict.load(path).memmap_()
    assert loaded.is_memmap() and loaded.saved_path == str(path)
    assert {p.name: p.stat().st_ino for p in path.rglob("*") if p.is_file()} == inodes


def test_mode_none_writes_through(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    loaded = TensorDict.load(path)
    loaded["a"][0] = 50.0
    loaded["n", "m", "c"][1] = -1
    again = TensorDict.load(path)
    assert again["a"][0].tolist() == [50.0] * 4 and again["n", "m", "c"][1].tolist() == [-1, -1]


def test_mode_r_keeps_writes_private(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    before = (path / "a.memmap").read_bytes()
    loaded = TensorDict.load(path, mode="r")
    loaded["a"][0] = 50.0
    assert loaded["a"][0].tolist() == [50.0] * 4
    assert (path / "a.memmap").read_bytes() == before
    assert TensorDict.load(path)["a"][0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert loaded._memmap_prefix is None
    anonymous = loaded.memmap_()  # no folder: into anonymous memory, the files stay as they were
    assert anonymous["a"].is_anonymous and (path / "a.memmap").read_bytes() == before


def test_mode_r_plus_writes_through_and_needs_writable_files(shared_dir: Path) -> None:
    """As root the read-only half runs as the user ``nobody`` (root may write any file)."""
    path = _saved(shared_dir)
    loaded = TensorDict.load(path, mode="r+")
    loaded["a"][0] = 7.0
    assert TensorDict.load(path)["a"][0, 0] == 7.0
    for folder, _, files in os.walk(path):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)

    def check() -> str:
        try:
            TensorDict.load(path, mode="r+")
        except PermissionError as err:
            assert "a.memmap" in str(err)
        else:
            return "r+ loaded a read-only file"
        loaded = TensorDict.load(path)  # mode None on a read-only file: copy-on-write
        loaded["a"][0] = 8.0
        return f"{loaded['a'][0, 0].item()} {TensorDict.load(path)['a'][0, 0].item()}"

    assert as_other_user(check) == "8.0 7.0"
    assert TensorDict.load(path)["a"][0, 0] == 7.0


@pytest.mark.parametrize("mode", ["w", "rw", "R", "", 1])
def test_bad_mode(tmp_path: Path, mode: Any) -> None:
    path = _saved(tmp_path)
    with pytest.raises(ValueError, match="mode"):
        TensorDict.load(path, mode=mode)
    with pytest.raises(ValueError, match="mode"):
        TensorDict(a=torch.zeros(3), batch_size=[3]).load_memmap_(path, mode=mode)


@pytest.mark.parametrize("subpath", ["n/m", ("n", "m"), ("n", ("m",)), "/n//m/"])
def test_subpath(tmp_path: Path, subpath: Any) -> None:
    path = _saved(tmp_path, value=1.0)
    loaded = TensorDict.load(path, subpath=subpath)
    assert list(loaded.keys()) == ["c"] and loaded.batch_size == torch.Size([3])
    assert loaded["c"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert TensorDict.load(path, subpath="n")["b"].tolist() == [1.0, 1.0, 1.0]


def test_subpath_with_encoded_keys(tmp_path: Path) -> None:
    TensorDict({"a/b": {"c d": {"x": torch.ones(2)}}}, batch_size=[2]).save(tmp_path / "td")
    assert TensorDict.load(tmp_path / "td", subpath=("a/b", "c d"))["x"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("subpath", ["zz", "n/zz", ("n", "b"), "..", "../td", (), ("n", 3), 5])
def test_bad_subpath(tmp_path: Path, subpath: Any) -> None:
    path = _saved(tmp_path)
    with pytest.raises(ValueError, match="subpath"):
        TensorDict.load(path, subpath=subpath)


def test_device(tmp_path: Path) -> None:
    path = _saved(tmp_path, value=1.0)
    on_cpu = TensorDict.load(path, device="cpu")
    assert on_cpu.device == torch.device("cpu") and isinstance(on_cpu["n", "m", "c"], MemoryMappedTensor)
    on_meta = TensorDict.load(path, torch.device("meta"))
    assert on_meta.device == torch.device("meta") and on_meta["a"].device.type == "meta"
    assert on_meta["n", "m", "c"].shape == (3, 2) and on_meta["n", "m", "c"].dtype == torch.int32


def test_out(tmp_path: Path) -> None:
    path = _saved(tmp_path, value=1.0)
    target = TensorDict({"n": {"old": torch.zeros(3)}, "gone": torch.zeros(3)}, batch_size=[3])
    nested = target["n"]
    out = TensorDict.load(path, out=target)
    assert out is target and target["n"] is nested
    assert "gone" not in target and "old" not in nested
    assert_same_tensordict(target, _make(1.0))
    with pytest.raises(ValueError, match="device"):
        TensorDict.load(path, device="meta", out=TensorDict({}, batch_size=[3], device="cpu"))


# -- allow_pickle -------------------------------------------------------------------------------
def test_allow_pickle_none_warns_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "td"
    TensorDict({"obj": {1, 2}, "n": {"b": b"\x00"}}, batch_size=[]).save(path)
    with pytest.warns(FutureWarning, match=r"other\.pickle") as record:
        loaded = TensorDict.load(path)
    assert loaded["obj"] == {1, 2} and loaded["n", "b"] == b"\x00"
    assert len(record) == 2
    assert all(w.filename == __file__ for w in record)  # the warning points at the caller


def test_allow_pickle_false_refuses_before_unpickling(tmp_path: Path) -> None:
    path, marker = _pickled_folder(tmp_path)
    with pytest.raises(RuntimeError, match="allow_pickle") as info:
        TensorDict.load(path, allow_pickle=False)
    assert str(path / "n" / "obj" / "other.pickle") in str(info.value)
    assert not marker.exists()
    target = TensorDict(a=torch.zeros(2), batch_size=[2])
    with pytest.raises(RuntimeError, match="allow_pickle"):
        target.load_memmap_(path, allow_pickle=False)
    assert not marker.exists()
    assert list(target.keys()) == ["a"] and target["a"].tolist() == [0.0, 0.0]  # unchanged on error
    with pytest.raises(RuntimeError):
        tdshare.load(path, allow_pickle=False, subpath="n")
    assert not marker.exists()


def test_allow_pickle_true_loads_silently(tmp_path: Path) -> None:
    path, marker = _pickled_folder(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TensorDict.load(path, allow_pickle=True)
    assert marker.exists()


def test_data_without_pickles_loads_with_any_allow_pickle(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for allow in (None, False, True):
            assert TensorDict.load(path, allow_pickle=allow)["s"] == "hello"


@pytest.mark.parametrize("allow_pickle", [1, 0, "yes", "False", [True]])
def test_allow_pickle_must_be_a_bool(tmp_path: Path, allow_pickle: Any) -> None:
    path, marker = _pickled_folder(tmp_path)
    with pytest.raises(TypeError, match="allow_pickle"):
        TensorDict.load(path, allow_pickle=allow_pickle)
    with pytest.raises(TypeError, match="allow_pickle"):
        TensorDict(a=torch.zeros(2), batch_size=[2]).load_memmap_(path, allow_pickle=allow_pickle)
    assert not marker.exists()


# -- load_memmap_ -------------------------------------------------------------------------------
def test_load_memmap_in_place_reuses_the_tds(tmp_path: Path) -> None:
    path = _saved(tmp_path, value=3.0)
    td = TensorDict(
        {"a": torch.zeros(3, 4), "n": {"b": torch.zeros(3), "extra": torch.zeros(3), "m": {}}, "z": torch.zeros(3)},
        batch_size=[3],
    )
    nested, inner = td["n"], td["n", "m"]
    old_a = td["a"]
    out = td.load_memmap_(path)
    assert out is td and td["n"] is nested and td["n", "m"] is inner
    assert list(td.keys()) == ["a", "n", "s"] and list(nested.keys()) == ["b", "m"]
    assert td["a"] is not old_a and old_a.sum() == 0  # the leaf is replaced, its storage not written
    assert isinstance(td["a"], MemoryMappedTensor) and td["a"].filename == str(path / "a.memmap")
    assert_same_tensordict(td, _make(3.0))
    assert not td.is_memmap() and not td.is_locked


def test_load_memmap_in_place_of_a_memmapped_td(tmp_path: Path) -> None:
    path = _saved(tmp_path, value=3.0)
    td = TensorDict({"a": torch.zeros(3, 4), "n": {"b": torch.zeros(3)}}, batch_size=[3]).memmap_(tmp_path / "old")
    nested = td["n"]
    meta_before = {p: p.read_bytes() for p in path.rglob("meta.json")}
    td.load_memmap_(path)
    assert td["n"] is nested
    assert td.is_memmap() and td.is_locked and td["n", "m"].is_memmap() and td["n", "m"].is_locked
    assert td.saved_path == str(path) and td["n"].saved_path == str(path / "n")
    assert td["n", "m", "c"].filename == str(path / "n" / "m" / "c.memmap")
    assert {p: p.read_bytes() for p in path.rglob("meta.json")} == meta_before  # loading wrote nothing
    assert_same_tensordict(td, _make(3.0))
    td["a"][0] = 99.0
    assert TensorDict.load(path)["a"][0, 0] == 99.0
    with pytest.raises(RuntimeError):
        td["new"] = torch.zeros(3)


def test_load_memmap_in_place_with_mode_r(tmp_path: Path) -> None:
    path = _saved(tmp_path, value=3.0)
    td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3]).memmap_(tmp_path / "old")
    td.load_memmap_(path, mode="r")
    assert not td.is_memmap() and not td.is_locked and td._memmap_prefix is None
    td["a"][0] = 99.0
    assert TensorDict.load(path)["a"][0, 0] == 3.0
    td["new"] = torch.zeros(3)  # unlocked


def test_load_memmap_in_place_of_a_legacy_folder(tmp_path: Path) -> None:
    TensorDict({"a b": torch.arange(3.0), "n%": {"c": torch.ones(3)}}, batch_size=[3]).save(
        tmp_path / "legacy", robust_key=False
    )
    td = TensorDict({"x": torch.zeros(3)}, batch_size=[3]).memmap_(tmp_path / "old")
    td.load_memmap_(tmp_path / "legacy")
    assert td.is_memmap() and list(td.keys()) == ["a b", "n%"]
    assert td["a b"].filename == str(tmp_path / "legacy" / "a b.memmap")
    assert sorted(os.listdir(tmp_path / "legacy")) == ["a b.memmap", "meta.json", "n%"]


def test_failed_load_memmap_in_place_leaves_the_td_unchanged(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    os.truncate(path / "n" / "m" / "c.memmap", 4)
    td = TensorDict({"a": torch.zeros(3, 4), "n": {"b": torch.full((3,), 5.0)}}, batch_size=[3])
    td.memmap_(tmp_path / "old")
    before = {k: v for k, v in td.items(True, True)}
    with pytest.raises(ValueError, match=r"c\.memmap"):
        td.load_memmap_(path)
    assert td.is_memmap() and td.is_locked and td["n"].is_locked
    assert {k: v for k, v in td.items(True, True)} == before
    assert td["n", "b"].tolist() == [5.0] * 3
    plain = TensorDict({"q": torch.zeros(3), "n": {"b": torch.ones(3)}}, batch_size=[3])
    with pytest.raises(ValueError):
        plain.load_memmap_(path)
    assert list(plain.keys(True, True)) == ["q", ("n", "b")] and not plain.is_locked


def test_load_memmap_in_place_refuses_a_locked_td(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3]).lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.load_memmap_(path)
    assert list(td.keys()) == ["a"] and td["a"].sum() == 0


# -- strict validation --------------------------------------------------------------------------
def test_missing_leaf_file(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    os.unlink(path / "n" / "b.memmap")
    with pytest.raises(ValueError, match="missing") as info:
        TensorDict.load(path)
    message = str(info.value)
    assert str(path / "n" / "b.memmap") in message and "12 bytes" in message
    assert not (path / "n" / "b.memmap").exists()


@pytest.mark.parametrize("size", [0, 10, 47])
def test_short_leaf_file_is_never_grown(tmp_path: Path, size: int) -> None:
    path = _saved(tmp_path)
    os.truncate(path / "a.memmap", size)
    with pytest.raises(ValueError, match="truncated") as info:
        TensorDict.load(path)
    message = str(info.value)
    assert str(path / "a.memmap") in message and f"holds {size} bytes" in message and "48" in message
    with pytest.raises(ValueError, match="truncated"):
        TensorDict.load(path, mode="r")
    assert (path / "a.memmap").stat().st_size == size


def test_longer_leaf_file_loads(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    with open(path / "a.memmap", "ab") as f:  # the reference leaves larger files on re-save
        f.write(b"\xff" * 64)
    assert TensorDict.load(path)["a"].tolist() == _make()["a"].tolist()


def test_leaf_that_is_a_folder(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    os.unlink(path / "a.memmap")
    os.mkdir(path / "a.memmap")
    with pytest.raises(ValueError, match="regular file"):
        TensorDict.load(path)


@pytest.mark.parametrize("folder", ["n", "n/m", "s"])
def test_missing_nested_folder(tmp_path: Path, folder: str) -> None:
    path = _saved(tmp_path)
    shutil.rmtree(path / folder)
    with pytest.raises(ValueError, match="missing") as info:
        TensorDict.load(path)
    assert str(path / folder) in str(info.value)


def test_nested_folder_without_meta_json(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    os.unlink(path / "n" / "m" / "meta.json")
    with pytest.raises(FileNotFoundError, match=r"meta\.json") as info:
        TensorDict.load(path)
    assert str(path / "n" / "m") in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"a": ', b"[1, 2]", b'"text"', b"\xff\xfe", b"null", b'{"a": {"dtype": "torch.float32", "sha'],
)
@pytest.mark.parametrize("where", ["meta.json", "n/meta.json", "s/meta.json"])
def test_malformed_meta_json(tmp_path: Path, content: bytes, where: str) -> None:
    path = _saved(tmp_path)
    (path / where).write_bytes(content)
    with pytest.raises(ValueError) as info:
        TensorDict.load(path)
    assert str(path / where) in str(info.value)


def test_truncated_meta_json(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    raw = (path / "n" / "meta.json").read_bytes()
    for cut in (1, len(raw) // 3, len(raw) // 2, len(raw) - 1):
        (path / "n" / "meta.json").write_bytes(raw[:cut])
        with pytest.raises(ValueError, match="not valid JSON") as info:
            TensorDict.load(path)
        assert str(path / "n" / "meta.json") in str(info.value)


@pytest.mark.parametrize("dtype", ["torch.float128", "float32", "torch.nothing", 5, None, ["torch.float32"]])
def test_unknown_dtype(tmp_path: Path, dtype: Any) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / "n" / "meta.json", lambda m: m["b"].update(dtype=dtype))
    with pytest.raises(RuntimeError, match="dtype") as info:
        TensorDict.load(path)
    assert str(path / "n" / "meta.json") in str(info.value) and repr(dtype) in str(info.value)


@pytest.mark.parametrize("where", ["meta.json", "n/m/meta.json"])
def test_newer_format_version(tmp_path: Path, where: str) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / where, lambda m: m.update(_format_version=2))
    with pytest.raises(RuntimeError, match="version 2") as info:
        TensorDict.load(path)
    assert str(path / where) in str(info.value)


@pytest.mark.parametrize("version", ["2", 2.0, True, -1, [1]])
def test_malformed_format_version(tmp_path: Path, version: Any) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / "meta.json", lambda m: m.update(_format_version=version))
    with pytest.raises(ValueError, match="_format_version"):
        TensorDict.load(path)


def test_format_version_0_loads(tmp_path: Path) -> None:
    path = _saved(tmp_path, value=1.0)
    for meta_path in path.rglob("meta.json"):
        _edit_meta(meta_path, lambda m: [m.pop("_format_version", None), m.pop("_class", None)])
    assert_same_tensordict(TensorDict.load(path), _make(1.0))


@pytest.mark.parametrize(
    ("where", "edit", "match"),
    [
        ("meta.json", lambda m: m["a"].update(shape=[4, 3]), "batch size"),
        ("meta.json", lambda m: m["a"].update(shape=[]), "batch size"),
        ("n/meta.json", lambda m: m.update(shape=[2]), "parent"),
        ("meta.json", lambda m: m.update(shape=[3, 4]), "parent"),
        ("meta.json", lambda m: m["a"].update(shape=[3, -4]), "non-negative"),
        ("meta.json", lambda m: m["a"].update(shape="3x4"), "non-negative"),
        ("meta.json", lambda m: m.update(shape=[3.0]), "non-negative"),
        ("meta.json", lambda m: m.update(_names="batch"), "_names"),
        ("meta.json", lambda m: m.update(_names=["a", "b"]), "_names"),
        ("meta.json", lambda m: m.update(_names=[3]), "_names"),
    ],
)
def test_inconsistent_metadata(tmp_path: Path, where: str, edit: Callable[[dict], None], match: str) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / where, edit)
    with pytest.raises(ValueError, match=match) as info:
        TensorDict.load(path)
    assert str(path) in str(info.value)


def test_leaf_bigger_than_its_file(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / "meta.json", lambda m: m["a"].update(shape=[3, 4, 1000]))
    with pytest.raises(ValueError, match="48000 ") as info:
        TensorDict.load(path)
    assert "holds 48 bytes" in str(info.value)
    assert (path / "a.memmap").stat().st_size == 48


def test_symlinked_leaf_outside_the_prefix(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\x00" * 48)
    os.unlink(path / "a.memmap")
    os.symlink(outside, path / "a.memmap")
    with pytest.raises(ValueError, match="outside") as info:
        TensorDict.load(path)
    assert str(path / "a.memmap") in str(info.value)


@pytest.mark.parametrize("target", ["n", "n/m", "s"])
def test_symlinked_folder_outside_the_prefix(tmp_path: Path, target: str) -> None:
    path = _saved(tmp_path)
    shutil.move(path / target, tmp_path / "moved")
    os.symlink(tmp_path / "moved", path / target)
    with pytest.raises(ValueError, match="outside"):
        TensorDict.load(path)
    if target != "s":
        with pytest.raises(ValueError, match="outside"):
            TensorDict.load(path, subpath=target)


@pytest.mark.parametrize("name", ["meta.json", "n/meta.json", "obj/other.pickle"])
def test_symlinked_metadata_outside_the_prefix(tmp_path: Path, name: str) -> None:
    path = tmp_path / "td"
    td = _make()
    td["obj"] = {1, 2}
    td.save(path)
    shutil.move(path / name, tmp_path / "moved")
    os.symlink(tmp_path / "moved", path / name)
    with pytest.raises(ValueError, match="outside"):
        TensorDict.load(path, allow_pickle=True)


def test_symlinks_inside_the_prefix_are_fine(tmp_path: Path) -> None:
    path = _saved(tmp_path, value=1.0)
    os.rename(path / "a.memmap", path / "a.data")
    os.symlink("a.data", path / "a.memmap")
    os.symlink(path, tmp_path / "link")
    assert_same_tensordict(TensorDict.load(tmp_path / "link"), _make(1.0))


def test_symlink_loop(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    shutil.rmtree(path / "n" / "m")
    os.symlink("..", path / "n" / "m")  # n/m -> the root: would recurse forever
    with pytest.raises(ValueError, match="loops"):
        TensorDict.load(path)


def test_directory_without_meta_json(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"meta\.json"):
        TensorDict.load(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        TensorDict.load(tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError):
        TensorDict(a=torch.zeros(1), batch_size=[1]).load_memmap_(tmp_path / "empty")


def test_file_that_is_not_an_archive(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"not an archive")
    with pytest.raises(ValueError, match="archive"):
        TensorDict.load(tmp_path / "file")


def test_tdz_archives_load(tmp_path: Path) -> None:
    """A zip file with a top-level meta.json loads as an archive (tests/test_archive.py has the rest)."""
    with zipfile.ZipFile(tmp_path / "td.tdz", "w") as zf:
        zf.writestr("meta.json", json.dumps({"shape": [], "device": "cpu"}))
    td = TensorDict.load(tmp_path / "td.tdz")
    assert len(td.keys()) == 0 and not td.is_memmap() and not td.is_locked


# -- cost ---------------------------------------------------------------------------------------
def test_load_reads_metadata_only(tmp_path: Path) -> None:
    size = 256 << 20
    path = tmp_path / "td"
    TensorDict(big=torch.zeros(4, 2), batch_size=[4]).save(path)
    _edit_meta(path / "meta.json", lambda m: m["big"].update(shape=[4, size // 16]))
    os.truncate(path / "big.memmap", size)  # sparse: valid size, no data blocks
    blocks = (path / "big.memmap").stat().st_blocks
    rss = _rss()
    start = time.perf_counter()
    loaded = TensorDict.load(path)
    elapsed = time.perf_counter() - start
    assert loaded["big"].shape == (4, size // 16)
    assert elapsed < 1.0
    assert _rss() - rss < 32 << 20
    assert (path / "big.memmap").stat().st_blocks == blocks
    assert loaded["big"][3, -1] == 0.0  # a read maps one page, not the payload
    assert _rss() - rss < 32 << 20


# -- legacy layout and reference quirks ---------------------------------------------------------
def test_legacy_folder_loads_with_robust_key_true(tmp_path: Path) -> None:
    td = TensorDict(
        {"a b": torch.arange(3.0), "50%": torch.ones(3), "n x": {"c%d": torch.zeros(3)}, "s t": "text"},
        batch_size=[3],
    )
    td.save(tmp_path / "td", robust_key=False)
    assert (tmp_path / "td" / "a b.memmap").exists() and (tmp_path / "td" / "n x" / "c%d.memmap").exists()
    for robust_key in (True, None, False):
        assert_same_tensordict(TensorDict.load(tmp_path / "td", robust_key=robust_key), td)
    assert TensorDict.load(tmp_path / "td", subpath="n x")["c%d"].tolist() == [0.0] * 3


def test_encoded_name_wins_over_a_legacy_name(tmp_path: Path) -> None:
    TensorDict({"a b": torch.ones(2)}, batch_size=[2]).save(tmp_path / "td")
    (tmp_path / "td" / "a b.memmap").write_bytes(torch.zeros(2).numpy().tobytes())
    assert TensorDict.load(tmp_path / "td")["a b"].tolist() == [1.0, 1.0]


def test_user_entries_named_like_optional_fields_load(tmp_path: Path) -> None:
    """The reference keeps leaves named _names/_format_version/_class (its setdefault): so do we."""
    path = tmp_path / "td"
    path.mkdir()
    entry = {"device": "cpu", "shape": [2], "dtype": "torch.float32", "is_nested": False}
    meta = {"_names": entry, "_format_version": entry, "_class": entry, "shape": [2], "device": "cpu"}
    meta["_type"] = "<class 'tensordict._td.TensorDict'>"
    (path / "meta.json").write_text(json.dumps(meta))
    for i, key in enumerate(["_names", "_format_version", "_class"]):
        (path / f"{key}.memmap").write_bytes(torch.full((2,), float(i)).numpy().tobytes())
    loaded = TensorDict.load(path)
    assert [loaded[k].tolist() for k in ["_names", "_format_version", "_class"]] == [[0, 0], [1, 1], [2, 2]]
    assert loaded.names == [None]


# -- deep nesting -------------------------------------------------------------------------------
def test_deep_nested_memmap_then_load(tmp_path: Path) -> None:
    td = TensorDict(
        {
            "r": torch.arange(4.0),
            "l1": {
                "a": torch.arange(8).reshape(4, 2),
                "l2": {"b": torch.ones(4, 3, dtype=torch.float64), "l3": {"c": torch.arange(4) % 2 == 0, "t": "deep"}},
            },
        },
        batch_size=[4],
    )
    expected = td.clone()
    td.memmap_(tmp_path / "td")
    loaded = TensorDict.load(tmp_path / "td")
    assert_same_tensordict(loaded, expected)
    assert loaded["l1", "l2", "l3"]._memmap_prefix == str(tmp_path / "td" / "l1" / "l2" / "l3")
    td["l1", "l2", "l3", "c"][0] = False  # seen by a later load of the same folder
    assert TensorDict.load(tmp_path / "td", subpath="l1/l2/l3")["c"].tolist() == [False, False, True, False]
