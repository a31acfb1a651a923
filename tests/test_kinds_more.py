"""The container kinds the reference's test fixtures build: typed tensordicts, TensorDictParams,
legacy lazy stacks, sub-tensordict views and tensordicts with non-tensor entries, compared
against tensordict 0.15.3, here and across spawn, fork and forkserver children."""

from __future__ import annotations

import multiprocessing as mp
import weakref
from typing import Any

import pytest
import tensordict
import torch
from _kinds import TypedSample, TypedWithNested

import tdshare
from tdshare import (
    LazyStackedTensorDict,
    NotSupportedError,
    TensorDict,
    TensorDictParams,
    TypedTensorDict,
)

METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
TIMEOUT = 60

# the kinds a shared tensordict is sent as, each with its content rows a/n.b (4 rows)
SHARE_KINDS = ["typed", "typed_nested", "params", "legacy_stack", "sub_td", "non_tensor"]


def _content(offset: float = 0.0) -> dict[str, torch.Tensor]:
    return {"a": torch.arange(4.0) + offset, "b": torch.zeros(4, 2) + offset}


def make(kind: str) -> Any:
    c = _content()
    if kind == "typed":
        return TypedSample(a=c["a"], b=c["b"], batch_size=[4])
    if kind == "typed_nested":
        return TypedWithNested(a=c["a"], n=TensorDict(b=c["b"], batch_size=[4]), batch_size=[4])
    if kind == "params":
        return TensorDictParams(TensorDict(a=c["a"], n=TensorDict(b=c["b"], batch_size=[4]), batch_size=[4]))
    if kind == "legacy_stack":
        rows = [TensorDict(a=c["a"][i], n=TensorDict(b=c["b"][i], batch_size=[]), batch_size=[]) for i in range(4)]
        with tdshare.set_lazy_legacy(True):
            return torch.stack(rows, 0)
    if kind == "sub_td":
        parent = TensorDict(a=torch.stack([c["a"], c["a"]]), n={"b": torch.stack([c["b"], c["b"]])}, batch_size=[2, 4])
        return parent._get_sub_tensordict(1)
    if kind == "non_tensor":
        return TensorDict(a=c["a"], n={"b": c["b"]}, batch_size=[4]).set_non_tensor(("data", "text"), "hello")
    raise AssertionError(kind)


def _nested_b(td: Any) -> torch.Tensor:
    return td["b"] if "b" in td.keys() else td["n", "b"]


# -- functions the children run (module level: spawned children import them) --------------------
def _child_writes_and_reports_locks(td: Any, ready: Any, results: Any) -> None:
    # nested levels; non-tensor leaves (which values() gives as stored) carry no lock of their own here
    nested = [v for v in td.values(True) if tdshare.is_tensor_collection(v) and not tdshare.is_non_tensor(v)]
    results.put(
        (
            td.is_locked,
            len(td._lock_parents_weakrefs),
            [bool(v.is_locked) for v in nested],
            [len(v._lock_parents_weakrefs) > 0 for v in nested],
        )
    )
    with torch.no_grad():  # TensorDictParams' leaves are parameters
        if isinstance(td, LazyStackedTensorDict):  # its entries read as stacked copies: write into members
            td.tensordicts[2]["n", "b"].fill_(7.0)
            td.tensordicts[1]["a"].fill_(-1.0)
        else:
            _nested_b(td)[2] = 7.0  # an in-place write into the shared memory
            td["a"][1] = -1.0
    ready.set()


