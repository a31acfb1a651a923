"""The TensorDict surface added in session 8 for the reference's test_generic.py (issue 16): values
checked against tensordict 0.15.3, over every container kind where the operation applies to all."""

from __future__ import annotations

import collections
import warnings
from typing import Any

import pytest
import tensordict
import torch
import torch.utils._pytree as pytree
from _kinds import KINDS, build
from torch import nn

import tdshare
from tdshare import LazyStackedTensorDict, TensorDict, TensorDictParams

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)


def _reference(kind: str) -> Any:
    """The content of ``build(kind)`` as a tensordict 0.15.3 TensorDict."""
    return tensordict.TensorDict(a=torch.arange(4.0), n={"b": torch.zeros(4, 2)}, s="text", batch_size=[4])


# -- td[idx] = other with new keys ----------------------------------------------------------------
def test_setitem_index_adds_new_keys_as_the_reference() -> None:
    ours, ref = TensorDict(batch_size=[5, 3]), tensordict.TensorDict(batch_size=[5, 3])
    for target in (ours, ref):
        row = {"x": torch.ones(3, 2), "n": {"y": torch.full((3,), 7)}}
        target[1] = TensorDict(row, batch_size=[3]) if target is ours else tensordict.TensorDict(row, batch_size=[3])
    assert ours["x"].shape == ref["x"].shape == (5, 3, 2)
    assert torch.equal(ours["x"], ref["x"]) and torch.equal(ours["n", "y"], ref["n", "y"])
    assert ours["n"].batch_size == ref["n"].batch_size and ours["x"].dtype == ref["x"].dtype


def test_setitem_index_new_nested_level_keeps_its_extra_batch_dims() -> None:
    value = TensorDict(obs=TensorDict(img=torch.ones(3, 4, 2), batch_size=[3, 4]), batch_size=[3])
    ours = TensorDict(batch_size=[5, 3])
    ours[0] = value
    ref = tensordict.TensorDict(batch_size=[5, 3])
    ref[0] = tensordict.TensorDict(
        obs=tensordict.TensorDict(img=torch.ones(3, 4, 2), batch_size=[3, 4]), batch_size=[3]
    )
    assert ours["obs"].batch_size == ref["obs"].batch_size == (5, 3, 4)
    assert torch.equal(ours["obs", "img"], ref["obs", "img"])


def test_setitem_index_on_a_locked_tensordict_still_refuses_new_keys() -> None:
    td = TensorDict(a=torch.zeros(3), batch_size=[3]).lock_()
    with pytest.raises(tdshare.LockedError):
        td[0] = {"b": torch.ones(())}
    assert "b" not in td


# -- sub-tensordict views -------------------------------------------------------------------------
def test_sub_tensordict_set_new_key_reaches_the_parent() -> None:
    source = {"a": torch.randn(10, 10, 10)}
    ours, ref = TensorDict(source, batch_size=[10, 10]), tensordict.TensorDict(source, batch_size=[10, 10])
    c = torch.randn(2, 10, 10)
    before_ours, before_ref = ours._get_sub_tensordict(0), ref._get_sub_tensordict(0)
    ours._get_sub_tensordict(slice(2, 4)).set("c", c)
    ref._get_sub_tensordict(slice(2, 4)).set("c", c)
    assert torch.equal(ours["c"], ref["c"]) and torch.equal(ours["c"][2:4], c)
    assert torch.equal(before_ours.get("c"), before_ref.get("c"))  # a view made before reads it too


def test_sub_tensordict_refuses_set_of_an_existing_key_and_writes_with_set_() -> None:
    td = TensorDict(a=torch.zeros(4, 5, 1), batch_size=[4, 5])
    sub = td._get_sub_tensordict((2, 2))
    ref = tensordict.TensorDict(a=torch.zeros(4, 5, 1), batch_size=[4, 5])._get_sub_tensordict((2, 2))
    for view in (sub, ref):
        with pytest.raises(RuntimeError, match="prohibited for existing tensors"):
            view.set("a", torch.ones(1))
    sub.set_("a", torch.ones(1))
    assert td["a"][2, 2].item() == 1.0 and td["a"].sum().item() == 1.0
    assert sub.get_parent_tensordict() is td
    assert td._get_sub_tensordict(2)._get_sub_tensordict(2).get_parent_tensordict().get_parent_tensordict() is td
    with pytest.raises(tdshare.NotSupportedError, match="_get_sub_tensordict"):
        td.get_parent_tensordict()


