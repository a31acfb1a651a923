"""Nested tensors (strided layout) as leaves, in the reference's layout: the packed elements in
``<key>.memmap``, the pieces' shapes in ``<key>.shape.memmap``, ``"is_nested": true`` in meta.json."""

from __future__ import annotations

import json
import multiprocessing as mp
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import tdshare
from tdshare import TensorDict

METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
WAIT = 60
BACKENDS = ["folder", "anonymous", "archive"]

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")


def _nt() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.arange(6.0).reshape(2, 3), torch.full((4, 3), 7.0)])


def _pieces(t: torch.Tensor) -> list[list[list[float]]]:
    assert t.is_nested
    return [p.tolist() for p in t.unbind()]


def _td() -> TensorDict:
    return TensorDict(nt=_nt(), x=torch.arange(2.0), n={"inner": _nt()}, batch_size=[2])


def _target(backend: str, tmp_path: Path) -> Path | None:
    return {"folder": tmp_path / "td", "anonymous": None, "archive": tmp_path / "td.tdz"}[backend]


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_leaves_round_trip(tmp_path: Path, backend: str) -> None:
    out = _td().memmap(_target(backend, tmp_path))
    assert _pieces(out["nt"]) == _pieces(_nt()) and _pieces(out["n", "inner"]) == _pieces(_nt())
    if backend != "anonymous":
        back = tdshare.load(_target(backend, tmp_path))
        assert _pieces(back["nt"]) == _pieces(_nt()) and back["x"].tolist() == [0.0, 1.0]


