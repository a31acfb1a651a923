"""The tensorclass options (autocast, nocast, tensor_only, frozen, shadow, kw_only) and the
``TensorClass`` base class, each checked against what tensordict 0.15.3 stores for the same class."""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensordict
import torch

import tdshare
from tdshare import NonTensorStack, TensorClass, TensorDict, tensorclass


def _both(**flags: Any) -> tuple[Any, Any]:
    """The same class body made a tensorclass by tdshare and by the reference."""

    def body() -> type:
        return type(
            "Obs",
            (),
            {
                "__annotations__": {"x": torch.Tensor, "n": int, "s": str, "f": float, "a": Any},
                "__module__": __name__,
                "n": 0,
                "s": "s",
                "f": 0.0,
                "a": None,
            },
        )

    return tensorclass(body(), **flags), tensordict.tensorclass(body(), **flags)


def _kinds(obj: Any) -> dict[str, str]:
    out = {}
    for name in ("x", "n", "s", "f", "a"):
        value = getattr(obj, name)
        out[name] = "tensor" if isinstance(value, torch.Tensor) else type(value).__name__
    return out


@pytest.mark.parametrize(
    ("flags", "values", "batch"),
    [
        ({}, {"x": np.zeros(2), "n": 3, "s": "t", "f": 2, "a": [1, 2]}, []),
        ({}, {"x": torch.zeros(2), "n": 3, "s": "t", "f": 2.5, "a": "w"}, [2]),
        ({"autocast": True}, {"x": [1, 2], "n": "3", "s": 4, "f": 2, "a": 1.5}, []),
        ({"nocast": True}, {"x": torch.zeros(2), "n": 3, "s": "t", "f": 2, "a": np.zeros(2)}, [2]),
    ],
)
def test_values_are_stored_as_the_reference_stores_them(flags: dict, values: dict, batch: list) -> None:
    ours, theirs = _both(**flags)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference warns about int fields stored as tensors
        expected = theirs(**values, batch_size=batch)
    got = ours(**values, batch_size=batch)
    assert _kinds(got) == _kinds(expected)
    for name in ("x", "n", "s", "f", "a"):
        a, b = getattr(got, name), getattr(expected, name)
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.tolist() == b.tolist()
        else:
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


def test_a_list_field_follows_tensordict_set() -> None:
    @tensorclass
    class Ep:
        steps: Any
        tags: Any = None

    ep = Ep(steps=[1, 2, 3], tags=["a", "b", "c"], batch_size=[3])
    assert isinstance(ep.steps, torch.Tensor) and ep.steps.tolist() == [1, 2, 3]
    assert isinstance(ep._tensordict._tensordict["tags"], NonTensorStack) and ep[1].tags == "b"


def test_autocast_failure_names_the_field() -> None:
    @tensorclass(autocast=True)
    class C:
        n: int

    with pytest.raises(TypeError, match=r"'n'.*int") as info:
        C(n="three")
    assert isinstance(info.value, tdshare.ArgumentTypeError)


def test_exclusive_flags_are_refused_before_the_class_changes() -> None:
    for flags in ({"autocast": True, "nocast": True}, {"tensor_only": True, "nocast": True}):
        cls = type("C", (), {"__annotations__": {"x": torch.Tensor}})
        with pytest.raises(TypeError, match="exclude"):
            tensorclass(cls, **flags)
        assert not tdshare.is_tensorclass(cls) and not dataclasses.is_dataclass(cls)


def test_tensor_only_checks_annotations_and_casts() -> None:
    with pytest.raises(tdshare.ArgumentTypeError, match=r"'label'.*tensor_only"):

        @tensorclass(tensor_only=True)
        class Bad:
            x: torch.Tensor
            label: str

    @tensorclass(tensor_only=True)
    class Good:
        x: torch.Tensor
        nested: TensorDict | None = None

    g = Good(x=[1.0, 2.0], batch_size=[2])
    assert isinstance(g.x, torch.Tensor) and g.x.tolist() == [1.0, 2.0] and g.nested is None
    with pytest.raises(tdshare.ArgumentTypeError, match="'x'"):
        Good(x="text")


