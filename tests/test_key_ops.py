"""Key and conversion operations (tdshare/_key_ops.py, _conversions.py, _apply.py, _compact_repr.py)
on every container kind, compared with tensordict 0.15.3."""

from __future__ import annotations

import re
from typing import Any

import pytest
import tensordict
import torch
from _kinds import KINDS, build

import tdshare
from tdshare import TensorDict


@tensordict.tensorclass
class RefSample:
    a: torch.Tensor
    n: tensordict.TensorDict
    s: str


def ref_build(kind: str, offset: float = 0.0) -> Any:
    """The reference's twin of ``_kinds.build(kind)``."""
    a = torch.arange(4.0) + offset
    b = torch.zeros(4, 2) + offset
    if kind == "tensordict":
        return tensordict.TensorDict(a=a, n={"b": b}, s="text", batch_size=[4])
    if kind == "tensorclass":
        return RefSample(a=a, n=tensordict.TensorDict(b=b, batch_size=[4]), s="text", batch_size=[4])
    members = [tensordict.TensorDict(a=a[i], n={"b": b[i]}, s="text", batch_size=[]) for i in range(4)]
    return tensordict.LazyStackedTensorDict(*members, stack_dim=0)


def _values(td: Any) -> dict[Any, Any]:
    """Every leaf's value (tensors as lists), non-tensor leaves included in both libraries."""
    out = {}
    for key in td.keys(True):
        value = td.get(key)
        if type(value).__name__ == "NonTensorData":
            value = value.data
        elif type(value).__name__ == "NonTensorStack":
            value = value.tolist()
        if isinstance(value, torch.Tensor):
            out[key] = value.tolist()
        elif not hasattr(value, "keys"):
            out[key] = _one(value)
    return out


def _one(value: Any) -> Any:
    """A non-tensor value; the reference's stack of equal values (a nested list) as that value."""
    while isinstance(value, list) and value and all(v == value[0] for v in value):
        value = value[0]
    return value


# -- keys ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_flatten_and_unflatten_keys_match_the_reference(kind: str) -> None:
    # the reference refuses to flatten a tensorclass (its keys must be fields): compare with its tensordict
    ref = ref_build(kind)
    flat, ref_flat = build(kind).flatten_keys(), (ref._tensordict if kind == "tensorclass" else ref).flatten_keys()
    assert sorted(flat.keys()) == sorted(ref_flat.keys()) == ["a", "n.b", "s"]
    assert _values(flat) == _values(ref_flat)
    back = flat.unflatten_keys()
    assert set(back.keys(True, True)) == {"a", ("n", "b"), "s"}
    assert _values(back) == _values(ref_flat.unflatten_keys())
    dashed = build(kind).flatten_keys("-")
    assert "n-b" in dashed.keys() and dashed.unflatten_keys("-")["n", "b"].shape == (4, 2)


def test_flatten_keys_inplace_and_collisions() -> None:
    td = TensorDict(a={"b": {"c": torch.zeros(2)}, "e": {}}, d=torch.ones(2), batch_size=[2])
    assert td.flatten_keys(inplace=True) is td and td.keys() == ["a.b.c", "d"]
    assert td.unflatten_keys(inplace=True) is td and td.keys(True, True) == [("a", "b", "c"), "d"]
    clash = TensorDict({"a.b": torch.zeros(3), "a": {"b": torch.zeros(3)}})
    with pytest.raises(KeyError, match=r"Flattening keys in tensordict causes keys"):
        clash.flatten_keys()
    with pytest.raises(KeyError, match=re.escape("Unflattening key(s) in tensordict will override an existing")):
        clash.unflatten_keys()
    with pytest.raises(tdshare.NotSupportedError, match=r"inplace"):
        build("lazy").flatten_keys(inplace=True)
    with pytest.raises(tdshare.InvalidArgumentError, match=r"separator"):
        td.flatten_keys("")


@pytest.mark.parametrize("kind", KINDS)
def test_keys_options_depth_and_emptiness(kind: str) -> None:
    obj, ref = build(kind), ref_build(kind)
    assert list(obj.keys(True, sort=True)) == list(ref.keys(True, sort=True))
    assert obj.sorted_keys == ref.sorted_keys == ["a", "n", "s"]
    leafy = obj.keys(True, True, is_leaf=lambda cls: cls.__name__ in ("TensorDict", "LazyStackedTensorDict"))
    assert set(leafy) == {"a", "n", "s"}
    assert obj.depth == ref.depth == 1
    assert obj.is_empty() is ref.is_empty() is False
    assert TensorDict(n={}).is_empty() and tensordict.TensorDict(n={}).is_empty()


