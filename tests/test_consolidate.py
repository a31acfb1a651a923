"""consolidate: one flat storage plus the reference's schema, files, pickling, staleness, transfer parts."""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from _kinds import KINDS, Sample, build

import tdshare
from tdshare import LazyStackedTensorDict, TensorDict

CONTEXTS = ["spawn", "fork", "forkserver"]
TIMEOUT = 60


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every stored tensor (a lazy stack's members' own, not stacked copies)."""
    if isinstance(obj, LazyStackedTensorDict):
        return [t for member in obj.tensordicts for t in _tensors(member)]
    td = obj._tensordict if tdshare.is_tensorclass(obj) else obj
    return [v for _, v in td.items(include_nested=True, leaves_only=True) if isinstance(v, torch.Tensor)]


def _mixed() -> dict[str, Any]:
    """Leaves of several dtypes and sizes (so that padding shows), nested, and a string."""
    return {
        "a": torch.arange(3, dtype=torch.float32),
        "b": {"c": torch.ones(3, 2, dtype=torch.float16), "d": torch.tensor([True, False, True])},
        "e": torch.arange(6, dtype=torch.float64).reshape(3, 2),
        "s": "a string",
    }


def _reference_metadata(meta: Any) -> Any:
    """The reference's in-memory metadata in JSON form (tuples as lists)."""
    return json.loads(json.dumps(meta))


# -- the storage and the schema ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_every_leaf_views_one_storage(kind: str) -> None:
    obj = build(kind)
    c = obj.consolidate()
    assert type(c) is type(obj) and c.is_consolidated() and c.is_locked
    pointers = {t.untyped_storage().data_ptr() for t in _tensors(c)}
    assert len(pointers) == 1
    storage = (c._tensordict if kind == "tensorclass" else c)._consolidated["storage"]
    assert storage.dtype == torch.uint8 and storage.dim() == 1
    assert (c == obj).all() and c.get("s") == "text"
    storage.zero_()  # the leaves are views: writes into the storage show in them
    assert all((t == 0).all() for t in _tensors(c))
    assert not all((t == 0).all() for t in _tensors(obj))  # the source is untouched


def test_schema_and_bytes_equal_the_reference() -> None:
    ours = TensorDict(_mixed(), batch_size=[3], names=["t"]).consolidate()
    theirs = tensordict.TensorDict(_mixed(), batch_size=[3], names=["t"]).consolidate()
    assert ours._consolidated["metadata"] == _reference_metadata(theirs._consolidated["metadata"])
    assert torch.equal(ours._consolidated["storage"], theirs._consolidated["storage"])
    assert ours._consolidated["metadata"]["leaves"]["a"] == ["torch.float32", [3], 0, 16, 4]  # 12 bytes + 4 pad


def test_lazy_stack_and_tensorclass_schema_equal_the_reference() -> None:
    members = [{"x": torch.zeros(2)}, {"x": torch.ones(2), "y": torch.arange(3)}]
    ours = LazyStackedTensorDict(*[TensorDict(m, batch_size=[]) for m in members]).consolidate()
    theirs = tensordict.LazyStackedTensorDict(*[tensordict.TensorDict(m, batch_size=[]) for m in members]).consolidate()
    assert type(ours) is LazyStackedTensorDict
    assert ours._consolidated["metadata"] == _reference_metadata(theirs._consolidated["metadata"])
    assert torch.equal(ours._consolidated["storage"], theirs._consolidated["storage"])
    assert ours.tensordicts[1]["y"].tolist() == [0, 1, 2]

    inner = TensorDict(sample=build("tensorclass"), batch_size=[4]).consolidate()
    schema = inner._consolidated["metadata"]
    assert schema["sample"]["cls"] == str(Sample) and schema["sample"]["non_tensors"]["s"] == ["text", [4], None]
    assert type(inner["sample"]) is Sample and inner["sample"].n["b"].shape == (4, 2)


def test_non_tensor_stack_entry_matches_the_reference() -> None:
    ours = TensorDict(a=torch.zeros(2), s=tdshare.NonTensorStack("x", "y"), batch_size=[2]).consolidate()
    theirs = tensordict.TensorDict(a=torch.zeros(2), s=tensordict.NonTensorStack("x", "y"), batch_size=[2])
    assert ours._consolidated["metadata"] == _reference_metadata(theirs.consolidate()._consolidated["metadata"])
    back = pickle.loads(pickle.dumps(ours))
    assert back["s"] == ["x", "y"] and isinstance(back.get_non_tensor("s"), list)


