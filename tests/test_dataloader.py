"""torch's DataLoader over tdshare collections: __getitems__, the default collate, pin_memory, workers."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from _kinds import KINDS, Sample, build
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate

import tdshare
from tdshare import LazyStackedTensorDict, TensorDict

CONTEXTS = ["spawn", "fork", "forkserver"]
TIMEOUT = 60


def _rows(n: int = 10) -> dict[str, Any]:
    return {"x": torch.arange(n), "y": {"z": torch.arange(2.0 * n).reshape(n, 2)}, "s": "text"}


def _source(kind: str, tmp_path: Path) -> Any:
    """A memory-mapped collection of 10 rows: ``x`` = row number, ``("y", "z")`` = 2 floats per row."""
    if kind == "folder":
        return TensorDict(_rows(), batch_size=[10]).memmap_(tmp_path / "td")
    if kind == "anonymous":
        return TensorDict(_rows(), batch_size=[10]).memmap_()
    if kind == "tensorclass":
        rows = _rows()
        tc = Sample(a=rows["x"].float(), n=TensorDict(b=rows["y"]["z"], batch_size=[10]), s="text", batch_size=[10])
        return tc.memmap_(tmp_path / "tc")
    members = [TensorDict({"x": torch.tensor(i), "y": {"z": torch.tensor([2.0 * i, 2.0 * i + 1])}}) for i in range(10)]
    return LazyStackedTensorDict(*members).memmap_(tmp_path / "ls")


def _flat(lists: Any) -> list[Any]:
    return [x for part in lists for x in part]


def _x(batch: Any) -> list[float]:
    return (batch.a if tdshare.is_tensorclass(batch) else batch["x"]).tolist()


# -- __getitems__ and the fetch ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_getitems_is_one_batched_index(kind: str) -> None:
    obj = build(kind)
    batch = obj.__getitems__([3, 0, 2])
    assert type(batch) is type(obj) and batch.batch_size == (3,)
    assert (batch == obj[torch.tensor([3, 0, 2])]).all()
    ref = tensordict.TensorDict({"a": torch.arange(4.0), "n": {"b": torch.zeros(4, 2)}}, batch_size=[4])
    assert batch.get("a").tolist() == ref.__getitems__([3, 0, 2])["a"].tolist()


def test_dataloader_calls_getitems_once_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[int]] = []
    original = TensorDict.__getitems__

    def counting(self: Any, indices: Any) -> Any:
        calls.append(list(indices))
        return original(self, indices)

    monkeypatch.setattr(TensorDict, "__getitems__", counting)
    td = TensorDict(_rows(), batch_size=[10])
    batches = list(DataLoader(td, batch_size=4))
    assert calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [type(b) for b in batches] == [TensorDict] * 3 and batches[2]["y", "z"].tolist() == [[16, 17], [18, 19]]


@pytest.mark.parametrize("kind", KINDS)
def test_batches_equal_the_reference(kind: str) -> None:
    obj = build(kind)
    ref = tensordict.TensorDict({"a": torch.arange(4.0), "n": {"b": torch.zeros(4, 2)}, "s": "text"}, batch_size=[4])
    ours = list(DataLoader(obj, batch_size=3))
    theirs = list(DataLoader(ref, batch_size=3))
    assert [type(b) for b in ours] == [type(obj)] * 2
    assert [b.batch_size for b in ours] == [b.batch_size for b in theirs]
    for mine, their in zip(ours, theirs, strict=True):
        assert mine.get("a").tolist() == their["a"].tolist()
        assert mine.get(("n", "b")).tolist() == their["n", "b"].tolist()
        assert mine.get("s") == "text"


def test_batch_sampler_and_no_batch_size() -> None:
    td = TensorDict(_rows(), batch_size=[10])
    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=True)
    assert [b["x"].tolist() for b in DataLoader(td, batch_sampler=sampler)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    generator = torch.Generator().manual_seed(0)
    shuffled = [b["x"].tolist() for b in DataLoader(td, batch_size=4, shuffle=True, generator=generator)]
    assert sorted(_flat(shuffled)) == list(range(10)) and shuffled != [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    random = BatchSampler(RandomSampler(range(10), generator=torch.Generator().manual_seed(1)), 5, False)
    assert sorted(_flat(b["x"].tolist() for b in DataLoader(td, batch_sampler=random))) == list(range(10))
    # no auto-collation: one row per item; torch's default_convert iterates a Mapping's keys, which a
    # tensordict (a Mapping, as the reference's) does not do, so such a loader passes rows on as they are
    rows = list(DataLoader(td, batch_size=None, collate_fn=lambda row: row))
    assert len(rows) == 10 and rows[3].batch_size == () and rows[3]["x"].item() == 3


# -- the default collate -------------------------------------------------------------------------
def test_default_collate_stacks_a_list_of_tensordicts() -> None:
    items = [TensorDict({"x": torch.tensor(i), "y": {"z": torch.ones(2) * i}}) for i in range(3)]
    out = default_collate(items)
    ref_items = [tensordict.TensorDict({"x": torch.tensor(i), "y": {"z": torch.ones(2) * i}}) for i in range(3)]
    ref = default_collate(ref_items)
    assert type(out) is TensorDict and out.batch_size == ref.batch_size == (3,)
    assert out["y", "z"].tolist() == ref["y", "z"].tolist() and out["x"].tolist() == [0, 1, 2]
    batched = TensorDict(x=torch.arange(3), batch_size=[3])
    assert default_collate(batched) is batched  # a fetched batch passes through
    through = list(DataLoader(items, batch_size=2))  # a dataset whose items are single tensordicts
    assert [b["x"].tolist() for b in through] == [[0, 1], [2]]


def test_default_collate_of_other_kinds() -> None:
    tcs = [build("tensorclass", offset=i)[0] for i in range(3)]
    out = default_collate(tcs)
    assert type(out) is Sample and out.a.tolist() == [0.0, 1.0, 2.0] and out.s == "text"
    ragged = [TensorDict(x=torch.zeros(2)), TensorDict(x=torch.zeros(3))]
    lazy = default_collate(ragged)
    ref = default_collate([tensordict.TensorDict(x=torch.zeros(2)), tensordict.TensorDict(x=torch.zeros(3))])
    assert type(lazy) is LazyStackedTensorDict and isinstance(ref, tensordict.LazyStackedTensorDict)
    assert [m["x"].shape for m in lazy.tensordicts] == [m["x"].shape for m in ref.tensordicts]
    with pytest.raises(TypeError, match="other types"):
        default_collate([TensorDict(x=torch.zeros(1)), {"x": torch.zeros(1)}])
    with pytest.raises(TypeError, match="batch dims"):
        default_collate([TensorDict(x=torch.zeros(2), batch_size=[2]), TensorDict(x=torch.zeros(2))])


# -- pin_memory ----------------------------------------------------------------------------------
def test_pin_memory_matches_the_reference_on_this_machine() -> None:
    ours = TensorDict(_rows(), batch_size=[10])
    ref = tensordict.TensorDict({"x": torch.arange(10), "y": {"z": torch.zeros(10, 2)}}, batch_size=[10])
    if torch.accelerator.is_available():
        pinned = ours.pin_memory()
        assert pinned["x"].is_pinned() and pinned["y", "z"].is_pinned() and pinned["s"] == "text"
        assert ref.pin_memory()["x"].is_pinned()
    else:  # no accelerator: both raise torch's RuntimeError, and the DataLoader does not pin (or crash)
        with pytest.raises(RuntimeError):
            ref.pin_memory()
        with pytest.raises(RuntimeError):
            ours.pin_memory()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no accelerator is found"
            batches = list(DataLoader(ours, batch_size=4, pin_memory=True))
            ref_batches = list(DataLoader(ref, batch_size=4, pin_memory=True))
        assert [b["x"].tolist() for b in batches] == [b["x"].tolist() for b in ref_batches]


def test_pin_memory_structure(monkeypatch: pytest.MonkeyPatch) -> None:
    """What pin_memory builds, with torch's pinning replaced by a marked copy (this machine may have no GPU)."""
    pinned: set[int] = set()

    def fake_pin(t: torch.Tensor, *args: Any) -> torch.Tensor:
        out = t.clone()
        pinned.add(id(out))
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t, *a: id(t) in pinned)
    td = TensorDict(_rows(), batch_size=[10]).lock_()
    out = td.pin_memory()
    assert out is not td and out.is_locked and out["y", "z"].is_pinned() and not td["x"].is_pinned()
    assert (out == td).all() and out["s"] == "text"
    tc = build("tensorclass").pin_memory()
    assert type(tc) is Sample and tc.n["b"].is_pinned()
    ls = build("lazy").pin_memory()
    assert type(ls) is LazyStackedTensorDict and ls.tensordicts[0]["a"].is_pinned()
    free = TensorDict(_rows(), batch_size=[10])
    nested = free["y"]
    assert free.pin_memory(inplace=True) is free and free["y"] is nested and free["y", "z"].is_pinned()
    locked = TensorDict(_rows(), batch_size=[10]).memmap_()
    assert locked.pin_memory(inplace=True) is locked and not locked["x"].is_pinned()  # mapped leaves stay


