"""MemoryMappedTensor (tdshare/_memmap.py): constructors, modes, views, pickling, dtypes, failures."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import as_other_user

import tdshare
from tdshare import CorruptDataError, FileExistsRuntimeError, InvalidArgumentError, MemoryMappedTensor


def _bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().reshape(-1)
    return bytes(t.view(torch.uint8).numpy()) if t.numel() else b""


def _file_bytes(path: str | Path) -> bytes:
    return Path(path).read_bytes()


def _nfds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _no_temp_files(folder: Path) -> None:
    leftovers = [p.name for p in folder.iterdir() if ".tdshare-" in p.name]
    assert not leftovers, leftovers


# -- from_tensor ----------------------------------------------------------------------------
def test_from_tensor_to_file(tmp_path: Path) -> None:
    src = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    path = tmp_path / "a.memmap"
    m = MemoryMappedTensor.from_tensor(src, filename=path)
    assert type(m) is MemoryMappedTensor
    assert m.filename == str(path) and os.path.isabs(m.filename)
    assert not m.is_anonymous
    assert torch.equal(m, src) and m.dtype == src.dtype and m.shape == src.shape
    assert _file_bytes(path) == _bytes(src)
    m[1, 2] = -1.0  # writes go straight to the file
    assert np.frombuffer(_file_bytes(path), dtype=np.float32)[6] == -1.0
    assert src[1, 2] == 6.0  # the source is copied, not aliased


def test_from_tensor_relative_and_pathlike_filename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    m = MemoryMappedTensor.from_tensor(torch.ones(2), filename="rel.memmap")
    assert m.filename == str(tmp_path / "rel.memmap")
    n = MemoryMappedTensor.from_tensor(torch.ones(2), filename=Path("p.memmap"))
    assert n.filename == str(tmp_path / "p.memmap")


def test_from_tensor_anonymous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    src = torch.arange(5)
    m = MemoryMappedTensor.from_tensor(src)
    assert type(m) is MemoryMappedTensor and m.is_anonymous
    assert torch.equal(m, src)
    m[0] = 9
    assert src[0] == 0
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="anonymous shared memory"):
        m.filename  # noqa: B018


def test_from_tensor_existsok(tmp_path: Path) -> None:
    path = tmp_path / "a.memmap"
    old = MemoryMappedTensor.from_tensor(torch.zeros(4), filename=path)
    inode = os.stat(path).st_ino
    with pytest.raises(FileExistsRuntimeError, match="existsok") as info:
        MemoryMappedTensor.from_tensor(torch.ones(4), filename=path)
    assert isinstance(info.value, RuntimeError) and str(path) in str(info.value)
    assert _file_bytes(path) == _bytes(torch.zeros(4))
    new = MemoryMappedTensor.from_tensor(torch.ones(4), filename=path, existsok=True)
    assert torch.equal(new, torch.ones(4)) and _file_bytes(path) == _bytes(torch.ones(4))
    # the file was replaced by a new inode, not rewritten under the old mapping
    assert os.stat(path).st_ino != inode
    assert torch.equal(old, torch.zeros(4))
    _no_temp_files(tmp_path)


def test_from_tensor_existsok_false_copy_data_false(tmp_path: Path) -> None:
    path = tmp_path / "a.memmap"
    path.write_bytes(b"x" * 16)
    with pytest.raises(FileExistsRuntimeError):
        MemoryMappedTensor.from_tensor(torch.ones(4), filename=path, copy_data=False)
    assert _file_bytes(path) == b"x" * 16


def test_from_tensor_copy_existing(tmp_path: Path) -> None:
    a = MemoryMappedTensor.from_tensor(torch.arange(4.0), filename=tmp_path / "a.memmap")
    with pytest.raises(RuntimeError, match="copy_existing=True"):
        MemoryMappedTensor.from_tensor(a, filename=tmp_path / "b.memmap")
    assert not (tmp_path / "b.memmap").exists()
    b = MemoryMappedTensor.from_tensor(a, filename=tmp_path / "b.memmap", copy_existing=True)
    assert b.filename == str(tmp_path / "b.memmap") and torch.equal(b, a)
    b[0] = 100.0
    assert a[0] == 0.0


def test_from_tensor_file_backed_to_anonymous(tmp_path: Path) -> None:
    a = MemoryMappedTensor.from_tensor(torch.arange(4.0), filename=tmp_path / "a.memmap")
    anon = MemoryMappedTensor.from_tensor(a)
    assert anon is not a and anon.is_anonymous and torch.equal(anon, a)
    anon[0] = 7.0
    assert a[0] == 0.0


def test_from_tensor_same_place_returns_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.memmap"
    m = MemoryMappedTensor.from_tensor(torch.arange(3.0), filename=path)
    assert MemoryMappedTensor.from_tensor(m, filename=path) is m
    assert MemoryMappedTensor.from_tensor(m, filename=str(path), existsok=False) is m
    monkeypatch.chdir(tmp_path)
    assert MemoryMappedTensor.from_tensor(m, filename="a.memmap") is m
    anon = MemoryMappedTensor.from_tensor(torch.arange(3.0))
    assert MemoryMappedTensor.from_tensor(anon) is anon


def test_from_tensor_copy_on_write_mapping_is_not_the_file(tmp_path: Path) -> None:
    """A mode="r" tensor may hold writes its file lacks: it is never taken for the file."""
    path = tmp_path / "a.memmap"
    MemoryMappedTensor.from_tensor(torch.zeros(3), filename=path)
    r = MemoryMappedTensor.from_filename(path, torch.float32, (3,), mode="r")
    r[0] = 5.0
    with pytest.raises(FileExistsRuntimeError):
        MemoryMappedTensor.from_tensor(r, filename=path)
    out = MemoryMappedTensor.from_tensor(r, filename=path, existsok=True)
    assert out is not r and out[0] == 5.0
    assert np.frombuffer(_file_bytes(path), dtype=np.float32)[0] == 5.0


def test_from_tensor_copy_data_false(tmp_path: Path) -> None:
    src = torch.full((3, 2), 7, dtype=torch.int32)
    m = MemoryMappedTensor.from_tensor(src, filename=tmp_path / "a.memmap", copy_data=False)
    assert m.shape == src.shape and m.dtype == src.dtype
    assert torch.equal(m, torch.zeros_like(src))  # fresh files never expose stale bytes
    assert os.path.getsize(tmp_path / "a.memmap") == 24
    anon = MemoryMappedTensor.from_tensor(src, copy_data=False)
    assert anon.shape == src.shape and torch.equal(anon, torch.zeros_like(src))


@pytest.mark.parametrize("where", ["file", "anonymous"])
def test_from_tensor_shape_broadcasts(tmp_path: Path, where: str) -> None:
    filename = tmp_path / "a.memmap" if where == "file" else None
    m = MemoryMappedTensor.from_tensor(torch.arange(3.0), shape=(2, 3), filename=filename)
    assert m.shape == (2, 3) and m.is_contiguous()
    assert torch.equal(m, torch.arange(3.0).expand(2, 3))
    if filename is not None:
        assert os.path.getsize(filename) == 24
    m[0, 0] = 9.0
    assert m[1, 0] == 0.0  # materialised, not an expanded view


def test_from_tensor_bad_shape_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        MemoryMappedTensor.from_tensor(torch.arange(3.0), shape=(2, 2), filename=tmp_path / "a.memmap")
    assert list(tmp_path.iterdir()) == []


def test_from_tensor_requires_grad(tmp_path: Path) -> None:
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="detach"):
        MemoryMappedTensor.from_tensor(x, filename=tmp_path / "a.memmap")
    with pytest.raises(RuntimeError, match="grad"):
        MemoryMappedTensor.from_tensor(x)
    assert list(tmp_path.iterdir()) == []
    assert torch.equal(MemoryMappedTensor.from_tensor(x.detach()), x.detach())


@pytest.mark.parametrize("bad", [[1, 2], np.arange(3), 3.0, None, "x"])
def test_from_tensor_non_tensor(bad: object) -> None:
    with pytest.raises(TypeError):
        MemoryMappedTensor.from_tensor(bad)  # type: ignore[arg-type]


def _odd_inputs() -> dict[str, torch.Tensor]:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    c = torch.arange(6.0).reshape(2, 3).to(torch.complex64) * (1 + 2j)
    return {
        "transposed": base.t(),
        "strided": base[:, ::2],
        "offset": base[1:, 2:],
        "expanded": torch.arange(3.0).expand(4, 3),
        "expanded_scalar": torch.tensor(5.0).expand(2, 3),
        "conj": c.conj(),
        "neg": torch._neg_view(base),
        "conj_t": c.conj().t(),
        "channels_last": torch.arange(2 * 3 * 4 * 5.0)
        .reshape(2, 3, 4, 5)
        .contiguous(memory_format=torch.channels_last),
        "scalar": torch.tensor(3.5),
    }


@pytest.mark.parametrize("name", list(_odd_inputs()))
@pytest.mark.parametrize("where", ["file", "anonymous"])
def test_non_contiguous_and_expanded_inputs_are_materialised(tmp_path: Path, name: str, where: str) -> None:
    src = _odd_inputs()[name]
    expected = src.resolve_conj().resolve_neg().contiguous()
    filename = tmp_path / "a.memmap" if where == "file" else None
    m = MemoryMappedTensor.from_tensor(src, filename=filename)
    assert m.shape == src.shape and m.dtype == src.dtype
    assert m.is_contiguous() and not m.is_conj() and not m.is_neg()
    assert torch.equal(m, expected)
    if filename is not None:
        assert _file_bytes(filename) == _bytes(expected)
        back = MemoryMappedTensor.from_filename(filename, src.dtype, src.shape)
        assert torch.equal(back, expected)


# -- zero-size tensors ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 2)])
def test_zero_size(tmp_path: Path, shape: tuple[int, ...]) -> None:
    src = torch.empty(shape, dtype=torch.float64)
    m = MemoryMappedTensor.from_tensor(src, filename=tmp_path / "z.memmap")
    assert type(m) is MemoryMappedTensor and m.shape == shape and m.dtype == torch.float64
    assert not (tmp_path / "z.memmap").exists()  # nothing to store (as the reference)
    back = pickle.loads(pickle.dumps(m))
    assert type(back) is MemoryMappedTensor and back.shape == shape and back.dtype == torch.float64
    n0 = _nfds()
    anon = [MemoryMappedTensor.from_tensor(src) for _ in range(20)]
    assert _nfds() == n0  # no descriptor for nothing
    assert all(a.shape == shape for a in anon)
    assert pickle.loads(ForkingPickler.dumps(anon[0])).shape == shape
    for factory in (MemoryMappedTensor.empty, MemoryMappedTensor.zeros, MemoryMappedTensor.ones):
        assert factory(shape).shape == shape
        assert factory(shape, filename=tmp_path / "f.memmap").shape == shape
    assert not (tmp_path / "f.memmap").exists()


def test_zero_size_from_filename(tmp_path: Path) -> None:
    path = tmp_path / "empty.memmap"
    path.write_bytes(b"")
    m = MemoryMappedTensor.from_filename(path, torch.float32, (0, 3))
    assert m.shape == (0, 3)


# -- from_filename -------------------------------------------------------------------------------
@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "d.memmap"
    path.write_bytes(_bytes(torch.arange(6, dtype=torch.int32)))
    return path


def test_from_filename_mode_none_writes_through(data_file: Path) -> None:
    m = MemoryMappedTensor.from_filename(data_file, torch.int32, (2, 3))
    assert m.filename == str(data_file) and m.shape == (2, 3)
    assert torch.equal(m, torch.arange(6, dtype=torch.int32).reshape(2, 3))
    other = MemoryMappedTensor.from_filename(str(data_file), torch.int32, [6])
    m[1, 1] = 40
    assert other[4] == 40
    assert np.frombuffer(_file_bytes(data_file), dtype=np.int32)[4] == 40


def test_from_filename_mode_r_plus_writes_through(data_file: Path) -> None:
    m = MemoryMappedTensor.from_filename(data_file, torch.int32, (6,), mode="r+")
    m[0] = -3
    assert np.frombuffer(_file_bytes(data_file), dtype=np.int32)[0] == -3


def test_from_filename_mode_r_writes_stay_private(data_file: Path) -> None:
    before = _file_bytes(data_file)
    r = MemoryMappedTensor.from_filename(data_file, torch.int32, (6,), mode="r")
    shared = MemoryMappedTensor.from_filename(data_file, torch.int32, (6,))
    r[0] = 99  # a private copy-on-write page: no crash, no effect outside this tensor
    r[1:].fill_(7)
    assert r.tolist() == [99, 7, 7, 7, 7, 7]
    assert _file_bytes(data_file) == before
    assert shared.tolist() == [0, 1, 2, 3, 4, 5]
    # the other way round: the private mapping still reads pages it has not written
    shared[0] = 11
    assert r[0] == 99


def test_from_filename_mode_r_on_read_only_file(data_file: Path) -> None:
    data_file.chmod(0o444)
    before = _file_bytes(data_file)
    r = MemoryMappedTensor.from_filename(data_file, torch.int32, (6,), mode="r")
    r[2] = 5
    assert r[2] == 5 and _file_bytes(data_file) == before


def test_from_filename_bad_mode(data_file: Path) -> None:
    for mode in ("w", "rw", "w+", "", 1):
        with pytest.raises(InvalidArgumentError) as info:
            MemoryMappedTensor.from_filename(data_file, torch.int32, (6,), mode=mode)  # type: ignore[arg-type]
        assert isinstance(info.value, ValueError)


def _read_only_check(path: str) -> str:
    assert not os.access(path, os.W_OK)
    try:
        MemoryMappedTensor.from_filename(path, torch.int32, (6,), mode="r+")
    except PermissionError as err:
        assert path in str(err), err
        result = "permission-error"
    else:
        result = "no-error"
    # mode None falls back to copy-on-write and "r" is private: writes never crash
    for mode in (None, "r"):
        m = MemoryMappedTensor.from_filename(path, torch.int32, (6,), mode=mode)
        m[0] = 123
        assert m[0] == 123
    with open(path, "rb") as f:
        assert f.read(4) == bytes(4), "the read-only file changed"
    return result


def test_from_filename_r_plus_on_read_only_file(shared_dir: Path) -> None:
    """mode="r+" on a file this user may not write raises PermissionError naming it.

    Root may write any file, so as root the check runs in a child that is the user ``nobody``.
    """
    path = shared_dir / "ro.memmap"
    path.write_bytes(_bytes(torch.arange(6, dtype=torch.int32)))
    path.chmod(0o444)
    assert as_other_user(lambda: _read_only_check(str(path))) == "permission-error"


def test_from_filename_r_plus_on_a_file_the_user_may_write(shared_dir: Path) -> None:
    path = shared_dir / "rw.memmap"
    path.write_bytes(bytes(24))
    path.chmod(0o666)

    def check() -> str:
        m = MemoryMappedTensor.from_filename(str(path), torch.int32, (6,), mode="r+")
        m[0] = 5
        return "done"

    assert as_other_user(check) == "done"
    assert np.frombuffer(_file_bytes(path), dtype=np.int32)[0] == 5


def test_from_filename_short_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "short.memmap"
    path.write_bytes(bytes(10))
    for mode in (None, "r", "r+"):
        with pytest.raises(CorruptDataError) as info:
            MemoryMappedTensor.from_filename(path, torch.float32, (2, 2), mode=mode)
        msg = str(info.value)
        assert str(path) in msg and "10" in msg and "16" in msg
        assert isinstance(info.value, ValueError) and isinstance(info.value, tdshare.TdshareError)
    assert os.path.getsize(path) == 10  # never grown


def test_from_filename_missing_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "missing.memmap"
    for mode in (None, "r", "r+"):
        with pytest.raises(CorruptDataError, match="missing") as info:
            MemoryMappedTensor.from_filename(path, torch.float32, (3,), mode=mode)
        assert str(path) in str(info.value)
    assert not path.exists()  # never created


def test_from_filename_longer_file_maps_a_prefix(data_file: Path) -> None:
    m = MemoryMappedTensor.from_filename(data_file, torch.int32, (4,))
    assert m.tolist() == [0, 1, 2, 3]
    assert os.path.getsize(data_file) == 24


def test_from_filename_index(data_file: Path) -> None:
    m = MemoryMappedTensor.from_filename(data_file, torch.int32, (2, 3), index=1)
    assert type(m) is MemoryMappedTensor and m.tolist() == [3, 4, 5]
    m[0] = 30
    assert np.frombuffer(_file_bytes(data_file), dtype=np.int32)[3] == 30
    s = MemoryMappedTensor.from_filename(data_file, torch.int32, (2, 3), index=(slice(None), 2))
    assert s.tolist() == [2, 5]


def test_from_filename_other_dtype(data_file: Path) -> None:
    m = MemoryMappedTensor.from_filename(data_file, torch.int16, (12,))
    assert m.tolist()[:4] == [0, 0, 1, 0]


# -- from_storage ------------------------------------------------------------------------------
def test_from_storage_file(tmp_path: Path) -> None:
    path = tmp_path / "s.memmap"
    MemoryMappedTensor.from_tensor(torch.arange(6.0), filename=path)
    storage = torch.UntypedStorage.from_file(str(path), True, 24)
    m = MemoryMappedTensor.from_storage(storage, dtype=torch.float32)
    assert m.filename == str(path) and m.tolist() == [0, 1, 2, 3, 4, 5]
    m2 = MemoryMappedTensor.from_storage(storage, dtype=torch.float32, shape=(2, 3), filename=path)
    assert m2.shape == (2, 3) and m2.filename == str(path)
    m2[1, 2] = -5.0  # no copy: the storage, and the file
    assert m[5] == -5.0 and np.frombuffer(_file_bytes(path), dtype=np.float32)[5] == -5.0
    back = pickle.loads(pickle.dumps(m2))
    assert back.filename == str(path) and torch.equal(back, m2)
    idx = MemoryMappedTensor.from_storage(storage, dtype=torch.float32, index=slice(1, 3))
    assert type(idx) is MemoryMappedTensor and idx.tolist() == [1.0, 2.0]


def test_from_storage_filename_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "s.memmap"
    MemoryMappedTensor.from_tensor(torch.arange(6.0), filename=path)
    storage = torch.UntypedStorage.from_file(str(path), True, 24)
    with pytest.raises(RuntimeError, match="differs") as info:
        MemoryMappedTensor.from_storage(storage, dtype=torch.float32, filename=tmp_path / "other.memmap")
    assert str(path) in str(info.value) and "other.memmap" in str(info.value)


def test_from_storage_in_memory() -> None:
    storage = torch.UntypedStorage(32)
    m = MemoryMappedTensor.from_storage(storage)
    assert m.dtype == torch.int64 and m.shape == (4,)  # an untyped storage reads as int64
    m[0] = 3
    assert torch.tensor([], dtype=torch.int64).set_(storage)[0] == 3
    with pytest.raises(RuntimeError, match="no file"):
        m.filename  # noqa: B018
    with pytest.raises(RuntimeError, match="neither a file nor a shared segment"):
        pickle.dumps(m)
    f = MemoryMappedTensor.from_storage(storage, dtype=torch.float16, shape=(2, 8))
    assert f.shape == (2, 8) and f.dtype == torch.float16
    with pytest.raises(InvalidArgumentError):
        MemoryMappedTensor.from_storage(storage, shape=(5,))


def test_from_storage_typed_storage() -> None:
    t = torch.arange(4, dtype=torch.int16)
    with pytest.warns(UserWarning):
        typed = t.storage()
    m = MemoryMappedTensor.from_storage(typed)
    assert m.dtype == torch.int16 and m.tolist() == [0, 1, 2, 3]


def test_from_storage_of_anonymous_segment() -> None:
    """The storage of an anonymous MemoryMappedTensor stays shared and picklable."""
    anon = MemoryMappedTensor.from_tensor(torch.arange(4.0))
    m = MemoryMappedTensor.from_storage(anon.untyped_storage(), dtype=torch.float32, shape=(4,))
    assert m.is_anonymous and torch.equal(m, anon)
    back = pickle.loads(ForkingPickler.dumps(m))
    back[0] = 50.0
    assert anon[0] == 50.0


def test_from_storage_non_storage() -> None:
    with pytest.raises(TypeError):
        MemoryMappedTensor.from_storage(torch.zeros(3))  # type: ignore[arg-type]


# -- factories ------------------------------------------------------------------------------------
FACTORIES = {
    "empty": (lambda *a, **k: MemoryMappedTensor.empty(*a, **k), 0),
    "zeros": (lambda *a, **k: MemoryMappedTensor.zeros(*a, **k), 0),
    "ones": (lambda *a, **k: MemoryMappedTensor.ones(*a, **k), 1),
    "full": (lambda *a, **k: MemoryMappedTensor.full(*a, fill_value=2.5, **k), 2.5),
}


@pytest.mark.parametrize("name", list(FACTORIES))
@pytest.mark.parametrize("where", ["file", "anonymous"])
@pytest.mark.parametrize("size", ["ints", "tuple", "list", "torch.Size", "shape=", "tensor"])
def test_factories(tmp_path: Path, name: str, where: str, size: str) -> None:
    factory, value = FACTORIES[name]
    filename = tmp_path / f"{name}.memmap" if where == "file" else None
    args: tuple = {
        "ints": (2, 3),
        "tuple": ((2, 3),),
        "list": ([2, 3],),
        "torch.Size": (torch.Size([2, 3]),),
        "shape=": (),
        "tensor": (torch.tensor([2, 3]),),
    }[size]
    kwargs: dict = {"shape": (2, 3)} if size == "shape=" else {}
    m = factory(*args, filename=filename, **kwargs)
    assert type(m) is MemoryMappedTensor and m.shape == (2, 3)
    assert m.dtype == torch.get_default_dtype()
    assert torch.equal(m, torch.full((2, 3), float(value)))
    if filename is not None:
        assert m.filename == str(filename) and os.path.getsize(filename) == 24
        assert _file_bytes(filename) == _bytes(torch.full((2, 3), float(value)))
    else:
        assert m.is_anonymous


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.float64, torch.complex64, torch.bfloat16])
def test_factories_dtype(tmp_path: Path, dtype: torch.dtype) -> None:
    for filename in (None, tmp_path / f"{dtype}.memmap"):
        assert (
            MemoryMappedTensor.ones(3, dtype=dtype, filename=filename).tolist() == torch.ones(3, dtype=dtype).tolist()
        )
        z = MemoryMappedTensor.zeros(3, dtype=dtype, filename=filename, existsok=True)
        assert torch.equal(z, torch.zeros(3, dtype=dtype))
        f = MemoryMappedTensor.full((3,), fill_value=1, dtype=dtype, filename=filename, existsok=True)
        assert torch.equal(f, torch.ones(3, dtype=dtype))


def test_factory_scalar_shape(tmp_path: Path) -> None:
    m = MemoryMappedTensor.full((), fill_value=4.0, filename=tmp_path / "s.memmap")
    assert m.shape == () and m.item() == 4.0 and os.path.getsize(tmp_path / "s.memmap") == 4


def test_factory_existsok(tmp_path: Path) -> None:
    path = tmp_path / "a.memmap"
    path.write_bytes(b"old!")
    with pytest.raises(FileExistsRuntimeError):
        MemoryMappedTensor.zeros(1, filename=path)
    assert _file_bytes(path) == b"old!"
    m = MemoryMappedTensor.ones(1, filename=path, existsok=True)
    assert m.item() == 1.0 and _file_bytes(path) == _bytes(torch.ones(1))
    _no_temp_files(tmp_path)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((-1,), {}), ((2, -3), {}), ((2,), {"shape": (2,)}), (("a",), {}), ((2.5j,), {})],
)
def test_factory_bad_size(tmp_path: Path, args: tuple, kwargs: dict) -> None:
    with pytest.raises(InvalidArgumentError):
        MemoryMappedTensor.empty(*args, **kwargs)
    with pytest.raises(InvalidArgumentError):
        MemoryMappedTensor.zeros(*args, filename=tmp_path / "x.memmap", **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["empty_like", "zeros_like", "ones_like", "full_like"])
@pytest.mark.parametrize("where", ["file", "anonymous"])
def test_like_factories(tmp_path: Path, name: str, where: str) -> None:
    src = torch.arange(6, dtype=torch.int16).reshape(3, 2).t()
    filename = tmp_path / "like.memmap" if where == "file" else None
    fn = getattr(MemoryMappedTensor, name)
    m = fn(src, 3, filename=filename) if name == "full_like" else fn(src, filename=filename)
    expected = {"empty_like": 0, "zeros_like": 0, "ones_like": 1, "full_like": 3}[name]
    assert type(m) is MemoryMappedTensor and m.shape == src.shape and m.dtype == src.dtype
    assert torch.equal(m, torch.full(src.shape, expected, dtype=src.dtype))
    if filename is not None:
        assert m.filename == str(filename) and os.path.getsize(filename) == 12
    else:
        assert m.is_anonymous


# -- filename, sharing flags ---------------------------------------------------------------------
def test_filename_property(tmp_path: Path) -> None:
    m = MemoryMappedTensor.zeros(2, filename=tmp_path / "f.memmap")
    assert m.filename == str(tmp_path / "f.memmap")
    assert m[0].filename == m.filename  # views keep it
    anon = MemoryMappedTensor.zeros(2)
    for t in (anon, anon[0], MemoryMappedTensor(torch.zeros(2))):
        with pytest.raises(RuntimeError) as info:
            t.filename  # noqa: B018
        assert isinstance(info.value, tdshare.MemmapError)


def test_shared_flags(tmp_path: Path) -> None:
    for m in (MemoryMappedTensor.zeros(2, filename=tmp_path / "f.memmap"), MemoryMappedTensor.zeros(2)):
        assert m.is_shared()
        assert m.share_memory_() is m


def test_plain_wrap_constructor() -> None:
    t = torch.arange(3.0)
    m = MemoryMappedTensor(t)
    assert type(m) is MemoryMappedTensor and m.is_anonymous and torch.equal(m, t)
    assert type(m[1:]) is MemoryMappedTensor
    with pytest.raises(RuntimeError):
        pickle.dumps(m)


# -- views and other operations --------------------------------------------------------------------
@pytest.fixture(params=["file", "anonymous"])
def mmt(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryMappedTensor:
    src = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    if request.param == "file":
        return MemoryMappedTensor.from_tensor(src, filename=tmp_path / "v.memmap")
    return MemoryMappedTensor.from_tensor(src)


def _same_place(view: torch.Tensor, base: MemoryMappedTensor) -> bool:
    return (
        type(view) is MemoryMappedTensor
        and view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        and view._filename == base._filename
        and view._segment is base._segment
    )


@pytest.mark.parametrize(
    "index",
    [0, -1, slice(1, 3), (slice(None), 1), (1, slice(None, None, 2)), Ellipsis, (None, 0), (Ellipsis, 2)],
    ids=repr,
)
def test_basic_indexing_gives_views(mmt: MemoryMappedTensor, index: object) -> None:
    v = mmt[index]
    assert _same_place(v, mmt)
    expected = torch.arange(24, dtype=torch.float32).reshape(4, 6)[index]
    assert torch.equal(v, expected)
    torch.Tensor.fill_(v, -1.0)
    assert torch.equal(mmt[index], torch.full_like(expected, -1.0))


def test_views_write_to_the_file(tmp_path: Path) -> None:
    m = MemoryMappedTensor.from_tensor(torch.zeros(4, 6), filename=tmp_path / "v.memmap")
    m[2][3] = 5.0
    m[:, 0][1] = 7.0
    data = np.frombuffer(_file_bytes(tmp_path / "v.memmap"), dtype=np.float32)
    assert data[2 * 6 + 3] == 5.0 and data[6] == 7.0


@pytest.mark.parametrize(
    "index",
    [[0, 2], torch.tensor([1, 3]), torch.tensor([True, False, True, False]), ([0, 1], [2, 3])],
    ids=["list", "long", "mask", "pairs"],
)
def test_advanced_indexing_copies(mmt: MemoryMappedTensor, index: object) -> None:
    v = mmt[index]
    assert type(v) is torch.Tensor
    torch.Tensor.fill_(v, 100.0)
    assert mmt.max() < 100


def test_unbind_chunk_split_give_views(mmt: MemoryMappedTensor) -> None:
    parts = {
        "unbind0": mmt.unbind(0),
        "unbind1": mmt.unbind(1),
        "unbind_default": mmt.unbind(),
        "chunk": mmt.chunk(2),
        "chunk1": mmt.chunk(3, dim=1),
        "split": mmt.split(3),
        "split_sizes": mmt.split([1, 5], dim=1),
        "torch.unbind": tuple(torch.unbind(mmt, 0)),
    }
    for name, seq in parts.items():
        if name == "torch.unbind":
            continue  # torch functions are disabled for the subclass: plain tensors are fine
        assert seq and all(_same_place(p, mmt) for p in seq), name
    assert len(parts["unbind1"]) == 6 and parts["unbind1"][2].tolist() == [2.0, 8.0, 14.0, 20.0]
    torch.Tensor.fill_(parts["split_sizes"][0], -2.0)
    assert mmt[:, 0].tolist() == [-2.0] * 4


@pytest.mark.parametrize(
    "op",
    [
        lambda m: m.view(6, 4),
        lambda m: m.reshape(-1),
        lambda m: m.t(),
        lambda m: m.clone(),
        lambda m: m + 1,
        lambda m: m.sum(),
        lambda m: m * m,
        lambda m: m.to("meta"),
        lambda m: m.to(torch.float64),
        lambda m: m.contiguous().flatten(),
        lambda m: torch.stack([m, m]),
        lambda m: m.detach(),
        lambda m: m.view(torch.int32),
    ],
)
def test_other_ops_give_plain_tensors(mmt: MemoryMappedTensor, op: object) -> None:
    out = op(mmt)  # type: ignore[operator]
    assert type(out) is torch.Tensor


def test_in_place_ops_keep_the_mapping(tmp_path: Path) -> None:
    m = MemoryMappedTensor.from_tensor(torch.zeros(3), filename=tmp_path / "i.memmap")
    m.add_(2)
    m.mul_(3)
    m.copy_(m + 1)
    assert m.tolist() == [7.0, 7.0, 7.0]
    assert np.frombuffer(_file_bytes(tmp_path / "i.memmap"), dtype=np.float32).tolist() == [7.0, 7.0, 7.0]


# -- pickling --------------------------------------------------------------------------------------
def test_pickle_file_backed_is_a_small_handle(tmp_path: Path) -> None:
    small = MemoryMappedTensor.from_tensor(torch.arange(10.0), filename=tmp_path / "s.memmap")
    big = MemoryMappedTensor.from_tensor(torch.zeros(1_000_000), filename=tmp_path / "b.memmap")
    ps, pb = pickle.dumps(small), pickle.dumps(big)
    assert len(pb) < 1000
    assert abs(len(pb) - len(ps)) <= 8  # a few bytes of integers, never the data
    assert len(ForkingPickler.dumps(big)) < 1000
    back = pickle.loads(pb)
    assert type(back) is MemoryMappedTensor and back.filename == big.filename and back.shape == big.shape
    back[0] = 4.0
    assert big[0] == 4.0  # the same file, mapped again


def test_pickle_anonymous_is_a_small_handle() -> None:
    small = MemoryMappedTensor.from_tensor(torch.arange(10.0))
    big = MemoryMappedTensor.zeros(1_000_000)
    ps, pb = ForkingPickler.dumps(small), ForkingPickler.dumps(big)
    assert len(pb) < 1000 and abs(len(pb) - len(ps)) <= 16
    back = pickle.loads(pb)
    assert type(back) is MemoryMappedTensor and back.is_anonymous and back.shape == big.shape
    back[-1] = 3.0
    assert big[-1] == 3.0


@pytest.mark.parametrize(
    "make_view",
    [
        lambda m: m[1],
        lambda m: m[1:3],
        lambda m: m[:, 1],
        lambda m: m[::2, 1::3],
        lambda m: m[1:][1:][:, 2:],
        lambda m: m.unbind(1)[4],
        lambda m: m.split(2, dim=1)[1][1:],
        lambda m: m[3, 5],
    ],
)
@pytest.mark.parametrize("how", ["pickle", "forking"])
def test_pickle_keeps_view_geometry(mmt: MemoryMappedTensor, make_view: object, how: str) -> None:
    view = make_view(mmt)  # type: ignore[operator]
    assert type(view) is MemoryMappedTensor
    data = pickle.dumps(view) if how == "pickle" else ForkingPickler.dumps(view)
    back = pickle.loads(data)
    assert type(back) is MemoryMappedTensor
    assert back.shape == view.shape and back.stride() == view.stride() and torch.equal(back, view)
    assert back._filename == view._filename
    torch.Tensor.fill_(back, -9.0)
    assert torch.equal(view, torch.full_like(view, -9.0))  # the same memory as the parent's view


def test_pickle_keeps_mode(data_file: Path) -> None:
    r = MemoryMappedTensor.from_filename(data_file, torch.int32, (6,), mode="r")
    back = pickle.loads(pickle.dumps(r[2:]))
    assert back._mode == "r" and back.tolist() == [2, 3, 4, 5]
    back[0] = 77  # private again in the receiver
    assert np.frombuffer(_file_bytes(data_file), dtype=np.int32)[2] == 2


def test_pickle_of_deleted_file_raises_clearly(tmp_path: Path) -> None:
    m = MemoryMappedTensor.from_tensor(torch.arange(3.0), filename=tmp_path / "gone.memmap")
    data = pickle.dumps(m)
    os.unlink(tmp_path / "gone.memmap")
    with pytest.raises(CorruptDataError, match=r"gone\.memmap"):
        pickle.loads(data)


# -- every dtype -------------------------------------------------------------------------------------
_DTYPE_NAMES = [
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]
DTYPES = [getattr(torch, n) for n in _DTYPE_NAMES if hasattr(torch, n)]


def _sample(dtype: torch.dtype, n: int = 7) -> torch.Tensor:
    """``n`` elements of ``dtype`` with every byte pattern the dtype allows."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