# -- legacy views ---------------------------------------------------------------------------------
def test_legacy_view_and_permute_give_the_source_back() -> None:
    td = TensorDict(a=torch.randn(3, 4), batch_size=[3, 4])
    with tdshare.set_lazy_legacy(True):
        assert td.view(-1).view(-1, 4) is td
        assert td.permute(1, 0).permute(1, 0) is td
        with pytest.raises(RuntimeError):
            td.permute(1, 1)
        with pytest.raises(IndexError):
            td.permute(2, 0)
    assert td.view(-1).view(3, 4) is not td  # outside legacy mode every view is new, as in the reference
    ref = tensordict.TensorDict(a=torch.randn(3, 4), batch_size=[3, 4])
    with tensordict.utils.set_lazy_legacy(True):
        assert ref.view(-1).view(-1, 4) is ref


# -- stack keywords, torch functions --------------------------------------------------------------
def test_stack_keywords() -> None:
    rows = [TensorDict(a=torch.full((2,), float(i)), batch_size=[2]) for i in range(3)]
    with tdshare.set_lazy_legacy(True):
        dense = tdshare.stack(rows, 1, contiguous=True)
    assert type(dense) is TensorDict and dense.batch_size == (2, 3)
    ref = tensordict.stack([tensordict.TensorDict(a=torch.full((2,), float(i)), batch_size=[2]) for i in range(3)], 1)
    assert torch.equal(dense["a"], ref["a"])
    mixed = tdshare.stack([rows[0], TensorDict(b=torch.zeros(2), batch_size=[2])], maybe_dense_stack=True)
    assert isinstance(mixed, LazyStackedTensorDict)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["zeros_like", "ones_like", "full_like"])
def test_torch_like_functions(kind: str, name: str) -> None:
    func = getattr(torch, name)
    args = (3.0,) if name == "full_like" else ()
    ours, ref = func(build(kind), *args), func(_reference(kind), *args)
    assert type(ours) is type(build(kind))
    assert torch.equal(ours["a"], ref["a"]) and torch.equal(ours["n", "b"], ref["n", "b"])
    assert ours["s"] == "text"


def test_masked_select() -> None:
    mask = torch.tensor([True, False, True, True])
    ours, ref = torch.masked_select(build("tensordict"), mask), torch.masked_select(_reference("tensordict"), mask)
    assert ours.batch_size == ref.batch_size and torch.equal(ours["a"], ref["a"])


def test_subclass_results_keep_the_subclass() -> None:
    class SubTD(TensorDict): ...

    t = SubTD(a=torch.randn(3))
    assert isinstance(torch.zeros_like(t), SubTD) and isinstance(t + t, SubTD)


# -- nn -------------------------------------------------------------------------------------------
def test_from_module_as_module_is_a_tensordict_params() -> None:
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    ours = TensorDict.from_module(net, as_module=True)
    ref = tensordict.TensorDict.from_module(net, as_module=True)
    assert isinstance(ours, TensorDictParams) and isinstance(ours, nn.Module)
    assert set(ours.parameters()) == set(ref.parameters()) == set(net.parameters())
    assert type(ours["1", "running_mean"]) is torch.Tensor  # buffers stay tensors, as in the reference


def test_vmap_over_stacked_parameters() -> None:
    modules = [nn.Linear(3, 4) for _ in range(3)]
    params = TensorDict.from_modules(*modules)
    empty = nn.Linear(3, 4, device="meta")

    def run(p: Any, x: torch.Tensor) -> torch.Tensor:
        with p.to_module(empty):
            return empty(x)

    x = torch.randn(3)
    y = torch.vmap(run, (0, None))(params, x)
    expected = torch.stack([m(x) for m in modules])
    torch.testing.assert_close(y, expected)
    y.sum().backward()
    assert all(p.grad is not None for p in params.values(True, True))


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd"])
def test_jacobians_of_a_tensordict_function_are_tensordicts_of_tensordicts(transform: str) -> None:
    td = TensorDict(a=torch.randn(3, 2), b=torch.randn(3, 2), batch_size=[3])

    def f(x: Any) -> Any:
        return type(x)({"x": x["a"] ** 2, "y": x["b"] ** 3}, batch_size=x.batch_size)

    jac = getattr(torch.func, transform)(f)(td)
    ref_td = tensordict.TensorDict(a=td["a"], b=td["b"], batch_size=[3])
    ref = getattr(torch.func, transform)(f)(ref_td)
    assert jac.batch_size == ref.batch_size == td.batch_size
    for out_key in ("x", "y"):
        for in_key in ("a", "b"):
            torch.testing.assert_close(jac[out_key, in_key], ref[out_key, in_key])
    assert torch.allclose(jac["x", "a"].flatten(-2).flatten(end_dim=-2), torch.diag(2 * td["a"].flatten()))


