"""The dict and autograd conveniences (tdshare/_dict_ops.py) on every container kind, against
tensordict 0.15.3 where it has the same call."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import tensordict
import torch
from _kinds import KINDS, build

import tdshare
from tdshare import TensorDict

warnings.filterwarnings("ignore", category=FutureWarning)

pytestmark = pytest.mark.timeout(60)


def _ref() -> tensordict.TensorDict:
    return tensordict.TensorDict(
        a=torch.arange(4.0),
        n={"b": torch.zeros(4, 2)},
        s=tensordict.NonTensorData("text", batch_size=[4]),
        batch_size=[4],
    )


def _keys(c: Any) -> list[str]:
    return sorted(map(str, c.keys(True, True)))


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_popitem_takes_the_last_entry_as_the_reference(kind: str) -> None:
    c = build(kind)
    key, value = c.popitem()
    ref_key, _ = _ref().popitem()
    assert key == ref_key == "s"
    assert value == build(kind).pop("s")  # what pop gives (the value)
    assert list(c.keys()) == ["a", "n"]
    assert c.popitem()[0] == "n"
    key, value = c.popitem()
    assert key == "a" and value.tolist() == [0.0, 1.0, 2.0, 3.0] and list(c.keys()) == []
    with pytest.raises(KeyError, match="empty"):
        c.popitem()
    with pytest.raises(KeyError):
        tensordict.TensorDict().popitem()


@pytest.mark.parametrize("kind", KINDS)
def test_clear_and_popitem_refuse_a_locked_collection_and_change_nothing(kind: str) -> None:
    c = build(kind).lock_()
    for call in (c.clear, c.popitem):
        with pytest.raises(RuntimeError, match="lock"):
            call()
        assert _keys(c) == _keys(build(kind))
    with pytest.raises(RuntimeError, match="lock"):
        _ref().lock_().clear()


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_clear_keeps_the_batch_size(kind: str) -> None:
    c = build(kind)
    assert c.clear() is c and list(c.keys()) == [] and c.batch_size == torch.Size([4])


@pytest.mark.parametrize("kind", KINDS)
def test_replace_copies_and_leaves_the_original(kind: str) -> None:
    c = build(kind)
    new = c.replace(a=torch.ones(4))
    assert new is not c and new["a"].tolist() == [1.0] * 4 and c["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert torch.equal(new["n", "b"], c["n", "b"])
    new2 = c.replace({("n", "b"): torch.ones(4, 2)})
    assert new2["n", "b"].sum().item() == 8 and c["n", "b"].sum().item() == 0
    ref = _ref()
    assert ref.replace(a=torch.ones(4))["a"].tolist() == new["a"].tolist()
    with pytest.raises(TypeError, match="mapping"):
        c.replace(1)


def test_replace_of_a_locked_tensordict_gives_a_locked_copy() -> None:
    td = build("tensordict").lock_()
    new = td.replace(a=torch.ones(4))
    assert new.is_locked and new["a"].sum().item() == 4 and td["a"].sum().item() == 6


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_create_nested_adds_an_empty_level_of_the_batch_size(kind: str) -> None:
    c = build(kind)
    assert c.create_nested("z") is c and c.create_nested(("n", "y")) is c
    assert c["z"].batch_size == torch.Size([4]) and list(c["z"].keys()) == []
    assert list(c["n", "y"].keys()) == []
    ref = _ref().create_nested("z")
    assert ref["z"].batch_size == c["z"].batch_size
    with pytest.raises(RuntimeError, match="lock"):
        build(kind).lock_().create_nested("q")


@pytest.mark.parametrize("kind", KINDS)
def test_entry_class_filter_and_numpy(kind: str) -> None:
    c = build(kind)
    assert c.entry_class("a") is torch.Tensor
    assert issubclass(c.entry_class("n"), tdshare.TensorDictBase)
    kept = c.filter_non_tensor_data()
    assert _keys(kept) == ["('n', 'b')", "a"] and "s" in c.keys()
    ref_kept = _ref().filter_non_tensor_data()
    assert sorted(map(str, ref_kept.keys(True, True))) == _keys(kept)
    arrays = c.numpy()
    ref_arrays = _ref().numpy()
    assert isinstance(arrays["a"], np.ndarray) and np.array_equal(arrays["a"], ref_arrays["a"])
    assert np.array_equal(arrays["n"]["b"], ref_arrays["n"]["b"])
    assert arrays["s"] in ("text", ["text"] * 4)


@pytest.mark.parametrize("kind", KINDS)
def test_type_ndimension_and_copy_at_(kind: str) -> None:
    c = build(kind)
    cast = c.type(torch.float64)
    assert cast["a"].dtype == torch.float64 and cast["n", "b"].dtype == torch.float64 and c["a"].dtype == torch.float32
    only_a = c.type(torch.float64, cast_filter=lambda t: t.shape[-1:] != (2,))  # (a lazy stack: its members' leaves)
    assert only_a["a"].dtype == torch.float64 and only_a["n", "b"].dtype == torch.float32
    assert c.ndimension() == _ref().ndimension() == 1
    row = TensorDict(a=torch.tensor(9.0), n={"b": torch.full((2,), 5.0)}, batch_size=[])
    assert c.copy_at_(row, 2) is c
    assert c["a"].tolist() == [0.0, 1.0, 9.0, 3.0] and c["n", "b"][2].tolist() == [5.0, 5.0]
    assert c["n", "b"][1].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("kind", KINDS)
def test_requires_grad_and_zero_grad(kind: str) -> None:
    c = build(kind)
    assert c.requires_grad is False
    td = TensorDict(a=torch.zeros(3, requires_grad=True), n={"b": torch.ones(3, requires_grad=True)}, batch_size=[3])
    assert td.requires_grad is True
    (td["a"] * 2 + td["n", "b"]).sum().backward()
    assert td.zero_grad(set_to_none=False) is td
    assert td["a"].grad.tolist() == [0.0] * 3 and td["n", "b"].grad.tolist() == [0.0] * 3
    td.zero_grad()
    assert td["a"].grad is None and td["n", "b"].grad is None
    ref = tensordict.TensorDict(a=torch.zeros(3, requires_grad=True), batch_size=[3])
    assert ref.requires_grad is True
    (ref["a"] * 2).sum().backward()
    assert ref.zero_grad()["a"].grad is None


def test_the_conveniences_work_on_a_memory_mapped_tensordict(tmp_path: Any) -> None:
    td = build("tensordict").memmap_(tmp_path / "td")
    assert td.numpy()["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert td.replace(a=torch.ones(4))["a"].tolist() == [1.0] * 4
    assert td.copy_at_(TensorDict(a=torch.tensor(7.0), n={"b": torch.ones(2)}, batch_size=[]), 0)["a"][0] == 7
    assert TensorDict.load_memmap(tmp_path / "td")["a"][0] == 7  # written through to the file
    with pytest.raises(RuntimeError, match="lock"):
        td.clear()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("idx", "value", "expected"),
    [
        (slice(1, 3), torch.tensor([7.0, 8.0]), [0.0, 7.0, 8.0, 3.0]),
        (torch.tensor([True, False, False, True]), torch.tensor(5.0), [5.0, 1.0, 2.0, 5.0]),
        (2, torch.tensor(9.0), [0.0, 1.0, 9.0, 3.0]),
    ],
)
def test_update_at_writes_in_place_into_every_kind(kind: str, idx: Any, value: Any, expected: list[float]) -> None:
    """A lazy stack's update_at_ wrote into a stacked copy and lost the values (found with copy_at_)."""
    c = build(kind)
    members = list(c.tensordicts) if kind == "lazy" else []
    ptrs = [m["a"].data_ptr() for m in members]
    assert c.update_at_({"a": value}, idx) is c
    assert c["a"].tolist() == expected
    assert [m["a"].data_ptr() for m in members] == ptrs  # the members' own tensors, written in place
    assert [m["a"].item() for m in members] == (expected if kind == "lazy" else [])
    ref = _ref()
    ref.update_at_({"a": value}, idx)
    assert ref["a"].tolist() == expected