def test_the_reference_layout(tmp_path: Path) -> None:
    _td().memmap_(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["nt"] == {"device": "cpu", "shape": [2, 2], "dtype": "torch.float32", "is_nested": True}
    assert (tmp_path / "nt.shape.memmap").read_bytes() == torch.tensor([[2, 3], [4, 3]]).numpy().tobytes()
    packed = torch.cat([torch.arange(6.0), torch.full((12,), 7.0)])
    assert (tmp_path / "nt.memmap").read_bytes() == packed.numpy().tobytes()


def test_a_loaded_nested_leaf_maps_its_file(tmp_path: Path) -> None:
    _td().memmap_(tmp_path)
    a, b = TensorDict.load(tmp_path), TensorDict.load(tmp_path)
    a["nt"].unbind()[1][0, 0] = -1.0
    assert b["nt"].unbind()[1][0, 0].item() == -1.0 and TensorDict.load(tmp_path)["nt"].unbind()[1][0, 0] == -1.0


def test_compatible_with_tensordict_both_ways(tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    _td().memmap_(tmp_path / "ours")
    ref = tensordict.TensorDict.load_memmap(tmp_path / "ours")
    assert [p.tolist() for p in torch.Tensor.unbind(ref["nt"], 0)] == _pieces(_nt())
    theirs = tensordict.TensorDict(nt=_nt(), batch_size=[2])
    theirs.memmap(tmp_path / "theirs")
    assert _pieces(TensorDict.load(tmp_path / "theirs")["nt"]) == _pieces(_nt())


def _jagged() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor(
            [torch.arange(6.0).view(2, 3), torch.arange(12.0).view(4, 3)], layout=torch.jagged
        )


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_jagged_nested_tensor_round_trips_as_jagged(tmp_path: Path, backend: str) -> None:
    out = TensorDict(j=_jagged(), batch_size=[2]).memmap(_target(backend, tmp_path))
    assert out["j"].layout is torch.jagged and _pieces(out["j"]) == _pieces(_jagged())
    if backend != "anonymous":
        back = tdshare.load(_target(backend, tmp_path))
        assert back["j"].layout is torch.jagged and _pieces(back["j"]) == _pieces(_jagged())


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_reference_reads_a_jagged_leaf_as_strided(tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    TensorDict(j=_jagged(), batch_size=[2]).memmap_(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["j"]["is_nested"] is True and meta["j"]["_tdshare_jagged"] is True
    ref = tensordict.TensorDict.load_memmap(tmp_path)
    assert [p.tolist() for p in torch.Tensor.unbind(ref["j"], 0)] == _pieces(_jagged())


def test_a_key_that_collides_with_the_size_table_is_refused(tmp_path: Path) -> None:
    td = TensorDict({"nt": _nt(), "nt.shape": torch.zeros(2)}, batch_size=[2])
    with pytest.raises(ValueError, match=r"nt\.shape"):
        td.memmap(tmp_path / "td")
    assert not (tmp_path / "td").exists()


def _child(td: TensorDict, out: Any) -> None:
    piece = td["nt"].unbind()[0]
    piece[0, 0] = 100.0
    out.put(_pieces(td["nt"]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["folder", "anonymous"])
@pytest.mark.parametrize("method", METHODS)
def test_a_child_writes_into_the_parents_nested_leaf(tmp_path: Path, method: str, backend: str) -> None:
    td = _td().memmap_(_target(backend, tmp_path))
    ctx = mp.get_context(method)
    out = ctx.Queue()
    proc = ctx.Process(target=_child, args=(td, out))
    proc.start()
    seen = out.get(timeout=WAIT)
    proc.join(WAIT)
    assert proc.exitcode == 0 and seen[0][0][0] == 100.0
    assert td["nt"].unbind()[0][0, 0].item() == 100.0  # the parent's memory


SHAPES = torch.tensor([[2, 3], [2, 4], [3, 2]])


def _pieces_shapes(t: torch.Tensor) -> list[list[int]]:
    return [list(p.shape) for p in t.unbind()]


def test_make_memmap_with_a_tensor_of_shapes(tmp_path: Path) -> None:
    td = TensorDict(x=torch.zeros(3), batch_size=[3]).memmap_(tmp_path)
    out = td.make_memmap("nt", SHAPES, dtype=torch.int32)
    assert isinstance(out, tdshare.MemoryMappedTensor) and out.is_nested and out.filename == str(tmp_path / "nt.memmap")
    assert _pieces_shapes(out) == SHAPES.tolist() and out.dtype == torch.int32
    out.unbind()[2].fill_(5)
    loaded = TensorDict.load(tmp_path)["nt"]
    assert _pieces_shapes(loaded) == SHAPES.tolist() and loaded.unbind()[2].tolist() == [[5, 5]] * 3
    assert (tmp_path / "nt.shape.memmap").read_bytes() == SHAPES.numpy().tobytes()


def test_make_memmap_from_tensor_and_from_storage_with_nested_shapes(tmp_path: Path) -> None:
    td = TensorDict(x=torch.zeros(3), batch_size=[3]).memmap_(tmp_path)
    copied = td.make_memmap_from_tensor("a", _nt3())
    assert [p.tolist() for p in copied.unbind()] == [p.tolist() for p in _nt3().unbind()]
    storage = torch.UntypedStorage.from_file(str(tmp_path / "b.memmap"), shared=True, nbytes=4 * 20)
    viewed = td.make_memmap_from_storage("b", storage, SHAPES)
    assert viewed.is_nested and _pieces_shapes(viewed) == SHAPES.tolist()
    torch.Tensor.as_subclass(viewed.unbind()[0], torch.Tensor)[0, 0] = 8.0  # the storage's own memory
    assert torch.frombuffer(bytearray(bytes(storage)[:4]), dtype=torch.float32).item() == 8.0
    other = TensorDict.load(tmp_path)
    assert _pieces_shapes(other["b"]) == SHAPES.tolist() and [p.tolist() for p in other["a"].unbind()] == [
        p.tolist() for p in _nt3().unbind()
    ]


def _nt3() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.ones(2), torch.zeros(3), torch.arange(1.0)])


def test_another_process_sees_a_nested_entry_after_a_refresh(tmp_path: Path) -> None:
    td = TensorDict(x=torch.zeros(3), batch_size=[3]).memmap_(tmp_path)
    other = TensorDict.load(tmp_path).memmap_()
    other.make_memmap("late", torch.tensor([[1], [2], [3]]))
    td.memmap_refresh_()
    assert _pieces_shapes(td["late"]) == [[1], [2], [3]]


@pytest.mark.parametrize(
    ("batch", "shapes", "match"),
    [([3], torch.tensor([[1], [2]]), "2 pieces"), ([3, 2], torch.tensor([[2, 1], [3, 1], [2, 5]]), "ragged")],
)
def test_nested_shapes_that_disagree_with_the_batch_are_refused(
    tmp_path: Path, batch: list[int], shapes: torch.Tensor, match: str
) -> None:
    td = TensorDict(y=torch.zeros(batch), batch_size=batch).memmap_(tmp_path)
    with pytest.raises(tdshare.BatchSizeError, match=match):
        td.make_memmap("bad", shapes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json", "y.memmap"]


@pytest.mark.parametrize("bad", [torch.tensor([2, 3]), torch.tensor([[1.5, 2.0]]), torch.tensor([[-1, 2]])])
def test_a_malformed_tensor_of_shapes_is_refused(tmp_path: Path, bad: torch.Tensor) -> None:
    td = TensorDict(x=torch.zeros(1), batch_size=[1]).memmap_(tmp_path)
    with pytest.raises(RuntimeError, match="tensor of shapes"):
        td.make_memmap("bad", bad)


def test_a_nested_entry_needs_a_folder() -> None:
    td = TensorDict(x=torch.zeros(3), batch_size=[3]).memmap_()
    with pytest.raises(NotImplementedError, match="folder"):
        td.make_memmap("nt", SHAPES)


@pytest.mark.parametrize("anonymous", [False, True])
@pytest.mark.parametrize(("factory", "fill"), [("empty", 0), ("zeros", 0), ("ones", 1)])
def test_memory_mapped_tensor_constructors_take_a_tensor_of_shapes(
    tmp_path: Path, anonymous: bool, factory: str, fill: int
) -> None:
    filename = None if anonymous else tmp_path / "x.memmap"
    t = getattr(tdshare.MemoryMappedTensor, factory)(SHAPES, dtype=torch.int32, filename=filename)
    assert type(t) is tdshare.MemoryMappedTensor and t.is_nested and t.dtype == torch.int32
    assert _pieces_shapes(t) == SHAPES.tolist() and all((p == fill).all() for p in t.unbind())
    assert (t._filename is None) == anonymous and (t._handler is not None) == anonymous


def test_memory_mapped_tensor_from_a_nested_tensor_and_back_from_its_file(tmp_path: Path) -> None:
    src = _nt3()
    m = tdshare.MemoryMappedTensor.from_tensor(src, filename=tmp_path / "n.memmap")
    assert type(m) is tdshare.MemoryMappedTensor and [p.tolist() for p in m.unbind()] == [
        p.tolist() for p in src.unbind()
    ]
    table = torch.tensor([[2], [3], [1]])
    again = tdshare.MemoryMappedTensor.from_filename(tmp_path / "n.memmap", dtype=torch.float32, shape=table)
    assert [p.tolist() for p in again.unbind()] == [p.tolist() for p in src.unbind()]
    anon = tdshare.MemoryMappedTensor.from_tensor(src)
    with pytest.warns(DeprecationWarning):
        view = tdshare.MemoryMappedTensor.from_handler(anon._handler, torch.float32, table)
    torch.Tensor.as_subclass(view.unbind()[1], torch.Tensor)[0] = 4.0  # the same memory
    assert anon.unbind()[1][0].item() == 4.0


def test_a_nested_leaf_inside_a_two_dim_batch(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nt = torch.nested.nested_tensor([torch.arange(12.0).view(3, 4), torch.arange(15.0).view(3, 5)])
    td = TensorDict({"a": nt}, batch_size=[2, 3])
    td.memmap(tmp_path)
    back = TensorDict.load(tmp_path)
    assert back.batch_size == (2, 3) and (back[1, 2]["a"] == td[1, 2]["a"]).all()
    with pytest.raises(tdshare.BatchSizeError, match="'a'"):
        TensorDict({"a": nt}, batch_size=[2, 4])


def _jagged_child(td: TensorDict, out: Any) -> None:
    piece = td["j"].unbind()[1]
    piece[0, 0] = -5.0
    out.put(td["j"].layout is torch.jagged)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_a_child_writes_into_the_parents_jagged_leaf(tmp_path: Path, method: str) -> None:
    td = TensorDict(j=_jagged(), batch_size=[2]).memmap_(tmp_path / "td")
    ctx = mp.get_context(method)
    out = ctx.Queue()
    proc = ctx.Process(target=_jagged_child, args=(td, out))
    proc.start()
    assert out.get(timeout=WAIT) is True
    proc.join(WAIT)
    assert proc.exitcode == 0 and td["j"].unbind()[1][0, 0].item() == -5.0
