"""The module-level functions (tdshare/_functional.py), compared with tensordict 0.15.3."""

from __future__ import annotations

from typing import Any

import pytest
import tensordict
import torch
from _kinds import KINDS, Sample, build

import tdshare
from tdshare import LazyStackedTensorDict, TensorDict


def _leaves(td: Any) -> dict[str, Any]:
    return {str(k): td.get(k).tolist() for k in td.keys(True, True) if isinstance(td.get(k), torch.Tensor)}


@pytest.mark.parametrize("kind", KINDS)
def test_stack_cat_and_lazy_stack_of_every_kind(kind: str) -> None:
    a, b = build(kind), build(kind, offset=1.0)
    stacked = tdshare.stack([a, b], 1)
    assert stacked.batch_size == (4, 2) and stacked.get("a")[:, 1].tolist() == [1.0, 2.0, 3.0, 4.0]
    joined = tdshare.cat([a, b])
    assert joined.batch_size == (8,) and joined.get("a").tolist()[4:] == [1.0, 2.0, 3.0, 4.0]
    lazy = tdshare.lazy_stack([a, b])
    assert lazy.batch_size == (2, 4) and lazy.get("a")[1].tolist() == [1.0, 2.0, 3.0, 4.0]
    if kind == "tensorclass":
        assert type(lazy) is Sample and type(stacked) is Sample
    else:
        assert isinstance(lazy, LazyStackedTensorDict)
    out = tdshare.stack([a, a], 0)
    assert tdshare.stack([a, b], 0, out=out) is out and out.get("a")[1].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_maybe_dense_stack_chooses_like_the_reference() -> None:
    same = [TensorDict(a=torch.zeros(2, 3), batch_size=[2]), TensorDict(a=torch.ones(2, 3), batch_size=[2])]
    ragged = [TensorDict(a=torch.zeros(2, 3), batch_size=[2]), TensorDict(a=torch.ones(2, 4), batch_size=[2])]
    ref_same = [tensordict.TensorDict(td.to_dict(), batch_size=[2]) for td in same]
    ref_ragged = [tensordict.TensorDict(td.to_dict(), batch_size=[2]) for td in ragged]
    for mine, theirs in ((same, ref_same), (ragged, ref_ragged)):
        got, want = tdshare.maybe_dense_stack(mine), tensordict.maybe_dense_stack(theirs)
        assert type(got).__name__ == type(want).__name__ and got.batch_size == want.batch_size
    assert tdshare.maybe_dense_stack(ragged).tensordicts[1]["a"].shape == (2, 4)


def test_pad_matches_the_reference() -> None:
    data = {"a": torch.ones(3, 4, 1), "n": {"b": torch.arange(12.0).view(3, 4)}, "s": "x"}
    td = TensorDict(data, batch_size=[3, 4])
    ref = tensordict.TensorDict(data, batch_size=[3, 4])
    for sizes in ([0, 1, 0, 2], [2, 0], [1, 1, 1, 1]):
        got, want = tdshare.pad(td, sizes, value=-1.0), tensordict.pad(ref, sizes, value=-1.0)
        assert got.batch_size == want.batch_size and got["n"].batch_size == want["n"].batch_size
        assert _leaves(got) == _leaves(want)
        assert got.get("s").tolist() == list(want.get("s").tolist())  # new elements hold None, as the reference
    with pytest.raises(ValueError, match=r"pairs"):
        tdshare.pad(td, [1, 1, 1, 1, 1, 1])
    with pytest.raises(ValueError, match=r"pairs"):
        tdshare.pad(td, [1])
    before = td["a"]
    assert tdshare.pad(td, [0, 1], inplace=True) is td and td.batch_size == (4, 4) and td["a"] is not before
    sample = build("tensorclass")
    padded = tdshare.pad(sample, [1, 0])
    assert type(padded) is Sample and padded.a.tolist() == [0.0, 0.0, 1.0, 2.0, 3.0]


