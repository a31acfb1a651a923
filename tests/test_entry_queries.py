"""Entry queries, ``rename_keys``, ``from_list``, nested keys through tensorclass entries and the
tensorclass class methods: values checked against tensordict 0.15.3 over every container kind."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from _kinds import KINDS, Sample, build

import tdshare
from tdshare import LazyStackedTensorDict, TensorDict

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)


def _ref() -> tensordict.TensorDict:
    return tensordict.TensorDict(a=torch.arange(4.0), n={"b": torch.zeros(4, 2)}, s="text", batch_size=[4])


# -- queries --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_get_at_indexes_the_entry_and_defaults_to_none(kind: str) -> None:
    c, ref = build(kind), _ref()
    for key, idx in [("a", 1), ("a", slice(1, 3)), (("n", "b"), torch.tensor([True, False, True, False]))]:
        assert torch.equal(c.get_at(key, idx), ref.get_at(key, idx))
    assert c.get_at("zz", 0) is None and ref.get_at("zz", 0) is None
    assert c.get_at("zz", 0, "else") == ref.get_at("zz", 0, "else") == "else"
    assert c.get_at(("n", "zz"), 0, default=3) == 3
    assert torch.equal(c.get_at("a", index=2), torch.tensor(2.0))


@pytest.mark.parametrize("kind", KINDS)
def test_get_item_shape_is_stored_shape(kind: str) -> None:
    c, ref = build(kind), _ref()
    for key in ("a", ("n", "b"), "s", "n"):
        assert c.get_item_shape(key) == ref.get_item_shape(key), key
    with pytest.raises(KeyError):
        c.get_item_shape("zz")


def test_get_item_shape_of_a_ragged_lazy_stack_has_minus_one() -> None:
    ours = LazyStackedTensorDict(TensorDict(x=torch.zeros(2, 5)), TensorDict(x=torch.zeros(3, 5)))
    ref = tensordict.lazy_stack(
        [tensordict.TensorDict(x=torch.zeros(2, 5)), tensordict.TensorDict(x=torch.zeros(3, 5))]
    )
    assert ours.get_item_shape("x") == ref.get_item_shape("x") == torch.Size([2, -1, 5])
    ours1 = LazyStackedTensorDict(TensorDict(x=torch.zeros(2)), TensorDict(x=torch.zeros(3)), stack_dim=0)
    assert ours1.get_item_shape("x") == torch.Size([2, -1])


@pytest.mark.parametrize("kind", KINDS)
def test_is_non_tensor_and_non_tensor_items_look_at_the_stored_entry(kind: str) -> None:
    c, ref = build(kind), _ref()
    for key in ("a", "s", "n", ("n", "b")):
        assert c.is_non_tensor(key) == ref.is_non_tensor(key), key
    with pytest.raises(KeyError):
        c.is_non_tensor("zz")
    ours = [(k, v.tolist() if hasattr(v, "tolist") else v.data) for k, v in c.non_tensor_items(True)]
    assert [k for k, _ in ours] == [k for k, _ in ref.non_tensor_items(True)] == ["s"]
    assert ours[0][1] in ("text", ["text"] * 4)


def test_non_tensor_items_of_nested_levels() -> None:
    td = TensorDict(a=torch.zeros(2), s="text", nested=TensorDict(t="more"))
    ref = tensordict.TensorDict(a=torch.zeros(2), s="text", nested=tensordict.TensorDict(t="more"))
    assert [k for k, _ in td.non_tensor_items(True)] == [k for k, _ in ref.non_tensor_items(True)]
    assert [k for k, _ in td.non_tensor_items()] == ["s"] and td.non_tensor_items()[0][1].data == "text"


@pytest.mark.parametrize("kind", KINDS)
def test_size_and_contiguity(kind: str) -> None:
    c, ref = build(kind), _ref()
    assert c.size() == ref.size() and c.size(0) == c.size(-1) == 4
    with pytest.raises(IndexError, match="1 batch dimension"):
        c.size(1)
    assert c.is_contiguous() == (kind != "lazy")
    assert not TensorDict(a=torch.zeros(3, 2).t(), batch_size=[2]).is_contiguous()
    assert tensordict.lazy_stack([ref[0], ref[1]]).is_contiguous() is False


@pytest.mark.parametrize("kind", KINDS)
def test_device_flags_and_device_bookkeeping(kind: str) -> None:
    c = build(kind)
    assert (c.is_cpu, c.is_cuda, c.is_meta) == (False, False, False)  # no device set
    assert c.auto_device_() is c and c.device == torch.device("cpu") and c.is_cpu
    assert c["n"].device == torch.device("cpu")
    assert c.clear_device_() is c and c.device is None and c["n"].device is None
    assert c["a"].device.type == "cpu"
    ref = tensordict.TensorDict(a=torch.zeros(1), n=tensordict.TensorDict(b=torch.zeros(1)), device="cpu")
    assert ref.clear_device_()["n"].device is None
    assert TensorDict(device="meta").is_meta and TensorDict(device="cpu").is_cpu


def test_new_tensor_copies_data_into_each_leaf_s_dtype() -> None:
    kw: dict[str, Any] = {"a": torch.zeros(3), "b": torch.zeros(3, dtype=torch.int64), "batch_size": [3]}
    ours, ref = TensorDict(**kw).new_tensor([1, 2]), tensordict.TensorDict(**kw).new_tensor([1, 2])
    assert ours.batch_size == ref.batch_size == torch.Size([2]) and ours.device == ref.device
    for key in ("a", "b"):
        assert torch.equal(ours[key], ref[key]) and ours[key].dtype == ref[key].dtype
    source = TensorDict(a=torch.ones(2), b=torch.full((2,), 5.0), batch_size=[2])
    out = TensorDict(**kw).new_tensor(source)
    assert out["b"].tolist() == [5, 5] and out["b"].dtype == torch.int64 and out.batch_size == torch.Size([2])
    grad = TensorDict(**kw).new_tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    assert grad["a"].dtype == torch.float64 and grad["a"].requires_grad


@pytest.mark.parametrize(("name", "dtype"), [("complex64", torch.complex64), ("uint16", torch.uint16)])
def test_more_dtype_casts(name: str, dtype: torch.dtype) -> None:
    assert getattr(TensorDict(a=torch.ones(2)), name)()["a"].dtype == dtype
    assert getattr(tensordict.TensorDict(a=torch.ones(2)), name)()["a"].dtype == dtype


def test_to_padded_tensor_pads_nested_leaves_and_refuses_a_mask() -> None:
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
    ours = TensorDict(a=nested, b=torch.ones(2), batch_size=[2]).to_padded_tensor(1.0)
    ref = tensordict.TensorDict(a=nested, b=torch.ones(2), batch_size=[2]).to_padded_tensor(1.0)
    assert torch.equal(ours["a"], ref["a"]) and torch.equal(ours["b"], ref["b"])
    with pytest.raises(RuntimeError, match="mask"):
        TensorDict(a=nested, batch_size=[2]).to_padded_tensor(mask_key="m")


def test_load_and_pin_memory_are_deprecated_aliases(tmp_path: Path) -> None:
    TensorDict(a=torch.ones(3), batch_size=[3]).save(tmp_path / "d")
    td = TensorDict(a=torch.zeros(3), b=torch.zeros(3), batch_size=[3])
    with pytest.warns(DeprecationWarning, match="load_memmap_"):
        assert td.load_(tmp_path / "d") is td
    assert td["a"].tolist() == [1.0, 1.0, 1.0] and list(td.keys()) == ["a"]
    if not torch.cuda.is_available():
        with pytest.warns(DeprecationWarning), pytest.raises(RuntimeError):
            TensorDict(a=torch.ones(1)).pin_memory_()


# -- rename_keys ----------------------------------------------------------------------------------
_RENAMES = [
    {"a": "s", "s": "a"},
    {("n", "b"): "b"},
    {"n": "m"},
    {"a": ("x", "y")},
    {"a": "b2", "b2": "c"},
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mapping", _RENAMES)
def test_rename_keys_matches_the_reference(kind: str, mapping: dict) -> None:
    c = build(kind)
    if kind == "tensorclass" and any(isinstance(v, str) and v not in ("a", "s", "n") for v in mapping.values()):
        c = c.to_tensordict()  # a tensorclass's destinations must be fields
    if kind == "tensorclass" and isinstance(next(iter(mapping.values())), tuple):
        c = c.to_tensordict()
    if kind == "lazy" and mapping == {"a": "b2", "b2": "c"}:
        mapping = {"a": "b2"}
    ref = _ref()
    ours = c.rename_keys(mapping, strict=False)
    theirs = ref.rename_keys(mapping, strict=False)
    assert sorted(map(str, ours.keys(True))) == sorted(map(str, theirs.keys(True)))
    for key in theirs.keys(True):
        if isinstance(theirs.get(key), torch.Tensor):
            assert torch.equal(ours.get(key), theirs.get(key)), key
    assert "a" in c.keys()  # the source is unchanged
    assert not ours.is_locked


def test_rename_keys_shares_leaves_and_removes_only_what_it_empties() -> None:
    td = TensorDict(raw=TensorDict(p=torch.zeros(3), u=torch.ones(3)), e=TensorDict(), batch_size=[])
    out = td.rename_keys({("raw", "p"): "pressure", ("raw", "u"): "velocity"})
    assert sorted(out.keys(True)) == ["e", "pressure", "velocity"] and out["pressure"] is td["raw", "p"]
    deep = TensorDict(a={"b": {"c": torch.zeros(1)}}).rename_keys({("a", "b", "c"): "c"})
    assert list(deep.keys(True)) == ["c"]
    locked = td.clone().lock_()
    assert not locked.rename_keys({"e": "f"}).is_locked and locked.is_locked


@pytest.mark.parametrize(
    ("mapping", "error", "match"),
    [
        ({"a": "q", "s": "q"}, ValueError, "destination more than once"),
        ({"n": "q", ("n", "b"): "r"}, ValueError, "lie inside one another"),
        ({"a": "q", "s": ("q", "r")}, ValueError, "lie inside one another"),
        ({"a": "s"}, ValueError, "already present"),
        ({"s": ("a", "q")}, ValueError, "not a tensordict"),
        ({"zz": "q"}, KeyError, "zz"),
        ({(): "q"}, KeyError, "empty"),
    ],
)
def test_rename_keys_refusals_match_the_reference(mapping: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        build("tensordict").rename_keys(mapping)
    with pytest.raises(error):
        _ref().rename_keys(mapping)


def test_rename_keys_of_a_lazy_stack_removes_a_level_only_when_emptied_in_every_member() -> None:
    members = [TensorDict(x=torch.zeros(2), n=TensorDict(p=1)), TensorDict(x=torch.zeros(2), n=TensorDict(p=2, q=3))]
    ours = LazyStackedTensorDict(*members).rename_keys({("n", "p"): "p"})
    ref = tensordict.lazy_stack(
        [
            tensordict.TensorDict(x=torch.zeros(2), n=tensordict.TensorDict(p=1)),
            tensordict.TensorDict(x=torch.zeros(2), n=tensordict.TensorDict(p=2, q=3)),
        ]
    ).rename_keys({("n", "p"): "p"})
    assert sorted(ours.keys()) == sorted(ref.keys()) == ["n", "p", "x"]
    assert ours["p"].tolist() == [1, 2]
    emptied = LazyStackedTensorDict(TensorDict(n=TensorDict(p=1)), TensorDict(n=TensorDict(p=2))).rename_keys(
        {("n", "p"): "p"}
    )
    assert list(emptied.keys()) == ["p"]


# -- from_list ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"auto_batch_size": True}, {"batch_size": [2, 3], "names": ["x", "y"]}, {"batch_dims": 2}, {"lazy": True}],
)
def test_from_list_matches_the_reference(kwargs: dict) -> None:
    rows = [{"a": torch.zeros(3, 4), "s": "x"}, {"a": torch.ones(3, 4), "s": "y"}]
    ours, ref = TensorDict.from_list(rows, **kwargs), tensordict.TensorDict.from_list(rows, **kwargs)
    assert type(ours).__name__ == type(ref).__name__ and ours.batch_size == ref.batch_size
    assert torch.equal(ours["a"], ref["a"]) and ours["s"] == ref["s"]
    assert ours.names == ref.names


def test_from_list_stacks_ragged_rows_lazily_and_checks_the_batch_size() -> None:
    ragged = TensorDict.from_list([{"a": torch.zeros(3)}, {"a": torch.ones(4)}])
    assert isinstance(ragged, LazyStackedTensorDict) and ragged[1]["a"].tolist() == [1.0] * 4
    with pytest.raises(ValueError, match="length of the list"):
        TensorDict.from_list([{"a": torch.zeros(3)}, {"a": torch.ones(3)}], batch_size=[3])
    with pytest.raises(ValueError, match="at least one"):
        TensorDict.from_list([])
    dense = TensorDict.from_list([TensorDict(a=torch.zeros(3), batch_size=[3])] * 2, device="cpu")
    assert dense.batch_size == torch.Size([2, 3]) and dense.device == torch.device("cpu")


# -- nested keys through a tensorclass entry ------------------------------------------------------
def test_nested_keys_run_through_a_tensorclass_entry() -> None:
    inner = Sample(a=torch.ones(4), n=TensorDict(b=torch.zeros(4, 2), batch_size=[4]), s="in", batch_size=[4])
    td = TensorDict(y=inner, batch_size=[4])
    ref_inner = tensordict.TensorDict(a=torch.ones(4), n={"b": torch.zeros(4, 2)}, s="in", batch_size=[4])
    assert torch.equal(td["y", "a"], torch.ones(4)) and td.get(("y", "zz")) is None
    td["y", "a"] = torch.full((4,), 2.0)
    td.set_(("y", "n", "b"), torch.ones(4, 2))
    td.set_at_(("y", "a"), 5.0, 1)
    assert inner.a.tolist() == [2.0, 5.0, 2.0, 2.0] and inner.n["b"].sum() == 8
    assert ("y", "a") in td.keys(True) and ("y", "n", "b") in td.keys(True, True)
    ref = tensordict.TensorDict(y=ref_inner, batch_size=[4])
    assert {k for k in td.keys(True) if k != ("y", "s")} >= {k for k in ref.keys(True) if k != ("y", "s")}
    assert sorted(td.state_dict()) == ["y.a", "y.n.b"]
    with pytest.raises(AttributeError, match="not a field"):
        td.set(("y", "zz"), torch.zeros(4))


# -- tensorclass class methods and constructor ----------------------------------------------------
def test_tensorclass_class_methods_return_the_class() -> None:
    c = build("tensorclass")
    for name in ("stack", "cat", "lazy_stack", "maybe_dense_stack"):
        out = getattr(Sample, name)([c, c])
        assert type(out) is Sample, name
    assert Sample.stack([c, c]).batch_size == torch.Size([2, 4]) and Sample.cat([c, c]).batch_size == torch.Size([8])
    back = Sample.from_dict(c.to_dict(), auto_batch_size=True)
    assert type(back) is Sample and back.batch_size[0] == 4 and (back == c).all() and back.s == "text"
    rows = Sample.from_list([c[0].to_dict(), c[1].to_dict()])
    assert type(rows) is Sample and rows.a.tolist() == [0.0, 1.0]
    keys = Sample.fromkeys(["a", "s"], 0)
    assert type(keys) is Sample and keys.a.item() == 0


def test_tensorclass_update_takes_fields_as_keywords_and_merges_nested_dicts() -> None:
    c = build("tensorclass")
    assert c.update() is c and c.update_() is c
    c.update(a=torch.ones(4))
    assert c.a.tolist() == [1.0] * 4
    c.update({"n": {"b": torch.ones(4, 2)}}, s="new")
    assert c.n["b"].sum() == 8 and c.s == "new"
    c.update_(a=torch.full((4,), 3.0))
    assert c.a.tolist() == [3.0] * 4
    with pytest.raises(AttributeError, match="not a field"):
        c.update({"zz": torch.zeros(4)})


def test_tensorclass_signature_lists_the_fields_then_the_constructor_keywords() -> None:
    @tdshare.tensorclass
    class Point:
        x: torch.Tensor
        y: torch.Tensor
        tag: str = "p"

    @tensordict.tensorclass
    class RefPoint:
        x: torch.Tensor
        y: torch.Tensor
        tag: str = "p"

    assert list(inspect.signature(Point).parameters) == list(inspect.signature(RefPoint).parameters)
    assert inspect.signature(Point).parameters["tag"].default == "p"
    with pytest.raises(TypeError, match="missing 2 required positional arguments"):
        Point()
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        Point(x=torch.zeros(1))


def test_tensorclass_select_as_tensordict_gives_a_tensordict() -> None:
    c = build("tensorclass")
    assert type(c.select("a", as_tensordict=True)) is TensorDict and type(c.select("a")) is Sample


def test_non_tensor_entries_are_leaves() -> None:
    ours = TensorDict(a=torch.zeros(3), s="x", n=TensorDict(t="y", b=torch.zeros(3), batch_size=[3]), batch_size=[3])
    assert sorted(map(str, ours.keys(True, True))) == ["('n', 'b')", "('n', 't')", "a", "s"]
    ref = tensordict.TensorDict(
        a=torch.zeros(3), s="x", n=tensordict.TensorDict(t="y", b=torch.zeros(3), batch_size=[3]), batch_size=[3]
    )
    assert sorted(map(str, ref.keys(True, True))) == ["('n', 'b')", "a"]  # the difference the README states


# -- from_schema ----------------------------------------------------------------------------------
_SCHEMA = {"obs": ([4, 4], torch.float32), "action": ([2], torch.int64), "reward": ([], torch.float32)}


@pytest.mark.parametrize("storage", [None, "memmap", "shared"])
def test_from_schema_allocates_zeros_in_the_storage_asked_for(storage: str | None, tmp_path: Path) -> None:
    kwargs = {"prefix": str(tmp_path / "buf")} if storage == "memmap" else {}
    ours = TensorDict.from_schema(_SCHEMA, batch_size=[8], storage=storage, **kwargs)
    ref_kwargs = {"prefix": str(tmp_path / "ref")} if storage == "memmap" else {}
    ref = tensordict.TensorDict.from_schema(_SCHEMA, batch_size=[8], storage=storage, **ref_kwargs)
    for key in _SCHEMA:
        assert ours[key].shape == ref[key].shape and ours[key].dtype == ref[key].dtype and (ours[key] == 0).all()
    assert ours.is_memmap() == ref.is_memmap() == (storage == "memmap")
    assert ours.is_shared() == (storage == "shared")
    ours[0] = TensorDict(obs=torch.ones(4, 4), action=torch.ones(2, dtype=torch.int64), reward=torch.tensor(1.0))
    assert (ours[0]["obs"] == 1).all() and (ours[1]["obs"] == 0).all()
    if storage == "memmap":
        back = TensorDict.load_memmap(tmp_path / "buf")
        assert (
            back["action"][0].tolist() == [1, 1]
            and tensordict.TensorDict.load_memmap(tmp_path / "buf")["obs"].sum() == 16
        )


def test_from_schema_refusals() -> None:
    with pytest.raises(ValueError, match="Unknown storage backend"):
        TensorDict.from_schema(_SCHEMA, storage="foobar")
    with pytest.raises(ValueError, match="Unknown storage backend"):
        tensordict.TensorDict.from_schema(_SCHEMA, storage="foobar")
    with pytest.raises(NotImplementedError, match="h5"):
        TensorDict.from_schema(_SCHEMA, storage="h5", filename="x.h5")
    with pytest.raises(TypeError, match="pair"):
        TensorDict.from_schema({"x": [3]})  # type: ignore[dict-item]
    assert tdshare.TensorDictBase.from_schema({"x": ([3], torch.float32)}, batch_size=[2])["x"].shape == (2, 3)


@pytest.mark.parametrize("as_td", [False, True])
def test_make_tensordict_matches_the_reference(as_td: bool) -> None:
    entries = {"a": {"b": torch.randn(3, 4), "c": torch.randn(3, 4, 5)}, "d": torch.randn(3)}
    source: Any = TensorDict(entries, []) if as_td else entries
    ref_source: Any = tensordict.TensorDict(entries, []) if as_td else entries
    ours, ref = (
        tdshare.make_tensordict(source, auto_batch_size=True),
        tensordict.make_tensordict(ref_source, auto_batch_size=True),
    )
    assert ours.batch_size == ref.batch_size == torch.Size([3]) and ours["a"].batch_size == ref["a"].batch_size
    assert torch.equal(ours["a", "c"], entries["a"]["c"])
    assert tdshare.make_tensordict(a=torch.zeros(3, 4)).batch_size == torch.Size([])
    assert tdshare.make_tensordict(a=torch.zeros(3, 4), batch_size=3).batch_size == torch.Size([3])
    both = tdshare.make_tensordict({"a": torch.ones(2)}, a=torch.zeros(2), b=torch.zeros(2))
    assert both["a"].tolist() == [1.0, 1.0] and sorted(both.keys()) == ["a", "b"]


# -- the reference's private helpers, device examples and names ------------------------------------
def test_private_apply_and_flags_behave_as_the_reference() -> None:
    td = TensorDict(a=torch.ones(2), n={"b": torch.ones(2)}, batch_size=[2])
    ref = tensordict.TensorDict(a=torch.ones(2), n={"b": torch.ones(2)}, batch_size=[2])
    ours, theirs = td._fast_apply(lambda t: t * 3), ref._fast_apply(lambda t: t * 3)
    assert torch.equal(ours["n", "b"], theirs["n", "b"])
    named = td._fast_apply(lambda k, t: t + len(k), named=True, nested_keys=True)
    assert named["n", "b"].tolist() == [3.0, 3.0] and named["a"].tolist() == [2.0, 2.0]
    assert not td._has_non_tensor and TensorDict(n=TensorDict(s="x"))._has_non_tensor
    assert tensordict.TensorDict(n=tensordict.TensorDict(s="x"))._has_non_tensor
    assert TensorDict(a=torch.zeros(1), device="cpu")._check_device() is True


def test_to_takes_an_example_tensordict() -> None:
    td = TensorDict(a=torch.zeros(2), b=torch.zeros(2, dtype=torch.int64), batch_size=[2])
    one = td.to(other=TensorDict({"a": torch.randn(3, dtype=torch.half)}, [], device="cpu"))
    assert one.device == torch.device("cpu") and {t.dtype for t in one.values()} == {torch.half}
    many = td.to(TensorDict({"a": torch.zeros(1, dtype=torch.half), "b": torch.zeros(1)}, [], device="cpu"))
    assert many.device == torch.device("cpu") and many["b"].dtype == torch.int64


def test_an_index_tensor_of_two_dims_leaves_its_dims_unnamed_and_keeps_the_others() -> None:
    index = torch.tensor([[0, 1, 2], [1, 2, 0], [2, 0, 1]])
    for lib in (tdshare, tensordict):
        td = lib.TensorDict(a=torch.zeros(4, 3, 2), batch_size=[4, 3, 2], names=["a", "b", "c"])
        assert td[:, index].names == ["a", None, None, "c"] and td[0, index].names == [None, None, "c"]
        assert td[:, index].shape == (4, 3, 3, 2) and td[:, torch.tensor([0, 2])].names == ["a", "b", "c"]
