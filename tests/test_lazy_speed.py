"""The fast paths of a lazy stack's load_memmap and memmap_ (issue 15) give what the general
paths give: the same members, the same pending leaves, the same errors naming the same files.

The general path is forced by switching the fast one off (``member_template`` returning None),
so every comparison below is between the two ways of building one saved folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from _helpers import add_record

import tdshare
import tdshare._read
from tdshare import CorruptDataError, LazyStackedTensorDict, TensorDict
from tdshare._coordination import SharedRegistry
from tdshare._lazy_leaves import PendingLeaf


def _members(n: int = 5, hetero: bool = False) -> list[TensorDict]:
    """``n`` members of batch [2]; with ``hetero`` the odd ones have other keys and shapes."""
    out = []
    for i in range(n):
        if hetero and i % 2:
            td = TensorDict({"x": torch.full((2, 5), float(i)), "odd key": torch.arange(2) + i}, batch_size=[2])
        else:
            td = TensorDict({"x": torch.full((2, 3), float(i)), "y": torch.arange(4).reshape(2, 2) * i}, batch_size=[2])
        td.names = ["row"]
        out.append(td)
    return out


def _general(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tdshare._read, "member_template", lambda *args: None)


def _raw(td: TensorDict) -> dict[str, Any]:
    return dict(dict.items(td._tensordict))


def _describe(ls: Any) -> list[dict[str, Any]]:
    """Everything a loaded member holds, without mapping a pending leaf."""
    out = []
    for member in ls.tensordicts:
        leaves = {}
        for key, value in _raw(member).items():
            if type(value) is PendingLeaf:
                leaves[key] = ("pending", value.dtype, value.shape, value.path, value.mode, value.ino, value.where)
            else:
                leaves[key] = ("tensor", value.dtype, tuple(value.shape), value.tolist())
        out.append(
            {
                "class": type(member),
                "dict": type(member._tensordict),
                "leaves": leaves,
                "order": list(dict.keys(member._tensordict)),
                "batch": member.batch_size,
                "names": member._names,
                "device": member.device,
                "prefix": member._memmap_prefix,
                "seen": member._meta_seen,
                "memmap": member._is_memmap,
                "locked": member._is_locked,
            }
        )
    return out


@pytest.mark.parametrize("hetero", [False, True])
@pytest.mark.parametrize("mode", [None, "r", "r+"])
def test_members_are_built_as_the_general_walker_builds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hetero: bool, mode: str | None
) -> None:
    LazyStackedTensorDict(*_members(hetero=hetero), stack_dim=1).memmap_(tmp_path / "s")
    fast = LazyStackedTensorDict.load_memmap(tmp_path / "s", mode=mode)
    with monkeypatch.context() as m:
        _general(m)
        slow = LazyStackedTensorDict.load_memmap(tmp_path / "s", mode=mode)
    assert _describe(fast) == _describe(slow)
    assert fast.batch_size == slow.batch_size == torch.Size([2, 5]) and fast.stack_dim == 1
    if mode != "r+":  # the fast path made them: every leaf still pending
        assert all(type(v) is PendingLeaf for member in fast.tensordicts for v in _raw(member).values())
    ref = tensordict.LazyStackedTensorDict.load_memmap(tmp_path / "s")
    for got, want in zip(fast.tensordicts, ref.tensordicts, strict=True):
        assert sorted(got.keys()) == sorted(want.keys())
        for key in want.keys():
            assert torch.equal(got[key], want[key])
        assert got.names == want.names == ["row"]


def test_members_that_need_the_general_walker_are_still_loaded(tmp_path: Path) -> None:
    """A nested level, an empty leaf, a non-tensor value: those members take the general path."""
    members = [
        TensorDict({"x": torch.ones(2, 3)}, batch_size=[2]),
        TensorDict({"x": torch.ones(2, 3), "n": {"b": torch.zeros(2)}}, batch_size=[2]),
        TensorDict({"x": torch.ones(2, 3), "e": torch.zeros(2, 0)}, batch_size=[2]),
        TensorDict({"x": torch.ones(2, 3), "s": "text"}, batch_size=[2]),
        TensorDict({"x": torch.ones(2, 3)}, batch_size=[2]),
    ]
    LazyStackedTensorDict(*members).memmap_(tmp_path / "s")
    back = LazyStackedTensorDict.load_memmap(tmp_path / "s")
    assert [sorted(m.keys()) for m in back.tensordicts] == [["x"], ["n", "x"], ["e", "x"], ["s", "x"], ["x"]]
    assert back.tensordicts[1]["n", "b"].tolist() == [0.0, 0.0]
    assert back.tensordicts[2]["e"].shape == (2, 0)
    assert back.tensordicts[3]["s"] == "text"
    assert torch.equal(back["x"], torch.ones(5, 2, 3))


def test_a_member_with_a_record_of_new_entries(tmp_path: Path) -> None:
    """A member's meta.jsonl (entries added by make_memmap) is laid over its meta.json."""
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    folder = tmp_path / "s" / "3"
    (folder / "w.memmap").write_bytes(torch.arange(2.0).numpy().tobytes())
    entry = {"device": "cpu", "shape": [2], "dtype": "torch.float32", "is_nested": False}
    add_record(folder, {"w": entry})
    back = LazyStackedTensorDict.load_memmap(tmp_path / "s")
    assert list(back.tensordicts[3].keys()) == ["x", "y", "w"]
    assert back.tensordicts[3]["w"].tolist() == [0.0, 1.0]
    assert [list(m.keys()) for i, m in enumerate(back.tensordicts) if i != 3] == [["x", "y"]] * 4


