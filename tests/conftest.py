"""Shared fixtures: every test writes under its own tmp_path."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import tdshare


@pytest.fixture
def td_nested() -> tdshare.TensorDict:
    """A small nested tensordict with several dtypes and a non-tensor value."""
    return tdshare.TensorDict(
        {
            "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
            "b": torch.tensor([True, False, True]),
            "n": {"c": torch.arange(3, dtype=torch.int64), "d": torch.ones(3, 2, dtype=torch.float16)},
            "s": "hello",
        },
        batch_size=[3],
    )


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user can enter (tmp_path's parents are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="tdshare-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