def test_every_dtype_round_trips_through_a_file(tmp_path: Path, dtype: torch.dtype) -> None:
    src = _sample(dtype).reshape(7, 1)
    path = tmp_path / "x.memmap"
    m = MemoryMappedTensor.from_tensor(src, filename=path)
    assert m.dtype == dtype and m.shape == (7, 1)
    assert _file_bytes(path) == _bytes(src)
    assert os.path.getsize(path) == 7 * dtype.itemsize
    back = MemoryMappedTensor.from_filename(path, dtype, (7, 1))
    assert back.dtype == dtype and _bytes(back) == _bytes(src)
    unpickled = pickle.loads(pickle.dumps(m[2:]))
    assert unpickled.dtype == dtype and _bytes(unpickled) == _bytes(src[2:])
    anon = MemoryMappedTensor.from_tensor(src)
    assert anon.dtype == dtype and _bytes(anon) == _bytes(src)
    anon_back = pickle.loads(ForkingPickler.dumps(anon[1:]))
    assert _bytes(anon_back) == _bytes(src[1:])
    empty = MemoryMappedTensor.empty(3, dtype=dtype, filename=tmp_path / "e.memmap")
    assert empty.dtype == dtype and _file_bytes(tmp_path / "e.memmap") == bytes(3 * dtype.itemsize)


