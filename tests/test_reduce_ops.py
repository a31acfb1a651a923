"""Reductions, arithmetic and comparisons, on every container kind, against tensordict 0.15.3."""

from __future__ import annotations

import multiprocessing as mp
import operator
import tempfile
import warnings
from typing import Any

import pytest
import tensordict as ref
import torch
from _kinds import KINDS, Sample, build

import tdshare
from tdshare import LazyStackedTensorDict, MissingKeyError, NotSupportedError, TensorDict


@ref.tensorclass
class RefSample:
    """The reference twin of ``_kinds.Sample``."""

    a: torch.Tensor
    n: ref.TensorDict
    s: str


def ref_build(kind: str, offset: float = 0.0) -> Any:
    """The reference's container with the content of ``build(kind)``."""
    a = torch.arange(4.0) + offset
    b = torch.zeros(4, 2) + offset
    if kind == "tensordict":
        return ref.TensorDict(a=a, n={"b": b}, s="text", batch_size=[4])
    if kind == "tensorclass":
        return RefSample(a=a, n=ref.TensorDict(b=b, batch_size=[4]), s="text", batch_size=[4])
    members = [ref.TensorDict(a=a[i], n={"b": b[i]}, batch_size=[]) for i in range(4)]
    return ref.LazyStackedTensorDict(*members, stack_dim=0)  # no "s": see test_lazy_reduction_non_tensor


def varied(mod: Any) -> Any:
    """A richer tensordict: negative, fractional and 2-d batch values, an integer leaf."""
    g = torch.Generator().manual_seed(0)
    return mod.TensorDict(
        a=torch.randn(4, 3, generator=g),
        n=mod.TensorDict(b=torch.randn(4, 3, 2, generator=g), batch_size=[4, 3]),
        i=torch.arange(12).view(4, 3),
        batch_size=[4, 3],
    )


