"""UnbatchedTensor, NonTensorData/NonTensorStack memory-mapped on their own, and the leaf-side
behaviour of non-tensor values (update_ through a locked tensordict, MetaData, LinkedList,
auto_batch_size_, where), compared with tensordict 0.15.3 where it has the operation."""

from __future__ import annotations

import math
import multiprocessing as mp
import operator
import os
import pickle
from collections import UserDict
from typing import Any

import pytest
import tensordict
import torch
from _kinds import KINDS, build

import tdshare as tdshare_lib
from tdshare import (
    LinkedList,
    LockedError,
    MetaData,
    NonTensorData,
    NonTensorStack,
    NotSupportedError,
    PickleRefusedError,
    TensorDict,
    UnbatchedTensor,
)

METHODS = ["spawn", "fork", "forkserver"]
TIMEOUT = 60


# -- UnbatchedTensor on its own ------------------------------------------------------------------
@pytest.mark.parametrize(
    "data", [torch.tensor(3), torch.tensor([3]), torch.tensor(1.25), torch.tensor(1 + 2j), torch.tensor([1, 2])]
)
def test_unbatched_python_conversions_are_the_payloads(data: torch.Tensor) -> None:
    ours, theirs = UnbatchedTensor(data), tensordict.UnbatchedTensor(data)
    for fun in (str, format, bool, int, float, complex, operator.index, round, math.trunc, math.floor, math.ceil):

        def outcome(x: Any, fun: Any = fun) -> Any:
            try:
                return fun(x)
            except Exception as err:  # the payload's own error, type and text
                return type(err), str(err)

        assert outcome(ours) == outcome(theirs) == outcome(data)
    assert repr(ours) == repr(theirs) == f"UnbatchedTensor({data!r})"
    assert ours.tolist() == theirs.tolist() == data.tolist()


def test_unbatched_is_a_tensor_sharing_the_payload() -> None:
    data = torch.arange(6.0).reshape(2, 3)
    ours = UnbatchedTensor(data, batch_size=[4])
    assert isinstance(ours, torch.Tensor) and ours.data_ptr() == data.data_ptr()
    assert ours.shape == (2, 3) and ours.batch_size == (4,)
    doubled = ours * 2  # an operation on it stays unbatched, with its batch size
    assert isinstance(doubled, UnbatchedTensor) and doubled.batch_size == (4,)
    assert doubled.tolist() == (tensordict.UnbatchedTensor(data, batch_size=[4]) * 2).tolist()
    back = pickle.loads(pickle.dumps(ours))
    assert isinstance(back, UnbatchedTensor) and back.batch_size == (4,) and back.tolist() == data.tolist()


# -- UnbatchedTensor in a tensordict -------------------------------------------------------------
def _pair() -> tuple[Any, Any, torch.Tensor]:
    data = torch.randn(10)
    b = torch.randn(2, 3)
    ours = TensorDict(a=UnbatchedTensor(data), b=b, batch_size=[2, 3])
    theirs = tensordict.TensorDict(a=tensordict.UnbatchedTensor(data), b=b, batch_size=[2, 3])
    return ours, theirs, data


