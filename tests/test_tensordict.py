"""The in-memory TensorDict model: construction, keys, indexing, writes, locking, derived tensordicts."""

from __future__ import annotations

import pickle

import pytest
import tensordict
import torch

import tdshare
from tdshare import BatchSizeError, NonTensorData, NonTensorStack, TensorDict


def make() -> TensorDict:
    """A [3]-batched tensordict: a leaf with an extra dim, a nested level and a non-tensor value."""
    return TensorDict(
        {"a": torch.arange(6.0).reshape(3, 2), "n": {"c": torch.arange(3), "d": torch.zeros(3, 1)}, "s": "x"},
        batch_size=[3],
    )


def make2d() -> TensorDict:
    """A [2, 3]-batched tensordict whose leaf ``x`` has one dim more than the batch."""
    return TensorDict(
        x=torch.arange(24).reshape(2, 3, 4),
        y=torch.arange(6).reshape(2, 3),
        n={"z": torch.ones(2, 3)},
        batch_size=[2, 3],
    )


# -- construction ------------------------------------------------------------------------------
def test_construct_from_dict_and_kwargs() -> None:
    td = TensorDict({"a": torch.zeros(3)}, batch_size=[3], b=torch.ones(3, 2))
    assert td.keys() == ["a", "b"]
    assert td.batch_size == torch.Size([3]) and td.shape == (3,) and td.batch_dims == 1 and td.ndim == 1
    assert td.device is None and len(td) == 3 and td.numel() == 3
    assert TensorDict(a=torch.zeros(2, 5), batch_size=2).batch_size == (2,)
    assert TensorDict().batch_size == () and len(TensorDict()) == 0


def test_nested_dicts_become_tensordicts() -> None:
    td = TensorDict({"n": {"m": {"x": torch.zeros(4, 2)}}}, batch_size=[4])
    assert isinstance(td["n"], TensorDict) and isinstance(td["n", "m"], TensorDict)
    assert td["n", "m"].batch_size == (4,)
    assert td["n", "m", "x"].shape == (4, 2)


def test_construct_with_device_and_scalars() -> None:
    td = TensorDict(a=torch.zeros(2), f=1.5, i=3, flag=True, batch_size=[], device="cpu")
    assert td.device == torch.device("cpu")
    assert td["a"].device.type == "cpu"
    assert td["f"].dtype == torch.float32 and td["f"].item() == 1.5
    assert td["i"].dtype == torch.int64 and td["flag"].dtype == torch.bool
    assert td.to_dict()["i"].item() == 3


@pytest.mark.parametrize("shape", [(4,), (3, 3), ()])
def test_construct_batch_mismatch(shape: tuple[int, ...]) -> None:
    with pytest.raises(tdshare.BatchSizeError, match="'bad'") as info:
        TensorDict(bad=torch.zeros(shape), batch_size=[3, 2])
    assert isinstance(info.value, RuntimeError)


def test_construct_nested_td_batch_mismatch() -> None:
    with pytest.raises(RuntimeError, match="batch"):
        TensorDict(n=TensorDict(x=torch.zeros(2), batch_size=[2]), batch_size=[3])


# -- keys ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", [("n", "c"), ("n", ("c",)), (("n",), "c"), ((("n",), ("c",)),)])
def test_tuple_and_nested_tuple_keys(key: tuple) -> None:
    td = make()
    assert torch.equal(td[key], torch.arange(3))
    assert torch.equal(td.get(key), torch.arange(3))
    assert key in td


def test_setting_a_nested_key_creates_levels() -> None:
    td = make()
    td["p", "q", "r"] = torch.ones(3)
    td.set(("p", ("q", "t")), torch.zeros(3, 5))
    assert td["p"]["q"]["r"].sum() == 3 and td["p", "q", "t"].shape == (3, 5)
    assert td["p", "q"].batch_size == (3,)
    assert ("p", "q", "t") in td.keys(include_nested=True)


