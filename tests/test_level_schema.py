"""Equal levels planned once (:mod:`tdshare._level_schema`) and their leaf files created relative to
the folder's descriptor (:func:`tdshare._files.write_files_in`): the same files, byte for byte, as
the per-entry plan and the reference write, and errors that name the file."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch

import tdshare._level_schema
from tdshare import TensorDict
from tdshare._lazy_leaves import PendingLeaf, raw_items
from tdshare._plan import plan_tree

pytestmark = pytest.mark.timeout(120)

LEAVES = 12  # over _files._AT_MIN: the files are created relative to the folder's descriptor


def _level(j0: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    out = {f"x{j}": torch.full((4,), float(j + j0), dtype=dtype) for j in range(LEAVES)}
    out["m"] = torch.arange(6, dtype=torch.int16).reshape(2, 3) + j0  # another shape, same every level
    return out


def _tree(lib: Any) -> Any:
    """Equal levels, and levels that differ from them in one way each."""
    td = lib.TensorDict({f"g{i}": _level(i) for i in range(5)}, [])
    td["f64"] = lib.TensorDict(_level(7, torch.float64), [])  # other dtypes
    td["batched"] = lib.TensorDict({k: v.expand(2, *v.shape).clone() for k, v in _level(8).items()}, [2])
    td["named"] = lib.TensorDict({k: v.expand(2, *v.shape).clone() for k, v in _level(9).items()}, [2], names=["t"])
    td["odd"] = lib.TensorDict({**_level(10), "not plain": torch.ones(2), "empty": torch.zeros(0)}, [])
    td["few"] = lib.TensorDict({"a": torch.ones(2), "b": torch.zeros(3)}, [])  # under _AT_MIN
    return td


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_equal_levels_share_one_schema(tmp_path: Path) -> None:
    root = plan_tree(_tree(tdshare), str(tmp_path / "t"), True, False, True)
    levels = dict(root.children)
    schemas = {key: level.schema for key, level in levels.items()}
    assert all(schemas[f"g{i}"] is schemas["g0"] for i in range(5)) and schemas["g0"] is not None
    others = [schemas[k] for k in ("f64", "batched", "named", "few")]
    assert None not in others and len({id(s) for s in [schemas["g0"], *others]}) == 5
    assert schemas["odd"] is None and root.schema is None  # planned entry by entry
    assert levels["g3"].plain[2][1] == str(tmp_path / "t" / "g3" / "x2.memmap")
    assert torch.equal(levels["g3"].plain[2][0], torch.full((4,), 5.0))


def test_the_files_are_those_of_the_per_entry_plan_and_of_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _tree(tdshare)
    out.memmap_(tmp_path / "schema")
    with monkeypatch.context() as patch:
        patch.setattr(tdshare._level_schema.SchemaCache, "of", lambda *_: None)
        _tree(tdshare).memmap_(tmp_path / "entries")
    _tree(tensordict).memmap_(tmp_path / "reference")
    ours = _files(tmp_path / "schema")
    assert ours == _files(tmp_path / "entries") == _files(tmp_path / "reference")
    assert len(ours) > 7 * LEAVES and ours["g4/meta.json"] == ours["g0/meta.json"] != ours["named/meta.json"]
    handles = dict(raw_items(out["g2"]._tensordict))
    for key in ("x0", "x11", "m"):  # pending, knowing their file, its inode and the metadata naming it
        h = handles[key]
        assert type(h) is PendingLeaf and h.path == str(tmp_path / "schema" / "g2" / f"{key}.memmap")
        assert h.ino == os.stat(h.path).st_ino and h.where == str(tmp_path / "schema" / "g2" / "meta.json")
    assert torch.equal(out["g2", "x11"], torch.full((4,), 13.0)) and out["named"].names == ["t"]
    back = TensorDict.load_memmap(tmp_path / "schema")
    assert torch.equal(back["batched", "m"], _level(8)["m"].expand(2, 2, 3))


def test_a_file_that_cannot_be_created_is_named_by_its_full_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.open

    def refusing(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if os.fspath(path).endswith("x7.memmap"):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, flags, mode, dir_fd=dir_fd)

    td = TensorDict({"g": _level()}, [])
    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(PermissionError) as info:
        td.memmap_(tmp_path / "t")
    monkeypatch.undo()
    assert info.value.filename == str(tmp_path / "t" / "g" / "x7.memmap")
    assert not (tmp_path / "t").exists()  # a failed first write removes what it wrote
    assert not td.is_memmap() and type(td["g", "x7"]) is torch.Tensor


def test_a_write_that_fails_names_the_file_and_keeps_its_errno(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write

    def full(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("x9.memmap"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    td = TensorDict({"g": _level()}, [])
    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as info:
        td.memmap_(tmp_path / "t")
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC and str(tmp_path / "t" / "g" / "x9.memmap") in str(info.value)
    assert not (tmp_path / "t").exists() and not td.is_memmap()