def test_non_contiguous_and_grad_leaves() -> None:
    base = torch.arange(24, dtype=torch.float32, requires_grad=True)
    td = TensorDict(
        t=base.reshape(2, 3, 4).transpose(0, 1),
        s=torch.arange(48).reshape(3, 4, 4)[..., ::2],
        one=torch.zeros(3, 1, 5)[:, :, :1],
        batch_size=[3],
    )
    c = td.consolidate()
    for key in ("t", "s", "one"):
        assert torch.equal(c[key], td[key].detach()) and c[key].shape == td[key].shape
    assert not c["t"].requires_grad


def test_jagged_leaf() -> None:
    njt = torch.nested.nested_tensor([torch.zeros(1, 3), torch.ones(2, 3)], layout=torch.jagged)
    c = TensorDict(j=njt, x=torch.arange(2), batch_size=[2]).consolidate()
    assert c["j"].is_nested and [p.tolist() for p in c["j"].unbind()] == [p.tolist() for p in njt.unbind()]
    leaves = c._consolidated["metadata"]["leaves"]
    assert set(leaves) == {"<NJT_VALUES>j", "<NJT_OFFSETS>j", "x"} and leaves["<NJT_OFFSETS>j"][5] == 1
    back = pickle.loads(pickle.dumps(c))
    assert [p.tolist() for p in back["j"].unbind()] == [p.tolist() for p in njt.unbind()]
    c._consolidated["storage"].zero_()
    assert (c["j"].values() == 0).all()


# -- options ---------------------------------------------------------------------------------------
def test_threads_give_the_same_bytes_and_return_early_a_future() -> None:
    dtypes = [torch.float32, torch.float16, torch.uint8, torch.float64]
    td = TensorDict({f"k{i}": torch.full((i % 7 + 1,), i, dtype=dtypes[i % 4]) for i in range(50)}, batch_size=[])
    one = td.consolidate()
    four = td.consolidate(num_threads=4)
    assert torch.equal(one._consolidated["storage"], four._consolidated["storage"]) and (four == td).all()
    future = td.consolidate(num_threads=4, return_early=True)
    assert isinstance(future, tdshare.TensorDictFuture)
    done = future.result()
    assert done.is_consolidated() and torch.equal(done._consolidated["storage"], one._consolidated["storage"])


def test_inplace_keeps_the_tensordict() -> None:
    td = TensorDict(_mixed(), batch_size=[3])
    nested = td["b"]
    out = td.consolidate(inplace=True)
    assert out is td and td["b"] is nested and td.is_consolidated() and td.is_locked
    assert len({t.untyped_storage().data_ptr() for t in _tensors(td)}) == 1
    assert td["s"] == "a string"


def test_share_memory_and_already_consolidated() -> None:
    c = TensorDict(_mixed(), batch_size=[3]).consolidate(share_memory=True)
    assert c._consolidated["storage"].is_shared() and c["a"].is_shared()
    assert c.consolidate() is c


@pytest.mark.parametrize("use_buffer", [False, True])
def test_file_goes_both_ways_with_the_reference(tmp_path: Path, use_buffer: bool) -> None:
    path = tmp_path / "ours.bin"
    c = TensorDict(_mixed(), batch_size=[3]).consolidate(filename=path, use_buffer=use_buffer)
    assert c.device == torch.device("cpu")
    theirs = tensordict.TensorDict.from_consolidated(path)
    assert theirs["b", "c"].dtype == torch.float16 and theirs["e"].tolist() == c["e"].tolist()
    assert theirs["s"] == "a string" and (theirs["a"] == c["a"]).all()
    c["a"][0] = 42.0  # the leaves map the file (unless a buffer was used)
    assert tdshare.from_consolidated(path)["a"][0].item() == (0.0 if use_buffer else 42.0)

    ref_path = tmp_path / "theirs.bin"
    tensordict.TensorDict(_mixed(), batch_size=[3]).consolidate(filename=ref_path)
    ours = TensorDict.from_consolidated(ref_path)
    assert type(ours) is TensorDict and ours.is_consolidated() and not ours.is_locked
    assert (ours == TensorDict(_mixed(), batch_size=[3])).all() and ours["s"] == "a string"
    ours["a"][0] = 7.0  # copy-on-write: the file keeps its bytes
    assert TensorDict.from_consolidated(ref_path)["a"][0].item() == 0.0