def test_keys_items_values() -> None:
    td = make()
    assert td.keys() == ["a", "n", "s"]
    assert td.keys(include_nested=True) == ["a", "n", ("n", "c"), ("n", "d"), "s"]
    assert td.keys(include_nested=True, leaves_only=True) == ["a", ("n", "c"), ("n", "d"), "s"]
    assert td.keys(leaves_only=True) == ["a", "s"]
    items = dict(td.items(include_nested=True, leaves_only=True))
    assert items["s"] == "x" and torch.equal(items["n", "c"], torch.arange(3))
    values = list(td.values())
    assert values[0] is td["a"] and values[1] is td["n"] and values[2] == "x"


@pytest.mark.parametrize("bad", [1, 1.5, None, (), ("a", 1), b"a", ["a"]])
def test_wrong_key_types(bad: object) -> None:
    td = make()
    with pytest.raises(tdshare.KeyTypeError) as info:
        td.set(bad, torch.zeros(3))
    assert isinstance(info.value, TypeError)
    with pytest.raises(tdshare.KeyTypeError):
        bad in td  # noqa: B015
    with pytest.raises(TypeError, match="string"):
        td.get(bad)


@pytest.mark.parametrize("key", ["zz", ("n", "zz"), ("zz", "c"), ("a", "b")])
def test_missing_keys(key: object) -> None:
    td = make()
    missing = "zz" if "zz" in key else "b"
    for fn in (lambda: td[key], lambda: td.pop(key), lambda: td.set_(key, torch.zeros(3))):
        with pytest.raises(tdshare.MissingKeyError, match=missing) as info:
            fn()
        assert isinstance(info.value, KeyError)
    if key == ("a", "b"):  # through the tensor "a": get() without a default raises, as the reference
        with pytest.raises(tdshare.InvalidArgumentError, match=r"'a' is a Tensor.*'b'"):
            td.get(key)
    else:  # a missing key: get() gives None, as dict.get and tensordict >= 0.7
        assert td.get(key) is None
    with pytest.raises(KeyError, match=missing):
        del td[key]
    assert key not in td
    assert td.get(key, "dflt") == "dflt" and td.pop(key, None) is None


# -- get / set / update / pop --------------------------------------------------------------------
def test_set_replaces_and_set_writes_in_place() -> None:
    td = make()
    old = td["a"]
    td.set("a", torch.ones(3, 2))
    assert td["a"] is not old and old.sum() == 15 and td["a"].sum() == 6
    current = td["a"]
    td.set_("a", torch.full((3, 2), 2.0))
    assert td["a"] is current and current.sum() == 12
    td.set("a", torch.zeros(3, 2), inplace=True)
    assert td["a"] is current and current.sum() == 0
    td.set("new", torch.zeros(3), inplace=True)  # inplace on a missing key adds it
    assert "new" in td


@pytest.mark.parametrize("value", [torch.ones(1, 2), torch.ones(2, 2), torch.ones(3, 3), 1.0])
def test_set_inplace_validates_shape(value: object) -> None:
    td = make()
    with pytest.raises(RuntimeError):
        td.set_("a", value)
    assert td["a"].sum() == 15


def test_set_nested_td_in_place() -> None:
    td = make()
    inner = td["n"]
    td.set_("n", {"c": torch.tensor([7, 8, 9])})
    assert td["n"] is inner and td["n", "c"].tolist() == [7, 8, 9]
    with pytest.raises(tdshare.MissingKeyError, match="a"):
        td.set(("a", "b"), torch.zeros(3))  # "a" is a leaf


def test_update_and_update_() -> None:
    td = make()
    c = td["n", "c"]
    td.update({"n": {"e": torch.ones(3)}, "b": torch.zeros(3), ("n", "c"): torch.ones(3, dtype=torch.int64)})
    assert td.keys(True, True) == ["a", ("n", "c"), ("n", "d"), ("n", "e"), "s", "b"]
    assert td["n", "c"] is not c and c.tolist() == [0, 1, 2]
    c = td["n", "c"]
    td.update_({"n": {"c": torch.tensor([4, 5, 6])}, "s": "y"})
    assert td["n", "c"] is c and c.tolist() == [4, 5, 6] and td["s"] == "y"
    td.update(TensorDict(a=torch.zeros(3, 2), batch_size=[3]), inplace=True)
    assert td["a"].sum() == 0
    with pytest.raises(tdshare.MissingKeyError, match="zz"):
        td.update_({"zz": torch.zeros(3)})


