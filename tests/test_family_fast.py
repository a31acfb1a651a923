"""The family's fast write paths (issue 15) give what the general writer gives.

A lazy stack's first save into a folder goes through ``_stack_write.write_stack`` (its members in
one loop); the general writer (``_write.FolderWriter`` planning every member as a level) is forced
by making ``write_stack`` hand the save back.  Both must write the same files with the same bytes
(every ``meta.json`` text), give the same in-memory result (pending leaves, locks, prefixes, the
metadata remembered as seen) and load to the same values, in tdshare and in tensordict 0.15.3.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch

import tdshare._stack_write
import tdshare._write
from tdshare import LazyStackedTensorDict, NotSupportedError, TensorDict
from tdshare._lazy_leaves import PendingLeaf

PATHS = ["fast", "general"]


def _homogeneous(n: int = 5) -> LazyStackedTensorDict:
    return LazyStackedTensorDict(*(TensorDict(x=torch.arange(4.0) + i, batch_size=[]) for i in range(n)))


def _heterogeneous() -> LazyStackedTensorDict:
    """Members of batch [3] with equal schemas (0, 2; 2 a non-contiguous view), other keys, shapes and
    dtypes (1, 3), dim names (4)."""
    return LazyStackedTensorDict(
        TensorDict({"x": torch.zeros(3, 2), "y": torch.arange(3)}, batch_size=[3]),
        TensorDict({"x": torch.ones(3, 5), "z": torch.ones(3, dtype=torch.bool)}, batch_size=[3]),
        TensorDict({"x": torch.arange(6.0).reshape(2, 3).t(), "y": torch.arange(3) + 2}, batch_size=[3]),  # a view
        TensorDict({"w": torch.arange(12, dtype=torch.float64).reshape(3, 2, 2)}, batch_size=[3]),
        TensorDict({"x": torch.full((3, 2), 4.0), "y": torch.arange(3) * 4}, batch_size=[3], names=["row"]),
        stack_dim=1,
    )


def _uncovered() -> LazyStackedTensorDict:
    """Members the fast path does not cover (a nested level, a non-tensor value): the general way."""
    return LazyStackedTensorDict(
        TensorDict({"x": torch.zeros(2), "n": {"b": torch.ones(2)}}, batch_size=[2]),
        TensorDict({"x": torch.ones(2), "s": "text"}, batch_size=[2]),
    )


BUILDERS: dict[str, Callable[[], LazyStackedTensorDict]] = {
    "homogeneous": _homogeneous,
    "heterogeneous": _heterogeneous,
    "uncovered": _uncovered,
}


def _force(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    if path == "general":
        monkeypatch.setattr(tdshare._write, "write_stack", lambda *args, **kwargs: None)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record whether each lazy-stack write was taken by the fast path (True) or handed back."""
    taken: list[bool] = []
    real = tdshare._stack_write.write_stack

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(tdshare._write, "write_stack", spy)
    return taken


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes), and every folder (-> b"<dir>")."""
    out: dict[str, bytes] = {}
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), folder)] = b"<dir>"
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = fh.read()
    return out


def _state(ls: LazyStackedTensorDict, folder: Path) -> list[Any]:
    """What a write leaves in memory, with the folder's path cut off."""
    head = str(folder)
    out: list[Any] = [ls.is_memmap(), ls.is_locked, ls._memmap_prefix == head, ls.batch_size, ls.stack_dim]
    for m in ls.tensordicts:
        leaves = [
            (k, type(v).__name__, v.path[len(head) :], v.where[len(head) :], v.shape, v.dtype)
            if isinstance(v, PendingLeaf)
            else (k, type(v).__name__)
            for k, v in dict.items(m._tensordict)
        ]
        out.append(
            (
                type(m._tensordict).__name__,
                leaves,
                m.is_locked,
                m.is_memmap(),
                (m._memmap_prefix or "")[len(head) :],
                m.device,
                m._names,
                m._meta_seen,
            )
        )
    return out


def _values(ls: Any) -> list[dict[str, Any]]:
    """Each member's tensors, as lists (tensordict's ``items`` leaves its non-tensor values out)."""
    return [
        {k: v.tolist() for k, v in m.items(include_nested=True, leaves_only=True) if isinstance(v, torch.Tensor)}
        for m in ls.tensordicts
    ]