def test_file_is_replaced_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "td.bin"
    first = TensorDict(a=torch.zeros(4), batch_size=[4]).consolidate(filename=path)
    TensorDict(a=torch.ones(2), batch_size=[2]).consolidate(filename=path)
    assert first["a"].tolist() == [0.0] * 4  # the old mapping keeps its bytes
    assert TensorDict.from_consolidated(path)["a"].tolist() == [1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["td.bin"]


# -- pickling ------------------------------------------------------------------------------------
def test_pickle_sends_one_buffer_and_the_schema() -> None:
    groups = {f"g{i}": {f"x{j}": torch.full((4,), float(j)) for j in range(10)} for i in range(100)}
    td = TensorDict(groups, batch_size=[4])
    c = td.consolidate()
    data = pickle.dumps(c)
    assert len(data) < len(pickle.dumps(td)) / 2  # 1,000 leaves: one buffer instead of 1,000 tensors
    back = pickle.loads(data)
    assert back.is_consolidated() and (back == td).all()
    assert len({t.untyped_storage().data_ptr() for t in _tensors(back)}) == 1
    reference = tensordict.TensorDict(td.to_dict(), batch_size=[4]).consolidate()
    assert len(data) < 2 * len(pickle.dumps(reference))


@pytest.mark.parametrize("kind", KINDS)
def test_pickle_round_trip_of_every_kind(kind: str) -> None:
    c = build(kind).consolidate()
    back = pickle.loads(pickle.dumps(c))
    assert type(back) is type(c) and (back == build(kind)).all() and back.is_consolidated()


def _child_writes(q: Any, done: Any) -> None:
    td = q.get(timeout=TIMEOUT)
    td["a"][0] = 99.0  # a view of the shared storage
    done.put((td.is_consolidated(), td["s"], len({t.untyped_storage().data_ptr() for t in _tensors(td)})))


@pytest.mark.parametrize("context", CONTEXTS)
def test_shared_storage_crosses_processes(context: str) -> None:
    ctx = mp.get_context(context)
    c = TensorDict(_mixed(), batch_size=[3]).consolidate(share_memory=True)
    q, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_child_writes, args=(q, done))
    proc.start()
    try:
        q.put(c)
        consolidated, text, storages = done.get(timeout=TIMEOUT)
    finally:
        proc.join(TIMEOUT)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0 and consolidated and text == "a string" and storages == 1
    assert c["a"][0].item() == 99.0


@pytest.mark.parametrize("context", CONTEXTS)
def test_file_backed_storage_crosses_processes_as_the_file(context: str, tmp_path: Path) -> None:
    ctx = mp.get_context(context)
    path = tmp_path / "td.bin"
    c = TensorDict(_mixed(), batch_size=[3]).consolidate(filename=path)
    q, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_child_writes, args=(q, done))
    proc.start()
    try:
        q.put(c)
        consolidated, text, storages = done.get(timeout=TIMEOUT)
    finally:
        proc.join(TIMEOUT)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0 and consolidated and text == "a string" and storages == 1
    assert c["a"][0].item() == 99.0 and TensorDict.from_consolidated(path)["a"][0].item() == 99.0


