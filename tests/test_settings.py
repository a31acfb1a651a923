"""The process-wide switches: set_list_to_stack and set_capture_non_tensor_stack."""

from __future__ import annotations

import pytest
import tensordict
import torch

import tdshare
from tdshare import NonTensorData, NonTensorStack, TensorDict


def test_list_to_stack_switch_as_context_decorator_and_for_good() -> None:
    assert tdshare.list_to_stack() is True
    with tdshare.set_list_to_stack(False):
        assert tdshare.list_to_stack() is False
        td = TensorDict(a=[1, 2], b=["x", "y"], batch_size=[2])
        assert td["a"] == [1, 2] and type(td._tensordict["b"]) is NonTensorData
    assert tdshare.list_to_stack() is True
    assert isinstance(TensorDict(a=[1, 2])["a"], torch.Tensor)

    @tdshare.set_list_to_stack(False)
    def build() -> TensorDict:
        return TensorDict(a=[1, 2])

    assert build()["a"] == [1, 2] and tdshare.list_to_stack() is True
    tdshare.set_list_to_stack(False).set()
    try:
        assert tdshare.list_to_stack() is False
    finally:
        tdshare.set_list_to_stack(True).set()


def test_capture_non_tensor_stack_switch_matches_the_reference_when_off() -> None:
    ours = [TensorDict(s="a"), TensorDict(s="a")]
    assert type(torch.stack(ours)._tensordict["s"]) is NonTensorData  # tdshare's default: one value
    with tdshare.set_capture_non_tensor_stack(False), tensordict.set_capture_non_tensor_stack(False):
        stacked = torch.stack(ours)
        theirs = torch.stack([tensordict.TensorDict(s="a"), tensordict.TensorDict(s="a")])
        assert isinstance(stacked._tensordict["s"], NonTensorStack)
        assert stacked._tensordict["s"].tolist() == theirs._tensordict["s"].tolist() == ["a", "a"]


def test_a_switch_takes_a_bool_only() -> None:
    with pytest.raises(TypeError, match="True or False"):
        tdshare.set_list_to_stack("yes")  # type: ignore[arg-type]