def test_frozen_refuses_assignment_but_allows_in_place_writes() -> None:
    @tensorclass(frozen=True)
    class F:
        x: torch.Tensor

    f = F(x=torch.zeros(2), batch_size=[2])
    with pytest.raises(dataclasses.FrozenInstanceError, match="'x'"):
        f.x = torch.ones(2)
    with pytest.raises(tdshare.FrozenFieldError):
        del f.x
    f.set_("x", torch.ones(2))
    assert f.x.tolist() == [1.0, 1.0]
    assert f.is_locked and {f: 1}[f] == 1  # as the reference: locked, and usable as a dict key


def test_shadow_lets_a_field_hide_a_method() -> None:
    with pytest.raises(AttributeError, match=r"Attribute name exclude can't.*shadow=True") as info:

        @tensorclass
        class NoShadow:
            exclude: torch.Tensor

    assert isinstance(info.value, tdshare.ReservedFieldError) and isinstance(info.value, ValueError)

    @tensorclass(shadow=True)
    class Shadow:
        get: torch.Tensor

    s = Shadow(get=torch.ones(2), batch_size=[2])
    assert s.get.tolist() == [1.0, 1.0] and s[0].get.item() == 1.0
    with pytest.raises(tdshare.ReservedFieldError, match="batch_size"):
        tensorclass(type("B", (), {"__annotations__": {"batch_size": torch.Tensor}}), shadow=True)


def test_kw_only() -> None:
    @tensorclass(kw_only=True)
    class K:
        x: torch.Tensor

    with pytest.raises(TypeError, match="keywords only"):
        K(torch.ones(1))
    assert K(x=torch.ones(1)).x.tolist() == [1.0]


class Point(TensorClass["nocast"]):
    """A TensorClass subclass with a bracket flag (module level: it pickles)."""

    xy: torch.Tensor
    count: int = 0


class Plain(TensorClass):
    """A TensorClass subclass without flags."""

    xy: torch.Tensor
    count: int = 0


def test_tensorclass_base_class(tmp_path: Path) -> None:
    p = Point(xy=torch.ones(3, 2), count=4, batch_size=[3])
    assert tdshare.is_tensorclass(Point) and type(p.count) is int and p[1:].batch_size == torch.Size([2])
    assert type(Plain(xy=torch.ones(2), count=1).count) is torch.Tensor  # default casting, as the reference
    p.memmap_(tmp_path / "p")
    back = Point.load_memmap(tmp_path / "p")
    assert type(back) is Point and back.count == 4 and back.xy.tolist() == p.xy.tolist()
    assert pickle.loads(pickle.dumps(p)).count == 4
    theirs = tensordict.TensorDict.load_memmap(tmp_path / "p" / "_tensordict")  # the reference reads it
    assert theirs["xy"].tolist() == p.xy.tolist()


def test_tensorclass_base_refuses_an_unknown_flag() -> None:
    with pytest.raises(tdshare.ArgumentTypeError, match="'fast'"):
        TensorClass["fast"]


# -- subclassing and the reference's class attributes ---------------------------------------------
def test_subclass_keywords_set_the_flags_and_its_setattr_sees_every_field() -> None:
    seen: list[str] = []

    class Sub(TensorClass, autocast=True):
        a: int

        def __setattr__(self, name: str, value: Any) -> None:
            seen.append(name)
            super().__setattr__(name, value)

    class RefSub(tensordict.TensorClass, autocast=True):
        a: int

    obj = Sub(torch.ones(()))
    assert seen == ["a"] and type(obj.a) is int and type(RefSub(torch.ones(())).a) is int
    obj.a = 2
    assert obj.a == 2 and seen == ["a", "a"]
    assert (Sub._autocast, Sub._nocast, TensorClass._autocast) == (True, False, False)
    assert (RefSub._autocast, RefSub._nocast) == (True, False)
    assert Sub.__expected_keys__ == {"a"} and not obj._non_tensordict


def test_setting_the_device_in_place_is_refused_as_the_reference() -> None:
    @tensorclass
    class Obs:
        x: torch.Tensor

    for target, word in [(Obs(x=torch.zeros(2), batch_size=[2]), "tensorclass"), (TensorDict(), "tensordict")]:
        with pytest.raises(RuntimeError, match=f"device cannot be set using {word}.device = device") as info:
            target.device = torch.device("cpu")
        assert isinstance(info.value, tdshare.DeviceError)
    with pytest.raises(RuntimeError, match="device cannot be set"):
        tensordict.TensorDict().device = torch.device("cpu")


