"""One suite, every storage backend: a saved folder and a ``.tdz`` archive load through the same walker.

Each test builds a folder (broken fixtures are made by editing it), then loads it through the
``backend`` fixture's store: the folder itself, or the folder packed with ``pack_memmap``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import assert_same_tensordict

import tdshare
from tdshare import NonTensorData, TensorDict, pack_memmap
from tdshare._format import LAZY_STACK_TYPE, NONTENSOR_STACK_TYPE, NONTENSOR_TYPE

Loader = Callable[[Path], Path]


@pytest.fixture(params=["folder", "archive"])
def backend(request: pytest.FixtureRequest) -> Loader:
    """Turn a saved folder into what is loaded: the folder itself, or a ``.tdz`` packed from it."""

    def as_backend(folder: Path) -> Path:
        if request.param == "folder":
            return folder
        archive = folder.with_name(folder.name + ".tdz")
        pack_memmap(folder, archive)
        return archive

    return as_backend


def _make() -> TensorDict:
    return TensorDict(
        {
            "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
            "n": {"b": torch.ones(3), "m": {"c": torch.arange(6, dtype=torch.int32).reshape(3, 2)}},
            "s": "hello",
            "j": NonTensorData({"x": 1, "y": [1.5, None]}),
        },
        batch_size=[3],
    )


def _saved(tmp_path: Path, td: TensorDict | None = None, **kwargs: Any) -> Path:
    path = tmp_path / "td"
    (td if td is not None else _make()).save(path, **kwargs)
    return path


def _edit_meta(path: Path, fn: Callable[[dict], Any]) -> None:
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


# -- round trips ---------------------------------------------------------------------------------
def test_round_trip(tmp_path: Path, backend: Loader) -> None:
    td = _make()
    td["p"] = {1, 2}  # JSON cannot hold a set: pickled
    loaded = TensorDict.load(backend(_saved(tmp_path, td)), allow_pickle=True)
    assert_same_tensordict(loaded, td)
    assert loaded["j"] == {"x": 1, "y": [1.5, None]} and loaded["p"] == {1, 2}
    assert isinstance(loaded["a"], tdshare.MemoryMappedTensor) and loaded["n", "m"].batch_size == (3,)


def test_load_into_out(tmp_path: Path, backend: Loader) -> None:
    out = TensorDict({"n": {"b": torch.zeros(3)}}, batch_size=[3])
    nested = out["n"]
    TensorDict.load(backend(_saved(tmp_path)), out=out)
    assert out["n"] is nested and out["n", "m", "c"].tolist() == _make()["n", "m", "c"].tolist()


@pytest.mark.parametrize("subpath", ["n/m", ("n", "m"), "n", ("n",)])
def test_subpath(tmp_path: Path, backend: Loader, subpath: Any) -> None:
    loaded = TensorDict.load(backend(_saved(tmp_path)), subpath=subpath)
    expected = _make().get(subpath if isinstance(subpath, tuple) else tuple(subpath.split("/")))
    assert_same_tensordict(loaded, expected)


def test_bad_subpath(tmp_path: Path, backend: Loader) -> None:
    with pytest.raises(ValueError, match="No tensordict found under subpath"):
        TensorDict.load(backend(_saved(tmp_path)), subpath="n/nothing")


def test_legacy_names_load_with_robust_key(tmp_path: Path, backend: Loader) -> None:
    td = TensorDict(
        {"a b": torch.arange(3.0), "50%": torch.ones(3), "n x": {"c%d": torch.zeros(3)}, "s t": "text"},
        batch_size=[3],
    )
    path = _saved(tmp_path, td, robust_key=False)
    assert (path / "a b.memmap").exists() and (path / "n x" / "c%d.memmap").exists()
    source = backend(path)
    for robust_key in (True, None, False):
        assert_same_tensordict(TensorDict.load(source, robust_key=robust_key), td)
    assert TensorDict.load(source, subpath="n x")["c%d"].tolist() == [0.0] * 3


# -- pickles -------------------------------------------------------------------------------------
def test_allow_pickle(tmp_path: Path, backend: Loader) -> None:
    source = backend(_saved(tmp_path, TensorDict({"a": torch.ones(2), "n": {"obj": {1, 2}}}, batch_size=[2])))
    with pytest.warns(FutureWarning, match="pickled") as record:
        assert TensorDict.load(source)["n", "obj"] == {1, 2}
    assert record[0].filename == __file__  # pointed at the caller, not at tdshare
    with pytest.raises(tdshare.PickleRefusedError, match="allow_pickle=True"):
        TensorDict.load(source, allow_pickle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TensorDict.load(source, allow_pickle=True)["n", "obj"] == {1, 2}


# -- strict validation ---------------------------------------------------------------------------
def test_missing_leaf(tmp_path: Path, backend: Loader) -> None:
    path = _saved(tmp_path)
    os.unlink(path / "n" / "b.memmap")
    with pytest.raises(tdshare.CorruptDataError, match="missing") as info:
        TensorDict.load(backend(path))
    assert "b.memmap" in str(info.value) and "12 bytes" in str(info.value)


def test_short_leaf(tmp_path: Path, backend: Loader) -> None:
    path = _saved(tmp_path)
    os.truncate(path / "a.memmap", 16)
    with pytest.raises(tdshare.CorruptDataError, match=r"holds 16 bytes but .* expects 48") as info:
        TensorDict.load(backend(path))
    assert "a.memmap" in str(info.value)


@pytest.mark.parametrize("folder", ["n", "n/m", "s"])
def test_missing_nested_level(tmp_path: Path, backend: Loader, folder: str) -> None:
    path = _saved(tmp_path)
    shutil.rmtree(path / folder)
    with pytest.raises(tdshare.CorruptDataError, match="missing") as info:
        TensorDict.load(backend(path))
    assert folder.split("/")[-1] in str(info.value)


@pytest.mark.parametrize("content", [b"", b"{", b"[1, 2]", b"\xff\xfe", b"null"])
@pytest.mark.parametrize("where", ["meta.json", "n/meta.json", "s/meta.json"])
def test_malformed_meta_json(tmp_path: Path, backend: Loader, content: bytes, where: str) -> None:
    path = _saved(tmp_path)
    (path / where).write_bytes(content)
    with pytest.raises(ValueError) as info:
        TensorDict.load(backend(path))
    assert where in str(info.value)


@pytest.mark.parametrize("dtype", ["torch.float128", "float32", 5, None])
def test_unknown_dtype(tmp_path: Path, backend: Loader, dtype: Any) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / "n" / "meta.json", lambda m: m["b"].update(dtype=dtype))
    with pytest.raises(RuntimeError, match="dtype") as info:
        TensorDict.load(backend(path))
    assert "n/meta.json" in str(info.value) and repr(dtype) in str(info.value)


@pytest.mark.parametrize("where", ["meta.json", "n/m/meta.json"])
def test_too_new_format_version(tmp_path: Path, backend: Loader, where: str) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / where, lambda m: m.update(_format_version=2))
    with pytest.raises(tdshare.UnsupportedFormatError, match="version 2") as info:
        TensorDict.load(backend(path))
    assert where in str(info.value)


def test_leaf_shape_disagrees_with_batch_size(tmp_path: Path, backend: Loader) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / "meta.json", lambda m: m["a"].update(shape=[2, 6]))
    with pytest.raises(tdshare.CorruptDataError, match="does not start with the batch size"):
        TensorDict.load(backend(path))


def test_nested_batch_size_disagrees_with_parent(tmp_path: Path, backend: Loader) -> None:
    path = _saved(tmp_path)
    _edit_meta(path / "n" / "meta.json", lambda m: m.update(shape=[4]))
    with pytest.raises(tdshare.CorruptDataError, match="does not start with the parent"):
        TensorDict.load(backend(path))


# -- other level kinds ---------------------------------------------------------------------------
@pytest.mark.parametrize("pickled", [False, True])
def test_nontensor_stack(tmp_path: Path, backend: Loader, pickled: bool) -> None:
    path = _saved(tmp_path)
    values: list[Any] = [{1}, {2}, {3}] if pickled else ["x", "y", "z"]
    meta = {"_type": NONTENSOR_STACK_TYPE, "_class": "tensordict:NonTensorStack", "stack_dim": 0}
    (path / "s" / "meta.json").write_text(json.dumps({**meta, "data": "pickle.pkl" if pickled else values}))
    if pickled:
        (path / "s" / "pickle.pkl").write_bytes(pickle.dumps(values))
    source = backend(path)
    assert TensorDict.load(source, allow_pickle=True)["s"] == values
    if pickled:
        with pytest.raises(tdshare.PickleRefusedError):
            TensorDict.load(source, allow_pickle=False)


def test_nontensor_stack_as_member_folders(tmp_path: Path, backend: Loader) -> None:
    path = _saved(tmp_path)
    (path / "s" / "meta.json").write_text(json.dumps({"_type": NONTENSOR_STACK_TYPE, "stack_dim": 0}))
    for i, v in enumerate(["a", "b", "c"]):
        (path / "s" / str(i)).mkdir()
        member = {"_type": NONTENSOR_TYPE, "data": v, "_metadata": None, "_is_non_tensor": True}
        (path / "s" / str(i) / "meta.json").write_text(json.dumps(member))
    assert TensorDict.load(backend(path))["s"] == ["a", "b", "c"]


def test_tensorclass_folder(tmp_path: Path, backend: Loader) -> None:
    path = tmp_path / "tc"
    _make().save(path / "_tensordict")
    (path / "meta.json").write_text(json.dumps({"_type": "<class 'user.MyClass'>"}))
    source = backend(path)
    with pytest.warns(UserWarning, match="MyClass"):
        loaded = TensorDict.load(source)
    assert_same_tensordict(loaded, _make())
    # a subpath looks inside the tensorclass's fields and lands on a plain level: no warning
    assert TensorDict.load(source, subpath="n")["b"].tolist() == [1.0] * 3


def test_unknown_level_type(tmp_path: Path, backend: Loader) -> None:
    path = _saved(tmp_path)
    (path / "n" / "meta.json").write_text(json.dumps({"_type": "<class 'user.Thing'>"}))
    with pytest.raises(tdshare.UnsupportedFormatError, match="Thing"):
        TensorDict.load(backend(path))


def _lazy_stack(tmp_path: Path, count: int = 2) -> Path:
    path = tmp_path / "lazy"
    for i in range(count):
        TensorDict({"a": torch.full((3,), float(i)), "n": {"b": torch.zeros(3, 2)}}, batch_size=[3]).save(path / str(i))
    (path / "meta.json").write_text(json.dumps({"_type": LAZY_STACK_TYPE, "stack_dim": 0}))
    return path


def test_lazy_stack(tmp_path: Path, backend: Loader) -> None:
    loaded = TensorDict.load(backend(_lazy_stack(tmp_path)))
    assert loaded.batch_size == (2, 3)
    assert loaded["a"].tolist() == [[0.0] * 3, [1.0] * 3] and loaded["n", "b"].shape == (2, 3, 2)


def test_lazy_stack_with_a_gap(tmp_path: Path, backend: Loader) -> None:
    path = _lazy_stack(tmp_path, 3)
    shutil.rmtree(path / "1")
    with pytest.raises(tdshare.CorruptDataError, match="member folder 1 is missing"):
        TensorDict.load(backend(path))


def test_lazy_stack_without_members(tmp_path: Path, backend: Loader) -> None:
    path = _lazy_stack(tmp_path, 1)
    shutil.rmtree(path / "0")
    with pytest.raises(tdshare.CorruptDataError, match="no members"):
        TensorDict.load(backend(path))