def test_a_member_given_a_record_is_marked_and_loads_whole(tmp_path: Path) -> None:
    """make_memmap past a member's write-through: its meta.json gets the record field first, the
    stack's load reads the record, tensordict skips the field."""
    stack = LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    member = stack.tensordicts[1]
    for i in range(100):
        member.make_memmap_from_tensor(f"k{i}", torch.full((2,), float(i)))
    folder = tmp_path / "s" / "1"
    assert json.loads((folder / "meta.json").read_text())["_tdshare_journal"] is True
    assert (folder / "meta.jsonl").stat().st_size > 0  # the last additions are in the record only
    others = [json.loads((tmp_path / "s" / str(i) / "meta.json").read_text()) for i in (0, 2, 3, 4)]
    assert not any("_tdshare_journal" in meta for meta in others)
    back = LazyStackedTensorDict.load_memmap(tmp_path / "s")
    got = back.tensordicts[1]
    assert list(got.keys()) == ["x", "y"] + [f"k{i}" for i in range(100)]
    assert [got[f"k{i}"][1].item() for i in range(100)] == [float(i) for i in range(100)]
    ref = tensordict.LazyStackedTensorDict.load_memmap(tmp_path / "s")  # meta.json only, the field skipped
    seen = list(ref.tensordicts[1].keys())
    assert 2 < len(seen) < 102 and seen == list(got.keys())[: len(seen)]
    tdshare.compact_metadata(tmp_path / "s")
    ref = tensordict.LazyStackedTensorDict.load_memmap(tmp_path / "s")
    assert ref.tensordicts[1]["k99"].tolist() == [99.0, 99.0] and len(list(ref.tensordicts[1].keys())) == 102


def test_a_record_without_the_field_is_not_read_by_a_stack_load(tmp_path: Path) -> None:
    """Only a hand or another program leaves a record in a meta.json without the field: the
    stack's load does not probe for it; the member loaded on its own (the general walker) reads it."""
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    folder = tmp_path / "s" / "3"
    (folder / "w.memmap").write_bytes(torch.arange(2.0).numpy().tobytes())
    entry = {"device": "cpu", "shape": [2], "dtype": "torch.float32", "is_nested": False}
    (folder / "meta.jsonl").write_text(json.dumps({"w": entry}) + "\n")
    assert list(LazyStackedTensorDict.load_memmap(tmp_path / "s").tensordicts[3].keys()) == ["x", "y"]
    assert list(TensorDict.load_memmap(folder).keys()) == ["x", "y", "w"]


@pytest.mark.parametrize("target", ["dangling", "file"])
def test_a_record_that_is_a_symbolic_link_is_refused(tmp_path: Path, target: str) -> None:
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    real = tmp_path / "record"
    if target == "file":
        real.write_text("")
    add_record(tmp_path / "s" / "2", {})  # marked as having a record, as tdshare's writer does
    (tmp_path / "s" / "2" / "meta.jsonl").unlink()
    os.symlink(real, tmp_path / "s" / "2" / "meta.jsonl")
    with pytest.raises(CorruptDataError, match=r"2/meta\.jsonl"):
        LazyStackedTensorDict.load_memmap(tmp_path / "s")


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:4])


