"""nn helpers (tdshare/_nn.py): from_module, from_modules, to_module, state_dict, load_state_dict,
compared with tensordict 0.15.3."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import tensordict
import torch
from _kinds import KINDS, build
from torch import nn

import tdshare
from tdshare import TensorDict


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def _keys(td: Any) -> list[str]:
    return sorted(map(str, td.keys(True, True)))


@pytest.mark.parametrize("filter_empty", [True, False])
def test_from_module_matches_the_reference(filter_empty: bool) -> None:
    net = _net()
    params = TensorDict.from_module(net, filter_empty=filter_empty)
    ref = tensordict.TensorDict.from_module(net, filter_empty=filter_empty)
    assert _keys(params) == _keys(ref) and sorted(params.keys()) == sorted(ref.keys())
    assert ("2" in params.keys()) is (not filter_empty)  # the ReLU holds nothing
    assert type(params["0", "weight"]) is nn.Parameter and params["0", "weight"] is net[0].weight
    assert type(params["1", "running_mean"]) is torch.Tensor and params["1", "running_mean"] is net[1].running_mean
    assert params.batch_size == () and not params.is_locked and TensorDict.from_module(net, lock=True).is_locked
    module = TensorDict.from_module(net, as_module=True)  # a TensorDictParams, as in the reference
    assert isinstance(module, nn.Module) and module["0", "weight"] is net[0].weight
    assert set(module.parameters()) == set(net.parameters())


def test_from_module_with_state_dict_hooks() -> None:
    net = nn.Linear(2, 2)

    def adder(module: nn.Module, *args: Any, **kwargs: Any) -> None:
        for p in module.parameters(recurse=False):
            p.data += 1

    def remover(module: nn.Module, *args: Any, **kwargs: Any) -> None:
        for p in module.parameters(recurse=False):
            p.data = p.data - 1

    net.register_state_dict_pre_hook(adder)
    net._register_state_dict_hook(remover)
    plain = TensorDict.from_module(net).detach().clone()
    through = TensorDict.from_module(net, use_state_dict=True)
    ref = tensordict.TensorDict.from_module(net, use_state_dict=True)
    assert torch.allclose(through["weight"], plain["weight"] + 1) and torch.allclose(through["weight"], ref["weight"])


@pytest.mark.parametrize("expand_identical", [False, True])
def test_from_modules_stacks_new_parameters(expand_identical: bool) -> None:
    shared = nn.Linear(3, 3)
    modules = [nn.Sequential(shared, nn.Linear(3, 4)) for _ in range(3)]
    params = TensorDict.from_modules(*modules, expand_identical=expand_identical)
    ref = tensordict.TensorDict.from_modules(*modules, expand_identical=expand_identical)
    assert params.batch_size == ref.batch_size == (3,) and params.is_locked and ref.is_locked
    assert params["1", "weight"].shape == ref["1", "weight"].shape == (3, 4, 3)
    assert type(params["1", "weight"]) is nn.Parameter
    assert params["1", "weight"].data_ptr() != modules[0][1].weight.data_ptr()
    assert torch.equal(params["1", "weight"][2], modules[2][1].weight)
    assert isinstance(params["0", "weight"], nn.Parameter) is (not expand_identical)
    assert isinstance(ref["0", "weight"], nn.Parameter) is (not expand_identical)
    if expand_identical:
        assert params["0", "weight"].data_ptr() == shared.weight.data_ptr()
    lazy = TensorDict.from_modules(*modules, lazy_stack=True)
    assert isinstance(lazy, tdshare.LazyStackedTensorDict)
    assert lazy.tensordicts[1]["1", "weight"] is modules[1][1].weight


def test_to_module_swaps_and_restores() -> None:
    net = _net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    zeros = TensorDict.from_module(net).detach().clone().zero_()
    with zeros.to_module(net):
        assert net[0].weight.abs().sum() == 0 and net[1].running_var.abs().sum() == 0
        assert net(torch.ones(2, 3)).abs().sum() == 0
    assert type(net[0].weight) is nn.Parameter
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())
    swap = zeros.to_module(net)
    assert type(swap["0", "weight"]) is nn.Parameter and torch.equal(swap["0", "weight"], before["0.weight"])
    swap.to_module(net)
    assert torch.equal(net[0].weight, before["0.weight"])
    ones = zeros.clone().apply_(lambda t: t + 1)
    assert ones.to_module(net, inplace=True, return_swap=False) is None
    assert net[0].weight.sum() == 12 and type(net[0].weight) is nn.Parameter
    with pytest.raises(KeyError, match=r"submodule"):
        TensorDict(x={"w": torch.zeros(1)}).to_module(net)


def test_to_module_with_a_reference_like_forward() -> None:
    net = nn.Linear(3, 4)
    empty = nn.Linear(3, 4, device="meta")
    params = TensorDict.from_module(net)
    with params.to_module(empty):
        y = empty(torch.ones(2, 3))
    assert torch.allclose(y, net(torch.ones(2, 3)))
    y.sum().backward()
    assert net.weight.grad is not None  # the parameters themselves were used


@pytest.mark.parametrize("flatten", [True, False])
def test_state_dict_round_trip_matches_the_reference(flatten: bool) -> None:
    net = _net()
    params, ref = TensorDict.from_module(net), tensordict.TensorDict.from_module(net)
    sd, ref_sd = params.state_dict(flatten=flatten), ref.state_dict(flatten=flatten)
    assert list(sd) == list(ref_sd)
    if flatten:
        assert all(torch.equal(sd[k], ref_sd[k]) for k in sd) and list(sd) == list(net.state_dict())
        assert not isinstance(sd["0.weight"], nn.Parameter)
        assert isinstance(params.state_dict(keep_vars=True)["0.weight"], nn.Parameter)
        assert list(params.state_dict(prefix="m.")) == ["m." + k for k in sd]
    target = TensorDict.from_module(_net()).detach().clone().zero_()
    assert target.load_state_dict(sd) is target
    assert (target == params.detach()).all()
    with pytest.raises(KeyError, match=r"strict"):
        target.load_state_dict({"0.weight": torch.zeros(4, 3)})
    target.load_state_dict({"0.weight": torch.ones(4, 3)}, strict=False)
    assert target["0", "weight"].sum() == 12
    new = torch.full((4, 3), 2.0)
    target.load_state_dict({"0.weight": new}, strict=False, assign=True)
    assert target["0", "weight"] is new


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_of_every_kind(kind: str) -> None:
    sd = build(kind).state_dict()
    assert sorted(sd) == ["a", "n.b"] and sd["n.b"].shape == (4, 2)


def test_state_dict_metadata_and_legacy_keys() -> None:
    td = TensorDict({"x": torch.randn(3), "sub": TensorDict({"y": torch.randn(3)}, [3])}, [3])
    sd, ref_sd = td.state_dict(), tensordict.TensorDict(td.to_dict(), [3]).state_dict()
    assert sd._metadata[""]["batch_size"] == ref_sd._metadata[""]["batch_size"] == torch.Size([3])
    assert set(sd._metadata) == set(ref_sd._metadata) == {"", "sub"}
    legacy = {"a": torch.tensor(1), "__batch_size": torch.Size([]), "__device": None}
    assert TensorDict({"a": 0}, []).load_state_dict(legacy)["a"] == 1


def test_from_modules_refuses_what_the_reference_refuses() -> None:
    with pytest.raises(RuntimeError, match=r"within a TensorDictParams"):
        TensorDict.from_modules(nn.Linear(3, 4), nn.Linear(3, 4), as_module=True, lazy_stack=True)
    with pytest.raises(RuntimeError, match=r"lasy_stack=True is not compatible with lazy modules"):
        TensorDict.from_modules(nn.LazyLinear(4), nn.LazyLinear(4), lazy_stack=True)


def test_a_tensordict_is_a_mapping_for_torch() -> None:
    net = nn.Sequential(nn.Linear(2, 2))
    zeros = TensorDict.from_module(net).detach().clone().zero_()
    assert isinstance(zeros, Mapping) and isinstance(tensordict.TensorDict(), Mapping)
    net.load_state_dict(zeros.flatten_keys("."))
    assert net[0].weight.abs().sum() == 0 and isinstance(net[0].weight, nn.Parameter)
    assert isinstance(build("lazy"), Mapping) and isinstance(zeros, tdshare.TensorDictBase)
