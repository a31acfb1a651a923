"""The TensorDict surface added for the reference's test_generic.py: values checked against
tensordict 0.15.3 (issue 16)."""

from __future__ import annotations

import dataclasses
import warnings
from collections import UserDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensordict
import torch
from _kinds import KINDS, build

import tdshare
from tdshare import LazyStackedTensorDict, NonTensorData, TensorDict

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)


def _ref_td(**kwargs: Any) -> tensordict.TensorDict:
    return tensordict.TensorDict(**kwargs)


# -- get ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_get_of_a_missing_key_gives_none_and_indexing_raises(kind: str) -> None:
    c = build(kind)
    assert c.get("zz") is None and c.get("zz", 3) == 3
    assert c.get(("n", "zz")) is None
    with pytest.raises(tdshare.MissingKeyError, match="zz"):
        c["zz"]
    ref = tensordict.TensorDict(a=torch.zeros(4), n={"b": torch.zeros(4, 2)}, batch_size=[4])
    assert ref.get("zz") is None and ref.get(("n", "zz")) is None


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_get_through_a_tensor_raises_a_value_error_as_the_reference(kind: str) -> None:
    c = build(kind)
    with pytest.raises(tdshare.InvalidArgumentError, match=r"'a' is a .*'q'") as info:
        c.get(("a", "q"))
    assert isinstance(info.value, ValueError)
    assert c.get(("a", "q"), 7) == 7
    ref = tensordict.TensorDict(a=torch.zeros(4), batch_size=[4])
    with pytest.raises(ValueError):
        ref.get(("a", "q"))


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_items_give_non_tensor_entries_as_stored(kind: str) -> None:
    c = build(kind)
    ours = {k: type(v).__name__ for k, v in c.items() if k != "n"}
    ref = tensordict.TensorDict(a=torch.zeros(4), n={"b": torch.zeros(4, 2)}, s="text", batch_size=[4])
    theirs = {k: type(v).__name__ for k, v in ref.items() if k != "n"}
    assert ours == theirs == {"a": "Tensor", "s": "NonTensorData"}
    assert tdshare.is_non_tensor(dict(c.items())["s"]) and dict(c.items())["s"].data == "text"
    assert [type(v).__name__ for v in c.values()][-1] == "NonTensorData"


# -- module-level helpers -------------------------------------------------------------------------
def test_is_non_tensor_matches_the_reference() -> None:
    td = TensorDict(a=torch.zeros(2), s="x", t=tdshare.NonTensorStack("p", "q"), batch_size=[2])
    ref = tensordict.TensorDict(a=torch.zeros(2), s="x", t=tensordict.NonTensorStack("p", "q"), batch_size=[2])
    for key in ("a", "s", "t"):
        assert tdshare.is_non_tensor(td.get(key)) == tensordict.is_non_tensor(ref.get(key))
    assert not tdshare.is_non_tensor(td["s"]) and not tdshare.is_non_tensor(td)


def test_assert_close_compares_nested_and_lazy_trees() -> None:
    a = TensorDict(x=torch.zeros(3), n={"y": torch.ones(3)}, s="q", batch_size=[3])
    assert tdshare.assert_close(a, a.clone()) is True and tdshare.assert_allclose_td is tdshare.assert_close
    b = a.clone()
    b["n", "y"] += 1
    with pytest.raises(AssertionError, match=r"\('n', 'y'\).*mse = 1.0000"):
        tdshare.assert_close(a, b)
    ref_a = tensordict.TensorDict(x=torch.zeros(3), n={"y": torch.ones(3)}, batch_size=[3])
    ref_b = ref_a.clone()
    ref_b["n", "y"] += 1
    with pytest.raises(AssertionError, match=r"mse = 1\.0000"):
        tensordict.assert_close(ref_a, ref_b)
    with pytest.raises(tdshare.MissingKeyError, match="intersection"):
        tdshare.assert_close(a, a.exclude("x"))
    assert tdshare.assert_close(a, a.exclude("x"), intersection=True)
    ragged = tdshare.lazy_stack([TensorDict(v=torch.zeros(2)), TensorDict(v=torch.zeros(3))])
    assert tdshare.assert_close(ragged, ragged.clone())
    with pytest.raises(tdshare.ArgumentTypeError):
        tdshare.assert_close(torch.zeros(1), a)