def _remove(path: Path) -> None:
    path.unlink()


def _link_outside(path: Path) -> None:
    outside = path.parent.parent.parent / "outside.memmap"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    os.symlink(outside, path)


def _not_a_file(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize("damage", [_truncate, _remove, _link_outside, _not_a_file])
def test_a_damaged_leaf_raises_the_general_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Any
) -> None:
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    damage(tmp_path / "s" / "3" / "y.memmap")
    with pytest.raises(CorruptDataError) as fast:
        LazyStackedTensorDict.load_memmap(tmp_path / "s")
    with monkeypatch.context() as m:
        _general(m)
        with pytest.raises(CorruptDataError) as slow:
            LazyStackedTensorDict.load_memmap(tmp_path / "s")
    assert str(fast.value) == str(slow.value)
    assert str(tmp_path / "s" / "3" / "y.memmap") in str(fast.value)


def test_a_member_whose_leaf_disagrees_with_its_batch_size_is_named(tmp_path: Path) -> None:
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    meta_path = tmp_path / "s" / "4" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["shape"] = [3]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CorruptDataError, match=r"4/meta\.json.*'x'.*batch size \[3\]"):
        LazyStackedTensorDict.load_memmap(tmp_path / "s")


def test_a_resave_of_one_member_folder_keeps_the_loaded_bytes_of_that_member_only(tmp_path: Path) -> None:
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    held = LazyStackedTensorDict.load_memmap(tmp_path / "s")
    TensorDict({"x": torch.full((2, 3), -1.0), "y": torch.zeros(2, 2, dtype=torch.int64)}, batch_size=[2]).memmap(
        tmp_path / "s" / "2"
    )
    assert type(dict.__getitem__(held.tensordicts[2]._tensordict, "x")) is not PendingLeaf  # mapped first
    assert held.tensordicts[2]["x"].tolist() == [[2.0] * 3] * 2  # the bytes it was loaded with
    assert all(type(v) is PendingLeaf for i in (0, 1, 3, 4) for v in _raw(held.tensordicts[i]).values())
    assert LazyStackedTensorDict.load_memmap(tmp_path / "s").tensordicts[2]["x"].tolist() == [[-1.0] * 3] * 2


def test_a_resave_of_the_stack_keeps_the_loaded_bytes_of_every_member(tmp_path: Path) -> None:
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    held = LazyStackedTensorDict.load_memmap(tmp_path / "s")
    LazyStackedTensorDict(*(td.apply(lambda t: t * 0 - 7) for td in _members())).memmap(tmp_path / "s")
    assert [m["x"][0, 0].item() for m in held.tensordicts] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert LazyStackedTensorDict.load_memmap(tmp_path / "s")["x"].unique().tolist() == [-7.0]


def test_a_member_without_meta_json_is_named(tmp_path: Path) -> None:
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    (tmp_path / "s" / "1" / "meta.json").unlink()
    with pytest.raises(CorruptDataError, match=r"member folder 1 has no meta\.json"):
        LazyStackedTensorDict.load_memmap(tmp_path / "s")


def test_the_loaded_stack_memmaps_again_in_place(tmp_path: Path) -> None:
    """What a fast-built member holds is enough for the rest of the family: re-save, refresh, pickle."""
    LazyStackedTensorDict(*_members()).memmap_(tmp_path / "s")
    back = LazyStackedTensorDict.load_memmap(tmp_path / "s")
    back.memmap_(tmp_path / "s")
    assert back.is_memmap() and back.is_locked
    assert back.tensordicts[4]["x"].filename == str(tmp_path / "s" / "4" / "x.memmap")
    back.memmap_refresh_()
    assert torch.equal(back["y"], torch.stack([m["y"] for m in _members()]))


def _write_members() -> list[tuple[dict[str, torch.Tensor], list[str | None] | None]]:
    """Members that agree on some of: keys, shapes, dtypes, dim names (one encoding may be shared
    by the equal ones only)."""
    base = {"x": torch.zeros(2, 3), "y": torch.ones(2)}
    return [
        (base, None),
        (base, None),
        ({"x": torch.zeros(2, 4), "y": torch.ones(2)}, None),
        ({"x": torch.zeros(2, 3), "y": torch.ones(2, dtype=torch.float64)}, None),
        (base, ["row"]),
        ({"y": torch.ones(2), "x": torch.zeros(2, 3)}, None),
        ({"x": torch.zeros(2, 3), "y": torch.ones(2), "n": {"b": torch.zeros(2)}}, None),
        (base, None),
    ]