def test_from_modules_expand_identical_keeps_grads_to_the_shared_tensor() -> None:
    shared = nn.Linear(3, 3)
    modules = [nn.Sequential(shared, nn.Linear(3, 4)) for _ in range(2)]
    params = TensorDict.from_modules(*modules, expand_identical=True)
    assert not isinstance(params["0", "weight"], nn.Parameter)
    params["0", "weight"].sum().backward()
    assert shared.weight.grad is not None and torch.equal(shared.weight.grad, torch.full((3, 3), 2.0))


# -- pytree ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_pytree_flatten_round_trip(kind: str) -> None:
    td = build(kind)
    leaves, spec = pytree.tree_flatten(td)
    ref_leaves, _ = pytree.tree_flatten(_reference(kind))
    assert len(leaves) == len(ref_leaves) == 2
    back = pytree.tree_unflatten([leaf + 1 for leaf in leaves], spec)
    assert torch.equal(back["a"], td["a"] + 1) and back["s"] == "text" and back.batch_size == td.batch_size


def test_from_pytree_round_trip() -> None:
    pair = collections.namedtuple("pair", ["x", "y"])
    tree = {
        "a": [torch.zeros(2), (torch.ones(2), 3)],
        "b": pair(torch.ones(1), {"z": torch.zeros(1)}),
        5: torch.ones(3),
    }
    ours = TensorDict.from_pytree(tree)
    ref = tensordict.TensorDict.from_pytree(tree)
    assert torch.equal(ours["a", "1", "1"], ref["a", "1", "1"])
    back = ours.to_pytree()
    assert isinstance(back["a"], list) and isinstance(back["a"][1], tuple) and isinstance(back["b"], pair)
    assert torch.equal(back[5], torch.ones(3)) and int(back["a"][1][1]) == 3
    pytree.tree_map(lambda u, v: torch.testing.assert_close(torch.as_tensor(u), torch.as_tensor(v)), tree, back)


# -- small methods --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_to_tensordict_param_count_values_list(kind: str) -> None:
    c, ref = build(kind), _reference(kind)
    plain = c.to_tensordict(retain_none=True)
    assert type(plain) is TensorDict and torch.equal(plain["a"], ref["a"])
    assert c.param_count() == ref.param_count() == 12
    if kind != "tensorclass":  # private names are the tensordict's (a tensorclass forwards public ones)
        assert len(c._values_list(True, True)) == len(ref._values_list(True, True)) == 2
        c._check_batch_size()


def test_param_count_duplicates_and_check_batch_size() -> None:
    td = TensorDict(a=torch.randn(3), b=torch.randn(6))
    td["c"] = td["a"]
    ref = tensordict.TensorDict(a=td["a"], b=td["b"], c=td["a"])
    assert td.param_count(count_duplicates=False) == ref.param_count(count_duplicates=False) == 9
    assert td.param_count() == ref.param_count() == 12
    broken = TensorDict(a=torch.zeros(3, 2), batch_size=[3])
    broken._batch_size = torch.Size([4])  # what a bad manual edit would leave
    with pytest.raises(tdshare.BatchSizeError, match="'a'"):
        broken._check_batch_size()


def test_contains_refuses_a_non_key_as_both_errors() -> None:
    td = TensorDict.fromkeys({"a", ("d", "e")}, 0)
    for bad in (td, LazyStackedTensorDict(td, td)):
        with pytest.raises(RuntimeError, match="NestedKey"):
            0 in bad  # noqa: B015
        with pytest.raises(TypeError):
            0 in bad  # noqa: B015
    with pytest.raises(RuntimeError, match="NestedKey"):
        0 in tensordict.TensorDict.fromkeys({"a"}, 0)  # noqa: B015


def test_autocast_number_field_takes_a_one_element_tensor() -> None:
    @tdshare.tensorclass(autocast=True)
    class Ours:
        y: int

    @tensordict.tensorclass(autocast=True)
    class Ref:
        y: int

    assert Ours(y=torch.tensor(3)).y == Ref(y=torch.tensor(3)).y == 3
    assert isinstance(Ours(y=torch.tensor(3)).y, int) and isinstance(Ref(y=torch.tensor(3)).y, int)


def test_from_dict_instance_rebuilds_tensorclasses_through_their_constructor() -> None:
    def check(tc: Any, td_cls: Any) -> None:
        @tc(autocast=True)
        class Item:
            x: torch.Tensor = None  # type: ignore[assignment]
            y: int = None  # type: ignore[assignment]

        td = td_cls({"a": torch.zeros(()), "b": Item(x=torch.ones(()), y=1)})
        recon = td.from_dict_instance(td.to_dict(), auto_batch_size=True)
        assert isinstance(recon["b"], Item) and isinstance(recon["b"].y, int) and recon["b"].y == 1
        assert torch.equal(recon["b"].x, torch.ones(()))

    check(tdshare.tensorclass, TensorDict)
    check(tensordict.tensorclass, tensordict.TensorDict)