def test_file_backed_pickle_is_a_handle(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    c = TensorDict(x=torch.zeros(1 << 20), batch_size=[]).consolidate(filename=path)  # 4 MiB
    data = pickle.dumps(c)
    assert len(data) < 2_000  # the path, the file's identity and the schema: no bytes
    back = pickle.loads(data)
    back["x"][3] = 1.0  # the same file, mapped shared
    assert c["x"][3].item() == 1.0 and back.is_consolidated()
    TensorDict(x=torch.ones(2), batch_size=[]).consolidate(filename=path)  # the file is replaced
    with pytest.raises(tdshare.CorruptDataError, match="replaced"):
        pickle.loads(data)


# -- staleness -----------------------------------------------------------------------------------
def test_in_place_tensor_writes_keep_it_consolidated() -> None:
    c = TensorDict(_mixed(), batch_size=[3]).consolidate()
    c["a"][1] = 5.0
    c.set_("e", torch.zeros(3, 2, dtype=torch.float64))
    assert c.is_consolidated() and pickle.loads(pickle.dumps(c))["a"][1].item() == 5.0


@pytest.mark.parametrize("change", ["unlock", "add", "non_tensor", "memmap", "batch_size"])
def test_changes_make_it_stale(change: str, tmp_path: Path) -> None:
    c = TensorDict(_mixed(), batch_size=[3]).consolidate()
    if change == "unlock":
        c.unlock_()
    elif change == "add":
        with c.unlock_():
            c["new"] = torch.zeros(3)
    elif change == "non_tensor":
        c.set_("s", "other")
    elif change == "memmap":
        c.memmap_(tmp_path / "m")
    else:
        c.batch_size = []
    assert not c.is_consolidated()
    back = pickle.loads(pickle.dumps(c))  # a stale one pickles entry by entry, with its current content
    assert not back.is_consolidated() and (back == c).all()
    if change == "non_tensor":
        assert back["s"] == "other"
    if change == "unlock":
        c.lock_()
        assert not c.is_consolidated()  # stale for good


# -- transfer parts ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_parts_rebuild_the_same_tree(kind: str) -> None:
    obj = build(kind)
    buffer, schema = tdshare.consolidated_parts(obj)
    assert buffer.dtype == torch.uint8 and json.loads(json.dumps(schema)) == schema  # what a transport can send
    received = buffer.clone()  # e.g. torch.distributed.recv into a fresh buffer
    back = tdshare.from_consolidated_parts(received, schema)
    if kind == "tensorclass":
        assert type(back) is TensorDict and (Sample._from_tensordict(back) == obj).all()
    else:
        assert type(back) is type(obj) and (back == obj).all()
    assert back.is_consolidated()
    received.zero_()
    assert all((t == 0).all() for t in _tensors(back))


# -- errors ---------------------------------------------------------------------------------------
def test_errors_name_the_problem(tmp_path: Path) -> None:
    td = TensorDict(_mixed(), batch_size=[3])
    with pytest.raises(NotImplementedError, match="use_buffer"):
        td.consolidate(filename=tmp_path / "x", num_threads=4, return_early=True, use_buffer=True)
    with pytest.raises(NotImplementedError, match="non_blocking"):
        td.consolidate(num_threads=4, return_early=True, non_blocking=True)
    with pytest.raises(RuntimeError, match="mutually exclusive"):
        td.consolidate(filename=tmp_path / "y", device="meta")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(tdshare.NotSupportedError, match=r"'nt'.*layout=torch.jagged"):
        TensorDict(nt=strided, batch_size=[2]).consolidate()
    with pytest.raises(tdshare.InvalidArgumentError, match=r"'leaves'.*rename"):
        TensorDict(leaves={"x": torch.zeros(1)}, batch_size=[1]).consolidate()
    with pytest.raises(tdshare.InvalidArgumentError, match="JSON"):
        TensorDict(p=object(), batch_size=[]).consolidate(filename=tmp_path / "z")
    with pytest.raises(tdshare.InvalidArgumentError, match="uint8"):
        tdshare.from_consolidated_parts(torch.zeros(3), {})


def test_corrupt_files_raise(tmp_path: Path) -> None:
    short = tmp_path / "short.bin"
    short.write_bytes(b"abc")
    with pytest.raises(tdshare.CorruptDataError, match=r"short\.bin"):
        TensorDict.from_consolidated(short)
    path = tmp_path / "td.bin"
    TensorDict(a=torch.zeros(4), batch_size=[4]).consolidate(filename=path)
    raw = bytearray(path.read_bytes())
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(raw[:-9]) + b"!" + bytes(raw[-8:]))  # the JSON broken
    with pytest.raises(tdshare.CorruptDataError, match="JSON"):
        TensorDict.from_consolidated(bad)
    _, schema = tdshare.consolidated_parts(TensorDict(a=torch.zeros(4), batch_size=[4]))
    with pytest.raises(tdshare.CorruptDataError, match="'a'"):
        tdshare.from_consolidated_parts(torch.zeros(4, dtype=torch.uint8), schema)  # 16 bytes needed
    schema = json.loads(json.dumps(schema))
    schema["x"] = dict(schema, cls="<class 'nowhere.Missing'>")
    with pytest.raises(tdshare.UnsupportedFormatError, match=r"nowhere\.Missing"):
        tdshare.from_consolidated_parts(torch.zeros(16, dtype=torch.uint8), schema)


def test_lazy_stack_file_goes_both_ways(tmp_path: Path) -> None:
    members = [{"x": torch.zeros(2)}, {"x": torch.ones(2), "y": torch.arange(3)}]
    LazyStackedTensorDict(*[TensorDict(m) for m in members]).consolidate(filename=tmp_path / "ours.bin")
    theirs = tensordict.TensorDict.from_consolidated(tmp_path / "ours.bin")
    assert isinstance(theirs, tensordict.LazyStackedTensorDict) and theirs.tensordicts[1]["y"].tolist() == [0, 1, 2]
    ref = tensordict.LazyStackedTensorDict(*[tensordict.TensorDict(m) for m in members])
    ref.consolidate(filename=tmp_path / "theirs.bin")
    ours = TensorDict.from_consolidated(tmp_path / "theirs.bin")
    assert type(ours) is LazyStackedTensorDict and ours.is_consolidated()
    assert ours.tensordicts[1]["y"].tolist() == [0, 1, 2] and "y" not in ours.tensordicts[0]


def test_pin_memory_storage_as_the_reference() -> None:
    td = TensorDict(a=torch.zeros(2), batch_size=[2])
    if torch.accelerator.is_available():
        assert td.consolidate(pin_memory=True)._consolidated["storage"].is_pinned()
    else:  # no pinned memory without an accelerator: torch's RuntimeError, as in the reference
        with pytest.raises(RuntimeError):
            tensordict.TensorDict(a=torch.zeros(2), batch_size=[2]).consolidate(pin_memory=True)
        with pytest.raises(RuntimeError):
            td.consolidate(pin_memory=True)