@pytest.mark.parametrize("twice", [False, True])
def test_member_metadata_is_what_the_reference_writes(tmp_path: Path, twice: bool) -> None:
    """Equal members share one encoding of their meta.json; every member's file is still its own."""
    ours = []
    ref = []
    for values, names in _write_members():
        ours.append(TensorDict(dict(values), batch_size=[2], names=names))
        ref.append(tensordict.TensorDict(dict(values), batch_size=[2], names=names))
    stack = LazyStackedTensorDict(*ours)
    stack.memmap_(tmp_path / "ours")
    if twice:  # over a saved tree: levels unchanged since they were written are kept
        stack.memmap_(tmp_path / "ours")
    tensordict.LazyStackedTensorDict(*ref).memmap_(tmp_path / "ref")
    for i in range(len(ours)):
        got = json.loads((tmp_path / "ours" / str(i) / "meta.json").read_text())
        want = json.loads((tmp_path / "ref" / str(i) / "meta.json").read_text())
        assert got == want, i
        assert list(got) == list(want)
        assert stack.tensordicts[i]._meta_seen == got
    back = LazyStackedTensorDict.load_memmap(tmp_path / "ours")
    assert [m.names for m in back.tensordicts][4] == ["row"]
    assert back.tensordicts[3]["y"].dtype == torch.float64
    assert back.tensordicts[2]["x"].shape == (2, 4)


@tdshare.tensorclass
class _Pair:
    a: torch.Tensor
    fields: TensorDict


def test_a_loaded_tensorclass_records_the_folder_state_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fields of a loaded tensorclass hold the registry state read before its metadata (one read)."""
    obj = _Pair(a=torch.zeros(3), fields=TensorDict(b=torch.ones(3), batch_size=[3]), batch_size=[3])
    obj.memmap_(tmp_path / "tc")
    obj.memmap_(tmp_path / "tc")  # over a saved tree: its counter file exists now
    want = SharedRegistry.for_directory(str(tmp_path / "tc")).state()
    assert want is not None
    reads = []
    real = SharedRegistry.state

    def counted(self: SharedRegistry, create: bool = False) -> Any:
        reads.append(self.root)
        return real(self, create)

    monkeypatch.setattr(SharedRegistry, "state", counted)
    back = _Pair.load_memmap(tmp_path / "tc")
    assert type(back) is _Pair and back._tensordict._generation == want
    assert reads == [str(tmp_path / "tc")]
    assert back.fields["b"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("inplace", [True, False])
def test_written_members_are_installed_memory_mapped(tmp_path: Path, inplace: bool) -> None:
    """Members of plain leaves (the short install) end as the general install leaves the others."""
    members = _members()
    members.append(TensorDict({"x": torch.ones(2, 3), "n": {"b": torch.zeros(2)}}, batch_size=[2], names=["row"]))
    members.append(TensorDict({}, batch_size=[2]))
    src = LazyStackedTensorDict(*members)
    out = src.memmap_(tmp_path / "s") if inplace else src.memmap(tmp_path / "s")
    assert (out is src) == inplace
    for i, (member, before) in enumerate(zip(out.tensordicts, _members() + members[5:], strict=True)):
        assert member.is_memmap() and member.is_locked and not member.is_shared()
        assert member._memmap_prefix == str(tmp_path / "s" / str(i))
        assert member.device == torch.device("cpu")
        assert list(member.keys()) == list(before.keys())
        assert member.names == before.names
        for key, value in member.items(True, True):
            assert isinstance(value, tdshare.MemoryMappedTensor)
            parts = key if isinstance(key, tuple) else (key,)
            assert value.filename == str(tmp_path / "s" / str(i) / Path(*parts)) + ".memmap"
            assert torch.equal(value, before[key])
    assert out.is_memmap() and out.is_locked
    if not inplace:
        assert not any(m.is_memmap() for m in src.tensordicts)
        assert type(src.tensordicts[0]["x"]) is torch.Tensor
