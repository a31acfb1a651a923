"""MemoryMappedTensor behaviours that tensordict's own test suite checks (tdshare/_memmap.py).

A factory called with no shape.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

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