@pytest.mark.parametrize("case", list(BUILDERS))
def test_fast_and_general_write_the_same_bytes_and_state(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = {}
    for path in PATHS:
        folder = tmp_path / path
        with monkeypatch.context() as m:
            _force(m, path)
            taken = _spy(m) if path == "fast" else []
            ls = BUILDERS[case]()
            expected = _values(ls)
            assert ls.memmap_(folder) is ls
        if path == "fast":
            assert taken == [case != "uncovered"]
        results[path] = (_files(folder), _state(ls, folder))
        assert _values(ls) == expected  # read back through the pending leaves
        loaded = LazyStackedTensorDict.load_memmap(folder)
        assert _values(loaded) == expected and loaded.stack_dim == ls.stack_dim
        ref = tensordict.LazyStackedTensorDict.load_memmap(folder)
        assert _values(ref) == expected and ref.batch_size == ls.batch_size
    assert results["fast"][0] == results["general"][0]
    assert results["fast"][1] == results["general"][1]


@pytest.mark.parametrize("path", PATHS)
def test_memmap_copy_leaves_the_source_unchanged(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        _force(m, path)
        src = _heterogeneous()
        out = src.memmap(tmp_path / "copy")
    assert out is not src and type(out) is LazyStackedTensorDict and out.is_memmap() and out.is_locked
    assert not src.is_memmap() and not src.is_locked
    assert all(type(v) is torch.Tensor for mem in src.tensordicts for v in dict.values(mem._tensordict))
    assert _values(out) == _values(src) and out.stack_dim == 1
    assert out.tensordicts[4].names == ["row"]
    out.tensordicts[0]["x"][0, 0] = 9.0  # the copy writes its files, not the source
    assert src.tensordicts[0]["x"][0, 0].item() == 0.0
    assert LazyStackedTensorDict.load_memmap(tmp_path / "copy").tensordicts[0]["x"][0, 0].item() == 9.0


def test_fast_write_shares_the_files_and_resaves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _spy(monkeypatch)
    ls = _homogeneous(3)
    ls.memmap_(tmp_path)  # an existing empty folder (as tempfile.mkdtemp gives)
    assert taken == [True]
    ls.tensordicts[1]["x"][2] = 42.0
    loaded = LazyStackedTensorDict.load_memmap(tmp_path)
    assert loaded.tensordicts[1]["x"].tolist() == [1.0, 2.0, 42.0, 4.0]
    ls.memmap_()  # over its own folder: the general writer (not a first save), nothing lost
    assert taken == [True]
    assert LazyStackedTensorDict.load_memmap(tmp_path).tensordicts[1]["x"].tolist() == [1.0, 2.0, 42.0, 4.0]
    ls.tensordicts[2].make_memmap("extra", shape=(2,), dtype=torch.int32)  # a member's record of new entries
    again = LazyStackedTensorDict.load_memmap(tmp_path)
    assert set(again.tensordicts[2].keys()) == {"x", "extra"} and set(again.tensordicts[0].keys()) == {"x"}


def test_unread_leaves_keep_their_bytes_when_the_folder_is_saved_over(tmp_path: Path) -> None:
    ls = _homogeneous(4)
    ls.memmap_(tmp_path)  # fast: every leaf pending
    assert all(type(v) is PendingLeaf for m in ls.tensordicts for v in dict.values(m._tensordict))
    other = LazyStackedTensorDict(*(TensorDict(x=torch.full((4,), -1.0), batch_size=[]) for _ in range(4)))
    other.memmap_(tmp_path, copy_existing=True)  # replaces the files: ls's leaves are mapped first
    assert [m["x"].tolist() for m in ls.tensordicts] == [(torch.arange(4.0) + i).tolist() for i in range(4)]
    assert LazyStackedTensorDict.load_memmap(tmp_path).tensordicts[3]["x"].tolist() == [-1.0] * 4


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_fast_write_leaves_nothing_and_the_source_as_it_was(tmp_path: Path, existing: bool) -> None:
    folder = tmp_path / "stack"
    if existing:
        folder.mkdir()
    ls = LazyStackedTensorDict(
        TensorDict(x=torch.ones(2), batch_size=[]),
        TensorDict(x=torch.empty(2, device="meta"), batch_size=[]),  # no data to write
    )
    with pytest.raises(NotSupportedError, match=r"meta device"):
        ls.memmap_(folder)
    assert folder.exists() == existing and (not existing or not any(folder.iterdir()))
    assert not ls.is_memmap() and not ls.is_locked
    assert all(type(v) is torch.Tensor for m in ls.tensordicts for v in dict.values(m._tensordict))


def test_options_the_fast_path_leaves_to_the_general_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _spy(monkeypatch)
    calls: list[tuple[int, int]] = []
    _homogeneous(3).memmap_(tmp_path / "a", progress=lambda done, total: calls.append((done, total)))
    _homogeneous(3).memmap_(tmp_path / "b", num_threads=2)
    _homogeneous(3).memmap_(tmp_path / "c", atomic=True)
    _homogeneous(3).memmap_(tmp_path / "d", robust_key=False)
    _homogeneous(3).memmap_(tmp_path / "e", existsok=False)
    assert taken == [] and calls and calls[-1] == (3, 3)
    for name in "abcde":
        assert _values(LazyStackedTensorDict.load_memmap(tmp_path / name)) == _values(_homogeneous(3))
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "stray").write_bytes(b"")  # a folder that holds something: the general writer
    _homogeneous(3).memmap_(tmp_path / "f")
    _homogeneous(3).memmap_(tmp_path / "g")
    assert taken == [False, True]
    assert (tmp_path / "f" / "stray").exists()
    assert _files(tmp_path / "g") == {k: v for k, v in _files(tmp_path / "f").items() if k != "stray"}