OPS = {
    "index": lambda td: td[0],
    "slice": lambda td: td[:, :2],
    "mask": lambda td: td[torch.tensor([True, False])],
    "reshape": lambda td: td.reshape(6),
    "view": lambda td: td.view(3, 2),
    "unsqueeze": lambda td: td.unsqueeze(0),
    "expand": lambda td: td.unsqueeze(0).expand(4, 2, 3),
    "permute": lambda td: td.permute(1, 0),
    "transpose": lambda td: td.transpose(0, 1),
    "flatten": lambda td: td.flatten(0, 1),
    "unflatten": lambda td: td.flatten(0, 1).unflatten(0, (3, 2)),
    "squeeze": lambda td: td.unsqueeze(1).squeeze(1),
    "gather": lambda td: td.gather(0, torch.zeros(1, 3, dtype=torch.long)),
    "masked_select": lambda td: td.masked_select(torch.tensor([[True, False, True], [False, True, False]])),
    "masked_select one dim": lambda td: td.masked_select(torch.tensor([False, True])),
    "split": lambda td: td.split(1, 0)[1],
    "chunk": lambda td: td.chunk(3, 1)[2],
    "unbind": lambda td: td.unbind(1)[2],
    "stack": lambda td: torch.stack([td, td], 1),
    "cat": lambda td: torch.cat([td, td], 0),
    "copy": lambda td: td.copy(),
    "select": lambda td: td.select("a", "b"),
    "exclude": lambda td: td.exclude("b"),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_batch_operations_leave_the_unbatched_entry_whole(op: str) -> None:
    ours, theirs, data = _pair()
    mine, ref = OPS[op](ours), OPS[op](theirs)
    assert mine.batch_size == ref.batch_size
    got = mine["a"]
    assert isinstance(got, UnbatchedTensor) and isinstance(ref["a"], tensordict.UnbatchedTensor)
    assert got.shape == ref["a"].shape == (10,)
    assert got.batch_size == ref["a"].batch_size == mine.batch_size
    assert got.data_ptr() == data.data_ptr()
    assert sorted(mine.keys()) == sorted(ref.keys())
    if "b" in ref.keys():
        assert torch.equal(mine["b"], ref["b"])


def test_unbatched_entry_is_never_checked_against_the_batch() -> None:
    td = TensorDict(a=UnbatchedTensor(torch.zeros(7, 11)), b=torch.zeros(3), batch_size=[3])
    assert td["a"].shape == (7, 11) and td.get("a").batch_size == (3,)
    assert td.copy()["a"] is td["a"] and td.select("a")["a"] is td["a"]  # the same object for the same batch


def test_elementwise_operations_apply_to_the_unbatched_tensor() -> None:
    ours, theirs, _ = _pair()
    for fn in (lambda td: td.int(), lambda td: td.apply(lambda t: t + 1), lambda td: td.clone()):
        mine, ref = fn(ours), fn(theirs)
        assert isinstance(mine["a"], UnbatchedTensor)
        assert mine["a"].dtype == ref["a"].dtype and mine["a"].tolist() == ref["a"].tolist()


def test_stacking_different_unbatched_tensors_warns_and_keeps_the_first() -> None:
    first, second = torch.zeros(5), torch.ones(5)
    tds = [TensorDict(x=torch.ones(3), u=UnbatchedTensor(t), batch_size=[3]) for t in (first, second)]
    with pytest.warns(UserWarning, match="different data storage"):
        stacked = torch.stack(tds)
    assert stacked["u"].data_ptr() == first.data_ptr() and stacked["u"].batch_size == (2, 3)


@pytest.mark.parametrize("kind", KINDS)
def test_unbatched_entry_in_every_kind(kind: str) -> None:
    payload = torch.arange(5.0)
    obj = build(kind)
    obj.set(("n", "u"), UnbatchedTensor(payload))
    for result, batch in (
        (obj, (4,)),
        (obj[1], ()),
        (obj[1:3], (2,)),
        (obj.reshape(2, 2), (2, 2)),
        (obj.unsqueeze(0), (1, 4)),
        (torch.stack([obj, obj]), (2, 4)),
    ):
        got = result.get(("n", "u"))
        assert isinstance(got, UnbatchedTensor)
        assert got.batch_size == batch and got.data_ptr() == payload.data_ptr() and got.tolist() == payload.tolist()


def test_unbatched_entry_refuses_to_be_saved_as_the_reference(tmp_path: Any) -> None:
    ours, theirs, _ = _pair()
    with pytest.raises(NotImplementedError):
        theirs.memmap_(tmp_path / "ref")
    with pytest.raises(NotSupportedError, match="UnbatchedTensor"):
        ours.memmap_(tmp_path / "ours")
    with pytest.raises(NotSupportedError, match="exclude"):
        ours.save(tmp_path / "ours.tdz")
    assert not os.path.exists(tmp_path / "ours" / "meta.json")
    mapped = ours.exclude("a").memmap_(tmp_path / "excluded")
    assert tensordict.TensorDict.load_memmap(tmp_path / "excluded")["b"].tolist() == mapped["b"].tolist()
    anonymous = ours.memmap_()  # no folder: the unbatched tensor stays in memory
    assert isinstance(anonymous["a"], UnbatchedTensor)


def _child_reads_and_bumps(td: Any, results: Any) -> None:
    entry = td.get("u")
    results.put((type(entry).__name__, tuple(entry.batch_size), entry.tolist()))
    entry.add_(1)
    results.put("done")


@pytest.mark.parametrize("method", METHODS)
def test_unbatched_entry_crosses_processes_shared(method: str) -> None:
    td = TensorDict(u=UnbatchedTensor(torch.zeros(4)), x=torch.zeros(3), batch_size=[3]).share_memory_()
    ctx = mp.get_context(method)
    results = ctx.Queue()
    child = ctx.Process(target=_child_reads_and_bumps, args=(td, results))
    child.start()
    try:
        seen = results.get(timeout=TIMEOUT)
        assert results.get(timeout=TIMEOUT) == "done"
    finally:
        child.join(TIMEOUT)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert seen == ("UnbatchedTensor", (3,), [0.0] * 4)
    assert td["u"].tolist() == [1.0] * 4  # written in place by the child


# -- NonTensorData / NonTensorStack memory-mapped on their own -------------------------------------
VALUES = ["cat", 3, 2.5, [1, "a"], {"k": [1, 2]}, 1 + 2j, {1: "int key"}]


@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ + str(i) for i, v in enumerate(VALUES)])
def test_value_saved_alone_loads_in_either_library(value: Any, tmp_path: Any) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    mapped = NonTensorData(value).memmap(ours)
    assert mapped.is_memmap() and mapped._is_memmap and mapped.is_locked
    tensordict.NonTensorData(value).memmap(theirs)
    assert sorted(os.listdir(ours)) == sorted(os.listdir(theirs))
    assert tensordict.NonTensorData.load_memmap(ours).data == value
    back = NonTensorData.load_memmap(theirs, allow_pickle=True)
    # as a tensordict's load (and the reference's): unlocked, not memory-mapped until memmap_()
    assert type(back) is NonTensorData and back.data == value and not back.is_memmap() and not back.is_locked
    assert back.memmap_().is_memmap() and back.is_locked


@pytest.mark.parametrize("values", [["a", "b", "c"], [1 + 2j, 3j, 4j]], ids=["json", "pickle"])
def test_stack_saved_alone_loads_in_either_library(values: list, tmp_path: Any) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    NonTensorStack(*values).memmap(ours)
    torch.stack([tensordict.NonTensorData(v) for v in values]).memmap(theirs)
    for folder in (ours, theirs):
        assert (folder / "meta.json").read_bytes() == (theirs / "meta.json").read_bytes()
        assert tensordict.TensorDict.load_memmap(folder).tolist() == values
        loaded = NonTensorStack.load_memmap(folder, allow_pickle=True)
        assert isinstance(loaded, NonTensorStack) and loaded.tolist() == values


def test_stack_rewritten_as_json_drops_its_stale_pickle(tmp_path: Any) -> None:
    NonTensorStack(1 + 2j, 3 + 4j).memmap(tmp_path)
    assert (tmp_path / "pickle.pkl").exists()
    NonTensorStack("a", "b").memmap(tmp_path)
    assert not (tmp_path / "pickle.pkl").exists()
    assert tensordict.TensorDict.load_memmap(tmp_path, allow_pickle=False).tolist() == ["a", "b"]


def test_updates_of_a_value_mapped_alone_rewrite_its_folder(tmp_path: Any) -> None:
    stack = NonTensorStack("a", "b").memmap_(tmp_path)
    with pytest.raises(LockedError, match="inplace=True"):
        stack.update(NonTensorStack("x", "y"))
    stack.update(NonTensorStack("c", "d"), inplace=True)
    assert tensordict.TensorDict.load_memmap(tmp_path).tolist() == ["c", "d"]
    stack.update_(NonTensorData("z"))  # one value for every element
    assert stack.tolist() == ["z", "z"] == tensordict.TensorDict.load_memmap(tmp_path).tolist()
    stack[1] = "q"
    assert tensordict.TensorDict.load_memmap(tmp_path).tolist() == ["z", "q"]
    other = tmp_path / "value"
    value = NonTensorData(1).memmap_(other)
    value.update_(NonTensorData(1 + 1j))  # now pickled
    assert tensordict.NonTensorData.load_memmap(other).data == 1 + 1j
    assert NonTensorData(0).load_memmap_(other, allow_pickle=True).data == 1 + 1j