def test_pop_del_contains_len() -> None:
    td = make()
    a = td["a"]
    assert td.pop("a") is a and "a" not in td
    assert td.pop(("n", "c")).tolist() == [0, 1, 2] and ("n", "c") not in td and ("n", "d") in td
    assert td.pop("s") == "x"
    del td["n", "d"]
    assert td.keys(True) == ["n"] and len(td) == 3
    td.rename_key_("n", "m")
    assert td.keys() == ["m"]


def test_rename_key() -> None:
    td = make()
    a = td["a"]
    td.rename_key_("a", ("z", "a"))
    assert td["z", "a"] is a and "a" not in td
    td.rename_key_(("z", "a"), ("z", "a"))  # onto itself: a no-op
    assert td["z", "a"] is a


# -- indexing ------------------------------------------------------------------------------------
MASK = torch.tensor([True, False, True])
INDICES_1D = [0, -1, slice(1, 3), slice(None, None, 2), torch.tensor([2, 0]), torch.tensor(1), MASK, [0, 2]]
INDICES_1D += [[True, False, True], Ellipsis, None, (None, 1), (slice(0, 2), None)]


@pytest.mark.parametrize("idx", INDICES_1D)
def test_index_1d_matches_torch(idx: object) -> None:
    td = make()
    ref = torch.arange(6.0).reshape(3, 2)
    t_idx = torch.as_tensor(idx) if isinstance(idx, list) else idx
    sub = td[idx]
    assert torch.equal(sub["a"], ref[t_idx])
    assert sub.batch_size == torch.arange(3)[t_idx].shape
    assert torch.equal(sub["n", "c"], torch.arange(3)[t_idx])
    assert sub["s"] == "x" and sub["n"].batch_size == sub.batch_size


def test_ellipsis_indexes_batch_dims_only() -> None:
    td = make()
    assert td[..., None]["a"].shape == (3, 1, 2) and td[..., None].batch_size == (3, 1)
    assert td[..., 1]["a"].tolist() == [2, 3] and td[..., 1].batch_size == ()


@pytest.mark.parametrize(
    ("idx", "batch", "x_shape"),
    [
        ((1, 2), (), (4,)),
        ((Ellipsis, 0), (2,), (2, 4)),
        ((0, Ellipsis), (3,), (3, 4)),
        ((slice(None), [0, 2]), (2, 2), (2, 2, 4)),
        (([0, 1], [1, 2]), (2,), (2, 4)),
        ((None, Ellipsis, None), (1, 2, 3, 1), (1, 2, 3, 1, 4)),
        (torch.tensor([[True, False, True], [False, False, True]]), (3,), (3, 4)),
        ((Ellipsis, MASK), (2, 2), (2, 2, 4)),
        ((slice(1, 2), Ellipsis, 1), (1,), (1, 4)),
    ],
)
def test_index_2d_batch_and_ellipsis(idx: object, batch: tuple, x_shape: tuple) -> None:
    td = make2d()
    sub = td[idx]
    assert sub.batch_size == batch and sub["x"].shape == x_shape
    t_idx = tuple(torch.as_tensor(i) if isinstance(i, list) else i for i in idx) if isinstance(idx, tuple) else idx
    assert torch.equal(sub["y"], torch.arange(6).reshape(2, 3)[t_idx])
    assert sub["n", "z"].shape == batch


@pytest.mark.parametrize("idx", [(0, 0, 0), (Ellipsis, 0, 0, 0), (torch.ones(2, 3, 4, dtype=torch.bool),)])
def test_too_many_indices(idx: object) -> None:
    with pytest.raises(IndexError):
        make2d()[idx]


VIEWS = [(0, True), (slice(0, 2), True), (Ellipsis, True), (None, True), (torch.tensor([0, 1]), False), (MASK, False)]


@pytest.mark.parametrize(("idx", "is_view"), VIEWS)
def test_views_share_memory_where_torch_does(idx: object, is_view: bool) -> None:
    td = make()
    sub = td[idx]
    sub["a"].fill_(100.0)
    sub["n", "c"].fill_(100)
    assert bool(td["a"][0, 0] == 100) is is_view and bool(td["n", "c"][0] == 100) is is_view