def test_setdefault_split_keys_select_exclude_rename() -> None:
    td = TensorDict(a=torch.zeros(2), n={"b": torch.ones(2)}, s="x", batch_size=[2])
    assert td.setdefault("a", torch.ones(2)).tolist() == [0.0, 0.0]
    assert td.setdefault("z", torch.full((2,), 5.0)).tolist() == [5.0, 5.0] and "z" in td
    picked, rest = td.split_keys(["a", ("n", "b")])
    ref_picked, ref_rest = tensordict.TensorDict(td.to_dict(), batch_size=[2]).split_keys(["a", ("n", "b")])
    assert sorted(map(str, picked.keys(True))) == sorted(map(str, ref_picked.keys(True)))
    assert sorted(map(str, rest.keys(True))) == sorted(map(str, ref_rest.keys(True)))
    with pytest.raises(KeyError, match=r"zz"):
        td.split_keys(["zz"])
    empty, _ = td.split_keys(["zz"], strict=False)
    assert empty.keys() == []
    (filled, _) = td.split_keys(["zz"], default=torch.zeros(2))
    assert filled["zz"].tolist() == [0.0, 0.0]
    copy = td.clone()
    _, remainder = copy.split_keys(["a"], inplace=True)
    assert remainder is copy and "a" not in copy
    assert td.select("a", "missing", strict=False).keys() == ["a"]
    with pytest.raises(KeyError):
        td.select("missing")
    kept = td.clone()
    assert kept.select("a", inplace=True) is kept and kept.keys() == ["a"]
    gone = td.clone()
    assert gone.exclude(("n", "b"), inplace=True) is gone and gone.keys(True) == ["a", "n", "s", "z"]
    assert "a" in td  # select/exclude without inplace leave the source alone
    with pytest.raises(KeyError, match=r"safe"):
        td.clone().rename_key_("a", "z", safe=True)
    assert td.clone().rename_key_(old_key="a", new_key="q")["q"].tolist() == [0.0, 0.0]


# -- conversions --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "batch"),
    [({}, []), ({"auto_batch_size": True}, [3, 4]), ({"batch_dims": 1}, [3]), ({"batch_size": [3]}, [3])],
)
def test_from_dict_matches_the_reference(kwargs: dict[str, Any], batch: list[int]) -> None:
    data = {"a": torch.zeros(3, 4, 5), "b": {"c": torch.zeros(3, 4, 6)}, ("d", "e"): torch.ones(3, 4), "s": "x"}
    td = TensorDict.from_dict(data, **kwargs)
    ref = tensordict.TensorDict.from_dict(data, **kwargs)
    assert td.batch_size == ref.batch_size == torch.Size(batch)
    assert td["b"].batch_size == ref["b"].batch_size and td["d"].batch_size == ref["d"].batch_size
    assert sorted(map(str, td.keys(True))) == sorted(map(str, ref.keys(True)))
    assert td["s"] == "x" and td["d", "e"].sum() == 12
    with pytest.raises(ValueError, match=r"both"):
        TensorDict.from_dict(data, batch_size=[3], batch_dims=1)
    assert TensorDict.from_dict({"a": [1, 2]})["a"].dtype == torch.int64


def test_from_dict_instance_fromkeys_and_namedtuples() -> None:
    td = TensorDict(a=torch.zeros(2), n={"b": torch.ones(2)}, batch_size=[2])
    back = td.from_dict_instance(td.to_dict(), auto_batch_size=True)
    assert type(back) is TensorDict and back.batch_size == (2,) and back["n", "b"].tolist() == [1.0, 1.0]
    keys = TensorDict.fromkeys(["a", ("b", "c")], 1)
    ref_keys = tensordict.TensorDict.fromkeys(["a", ("b", "c")], 1)
    assert _values(keys) == _values(ref_keys) and keys.batch_size == ()
    nt = td.to_namedtuple()
    assert type(nt).__name__ == type(tensordict.TensorDict(td.to_dict(), [2]).to_namedtuple()).__name__
    assert nt.n.b.tolist() == [1.0, 1.0]
    again = TensorDict.from_namedtuple(nt, auto_batch_size=True)
    assert again.batch_size == (2,) and (again == td).all()