# -- TypedTensorDict ------------------------------------------------------------------------------
def test_typed_fields_and_errors_match_reference() -> None:
    class RefTyped(tensordict.TypedTensorDict):
        a: torch.Tensor
        b: torch.Tensor

    c = _content()
    ours = TypedSample(a=c["a"], b=c["b"], batch_size=[4])
    ref = RefTyped(a=c["a"], b=c["b"], batch_size=[4])
    assert ours.a.tolist() == ref.a.tolist() and ours["b"].shape == ref["b"].shape
    assert type(ours[1:3]).__name__ == "TypedSample" and ours[1:3].batch_size == ref[1:3].batch_size
    assert type(ours.apply(lambda t: t + 1)) is TypedSample
    assert (ours.apply(lambda t: t + 1)["a"] == ref.apply(lambda t: t + 1)["a"]).all()
    with pytest.raises(TypeError, match=r"missing the fields \['b'\]"):
        TypedSample(a=c["a"], batch_size=[4])
    with pytest.raises(TypeError):
        RefTyped(a=c["a"], batch_size=[4])
    with pytest.raises(TypeError, match=r"unknown fields \['z'\]"):
        TypedSample(a=c["a"], b=c["b"], z=c["a"], batch_size=[4])
    ours.a = torch.ones(4)
    assert ours["a"].tolist() == [1.0] * 4


def test_typed_field_named_like_a_method_is_refused() -> None:
    with pytest.raises(AttributeError, match=r"'keys'"):

        class Bad(TypedTensorDict):
            keys: torch.Tensor


def test_typed_default_and_from_tensordict() -> None:
    class WithDefault(TypedTensorDict):
        a: torch.Tensor
        note: Any = None

    td = TensorDict(a=torch.zeros(3), batch_size=[3])
    typed = WithDefault.from_tensordict(td)
    assert typed.a is td["a"] and typed.note is None and "note" not in typed


# -- TensorDictParams -----------------------------------------------------------------------------
def test_params_register_like_reference() -> None:
    c = _content()
    ours = TensorDictParams(TensorDict(a=c["a"], n=TensorDict(b=c["b"], batch_size=[4]), batch_size=[4]))
    ref = tensordict.TensorDictParams(
        tensordict.TensorDict(a=c["a"], n=tensordict.TensorDict(b=c["b"], batch_size=[4]), batch_size=[4])
    )
    ours_params = sorted((n, tuple(p.shape)) for n, p in ours.named_parameters())
    ref_params = sorted((n, tuple(p.shape)) for n, p in ref.named_parameters())
    assert [s for _, s in ours_params] == [s for _, s in ref_params]
    assert all(isinstance(p, torch.nn.Parameter) for p in ours.parameters())
    assert ours.batch_size == ref.batch_size and sorted(map(str, ours.keys(True, True))) == sorted(
        map(str, ref.keys(True, True))
    )
    assert isinstance(ours["a"], torch.nn.Parameter)
    with pytest.raises(RuntimeError, match=r"Cannot call map on a TensorDictParams object"):
        ours.map(lambda t: t)
    with pytest.raises(RuntimeError, match=r"Cannot call map on a TensorDictParams object"):
        ref.map(lambda t: t)
    with pytest.raises(NotSupportedError):
        ours.map(lambda t: t)


def test_params_optimizer_sees_the_tensordict() -> None:
    params = TensorDictParams(TensorDict(w=torch.ones(3), batch_size=[]))
    opt = torch.optim.SGD(params.parameters(), lr=0.5)
    params["w"].sum().backward()
    opt.step()
    assert params["w"].tolist() == [0.5, 0.5, 0.5]
    assert params.lock_() is params and params.is_locked


# -- set_lazy_legacy, lazy cat ----------------------------------------------------------------------
def test_lazy_legacy_stack_matches_reference() -> None:
    ours_rows = [TensorDict(a=torch.full((3,), float(i)), batch_size=[3]) for i in range(2)]
    ref_rows = [tensordict.TensorDict(a=torch.full((3,), float(i)), batch_size=[3]) for i in range(2)]
    with tdshare.set_lazy_legacy(True):
        ours = torch.stack(ours_rows, 1)
        assert tdshare.lazy_legacy() is True
    with tensordict.utils.set_lazy_legacy(True):
        ref = torch.stack(ref_rows, 1)
    assert type(ours) is LazyStackedTensorDict and type(ref).__name__ == "LazyStackedTensorDict"
    assert ours.tensordicts[1] is ours_rows[1] and ours.stack_dim == ref.stack_dim == 1
    assert (ours["a"] == ref["a"]).all() and tdshare.lazy_legacy() is False
    assert type(torch.stack(ours_rows, 0)) is TensorDict  # the default: dense
    assert type(tdshare._stack(ours_rows, 0)) is TensorDict