@pytest.mark.parametrize(
    "index", [..., (0, ..., 0), (..., 0), (0, ...), (slice(1, 2), ...), (None, ..., 1), (torch.ones(3, 4).bool(), ...)]
)
def test_convert_ellipsis_to_idx_matches_the_reference(index: Any) -> None:
    from tensordict.utils import convert_ellipsis_to_idx

    ours = tdshare.convert_ellipsis_to_idx(index, [3, 4, 5, 6, 7])
    theirs = convert_ellipsis_to_idx(index, [3, 4, 5, 6, 7])
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs, strict=True):
        assert (o == t).all() if isinstance(o, torch.Tensor) else o == t


@pytest.mark.parametrize("index", [(..., 0, ...), (0, ..., 0, ...), (0, 0, 0, 0, 0, 0, ...)])
def test_convert_ellipsis_to_idx_refuses_what_the_reference_refuses(index: Any) -> None:
    from tensordict.utils import convert_ellipsis_to_idx

    with pytest.raises(RuntimeError):
        convert_ellipsis_to_idx(index, [3, 4, 5, 6, 7])
    with pytest.raises(tdshare.BatchSizeError):
        tdshare.convert_ellipsis_to_idx(index, [3, 4, 5, 6, 7])
    assert tdshare.convert_ellipsis_to_idx(3, [2]) == 3


def test_set_lazy_legacy_switches_and_restores() -> None:
    assert tdshare.lazy_legacy() is False

    @tdshare.set_lazy_legacy(False)
    def permuted() -> torch.Size:
        return TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3]).permute(1, 0).batch_size

    assert permuted() == torch.Size([3, 2])
    with tdshare.set_lazy_legacy(True):
        assert tdshare.lazy_legacy() is True
    assert tdshare.lazy_legacy() is False
    with pytest.raises(tdshare.ArgumentTypeError):
        tdshare.set_lazy_legacy(1)  # type: ignore[arg-type]


# -- layout and dtype copies ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_contiguous_copies_only_what_needs_it(kind: str) -> None:
    c = build(kind)
    out = c.contiguous()
    assert torch.equal(out["a"], c["a"]) and out["a"].is_contiguous()
    assert out["s"] == "text"
    strided = TensorDict(a=torch.arange(20.0).view(4, 5)[:, ::2], batch_size=[4])
    ref = tensordict.TensorDict(a=torch.arange(20.0).view(4, 5)[:, ::2], batch_size=[4])
    ptr = strided["a"].data_ptr()
    same = strided.contiguous(inplace=True)
    assert same is strided and strided["a"].is_contiguous() and strided["a"].data_ptr() != ptr
    assert torch.equal(strided["a"], ref.contiguous(inplace=True)["a"])


def test_contiguous_canonical_matches_the_reference() -> None:
    base = torch.arange(20.0).view(1, 4, 5)
    odd = base.as_strided((1, 4, 5), (5, 5, 1))  # is_contiguous() holds, the strides are not row-major
    ours = TensorDict(x=odd, n={"y": odd}, batch_size=[]).contiguous(canonical=True)
    theirs = tensordict.TensorDict(x=odd, n={"y": odd}, batch_size=[]).contiguous(canonical=True)
    assert ours["x"].stride() == theirs["x"].stride() == (20, 5, 1)
    assert ours["n", "y"].stride() == theirs["n", "y"].stride()
    assert torch.equal(ours["x"], odd) and ours["x"].data_ptr() != odd.data_ptr()
    kept = TensorDict(x=odd, batch_size=[]).contiguous()
    assert kept["x"].data_ptr() == odd.data_ptr() and kept["x"].stride() == (5, 5, 1)


def test_contiguous_inplace_of_a_lazy_stack_raises_as_the_reference() -> None:
    ls = build("lazy")
    with pytest.raises(tdshare.NotSupportedError, match="contiguous") as info:
        ls.contiguous(inplace=True)
    assert isinstance(info.value, NotImplementedError)
    ref = tensordict.lazy_stack([tensordict.TensorDict(x=torch.zeros(2), batch_size=[2])] * 2)
    with pytest.raises(NotImplementedError, match="contiguous"):
        ref.contiguous(inplace=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("name", "dtype"), [("float", torch.float32), ("double", torch.float64), ("int", torch.int32), ("bool", torch.bool)]
)
def test_dtype_casts(kind: str, name: str, dtype: torch.dtype) -> None:
    c = build(kind, offset=1.0)
    out = getattr(c, name)()
    assert out["a"].dtype == dtype and out["n", "b"].dtype == dtype and out["s"] == "text"
    ref = tensordict.TensorDict(a=torch.arange(4.0) + 1, s="text", batch_size=[4])
    assert torch.equal(out["a"], getattr(ref, name)()["a"])