@pytest.mark.parametrize("kind", KINDS)
def test_to_dict_and_tolist_match_the_reference(kind: str) -> None:
    obj, ref = build(kind), ref_build(kind)
    mine, theirs = obj.to_dict(convert_tensors=True), ref.to_dict(convert_tensors=True)
    theirs["s"] = _one(theirs["s"])  # a lazy stack of equal values: one value in tdshare (see the README)
    assert mine == theirs
    assert obj.tolist(convert_tensors=True) == ref.tolist(convert_tensors=True)
    rows = obj.tolist(convert_nodes=False)
    assert len(rows) == 4 and rows[1]["a"].item() == 1.0
    with pytest.raises(TypeError, match=r"convert_tensors"):
        obj.tolist(convert_nodes=False, convert_tensors=True)
    assert TensorDict(a=None).to_dict() == {"a": None} and TensorDict(a=None).to_dict(retain_none=False) == {}


def test_tolist_of_a_2d_batch() -> None:
    data = {"a": torch.arange(24).view(2, 3, 4), "b": {"c": torch.arange(6).view(2, 3)}}
    td, ref = TensorDict(data, batch_size=[2, 3]), tensordict.TensorDict(data, batch_size=[2, 3])
    assert td.tolist(convert_tensors=True) == ref.tolist(convert_tensors=True)
    assert td.to_dict(convert_tensors="numpy")["a"].shape == (2, 3, 4)


# -- copies and updates -------------------------------------------------------------------------
def test_update_keywords() -> None:
    td = TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2), "c": torch.zeros(2)}, batch_size=[2])
    src = {"a": torch.ones(2), "n": {"b": torch.ones(2), "c": torch.ones(2)}}
    td.update(src, keys_to_update=[("n", "b")])
    assert td["a"].tolist() == [0.0, 0.0] and td["n", "b"].tolist() == [1.0, 1.0] and td["n", "c"].sum() == 0
    value = torch.full((2,), 3.0)
    td.update({"a": value}, clone=True)
    assert td["a"] is not value and td["a"].tolist() == [3.0, 3.0]
    td.update(extra=torch.ones(2))
    assert "extra" in td
    td.lock_()
    with pytest.raises(RuntimeError):
        td.update({"new": torch.ones(2)})
    td.update({"new": torch.ones(2)}, ignore_lock=True)
    assert "new" in td and td.is_locked


@pytest.mark.parametrize("kind", KINDS)
def test_update_inplace_variants(kind: str) -> None:
    obj = build(kind)
    target = obj.clone()
    target.update_(build(kind, offset=1.0))
    assert target.get("a").tolist() == [1.0, 2.0, 3.0, 4.0] and target.get(("n", "b")).sum() == 8
    target = obj.clone()
    target.update_(build(kind, offset=1.0), keys_to_update=["a"])
    assert target.get("a").tolist() == [1.0, 2.0, 3.0, 4.0] and target.get(("n", "b")).sum() == 0
    target = obj.clone()
    target.copy_(build(kind, offset=2.0))
    assert target.get("a").tolist() == [2.0, 3.0, 4.0, 5.0]
    shallow = obj.copy()
    assert shallow.get("a").data_ptr() == obj.get("a").data_ptr() or kind == "lazy"


def test_update_underscore_errors_and_update_at() -> None:
    with pytest.raises(KeyError):
        TensorDict(a=0).update_(TensorDict(b=1))
    with pytest.raises(KeyError):
        TensorDict(a=0).update_({"b": torch.ones(())}, keys_to_update="b")
    TensorDict(a=0, b=1).update_(TensorDict(a=0))
    td = TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3, 2)}, batch_size=[3])
    td.update_at_({"a": torch.ones(()), "n": {"b": torch.ones(2)}}, 1)
    ref = tensordict.TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3, 2)}, batch_size=[3])
    ref.update_at_({"a": torch.ones(()), "n": {"b": torch.ones(2)}}, 1)
    assert _values(td) == _values(ref)
    with pytest.raises(KeyError, match=r"zz"):
        td.update_at_({"zz": torch.ones(())}, 0)