def same(mine: Any, theirs: Any, kind: str = "tensordict") -> None:
    """``mine`` (tdshare) holds what ``theirs`` (the reference) holds: type family, batch size, values."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(mine, torch.Tensor) and not isinstance(mine, tdshare.TensorDict)
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
        torch.testing.assert_close(mine, theirs, equal_nan=True)
        return
    if isinstance(theirs, tuple):
        assert type(mine).__name__ == type(theirs).__name__ and len(mine) == len(theirs)
        for m, t in zip(mine, theirs, strict=True):
            same(m, t, kind)
        return
    if isinstance(theirs, bool):
        assert mine is theirs
        return
    if ref.is_tensorclass(theirs):
        assert tdshare.is_tensorclass(mine), f"expected a tensorclass, got {type(mine).__name__}"
    elif isinstance(theirs, ref.LazyStackedTensorDict):
        assert isinstance(mine, LazyStackedTensorDict)
    else:
        assert isinstance(mine, tdshare.TensorDict) and not isinstance(mine, LazyStackedTensorDict), type(mine)
    assert mine.batch_size == theirs.batch_size
    keys = {k for k, v in theirs.items(True, True) if isinstance(v, torch.Tensor)}
    mine_keys = {k for k, v in mine.items(True, True) if isinstance(v, torch.Tensor)}
    assert mine_keys == keys
    for key in keys:
        same(mine.get(key), theirs.get(key), kind)
    if kind != "lazy" and "s" in theirs.keys():
        value = theirs.get("s")
        assert mine.get("s") == getattr(value, "data", value)


def both(kind: str, expr: Any, offset: float = 0.0) -> tuple[Any, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return expr(build(kind, offset)), expr(ref_build(kind, offset))


REDUCTIONS = [
    lambda t: t.sum(),
    lambda t: t.sum(0),
    lambda t: t.sum(-1, keepdim=True),
    lambda t: t.sum(keepdim=True),
    lambda t: t.sum(dim=None),
    lambda t: t.sum(dim=()),
    lambda t: t.sum(dim=(0,)),
    lambda t: t.sum(reduce=True),
    lambda t: t.sum(dtype=torch.float64),
    lambda t: t.nansum(0),
    lambda t: t.mean(),
    lambda t: t.mean(0, keepdim=True),
    lambda t: t.nanmean(),
    lambda t: t.mean(reduce=True),
    lambda t: t.std(),
    lambda t: t.std(0, correction=0),
    lambda t: t.var(0),
    lambda t: t.var(reduce=True),
    lambda t: t.prod(),
    lambda t: t.prod(0),
    lambda t: t.max(),
    lambda t: t.max(0),
    lambda t: t.max(0, return_indices=False),
    lambda t: t.max(0, keepdim=True),
    lambda t: t.max(reduce=True),
    lambda t: t.min(0),
    lambda t: t.min(),
    lambda t: t.amax(),
    lambda t: t.amax(0),
    lambda t: t.amin(0, keepdim=True),
    lambda t: t.cummax(0),
    lambda t: t.cummin(0, return_indices=False),
    lambda t: t.all(),
    lambda t: t.any(),
    lambda t: t.all(0),
    lambda t: t.any(-1),
    lambda t: t.quantile(0.5),
    lambda t: t.quantile(0.25, 0),
    lambda t: t.quantile(torch.tensor([0.25, 0.75]), 0),
    lambda t: t.quantile(0.5, reduce=True),
    lambda t: t.norm(),
    lambda t: t.logsumexp(),
    lambda t: t.logsumexp(0, keepdim=True),
    lambda t: t.softmax(0),
    lambda t: t.softmax(-1),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index", range(len(REDUCTIONS)))
def test_reduction_matches_reference(kind: str, index: int) -> None:
    mine, theirs = both(kind, REDUCTIONS[index], offset=-1.5)
    if kind == "lazy" and isinstance(theirs, ref.TensorDict) and not isinstance(theirs, ref.LazyStackedTensorDict):
        kind = "lazy"  # reduced through a dense copy: a TensorDict in both
    same(mine, theirs, kind)


VARIED = [
    lambda t: t.sum(1),
    lambda t: t.sum((0, 1)),
    lambda t: t.sum((0, -1), keepdim=True),
    lambda t: t.mean(dim="feature"),
    lambda t: t.std(dim="feature"),
    lambda t: t.nansum(dim="feature"),
    lambda t: t.quantile(0.5, dim="feature"),
    lambda t: t.sum(dim="feature", reduce=True),
    lambda t: t.mean(1, reduce=True),
    lambda t: t.max(1),
    lambda t: t.min(0, keepdim=True),
    lambda t: t.amax(1),
    lambda t: t.amax((0, 1)),
    lambda t: t.prod((1,)),
    lambda t: t.cummax(1),
    lambda t: t.all(1),
    lambda t: t.any(0),
    lambda t: t.logsumexp((0, 1)),
    lambda t: t.softmax(1),
    lambda t: t.quantile(0.5, dim=(1,)),
]


@pytest.mark.filterwarnings(r"ignore:std\(\)")
@pytest.mark.parametrize("index", range(len(VARIED)))
def test_reduction_of_two_batch_dims_matches_reference(index: int) -> None:
    fn = VARIED[index]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            theirs = fn(varied(ref).float())
        except Exception as err:  # the reference refuses: so do we, with an error of the same builtin
            with pytest.raises(
                type(err).__mro__[0] if type(err) in (RuntimeError, ValueError, TypeError) else Exception
            ):
                fn(varied(tdshare).apply(lambda t: t.float()))
            return
    same(fn(varied(tdshare).apply(lambda t: t.float())), theirs)


def test_names_follow_the_reduced_dims() -> None:
    td = varied(tdshare)
    td.names = ["x", "y"]
    assert td.sum(0).names == ["y"]
    assert td.sum(1, keepdim=True).names == ["x", "y"]
    assert td.all(0).names == ["y"]
    assert td.logsumexp(1).names == ["x"]
    assert td.sum().batch_size == () and td.max(1).values.names == ["x"]


OPS = [
    lambda t: t + 1,
    lambda t: 1 + t,
    lambda t: 2 - t,
    lambda t: t - 0.5,
    lambda t: t * 3,
    lambda t: 3 * t,
    lambda t: t / 2,
    lambda t: 2 / t,
    lambda t: t % 3,
    lambda t: t**2,
    lambda t: -t,
    lambda t: abs(t),
    lambda t: t + t,
    lambda t: t * t,
    lambda t: t - t,
    lambda t: t / (t + 10),
    lambda t: t + torch.arange(4.0),
    lambda t: t * torch.tensor(2.0),
    lambda t: t < 1,
    lambda t: t <= 1,
    lambda t: t > 1,
    lambda t: t >= t,
    lambda t: t < torch.arange(4.0),
    lambda t: t.add(t, alpha=2),
    lambda t: t.sub(1, alpha=2),
    lambda t: t.rsub(1),
    lambda t: t.mul(t),
    lambda t: t.div(4),
    lambda t: t.pow(2),
    lambda t: t.mod(2),
    lambda t: t.maximum(t * 0 + 1),
    lambda t: t.minimum(t * 0 + 1),
    lambda t: t.clamp(0, 2),
    lambda t: t.clamp(min=1),
    lambda t: t.clamp(max=1),
    lambda t: t.clamp_min(1),
    lambda t: t.clamp_max(1),
    lambda t: t.lerp(t * 2, 0.25),
    lambda t: t.addcmul(t, t + 1, value=2),
    lambda t: t.addcdiv(t, t + 10, value=0.5),
    lambda t: t.logical_and(t),
    lambda t: t.exp(),
    lambda t: t.log1p(),
    lambda t: t.sqrt(),
    lambda t: t.abs().sqrt(),
    lambda t: t.sign(),
    lambda t: t.sigmoid(),
    lambda t: t.floor(),
    lambda t: t.ceil(),
    lambda t: t.round(),
    lambda t: t.neg(),
    lambda t: t.reciprocal(),
    lambda t: t.tanh(),
    lambda t: t.frac(),
    lambda t: t.isfinite(),
    lambda t: t.isnan(),
    lambda t: t.sqrt().isnan(),
    lambda t: t.reciprocal().isposinf(),
    lambda t: ~(t > 0),
    lambda t: (t > 0) & (t < 2),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index", range(len(OPS)))
def test_pointwise_matches_reference(kind: str, index: int) -> None:
    mine, theirs = both(kind, OPS[index], offset=-1.5)
    same(mine, theirs, kind)


INPLACE = [
    lambda t: t.add_(1),
    lambda t: t.add_(t, alpha=2),
    lambda t: t.sub_(2),
    lambda t: t.mul_(t),
    lambda t: t.div_(2),
    lambda t: t.pow_(2),
    lambda t: t.exp_(),
    lambda t: t.abs_(),
    lambda t: t.neg_(),
    lambda t: t.sigmoid_(),
    lambda t: t.round_(),
    lambda t: t.clamp_min_(0),
    lambda t: t.clamp_max_(0),
    lambda t: t.maximum_(t * 0),
    lambda t: t.minimum_(t * 0),
    lambda t: t.lerp_(t * 0 + 1, 0.5),
    lambda t: t.addcmul_(t + 0, t + 0),
    lambda t: t.addcdiv_(t + 0, t * 0 + 2),
]


def _iop(t: Any, op: Any) -> Any:
    t2 = t
    t2 = op(t2, 2)
    assert t2 is t
    return t


INPLACE += [
    lambda t: _iop(t, operator.iadd),
    lambda t: _iop(t, operator.isub),
    lambda t: _iop(t, operator.imul),
    lambda t: _iop(t, operator.itruediv),
    lambda t: _iop(t, operator.ipow),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index", range(len(INPLACE)))
def test_inplace_matches_reference_and_returns_self(kind: str, index: int) -> None:
    mine, theirs = build(kind, -1.5), ref_build(kind, -1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert INPLACE[index](mine) is mine
        INPLACE[index](theirs)
    same(mine, theirs, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_inplace_writes_into_memory_mapped_files(kind: str, tmp_path: Any) -> None:
    td = build(kind)
    td.memmap_(str(tmp_path / "td"))
    assert td.is_locked
    td += 1
    td.mul_(2)
    td.exp_()
    td.clamp_max_(100.0)
    loaded = tdshare.load(str(tmp_path / "td"))
    expected = ((torch.arange(4.0) + 1) * 2).exp().clamp_max(100.0)
    a = loaded.a if kind == "tensorclass" else loaded["a"]
    torch.testing.assert_close(a, expected)
    assert torch.equal(td.get(("n", "b")), loaded.get(("n", "b"))) if kind != "tensorclass" else True


def test_lock_and_names_like_the_reference() -> None:
    td = TensorDict(a=torch.arange(3.0), batch_size=[3], names=["x"]).lock_()
    out = td + 1
    assert out.is_locked and out.names == ["x"]  # arithmetic keeps both, as the reference does
    cmp = td < 1
    assert not cmp.is_locked and cmp.names == [None]  # comparisons keep neither
    assert not td.sum().is_locked and td.norm().is_locked
    theirs = ref.TensorDict(a=torch.arange(3.0), batch_size=[3], names=["x"]).lock_()
    assert (theirs + 1).is_locked and not (theirs < 1).is_locked and theirs.norm().is_locked


def test_non_tensor_values_are_kept() -> None:
    td = build("tensordict")
    assert (td + 1)["s"] == "text" and td.sum()["s"] == "text" and (td < 1)["s"] == "text"
    assert "s" not in td.max(0).values.keys()  # as in the reference: (values, indices) hold tensors only
    assert td.amax(0)["s"] == "text"


def test_mismatched_keys_raise_a_key_error() -> None:
    td, other = build("tensordict"), build("tensordict").exclude("a")
    for op in (operator.add, operator.mul, operator.lt):
        with pytest.raises(KeyError):
            op(ref_build("tensordict"), ref_build("tensordict").exclude("a"))
        with pytest.raises(MissingKeyError, match=r"mismatch.*'a'"):
            op(td, other)
    with pytest.raises(MissingKeyError, match=r"n', 'b'"):
        td.add(TensorDict(a=torch.ones(4), s="x", batch_size=[4]))
    before = td["a"].clone()
    with pytest.raises(MissingKeyError):
        td.add_(other)  # checked before anything is written
    assert torch.equal(td["a"], before)


def test_bad_operands() -> None:
    td = build("tensordict")
    with pytest.raises(TypeError):
        td + "x"
    with pytest.raises(TypeError):
        ref_build("tensordict") + {"a": 1}
    with pytest.raises(tdshare.ArgumentTypeError, match=r"operand of type dict"):
        td + {"a": 1}
    with pytest.raises(tdshare.BatchSizeError, match=r"does not broadcast"):
        td + torch.ones(3)
    with pytest.raises(tdshare.ArgumentTypeError, match=r"min and max"):
        td.clamp()
    with pytest.warns(FutureWarning):
        assert (td < None) is False
    with pytest.raises(IndexError):
        td.sum(1)
    with pytest.raises(IndexError):
        ref_build("tensordict").sum(1)
    with pytest.raises(RuntimeError):
        td.all(1)
    with pytest.raises(ValueError):
        td.logsumexp(3)
    with pytest.raises(TypeError, match=r"keepdim"):
        td.sum(dim="feature", keepdim=True)


def test_bool_still_raises() -> None:
    with pytest.raises(RuntimeError):
        bool(build("tensordict"))
    with pytest.raises(RuntimeError):
        bool(ref_build("tensordict"))


def test_floor_division_and_reflected_power() -> None:
    # tensordict 0.15.3 has neither `//` nor `2 ** td`; tdshare gives torch's results leaf by leaf
    td = TensorDict(a=torch.tensor([5.0, -3.0]), batch_size=[2])
    assert (td // 2)["a"].tolist() == [2.0, -2.0]
    assert (7 // td)["a"].tolist() == [1.0, -3.0]
    assert (2**td)["a"].tolist() == [32.0, 0.125]
    assert (7 % td)["a"].tolist() == [2.0, -2.0]
    td //= 2
    assert td["a"].tolist() == [2.0, -2.0]


HETERO = [
    lambda t: t + 1,
    lambda t: t * t,
    lambda t: t.exp(),
    lambda t: t < 0.5,
    lambda t: t.clamp(0.25, 0.75),
    lambda t: t.softmax(1),
    lambda t: t.softmax(0),
    lambda t: t.mean(reduce=True),
    lambda t: t.all(),
]


def _hetero(mod: Any) -> Any:
    return mod.LazyStackedTensorDict(
        mod.TensorDict(a=torch.zeros(3), x=torch.linspace(0, 1, 6).view(3, 2), batch_size=[3]),
        mod.TensorDict(a=torch.ones(3), x=torch.linspace(1, 0, 15).view(3, 5), batch_size=[3]),
        stack_dim=0,
    )


@pytest.mark.parametrize("index", range(len(HETERO)))
def test_lazy_stack_of_different_shapes_works_member_by_member(index: int) -> None:
    mine, theirs = HETERO[index](_hetero(tdshare)), HETERO[index](_hetero(ref))
    if isinstance(theirs, ref.LazyStackedTensorDict):
        assert isinstance(mine, LazyStackedTensorDict) and mine.batch_size == theirs.batch_size
        for m, t in zip(mine.tensordicts, theirs.tensordicts, strict=True):
            same(m, t)
    else:
        same(mine, theirs)


def test_lazy_stack_that_cannot_be_dense_refuses_to_reduce() -> None:
    with pytest.raises(RuntimeError):
        _hetero(ref).sum()
    with pytest.raises(NotSupportedError, match=r"ls.tensordicts\[i\].sum"):
        _hetero(tdshare).sum()
    with pytest.raises(RuntimeError):
        _hetero(tdshare).max(1)


def test_lazy_reduction_non_tensor() -> None:
    # the reference stacks equal strings into a NonTensorStack that cannot be reduced; tdshare keeps
    # one NonTensorData (see the README's differences) and reduces the dense copy
    members = [TensorDict(a=torch.tensor(float(i)), s="text", batch_size=[]) for i in range(3)]
    out = LazyStackedTensorDict(*members).sum()
    assert type(out) is TensorDict and out["a"].item() == 3.0 and out["s"] == "text"


def test_lazy_plus_dense_and_dense_plus_lazy() -> None:
    ls, dense = build("lazy"), build("tensordict").exclude("s")
    theirs_ls, theirs_dense = ref_build("lazy"), ref_build("tensordict").exclude("s")
    same(ls + dense, theirs_ls + theirs_dense, "lazy")
    same(dense + ls, theirs_dense + theirs_ls)
    same(ls + ls, theirs_ls + theirs_ls, "lazy")


def test_tensorclass_results_and_operands() -> None:
    tc = build("tensorclass")
    assert type(tc + tc) is Sample and type(tc.max(0).values) is Sample
    assert type(tc.max(0)).__name__ == "max" and type(tc.sum()) is Sample
    out = build("tensordict").exclude("s") + tc.to_tensordict().exclude("s")
    assert out["a"].tolist() == [0.0, 2.0, 4.0, 6.0]


def test_readme_style_snippet_runs() -> None:
    td = TensorDict(obs=torch.arange(6.0).view(3, 2), batch_size=[3]).memmap_(tempfile.mkdtemp())
    td *= 2
    assert TensorDict.load(td._memmap_prefix)["obs"].sum().item() == 30.0


METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]


def _child_adds(obj: Any, out: Any) -> None:
    try:
        obj += 1
        obj.mul_(2)
        out.put(("ok", obj.get("a").tolist()))
    except BaseException as err:  # reported to the parent
        out.put(("error", repr(err)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", METHODS)
def test_a_child_adds_in_place_into_the_parents_anonymous_memory(method: str, kind: str) -> None:
    obj = build(kind).memmap_()
    ctx = mp.get_context(method)
    out = ctx.Queue()
    proc = ctx.Process(target=_child_adds, args=(obj, out))
    proc.start()
    tag, payload = out.get(timeout=60)
    proc.join(60)
    assert tag == "ok", payload
    expected = ((torch.arange(4.0) + 1) * 2).tolist()
    assert payload == expected and obj.get("a").tolist() == expected
    assert obj.get(("n", "b")).tolist() == [[2.0, 2.0]] * 4


MIXED = [
    lambda t: t + 1,
    lambda t: t + 1.5,
    lambda t: t - 2,
    lambda t: t * 2,
    lambda t: t / 2,
    lambda t: t**2,
    lambda t: -t,
    lambda t: abs(t),
    lambda t: t.exp(),
    lambda t: t.sqrt(),
    lambda t: t.sign(),
    lambda t: t.clamp_min(1),
    lambda t: t.clamp_max(1),
    lambda t: t.maximum(t * 0 + 1),
    lambda t: t.sum(),
    lambda t: t.mean(dtype=torch.float64),
    lambda t: t.prod(0),
    lambda t: t.max(0),
]


def _mixed(mod: Any) -> Any:
    return mod.TensorDict(
        f=torch.linspace(-2, 2, 6).view(3, 2),
        i=torch.arange(-3, 3).view(3, 2),
        n=mod.TensorDict(h=torch.arange(3, dtype=torch.float64), batch_size=[3]),
        batch_size=[3],
    )


@pytest.mark.parametrize("index", range(len(MIXED)))
def test_integer_and_double_leaves_promote_like_the_reference(index: int) -> None:
    same(MIXED[index](_mixed(tdshare)), MIXED[index](_mixed(ref)))


@pytest.mark.parametrize(
    "op", [lambda t: t.add_(1), lambda t: t.mul_(3), lambda t: t.clamp_min_(0), lambda t: t.neg_()]
)
def test_integer_and_double_leaves_in_place_like_the_reference(op: Any) -> None:
    mine, theirs = _mixed(tdshare), _mixed(ref)
    assert op(mine) is mine
    op(theirs)
    same(mine, theirs)


def dig(obj: Any, key: tuple[str, ...]) -> Any:
    """``obj[key]``, stepping into tensorclass entries by attribute."""
    for part in key:
        obj = getattr(obj, part) if tdshare.is_tensorclass(obj) or ref.is_tensorclass(obj) else obj.get(part)
    return obj


def _holder(mod: Any, sample: Any) -> Any:
    members = [mod.TensorDict(x=torch.tensor(float(i) - 1.0), batch_size=[]) for i in range(4)]
    return mod.TensorDict(
        a=torch.linspace(-1, 1, 4),
        ls=mod.LazyStackedTensorDict(*members, stack_dim=0),
        tc=sample(a=torch.arange(4.0), n=mod.TensorDict(b=torch.ones(4, 2), batch_size=[4]), s="x", batch_size=[4]),
        batch_size=[4],
    )


HOLDER = [
    lambda t: t + 1,
    lambda t: t * t,
    lambda t: 1 - t,
    lambda t: t.exp(),
    lambda t: t < 0,
    lambda t: t.sum(),
    lambda t: t.mean(0),
    lambda t: t.add_(1),
    lambda t: t.mul_(t.clone()),
]


@pytest.mark.parametrize("index", range(len(HOLDER)))
def test_a_tensordict_holding_a_lazy_stack_and_a_tensorclass(index: int) -> None:
    mine, theirs = HOLDER[index](_holder(tdshare, Sample)), HOLDER[index](_holder(ref, RefSample))
    assert mine.batch_size == theirs.batch_size
    for key in [("a",), ("ls", "x"), ("tc", "a"), ("tc", "n", "b")]:
        same(dig(mine, key), dig(theirs, key))
    if isinstance(mine["ls"], LazyStackedTensorDict):
        assert isinstance(theirs["ls"], ref.LazyStackedTensorDict)
    assert type(mine["tc"]) is Sample and type(theirs["tc"]) is RefSample


MASK = torch.tensor([True, False, True, False])
WHERE = [
    lambda t: t.where(MASK, 0.0),
    lambda t: t.where(MASK, torch.tensor(-1.0)),
    lambda t: t.where(MASK, t * 10),
    lambda t: t.where(MASK, t * 10, out=t.clone()),
    lambda t: torch.where(MASK, t, -5.0),
    lambda t: torch.where(MASK, -5.0, t),
    lambda t: torch.exp(t),
    lambda t: torch.sum(t),
    lambda t: torch.sum(t, 0),
    lambda t: torch.mean(t, 0),
    lambda t: torch.std(t),
    lambda t: torch.clamp(t, 0, 1),
    lambda t: torch.add(t, t, alpha=2),
    lambda t: torch.maximum(t, t * 0),
    lambda t: torch.isnan(t),
    lambda t: torch.sqrt_(t.abs()),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index", range(len(WHERE)))
def test_where_and_torch_functions_match_reference(kind: str, index: int) -> None:
    try:
        mine, theirs = both(kind, WHERE[index], offset=-1.5)
    except TypeError:  # the reference's tensorclasses lack torch.sum, torch.std, ...: as its TensorDict then
        assert kind == "tensorclass"
        mine = WHERE[index](build(kind, -1.5))
        assert type(mine) is Sample or isinstance(mine, torch.Tensor)
        _, theirs = both("tensordict", WHERE[index], offset=-1.5)
        same(getattr(mine, "_tensordict", mine), theirs)
        return
    same(mine, theirs, kind)


def test_where_pads_entries_only_one_side_has() -> None:
    td, theirs = build("tensordict"), ref_build("tensordict")
    other = td.exclude("a").set("z", torch.ones(4))
    ref_other = theirs.exclude("a").set("z", torch.ones(4))
    same(td.where(MASK, other, pad=-1), theirs.where(MASK, ref_other, pad=-1))
    with pytest.raises(KeyError):
        theirs.where(MASK, ref_other)
    with pytest.raises(MissingKeyError):
        td.where(MASK, other)
    with pytest.raises(tdshare.ArgumentTypeError, match=r"condition"):
        td.where([True] * 4, 0.0)


@pytest.mark.parametrize("kind", KINDS)
def test_logsumexp_and_norm_write_into_the_tensors_of_out(kind: str) -> None:
    c = build(kind)
    for name, kwargs in (("logsumexp", {"dim": 0}), ("norm", {})):
        expected = getattr(c, name)(**kwargs)
        out = expected.clone().zero_()
        before = {k: out.get(k) for k in out.keys(True, True) if isinstance(out.get(k), torch.Tensor)}
        assert getattr(c, name)(**kwargs, out=out) is out
        for key, tensor in before.items():
            assert torch.equal(tensor, expected.get(key))  # the same tensor objects got the values
            if kind != "lazy":  # a lazy stack's get stacks a copy
                assert out.get(key) is tensor
        empty = expected.empty()
        assert torch.equal(getattr(c, name)(**kwargs, out=empty).get("a"), expected.get("a"))  # added when missing


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "clamp_min", "clamp_max"])
def test_binary_methods_take_a_default_for_keys_one_side_lacks_as_the_reference(name: str) -> None:
    def pair(lib: Any) -> tuple[Any, Any]:
        return lib.TensorDict(a=2.0, b=2.0, c=2.0, s="kept"), lib.TensorDict(b=3.0, c=3.0, d=3.0, s="kept")

    (mine, other), (their_td, their_other) = pair(tdshare), pair(ref)
    with pytest.raises(KeyError):
        getattr(mine, name)(other)
    for default in (torch.tensor(10.0), "intersection"):
        ours = getattr(mine, name)(other, default=default)
        theirs = getattr(their_td, name)(their_other, default=default)
        assert sorted(map(str, ours.keys())) == sorted(map(str, theirs.keys())), (name, default)
        for key in ("a", "b", "c", "d"):
            if key in theirs.keys():
                assert torch.equal(ours[key], theirs[key]), (name, default, key)
        assert ours["s"] == "kept"