# -- workers ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("source", ["folder", "anonymous", "tensorclass", "lazy"])
def test_workers_read_the_mapped_rows(context: str, source: str, tmp_path: Path) -> None:
    obj = _source(source, tmp_path)
    loader = DataLoader(obj, batch_size=4, num_workers=2, multiprocessing_context=context, timeout=TIMEOUT)
    batches = list(loader)
    assert [type(b) for b in batches] == [type(obj)] * 3
    assert _flat(_x(b) for b in batches) == list(range(10))
    z = batches[1].n["b"] if source == "tensorclass" else batches[1]["y", "z"]
    assert z.tolist() == [[8.0, 9.0], [10.0, 11.0], [12.0, 13.0], [14.0, 15.0]]
    if source != "lazy":
        assert batches[0].get("s") == "text"


@pytest.mark.parametrize("context", CONTEXTS)
def test_workers_with_a_batch_sampler(context: str, tmp_path: Path) -> None:
    td = _source("folder", tmp_path)

    def sampler() -> BatchSampler:
        return BatchSampler(RandomSampler(range(10), generator=torch.Generator().manual_seed(3)), 3, drop_last=False)

    order = [list(b) for b in sampler()]
    loader = DataLoader(td, batch_sampler=sampler(), num_workers=2, multiprocessing_context=context, timeout=TIMEOUT)
    got = [b["x"].tolist() for b in loader]
    assert got == order and sorted(_flat(got)) == list(range(10))
