"""LazyStackedTensorDict and NonTensorStack: the model, the memmap family in the reference's layout,
loading back, cross-compatibility with tensordict 0.15.3 and sharing between processes."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensordict
import torch

import tdshare
from tdshare import LazyStackedTensorDict, MemoryMappedTensor, NonTensorData, NonTensorStack, TensorDict

WAIT = 60
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
LAZY_META = {
    "_type": "<class 'tensordict._lazy.LazyStackedTensorDict'>",
    "_format_version": 1,
    "_class": "tensordict:LazyStackedTensorDict",
}


def _members() -> list[TensorDict]:
    """Two members that share "x" (different trailing shapes), "n" and "s" (different values)."""
    a = TensorDict(
        {"x": torch.arange(6.0).reshape(3, 2), "y": torch.arange(3), "n": {"b": torch.zeros(3)}, "s": "left"},
        batch_size=[3],
    )
    b = TensorDict(
        {"x": torch.arange(15.0).reshape(3, 5), "z": -torch.ones(3), "n": {"b": torch.ones(3)}, "s": "right"},
        batch_size=[3],
    )
    return [a, b]


def _stack(dim: int = 0) -> LazyStackedTensorDict:
    return LazyStackedTensorDict(*_members(), stack_dim=dim)


def _member_values(td: TensorDict) -> dict[str, Any]:
    return {str(k): (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in td.items(True, True)}


def _same_stack(got: Any, want: LazyStackedTensorDict) -> None:
    assert isinstance(got, LazyStackedTensorDict)
    assert got.stack_dim == want.stack_dim and got.batch_size == want.batch_size
    assert [_member_values(m) for m in got.tensordicts] == [_member_values(m) for m in want.tensordicts]


# -- the model --------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_construction_batch_and_keys(dim: int) -> None:
    a, b = _members()
    ls = LazyStackedTensorDict(a, b, stack_dim=dim)
    assert ls.stack_dim == dim % 2 and ls.tensordicts == [a, b]
    assert ls.batch_size == ((2, 3) if dim == 0 else (3, 2)) and len(ls) == ls.batch_size[0]
    assert ls.keys() == ["x", "n", "s"]
    assert ls.keys(include_nested=True, leaves_only=True) == ["x", ("n", "b"), "s"]
    assert "x" in ls and "y" not in ls and ("n", "b") in ls
    assert LazyStackedTensorDict.lazy_stack([a, b], dim).batch_size == ls.batch_size


def test_bad_members_name_the_member() -> None:
    a, _ = _members()
    with pytest.raises(tdshare.BatchSizeError, match="Member 1"):
        LazyStackedTensorDict(a, TensorDict({}, batch_size=[4]))
    with pytest.raises(tdshare.ArgumentTypeError, match="Member 1"):
        LazyStackedTensorDict(a, torch.zeros(3))  # type: ignore[arg-type]
    assert LazyStackedTensorDict().batch_size == torch.Size([0])  # an empty stack, as the reference's
    with pytest.raises(tdshare.InvalidArgumentError, match="stack_dim"):
        LazyStackedTensorDict(a, stack_dim=3)


def test_get_stacks_shared_entries_and_names_the_missing_members() -> None:
    ls = _stack(1)
    assert ls["n", "b"].tolist() == [[0.0, 1.0]] * 3
    assert isinstance(ls.get("n"), LazyStackedTensorDict) and ls.get("n").stack_dim == 1
    assert ls["s"] == [["left", "right"]] * 3  # values that differ: a NonTensorStack, read as lists
    with pytest.raises(tdshare.MissingKeyError, match=r"'y'.*members \[1\]"):
        ls["y"]
    assert ls.get("y", "default") == "default"
    with pytest.raises(tdshare.NotSupportedError, match=r"'x'.*shapes differ"):
        ls["x"]
    assert [v.shape[-1] for v in ls.get("x", as_list=True)] == [2, 5]


def test_indexing_along_and_across_the_stack_dim() -> None:
    a, b = _members()
    ls = LazyStackedTensorDict(a, b, stack_dim=0)
    assert ls[1] is b and ls[-2] is a
    assert ls.unbind(0) == (a, b) and [m is t for m, t in zip(ls, (a, b), strict=True)] == [True, True]
    part = ls[:, 1:]
    assert isinstance(part, LazyStackedTensorDict) and part.batch_size == (2, 2)
    assert part.tensordicts[1]["x"].tolist() == b["x"][1:].tolist()
    row = ls[0, 2]
    assert isinstance(row, TensorDict) and row["x"].tolist() == [4.0, 5.0]
    picked = ls[torch.tensor([1, 0])]
    assert picked.tensordicts == [b, a]
    across = LazyStackedTensorDict(a, b, stack_dim=1)[2]  # an index before the stack dim drops it
    assert isinstance(across, LazyStackedTensorDict) and across.stack_dim == 0 and across.batch_size == (2,)
    assert across.tensordicts[1]["z"].item() == -1.0
    assert [t.batch_size for t in LazyStackedTensorDict(a, b, stack_dim=1).unbind(0)] == [(2,)] * 3


def test_writes_go_into_the_members() -> None:
    a, b = _members()
    ls = LazyStackedTensorDict(a, b)
    ls[1] = TensorDict({"x": torch.full((3, 5), 7.0)}, batch_size=[3])
    assert ls.tensordicts[1] is b and b["x"].unique().tolist() == [7.0]
    ls["w"] = torch.arange(6).reshape(2, 3)
    assert a["w"].tolist() == [0, 1, 2] and b["w"].tolist() == [3, 4, 5]
    ls.set_(("n", "b"), torch.full((2, 3), 5.0))
    assert a["n", "b"].tolist() == [5.0] * 3
    ls[0, 1] = 0  # a scalar into member 0's tensors at row 1
    assert a["x"][1].tolist() == [0.0, 0.0] and b["x"][1, 0].item() == 7.0
    ls.lock_()
    assert a.is_locked and b.is_locked
    with pytest.raises(tdshare.LockedError):
        ls["q"] = torch.zeros(2, 3)
    ls.unlock_()
    assert not a.is_locked
    del ls["w"]
    assert "w" not in a and "w" not in b
    with pytest.raises(tdshare.BatchSizeError):
        ls["bad"] = torch.zeros(3, 2)


def test_dense_conversion_equality_repr_pickle() -> None:
    a = TensorDict(x=torch.arange(3.0), batch_size=[3])
    b = TensorDict(x=torch.arange(3.0) + 10, batch_size=[3])
    ls = LazyStackedTensorDict(a, b, stack_dim=1)
    dense = ls.to_tensordict()
    assert type(dense) is TensorDict and dense.batch_size == (3, 2) and dense["x"][:, 1].tolist() == [10, 11, 12]
    assert ls.dense_stack(1)["x"].tolist() == dense["x"].tolist()
    eq = ls == ls.clone()
    assert isinstance(eq, LazyStackedTensorDict) and eq.all()
    assert not (ls == dense.apply(lambda t: t + 1)).any()
    assert (ls != 0).tensordicts[0]["x"].tolist() == [False, True, True]
    text = repr(_stack())
    assert "stack_dim=0" in text and "exclusive_fields={0: {y: i64[]}, 1: {z: f32[]}}" in text and "x: f32[-1]" in text
    back = pickle.loads(pickle.dumps(ls))
    assert isinstance(back, LazyStackedTensorDict) and back.stack_dim == 1 and back["x"].tolist() == ls["x"].tolist()
    with pytest.raises((tdshare.NotSupportedError, tdshare.MissingKeyError)):
        _stack().to_tensordict()
    assert torch.stack([ls, ls], 0).batch_size == (2, 3, 2)


def test_a_lazy_stack_inside_a_tensordict() -> None:
    ls = _stack()
    td = TensorDict({"ls": ls, "w": torch.zeros(2, 3)}, batch_size=[2, 3])
    assert td["ls", "n", "b"].tolist() == [[0.0] * 3, [1.0] * 3]
    assert td.keys(True, True) == [("ls", "x"), ("ls", "n", "b"), ("ls", "s"), "w"]
    td["ls", "new"] = torch.ones(2, 3)
    assert ls.tensordicts[1]["new"].tolist() == [1.0] * 3
    row = td[1]
    assert row["ls"] is ls.tensordicts[1] and row["w"].shape == (3,)
    td.zero_()  # in place, into the members' own tensors
    assert ls.tensordicts[1]["z"].tolist() == [0.0] * 3
    td.lock_()
    assert ls.is_locked and ls.tensordicts[0].is_locked
    with pytest.raises(tdshare.BatchSizeError):
        TensorDict({"ls": _stack()}, batch_size=[3])


# -- NonTensorStack -------------------------------------------------------------------------
def test_nontensor_stack() -> None:
    s = torch.stack([NonTensorData("a"), NonTensorData("b"), NonTensorData("c")])
    assert isinstance(s, NonTensorStack) and s.tolist() == ["a", "b", "c"] and s.batch_size == (3,)
    assert isinstance(s[1], NonTensorData) and s[1].data == "b" and s[1:].tolist() == ["b", "c"]
    assert (s == NonTensorStack("a", "x", "c")).tolist() == [True, False, True]
    assert (s == "c").tolist() == [False, False, True]
    assert pickle.loads(pickle.dumps(s)).tolist() == ["a", "b", "c"]
    grid = NonTensorStack(NonTensorStack("a", "b"), NonTensorStack("c", "d"), stack_dim=1)
    assert grid.tolist() == [["a", "c"], ["b", "d"]] and grid[:, 1].tolist() == ["c", "d"]
    assert NonTensorData("v", batch_size=[2]).tolist() == ["v", "v"]
    assert torch.stack([NonTensorData("v", batch_size=[2]), NonTensorData("w", batch_size=[2])]).tolist() == [
        ["v", "v"],
        ["w", "w"],
    ]
    with pytest.raises(tdshare.BatchSizeError, match="value 1"):
        NonTensorStack(NonTensorData("a"), NonTensorData("b", batch_size=[2]))


def test_stacked_tensordicts_with_differing_values() -> None:
    tds = [TensorDict(s=v, t=torch.zeros(2), batch_size=[2]) for v in ("a", "b")]
    out = torch.stack(tds)
    assert isinstance(out._tensordict["s"], NonTensorStack) and out["s"] == [["a", "a"], ["b", "b"]]
    assert out[1]["s"] == ["b", "b"] and out[0, 1]["s"] == "a"
    assert out.clone()["s"] == out["s"] and torch.stack(tds[:1] * 2)["s"] == "a"
    assert (out == out.clone())["s"].all()
    assert torch.cat([out, out])["s"] == [["a", "a"], ["b", "b"]] * 2


# -- the memmap family --------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1])
def test_memmap_in_place_in_the_reference_layout(tmp_path: Path, dim: int) -> None:
    ls = _stack(dim)
    a, b = ls.tensordicts
    assert ls.memmap_(tmp_path) is ls
    assert ls.is_memmap() and ls.is_locked and ls.saved_path == str(tmp_path)
    assert ls.tensordicts == [a, b] and a.is_memmap() and a.saved_path == str(tmp_path / "0")
    assert isinstance(b["x"], MemoryMappedTensor) and b["x"]._filename == str(tmp_path / "1" / "x.memmap")
    assert json.loads((tmp_path / "meta.json").read_text()) == {**LAZY_META, "stack_dim": dim, "stack_dim_name": None}
    assert json.loads((tmp_path / "1" / "meta.json").read_text())["x"]["shape"] == [3, 5]
    assert (tmp_path / "1" / "x.memmap").read_bytes() == torch.arange(15.0).numpy().tobytes()
    back = LazyStackedTensorDict.load_memmap(tmp_path)
    _same_stack(back, _stack(dim))
    back.tensordicts[0]["y"][0] = 9  # the loaded members map the same files
    assert a["y"][0].item() == 9


@pytest.mark.parametrize("target", ["folder", "archive", "anonymous"])
def test_memmap_copy_and_load_back(tmp_path: Path, target: str) -> None:
    ls = _stack(1)
    prefix = {"folder": tmp_path / "f", "archive": tmp_path / "t.tdz", "anonymous": None}[target]
    out = ls.memmap(prefix)
    assert isinstance(out, LazyStackedTensorDict) and out is not ls
    sources = [v for m in ls.tensordicts for v in m.values(True, True) if isinstance(v, torch.Tensor)]
    assert all(type(v) is torch.Tensor for v in sources)  # memmap() leaves the source alone
    _same_stack(out, _stack(1))
    leaf = out.tensordicts[1]["x"]
    assert isinstance(leaf, MemoryMappedTensor)
    if target == "anonymous":
        assert leaf._segment is not None and out.is_memmap()
        return
    assert leaf._filename == str(prefix if target == "archive" else tmp_path / "f" / "1" / "x.memmap")
    again = out.save(tmp_path / "again", copy_existing=True)
    for loaded in (tdshare.load(prefix), LazyStackedTensorDict.load_memmap(prefix), again):
        _same_stack(loaded, _stack(1))


def test_nested_lazy_stack_saved_and_loaded(tmp_path: Path) -> None:
    td = TensorDict({"ls": _stack(), "w": torch.arange(6.0).reshape(2, 3)}, batch_size=[2, 3])
    td.memmap_(tmp_path)
    assert json.loads((tmp_path / "meta.json").read_text())["ls"] == {"type": "LazyStackedTensorDict"}
    assert (tmp_path / "ls" / "0" / "n" / "b.memmap").exists()
    assert td["ls"].is_memmap() and td["ls"].tensordicts[1].saved_path == str(tmp_path / "ls" / "1")
    for source in (tmp_path, td.memmap(tmp_path / "copy.tdz", copy_existing=True)):
        back = TensorDict.load(source) if isinstance(source, Path) else source
        assert isinstance(back, TensorDict) and back["w"].tolist() == td["w"].tolist()
        _same_stack(back["ls"], _stack())


def test_load_memmap_in_place_reuses_the_members(tmp_path: Path) -> None:
    _stack().memmap(tmp_path)
    target = _stack()
    target.tensordicts[0]["y"].fill_(5)
    members = list(target.tensordicts)
    assert target.load_memmap_(tmp_path) is target
    assert target.tensordicts == members and target.tensordicts[0]["y"].tolist() == [0, 1, 2]
    assert isinstance(members[1]["x"], MemoryMappedTensor)
    with pytest.raises(tdshare.InvalidArgumentError, match=r"2 members along dim 0; this one has 3"):
        LazyStackedTensorDict(*_members(), _members()[0]).load_memmap_(tmp_path)


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda p: shutil.rmtree(p / "1"), "member folder 1 is missing"),
        (lambda p: (p / "1" / "meta.json").unlink(), "member folder 1 has no meta.json"),
        (lambda p: (p / "0" / "meta.json").write_text(json.dumps({"shape": [4], "_type": "x"})), "member 2|member 1"),
    ],
)
@pytest.mark.parametrize("archive", [False, True])
def test_damaged_members_are_refused_by_name(
    tmp_path: Path, damage: Callable[[Path], Any], match: str, archive: bool
) -> None:
    path = tmp_path / "s"
    LazyStackedTensorDict(*_members(), _members()[0]).memmap(path)
    damage(path)
    source = path
    if archive:
        source = Path(tdshare.pack_memmap(path, tmp_path / "s.tdz"))
    with pytest.raises(tdshare.CorruptDataError, match=match):
        tdshare.load(source)


def test_nothing_half_written_on_a_bad_member(tmp_path: Path) -> None:
    a, b = _members()
    b["bad"] = torch.zeros(3, dtype=torch.float32).to_sparse()
    with pytest.raises(tdshare.NotSupportedError, match="member 1"):
        LazyStackedTensorDict(a, b).memmap_(tmp_path / "out")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*"))
    assert not a.is_memmap() and type(a["x"]) is torch.Tensor


@pytest.mark.parametrize("pickled", [False, True])
def test_nontensor_stack_saved_in_the_reference_format(tmp_path: Path, pickled: bool) -> None:
    values: list[Any] = [{1}, {2}] if pickled else ["a", "b"]
    td = torch.stack([TensorDict(s=v, t=torch.zeros(1), batch_size=[1]) for v in values])
    td.memmap(tmp_path)
    raw = (tmp_path / "s" / "meta.json").read_text()
    data = "pickle.pkl" if pickled else [[v] for v in values]
    assert raw == json.dumps(
        {
            "_type": "<class 'tensordict.tensorclass.NonTensorStack'>",
            "_format_version": 1,
            "_class": "tensordict:NonTensorStack",
            "stack_dim": 0,
            "device": None,
            "data": data,
        },
        separators=(",", ":"),
    )
    assert (tmp_path / "s" / "pickle.pkl").exists() == pickled
    back = TensorDict.load(tmp_path, allow_pickle=True)
    assert isinstance(back._tensordict["s"], NonTensorStack) and back["s"] == [[v] for v in values]
    ref = tensordict.TensorDict.load_memmap(tmp_path, allow_pickle=True)
    assert ref["s"] == [[v] for v in values]
    if pickled:
        with pytest.raises(tdshare.PickleRefusedError):
            TensorDict.load(tmp_path, allow_pickle=False)


# -- compatibility with the reference --------------------------------------------------------------
def _ref_members() -> list[tensordict.TensorDict]:
    a = tensordict.TensorDict({"x": torch.arange(6.0).reshape(3, 2), "y": torch.arange(3)}, [3])
    b = tensordict.TensorDict({"x": torch.arange(15.0).reshape(3, 5), "z": -torch.ones(3)}, [3])
    a.set_non_tensor("s", "left")
    b.set_non_tensor("s", "right")
    return [a, b]


@pytest.mark.parametrize("archive", [False, True])
@pytest.mark.parametrize("nested", [False, True])
def test_reference_reads_tdshare_lazy_stacks(tmp_path: Path, archive: bool, nested: bool) -> None:
    ls = _stack(1)
    src: Any = TensorDict({"ls": ls}, batch_size=[3, 2]) if nested else ls
    folder = tmp_path / "f"
    src.memmap(folder)
    if archive:  # the reference reads folders: a tdshare archive unpacked is one
        src.memmap(tmp_path / "a.tdz")
        folder = Path(tdshare.unpack_memmap(tmp_path / "a.tdz", tmp_path / "unpacked"))
    ref = tensordict.TensorDict.load_memmap(folder)
    ref_ls = ref["ls"] if nested else ref
    assert isinstance(ref_ls, tensordict.LazyStackedTensorDict) and ref_ls.stack_dim == 1
    for mine, theirs in zip(ls.tensordicts, ref_ls.tensordicts, strict=True):
        assert sorted(theirs.keys()) == sorted(mine.keys())
        assert theirs["n", "b"].tolist() == mine["n", "b"].tolist()
        assert theirs["x"].tolist() == mine["x"].tolist() and theirs["s"] == mine["s"]


@pytest.mark.parametrize("archive", [False, True])
@pytest.mark.parametrize("nested", [False, True])
def test_tdshare_reads_reference_lazy_stacks(tmp_path: Path, archive: bool, nested: bool) -> None:
    ref = tensordict.LazyStackedTensorDict.lazy_stack(_ref_members(), 1)
    src: Any = tensordict.TensorDict({"ls": ref}, [3, 2]) if nested else ref
    src.memmap(tmp_path / "f")
    source = tmp_path / "f"
    if archive:
        source = Path(tdshare.pack_memmap(tmp_path / "f", tmp_path / "f.tdz"))
    loaded = tdshare.load(source)
    mine = loaded["ls"] if nested else loaded
    assert isinstance(mine, LazyStackedTensorDict) and mine.stack_dim == 1 and mine.batch_size == (3, 2)
    for m, r in zip(mine.tensordicts, ref.tensordicts, strict=True):
        assert m["x"].tolist() == r["x"].tolist() and m["s"] == r["s"]
        assert sorted(m.keys()) == sorted(r.keys())
    assert mine["s"] == ref["s"]


def test_reference_nontensor_stack_round_trip(tmp_path: Path) -> None:
    tensordict.NonTensorStack("x", "y", "z").memmap(tmp_path / "ref")
    alone = tdshare.load(tmp_path / "ref")
    assert isinstance(alone, NonTensorStack) and alone.tolist() == ["x", "y", "z"]
    TensorDict({"s": alone}, batch_size=[3]).memmap(tmp_path / "mine")
    assert tensordict.TensorDict.load_memmap(tmp_path / "mine")["s"] == ["x", "y", "z"]


# -- across processes --------------------------------------------------------------------------
def _child_writes(ls: LazyStackedTensorDict, replies: Any) -> None:
    try:
        ls.tensordicts[1]["x"][0, 0] = 100.0
        ls.tensordicts[0]["y"].add_(10)
        replies.put(("ok", type(ls).__name__, ls.stack_dim, list(ls.batch_size)))
    except BaseException:  # the parent gets the traceback instead of waiting
        replies.put(("error", traceback.format_exc()))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("via", ["argument", "queue"])
def test_processes_write_into_the_parents_files(tmp_path: Path, method: str, via: str) -> None:
    ctx = mp.get_context(method)
    ls = _stack(1).memmap_(tmp_path)
    replies = ctx.Queue()
    if via == "argument":
        proc = ctx.Process(target=_child_writes, args=(ls, replies))
        proc.start()
    else:
        inbox = ctx.Queue()
        proc = ctx.Process(target=_relay, args=(inbox, replies))
        proc.start()
        inbox.put(ls)
    reply = replies.get(timeout=WAIT)
    proc.join(WAIT)
    assert reply == ("ok", "LazyStackedTensorDict", 1, [3, 2]), reply
    assert ls.tensordicts[1]["x"][0, 0].item() == 100.0 and ls.tensordicts[0]["y"].tolist() == [10, 11, 12]
    assert LazyStackedTensorDict.load_memmap(tmp_path).tensordicts[1]["x"][0, 0].item() == 100.0


def _relay(inbox: Any, replies: Any) -> None:
    _child_writes(inbox.get(timeout=WAIT), replies)


def test_refreshing_a_parent_that_holds_a_lazy_stack(tmp_path: Path) -> None:
    """An entry added elsewhere appears; the lazy child stays a lazy stack over the same files."""
    ls = LazyStackedTensorDict(
        TensorDict(a=torch.zeros(2), batch_size=[2]), TensorDict(a=torch.ones(2), b=torch.ones(2), batch_size=[2])
    )
    parent = TensorDict({"x": torch.zeros(2, 2)}, batch_size=[2])
    parent["ls"] = ls
    parent.memmap_(tmp_path)
    TensorDict.load(tmp_path).memmap_().make_memmap("y", [2])[:] = 3.0
    parent.memmap_refresh_()
    child = parent._tensordict["ls"]
    assert parent["y"].tolist() == [3.0, 3.0] and isinstance(child, LazyStackedTensorDict)
    assert child.tensordicts[1]["b"].tolist() == [1.0, 1.0]
    child.tensordicts[0]["a"][0] = 9.0  # still the saved file
    assert TensorDict.load(tmp_path)["ls"].tensordicts[0]["a"].tolist() == [9.0, 0.0]


def _nested_lazy() -> LazyStackedTensorDict:
    """A lazy stack of lazy stacks of lazy stacks (2 x 3 x 4) of members with distinct values."""
    gen = torch.Generator().manual_seed(0)
    inner = [
        [LazyStackedTensorDict(*[TensorDict(a=torch.rand(2, generator=gen)) for _ in range(4)]) for _ in range(3)]
        for _ in range(2)
    ]
    return LazyStackedTensorDict(*[LazyStackedTensorDict(*row) for row in inner])


_INDEX_ITEMS = [1, slice(None), slice(1, 2), torch.tensor([1, 0]), range(1, 2), None, [0, 1], np.array([1, 0])]


@pytest.mark.parametrize("first", _INDEX_ITEMS, ids=lambda i: type(i).__name__)
@pytest.mark.parametrize("second", _INDEX_ITEMS, ids=lambda i: type(i).__name__)
def test_nested_lazy_stacks_index_as_their_dense_stack(first: Any, second: Any) -> None:
    """Every pair of index kinds (with a third, broadcast or not): the batch size and values of the
    dense stack's result. Two index sequences were applied one after the other before (a product:
    silently another batch size and other rows), and None was refused."""
    ls = _nested_lazy()
    dense = ls.to_tensordict()
    for index in ((first, second), (first, second, [1, 0]), (first, 1, second)):
        got = ls[index]
        assert got.batch_size == torch.zeros(ls.batch_size)[index].shape, index
        assert torch.equal(got["a"], dense[index]["a"]), index


def test_a_new_axis_of_a_lazy_stack_is_a_view_of_its_members() -> None:
    ls = _nested_lazy()
    view = ls[None, 1]
    assert view.batch_size == torch.Size([1, 3, 4])
    view[0, 2, 3]["a"].fill_(7.0)  # (a lazy stack's stacked leaf is a copy: a member's own leaf is not)
    assert ls[1, 2, 3]["a"].tolist() == [7.0, 7.0]


def test_writing_at_two_index_sequences_reaches_the_members() -> None:
    ls = _nested_lazy()
    dense = ls.to_tensordict()
    rows, cols = torch.tensor([0, 1]), torch.tensor([2, 0])
    ls[rows, cols] = TensorDict(a=torch.full((2, 4, 2), 5.0), batch_size=[2, 4])
    dense[rows, cols] = TensorDict(a=torch.full((2, 4, 2), 5.0), batch_size=[2, 4])
    assert torch.equal(ls["a"], dense["a"])
    assert ls.tensordicts[1].tensordicts[0].tensordicts[3]["a"].tolist() == [5.0, 5.0]
    assert ls.tensordicts[1].tensordicts[2].tensordicts[3]["a"].tolist() != [5.0, 5.0]


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("where", ["append", 0, 1, -1])
def test_append_and_insert_add_a_member_as_the_reference(dim: int, where: Any) -> None:
    def grown(lib: Any) -> Any:
        td = lib.TensorDict({"a": torch.zeros(4)}, [4])
        ls = lib.LazyStackedTensorDict.lazy_stack([td, td.clone()], dim=dim)
        new = lib.TensorDict({"a": torch.ones(4), "extra": torch.rand(4)}, [4])
        ls.append(new) if where == "append" else ls.insert(where, new)
        return ls, new

    ours, new = grown(tdshare)
    ref, _ = grown(tensordict)
    assert ours.batch_size == ref.batch_size == (torch.Size([3, 4]) if dim == 0 else torch.Size([4, 3]))
    assert set(ours.keys()) == set(ref.keys()) == {"a"}
    assert torch.equal(ours["a"], ref["a"]) and any(m is new for m in ours.tensordicts)
    with pytest.raises(TypeError, match="TensorDictBase"):
        ours.append(torch.rand(10))
    with pytest.raises(ValueError, match="Batch sizes"):
        ours.insert(0, TensorDict({"a": torch.ones(17)}, [17]))
    assert len(ours.tensordicts) == 3  # the refused members were not added
    with pytest.raises(tdshare.LockedError):
        ours.lock_().append(TensorDict({"a": torch.ones(4)}, [4]))


# -- entries whose shapes differ across the members: padded, nested ------------------------------
def _ragged(lib: Any, dim: int) -> Any:
    a = lib.TensorDict(x=torch.arange(12.0).reshape(4, 3), batch_size=[4])
    b = lib.TensorDict(x=-torch.arange(8.0).reshape(4, 2), batch_size=[4])
    return lib.LazyStackedTensorDict.lazy_stack([a, b], dim)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("dim", [0, 1])
def test_a_ragged_entry_reads_padded_or_nested_as_the_reference(dim: int) -> None:
    ours, theirs = _ragged(tdshare, dim), _ragged(tensordict, dim)
    for side, value in (("right", 0.0), ("left", -1.0)):
        kw = {"as_padded_tensor": True, "padding_side": side, "padding_value": value}
        assert torch.equal(ours.get("x", **kw), theirs.get("x", **kw))
    for layout in (torch.jagged, torch.strided):
        mine, ref = (
            ours.get("x", as_nested_tensor=True, layout=layout),
            theirs.get("x", as_nested_tensor=True, layout=layout),
        )
        assert mine.layout == ref.layout == layout
        assert all(torch.equal(m, r) for m, r in zip(mine.unbind(), ref.unbind(), strict=True))
    for read in (lambda s: s.get("x"), lambda s: s["x"], lambda s: s.contiguous(), lambda s: s.to_tensordict()):
        with pytest.raises(RuntimeError, match="Failed to stack tensors within a tensordict"):
            read(ours)
        with pytest.raises(RuntimeError, match="Failed to stack tensors within a tensordict"):
            read(theirs)
    assert [list(t.shape) for t in ours.clone().get("x", as_list=True)] == [[4, 3], [4, 2]]
    if dim == 0:
        nested = ours.get_nestedtensor("x")
        assert nested.layout == torch.strided and torch.equal(
            nested.unbind()[1], theirs.get_nestedtensor("x").unbind()[1]
        )
    else:
        with pytest.raises(RuntimeError, match="get_nestedtensor can only be called when the stack_dim is 0"):
            ours.get_nestedtensor("x")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_ragged_reads_of_missing_keys_and_stacks_of_stacks() -> None:
    ls = LazyStackedTensorDict(TensorDict(a=torch.zeros(4), b=torch.zeros(4)), TensorDict(a=torch.ones(5)))
    assert ls.get_nestedtensor("b", None) is None  # a default that is not a tensor is returned
    assert torch.equal(ls.get_nestedtensor("b", torch.ones(2)).unbind()[1], torch.ones(2))  # a tensor one is nested
    with pytest.raises(KeyError, match="members \\[1\\] lack it"):
        ls.get("b", as_padded_tensor=True)
    with pytest.raises(ValueError, match="exclude each other"):
        ls.get("a", as_list=True, as_padded_tensor=True)
    inner = LazyStackedTensorDict(TensorDict(a=torch.ones(1)), TensorDict(a=torch.ones(3)))
    outer = LazyStackedTensorDict(
        inner, LazyStackedTensorDict(TensorDict(a=torch.ones(2)), TensorDict(a=torch.ones(2)))
    )
    padded = outer.get("a", as_padded_tensor=True)  # padded across both levels
    assert padded.shape == (2, 2, 3) and padded.sum().item() == 1 + 3 + 2 + 2
    with pytest.raises(ValueError, match="one nested level"):
        outer.get("a", as_nested_tensor=True)


def test_the_stack_class_methods_take_out_and_choose_dense_or_lazy() -> None:
    same = [TensorDict(x=torch.full((2,), float(i))) for i in range(3)]
    ragged = [TensorDict(x=torch.zeros(2)), TensorDict(x=torch.zeros(3))]
    for cls in (TensorDict, LazyStackedTensorDict):
        assert type(cls.maybe_dense_stack(same)) is TensorDict
        assert type(cls.maybe_dense_stack(ragged)) is LazyStackedTensorDict
    for cls in (tensordict.TensorDict, tensordict.LazyStackedTensorDict):  # as the reference chooses
        ref = [tensordict.TensorDict(x=torch.zeros(2)), tensordict.TensorDict(x=torch.zeros(3))]
        assert type(cls.maybe_dense_stack(ref)).__name__ == "LazyStackedTensorDict"
    out = TensorDict(x=torch.ones(3, 2), batch_size=[3])
    kept = out["x"]
    assert LazyStackedTensorDict.lazy_stack(same, 0, out=out) is out
    assert out["x"] is kept and out["x"][:, 0].tolist() == [0.0, 1.0, 2.0]  # written in place
    assert LazyStackedTensorDict.maybe_dense_stack(same, 0, out=out) is out


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_get_through_a_tensordict_reads_a_nested_lazy_stack_padded_or_nested() -> None:
    def make(lib: Any) -> Any:
        inner = lib.lazy_stack([lib.TensorDict(x=torch.ones(1)), lib.TensorDict(x=torch.ones(2) * 2)])
        return lib.TensorDict(inner=inner, batch_size=[2])

    ours, theirs = make(tdshare), make(tensordict)
    for kw in ({"as_padded_tensor": True}, {"as_padded_tensor": True, "padding_side": "left", "padding_value": -1}):
        assert torch.equal(ours.get(("inner", "x"), **kw), theirs.get(("inner", "x"), **kw))
    assert ours.get(("inner", "x"), as_nested_tensor=True).is_nested
    assert [t.tolist() for t in ours.get(("inner", "x"), as_list=True)] == [[1.0], [2.0, 2.0]]
    dense = TensorDict(a=torch.ones(2), batch_size=[2])
    with pytest.warns(FutureWarning, match="dense entry"):  # ignored for a dense entry, as the reference
        assert dense.get("a", as_list=True) is dense["a"]


def test_a_lazy_stack_indexed_with_a_mask_or_an_index_tensor_of_two_dims_gives_the_dense_result() -> None:
    torch.manual_seed(0)
    for dim in (0, 1):
        ls = LazyStackedTensorDict(*[TensorDict(a=torch.randn(3, 4), batch_size=[3]) for _ in range(2)], stack_dim=dim)
        dense = ls.to_tensordict()
        mask = torch.rand(ls.shape) > 0.5
        grid = torch.tensor([[0, 1], [1, 0]])
        for idx in (mask, grid, (slice(None), grid), (0, grid[:1])):
            assert torch.equal(ls[idx]["a"], dense[idx]["a"]), (dim, idx)
        ls[mask] = TensorDict(a=torch.zeros(int(mask.sum()), 4), batch_size=[int(mask.sum())])
        assert float(ls["a"][mask].abs().sum()) == 0.0 and torch.equal(ls["a"][~mask], dense["a"][~mask])
        assert ls.tensordicts[0] in ls and ls.tensordicts[0].clone() not in ls  # `member in ls` is by identity


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_densify_makes_lazy_stacks_dense_and_ragged_entries_nested(layout: Any) -> None:
    def stack(lib: Any) -> Any:
        td0 = lib.TensorDict(a=torch.zeros(1), b=torch.zeros(2), d=lib.TensorDict(e=torch.zeros(())))
        td1 = lib.TensorDict(b=torch.ones(1), c=torch.ones(2), d=lib.TensorDict(e=torch.ones(())))
        return lib.LazyStackedTensorDict(td0, td1, stack_dim=0)

    ours, theirs = stack(tdshare).densify(layout=layout), stack(tensordict).densify(layout=layout)
    assert type(ours) is TensorDict and sorted(map(str, ours.keys(True, True))) == sorted(
        map(str, theirs.keys(True, True))
    )
    for key in ("a", "b", "c"):
        assert ours[key].is_nested and ours[key].layout == layout
        assert [t.tolist() for t in ours[key].unbind()] == [t.tolist() for t in theirs[key].unbind()], key
    assert not ours["d", "e"].is_nested and ours["d", "e"].tolist() == [0.0, 1.0]
    nest = TensorDict(td=stack(tdshare), batch_size=[2]).densify(layout=layout)
    assert nest["td", "b"].is_nested and [t.tolist() for t in nest["td", "b"].unbind()] == [[0.0, 0.0], [1.0]]
    plain = TensorDict(a=torch.zeros(2), batch_size=[2])
    assert plain.densify() is plain  # nothing lazy: itself
    same = LazyStackedTensorDict(TensorDict(a=torch.zeros(3)), TensorDict(a=torch.ones(3)), stack_dim=0).densify()
    assert not same["a"].is_nested and same["a"].tolist() == [[0.0] * 3, [1.0] * 3]
    with pytest.raises(RuntimeError, match="nests along its first dim"):
        LazyStackedTensorDict(
            TensorDict(a=torch.zeros(2, 3), batch_size=[2]), TensorDict(a=torch.ones(2, 4), batch_size=[2]), stack_dim=1
        ).densify()


@pytest.mark.parametrize("strict_shape", [False, True])
def test_members_of_other_batch_sizes_are_refused_with_the_references_words(strict_shape: bool) -> None:
    td0, td1 = TensorDict(batch_size=[3, 4]), TensorDict(batch_size=[3, 5])
    with pytest.raises(RuntimeError, match="stacking tensordicts requires"):
        TensorDict.lazy_stack([td0, td1], strict_shape=strict_shape)
    with pytest.raises(RuntimeError, match="batch sizes in tensordicts differs"):
        LazyStackedTensorDict(td0, td1, strict_shape=strict_shape)
    with pytest.raises(RuntimeError, match="stacking tensordicts requires"):  # the reference with strict_shape=True
        tensordict.TensorDict.lazy_stack(
            [tensordict.TensorDict(batch_size=[3, 4]), tensordict.TensorDict(batch_size=[3, 5])], strict_shape=True
        )
    ok = LazyStackedTensorDict.lazy_stack([td0, td0.clone()], 1, strict_shape=strict_shape, stack_dim_name="s")
    assert ok.batch_size == (3, 2, 4) and ok.names == [None, "s", None]