VALUE_KINDS = ["data", "stack"]


def _value_of(kind: str, word: str) -> Any:
    return NonTensorData(word) if kind == "data" else NonTensorStack(word, word + "2")


def _plain(value: Any) -> Any:
    return value.data if isinstance(value, NonTensorData) and not isinstance(value, NonTensorStack) else value.tolist()


SPEC_METHODS = ["memmap_", "memmap", "save", "dumps", "load", "load_memmap", "load_memmap_", "make_memmap_from_storage"]


@pytest.mark.parametrize("kind", VALUE_KINDS)
def test_a_value_alone_has_the_spec_family(kind: str, tmp_path: Any) -> None:
    cls = type(_value_of(kind, "a"))
    assert all(callable(getattr(cls, m)) for m in [*SPEC_METHODS, "make_memmap", "memmap_refresh_"])
    folder = tmp_path / "v"
    _value_of(kind, "old").memmap_(folder)
    with pytest.raises(RuntimeError, match=r"existsok=False"):
        _value_of(kind, "new").memmap_(folder, existsok=False)
    assert _plain(cls.load(folder)) == _plain(_value_of(kind, "old"))  # nothing written
    assert _plain(_value_of(kind, "new").memmap_(folder, existsok=True)) == _plain(_value_of(kind, "new"))
    assert _plain(tensordict.TensorDict.load_memmap(folder)) == _plain(_value_of(kind, "new"))