def test_pad_in_place_crops_and_lazy_stacks() -> None:
    td = TensorDict({"a": torch.ones(3, 4, 1), "n": TensorDict({"c": torch.ones(3, 4, 2)}, [3, 4])}, [3, 4])
    nested, old = td["n"], td["a"]
    assert td.pad([0, 1, 0, 2], value=5.0, inplace=True) is td and td["n"] is nested and td["a"] is not old
    assert td.batch_size == td["n"].batch_size == (4, 6) and td["n", "c"][3, 5].tolist() == [5.0, 5.0]
    before = td["a"]
    with pytest.raises(RuntimeError, match=r"negative output size"):
        td.pad([-10, 0], inplace=True)
    assert td["a"] is before and td.batch_size == (4, 6)
    cropped = td.pad([-1, 0, 0, -2])
    ref = tensordict.pad(tensordict.TensorDict(td.to_dict(), batch_size=[4, 6]), [-1, 0, 0, -2])
    assert cropped.batch_size == ref.batch_size == (3, 4) and _leaves(cropped) == _leaves(ref)
    lazy = tdshare.lazy_stack(
        [TensorDict(x=torch.ones(4), batch_size=[4]), TensorDict(x=torch.full((4,), 2.0), batch_size=[4])]
    )
    ref_lazy = tensordict.lazy_stack(
        [
            tensordict.TensorDict(x=torch.ones(4), batch_size=[4]),
            tensordict.TensorDict(x=torch.full((4,), 2.0), batch_size=[4]),
        ]
    )
    got, want = tdshare.pad(lazy, [1, 0, 0, 2], value=3.0), tensordict.pad(ref_lazy, [1, 0, 0, 2], value=3.0)
    assert got.batch_size == want.batch_size == (3, 6) and got["x"].tolist() == want["x"].tolist()
    assert lazy.pad([0, 1], value=9.0, inplace=True) is lazy and len(lazy.tensordicts) == 3
    assert lazy.tensordicts[2]["x"].tolist() == [9.0] * 4 and lazy.tensordicts[0]["x"].tolist() == [1.0] * 4
    sample = build("tensorclass")
    inner = sample._tensordict
    out = sample.pad([0, 2], inplace=True)
    assert out._tensordict is inner and sample.batch_size == (6,) and sample.n.batch_size == (6,)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("mask", [False, True, ("my", "masks")])
def test_pad_sequence_along_a_batch_dim(side: str, mask: Any) -> None:
    def make(lib: Any) -> list[Any]:
        return [
            lib.TensorDict({"a": torch.ones(2, 8), ("b", "c"): torch.ones(2, 3)}, [2]),
            lib.TensorDict({"a": torch.full((4, 8), 2.0), ("b", "c"): torch.full((4, 3), 2.0)}, [4]),
        ]

    got = tdshare.pad_sequence(make(tdshare), padding_value=-1, return_mask=mask, padding_side=side)
    want = tensordict.pad_sequence(make(tensordict), padding_value=-1, return_mask=mask, padding_side=side)
    assert got.batch_size == want.batch_size == (2, 4)
    assert _leaves(got) == _leaves(want)


def test_pad_sequence_along_a_feature_dim_non_tensors_and_tensorclasses() -> None:
    def make(lib: Any) -> list[Any]:
        return [lib.TensorDict(a=torch.ones(2, 3), s="x"), lib.TensorDict(a=torch.ones(2, 5), s="y")]

    got = tdshare.pad_sequence(make(tdshare), pad_dim=1, return_mask=True, padding_value={"a": 7.0})
    want = tensordict.pad_sequence(make(tensordict), pad_dim=1, return_mask=True, padding_value={"a": 7.0})
    assert got.batch_size == want.batch_size and _leaves(got) == _leaves(want)
    assert got["s"] == ["x", "y"]
    samples = [
        Sample(a=torch.ones(n), n=TensorDict(b=torch.zeros(2), batch_size=[]), s=str(n), batch_size=[]) for n in (2, 3)
    ]
    stacked = tdshare.pad_sequence(samples)
    assert type(stacked) is Sample and stacked.batch_size == (2,) and stacked.a.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert stacked.s == ["2", "3"]
    with pytest.raises(ValueError, match=r"padding_side"):
        tdshare.pad_sequence(make(tdshare), padding_side="middle")
    with pytest.raises(ValueError, match=r"no entry"):
        tdshare.pad_sequence(make(tdshare), padding_value={"zz": 1.0})