def test_view_writes_and_structure() -> None:
    td = make()
    row = td[1]
    row["a"][0] = -1
    row.set_("n", {"c": torch.tensor(42)})
    assert td["a"][1, 0] == -1 and td["n", "c"][1] == 42
    row["extra"] = torch.zeros(())
    assert "extra" not in td


# -- index assignment ----------------------------------------------------------------------------
def test_setitem_index_with_td_dict_scalar() -> None:
    td = make()
    td[1] = TensorDict({"a": torch.tensor([9.0, 9.0]), "n": {"c": torch.tensor(7)}}, batch_size=[])
    assert td["a"][1].tolist() == [9, 9] and td["n", "c"].tolist() == [0, 7, 2] and td["n", "d"].sum() == 0
    td[0:2] = {"n": {"d": torch.ones(2, 1)}}
    assert td["n", "d"].flatten().tolist() == [1, 1, 0]
    td[torch.tensor([True, False, True])] = 0
    assert td["a"].tolist() == [[0, 0], [9, 9], [0, 0]] and td["n", "c"].tolist() == [0, 7, 0]
    assert td["s"] == "x"  # a scalar leaves non-tensor values alone
    td[...] = 5
    assert (td["a"] == 5).all() and (td["n", "c"] == 5).all()
    td[[0, 2]] = td[[1, 1]].clone().apply(lambda t: t + 1)
    assert td["a"][0].tolist() == [6, 6]


def test_setitem_index_2d_ellipsis() -> None:
    td = make2d()
    td[..., 1] = TensorDict(
        x=torch.zeros(2, 4, dtype=torch.int64), y=torch.tensor([-1, -2]), n={"z": torch.zeros(2)}, batch_size=[2]
    )
    assert td["y"].tolist() == [[0, -1, 2], [3, -2, 5]]
    assert td["x"][:, 1].sum() == 0 and td["x"][:, 0].sum() != 0 and td["n", "z"][:, 1].sum() == 0


def test_setitem_index_unknown_key() -> None:
    # as tensordict 0.15.3: the entry is created (zeros elsewhere), a locked tensordict refuses it
    td = make()
    td[0] = {"zz": torch.ones(())}
    ref = tensordict.TensorDict(a=torch.zeros(td.batch_size), batch_size=td.batch_size)
    ref[0] = {"zz": torch.ones(())}
    assert td["zz"].tolist() == ref["zz"].tolist() and td["zz"].dtype == ref["zz"].dtype
    del td["zz"]
    with pytest.raises(tdshare.MissingKeyError, match="zz"):
        td[0] = {"zz": object()}  # a value that cannot be added row by row (zz is new again)
    td.lock_()
    with pytest.raises(tdshare.LockedError, match="yy"):
        td[0] = {"yy": torch.zeros(()), "zz": torch.zeros(())}


# -- derived tensordicts -------------------------------------------------------------------------
def test_to_cpu_and_dtype() -> None:
    td = make()
    moved = td.to("cpu")
    assert moved.device == torch.device("cpu") and moved["n"].device == torch.device("cpu")
    assert torch.equal(moved["a"], td["a"]) and not td.lock_().clone().is_locked
    td.unlock_()
    assert td.cpu().device == torch.device("cpu") and td.device is None
    cast = td.to(torch.float64)
    assert cast["a"].dtype == torch.float64 and cast["n", "c"].dtype == torch.float64 and cast["s"] == "x"
    assert td.to() is td


@pytest.mark.parametrize("recurse", [True, False])
def test_clone(recurse: bool) -> None:
    td = make()
    c = td.clone(recurse=recurse)
    assert c is not td and c["n"] is not td["n"] and (c == td).all()
    assert (c["a"].data_ptr() == td["a"].data_ptr()) is (not recurse)
    c["new"] = torch.zeros(3)
    c["a"].add_(1)
    assert "new" not in td and bool((td["a"] == c["a"]).all()) is (not recurse)
    c.set_("s", "changed")
    assert td["s"] == "x"


def test_contiguous() -> None:
    base = torch.arange(6.0).reshape(2, 3)
    td = TensorDict(a=base.t(), batch_size=[3])
    c = td.contiguous()
    assert not td["a"].is_contiguous() and c["a"].is_contiguous() and torch.equal(c["a"], base.t())