def test_empty_recurse_keeps_the_nested_levels() -> None:
    source = {"a": torch.zeros(()), ("b", "c"): torch.zeros(()), ("b", "d", "e"): torch.zeros(())}
    ours, theirs = TensorDict(source, []), tensordict.TensorDict(source, [])
    assert list(ours.empty().keys()) == list(theirs.empty().keys()) == []
    assert sorted(ours.empty(recurse=True).keys(True), key=str) == sorted(
        theirs.empty(recurse=True).keys(True), key=str
    )
    assert isinstance(build("lazy").empty(recurse=True), LazyStackedTensorDict)


# -- combining ------------------------------------------------------------------------------------
def test_stack_and_cat_write_into_out_and_keep_names_only_when_they_agree() -> None:
    td = TensorDict(a=torch.arange(3.0), batch_size=[3], names=["x"])
    out = TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3])
    assert TensorDict.stack([td, td + 1], out=out) is out
    assert out["a"].tolist() == [[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]
    cat_out = TensorDict(a=torch.zeros(6), batch_size=[6])
    torch.cat([td, td], out=cat_out)
    assert cat_out["a"].tolist() == [0.0, 1.0, 2.0] * 2
    other = td.clone()
    other.names = ["y"]
    ref = tensordict.TensorDict(a=torch.arange(3.0), batch_size=[3], names=["x"])
    ref_other = ref.clone()
    ref_other.names = ["y"]
    assert torch.stack([td, other]).names == torch.stack([ref, ref_other]).names == [None, None]
    assert torch.stack([td, td], 1).names == torch.stack([ref, ref], 1).names == ["x", None]


def test_cat_and_stack_from_tensordict_match_the_reference() -> None:
    source = {"a": torch.zeros(3, 4), "b": {"c": torch.ones(3, 4)}}
    ours, theirs = TensorDict(source, batch_size=[3, 4]), tensordict.TensorDict(source, batch_size=[3, 4])
    assert torch.equal(ours.cat_from_tensordict(dim=1), theirs.cat_from_tensordict(dim=1))
    assert torch.equal(ours.stack_from_tensordict(dim=1), theirs.stack_from_tensordict(dim=1))
    order = [("b", "c"), "a"]
    assert torch.equal(ours.cat_from_tensordict(sorted=order), theirs.cat_from_tensordict(sorted=order))
    with pytest.raises(tdshare.MissingKeyError, match="leaf keys"):
        ours.cat_from_tensordict(sorted=["a"])


def test_separates_matches_the_reference() -> None:
    def make(module: Any) -> Any:
        return module.TensorDict(a=0, b=module.TensorDict(c=0, d=0), unique=module.TensorDict(val=0))

    for kwargs in ({}, {"filter_empty": False}):
        ours, theirs = make(tdshare), make(tensordict)
        got = ours.separates("a", ("b", ("d",)), "e", ("unique", "val"), default=None, **kwargs)
        want = theirs.separates("a", ("b", ("d",)), "e", ("unique", "val"), default=None, **kwargs)
        assert sorted(got.keys(True), key=str) == sorted(want.keys(True), key=str)
        assert sorted(ours.keys(True), key=str) == sorted(theirs.keys(True), key=str)
        assert got["e"] is None and want["e"] is None
    td = make(tdshare)
    with pytest.raises(tdshare.MissingKeyError, match="'e'"):
        td.separates("a", "e")
    assert "a" in td  # checked before anything moved


def test_update_batch_size_refusals_match_the_reference() -> None:
    for module, locked_error in ((tdshare, tdshare.LockedError), (tensordict, RuntimeError)):
        td0, td1 = module.TensorDict(batch_size=(3,), lock=True), module.TensorDict(batch_size=(4,))
        with pytest.raises(locked_error, match="lock"):
            td0.update(td1, update_batch_size=True)
        a = module.TensorDict(a=torch.zeros(3), batch_size=(3,))
        b = module.TensorDict(a=torch.ones(4), batch_size=(4,))
        with pytest.raises(RuntimeError, match="keys_to_update"):
            a.update(b, update_batch_size=True, keys_to_update=[("a",)])
        assert a.update(b, update_batch_size=True).batch_size == (4,)


# -- moving and writing ---------------------------------------------------------------------------
def test_to_same_device_is_self_and_inplace_keeps_the_levels() -> None:
    td = TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)}, batch_size=[2], device="cpu")
    ref = tensordict.TensorDict(a=torch.zeros(2), batch_size=[2], device="cpu")
    assert (td.to("cpu") is td) == (ref.to("cpu") is ref) == True  # noqa: E712
    nested = td["n"]
    moved = td.to(torch.float64, inplace=True)
    assert moved is td and td["n"] is nested and td["n", "b"].dtype == torch.float64
    assert td.to("cpu", inplace=True) is td