# -- apply --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_apply_keywords_match_the_reference(kind: str) -> None:
    obj, ref = build(kind), ref_build(kind)
    assert _values(obj.apply(lambda x: x * 2)) == _values(ref.apply(lambda x: x * 2))
    both = obj.apply(lambda x, y: x + y, build(kind, offset=1.0))
    assert _values(both) == _values(ref.apply(lambda x, y: x + y, ref_build(kind, offset=1.0)))
    obj.apply_(lambda x: x + 10)
    assert obj.get("a").tolist() == [10.0, 11.0, 12.0, 13.0]
    seen: list[Any] = []
    obj.named_apply(lambda key, x: seen.append(key), nested_keys=True)
    ref_seen: list[Any] = []
    ref.named_apply(lambda key, x: ref_seen.append(key), nested_keys=True)
    assert sorted(map(str, seen)) == sorted(map(str, ref_seen))


def test_apply_default_filter_empty_call_on_nested_and_outputs() -> None:
    td = TensorDict(a=torch.zeros(2), n={"b": torch.ones(2), "e": {}}, s="x", batch_size=[2])
    ref = tensordict.TensorDict(a=torch.zeros(2), n={"b": torch.ones(2), "e": {}}, s="x", batch_size=[2])
    other = TensorDict(a=torch.ones(2), batch_size=[2])
    ref_other = tensordict.TensorDict(a=torch.ones(2), batch_size=[2])
    assert _values(td.apply(lambda x, y: x + y, other, default=5)) == _values(
        ref.apply(lambda x, y: x + y, ref_other, default=5)
    )
    with pytest.raises(KeyError):
        td.apply(lambda x, y: x + y, other)
    for filter_empty in (None, False, True):
        mine = td.apply(lambda x: None, filter_empty=filter_empty)
        theirs = ref.apply(lambda x: None, filter_empty=filter_empty)
        assert sorted(map(str, mine.keys(True))) == sorted(map(str, theirs.keys(True))), filter_empty
    kinds: list[str] = []
    td.apply(lambda x: kinds.append(type(x).__name__) or x, call_on_nested=True)
    assert kinds == ["Tensor", "TensorDict", "str"]
    assert td.apply(lambda x: x[0], batch_size=[]).batch_size == ()
    assert td.apply(lambda x: x, names=["t"]).names == ["t"]
    out = td.clone()
    assert td.apply(lambda x: x + 1, out=out) is out and out["a"].tolist() == [1.0, 1.0]
    assert td.apply(lambda x: x + 1, inplace=True) is td and td["a"].tolist() == [1.0, 1.0]
    assert td.apply(lambda x: x, lock=True).is_locked
    assert td.lock_().apply(lambda x: x, propagate_lock=True).is_locked
    with pytest.raises(TypeError, match=r"bogus"):
        td.apply(lambda x: x, bogus=1)


# -- gradients, dtypes, memory ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_dtype_bytes_data_ptr_and_gradients(kind: str) -> None:
    obj, ref = build(kind), ref_build(kind)
    assert obj.dtype == ref.dtype == torch.float32
    assert obj.is_floating_point() is ref.is_floating_point() is True
    assert obj.bytes() == ref.bytes() == 4 * 4 + 4 * 2 * 4
    assert obj.requires_grad_().get("a").requires_grad
    assert not obj.detach().get("a").requires_grad and obj.get("a").requires_grad
    if kind != "lazy":  # a lazy stack's members here are views, which torch cannot detach in place
        assert not obj.detach_().get("a").requires_grad
    ptrs = obj.data_ptr()
    if kind == "tensordict":
        assert ptrs["a"].item() == obj["a"].data_ptr() and ptrs.batch_size == ()
        assert list(ptrs.keys(True, True)) == list(ref.data_ptr().keys(True, True))


def test_bytes_counts_duplicates_and_gradients() -> None:
    shared = torch.zeros(4)
    grad = torch.ones(3, requires_grad=True)
    (grad + 1).sum().backward()
    td = TensorDict(a=shared, b=shared, g=grad, i=torch.zeros(2, dtype=torch.int64))
    ref = tensordict.TensorDict(a=shared, b=shared, g=grad, i=torch.zeros(2, dtype=torch.int64))
    for count in (True, False):
        assert td.bytes(count_duplicates=count) == ref.bytes(count_duplicates=count)
    assert td.dtype is None and ref.dtype is None and not td.is_floating_point()


def test_cuda_without_a_device() -> None:
    td = TensorDict(a=torch.zeros(2), batch_size=[2])
    if torch.cuda.is_available():
        assert td.cuda()["a"].device.type == "cuda"
    else:
        with pytest.raises(NotImplementedError, match=r"CUDA"):
            td.cuda()
    assert td.to("cpu", non_blocking=True)["a"].device.type == "cpu"