def test_cat_of_lazy_stacks_off_their_stack_dim_matches_reference() -> None:
    def parts(lib: Any) -> list[Any]:
        return [
            lib.LazyStackedTensorDict(
                *(lib.TensorDict(a=torch.arange(3.0) + 10 * j + i, batch_size=[3]) for i in range(2)), stack_dim=0
            )
            for j in range(2)
        ]

    ours, ref = torch.cat(parts(tdshare), 1), torch.cat(parts(tensordict), 1)
    assert ours.batch_size == ref.batch_size == (2, 6) and ours.stack_dim == 0
    assert (ours["a"] == ref["a"]).all()


# -- set_non_tensor, _has_names ---------------------------------------------------------------------
def test_set_non_tensor_matches_reference() -> None:
    ours = TensorDict(a=torch.zeros(4), batch_size=[4]).set_non_tensor(("data", "text"), [1, 2])
    ref = tensordict.TensorDict(a=torch.zeros(4), batch_size=[4]).set_non_tensor(("data", "text"), [1, 2])
    assert ours["data", "text"] == ref["data", "text"] == [1, 2]
    assert ours[2]["data", "text"] == ref[2]["data", "text"]
    wrapped = TensorDict(batch_size=[2]).set_non_tensor("x", tdshare.NonTensorData("y", batch_size=[2]))
    assert wrapped["x"] == "y"
    named = TensorDict(batch_size=[2], names=["t"])
    assert named._has_names() and not TensorDict(batch_size=[2])._has_names()


# -- _lock_parents_weakrefs -------------------------------------------------------------------------
def test_lock_parents_recorded_like_reference() -> None:
    def tree(lib: Any) -> Any:
        inner = lib.TensorDict(m=lib.TensorDict(x=torch.zeros(2), batch_size=[2]), batch_size=[2])
        return lib.TensorDict(a=torch.zeros(2), n=inner, batch_size=[2])

    ours, ref = tree(tdshare).lock_(), tree(tensordict).lock_()
    for key in ("n", ("n", "m")):
        assert len(ours.get(key)._lock_parents_weakrefs) == len(ref.get(key)._lock_parents_weakrefs)
    assert ours._lock_parents_weakrefs == [] and not ref._lock_parents_weakrefs
    assert ours["n"]._lock_parents_weakrefs[0]() is ours
    assert isinstance(ours["n"]._lock_parents_weakrefs[0], weakref.ref)
    row = ours[0]  # a row of a locked tensordict is locked too, its levels know the row
    assert row.is_locked and row["n"]._lock_parents_weakrefs[0]() is row
    ours.unlock_()
    assert ours["n"]._lock_parents_weakrefs == []


# -- across processes ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", SHARE_KINDS)
def test_shared_kind_is_locked_and_written_in_place_by_a_child(kind: str, method: str) -> None:
    td = make(kind)
    if kind == "sub_td":
        parent = TensorDict(a=torch.zeros(2, 4), n={"b": torch.zeros(2, 4, 2)}, batch_size=[2, 4]).share_memory_()
        td = parent._get_sub_tensordict(1)
    else:
        td.share_memory_()
        parent = None
    ctx = mp.get_context(method)
    ready, results = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_child_writes_and_reports_locks, args=(td, ready, results))
    child.start()
    try:
        locked, root_refs, nested_locked, nested_refs = results.get(timeout=TIMEOUT)
        assert ready.wait(TIMEOUT)
    finally:
        child.join(TIMEOUT)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert locked and root_refs == 0
    assert all(nested_locked) and all(nested_refs)
    assert _nested_b(td)[2].tolist() == [7.0, 7.0] and td["a"][1].item() == -1.0
    if parent is not None:
        assert parent["n", "b"][1, 2].tolist() == [7.0, 7.0] and parent["a"][1, 1].item() == -1.0