def test_a_consolidated_tensordict_moves_as_one_storage() -> None:
    td = TensorDict(a=torch.zeros(1, 1), b={"c": torch.ones(1, 1)}, batch_size=[1], device="cpu").consolidate()
    same = td.to("cpu")
    assert same is td and same.is_consolidated() and same.is_locked
    moved = td.to("meta")
    assert moved.is_consolidated() and moved.is_locked and moved.device == torch.device("meta")
    assert moved["b", "c"].device == torch.device("meta")
    assert moved["b", "c"].untyped_storage().nbytes() == moved["a"].untyped_storage().nbytes()
    moved.unlock_()
    assert not moved.is_consolidated()


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_set_at_and_set_non_blocking(kind: str) -> None:
    c = build(kind)
    c.set_at_(("n", "b"), torch.full((2,), 5.0, dtype=torch.float64), 2)
    assert c["n", "b"][2].tolist() == [5.0, 5.0] and c["n", "b"].sum().item() == 10.0
    ref = tensordict.TensorDict(n={"b": torch.zeros(4, 2)}, batch_size=[4])
    ref.set_at_(("n", "b"), torch.full((2,), 5.0, dtype=torch.float64), 2)
    assert torch.equal(ref["n", "b"], c["n", "b"])
    with pytest.raises(tdshare.MissingKeyError, match="not found in TensorDict with keys"):
        c.set_at_("zz", 1.0, 0)
    td = TensorDict(a=torch.zeros(2), batch_size=[2])
    assert td.set("a", torch.ones(2), inplace=True, non_blocking=False)["a"].tolist() == [1.0, 1.0]
    with pytest.raises(tdshare.MissingKeyError, match="not found in TensorDict with keys"):
        td.set_("zz", torch.ones(2))


def test_tolist_first_matches_the_reference() -> None:
    def make(module: Any) -> Any:
        inner = module.TensorDict(c=torch.arange(12).reshape(2, 3, 2), batch_size=(2, 3, 2))
        return module.TensorDict(a=torch.arange(24).view(2, 3, 4), b=inner, batch_size=(2, 3))

    for first in (True, False):
        ours, theirs = make(tdshare).tolist(tolist_first=first), make(tensordict).tolist(tolist_first=first)
        assert str(ours) == str(theirs)


def test_permute_refuses_more_dims_than_the_batch() -> None:
    td = TensorDict(a=torch.zeros(4, 5, 6, 7), batch_size=(4, 5, 6))
    for dims in [(1, 1, 0), (3, 2, 1, 0), (2, 3, 0)]:
        with pytest.raises(ValueError):
            td.permute(*dims)
        with pytest.raises(ValueError):
            tensordict.TensorDict(a=torch.zeros(4, 5, 6, 7), batch_size=(4, 5, 6)).permute(*dims)


@pytest.mark.parametrize("how", ["share_memory_", "memmap_"])
def test_views_keep_the_shared_or_mapped_status(how: str, tmp_path: Path) -> None:
    ours = TensorDict(a=torch.zeros(3, 4), batch_size=[3, 4])
    theirs = tensordict.TensorDict(a=torch.zeros(3, 4), batch_size=[3, 4])
    args = (str(tmp_path / "ours"),) if how == "memmap_" else ()
    getattr(ours, how)(*args)
    getattr(theirs, how)(*((str(tmp_path / "theirs"),) if args else ()))
    check = "is_shared" if how == "share_memory_" else "is_memmap"
    for op in (lambda t: t.unbind(1)[0], lambda t: t.split(1, 0)[0], lambda t: t.view(-1), lambda t: t.permute(1, 0)):
        assert getattr(op(ours), check)() == getattr(op(theirs), check)() == True  # noqa: E712
        assert op(ours).is_locked == op(theirs).is_locked
    assert getattr(ours.clone(), check)() is False