# -- repr ---------------------------------------------------------------------------------------
def _pair(build_one: Any) -> tuple[Any, Any]:
    return build_one(tdshare), build_one(tensordict)


@pytest.mark.parametrize(
    "case",
    [
        lambda lib: lib.TensorDict(a=torch.zeros(4, 3), n={"b": torch.ones(4, 2, dtype=torch.int64)}, batch_size=[4]),
        lambda lib: lib.TensorDict(
            a=torch.zeros(4, 3),
            n={"b": torch.ones(4, 2), "m": {"c": torch.zeros(4, dtype=torch.uint8)}},
            s="t",
            batch_size=[4],
        ),
        lambda lib: lib.TensorDict(),
        lambda lib: lib.TensorDict(a=torch.zeros(3, 2, 5), b=torch.zeros(3, 2, dtype=torch.bool), batch_size=[3, 2]),
        lambda lib: lib.TensorDict(
            z=torch.zeros(2, dtype=torch.complex64), a=torch.zeros(2, 7), device="cpu", batch_size=[2]
        ),
        lambda lib: lib.TensorDict(n=lib.TensorDict(x=torch.zeros(2, 3), batch_size=[2, 3]), batch_size=[2]),
        lambda lib: lib.TensorDict({f"key_{i}": torch.zeros(2, i) for i in range(8)}, batch_size=[2]),
        lambda lib: lib.LazyStackedTensorDict(
            lib.TensorDict(a=torch.zeros(3), b=torch.zeros(2)), lib.TensorDict(a=torch.zeros(4), c=torch.zeros(1))
        ),
        lambda lib: lib.TensorDict(
            ls=lib.LazyStackedTensorDict(
                lib.TensorDict(a=torch.zeros(2, 3), batch_size=[2]), lib.TensorDict(a=torch.zeros(2, 3), batch_size=[2])
            ),
            batch_size=[2],
        ),
    ],
)
def test_repr_is_the_reference_compact_form(case: Any) -> None:
    mine, theirs = _pair(case)
    assert repr(mine) == repr(theirs)


@pytest.mark.parametrize("kind", KINDS)
def test_repr_of_every_kind(kind: str) -> None:
    assert repr(build(kind)) == repr(ref_build(kind)).replace("RefSample", "Sample")


def test_keys_view_checks_like_the_reference() -> None:
    td = TensorDict(a={"b": {"c": torch.zeros(())}})
    ref = tensordict.TensorDict(a={"b": {"c": torch.zeros(())}})
    for lib_td in (td, ref):
        assert ("a",) in lib_td.keys(include_nested=True) and ("a", "b", "c") in lib_td.keys(include_nested=True)
        assert ("a", "c") not in lib_td.keys(include_nested=True) and "zz" not in lib_td.keys()
        assert ("a", "b") not in lib_td.keys()  # a flat view holds no nested key
        with pytest.raises(TypeError, match=r"TensorDict keys are always strings"):
            42 in lib_td.keys()  # noqa: B015
    assert td.keys(True) == ["a", ("a", "b"), ("a", "b", "c")]


def test_nested_collisions_rename_and_sorted_items() -> None:
    for data in (
        {"a-b-c-d": torch.zeros(3), "a": {"b": {"c": torch.zeros(3)}}},
        {"a-b": torch.zeros(3), "a": {"b": {"c": torch.zeros(3)}}},
    ):
        with pytest.raises(KeyError, match=re.escape("Unflattening key(s) in tensordict will override")):
            TensorDict(data).unflatten_keys("-")
        with pytest.raises(KeyError, match=re.escape("Unflattening key(s) in tensordict will override")):
            tensordict.TensorDict(data).unflatten_keys("-")
        assert sorted(TensorDict(data).flatten_keys("-").keys()) == sorted(
            tensordict.TensorDict(data).flatten_keys("-").keys()
        )
    td = TensorDict(a={"b": {"c": 0}})
    assert td.rename_key_(("a", "b", "c"), ("a", "b"))["a", "b"] == 0
    td = TensorDict(b=torch.ones(()), a={"z": torch.zeros(()), "c": torch.full((), 2.0)})
    ref = tensordict.TensorDict(td.to_dict())
    assert [k for k, _ in td.items(True, True, sort=True)] == [k for k, _ in ref.items(True, True, sort=True)]
    assert [v.item() for v in td.values(True, True, sort=True)] == [v.item() for v in ref.values(True, True, sort=True)]