@pytest.mark.parametrize("kind", VALUE_KINDS)
def test_a_value_alone_saved_atomically(kind: str, tmp_path: Any) -> None:
    folder = tmp_path / "v"
    _value_of(kind, "old").memmap_(folder)
    (folder / "stray").write_text("x")  # a file the value does not write: gone with the swap
    mapped = _value_of(kind, "new").memmap_(folder, atomic=True)
    assert mapped.is_memmap() and sorted(os.listdir(folder)) == ["meta.json"]
    assert _plain(tensordict.TensorDict.load_memmap(folder)) == _plain(_value_of(kind, "new"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("keep")
    with pytest.raises(RuntimeError, match=r"holds no saved tensordict"):
        _value_of(kind, "x").memmap_(tmp_path / "other", atomic=True)
    assert os.listdir(tmp_path / "other") == ["notes.txt"]
    (tmp_path / "file").write_text("f")
    with pytest.raises(NotADirectoryError):
        _value_of(kind, "x").memmap_(tmp_path / "file", atomic=True)
    with pytest.raises(NotImplementedError):
        _value_of(kind, "x").memmap_(tmp_path / "w", atomic=True, return_early=True, num_threads=2)
    with pytest.raises(ValueError, match=r"atomic=True needs a folder"):
        _value_of(kind, "x").memmap_(atomic=True)
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("kind", VALUE_KINDS)
def test_a_value_alone_in_an_archive_loads_in_either_library(kind: str, tmp_path: Any) -> None:
    ours, theirs = tmp_path / "ours.tdz", tmp_path / "theirs.tdz"
    value = _value_of(kind, "v")
    saved = value.save(ours)
    assert _plain(saved) == _plain(value) and not saved.is_memmap() and os.path.isfile(ours)
    assert _plain(type(value).load(ours)) == _plain(value)
    ref = (
        tensordict.NonTensorData("v")
        if kind == "data"
        else torch.stack([tensordict.NonTensorData(w) for w in ("v", "v2")])
    )
    assert _plain(tensordict.TensorDict.load(ours)) == _plain(value)
    ref.save(theirs)
    assert _plain(type(value).load(theirs)) == _plain(value)
    with pytest.raises(RuntimeError, match=r"existsok=True"):
        value.memmap(ours, existsok=False)
    assert _plain(value.dumps(tmp_path / "c.tdz", compression="deflate")) == _plain(value)
    for refused in ({"return_early": True, "num_threads": 2}, {"share_non_tensor": True}):  # as a tensordict's archive
        with pytest.raises(NotSupportedError, match=r"not supported for a \.tdz archive"):
            value.save(tmp_path / "r.tdz", **refused)
    assert not (tmp_path / "r.tdz").exists()


@pytest.mark.parametrize("kind", VALUE_KINDS)
def test_a_value_alone_returns_a_future_and_loads_back_in_place(kind: str, tmp_path: Any) -> None:
    from tdshare import TensorDictFuture

    value = _value_of(kind, "a")
    future = value.memmap_(tmp_path / "a", num_threads=2, return_early=True)
    assert isinstance(future, TensorDictFuture) and future.result() is value and value.is_memmap()
    _value_of(kind, "b").memmap(tmp_path / "b")
    plain = _value_of(kind, "z")
    assert plain.load_memmap_(tmp_path / "b", True) is plain and _plain(plain) == _plain(_value_of(kind, "b"))
    assert not plain.is_memmap() and not plain.is_locked  # a value that was not memory-mapped stays so
    assert value.load_memmap_(tmp_path / "b") is value and value.is_memmap() and value.is_locked
    assert _plain(value) == _plain(_value_of(kind, "b"))
    value.load_memmap_(tmp_path / "a", mode="r")  # no folder to stay mapped to
    assert _plain(value) == _plain(_value_of(kind, "a")) and not value.is_memmap() and not value.is_locked
    out = _value_of(kind, "q")
    assert type(value).load_memmap(tmp_path / "b", out=out) is out and _plain(out) == _plain(_value_of(kind, "b"))


@pytest.mark.parametrize("kind", VALUE_KINDS)
def test_a_value_alone_refreshes_and_refuses_entries(kind: str, tmp_path: Any) -> None:
    mine = _value_of(kind, "old").memmap_(tmp_path)
    _value_of(kind, "new").memmap(tmp_path)  # e.g. another process
    assert mine.memmap_refresh_() is mine and _plain(mine) == _plain(_value_of(kind, "new"))
    with pytest.raises(RuntimeError, match=r"not memory-mapped"):
        _value_of(kind, "x").memmap_refresh_()
    for call in (
        lambda: mine.make_memmap("k", [1]),
        lambda: mine.make_memmap_from_tensor("k", torch.ones(1)),
        lambda: mine.make_memmap_from_storage("k", torch.UntypedStorage(4), [1]),
    ):
        with pytest.raises(RuntimeError, match=rf"{type(mine).__name__}.make_memmap.*holds one non-tensor value"):
            call()
    assert sorted(os.listdir(tmp_path)) == ["meta.json"]  # nothing written


def test_load_memmap_of_the_wrong_class_is_refused(tmp_path: Any) -> None:
    NonTensorData("x").memmap(tmp_path)
    with pytest.raises(TypeError, match=r"TensorDict\.load_memmap"):
        NonTensorStack.load_memmap(tmp_path)
    NonTensorData(1 + 2j).memmap(tmp_path / "p")
    with pytest.raises(PickleRefusedError):
        NonTensorData.load_memmap(tmp_path / "p", allow_pickle=False)


# -- a value of a locked tensordict ----------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["shared", "memmap"])
def test_value_of_a_locked_tensordict_updates_in_place(strategy: str, tmp_path: Any) -> None:
    td = TensorDict(val=NonTensorData("old"), batch_size=[])
    td.share_memory_() if strategy == "shared" else td.memmap_(tmp_path)
    leaf = td.get("val")
    assert "data" not in leaf.__dict__
    assert leaf._is_shared == (strategy == "shared") and leaf._is_memmap == (strategy == "memmap")
    assert leaf._tensordict._is_memmap == (strategy == "memmap")
    with pytest.raises(RuntimeError, match="lock"):
        leaf.update(NonTensorData("new"))
    leaf.update(NonTensorData("new"), inplace=True)
    assert td["val"] == "new" and td.get("val").data == "new"
    if strategy == "memmap":
        assert tensordict.TensorDict.load_memmap(tmp_path)["val"] == "new"
    leaf.update_(NonTensorData([1, 2]))
    assert td["val"] == [1, 2]


# -- MetaData, auto_batch_size_, LinkedList, where ----------------------------------------------
@pytest.mark.parametrize(
    "op",
    [
        lambda td: td.expand(2, 3),
        lambda td: td.unsqueeze(0),
        lambda td: td.unsqueeze(0).squeeze(0),
        lambda td: td[1],
        lambda td: torch.stack([td, td]),
    ],
)
def test_metadata_stays_one_value_as_the_reference(op: Any) -> None:
    ours = op(TensorDict(foo=MetaData(7, batch_size=[3]), batch_size=[3]))
    theirs = op(tensordict.TensorDict(foo=tensordict.MetaData(7, batch_size=[3]), batch_size=[3]))
    mine, ref = ours.get("foo"), theirs.get("foo")
    assert isinstance(mine, MetaData) and isinstance(ref, tensordict.MetaData)
    assert mine.data == ref.data == 7 and mine.batch_size == ref.batch_size == ours.batch_size
    assert mine.tolist() == ref.tolist()


def test_metadata_that_differ_stack_into_values() -> None:
    ours = torch.stack([TensorDict(foo=MetaData("a")), TensorDict(foo=MetaData("b"))]).get("foo")
    ref = torch.stack(
        [tensordict.TensorDict(foo=tensordict.MetaData("a")), tensordict.TensorDict(foo=tensordict.MetaData("b"))]
    )
    assert isinstance(ours, NonTensorStack) and ours.tolist() == ref.get("foo").tolist() == ["a", "b"]


@pytest.mark.parametrize("batch_dims", [None, 1, 2])
def test_auto_batch_size_matches_the_reference(batch_dims: int | None) -> None:
    def content(lib: Any) -> dict:
        return {
            "x": torch.zeros(4, 3, 2),
            "m": lib.MetaData("scalar"),
            "u": lib.UnbatchedTensor(torch.zeros(9)),
            "n": {"y": torch.zeros(4, 3)},
        }

    ours = TensorDict(content(tdshare_lib)).auto_batch_size_(batch_dims)
    theirs = tensordict.TensorDict(content(tensordict)).auto_batch_size_(batch_dims)
    assert ours.batch_size == theirs.batch_size and ours["n"].batch_size == theirs["n"].batch_size
    strings = TensorDict.from_dict({"q": ["a", "b", "c", "d"]}, auto_batch_size=True, batch_dims=1)
    assert (
        strings.batch_size
        == (4,)
        == tensordict.TensorDict.from_dict({"q": ["a", "b", "c", "d"]}, auto_batch_size=True, batch_dims=1).batch_size
    )


def test_linked_list_writes_back_as_the_reference() -> None:
    ours = TensorDict(a=["foo", "bar", "baz"], batch_size=[3])
    with tensordict.set_list_to_stack(True):
        theirs = tensordict.TensorDict(a=["foo", "bar", "baz"], batch_size=[3])
        for td, cls in ((ours, LinkedList), (theirs, tensordict.utils.LinkedList)):
            values = td["a"]
            assert isinstance(values, cls)
            values[0] = "x"
            values[1:] = ["y", "z"]
            assert td.get("a").tolist() == ["x", "y", "z"]
            values.append("w")  # unlinks
            values[0] = "unlinked"
            assert td.get("a").tolist() == ["x", "y", "z"]
        assert repr(ours["a"]) == repr(theirs["a"]) == "LinkedList(['x', 'y', 'z'])"
    copied = pickle.loads(pickle.dumps(ours["a"]))  # travels as an unlinked copy
    assert isinstance(copied, LinkedList) and copied == ["x", "y", "z"]
    copied[0] = "elsewhere"
    assert ours.get("a").tolist() == ["x", "y", "z"]


def test_where_matches_the_reference() -> None:
    cond = torch.tensor([True, False, True])
    ours = NonTensorStack("a", "b", "c").where(cond, NonTensorStack("x", "y", "z"))
    ref = torch.stack([tensordict.NonTensorData(v) for v in "abc"]).where(
        cond, torch.stack([tensordict.NonTensorData(v) for v in "xyz"]), pad=0
    )
    assert ours.tolist() == ref.tolist() == ["a", "y", "c"]
    out = NonTensorStack("_", "_", "_")
    assert NonTensorStack("a", "b", "c").where(cond, "q", out=out) is out and out.tolist() == ["a", "q", "c"]


# -- new_* and to_lazystack ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["new_zeros", "new_ones", "new_empty"])
def test_new_tensordicts_match_the_reference(name: str) -> None:
    def content(lib: Any) -> Any:
        return lib.TensorDict(x=torch.ones(2, 3), s="q", n={"y": torch.ones(2, 4, dtype=torch.long)}, batch_size=[2])

    ours, theirs = getattr(content(tdshare_lib), name)(4, 5), getattr(content(tensordict), name)(4, 5)
    assert ours.batch_size == theirs.batch_size == (4, 5) and ours["n"].batch_size == theirs["n"].batch_size
    for key in ("x", ("n", "y")):
        assert ours[key].shape == theirs[key].shape and ours[key].dtype == theirs[key].dtype
        if name != "new_empty":
            assert torch.equal(ours[key], theirs[key])
    assert ours["s"] == theirs["s"] == "q"
    full = content(tdshare_lib).new_full((3,), 7)
    assert torch.equal(full["x"], content(tensordict).new_full((3,), 7)["x"])


def test_new_zeros_of_a_lazy_stack_keeps_its_non_tensor_values() -> None:
    ours = TensorDict(a=TensorDict(b=NonTensorStack("a", "b", "c").unsqueeze(-1), batch_size=(3,)), batch_size=(3,))
    theirs = tensordict.TensorDict(
        a=tensordict.TensorDict(
            b=torch.stack([tensordict.NonTensorData(v) for v in "abc"]).unsqueeze(-1), batch_size=(3,)
        ),
        batch_size=(3,),
    )
    lazy_ours, lazy_theirs = ours.to_lazystack(), theirs.to_lazystack()
    assert type(lazy_ours).__name__ == type(lazy_theirs).__name__ == "LazyStackedTensorDict"
    zeros_ours, zeros_theirs = lazy_ours.new_zeros((4,), empty_lazy=True), lazy_theirs.new_zeros((4,), empty_lazy=True)
    assert len(zeros_ours.tensordicts) == len(zeros_theirs.tensordicts) == 4
    mask = torch.tensor([True, True, False, True])
    zeros_ours[mask] = lazy_ours
    zeros_theirs[mask] = lazy_theirs
    assert zeros_ours.get(("a", "b")).tolist() == zeros_theirs.get(("a", "b")).tolist() == [["a"], ["b"], ["a"], ["c"]]


# -- contiguous of lazy stacks and non-tensor values ---------------------------------------------
def _query_stacks(lib: Any) -> tuple[Any, Any]:
    flat = lib.LazyStackedTensorDict(
        *[lib.TensorDict(query=lib.NonTensorData(f"abc{i}"), x=torch.full((2,), float(i))) for i in range(3)]
    )
    nested = lib.LazyStackedTensorDict(
        *[lib.TensorDict(sub=lib.TensorDict(q=lib.NonTensorData(f"s{i}"), y=torch.ones(2))) for i in range(2)]
    )
    return flat, nested


@pytest.mark.parametrize("canonical", [False, True])
def test_contiguous_of_a_lazy_stack_is_dense_and_keeps_non_tensor_values(canonical: bool) -> None:
    (ours, ours_nested), (theirs, theirs_nested) = _query_stacks(tdshare_lib), _query_stacks(tensordict)
    mine, ref = ours.contiguous(canonical=canonical), theirs.contiguous(canonical=canonical)
    assert type(mine) is TensorDict and type(ref) is tensordict.TensorDict
    assert mine.batch_size == ref.batch_size == (3,)
    assert isinstance(mine.get("query"), NonTensorStack) and isinstance(ref.get("query"), tensordict.NonTensorStack)
    assert mine.get("query").tolist() == ref.get("query").tolist() == ["abc0", "abc1", "abc2"]
    assert torch.equal(mine["x"], ref["x"]) and mine["x"].is_contiguous()
    assert [mine[i]["query"] for i in range(3)] == [ref[i]["query"] for i in range(3)]
    assert mine["x"].data_ptr() not in {m["x"].data_ptr() for m in ours.tensordicts}  # a copy, not the members'
    dense, ref_dense = ours_nested.contiguous(canonical=canonical), theirs_nested.contiguous(canonical=canonical)
    assert type(dense["sub"]) is TensorDict and type(ref_dense["sub"]) is tensordict.TensorDict
    assert dense["sub", "q"] == ref_dense["sub", "q"] == ["s0", "s1"]


def test_contiguous_of_a_tensordict_densifies_its_nested_lazy_stacks() -> None:
    def content(lib: Any) -> Any:
        rows = [lib.TensorDict(a=torch.arange(6.0).view(3, 2)[:, :1] + i, batch_size=[3]) for i in range(2)]
        return lib.TensorDict(n=lib.LazyStackedTensorDict(*rows, stack_dim=1), x=torch.zeros(3, 2), batch_size=[3, 2])

    mine, ref = content(tdshare_lib).contiguous(), content(tensordict).contiguous()
    assert type(mine.get("n")) is TensorDict and type(ref.get("n")) is tensordict.TensorDict
    assert mine["n", "a"].shape == ref["n", "a"].shape == (3, 2, 1)
    assert mine["n", "a"].stride() == ref["n", "a"].stride() and torch.equal(mine["n", "a"], ref["n", "a"])


def test_contiguous_of_a_lazy_stack_that_cannot_be_dense_says_why() -> None:
    ls = tdshare_lib.LazyStackedTensorDict(TensorDict(a=torch.zeros(3, 2)), TensorDict(a=torch.zeros(3, 4)))
    with pytest.raises(NotSupportedError, match=r"'a'.*shapes"):
        ls.contiguous()
    ref = tensordict.lazy_stack(
        [tensordict.TensorDict(a=torch.zeros(3, 2)), tensordict.TensorDict(a=torch.zeros(3, 4))]
    )
    with pytest.raises(RuntimeError, match="shapes"):  # the reference refuses too
        ref.contiguous()


def test_contiguous_of_non_tensor_values_matches_the_reference() -> None:
    ours, theirs = NonTensorStack("a", "b"), torch.stack([tensordict.NonTensorData(v) for v in "ab"])
    for canonical in (False, True):
        assert ours.contiguous(canonical=canonical) is ours and theirs.contiguous(canonical=canonical) is theirs
    value = [1, 2]
    for lib in (tdshare_lib, tensordict):
        single = lib.NonTensorData(value, batch_size=[2])
        copy = single.contiguous()
        assert copy is not single and copy.data is value and copy.batch_size == (2,)
        assert single.contiguous(inplace=True) is single
        assert type(lib.MetaData(3).contiguous()) is lib.MetaData


# -- torch.vmap over tensordicts with unbatched entries ------------------------------------------
# ``import tensordict`` patches torch.vmap's internals for its own classes (and anything with
# ``_pass_through``), so tdshare's side runs in a fresh interpreter that never imports it.
_VMAP_CHILD = """
import json, torch, tdshare
from tdshare import TensorDict, UnbatchedTensor

VMAPS = {
    "identity": lambda td: torch.vmap(lambda x: x)(td),
    "in_dims=1": lambda td: torch.vmap(lambda x: x * 2, in_dims=1)(td),
    "out_dims=1": lambda td: torch.vmap(lambda x: x + 1, in_dims=0, out_dims=1)(td),
    "nested": lambda td: torch.vmap(torch.vmap(lambda x: x + 1))(td),
    "new tensordict": lambda td: torch.vmap(lambda x: type(x)(y=x["a"][..., 0], batch_size=[]))(td),
    "returns the entry": lambda td: torch.vmap(lambda x: x["u"])(td),
}
data = torch.arange(77.0).reshape(7, 11)
a = torch.arange(60.0).reshape(4, 3, 5)
out = {}
for how, run in VMAPS.items():
    result = run(TensorDict(a=a, n={"b": a[..., 0]}, u=UnbatchedTensor(data), batch_size=[4, 3]))
    if isinstance(result, torch.Tensor):
        out[how] = {"type": type(result).__name__, "batch": list(result.batch_size), "shape": list(result.shape),
                    "same": result.data_ptr() == data.data_ptr()}
        continue
    row = {"type": type(result).__name__, "batch": list(result.batch_size), "leaves": {}}
    for key in result.keys(True, True):
        if key == "u":
            u = result.get("u")
            row["u"] = [type(u).__name__, list(u.batch_size), u.data_ptr() == data.data_ptr(), u.tolist()]
        else:
            name = "/".join(key) if isinstance(key, tuple) else key
            row["leaves"][name] = [result[key].tolist(), list(result[key[0] if isinstance(key, tuple) else key].shape)]
    out[how] = row
direct = torch.vmap(lambda x: x)(UnbatchedTensor(data, batch_size=[4]))
out["direct"] = [type(direct).__name__, list(direct.batch_size), direct.data_ptr() == data.data_ptr()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tdshare_vmaps() -> dict[str, Any]:
    import json
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", _VMAP_CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


REF_VMAPS = {
    "identity": lambda td: torch.vmap(lambda x: x)(td),
    "in_dims=1": lambda td: torch.vmap(lambda x: x * 2, in_dims=1)(td),
    "out_dims=1": lambda td: torch.vmap(lambda x: x + 1, in_dims=0, out_dims=1)(td),
    "nested": lambda td: torch.vmap(torch.vmap(lambda x: x + 1))(td),
    "new tensordict": lambda td: torch.vmap(lambda x: type(x)(y=x["a"][..., 0], batch_size=[]))(td),
}


@pytest.mark.parametrize("how", sorted(REF_VMAPS))
def test_vmap_returns_tensordicts_with_the_unbatched_entry_whole(how: str, tdshare_vmaps: dict[str, Any]) -> None:
    a, data = torch.arange(60.0).reshape(4, 3, 5), torch.arange(77.0).reshape(7, 11)
    ref = REF_VMAPS[how](
        tensordict.TensorDict(a=a, n={"b": a[..., 0]}, u=tensordict.UnbatchedTensor(data), batch_size=[4, 3])
    )
    mine = tdshare_vmaps[how]
    assert mine["type"] == "TensorDict" and mine["batch"] == list(ref.batch_size)
    expected = {"/".join(k) if isinstance(k, tuple) else k: k for k in ref.keys(True, True) if k != "u"}
    assert sorted(mine["leaves"]) == sorted(expected)
    for name, key in expected.items():
        top = key[0] if isinstance(key, tuple) else key
        assert mine["leaves"][name] == [ref[key].tolist(), list(ref[top].shape)], name
    if "u" in ref.keys():  # kept whole (no vmap alias leaking out), the result's batch size
        theirs = ref.get("u")
        assert mine["u"] == [
            "UnbatchedTensor",
            list(theirs.batch_size),
            theirs.data_ptr() == data.data_ptr(),
            theirs.tolist(),
        ]
        assert mine["u"][2] is (how == "identity")  # the same memory unless fn computed on it


def test_vmap_can_return_the_unbatched_entry(tdshare_vmaps: dict[str, Any]) -> None:
    data = torch.randn(7, 11)
    a = torch.arange(60.0).reshape(4, 3, 5)
    ref = torch.vmap(lambda x: x["u"])(
        tensordict.TensorDict(a=a, u=tensordict.UnbatchedTensor(data), batch_size=[4, 3])
    )
    assert isinstance(ref, tensordict.UnbatchedTensor) and ref.data_ptr() == data.data_ptr()
    mine = tdshare_vmaps["returns the entry"]
    assert mine == {"type": "UnbatchedTensor", "batch": list(ref.batch_size), "shape": list(ref.shape), "same": True}
    assert mine["batch"] == [4, 3] and mine["shape"] == [7, 11]
    assert tdshare_vmaps["direct"] == ["UnbatchedTensor", [4], True]  # an unbatched input on its own


ARITHMETIC = {
    "times itself": lambda td: td * td,
    "minus a number": lambda td: td - 1,
    "times a number": lambda td: td * 2,
    "mul_ in place": lambda td: td.mul_(2),
    "add_ itself in place": lambda td: td.add_(td),
}


@pytest.mark.parametrize("how", sorted(ARITHMETIC))
def test_arithmetic_applies_to_the_unbatched_tensor(how: str) -> None:
    mine_data, ref_data = torch.arange(3.0), torch.arange(3.0)
    ours = TensorDict(a=torch.ones(4, 3), u=UnbatchedTensor(mine_data), batch_size=[4, 3])
    theirs = tensordict.TensorDict(a=torch.ones(4, 3), u=tensordict.UnbatchedTensor(ref_data), batch_size=[4, 3])
    mine, ref = ARITHMETIC[how](ours), ARITHMETIC[how](theirs)
    assert isinstance(mine.get("u"), UnbatchedTensor) and mine.get("u").batch_size == ref.get("u").batch_size
    assert mine.get("u").tolist() == ref.get("u").tolist() and torch.equal(mine["a"], ref["a"])
    assert mine_data.tolist() == ref_data.tolist()  # written in place by the in-place operations only
    assert (mine is ours) == (ref is theirs)


# -- masked_select -------------------------------------------------------------------------------
def _masked_content(lib: Any) -> Any:
    return lib.TensorDict(
        x=torch.arange(6.0).view(2, 3),
        s="txt",
        st=torch.stack([torch.stack([lib.NonTensorData(c) for c in row]) for row in ("abc", "def")]),
        n={"y": torch.arange(12.0).view(2, 3, 2)},
        batch_size=[2, 3],
        names=["p", "q"],
    )


@pytest.mark.parametrize("mask", [[[True, False, True], [False, True, False]], [True, False], [[False] * 3] * 2])
def test_masked_select_matches_the_reference(mask: list) -> None:
    m = torch.tensor(mask)
    mine, ref = _masked_content(tdshare_lib).masked_select(m), _masked_content(tensordict).masked_select(m)
    assert type(mine) is TensorDict and mine.batch_size == ref.batch_size and mine.names == ref.names
    for key in ("x", ("n", "y")):
        assert torch.equal(mine[key], ref[key])
    assert mine["n"].batch_size == ref["n"].batch_size
    assert mine["s"] == ref["s"] == "txt"
    if ref.batch_size.numel():
        assert mine.get("st").tolist() == ref.get("st").tolist()
    source = _masked_content(tdshare_lib)
    assert mine["x"].data_ptr() != source["x"].data_ptr()  # a copy


@pytest.mark.parametrize("kind", KINDS)
def test_masked_select_in_every_kind(kind: str) -> None:
    c = build(kind)
    mask = torch.tensor([True, False, True, True])
    out = c.masked_select(mask)
    assert out.batch_size == (3,) and out["a"].tolist() == [0.0, 2.0, 3.0] and out["s"] == "text"
    assert out["n", "b"].shape == (3, 2)
    ref = tensordict.TensorDict(a=torch.arange(4.0), n={"b": torch.zeros(4, 2)}, s="text", batch_size=[4])
    assert out["a"].tolist() == ref.masked_select(mask)["a"].tolist()
    if kind == "lazy":
        assert type(out) is TensorDict  # a dense copy, as the reference gives
        with pytest.raises(NotSupportedError, match="to_tensordict"):
            c.masked_select(mask, inplace=True)
    else:
        nested = c["n"]
        assert c.masked_select(mask, inplace=True) is c and c.batch_size == (3,) and c["n"] is nested
        assert c["a"].tolist() == [0.0, 2.0, 3.0] and nested.batch_size == (3,)


def test_masked_select_refuses_bad_masks_and_locked_targets() -> None:
    td = _masked_content(tdshare_lib)
    with pytest.raises(tdshare_lib.ArgumentTypeError, match=r"bool tensor.*int64"):
        td.masked_select(torch.tensor([1, 0]))
    with pytest.raises(tdshare_lib.BatchSizeError, match=r"shape \[3\].*\[2, 3\]"):
        td.masked_select(torch.tensor([True, False, True]))
    with pytest.raises(LockedError, match="unlock"):
        td.lock_().masked_select(torch.tensor([True, False]), inplace=True)
    assert td.batch_size == (2, 3)


# -- updates of the parts of a stack, maybe_to_stack, update_at_ -----------------------------------
def _grid(lib: Any) -> Any:
    row = torch.stack([lib.NonTensorData(0), lib.NonTensorData(1)])
    return torch.stack([row] * 3).clone()


@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize("part", ["element", "row"])
def test_updating_a_part_of_a_stack_writes_back_as_the_reference(part: str, inplace: bool) -> None:
    ours, theirs = _grid(tdshare_lib), _grid(tensordict)
    index = (0, 1) if part == "element" else 1
    ours[index].update(NonTensorData(5), inplace=inplace)
    theirs[index].update(tensordict.NonTensorData(5), inplace=inplace)
    assert ours.tolist() == theirs.tolist() != [[0, 1]] * 3


@pytest.mark.parametrize("part", ["element", "row"])
def test_updating_a_part_of_a_memory_mapped_stack_rewrites_its_folder(part: str, tmp_path: Any) -> None:
    ours, theirs = _grid(tdshare_lib), _grid(tensordict)
    ours.memmap_(tmp_path / "ours")
    theirs.memmap_(tmp_path / "theirs")
    index = (0, 1) if part == "element" else 1
    with pytest.raises(RuntimeError, match="update the NonTensorStack"):  # the reference refuses
        theirs[index].update(tensordict.NonTensorData(5), inplace=True)
    ours[index].update(NonTensorData(5), inplace=True)  # tdshare writes it through to the stack
    expected = [[0, 5], [0, 1], [0, 1]] if part == "element" else [[0, 1], [5, 5], [0, 1]]
    assert ours.tolist() == expected
    assert TensorDict.load_memmap(tmp_path / "ours").tolist() == expected
    assert tensordict.TensorDict.load_memmap(tmp_path / "ours").tolist() == expected  # the reference reads it


def test_maybe_to_stack_and_update_at_match_the_reference(tmp_path: Any) -> None:
    for lib in (tdshare_lib, tensordict):
        single = lib.NonTensorData("a", batch_size=[2, 1])
        stack = single.maybe_to_stack()
        assert type(stack) is lib.NonTensorStack and stack.tolist() == [["a"], ["a"]]
        assert lib.NonTensorData("b").maybe_to_stack().data == "b"
        grid = _grid(lib)
        again = grid.maybe_to_stack()
        assert again is not grid and again.tolist() == grid.tolist()
        target = lib.NonTensorData(1, batch_size=grid.batch_size).maybe_to_stack()
        assert target.update(grid, inplace=True, non_blocking=False).tolist() == grid.tolist()
        assert grid.update_at_(lib.NonTensorData(9), (0, 1)) is grid and grid.tolist() == [[0, 9], [0, 1], [0, 1]]
        assert single.update_at_(lib.NonTensorData("c"), ()).data == "c"
        with pytest.raises(RuntimeError, match="part"):
            single.update_at_(lib.NonTensorData("d"), 0)
    with pytest.raises(ValueError, match=r"NonTensorStack.*maybe_to_stack\(\)"):
        NonTensorData(1).update(_grid(tdshare_lib), inplace=True)
    mapped = _grid(tdshare_lib).memmap(tmp_path / "g")
    mapped.update_at_(NonTensorData(7), (2, 0))
    assert TensorDict.load_memmap(tmp_path / "g").tolist() == [[0, 1], [0, 1], [7, 1]]


def test_contiguous_of_a_lazy_stack_keeps_the_stack_dims_name() -> None:
    """A documented difference: the reference's dense copy loses the stack dim's name unless the
    members are named; tdshare's keeps it, as its to_tensordict() does."""
    ours = tdshare_lib.LazyStackedTensorDict(*[TensorDict(a=torch.zeros(3), batch_size=[3])] * 2, stack_dim_name="s")
    theirs = tensordict.lazy_stack([tensordict.TensorDict(a=torch.zeros(3), batch_size=[3])] * 2, stack_dim_name="s")
    assert ours.contiguous().names == ours.to_tensordict().names == ["s", None]
    assert theirs.contiguous().names == [None, None]
    named = [TensorDict(a=torch.zeros(3), batch_size=[3], names=["x"])] * 2
    ref_named = [tensordict.TensorDict(a=torch.zeros(3), batch_size=[3], names=["x"])] * 2
    assert (
        tdshare_lib.LazyStackedTensorDict(*named, stack_dim_name="s").contiguous().names
        == tensordict.lazy_stack(ref_named, stack_dim_name="s").contiguous().names
        == ["s", "x"]
    )


def test_refresh_refuses_a_changed_pickle_and_keeps_an_unchanged_one(tmp_path: Any) -> None:
    """memmap_refresh_(allow_pickle=False) never unpickles: a pickled value that another writer
    changed is refused (the file named), one that did not change is kept as read before (the
    reference re-reads, so refuses both; tdshare reads only what changed)."""
    td = TensorDict(t=torch.zeros(1), v=NonTensorData({1, 2}), batch_size=[]).memmap_(tmp_path / "td")
    other = TensorDict.load_memmap(tmp_path / "td", allow_pickle=True)
    other.memmap_()  # attached to the same folder (writes nothing)
    assert other.memmap_refresh_(allow_pickle=False)["v"] == {1, 2}
    td.set_("v", {3})
    with pytest.raises(PickleRefusedError, match=r"other\.pickle.*allow_pickle=True") as info:
        other.memmap_refresh_(allow_pickle=False)
    assert isinstance(info.value, RuntimeError) and other["v"] == {1, 2}
    assert other.memmap_refresh_(allow_pickle=True)["v"] == {3}
    ref = tensordict.TensorDict(t=torch.zeros(1), v=tensordict.NonTensorData({1, 2}), batch_size=[])
    ref.memmap_(tmp_path / "ref")
    with pytest.raises(RuntimeError, match="allow_pickle=True"):  # the reference refuses an unchanged one too
        ref.memmap_refresh_(allow_pickle=False)


# -- tensorclass fields: `data`, tensor_only mappings, TensorDict[...] annotations -----------------
@tdshare_lib.tensorclass(tensor_only=True)
class _Holder:
    data: TensorDict  # a field named like the member, as NonTensorData's own field


@tensordict.tensorclass(tensor_only=True)
class _RefHolder:
    data: tensordict.TensorDict


@tdshare_lib.tensorclass(tensor_only=True)
class _Generic:
    a: torch.Tensor
    b: TensorDict[str, torch.Tensor]
    c: TensorDict[str, torch.Tensor] | None = None


@tensordict.tensorclass(tensor_only=True)
class _RefGeneric:
    a: torch.Tensor
    b: tensordict.TensorDict[str, torch.Tensor]
    c: tensordict.TensorDict[str, torch.Tensor] | None = None


def _mapping_classes(lib: Any) -> tuple[Any, Any]:
    return (_Holder, _Generic) if lib is tdshare_lib else (_RefHolder, _RefGeneric)


@pytest.mark.parametrize("mapping", [dict, UserDict])
def test_tensor_only_mapping_fields_become_tensordicts_as_the_reference(mapping: Any) -> None:
    for lib in (tdshare_lib, tensordict):
        holder, generic = _mapping_classes(lib)
        locked = lib.TensorDict({"tensor": torch.ones(())}).lock_()
        tc = holder(
            data=mapping({"tensor": torch.ones(()), "nested": mapping({"deep": torch.zeros(())}), "kept": locked})
        )
        assert type(tc.data) is lib.TensorDict and tc.data["tensor"] == 1
        assert type(tc.data["nested"]) is lib.TensorDict and tc.data["nested", "deep"] == 0
        assert tc.data["kept"] is locked and tc.data["kept"].is_locked  # a tensordict in it is kept as it is
        tc.data = mapping({"tensor": torch.zeros(())})
        assert type(tc.data) is lib.TensorDict and tc.data["tensor"] == 0
        tc.set("data", locked)
        assert tc.data is locked
        both = generic(a=torch.zeros(()), b=mapping({"t": torch.ones(())}), c=mapping({"t": torch.zeros(())}))
        assert type(both.b) is type(both.c) is lib.TensorDict and both.c["t"] == 0


def test_a_field_named_data_needs_no_shadow() -> None:
    for lib in (tdshare_lib, tensordict):

        @lib.tensorclass
        class Frame:
            data: torch.Tensor
            fields: str

        frame = Frame(data=torch.arange(3.0), fields="x", batch_size=[3])
        assert frame.data.tolist() == [0.0, 1.0, 2.0] and frame[1].data.item() == 1.0 and frame.fields == "x"
    with pytest.raises(tdshare_lib.ReservedFieldError, match="Attribute name apply can't"):

        @tdshare_lib.tensorclass
        class Bad:
            apply: torch.Tensor