def test_memmap_like_zeroes_every_kind(tmp_path: Path) -> None:
    a = TensorDict({"a": torch.ones(1)}, [])
    b = TensorDict({"b": torch.ones(1)}, [])
    stacked = tdshare.lazy_stack([a, b]).expand(10, 2)
    like = stacked.memmap_like(prefix=str(tmp_path / "like"))
    assert isinstance(like, LazyStackedTensorDict) and like.batch_size == (10, 2) and like.is_memmap()
    loaded = LazyStackedTensorDict.load_memmap(str(tmp_path / "like"))
    assert (loaded == like).all() and (loaded[:, 0] == a.zero_()).all()
    plain = TensorDict(x=torch.ones(3), s="keep", batch_size=[3]).memmap_like()
    assert plain["x"].tolist() == [0.0, 0.0, 0.0] and plain["s"] == "keep" and plain.is_locked


# -- conversions from other objects ---------------------------------------------------------------
@dataclasses.dataclass
class _Point:
    a: int


def test_from_any_matches_the_reference() -> None:
    def tree(module: Any) -> Any:
        named = module.TensorDict({"two": torch.ones(1) * 2}).to_namedtuple()
        return (
            [[-1, 0, 1], [2, 3, 4]],
            {"tensor": torch.arange(2.0), "td": module.TensorDict({"one": 1}), "tuple": (1, 2, 3)},
            {"named_tuple": named},
            {"dataclass": _Point(a=0)},
        )

    ours, theirs = TensorDict.from_any(tree(tdshare)), tensordict.TensorDict.from_any(tree(tensordict))
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    for key in theirs.keys(True, True):
        assert torch.equal(ours[key], theirs[key])
    assert TensorDict.from_any(UserDict(a=0))["a"].dtype == tensordict.TensorDict.from_any(UserDict(a=0))["a"].dtype
    ragged = torch.randn(3, 4, 5).tolist()
    assert isinstance(TensorDict.from_any(ragged), torch.Tensor)
    ragged[0][1].extend([0, 2])
    assert isinstance(TensorDict.from_any(ragged), tdshare.NonTensorStack)
    assert TensorDict.from_any("plain") == "plain"
    assert TensorDict.from_tuple((torch.zeros(2), torch.ones(2))).keys() == ["0", "1"]
    auto = TensorDict.from_dataclass(_Point(a=torch.zeros(3)), auto_batch_size=True)  # type: ignore[arg-type]
    assert auto.batch_size == (3,)
    with pytest.raises(tdshare.ArgumentTypeError):
        TensorDict.from_dataclass(_Point)


def test_struct_arrays_round_trip_and_share_memory() -> None:
    x = np.array([("Rex", 9, 81.0), ("Fido", 3, 27.0)], dtype=[("name", "U10"), ("age", "i4"), ("weight", "f4")])
    ours, theirs = TensorDict.from_struct_array(x), tensordict.TensorDict.from_struct_array(x.copy())
    assert ours.batch_size == theirs.batch_size == (2,)
    assert ours["name"] == list(theirs["name"]) == ["Rex", "Fido"]
    assert (ours.to_struct_array() == x).all() and (theirs.to_struct_array() == x).all()
    x["age"] += 1
    assert ours["age"].tolist() == [10, 4]
    nested = np.array(
        [("Alice", 25, (88.5, 92.0)), ("Bob", 30, (85.0, 88.0))],
        dtype=[("Name", "U10"), ("Age", "i4"), ("Grades", [("Math", "f4"), ("Science", "f4")])],
    )
    td = TensorDict.from_struct_array(nested)
    assert td["Grades", "Math"].tolist() == [88.5, 85.0] and (td.to_struct_array() == nested).all()
    scalar = np.array(("Rex", 9, 81.0), dtype=x.dtype)
    assert TensorDict.from_struct_array(scalar).batch_size == ()
    with pytest.raises(tdshare.ArgumentTypeError):
        TensorDict.from_struct_array(np.zeros(3))
    with pytest.raises(tdshare.InvalidArgumentError, match="non-string"):
        TensorDict(o=NonTensorData(3), batch_size=[]).to_struct_array()


