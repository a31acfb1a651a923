"""Lazy stacks whose members differ in shape, and empty lazy stacks: the operations that must never
stack a ragged entry (keys, update_, as_list reads), checked against tensordict 0.15.3."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import tensordict
import torch

import tdshare
from tdshare import LazyStackedTensorDict, TensorDict


def _ragged(lib: Any) -> Any:
    """A tensordict holding a lazy stack whose members' ``hetero`` entries differ in shape."""
    members = [
        lib.TensorDict(shared=torch.zeros(2), hetero=torch.zeros(3), own=lib.TensorDict(x=torch.zeros(1))),
        lib.TensorDict(shared=torch.zeros(2), hetero=torch.zeros(2), own=lib.TensorDict(x=torch.zeros(1))),
    ]
    return lib.TensorDict(lazy=lib.LazyStackedTensorDict(*members), dense=torch.zeros(2), batch_size=[2])


def test_keys_of_a_ragged_nested_stack_read_no_leaf() -> None:
    ours, ref = _ragged(tdshare), _ragged(tensordict)
    assert sorted(map(str, ours.keys(True))) == sorted(map(str, ref.keys(True)))
    assert sorted(map(str, ours.keys(True, True))) == sorted(map(str, ref.keys(True, True)))


def test_update_in_place_from_a_ragged_stack_goes_member_by_member() -> None:
    for lib in (tdshare, tensordict):
        dest = _ragged(lib)
        source = _ragged(lib)
        source["lazy"].tensordicts[1]["hetero"] += 5
        source["dense"] += 1
        kept = dest["lazy"].tensordicts[1]["hetero"]
        dest.update_(source)
        assert dest["lazy"].tensordicts[1]["hetero"].tolist() == [5.0, 5.0] and dest["dense"].tolist() == [1.0, 1.0]
        assert dest["lazy"].tensordicts[1]["hetero"] is kept  # written in place
    stacked = LazyStackedTensorDict(_ragged(tdshare), _ragged(tdshare))
    out = LazyStackedTensorDict(_ragged(tdshare), _ragged(tdshare))
    stacked.tensordicts[0]["lazy"].tensordicts[0]["hetero"] += 2
    out.update_(stacked)
    assert out.tensordicts[0]["lazy"].tensordicts[0]["hetero"].tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(KeyError):
        out.update_({"zz": torch.zeros(2, 2)})


def test_lazy_stack_with_out_writes_ragged_members_in_place() -> None:
    parts = [_ragged(tdshare), _ragged(tdshare)]
    out = LazyStackedTensorDict(_ragged(tdshare), _ragged(tdshare))
    parts[1]["lazy"].tensordicts[0]["hetero"] += 3
    result = LazyStackedTensorDict.lazy_stack(parts, 0, out=out)
    assert result is out and out.tensordicts[1]["lazy"].tensordicts[0]["hetero"].tolist() == [3.0, 3.0, 3.0]


def test_as_list_of_a_stack_of_stacks_gives_nested_lists() -> None:
    def build(lib: Any) -> Any:
        inner = lib.lazy_stack([lib.TensorDict(a=torch.zeros(3)), lib.TensorDict(a=torch.ones(4))])
        return lib.lazy_stack([inner, inner.copy()])

    ours, ref = build(tdshare), build(tensordict)
    got, want = ours.get("a", as_list=True), ref.get("a", as_list=True)
    assert isinstance(got, list) and len(got) == len(want) == 2
    assert [[t.tolist() for t in row] for row in got] == [[t.tolist() for t in row] for row in want]
    assert ours.get("a", as_padded_tensor=True).shape == ref.get("a", as_padded_tensor=True).shape


# -- empty lazy stacks ----------------------------------------------------------------------------
def test_an_empty_lazy_stack_has_a_zero_sized_stack_dim() -> None:
    for lib in (tdshare, tensordict):
        empty = lib.LazyStackedTensorDict(stack_dim=0)
        assert empty.shape == torch.Size([0]) and empty.device is None and list(empty.keys()) == []
        shaped = lib.LazyStackedTensorDict(stack_dim=1, batch_size=[1, 2], device="cpu")
        assert shaped.shape == torch.Size([1, 0, 2]) and shaped.device == torch.device("cpu")


def test_indexing_down_to_no_member_keeps_the_stack_and_its_shape() -> None:
    for lib in (tdshare, tensordict):
        lst = lib.LazyStackedTensorDict(*[lib.TensorDict({"a": torch.ones(2)}, [2]) for _ in range(3)], stack_dim=0)
        assert lst[0:0].batch_size == torch.Size([0, 2])
        assert lst[torch.zeros(3, dtype=torch.bool)].batch_size == torch.Size([0, 2])
        recat = torch.cat([lst[0:1], lst[0:0], lst[1:]], 0)
        assert recat.batch_size == torch.Size([3, 2]) and (recat == lst).all()
        side = lib.LazyStackedTensorDict(*[lib.TensorDict({"a": torch.ones(3)}, [3]) for _ in range(2)], stack_dim=1)
        assert side[:, torch.zeros(2, dtype=torch.bool)].batch_size == torch.Size([3, 0])


def test_an_empty_stack_survives_copies_pickling_and_densifying() -> None:
    lst = LazyStackedTensorDict(*[TensorDict({"a": torch.ones(2)}, [2]) for _ in range(3)], stack_dim=0)
    empty = lst[0:0]
    assert isinstance(empty, LazyStackedTensorDict)
    assert empty.clone().batch_size == empty.apply(lambda x: x + 1).batch_size == torch.Size([0, 2])
    assert pickle.loads(pickle.dumps(empty)).batch_size == torch.Size([0, 2])
    dense = empty.to_tensordict()
    assert type(dense) is TensorDict and dense.batch_size == torch.Size([0, 2]) and list(dense.keys()) == []
