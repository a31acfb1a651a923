"""MemoryMappedTensor behaviours that tensordict's own test suite checks (tdshare/_memmap.py).

A factory called with no shape, and writes through a symbolic link.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tdshare
from tdshare import MemoryMappedTensor

FACTORIES: dict[str, Callable[..., MemoryMappedTensor]] = {
    "empty": MemoryMappedTensor.empty,
    "zeros": MemoryMappedTensor.zeros,
    "ones": MemoryMappedTensor.ones,
    "full": lambda *a, **k: MemoryMappedTensor.full(*a, fill_value=3, **k),
}


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