@pytest.mark.parametrize(("stack_dim", "nested_dim"), [(0, 0), (0, 1), (2, 1), (1, 2)])
def test_dense_stack_tds_keeps_inner_lazy_stacks(stack_dim: int, nested_dim: int) -> None:
    def make(lib: Any) -> Any:
        td0 = lib.TensorDict({"a": torch.zeros(5, 6, 3)}, [5, 6])
        td1 = lib.TensorDict({"a": torch.zeros(5, 6, 4), "b": torch.zeros(5, 6, 2)}, [5, 6])
        lazy = lib.LazyStackedTensorDict.lazy_stack([td0, td1], dim=nested_dim)
        container = lib.TensorDict({"lazy": lazy}, lazy.batch_size)
        other = container.clone()
        other.apply_(lambda x: x + 1)
        return lib.LazyStackedTensorDict.lazy_stack([container, other], dim=stack_dim)

    got, want = tdshare.dense_stack_tds(make(tdshare)), tensordict.dense_stack_tds(make(tensordict))
    assert type(got) is TensorDict and isinstance(got["lazy"], LazyStackedTensorDict)
    assert got.batch_size == want.batch_size and got["lazy"].stack_dim == want["lazy"].stack_dim
    assert "b" not in got["lazy"].tensordicts[0].keys() and "b" in got["lazy"].tensordicts[1].keys()
    for i in range(2):
        index = (slice(None),) * stack_dim + (i,)
        assert all((member == i).all() for member in got[index]["lazy"].tensordicts)


@pytest.mark.parametrize("per_key", [False, True])
def test_merge_tensordicts_matches_the_reference(per_key: bool) -> None:
    def make(lib: Any) -> list[Any]:
        return [
            lib.TensorDict({"a": {"b0": 0}, "c": {"d": {"e": 0}}, "common": 0}),
            lib.TensorDict({"a": {"b1": 1}, "f": {"g": {"h": 1}}, "common": 1}),
            lib.TensorDict({"a": {"b2": 2}, "f": {"g": {"h": 2}}, "common": 2}),
        ]

    def caller(*v: Any) -> Any:
        return torch.stack(list(v))

    callback: Any = {"common": caller} if per_key else caller
    got = tdshare.merge_tensordicts(*make(tdshare), callback_exist=callback)
    want = tensordict.merge_tensordicts(*make(tensordict), callback_exist=callback)
    assert _leaves(got) == _leaves(want) and got["common"].tolist() == [0, 1, 2] and got["f", "g", "h"] == 1
    with pytest.raises(ValueError, match=r"at least 2"):
        tdshare.merge_tensordicts(make(tdshare)[0])


@pytest.mark.parametrize(
    "value",
    [tdshare.TensorDict, tdshare.LazyStackedTensorDict, Sample, tdshare.NonTensorData, torch.Tensor, int, "x"],
)
def test_is_tensor_collection(value: Any) -> None:
    twin = {
        tdshare.TensorDict: tensordict.TensorDict,
        tdshare.LazyStackedTensorDict: tensordict.LazyStackedTensorDict,
        Sample: tensordict.NonTensorData,  # a tensorclass in the reference
        tdshare.NonTensorData: tensordict.NonTensorData,
    }.get(value, value)
    assert tdshare.is_tensor_collection(value) is tensordict.is_tensor_collection(twin)
    assert tdshare.is_tensor_collection(build("tensorclass")) and tdshare.is_tensor_collection(build("lazy"))


def test_pad_of_per_element_non_tensor_values() -> None:
    def make(lib: Any) -> Any:
        return lib.TensorDict(x=torch.arange(3).unsqueeze(-1), instr=lib.NonTensorStack("a", "b", "c"), batch_size=[3])

    for sizes in ([0, 2], [1, 1], [-1, 1]):
        got, want = tdshare.pad(make(tdshare), sizes), tensordict.pad(make(tensordict), sizes)
        assert got["instr"] == want.get("instr").tolist() and got["x"].tolist() == want["x"].tolist()
    assert tdshare.pad(make(tdshare), [0, 2])["instr"] == ["a", "b", "c", None, None]