def test_update_batch_size_and_messages() -> None:
    with pytest.raises(RuntimeError, match=r"update_batch_size"):
        TensorDict(batch_size=(3,)).update(TensorDict(batch_size=(4,)))
    with pytest.raises(RuntimeError, match=r"inplace"):
        TensorDict(batch_size=(3,)).update(TensorDict(batch_size=(4,)), update_batch_size=True, inplace=True)
    td = TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3, 5)}, batch_size=(3,))
    nested = td["n"]
    td.update(TensorDict(a=torch.ones(2), n={"b": torch.ones(2, 1)}, batch_size=(2,)), update_batch_size=True)
    assert td.batch_size == (2,) and td["a"].tolist() == [1.0, 1.0] and td["n"] is nested and td["n"].batch_size == (2,)
    with pytest.raises(KeyError, match=r"was not found"):
        TensorDict(a=torch.zeros(3), batch_size=[3]).update_(b=torch.ones(3))


def test_data_and_grad_views() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    td = TensorDict(a=x, n={"b": torch.randn(3, 4, 5, requires_grad=True)}, batch_size=[3, 4])
    assert td.grad is None and td.data["a"].data_ptr() == x.data_ptr() and not td.data["a"].requires_grad
    td.apply(lambda t: t.sum().backward(), filter_empty=True)
    grads = td.grad
    assert grads is not td.grad and not grads.is_locked and grads["n", "b"].shape == (3, 4, 5)
    td.lock_()
    assert td.grad.is_locked and td.data.is_locked and grads["a"].tolist() == torch.ones(3, 4).tolist()


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_get_of_a_non_tensor_entry_gives_the_wrapper(kind: str) -> None:
    obj, ref = build(kind), ref_build(kind)
    assert type(obj.get("s")).__name__ == type(ref.get("s")).__name__ or kind == "lazy"
    assert obj.get("s") == "text" and obj["s"] == "text" and obj.get_non_tensor("s") == "text"
    assert obj.get("zz", "dflt") == ref.get("zz", "dflt") == "dflt"
    with pytest.raises(KeyError):
        obj["zz"]
    td = TensorDict(s="x", n=tdshare.NonTensorStack("a", "b"), batch_size=[2])
    ref_td = tensordict.TensorDict(s="x", n=tensordict.NonTensorStack("a", "b"), batch_size=[2])
    assert type(td.get("s")).__name__ == type(ref_td.get("s")).__name__ == "NonTensorData"
    assert type(td.get("n")).__name__ == type(ref_td.get("n")).__name__ == "NonTensorStack"
    assert td["s"] == ref_td["s"] == "x" and td.get("n").tolist() == ref_td.get("n").tolist() == ["a", "b"]


def test_entries_set_inside_a_flatten_keys_block_reach_the_tensordict() -> None:
    td = TensorDict(a=torch.zeros(4), n={"b": torch.ones(4)}, batch_size=[4])
    b = td["n", "b"]
    with td.flatten_keys(",") as flat:
        with flat.unflatten_keys(",") as nested:
            assert (nested == td).all()
            nested["new", "data"] = torch.zeros(4)
        assert flat["new,data"].tolist() == [0.0] * 4  # the inner block wrote into `flat`
        flat["n,c"] = torch.full((4,), 3.0)
    assert td["new", "data"].tolist() == [0.0] * 4 and td["n", "c"].tolist() == [3.0] * 4
    assert td["n", "b"] is b  # entries left alone are not written again
    ref = tensordict.TensorDict(a=torch.zeros(4), n={"b": torch.ones(4)}, batch_size=[4])
    with ref.flatten_keys(",") as ref_flat:
        ref_flat["n,c"] = torch.full((4,), 3.0)
    assert ref["n", "c"].tolist() == td["n", "c"].tolist()  # as the reference
    with td.lock_().flatten_keys(",") as flat_of_locked:  # nothing set: nothing written back (no LockedError)
        assert not flat_of_locked.is_locked  # as the reference: the flat copy is not locked
    with pytest.raises(tdshare.LockedError), td.flatten_keys(",") as flat_of_locked:
        flat_of_locked["z"] = torch.zeros(4)  # a new entry cannot reach the locked tensordict