def test_apply_and_apply_() -> None:
    td = make()
    out = td.apply(lambda t: t * 2)
    assert out["a"].tolist() == [[0, 2], [4, 6], [8, 10]] and out["n", "c"].tolist() == [0, 2, 4]
    assert out["s"] == "x" and td["a"][1, 0] == 2
    summed = td.apply(lambda x, y: x + y, out)
    assert summed["n", "c"].tolist() == [0, 3, 6]
    dropped = td.apply(lambda x, y: None if x.dtype == torch.int64 else x, td)
    assert dropped.keys(True, True) == ["a", ("n", "d"), "s"]
    assert td.apply(lambda t: None if t.dtype == torch.int64 else t).keys(True, True) == ["a", ("n", "d"), "s"]
    first = td.apply(lambda t: t[0], batch_size=[])
    assert first.batch_size == () and first["a"].tolist() == [0, 1] and first["n"].batch_size == ()
    a = td["a"]
    assert td.apply_(lambda t: t + 1) is td and td["a"] is a and a[0, 0] == 1 and td["n", "c"][0] == 1


def test_zero_and_fill() -> None:
    td = make()
    assert td.zero_() is td and td["a"].sum() == 0 and td["n", "c"].sum() == 0 and td["s"] == "x"
    td.fill_("a", 2.5)
    td.fill_("n", 3)
    assert (td["a"] == 2.5).all() and td["n", "c"].tolist() == [3, 3, 3] and (td["n", "d"] == 3).all()


# -- comparison ----------------------------------------------------------------------------------
def test_eq_ne_all_any() -> None:
    td, other = make(), make()
    eq = td == other
    assert isinstance(eq, TensorDict) and eq["a"].dtype == torch.bool and eq.batch_size == (3,)
    assert eq.all() and not (td != other).any()
    other["a"][1, 1] = -1
    assert not (td == other).all() and (td != other).any()
    assert (td != other)["a"].tolist() == [[False, False], [False, True], [False, False]]
    other["a"][1, 1] = 3
    other["s"] = "y"
    assert (td != other)["s"].tolist() == [True, True, True] and not (td == other).all()
    assert (td == 1)["a"].tolist() == [[False, True], [False, False], [False, False]]
    with pytest.raises(KeyError, match="a"):
        td == td.exclude("a")  # noqa: B015
    assert TensorDict(a=torch.zeros(2), batch_size=[2]).any() is False


def test_bool_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"all\(\)"):
        bool(make())
    with pytest.raises(RuntimeError):
        if make() == make():
            pass


# -- stack / cat / unbind / iteration ------------------------------------------------------------
@pytest.mark.parametrize("use_torch", [True, False])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stack(use_torch: bool, dim: int) -> None:
    tds = [make(), make().apply(lambda t: t + 1)]
    out = torch.stack(tds, dim) if use_torch else TensorDict.stack(tds, dim)
    shape = [3]
    shape.insert(dim % 2, 2)
    assert isinstance(out, TensorDict) and out.batch_size == tuple(shape)
    assert torch.equal(out["a"], torch.stack([t["a"] for t in tds], dim if dim >= 0 else 1))
    assert out["n"].batch_size == out.batch_size and out["s"] == "x"


@pytest.mark.parametrize("use_torch", [True, False])
def test_cat(use_torch: bool) -> None:
    tds = [make(), make()[:2]]
    out = torch.cat(tds) if use_torch else TensorDict.cat(tds, 0)
    assert out.batch_size == (5,) and out["n", "c"].tolist() == [0, 1, 2, 0, 1] and out["a"].shape == (5, 2)
    td2 = make2d()
    assert torch.cat([td2, td2], dim=1).batch_size == (2, 6)


@pytest.mark.parametrize(
    ("tds", "exc"),
    [
        (lambda: [make(), make()[:2]], tdshare.BatchSizeError),
        (lambda: [make(), make().exclude("a")], KeyError),
        (lambda: [], ValueError),
    ],
)
def test_stack_errors(tds: object, exc: type) -> None:
    with pytest.raises(exc):
        TensorDict.stack(tds())  # type: ignore[operator]