@pytest.mark.parametrize("kind", ["typed", "typed_nested", "legacy_stack", "non_tensor"])
def test_map_over_kind_matches_apply(kind: str) -> None:
    td = make(kind)
    with mp.get_context("fork").Pool(2) as pool:
        out = td.map(_add_one, dim=0, pool=pool)
    expected = td.apply(lambda t: t + 1)
    assert (out["a"] == expected["a"]).all() and (_nested_b(out) == _nested_b(expected)).all()


def _add_one(td: Any) -> Any:
    return td.apply(lambda t: t + 1)


# -- MetaData ---------------------------------------------------------------------------------------
def test_metadata_matches_reference() -> None:
    config = {"lr": 0.1}
    ours = TensorDict(a=torch.zeros(3), batch_size=[3])
    ours["config"] = tdshare.MetaData(config, batch_size=[3])
    ref = tensordict.TensorDict(a=torch.zeros(3), batch_size=[3])
    ref["config"] = tensordict.MetaData(config, batch_size=[3])
    assert ours["config"] is config and ref["config"] is config
    assert ours[1]["config"] is config and ref[1]["config"] is config
    assert type(tdshare.MetaData[str]("x")) is tdshare.MetaData[str]  # one class per type, cached
    with pytest.raises(TypeError, match=r"Expected data of type str, got int"):
        tdshare.MetaData[str](1)
    with pytest.raises(TypeError, match=r"Expected data of type str, got int"):
        tensordict.MetaData[str](1)


@pytest.mark.parametrize("method", METHODS)
def test_typed_metadata_crosses_processes(method: str) -> None:
    td = TensorDict(a=torch.zeros(2), batch_size=[2])
    td.set(("data", "meta"), tdshare.MetaData[str]("a metadata!"))
    td.share_memory_()
    ctx = mp.get_context(method)
    results = ctx.Queue()
    child = ctx.Process(target=_child_reports_metadata, args=(td, results))
    child.start()
    try:
        assert results.get(timeout=TIMEOUT) == ("MetaData[str]", "a metadata!")
    finally:
        child.join(TIMEOUT)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def _child_reports_metadata(td: Any, results: Any) -> None:
    leaf = td.get(("data", "meta"))
    results.put((type(leaf).__name__, leaf.data))


# -- first-class dims --------------------------------------------------------------------------------
def test_first_class_dims_on_lazy_stacks_and_memmap_match_reference() -> None:
    ftdim = pytest.importorskip("functorch.dim")

    def stacked(lib: Any) -> Any:
        rows = [lib.TensorDict(a=torch.zeros(4, 3, 1, 5), batch_size=[4, 3, 1]) for _ in range(2)]
        return lib.LazyStackedTensorDict(*rows, stack_dim=2)

    ours, ref = stacked(tdshare), stacked(tensordict)
    d0, d1 = ftdim.dims(2)
    assert ours[d0].shape == ref[d0].shape == (3, 2, 1)
    assert ours[d0, d1].shape == ref[d0, d1].shape == (2, 1)
    d0, d1, d2 = ftdim.dims(3)
    with pytest.raises(ValueError, match=r"Cannot index"):
        ours[d0, d1, d2]
    with pytest.raises(ValueError, match=r"Cannot index"):
        ref[d0, d1, d2]
    mapped = TensorDict(a=torch.zeros(4, 3), batch_size=[4]).memmap_()
    with pytest.raises(ValueError, match=r"Using first class dimension indices with MemoryMappedTensor"):
        mapped[ftdim.dims(1)]
    with pytest.raises(ValueError, match=r"Using first class dimension indices with MemoryMappedTensor"):
        tensordict.TensorDict(a=torch.zeros(4, 3), batch_size=[4]).memmap_()[ftdim.dims(1)]