def test_update_at_of_a_memory_mapped_lazy_stack_reaches_its_files(tmp_path: Any) -> None:
    ls = build("lazy").memmap_(tmp_path / "ls")
    ls.update_at_({("n", "b"): torch.ones(2)}, slice(0, 2))
    back = tdshare.LazyStackedTensorDict.load_memmap(tmp_path / "ls")
    assert back["n", "b"].sum(-1).tolist() == [2.0, 2.0, 0.0, 0.0]


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("join", ["stack_tensors", "cat_tensors"])
@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_stack_and_cat_tensors_join_entries_as_the_reference(kind: str, join: str, keep: bool) -> None:
    c, ref = build(kind), _ref()
    for obj in (c, ref):
        obj.set("b2", obj.get(("n", "b")) + 2)
        getattr(obj, join)(("n", "b"), "b2", out_key=("n", "joined"), dim=-1, keep_entries=keep)
    assert torch.equal(c.get(("n", "joined")), ref.get(("n", "joined")))
    tensors = [k for k in c.keys(True, True) if isinstance(c.get(k), torch.Tensor)]
    assert sorted(map(str, tensors)) == _keys(ref) and (("b2" in c.keys()) is keep)
    c.set("c", torch.ones(4, 3))
    with pytest.raises(RuntimeError):  # shapes that cannot be stacked: nothing is removed
        c.stack_tensors("a", "c", out_key="bad")
    assert {"a", "c"} <= set(c.keys()) and "bad" not in c.keys()
    with pytest.raises(KeyError):
        c.cat_tensors("missing", "c", out_key="bad")