def test_unbind_and_iteration() -> None:
    td = make2d()
    parts = td.unbind(1)
    assert len(parts) == 3 and parts[2].batch_size == (2,) and parts[2]["y"].tolist() == [2, 5]
    assert [p["y"].tolist() for p in torch.unbind(td)] == [[0, 1, 2], [3, 4, 5]]
    rows = list(td)
    assert len(rows) == 2 and rows[1]["x"].shape == (3, 4)
    rows[0]["y"][0] = 99
    assert td["y"][0, 0] == 99
    with pytest.raises(TypeError):
        list(TensorDict(a=torch.zeros(2), batch_size=[]))


# -- locking -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op",
    [
        lambda td: td.__setitem__("a", torch.zeros(3, 2)),
        lambda td: td.set("a", torch.zeros(3, 2)),
        lambda td: td.__setitem__("new", torch.zeros(3)),
        lambda td: td.__setitem__(("n", "new"), torch.zeros(3)),
        lambda td: td.__setitem__(("brand", "new"), torch.zeros(3)),
        lambda td: td.update({"a": torch.zeros(3, 2)}),
        lambda td: td.update({"n": {"c": torch.zeros(3)}}),
        lambda td: td.__delitem__("a"),
        lambda td: td.pop("a"),
        lambda td: td.pop(("n", "c")),
        lambda td: td.rename_key_("a", "b"),
        lambda td: td.set("new", torch.zeros(3), inplace=True),
    ],
)
def test_locked_refuses_structural_changes(op: object) -> None:
    td = make().lock_()
    before = td.keys(True)
    with pytest.raises(tdshare.LockedError, match="set_") as info:
        op(td)  # type: ignore[operator]
    assert isinstance(info.value, RuntimeError) and td.keys(True) == before and td["a"].sum() == 15


def test_locked_allows_in_place_writes() -> None:
    td = make().lock_()
    assert td.is_locked and td["n"].is_locked
    td["a"][0] = 1
    td.set_("a", td["a"] + 1)
    td.update_({"n": {"c": torch.tensor([5, 5, 5])}})
    td.set(("n", "d"), torch.ones(3, 1), inplace=True)
    td.update({"n": {"d": torch.full((3, 1), 2.0)}}, inplace=True)
    td[1] = TensorDict({"a": torch.zeros(2), "n": {"c": torch.tensor(0)}}, batch_size=[])
    td.set_("s", "y")
    td.apply_(lambda t: t * 1)
    assert td["a"].tolist() == [[2, 2], [0, 0], [5, 6]] and td["n", "c"].tolist() == [5, 0, 5]
    assert (td["n", "d"] == 2).all() and td["s"] == "y"


def test_lock_unlock_context_managers() -> None:
    td = make().lock_()
    with td.unlock_():
        assert not td.is_locked and not td["n"].is_locked
        td["b"] = torch.zeros(3)
    assert td.is_locked and td["n"].is_locked and "b" in td
    td.unlock_()
    with td.lock_():
        assert td.is_locked
        with pytest.raises(RuntimeError):
            td["c"] = torch.zeros(3)
    assert not td.is_locked
    with pytest.raises(ZeroDivisionError), td.lock_():
        raise ZeroDivisionError
    assert not td.is_locked


@pytest.mark.parametrize("locked", [True, False])
def test_context_manager_keeps_unchanged_state(locked: bool) -> None:
    td = make()
    if locked:
        td.lock_()
    with td.lock_() if locked else td.unlock_():
        pass
    assert td.is_locked is locked
    with td.unlock_() if locked else td.lock_():
        assert td.is_locked is not locked
        with td.lock_() if locked else td.unlock_():
            assert td.is_locked is locked
        assert td.is_locked is not locked
    assert td.is_locked is locked


def test_lock_flag_at_construction() -> None:
    td = TensorDict(a=torch.zeros(2), batch_size=[2], lock=True)
    assert td.is_locked and td.unlock_() is td and not td.is_locked


# -- shared memory, names, batch size, repr, pickling --------------------------------------------
def test_share_memory() -> None:
    td = make()
    assert not td.is_shared()
    assert td.share_memory_() is td
    assert td.is_shared() and td.is_locked and td["a"].is_shared() and td["n", "c"].is_shared()
    td.unlock_()
    assert not td.is_shared()