def test_rows_of_another_class_need_the_same_fields() -> None:
    @tensorclass
    class A:
        x: torch.Tensor

    @tensorclass
    class B:
        x: torch.Tensor

    @tensorclass
    class C:
        y: torch.Tensor

    a = A(x=torch.zeros(3), batch_size=[3])
    a[1:] = B(x=torch.ones(2), batch_size=[2])
    assert a.x.tolist() == [0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="same-class or compatible class"):
        a[1:] = C(y=torch.ones(2), batch_size=[2])


def test_grad_and_data_come_back_as_the_class() -> None:
    @tensorclass
    class Loss:
        x: torch.Tensor
        tag: str
        z: Any = None

    a = Loss(x=torch.randn(3, requires_grad=True), tag="t", z=torch.randn(2))
    (a + 1).sum().x.backward()
    assert type(a.grad) is Loss and a.grad.x.tolist() == [1.0, 1.0, 1.0] and a.grad.z is None
    assert type(a.data) is Loss and not a.data.x.requires_grad


def test_a_reserved_field_name_is_refused_in_the_reference_s_words() -> None:
    with pytest.raises(AttributeError, match="Attribute name reshape can't be used with @tensorclass"):

        @tensorclass
        class Bad:
            reshape: torch.Tensor


def test_comparing_with_a_number_leaves_non_tensor_fields_out() -> None:
    @tensorclass
    class Row:
        x: torch.Tensor
        z: list

    row = Row(x=torch.zeros(2, 3), z=["a", "b"], batch_size=[2])
    assert (row == 0).all() and not (row != 0).any()
    ref = tensordict.TensorDict(x=torch.zeros(2, 3), z=["a", "b"], batch_size=[2])
    assert (ref == 0).all() and (TensorDict(x=torch.zeros(2, 3), z=["a", "b"], batch_size=[2]) == 0).all()


# -- a tensorclass around a lazy stack ------------------------------------------------------------
def _nested_pair(lib: Any) -> tuple[Any, Any, type]:
    @lib.tensorclass
    class Nested:
        X: torch.Tensor
        z: str
        y: Any = None

    def make(x: torch.Tensor) -> Any:
        inner = Nested(X=x, z="t", batch_size=[3, 4])
        return Nested(X=x, y=inner, z="t", batch_size=[3, 4])

    return make(torch.ones(3, 4, 5)), make(torch.zeros(3, 4, 4)), Nested


@pytest.mark.parametrize("how", ["lazy_stack", "maybe_dense_stack", "functional", "class"])
def test_instances_stack_lazily_into_their_class_as_the_reference(how: str) -> None:
    for lib in (tdshare, tensordict):
        a, b, cls = _nested_pair(lib)
        if how == "functional":
            out = lib.lazy_stack([a, b])
        elif how == "class":
            if lib is tensordict:
                continue
            out = cls.lazy_stack([a, b])
        else:
            out = getattr(lib.LazyStackedTensorDict, how)([a, b], 0)
        assert type(out) is cls and isinstance(out._tensordict, lib.LazyStackedTensorDict)
        assert type(out.y) is cls and isinstance(out.y._tensordict, lib.LazyStackedTensorDict)
        assert out.batch_size == torch.Size([2, 3, 4])
        assert out[0].X.shape == (3, 4, 5) and out[1].y.X.shape == (3, 4, 4) and (out[0].y.X == 1).all()


def test_to_lazystack_and_from_tensordict_of_a_lazy_stack_read_ragged_fields() -> None:
    class Pair(TensorClass):
        foo: torch.Tensor
        bar: torch.Tensor

    tc = Pair(foo=torch.zeros(1, 2), bar=torch.ones(1, 2), batch_size=[1, 2])
    lazy = tc.to_lazystack(1)
    assert type(lazy) is Pair and isinstance(lazy._tensordict, tdshare.LazyStackedTensorDict)
    assert lazy.foo.shape == (1, 2) and lazy[0, 1].bar.item() == 1.0

    class Ragged(TensorClass):
        X: torch.Tensor
        y: torch.Tensor
        z: str

    stack = tdshare.LazyStackedTensorDict(
        TensorDict(X=torch.ones(3), y=0, z="s"), TensorDict(X=torch.ones(2) * 2, y=0, z="s")
    )
    obj = Ragged.from_tensordict(stack)
    assert isinstance(obj.get("X", as_list=True), list) and obj.get("X", as_nested_tensor=True).is_nested
    padded = obj.get("X", as_padded_tensor=True)
    assert padded.shape == (2, 3) and padded[1, -1] == 0 and obj[1].X.tolist() == [2.0, 2.0]