@pytest.mark.parametrize("kind", KINDS)
def test_backward_differentiates_every_leaf_that_requires_grad(kind: str) -> None:
    x = torch.ones(4, requires_grad=True)
    c = build(kind)
    c.set("a", x * 2)  # a leaf that requires grad, four elements
    with pytest.raises(RuntimeError, match="single-element leaves"):
        c.backward()
    c.backward(
        c.empty().set("a", torch.full((4,), 0.5)) if kind != "tensorclass" else TensorDict(a=torch.full((4,), 0.5))
    )
    assert x.grad.tolist() == [1.0] * 4  # d(2x)/dx * 0.5
    x.grad = None
    losses, ref_losses = TensorDict(actor=x.sum(), critic=x.pow(2).sum()), None
    losses.backward()
    y = torch.ones(4, requires_grad=True)
    ref_losses = tensordict.TensorDict(actor=y.sum(), critic=y.pow(2).sum())
    ref_losses.backward()
    assert torch.equal(x.grad, y.grad)
    with pytest.raises(RuntimeError, match="no leaf"):
        build(kind).backward()
    with pytest.raises(KeyError, match="critic"):
        TensorDict(actor=x.sum(), critic=x.pow(2).sum()).backward(TensorDict(actor=torch.tensor(1.0)))


@pytest.mark.parametrize("kind", KINDS)
def test_as_tensor_keeps_the_leaves_and_filter_empty_drops_empty_levels(tmp_path: Any, kind: str) -> None:
    mapped = build(kind).memmap_(tmp_path / "td")
    same = mapped.as_tensor()
    assert same.is_locked and all(torch.equal(same.get(k), mapped.get(k)) for k in (("a",), ("n", "b")))
    if kind == "tensorclass":
        return  # fixed fields: no empty level to add
    c = build(kind)
    c.set("e", {})
    c.set(("f", "g"), {})
    ref = _ref()
    ref.set("e", {})
    ref.set(("f", "g"), {})
    assert c.filter_empty_() is c and sorted(c.keys()) == sorted(ref.filter_empty_().keys()) == ["a", "n", "s"]


@pytest.mark.parametrize("kind", KINDS)
def test_torch_autograd_grad_and_backward_over_collections_as_the_reference(kind: str) -> None:
    inputs = build(kind).float().requires_grad_()
    outputs = inputs * 3 + 1
    grads = torch.autograd.grad(outputs, inputs, torch.ones_like(outputs))
    assert type(grads) is type(inputs) and (grads == 3).all()
    assert grads.get(("n", "b")).shape == inputs.get(("n", "b")).shape
    fresh = build(kind).float().requires_grad_()
    (fresh * 2).backward(torch.ones_like(fresh))
    assert (fresh.grad.get("a") == 2).all() and (fresh.grad.get(("n", "b")) == 2).all()
    ref_in = _ref().float().requires_grad_()
    ref_grads = torch.autograd.grad(ref_in * 3 + 1, ref_in, torch.ones_like(ref_in))
    assert torch.equal(grads.get("a"), ref_grads.get("a"))
