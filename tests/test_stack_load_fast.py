"""The fused member loop of a lazy stack's load (issue 15) builds what the general walker builds.

Three ways of loading one saved folder are compared: the fused loop (``_stack_load.load_members``,
the default), the same loop with every member handed to the general walker (``member_template``
returning None) and the general walker alone (``templates_apply`` returning False: the stack's
members listed by ``DirectoryStore.members`` and each loaded by ``load_level``).  They must give
the same stack (classes, keys, values, pending leaves, class markers, non-tensor members) and the
same errors, naming the same member and file.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from _helpers import add_record
from _kinds import KINDS, Sample, build

import tdshare._lazy_leaves
import tdshare._read
from tdshare import CorruptDataError, LazyStackedTensorDict, NonTensorData, TensorDict
from tdshare._lazy_leaves import PendingLeaf
from tdshare._tensordict_base import TensorDictBase

PATHS = ["fused", "fused-general", "general"]


def _force(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    if path == "fused-general":
        monkeypatch.setattr(tdshare._read, "member_template", lambda *args: None)
    elif path == "general":
        monkeypatch.setattr(tdshare._read, "templates_apply", lambda *args: False)


def _load(monkeypatch: pytest.MonkeyPatch, path: str, load: Callable[[], Any]) -> Any:
    with monkeypatch.context() as m:
        _force(m, path)
        return load()


def _stack_members() -> list[TensorDict]:
    """Members of batch [4] that share a template (0, 1, 6), need their own (2: another key, a
    key that is encoded in its file name; 5: dim names; 7: no leaves) or the general walker (3: a
    nested level, 4: a non-tensor value, 8: an empty leaf)."""
    return [
        TensorDict({"x": torch.full((4, 3), 0.0), "y": torch.arange(8).reshape(4, 2)}, batch_size=[4]),
        TensorDict({"x": torch.full((4, 3), 1.0), "y": torch.arange(8).reshape(4, 2) + 1}, batch_size=[4]),
        TensorDict({"x": torch.full((4, 5), 2.0), "odd key/é": torch.arange(4.0)}, batch_size=[4]),
        TensorDict({"x": torch.full((4, 3), 3.0), "n": {"b": torch.ones(4, dtype=torch.bool)}}, batch_size=[4]),
        TensorDict({"x": torch.full((4, 3), 4.0), "s": "text"}, batch_size=[4]),
        TensorDict({"x": torch.full((4, 3), 5.0), "y": torch.zeros(4, 2, dtype=torch.int64)}, [4], names=["row"]),
        TensorDict({"x": torch.full((4, 3), 6.0), "y": torch.arange(8).reshape(4, 2) * 6}, batch_size=[4]),
        TensorDict({}, batch_size=[4]),
        TensorDict({"x": torch.full((4, 3), 8.0), "e": torch.zeros(4, 0)}, batch_size=[4]),
    ]


def _save(kind: str, folder: Path) -> tuple[Callable[..., Any], Path]:
    """Save a lazy stack of :func:`_stack_members` (along dim 1) as ``kind`` (nested in the
    tensordict of the kind's content, or the stack itself); return its loader (keyword arguments:
    ``load_memmap``'s) and the stack's folder."""
    stack = LazyStackedTensorDict(*_stack_members(), stack_dim=1)
    if kind == "lazy":
        stack.memmap_(folder)
        return lambda **kw: LazyStackedTensorDict.load_memmap(folder, **kw), folder
    obj = build(kind)
    (obj.n if kind == "tensorclass" else obj["n"])["ls"] = stack
    obj.memmap_(folder)
    cls = type(obj)
    where = folder / ("_tensordict" if kind == "tensorclass" else "") / "n" / "ls"
    return lambda **kw: cls.load_memmap(folder, **kw), where


def _describe(value: Any) -> Any:
    """Everything a loaded tree holds, without mapping a pending leaf."""
    if type(value) is PendingLeaf:
        # (each load has its own guard of the folder's registry: whether there is one)
        guarded = value.guard is not None
        return ("pending", value.dtype, value.shape, value.path, value.mode, value.ino, value.where, guarded)
    if isinstance(value, LazyStackedTensorDict):
        return (
            "stack",
            value.stack_dim,
            value.batch_size,
            value._memmap_prefix,
            value._meta_seen,
            [_describe(m) for m in value.tensordicts],
        )
    if isinstance(value, NonTensorData):
        return ("value", value.data, value.batch_size)
    if isinstance(value, TensorDictBase):
        return (
            "level",
            type(value),
            type(value._tensordict),
            value.batch_size,
            value._names,
            value.device,
            value._memmap_prefix,
            value._meta_seen,
            value._is_memmap,
            value._is_locked,
            [(k, _describe(v)) for k, v in dict.items(value._tensordict)],
        )
    if isinstance(value, torch.Tensor):
        return ("tensor", type(value), value.dtype, tuple(value.shape), value.tolist())
    return ("object", type(value), getattr(value, "_tensordict", None) is not None and _describe(value._tensordict))


@pytest.mark.parametrize("mode", [None, "r"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_three_paths_build_the_same_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, mode: str | None
) -> None:
    load, _ = _save(kind, tmp_path / "saved")
    trees = {path: _load(monkeypatch, path, lambda: load(mode=mode)) for path in PATHS}
    described = {path: _describe(tree) for path, tree in trees.items()}
    assert described["fused"] == described["fused-general"] == described["general"]
    assert str(tmp_path / "saved") in repr(described["fused"])  # (what the comparison covers: the files)
    tree = trees["fused"]
    stack = tree if kind == "lazy" else (tree.n if kind == "tensorclass" else tree["n"])["ls"]
    assert type(stack) is LazyStackedTensorDict and stack.batch_size == (4, 9) and stack.stack_dim == 1
    raw = [dict(dict.items(m._tensordict)) for m in stack.tensordicts]
    assert all(type(v) is PendingLeaf for i in (0, 1, 2, 5, 6) for v in raw[i].values())  # nothing mapped at load
    assert type(raw[4]["s"]) is NonTensorData and raw[4]["s"].data == "text"
    assert type(raw[3]["n"]) is TensorDict and type(raw[8]["e"]) is not PendingLeaf  # the general walker's
    assert raw[7] == {} and stack.tensordicts[7].batch_size == (4,)


@pytest.mark.parametrize("kind", ["lazy", "tensordict"])
def test_values_are_the_references(tmp_path: Path, kind: str) -> None:
    load, _ = _save(kind, tmp_path / "saved")
    ours = load()
    ref = (
        tensordict.LazyStackedTensorDict.load_memmap(tmp_path / "saved")
        if kind == "lazy"
        else tensordict.TensorDict.load_memmap(tmp_path / "saved")
    )
    ours_stack, ref_stack = (ours, ref) if kind == "lazy" else (ours["n", "ls"], ref["n", "ls"])
    assert type(ref_stack).__name__ == "LazyStackedTensorDict"
    for i, (got, want) in enumerate(zip(ours_stack.tensordicts, ref_stack.tensordicts, strict=True)):
        assert sorted(got.keys()) == sorted(want.keys()), i
        for key in want.keys(include_nested=True, leaves_only=True):  # (the reference's: tensors only)
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), (i, key)
        assert got.names == want.names, i
    assert ours_stack.tensordicts[4]["s"] == ref_stack.tensordicts[4]["s"] == "text"
    assert torch.equal(ours_stack[:, 6]["y"], torch.arange(8).reshape(4, 2) * 6)


@pytest.mark.parametrize("path", PATHS)
def test_class_markers_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Each member records the meta.json it was loaded from; saved again elsewhere, it writes the same."""
    _, where = _save("lazy", tmp_path / "saved")
    loaded = _load(monkeypatch, path, lambda: LazyStackedTensorDict.load_memmap(where))
    loaded.memmap(tmp_path / "again", copy_existing=True)
    for i, member in enumerate(loaded.tensordicts):
        before = json.loads((where / str(i) / "meta.json").read_text())
        assert member._meta_seen == before, i
        assert json.loads((tmp_path / "again" / str(i) / "meta.json").read_text()) == before, i
        assert before["_type"] == "<class 'tensordict._td.TensorDict'>"
    top = json.loads((where / "meta.json").read_text())
    assert top["_type"] == "<class 'tensordict._lazy.LazyStackedTensorDict'>" and top["stack_dim"] == 1
    assert json.loads((tmp_path / "again" / "meta.json").read_text()) == top


def test_plain_members_take_the_fused_loop_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack of plain members is built without the general walker (what keeps its load fast)."""
    _, where = _save("lazy", tmp_path / "saved")
    calls: list[int] = []
    real = tdshare._read._member

    def counted(cls: Any, store: Any, level: str, index: int, *args: Any) -> Any:
        calls.append(index)
        return real(cls, store, level, index, *args)

    monkeypatch.setattr(tdshare._read, "_member", counted)
    LazyStackedTensorDict.load_memmap(where)
    assert calls == [3, 4, 8]  # the nested level, the non-tensor value, the empty leaf


# -- what goes to the general walker, and loads ------------------------------------------------
def _plain_stack(folder: Path, n: int = 6) -> None:
    members = [TensorDict({"x": torch.full((2,), float(i)), "y": torch.arange(3) + i}, batch_size=[]) for i in range(n)]
    LazyStackedTensorDict(*members).memmap_(folder)


def _xs(stack: Any) -> list[float]:
    return [m["x"][0].item() for m in stack.tensordicts]


def _journal(folder: Path) -> None:
    (folder / "2" / "w.memmap").write_bytes(torch.arange(2.0).numpy().tobytes())
    entry = {"device": "cpu", "shape": [2], "dtype": "torch.float32", "is_nested": False}
    add_record(folder / "2", {"w": entry})


def _member_link_inside(folder: Path) -> None:
    shutil.move(folder / "3", folder / "real3")
    os.symlink(folder / "real3", folder / "3")


def _meta_link_inside(folder: Path) -> None:
    (folder / "4" / "meta.json").rename(folder / "4" / "real.json")
    os.symlink(folder / "4" / "real.json", folder / "4" / "meta.json")


def _large_meta(folder: Path) -> None:
    """A member of 900 keys: its meta.json (over 64 KiB) is read in full by the general walker."""
    member = TensorDict({f"k{j:04d}": torch.full((1,), float(j)) for j in range(900)}, batch_size=[])
    member["x"] = torch.full((2,), 1.0)
    member["y"] = torch.arange(3) + 1
    shutil.rmtree(folder / "1")
    member.memmap_(folder / "1")
    assert (folder / "1" / "meta.json").stat().st_size > 1 << 16


def _not_members(folder: Path) -> None:
    """Entries that are no members: a file named like one, a leading zero, a non-ASCII digit."""
    (folder / "6").write_text("")
    for name in ("01", "٣", "x"):
        (folder / name).mkdir()
        (folder / name / "meta.json").write_text("{}")


@pytest.mark.parametrize("change", [_journal, _member_link_inside, _meta_link_inside, _large_meta, _not_members])
def test_unusual_members_load_as_the_general_walker_loads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[Path], None]
) -> None:
    _plain_stack(tmp_path / "s")
    change(tmp_path / "s")
    trees = [_load(monkeypatch, path, lambda: LazyStackedTensorDict.load_memmap(tmp_path / "s")) for path in PATHS]
    assert _describe(trees[0]) == _describe(trees[1]) == _describe(trees[2])
    stack = trees[0]
    assert len(stack.tensordicts) == 6
    assert _xs(stack) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    if change is _journal:
        assert list(stack.tensordicts[2].keys()) == ["x", "y", "w"] and stack.tensordicts[2]["w"].tolist() == [0, 1]
    if change is _large_meta:
        assert stack.tensordicts[1]["k0899"].item() == 899.0


# -- errors: the same for every path, naming the member -----------------------------------------
def _gap(folder: Path) -> None:
    shutil.rmtree(folder / "3")


def _no_meta(folder: Path) -> None:
    (folder / "1" / "meta.json").unlink()


def _gap_after_an_error(folder: Path) -> None:
    """Member 1 has no meta.json and member 4 is missing: the gap is what a load reports."""
    _no_meta(folder)
    shutil.rmtree(folder / "4")


def _bad_json(folder: Path) -> None:
    (folder / "2" / "meta.json").write_text('{"x": {"shape": [2]')


def _empty_meta(folder: Path) -> None:
    (folder / "2" / "meta.json").write_bytes(b"")


def _meta_is_a_folder(folder: Path) -> None:
    (folder / "2" / "meta.json").unlink()
    (folder / "2" / "meta.json").mkdir()


def _meta_link_outside(folder: Path) -> None:
    outside = folder.parent / "outside.json"
    shutil.copy(folder / "2" / "meta.json", outside)
    (folder / "2" / "meta.json").unlink()
    os.symlink(outside, folder / "2" / "meta.json")


def _member_link_outside(folder: Path) -> None:
    shutil.move(folder / "3", folder.parent / "elsewhere")
    os.symlink(folder.parent / "elsewhere", folder / "3")


def _short_leaf(folder: Path) -> None:
    path = folder / "3" / "y.memmap"
    path.write_bytes(path.read_bytes()[:4])


def _missing_leaf(folder: Path) -> None:
    (folder / "3" / "y.memmap").unlink()


def _leaf_is_a_folder(folder: Path) -> None:
    (folder / "3" / "y.memmap").unlink()
    (folder / "3" / "y.memmap").mkdir()


def _leaf_link_outside(folder: Path) -> None:
    outside = folder.parent / "outside.memmap"
    shutil.copy(folder / "3" / "y.memmap", outside)
    (folder / "3" / "y.memmap").unlink()
    os.symlink(outside, folder / "3" / "y.memmap")


def _batch_mismatch(folder: Path) -> None:
    meta = json.loads((folder / "5" / "meta.json").read_text())
    meta["shape"] = [3]
    (folder / "5" / "meta.json").write_text(json.dumps(meta))


def _other_batch(folder: Path) -> None:
    """Member 4 is valid on its own but has another batch size than the others."""
    shutil.rmtree(folder / "4")
    other = TensorDict({"x": torch.zeros(3, 2), "y": torch.zeros(3, 3, dtype=torch.int64)}, batch_size=[3])
    other.memmap_(folder / "4")


ERRORS: list[tuple[Callable[[Path], None], str]] = [
    (_gap, r"stacked member folder 3 is missing \(found \[0, 1, 2, 4, 5\]\)"),
    (_no_meta, r"stacked member folder 1 has no meta\.json"),
    (_gap_after_an_error, r"stacked member folder 4 is missing"),
    (_bad_json, r"s/2/meta\.json is not valid JSON"),
    (_empty_meta, r"s/2/meta\.json is not valid JSON"),
    (_meta_is_a_folder, r"s/2/meta\.json is a directory"),
    (_meta_link_outside, r"s/2/meta\.json' is a symbolic link that leads outside"),
    (_member_link_outside, r"s/3' is a symbolic link that leads outside"),
    (_short_leaf, r"s/3/y\.memmap"),
    (_missing_leaf, r"s/3/y\.memmap' is missing"),
    (_leaf_is_a_folder, r"s/3/y\.memmap"),
    (_leaf_link_outside, r"s/3/y\.memmap' is a symbolic link that leads outside"),
    (_batch_mismatch, r"s/5/meta\.json: the leaf 'x' has shape \[2\], which does not start with the batch size \[3\]"),
    (_other_batch, r"member 4 has batch size \[3\], member 0 has \[\]"),
]


@pytest.mark.parametrize(("damage", "match"), ERRORS, ids=[d.__name__.strip("_") for d, _ in ERRORS])
def test_errors_name_the_member_whatever_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Callable[[Path], None], match: str
) -> None:
    _plain_stack(tmp_path / "s")
    damage(tmp_path / "s")
    messages = []
    for path in PATHS:
        with monkeypatch.context() as m:
            _force(m, path)
            with pytest.raises(CorruptDataError, match=match) as err:
                LazyStackedTensorDict.load_memmap(tmp_path / "s")
        messages.append(str(err.value))
    assert messages[0] == messages[1] == messages[2]


# -- tracking the loaded members for re-saves ---------------------------------------------------
def test_repeated_loads_keep_the_tracking_table_bounded(tmp_path: Path) -> None:
    """Each load tracks its members weakly; the references of dropped loads are swept."""
    _plain_stack(tmp_path / "s", n=50)
    for _ in range(40):
        LazyStackedTensorDict.load_memmap(tmp_path / "s")
    held = LazyStackedTensorDict.load_memmap(tmp_path / "s")
    table = tdshare._lazy_leaves._LIVE[str(tmp_path / "s")]
    assert len(table.values()) == 50  # the held load's members only
    assert len(table.refs) <= 2 * 50 + 64
    again = TensorDict({"x": torch.full((2,), -1.0), "y": torch.zeros(3, dtype=torch.int64)}, batch_size=[])
    again.memmap(tmp_path / "s" / "7")  # a re-save of one member folder maps that member's leaves first
    assert held.tensordicts[7]["x"].tolist() == [7.0, 7.0]
    assert type(dict.__getitem__(held.tensordicts[8]._tensordict, "x")) is PendingLeaf
    assert LazyStackedTensorDict.load_memmap(tmp_path / "s").tensordicts[7]["x"].tolist() == [-1.0, -1.0]


def test_tracking_one_dict_twice_keeps_one_reference() -> None:
    d = tdshare._lazy_leaves.new_lazy_leaves()
    for _ in range(200):
        tdshare._lazy_leaves.track(d, "/nowhere/tracked-twice")
    table = tdshare._lazy_leaves._LIVE["/nowhere/tracked-twice"]
    assert len(table.refs) == 1 and table.values() == [d]
    del d
    assert table.values() == []


def test_a_tensorclass_with_a_stack_loads_its_class(tmp_path: Path) -> None:
    load, _ = _save("tensorclass", tmp_path / "saved")
    back = load()
    assert type(back) is Sample and back.s == "text"
    assert back.n["ls"].tensordicts[6]["y"].tolist() == (torch.arange(8).reshape(4, 2) * 6).tolist()
