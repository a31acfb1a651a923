"""MemoryMappedTensor behaviours that tensordict's own test suite checks (tdshare/_memmap.py).

A factory called with no shape, writes through a symbolic link, and the anonymous memory's
handler (``_handler``, ``from_handler``).
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch

import tdshare
from tdshare import MemoryMappedTensor, TensorDict
from tdshare._memmap import SharedMemoryHandle

FACTORIES: dict[str, Callable[..., MemoryMappedTensor]] = {
    "empty": MemoryMappedTensor.empty,
    "zeros": MemoryMappedTensor.zeros,
    "ones": MemoryMappedTensor.ones,
    "full": lambda *a, **k: MemoryMappedTensor.full(*a, fill_value=3, **k),
}


def _from_handler(*args: Any, **kwargs: Any) -> MemoryMappedTensor:
    with pytest.warns(DeprecationWarning, match="from_handler"):
        return MemoryMappedTensor.from_handler(*args, **kwargs)


# -- a factory needs a shape ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(FACTORIES))
@pytest.mark.parametrize("where", ["file", "anonymous"])
def test_factory_without_shape_raises_type_error(tmp_path: Path, name: str, where: str) -> None:
    filename = tmp_path / "x.memmap" if where == "file" else None
    with pytest.raises(TypeError, match=r"shape is required.*zeros\(\(\)\)") as info:
        FACTORIES[name](filename=filename)
    assert isinstance(info.value, tdshare.ArgumentTypeError)
    with pytest.raises(TypeError):
        FACTORIES[name](shape=None, filename=filename)
    assert list(tmp_path.iterdir()) == []  # nothing was created


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factory_empty_shape_is_a_0d_tensor(tmp_path: Path, name: str) -> None:
    expected = {"empty": 0.0, "zeros": 0.0, "ones": 1.0, "full": 3.0}[name]
    a = FACTORIES[name]((), filename=tmp_path / "a.memmap")
    b = FACTORIES[name](shape=(), dtype=torch.int16)
    assert a.shape == () and a.item() == expected and os.path.getsize(tmp_path / "a.memmap") == 4
    assert b.shape == () and b.dtype == torch.int16 and b.item() == int(expected)


# -- symbolic links are refused ---------------------------------------------------------------------
@pytest.fixture
def link(tmp_path: Path) -> Path:
    target = tmp_path / "target"
    target.write_bytes(b"unchanged")
    path = tmp_path / "file.memmap"
    path.symlink_to(target)
    return path


@pytest.mark.parametrize("existsok", [True, False])
@pytest.mark.parametrize(
    "make",
    [
        lambda f, ok: MemoryMappedTensor.from_tensor(torch.arange(4.0), filename=f, existsok=ok),
        lambda f, ok: MemoryMappedTensor.from_tensor(torch.zeros(()), filename=f, existsok=ok, copy_data=False),
        lambda f, ok: MemoryMappedTensor.from_tensor(torch.zeros(0), filename=f, existsok=ok),
        lambda f, ok: MemoryMappedTensor.zeros(3, filename=f, existsok=ok),
        lambda f, ok: MemoryMappedTensor.full((2,), fill_value=1, filename=f, existsok=ok),
        lambda f, ok: MemoryMappedTensor.ones(0, filename=f, existsok=ok),
    ],
    ids=["from_tensor", "from_tensor-no-copy", "from_tensor-empty", "zeros", "full", "ones-empty"],
)
def test_write_through_symlink_is_refused(link: Path, make: Callable[[Path, bool], Any], existsok: bool) -> None:
    with pytest.raises(RuntimeError, match="through symlink") as info:
        make(link, existsok)
    assert isinstance(info.value, tdshare.MemmapError)
    assert str(link) in str(info.value)
    assert link.is_symlink() and (link.parent / "target").read_bytes() == b"unchanged"
    assert sorted(p.name for p in link.parent.iterdir()) == ["file.memmap", "target"]


def test_dangling_symlink_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "file.memmap"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(RuntimeError, match="through symlink"):
        MemoryMappedTensor.from_tensor(torch.ones(2), filename=link, existsok=True)
    assert not (tmp_path / "nowhere").exists()


def test_symlinked_folder_above_the_file_is_allowed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    m = MemoryMappedTensor.from_tensor(torch.arange(3, dtype=torch.int32), filename=tmp_path / "alias" / "a.memmap")
    assert (tmp_path / "real" / "a.memmap").read_bytes() == torch.arange(3, dtype=torch.int32).numpy().tobytes()
    assert m.tolist() == [0, 1, 2]


# -- the anonymous memory's handler -----------------------------------------------------------------
def test_handler_is_none_without_anonymous_memory(tmp_path: Path) -> None:
    on_file = MemoryMappedTensor.from_tensor(torch.ones(3), filename=tmp_path / "f.memmap")
    assert on_file._handler is None and on_file[1:]._handler is None
    assert MemoryMappedTensor(torch.ones(3))._handler is None  # a plain wrapped tensor
    assert MemoryMappedTensor.zeros(0)._handler is None  # nothing to share


def test_views_share_their_base_handler() -> None:
    t = MemoryMappedTensor.from_tensor(torch.zeros(10))
    y = t[:4]
    z = y[1:][0]  # a view of a view, asked before the base's handler exists
    assert z._handler is t._handler and y._handler is t._handler
    assert all(p._handler is t._handler for p in (*t.chunk(3), *t.split(4), t[::2], t[None]))
    parts = MemoryMappedTensor.from_tensor(torch.zeros(2, 3))
    assert all(p._handler is parts._handler for p in (*parts.unbind(0), *parts.chunk(2), *parts.split(1, dim=1)))
    assert MemoryMappedTensor.from_tensor(t) is t  # an anonymous input is returned as is
    h = t._handler
    assert isinstance(h, SharedMemoryHandle) and (h.offset, h.nbytes) == (0, 40)


def test_from_handler_maps_the_same_memory() -> None:
    t = MemoryMappedTensor.from_tensor(torch.arange(6, dtype=torch.float32))
    u = _from_handler(t._handler, dtype=torch.float32, shape=(2, 3), index=None)
    assert type(u) is MemoryMappedTensor and u.shape == (2, 3) and u.is_anonymous
    assert u.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    u[1, 2] = -7.0
    assert t[5].item() == -7.0  # one memory: writes through either are seen by both
    t[0] = 9.0
    assert u[0, 0].item() == 9.0
    assert u._handler is t._handler
    assert pickle.loads(ForkingPickler.dumps(u)).tolist() == u.tolist()  # it pickles like any anonymous tensor


def test_from_handler_dtype_prefix_and_index() -> None:
    t = MemoryMappedTensor.from_tensor(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64))
    as_int = _from_handler(t._handler, torch.int64, (4,))
    assert as_int.tolist() == torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).view(torch.int64).tolist()
    prefix = _from_handler(t._handler, torch.float64, torch.Size([2]))
    assert prefix.tolist() == [1.0, 2.0]
    picked = _from_handler(t._handler, torch.float64, [2, 2], index=(slice(None), 1))
    assert type(picked) is MemoryMappedTensor and picked.tolist() == [2.0, 4.0]
    picked[0] = 20.0
    assert t[1].item() == 20.0


def test_from_handler_of_a_leaf_of_an_anonymous_tensordict() -> None:
    # leaves of one tensordict share a segment: a leaf's handler covers that leaf, not the segment's start
    td = TensorDict({"a": torch.arange(3.0), "b": torch.arange(5.0) + 10}, batch_size=[]).memmap_()
    b = td["b"]
    assert b._handler is not None and b._handler.segment is td["a"]._handler.segment
    back = _from_handler(b._handler, torch.float32, (5,))
    assert back.tolist() == [10.0, 11.0, 12.0, 13.0, 14.0]
    back[0] = -1.0
    assert td["b"][0].item() == -1.0 and td["a"].tolist() == [0.0, 1.0, 2.0]


def test_handler_pickles_by_descriptor() -> None:
    t = MemoryMappedTensor.from_tensor(torch.arange(4, dtype=torch.int32))
    h = pickle.loads(ForkingPickler.dumps(t._handler))
    assert isinstance(h, SharedMemoryHandle) and h is not t._handler and (h.offset, h.nbytes) == (0, 16)
    again = _from_handler(h, torch.int32, (4,))  # a second mapping of the same memory
    again[3] = 42
    assert t.tolist() == [0, 1, 2, 42]


def test_from_handler_errors(tmp_path: Path) -> None:
    t = MemoryMappedTensor.from_tensor(torch.zeros(3))
    with pytest.raises(ValueError, match="needs 16 bytes") as too_big:
        _from_handler(t._handler, torch.float32, (4,))
    assert isinstance(too_big.value, tdshare.InvalidArgumentError)
    with pytest.raises(ValueError, match="offset"):  # offset 4 of a float64 view
        _from_handler(SharedMemoryHandle(t._handler.segment, 4, 8), torch.float64, (1,))
    on_file = MemoryMappedTensor.from_tensor(torch.zeros(3), filename=tmp_path / "f.memmap")
    with pytest.raises(TypeError, match="from_filename") as no_handler:
        _from_handler(on_file._handler, torch.float32, (3,))
    assert isinstance(no_handler.value, tdshare.ArgumentTypeError)
    nested = _from_handler(t._handler, torch.float32, torch.tensor([[1], [2]]))  # a tensor of shapes: nested
    assert nested.is_nested and [list(p.shape) for p in nested.unbind()] == [[1], [2]]


def test_from_handler_warns_deprecation() -> None:
    t = MemoryMappedTensor.from_tensor(torch.zeros(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MemoryMappedTensor.from_handler(t._handler, torch.float32, (2,))
    assert [w.category for w in caught] == [DeprecationWarning]
    assert caught[0].filename == __file__  # attributed to the caller


def test_memmap_in_place_of_a_sub_tensordict_view_is_refused_as_the_reference(tmp_path: Path) -> None:
    import tensordict

    for lib in (tdshare, tensordict):
        td = lib.TensorDict(a=torch.zeros(4, 3), batch_size=[4, 3])
        sub = td._get_sub_tensordict((slice(None), slice(0, 2)))
        with pytest.raises(RuntimeError, match="Converting a sub-tensordict values to memmap cannot be done"):
            sub.memmap_(tmp_path / lib.__name__)
        assert not os.path.exists(tmp_path / lib.__name__ / "meta.json")
        copy = sub.memmap(tmp_path / f"{lib.__name__}-copy", copy_existing=True)
        assert copy.is_memmap() and copy["a"].shape == (4, 2)