# -- running out of space ------------------------------------------------------------------------------
PIB = 2**50


def test_reserving_more_than_the_disk_raises_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "huge.memmap"
    with pytest.raises(OSError) as info:
        MemoryMappedTensor.empty(PIB // 4, dtype=torch.float32, filename=path)
    assert str(path) in str(info.value) and str(PIB) in str(info.value)
    assert list(tmp_path.iterdir()) == []  # nothing half-made left behind
    with pytest.raises(OSError, match=r"huge2\.memmap"):
        MemoryMappedTensor.from_tensor(
            torch.zeros(()), shape=(PIB,), filename=tmp_path / "huge2.memmap", copy_data=False
        )
    with pytest.raises(OSError, match=r"huge3\.memmap"):
        MemoryMappedTensor.zeros_like(torch.zeros(()).expand(PIB // 4), filename=tmp_path / "huge3.memmap")
    assert list(tmp_path.iterdir()) == []


def test_failed_reserve_keeps_the_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "keep.memmap"
    old = MemoryMappedTensor.from_tensor(torch.arange(4.0), filename=path)
    with pytest.raises(OSError, match=r"keep\.memmap"):
        MemoryMappedTensor.empty(PIB, dtype=torch.uint8, filename=path, existsok=True)
    assert _file_bytes(path) == _bytes(torch.arange(4.0)) and old.tolist() == [0, 1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["keep.memmap"]


FSIZE_CHECK = """
    import os, resource, signal, sys, torch
    from tdshare import MemoryMappedTensor
    folder = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    for name, make in [
        ("copy.memmap", lambda p: MemoryMappedTensor.from_tensor(torch.ones(1 << 19), filename=p)),
        ("reserve.memmap", lambda p: MemoryMappedTensor.zeros(1 << 19, filename=p)),
    ]:
        path = os.path.join(folder, name)
        try:
            make(path)
        except OSError as err:
            assert path in str(err), err
            print("raised", name)
        assert not os.path.exists(path), "a partial file was left behind"
    ok = MemoryMappedTensor.from_tensor(torch.ones(1000), filename=os.path.join(folder, "small.memmap"))
    assert ok.sum() == 1000
    print(sorted(os.listdir(folder)))
"""


def test_disk_full_while_writing_raises_naming_the_path(tmp_path: Path) -> None:
    """A file-size limit stands in for a full disk: the write fails with OSError naming the path."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FSIZE_CHECK), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["raised copy.memmap", "raised reserve.memmap", "['small.memmap']"]


# -- devices ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "meta", torch.device("meta")])
def test_non_cpu_device_errors(tmp_path: Path, device: object) -> None:
    for make in (
        lambda: MemoryMappedTensor.empty(3, device=device),
        lambda: MemoryMappedTensor.zeros(3, device=device, filename=tmp_path / "d.memmap"),
        lambda: MemoryMappedTensor.ones(3, device=device),
        lambda: MemoryMappedTensor.full(3, fill_value=1, device=device),
        lambda: MemoryMappedTensor.from_storage(torch.UntypedStorage(8), device=device),
    ):
        with pytest.raises(RuntimeError, match="CPU"):
            make()
    assert list(tmp_path.iterdir()) == []
    assert MemoryMappedTensor.zeros(2, device="cpu").device.type == "cpu"


def test_meta_tensor_has_no_data(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="meta"):
        MemoryMappedTensor.from_tensor(torch.empty(3, device="meta"), filename=tmp_path / "m.memmap")
    with pytest.raises(NotImplementedError, match="meta"):
        MemoryMappedTensor.from_tensor(torch.empty(3, device="meta"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_is_copied_to_cpu(tmp_path: Path) -> None:
    src = torch.arange(6.0, device="cuda").reshape(2, 3)
    for filename in (None, tmp_path / "c.memmap"):
        m = MemoryMappedTensor.from_tensor(src, filename=filename)
        assert m.device.type == "cpu" and torch.equal(m, src.cpu())