def test_names() -> None:
    td = TensorDict(x=torch.zeros(2, 3, 4), n={"z": torch.zeros(2, 3, 5)}, batch_size=[2, 3], names=["b", "t"])
    assert td.names == ["b", "t"] and td["n"].names == ["b", "t"]
    assert td[0:1].names == ["b", "t"]
    assert td[:, 0].names == ["b"] and td[0].names == ["t"] and td[None].names == [None, "b", "t"]
    assert make().names == [None]
    with pytest.raises(ValueError, match="names"):
        td.names = ["only_one"]
    with pytest.raises(ValueError, match="non-unique"):
        td.names = ["b", "b"]
    deep = TensorDict(
        n=TensorDict(m=TensorDict(x=torch.zeros(2, 3, 4), batch_size=[2, 3]), batch_size=[2]), batch_size=[2]
    )
    deep.names = ["b"]
    assert deep["n", "m"].names == ["b", None]
    assert torch.stack([deep, deep], 1).names == ["b", None] and torch.stack([deep, deep])["n"].names == [None, "b"]
    td.batch_size = [2]
    assert td.names == [None]


def test_batch_size_setter() -> None:
    td = make2d()
    td.batch_size = [2]
    assert td.batch_size == (2,) and td["x"].shape == (2, 3, 4) and td["n"].batch_size == (2, 3)
    td.batch_size = torch.Size([2, 3])
    assert td.shape == (2, 3)
    with pytest.raises(tdshare.BatchSizeError, match="'y'"):
        td.batch_size = [2, 3, 4]
    with pytest.raises(RuntimeError):
        td.batch_size = [3]
    assert td.batch_size == (2, 3)
    with pytest.raises(ValueError):
        td.batch_size = ["a"]


def test_repr() -> None:
    # the compact form of tensordict 0.15.3 (tests/test_key_ops.py compares many cases with it)
    assert repr(make()) == "TensorDict(batch_size=[3], fields={a: f32[2], n: {c: i64[], d: f32[1]}, s: str})"


@pytest.mark.parametrize("locked", [True, False])
def test_pickle_round_trip(locked: bool) -> None:
    td = make2d()
    td["s"] = NonTensorData(["k", 1])
    td.names = ["b", "t"]
    if locked:
        td.lock_()
    back = pickle.loads(pickle.dumps(td))
    assert isinstance(back, TensorDict) and back.batch_size == (2, 3) and back.names == ["b", "t"]
    assert (back == td).all() and back["s"] == ["k", 1] and back.keys(True) == td.keys(True)
    assert back.is_locked is locked and back["n"].is_locked is locked
    assert back["x"].data_ptr() != td["x"].data_ptr()
    with back.unlock_() if locked else back:
        back["new"] = torch.zeros(2, 3)


# -- non-tensor leaves ---------------------------------------------------------------------------
def test_non_tensor_leaves() -> None:
    obj = object()
    td = TensorDict(s="hello", obj=obj, lst=["x", "y"], num=[1, 2], nt=NonTensorData("wrapped"), batch_size=[2])
    assert td["s"] == "hello" and td["obj"] is obj and td["lst"] == ["x", "y"] and td["nt"] == "wrapped"
    assert td.get("obj").data is obj  # get() gives the NonTensorData, as the reference's does
    # as the reference: a list of numbers is a tensor, any other list one non-tensor value per element
    assert isinstance(td["num"], torch.Tensor) and td["num"].tolist() == [1, 2]
    assert isinstance(td._tensordict["lst"], NonTensorStack) and td[1]["lst"] == "y"
    assert isinstance(td._tensordict["s"], NonTensorData)
    assert td[0]["s"] == "hello" and td[0:1]["obj"] is obj
    td.set_("s", "bye")
    assert td["s"] == "bye"
    td.set_("s", NonTensorData("again"))
    assert td["s"] == "again"
    td.lock_().set_("lst", ["p", "q"])
    assert td["lst"] == ["p", "q"]