def test_non_tensor_values_on_their_own_take_shape_operations() -> None:
    for module in (tdshare, tensordict):
        assert module.NonTensorData(0, batch_size=()).flatten().tolist() == [0]
    ours, theirs = tdshare.NonTensorStack("a", "b", "c", "d"), tensordict.NonTensorStack("a", "b", "c", "d")
    assert ours.view(2, 2).tolist() == list(map(list, theirs.view(2, 2).tolist())) == [["a", "b"], ["c", "d"]]
    assert ours.unsqueeze(0).batch_size == theirs.unsqueeze(0).batch_size == (1, 4)
    assert ours.repeat(2).tolist() == list(theirs.repeat(2).tolist())
    assert ours.repeat_interleave(2, dim=0).tolist() == list(theirs.repeat_interleave(2, dim=0).tolist())
    spread = tdshare.NonTensorData(0, batch_size=(1,)).expand(2, 3)
    assert spread.shape == (2, 3) and spread.tolist() == [[0, 0, 0], [0, 0, 0]]
    assert ours.reshape(4, 1).transpose(0, 1).tolist() == [["a", "b", "c", "d"]]


# -- == and != with other objects -----------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("other", ["z", None, [0.0, 1.0, 2.0, 3.0], object()], ids=["str", "None", "list", "object"])
def test_a_collection_is_not_equal_to_an_object_it_cannot_compare_with(kind: str, other: Any) -> None:
    """As in the reference: ``td == "z"`` is False and ``td != "z"`` True (a TensorDict of bools before)."""
    c = build(kind)
    assert (c == other) is False and (c != other) is True
    ref = tensordict.TensorDict(a=torch.arange(4.0), batch_size=[4])
    assert (ref == other) is False and (ref != other) is True


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_a_collection_compares_with_a_dict_of_its_values(kind: str) -> None:
    c = build(kind).exclude("s")
    assert bool((c == c.to_dict()).all()) and not bool((c != c.to_dict()).any())
    zeros = c.clone().zero_().to_dict()
    assert bool((c != zeros).any()) and (c == zeros)["a"].tolist() == [True, False, False, False]
    ref = tensordict.TensorDict(a=torch.arange(4.0), n={"b": torch.zeros(4, 2)}, batch_size=[4])
    assert (ref == {"a": torch.zeros(4), "n": {"b": torch.zeros(4, 2)}})["a"].tolist() == [True, False, False, False]
    with pytest.raises(tdshare.MissingKeyError, match="'n'"):
        c == {"a": torch.zeros(4)}  # noqa: B015


def test_a_tensordict_compares_with_a_tensorclass_key_by_key() -> None:
    td, tc = build("tensordict"), build("tensorclass")
    assert bool((td == tc).all()) and not bool((td != tc).any())
    assert (td == build("tensorclass", 1.0))["a"].tolist() == [False] * 4


# -- set, apply and messages the reference's tests match ----------------------------------------
@pytest.mark.parametrize("lib", [tdshare, tensordict], ids=["tdshare", "tensordict"])
def test_a_tensordict_value_of_a_leading_batch_size_is_widened_as_a_copy(lib: Any) -> None:
    td = lib.TensorDict(a=torch.zeros(4, 3), batch_size=[4, 3])
    for batch, shape in (([], (4, 3, 1)), ([4], (4, 3, 2))):
        value = lib.TensorDict(inner=torch.randn(*shape), batch_size=batch)
        td["x"] = value
        assert td["x"].batch_size == (4, 3) and value.batch_size == tuple(batch)  # the value is not changed
        assert td["x"]["inner"] is value["inner"]  # a shallow copy: the leaves are shared
    with pytest.raises(RuntimeError, match="4, 2"):  # the leaves cannot take the batch size
        td["y"] = lib.TensorDict(inner=torch.randn(4, 2), batch_size=[])
    assert "y" not in td.keys()


@pytest.mark.parametrize("filter_empty", [None, True, False])
def test_apply_filter_empty_leaves_out_what_the_reference_leaves_out(filter_empty: bool | None) -> None:
    def tree(lib: Any, empty: bool | str) -> Any:
        if empty is True:
            return lib.TensorDict(batch_size=[4])
        if empty == "inside":  # an empty level inside a level, and a non-tensor leaf
            return lib.TensorDict(a=torch.zeros(4), n={"b": torch.ones(4), "e": {}}, s="x", batch_size=[4])
        return lib.TensorDict(a=torch.zeros(4), n=lib.TensorDict(b=torch.ones(4), batch_size=[4]), batch_size=[4])

    fns = [lambda x: None, lambda x: x if x.sum() == 0 else None, lambda x: x + 1]
    for empty in (False, True, "inside"):
        for fn in fns:
            ours = tree(tdshare, empty).apply(fn, filter_empty=filter_empty)
            theirs = tree(tensordict, empty).apply(fn, filter_empty=filter_empty)
            assert (ours is None) == (theirs is None), (empty, filter_empty)
            if theirs is not None:
                assert sorted(map(str, ours.keys(True))) == sorted(map(str, theirs.keys(True)))


@pytest.mark.parametrize("kind", KINDS)
def test_the_errors_say_what_the_references_say(kind: str) -> None:
    obj = build(kind)
    with pytest.raises(RuntimeError, match="Converting a tensordict to boolean value is not permitted"):
        bool(obj)
    if kind != "tensorclass":  # a tensorclass has fixed fields: no pop, no rename
        with pytest.raises(KeyError, match="You are trying to pop key 'zz'"):
            obj.unlock_().pop("zz")
        with pytest.raises(KeyError, match="already present in TensorDict"):
            obj.rename_key_("a", "s", safe=True)
        assert obj.get("a").tolist() == [0.0, 1.0, 2.0, 3.0]  # nothing renamed


def test_a_strict_state_dict_load_names_the_keys_and_is_a_runtime_error() -> None:
    td = TensorDict(a=torch.zeros(2), n={"b": torch.zeros(2)}, batch_size=[2])
    state = td.state_dict()
    del state["a"]
    state["extra"] = torch.ones(2)
    with pytest.raises(RuntimeError, match=r"missing keys \['a'\], unexpected keys \['extra'\]") as caught:
        td.load_state_dict(state, strict=True)
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, tdshare.StateDictKeysError)
    with pytest.raises(RuntimeError):  # the reference's class of error there
        tensordict.TensorDict(a=torch.zeros(2), batch_size=[2]).load_state_dict({}, strict=True)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("kind", KINDS)
def test_the_losses_of_torch_nn_functional_apply_leaf_by_leaf(kind: str, reduction: str) -> None:
    obj = build(kind, offset=1.0)
    target = build(kind, offset=-0.5)
    ref_in = tensordict.TensorDict(a=torch.arange(4.0) + 1, n={"b": torch.zeros(4, 2) + 1}, batch_size=[4])
    ref_target = tensordict.TensorDict(a=torch.arange(4.0) - 0.5, n={"b": torch.zeros(4, 2) - 0.5}, batch_size=[4])
    for loss in (torch.nn.functional.l1_loss, torch.nn.functional.mse_loss, torch.nn.functional.smooth_l1_loss):
        ours, theirs = loss(obj, target, reduction=reduction), loss(ref_in, ref_target, reduction=reduction)
        assert ours.batch_size == theirs.batch_size == (torch.Size([4]) if reduction == "none" else torch.Size([]))
        for key in (("a",), ("n", "b")):
            assert torch.equal(ours.get(key), theirs.get(key)), (loss.__name__, key)
        assert ours.get("s") == "text"  # a non-tensor entry is carried over
    against_a_tensor = torch.nn.functional.mse_loss(obj.get("a"), torch.zeros(4))
    assert torch.equal(torch.nn.functional.mse_loss(TensorDict(a=obj.get("a")), torch.zeros(4))["a"], against_a_tensor)


@pytest.mark.parametrize("kind", KINDS)
def test_apply_out_replaces_entries_of_another_dtype_and_writes_the_others_in_place(tmp_path: Path, kind: str) -> None:
    obj = build(kind)
    obj.apply(lambda x: x.to(torch.float64), out=obj)  # a new dtype: the entries are replaced
    assert obj.get("a").dtype == obj.get(("n", "b")).dtype == torch.float64
    ref = tensordict.TensorDict(a=torch.arange(4), batch_size=[4])
    ref.apply(lambda x: x.to(torch.float64), out=ref)
    assert ref["a"].dtype == torch.float64  # the reference does the same
    mapped = build(kind).memmap_(tmp_path / "out")  # locked: written in place, into the files
    build(kind, offset=2.0).apply(lambda x: x * 2, out=mapped)
    assert tdshare.load(tmp_path / "out").get("a").tolist() == [4.0, 6.0, 8.0, 10.0]
    with pytest.raises(tdshare.LockedError):  # a new dtype cannot replace a locked entry
        build(kind).apply(lambda x: x.long(), out=mapped)