def test_non_tensor_data_class() -> None:
    nt = NonTensorData("v")
    assert nt == "v" and nt == NonTensorData("v") and nt != "w" and nt.tolist() == "v"
    assert NonTensorData(nt).data == "v" and repr(nt) == "NonTensorData(data='v')"
    assert pickle.loads(pickle.dumps(nt)).data == "v"
    arr = NonTensorData(torch.zeros(2))
    assert arr == arr.data and not (arr == torch.ones(2))
    assert len({NonTensorData(1), NonTensorData(1)}) == 2


# -- select / exclude / empty / to_dict ----------------------------------------------------------
def test_select_exclude_empty_to_dict() -> None:
    td = make()
    sel = td.select("a", ("n", "c"))
    assert sel.keys(True) == ["a", "n", ("n", "c")] and sel["a"] is td["a"] and sel.batch_size == (3,)
    assert td.select("n")["n", "d"] is td["n", "d"]
    with pytest.raises(KeyError, match="zz"):
        td.select("zz")
    exc = td.exclude("a", ("n", "c"), "missing")
    assert exc.keys(True) == ["n", ("n", "d"), "s"] and exc["n", "d"] is td["n", "d"]
    assert td.keys(True) == ["a", "n", ("n", "c"), ("n", "d"), "s"]
    empty = td.empty()
    assert empty.keys() == [] and empty.batch_size == (3,)
    d = td.to_dict()
    assert set(d) == {"a", "n", "s"} and isinstance(d["n"], dict) and d["n"]["c"] is td["n", "c"] and d["s"] == "x"


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensor_leaf_checks_its_first_dimension_only() -> None:
    nt = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0)])
    td = TensorDict({"nt": nt}, batch_size=[2])
    assert td["nt"].is_nested
    assert [t.tolist() for t in td["nt"].unbind()] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]]
    with pytest.raises(BatchSizeError, match="'nt'"):
        TensorDict({"nt": nt}, batch_size=[3])
    td.memmap_()  # anonymous memory: the packed elements and the size table in the segment
    assert td.is_memmap() and [t.tolist() for t in td["nt"].unbind()] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]]


def test_to_keeps_the_lock_and_fill_refuses_non_tensors() -> None:
    td = make().lock_()
    moved = td.to(torch.float64)
    assert moved.is_locked and moved["n"].is_locked and moved["a"].dtype == torch.float64
    assert moved["a"].tolist() == td["a"].tolist()
    with pytest.raises(ValueError, match="'s' holds a non-tensor value"):
        td.fill_("s", 1)
    td.fill_("a", 2.0)
    assert td["a"].tolist() == [[2.0, 2.0]] * 3


@pytest.mark.parametrize("kind", ["tensordict", "tensorclass"])
def test_setting_an_index_with_a_different_non_tensor_value_stores_one_per_element(kind: str) -> None:
    import tensordict as reference
    from _kinds import build

    obj = build(kind)
    part = build(kind)[1:3]
    part.set("s", "other")
    obj[1:3] = part
    theirs = reference.TensorDict(a=torch.arange(4.0), s="text", batch_size=[4])
    theirs[1:3] = reference.TensorDict(a=torch.arange(2.0), s="other", batch_size=[2])
    assert list(obj.get("s")) == list(theirs["s"]) == ["text", "other", "other", "text"]
    assert obj[2].get("s") == "other" and obj[0].get("s") == "text"
    same = build(kind)
    same[0:2] = build(kind)[0:2]  # an equal value leaves the entry one value
    entry = (same._tensordict if kind == "tensordict" else same._tensordict._tensordict)["s"]
    assert isinstance(entry, NonTensorData) and not isinstance(entry, NonTensorStack)


def test_a_per_element_non_tensor_write_into_a_memory_mapped_tensordict_is_refused_before_writing() -> None:
    td = TensorDict(x=torch.zeros(3), s="a", batch_size=[3]).memmap_()
    with pytest.raises(RuntimeError, match=r"'s'.*one value per element"):
        td[1] = TensorDict(x=torch.ones(()), s="b", batch_size=[])
    assert td["x"].tolist() == [0.0, 0.0, 0.0] and td["s"] == "a"
    td[1] = TensorDict(x=torch.ones(()), s="a", batch_size=[])
    assert td["x"].tolist() == [0.0, 1.0, 0.0]