def test_set_at_takes_a_numpy_array() -> None:
    td = TensorDict(k=torch.zeros(4, 3, 5, dtype=torch.float64), batch_size=[4, 3])
    td.set_at_("k", np.ones(5) * 42, (2, 2))
    assert td["k"][2, 2].tolist() == [42.0] * 5 and float(td["k"].sum()) == 42.0 * 5


@pytest.mark.parametrize("kind", KINDS)
def test_setting_rows_with_a_value_of_another_batch_size_names_both(kind: str) -> None:
    obj = build(kind)
    rows = obj[0:2].clone()
    obj[0:2] = rows.zero_()  # the batch size the index selects
    assert obj.get("a").tolist() == [0.0, 0.0, 2.0, 3.0]
    with pytest.raises(tdshare.BatchSizeError, match="differs from the source batch size"):
        obj[0:1] = rows
    assert obj.get("a").tolist() == [0.0, 0.0, 2.0, 3.0]  # nothing written


@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_refine_names_and_rename_as_the_reference(kind: str) -> None:
    def make(lib: Any) -> Any:
        td = lib.TensorDict(a=torch.zeros(2, 3, 4), n={"b": torch.zeros(2, 3, 4, 5)}, batch_size=[2, 3, 4])
        td.names = [None, "b", None]
        return td if kind == "tensordict" else lib.lazy_stack([td, td.clone()], 1)

    ours, theirs = make(tdshare), make(tensordict)
    for obj in (ours, theirs):
        assert obj.refine_names(..., "c") is obj
    assert ours.names == theirs.names and ours["n"].names == theirs["n"].names
    for obj in (ours, theirs):
        with pytest.raises(RuntimeError):  # a named dim given another name
            obj.refine_names(*["x"] * obj.batch_dims)
    renamed = ours.rename(*[f"d{i}" for i in range(ours.batch_dims)])
    assert renamed.names == [f"d{i}" for i in range(ours.batch_dims)] and ours.names == theirs.names
    assert ours.rename(b="z").names == theirs.rename(b="z").names
    assert ours.rename_(None) is ours and ours.names == theirs.rename_(None).names
    for bad in ({"q": "z"},):
        with pytest.raises(ValueError):
            theirs.rename(**bad)
        with pytest.raises(ValueError, match="not part of the tensordict names"):
            ours.rename(**bad)
    with pytest.raises(ValueError, match="both a name map and a name list"):
        ours.rename("x", b="y")


@pytest.mark.parametrize("kind", KINDS)
def test_more_errors_say_what_the_references_say(tmp_path: Path, kind: str) -> None:
    mapped = build(kind).memmap_(tmp_path / "first")
    with pytest.raises(RuntimeError, match="A filename was provided but the tensor already has a file associated"):
        mapped.memmap_(tmp_path / "second", copy_existing=False)
    assert not (tmp_path / "second" / "a.memmap").exists()
    with pytest.raises(ValueError, match="dim0 and dim1 must be within the range of the number of dimensions"):
        build(kind).transpose(0, 2)
    if kind == "tensordict":
        other = TensorDict(b=torch.zeros(4), batch_size=[4])
        with pytest.raises(KeyError, match=r"not found .*and no pad value provided"):
            build(kind).where(torch.ones(4, dtype=torch.bool), other)


@pytest.mark.parametrize("kind", KINDS)
def test_torch_clone_of_a_collection_is_its_clone(kind: str) -> None:
    obj = build(kind)
    copy = torch.clone(obj)
    assert type(copy) is type(obj) and copy.get("a") is not obj.get("a") and torch.equal(copy.get("a"), obj.get("a"))
    copy.get("a").add_(1) if kind != "lazy" else copy.tensordicts[0].get("a").add_(1)
    assert obj.get("a").tolist() == [0.0, 1.0, 2.0, 3.0]  # a deep copy: the original is untouched
