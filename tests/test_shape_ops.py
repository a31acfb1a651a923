"""The shape operations (reshape, view, flatten, permute, expand, split, gather, where...) on every
container kind, each result compared with tensordict 0.15.3's for the same input.

The content is built twice, once with tdshare and once with tensordict: a batch of ``[2, 3]``
with a float leaf ``a`` of ``2 x 3 x 2``, a nested level ``n`` whose batch is ``[2, 3, 4]`` (one
extra dim), a non-tensor ``s`` and named dims ``x``, ``y`` (the lazy stack is stacked along
``x`` from two members of batch ``[3]``).  The family content of ``_kinds.build`` (batch ``[4]``)
covers the one-dimensional operations.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import pytest
import tensordict
import torch
from _kinds import KINDS, build

import tdshare
from tdshare import LazyStackedTensorDict, TensorDict
from tdshare._errors import BatchSizeError, DimensionError, InvalidArgumentError, LockedError, NotSupportedError


@tdshare.tensorclass
class Pair:
    """The tensorclass of the comparisons (tdshare)."""

    a: torch.Tensor
    n: TensorDict
    s: str


@tensordict.tensorclass
class RefPair:
    """The same class for tensordict."""

    a: torch.Tensor
    n: tensordict.TensorDict
    s: str


def _content(lib: Any, kind: str) -> Any:
    a = torch.arange(12.0).reshape(2, 3, 2)
    b = torch.arange(24.0).reshape(2, 3, 4)
    if kind == "lazy":
        members = [
            lib.TensorDict(a=a[i], n=lib.TensorDict(b=b[i], batch_size=[3, 4]), s="text", batch_size=[3], names=["y"])
            for i in range(2)
        ]
        return lib.LazyStackedTensorDict(*members, stack_dim=0, stack_dim_name="x")
    n = lib.TensorDict(b=b, batch_size=[2, 3, 4])
    if kind == "tensorclass":
        cls = Pair if lib is tdshare else RefPair
        out = cls(a=a, n=n, s="text", batch_size=[2, 3])
        out.names = ["x", "y"]
        return out
    return lib.TensorDict(a=a, n=n, s="text", batch_size=[2, 3], names=["x", "y"])


def pair(kind: str) -> tuple[Any, Any]:
    return _content(tdshare, kind), _content(tensordict, kind)


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, tensordict.NonTensorData) and not isinstance(value, tensordict.NonTensorStack):
        return value.data  # the reference's get() may give the NonTensorData itself
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, (list, tuple)) or type(value).__name__ == "LinkedList":
        return [_plain(v) for v in value]
    return value


def _spread(value: Any, batch: torch.Size) -> Any:
    """A single value as the nested lists of a batch (a lazy stack of equal values reads as one value)."""
    if isinstance(value, list):
        return value
    for size in reversed(batch):
        value = [value] * size
    return value


def assert_same(ours: Any, ref: Any, names: bool = True, spread: bool = False) -> None:
    """Same batch size, names, keys and values (nested levels and stacked members read densely).

    ``spread``: compare a non-tensor value with a stack of that value (how lazy stacks read).
    """
    if isinstance(ref, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(ref)
        for o, r in zip(ours, ref, strict=True):
            assert_same(o, r, names, spread)
        return
    if tensordict.is_tensorclass(ref):  # its keys() leave the non-tensor fields out: compare the tensordicts
        assert tdshare.is_tensorclass(ours)
        ours, ref = ours._tensordict, ref._tensordict
    assert ours.batch_size == ref.batch_size
    if names:
        assert ours.names == ref.names
    ref_keys = set(ref.keys(include_nested=True, leaves_only=True))  # a non-tensor value is not a leaf there
    ref_keys |= {
        k
        for k in ref.keys()
        if tensordict.is_non_tensor(ref.get(k)) or not isinstance(ref.get(k), tensordict.TensorDictBase)
    }
    assert set(ours.keys(include_nested=True, leaves_only=True)) == ref_keys
    for key in ref_keys:
        mine, theirs = ours.get(key), ref.get(key)
        if isinstance(theirs, torch.Tensor):
            assert isinstance(mine, torch.Tensor) and type(mine) is torch.Tensor, key
            assert mine.shape == theirs.shape and torch.equal(mine, theirs), key
        elif spread:
            assert _spread(_plain(mine), ours.batch_size) == _spread(_plain(theirs), ref.batch_size), key
        else:
            assert _plain(mine) == _plain(theirs), key
    assert ours.get("n").batch_size == ref.get("n").batch_size


# (name, the operation) -- each one runs on both libraries' content of every kind
OPS: list[tuple[str, Callable[[Any], Any]]] = [
    ("reshape", lambda t: t.reshape(3, 2)),
    ("reshape_tuple", lambda t: t.reshape((-1,))),
    ("reshape_same", lambda t: t.reshape(2, 3)),
    ("view", lambda t: t.view(6)),
    ("view_size", lambda t: t.view(size=(6,))),
    ("view_unflatten", lambda t: t.view(2, 3, 1)),
    ("flatten", lambda t: t.flatten(0, 1)),
    ("flatten_default", lambda t: t.flatten()),
    ("flatten_same", lambda t: t.flatten(1, 1)),
    ("unflatten", lambda t: t.unflatten(1, (3, 1))),
    ("unflatten_inferred", lambda t: t.unflatten(-1, (-1, 1))),
    ("unflatten_stack_dim", lambda t: t.unflatten(0, (2, 1))),
    ("unflatten_keywords", lambda t: t.unflatten(dim=1, unflattened_size=(3, 1))),  # the reference's names
    ("squeeze_all", lambda t: t.unsqueeze(1).squeeze()),
    ("squeeze_dim", lambda t: t.unsqueeze(1).squeeze(1)),
    ("squeeze_negative", lambda t: t.unsqueeze(-1).squeeze(-1)),
    ("squeeze_not_one", lambda t: t.squeeze(0)),
    ("unsqueeze_first", lambda t: t.unsqueeze(0)),
    ("unsqueeze_middle", lambda t: t.unsqueeze(1)),
    ("unsqueeze_last", lambda t: t.unsqueeze(-1)),
    ("permute", lambda t: t.permute(1, 0)),
    ("permute_list", lambda t: t.permute([-1, 0])),
    ("permute_kw", lambda t: t.permute(dims=[1, 0])),
    ("transpose", lambda t: t.transpose(0, 1)),
    ("transpose_negative", lambda t: t.transpose(-1, -2)),
    ("transpose_same", lambda t: t.transpose(1, 1)),
    ("swapaxes", lambda t: t.swapaxes(0, 1)),
    ("movedim", lambda t: t.unsqueeze(-1).movedim(0, 2)),
    ("expand", lambda t: t.expand(4, 2, 3)),
    ("expand_tuple", lambda t: t.expand((4, -1, 3))),
    ("expand_singleton", lambda t: t.unsqueeze(1).expand(2, 5, 3)),
    ("expand_as", lambda t: t.expand_as(torch.zeros(4, 2, 3))),
    ("broadcast_to", lambda t: t.broadcast_to((4, 2, 3))),
    ("repeat", lambda t: t.repeat(2, 3)),
    ("repeat_ones", lambda t: t.repeat(1, 2)),
    ("tile", lambda t: t.tile((2,))),
    ("repeat_interleave", lambda t: t.repeat_interleave(2, dim=1)),
    ("repeat_interleave_stack_dim", lambda t: t.repeat_interleave(torch.tensor([1, 2]), dim=0)),
    ("repeat_interleave_flat", lambda t: t.repeat_interleave(2)),
    ("roll", lambda t: t.roll(1, 1)),
    ("roll_two_dims", lambda t: t.roll((1, -1), (0, 1))),
    ("roll_flat", lambda t: t.roll(2)),
    ("flip", lambda t: t.flip(1)),
    ("flip_both", lambda t: t.flip((0, 1))),
    ("fliplr", lambda t: t.fliplr()),
    ("flipud", lambda t: t.flipud()),
    ("narrow", lambda t: t.narrow(1, 1, 2)),
    ("narrow_stack_dim", lambda t: t.narrow(0, 1, 1)),
    ("narrow_negative_start", lambda t: t.narrow(-1, -2, 2)),
    ("split", lambda t: t.split(2, 1)),
    ("split_sizes", lambda t: t.split([1, 2], -1)),
    ("split_stack_dim", lambda t: t.split(1, 0)),
    ("chunk", lambda t: t.chunk(2, 1)),
    ("chunk_stack_dim", lambda t: t.chunk(2, 0)),
    ("gather", lambda t: t.gather(1, torch.tensor([[2, 0], [1, 1]]))),
    ("gather_stack_dim", lambda t: t.gather(0, torch.tensor([[1, 0, 1]]))),
    ("masked_fill", lambda t: t.masked_fill(torch.tensor([[True, False, True], [False, False, True]]), -1.0)),
    ("masked_fill_leading", lambda t: t.masked_fill(torch.tensor([False, True]), 5.0)),
    ("where_number", lambda t: t.where(torch.tensor([[True, False, True], [False, False, True]]), 0.0)),
    ("where_leading", lambda t: t.where(torch.tensor([True, False]), -2.0)),
    ("rot90", lambda t: t.rot90()),
    ("rot90_twice", lambda t: t.rot90(2, (1, 0))),
    ("rot90_three", lambda t: t.rot90(3)),
    ("tensor_split_sections", lambda t: t.tensor_split(2, 1)),
    ("tensor_split_indices", lambda t: t.tensor_split([1, -1], dim=1)),
    ("tensor_split_tensor", lambda t: t.tensor_split(torch.tensor([1]), 0)),
    ("atleast_3d", lambda t: t.atleast_3d()),
    ("atleast_2d", lambda t: t.atleast_2d()),
    ("torch_rot90", lambda t: torch.rot90(t, 1, (0, 1))),
    ("torch_atleast_3d", lambda t: torch.atleast_3d(t)),
    ("torch_tensor_split", lambda t: torch.tensor_split(t, 3, dim=1)),
    ("torch_flatten", lambda t: torch.flatten(t, 0, 1)),
    ("torch_reshape", lambda t: torch.reshape(t, (6,))),
    ("torch_squeeze", lambda t: torch.squeeze(t.unsqueeze(0))),
    ("torch_unsqueeze", lambda t: torch.unsqueeze(t, 2)),
    ("torch_permute", lambda t: torch.permute(t, (1, 0))),
    ("torch_transpose", lambda t: torch.transpose(t, 0, 1)),
    ("torch_movedim", lambda t: torch.movedim(t, 0, 1)),
    ("torch_split", lambda t: torch.split(t, 1, 1)),
    ("torch_chunk", lambda t: torch.chunk(t, 3, 1)),
    ("torch_gather", lambda t: torch.gather(t, 1, torch.tensor([[0], [2]]))),
    ("torch_roll", lambda t: torch.roll(t, 1, 0)),
    ("torch_flip", lambda t: torch.flip(t, (1,))),
    ("torch_narrow", lambda t: torch.narrow(t, 1, 0, 2)),
    ("torch_unflatten", lambda t: torch.unflatten(t, 1, (1, 3))),
    ("torch_broadcast_to", lambda t: torch.broadcast_to(t, (2, 2, 3))),
    ("torch_repeat_interleave", lambda t: torch.repeat_interleave(t, 2, dim=0)),
    ("torch_tile", lambda t: torch.tile(t, (2, 1))),
    ("torch_where", lambda t: torch.where(torch.tensor([[True, False, True], [False, True, True]]), t, 0.0)),
]
# reference quirks that tdshare does not copy (see the README's differences)
NAMES_DIFFER = {"squeeze_all", "torch_squeeze"}  # the reference drops the nested level's names there


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("name", "op"), OPS, ids=[name for name, _ in OPS])
def test_matches_the_reference(kind: str, name: str, op: Callable[[Any], Any]) -> None:
    ours, ref = pair(kind)
    got = op(ours)
    try:
        want = op(ref)
    except TypeError:  # the reference's tensorclass lacks some torch functions: its tensordict's answer
        assert kind == "tensorclass"
        want = op(ref._tensordict)
    assert_same(got, want, names=kind == "tensordict" and name not in NAMES_DIFFER, spread=kind == "lazy")
    if kind == "tensorclass":
        pieces = got if isinstance(got, tuple) else (got,)
        assert all(type(p) is Pair for p in pieces)


@pytest.mark.parametrize("kind", KINDS)
def test_family_content_one_dim(kind: str) -> None:
    obj = build(kind)
    assert obj.unsqueeze(0).squeeze(0).get("a").tolist() == [0.0, 1.0, 2.0, 3.0]
    assert obj.flip(0).get("a").tolist() == [3.0, 2.0, 1.0, 0.0]
    assert obj.roll(1, 0).get(("n", "b")).shape == (4, 2)
    assert [p.batch_size[0] for p in obj.split(3)] == [3, 1]
    assert obj.reshape(2, 2).get("a").tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert obj.expand(3, 4).get(("n", "b")).shape == (3, 4, 2)
    assert obj.masked_fill(torch.tensor([True, False, False, True]), 9.0).get("a").tolist() == [9.0, 1.0, 2.0, 9.0]
    assert obj.gather(0, torch.tensor([3, 0])).get("a").tolist() == [3.0, 0.0]
    assert obj.repeat_interleave(2).get("a").tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


# -- lazy stacks ------------------------------------------------------------------------------
def _hetero() -> LazyStackedTensorDict:
    a = TensorDict(x=torch.zeros(3, 2), batch_size=[3])
    b = TensorDict(x=torch.ones(3, 5), batch_size=[3])
    return LazyStackedTensorDict(a, b, stack_dim=0)


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.permute(1, 0),
        lambda t: t.unsqueeze(2),
        lambda t: t.squeeze(),
        lambda t: t.flip(0),
        lambda t: t.flip(1),
        lambda t: t.roll(1, 0),
        lambda t: t.roll(1, 1),
        lambda t: t.narrow(1, 0, 2),
        lambda t: t.split(1, 0)[1],
        lambda t: t.chunk(3, 1)[0],
        lambda t: t.expand(4, 2, 3),
        lambda t: t.repeat(2, 1),
        lambda t: t.repeat_interleave(2, dim=0),
        lambda t: t.repeat_interleave(2, dim=1),
        lambda t: t.masked_fill(torch.tensor([[True, False, True], [False, True, False]]), 7.0),
        lambda t: t.gather(1, torch.tensor([[2, 0], [1, 1]])),
        lambda t: t.where(torch.tensor([True, False]), 3.0),
        lambda t: t.flatten(0, 1),
        lambda t: t.reshape(6),
        lambda t: t.reshape(3, 2),
        lambda t: t.roll(1),
        lambda t: t.flatten(0, 1).unflatten(0, (2, 3)),
    ],
)
def test_heterogeneous_lazy_stack_stays_lazy_per_member(op: Callable[[Any], Any]) -> None:
    got = op(_hetero())  # members of widths 2 (zeros) and 5 (ones)
    assert isinstance(got, LazyStackedTensorDict)
    same = LazyStackedTensorDict(  # the same stack with equal widths: the op's answer, densely
        TensorDict(x=torch.zeros(3, 2), batch_size=[3]), TensorDict(x=torch.ones(3, 2), batch_size=[3])
    )
    want = op(same).to_tensordict() if isinstance(op(same), LazyStackedTensorDict) else op(same)
    assert got.batch_size == want.batch_size
    for element, expected in zip(_elements(got), _elements(want), strict=True):
        first = element["x"][..., 0]
        assert torch.equal(first, expected["x"][..., 0])  # the element came from the right member
        width = element["x"].shape[-1]
        assert torch.all(element["x"] == element["x"][..., :1])  # every feature alike
        if first.eq(0).all():
            assert width == 2
        elif first.eq(1).all():
            assert width == 5


def _elements(td: Any) -> list[Any]:
    if not td.batch_dims:
        return [td]
    return [e for piece in td.unbind(0) for e in _elements(piece)]


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.gather(0, torch.tensor([[1, 0, 1]])),
        lambda t: t.where(torch.tensor([True, False]), torch.zeros(2, 3, 1)),
    ],
)
def test_heterogeneous_lazy_stack_refuses_what_needs_a_dense_copy(op: Callable[[Any], Any]) -> None:
    with pytest.raises(NotSupportedError, match="shapes"):
        op(_hetero())


def test_lazy_view_refuses_a_general_reshape() -> None:
    ls, ref = pair("lazy")
    with pytest.raises(BatchSizeError, match="reshape"):
        ls.view(3, 2)
    with pytest.raises(RuntimeError, match="reshape"):
        ref.view(3, 2)
    assert isinstance(ls.view(6), LazyStackedTensorDict) and isinstance(ls.view(2, 3, 1), LazyStackedTensorDict)


def test_lazy_results_reuse_or_reorder_the_members() -> None:
    ls, _ = pair("lazy")
    a, b = ls.tensordicts
    assert ls.flip(0).tensordicts == [b, a]
    assert ls.roll(1, 0).tensordicts == [b, a]
    assert ls.narrow(0, 1, 1).tensordicts == [b]
    assert ls.repeat_interleave(2, dim=0).tensordicts == [a, a, b, b]
    assert ls.squeeze(0) is ls and ls.unsqueeze(0).squeeze(0).tensordicts[0] is not a
    moved = ls.permute(1, 0)
    assert isinstance(moved, LazyStackedTensorDict) and moved.stack_dim == 1 and moved.names == ["y", "x"]


def test_inplace_lazy_stack_refused() -> None:
    ls, _ = pair("lazy")
    for call in (
        lambda: ls.reshape(6, inplace=True),
        lambda: ls.flatten(0, 1, inplace=True),
        lambda: ls.unflatten(1, (3, 1), inplace=True),
        lambda: ls.repeat(2, 1, inplace=True),
        lambda: ls.repeat_interleave(2, 1, inplace=True),
        lambda: ls.roll(1, 0, inplace=True),
        lambda: ls.gather(1, torch.zeros(2, 3, dtype=torch.long), inplace=True),
    ):
        with pytest.raises(NotImplementedError, match="inplace"):
            call()


# -- in place, locked, memory-mapped --------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("reshape", lambda t, inplace: t.reshape(6, inplace=inplace)),
        ("flatten", lambda t, inplace: t.flatten(0, 1, inplace=inplace)),
        ("unflatten", lambda t, inplace: t.unflatten(1, (1, 3), inplace=inplace)),
        ("repeat", lambda t, inplace: t.repeat(2, 1, inplace=inplace)),
        ("repeat_interleave", lambda t, inplace: t.repeat_interleave(2, 0, inplace=inplace)),
        ("roll", lambda t, inplace: t.roll(1, 1, inplace=inplace)),
        ("gather", lambda t, inplace: t.gather(1, torch.tensor([[2, 0, 1], [1, 1, 0]]), inplace=inplace)),
    ],
)
def test_inplace_rebinds_the_leaves_and_keeps_nested_levels(name: str, call: Callable[..., Any]) -> None:
    ours, ref = pair("tensordict")
    nested = ours["n"]
    out = call(ours, True)
    assert out is ours and ours["n"] is nested
    assert_same(ours, call(ref, False), names=False)


def test_locked_and_memmap_inputs_give_in_memory_results() -> None:
    td, _ = pair("tensordict")
    td.memmap_(tempfile.mkdtemp())
    # as the reference: views count as memory-mapped, reshape and expand do not; a flip is a copy
    # (the reference calls it memory-mapped too: see README, "Where tdshare differs")
    for result, mapped in ((td.permute(1, 0), True), (td.unsqueeze(0), True), (td.view(6), True)):
        assert result.is_locked and result.is_memmap() is mapped
        assert type(result["a"]) is torch.Tensor
    for result in (td.reshape(6), td.expand(2, 2, 3), td.flip(0)):
        assert result.is_locked and not result.is_memmap()
        assert type(result["a"]) is torch.Tensor
    view = td.transpose(0, 1)
    assert view["a"].untyped_storage().data_ptr() == td["a"].untyped_storage().data_ptr()
    view["a"][0, 0, 0] = 42.0  # a view writes through to the mapped file
    assert td["a"][0, 0, 0] == 42.0
    assert not td.gather(0, torch.zeros(1, 3, dtype=torch.long)).is_locked
    with pytest.raises(LockedError):
        td.reshape(6, inplace=True)
    td.masked_fill_(torch.tensor([True, False]), 0.5)  # in place: allowed while locked
    assert td["a"][0].unique().tolist() == [0.5] and td["n", "b"][0].unique().tolist() == [0.5]


def test_masked_fill_in_place_every_kind() -> None:
    for kind in KINDS:
        ours, ref = pair(kind)
        mask = torch.tensor([[True, False, True], [False, False, True]])
        assert ours.masked_fill_(mask, 3.0) is ours
        ref.masked_fill_(mask, 3.0)
        assert_same(ours, ref, names=False, spread=kind == "lazy")


def test_where_with_another_tensordict_and_pad() -> None:
    ours, ref = pair("tensordict")
    cond = torch.tensor([[True, False, True], [False, False, True]])
    other, ref_other = ours.clone().apply(lambda t: -t), ref.clone().apply(lambda t: -t)
    assert_same(ours.where(cond, other), ref.where(cond, ref_other))
    assert_same(torch.where(cond, ours, other), torch.where(cond, ref, ref_other))
    assert_same(torch.where(cond, 1.0, ours), torch.where(cond, 1.0, ref))
    extra, ref_extra = ours.exclude("a"), ref.exclude("a")
    assert_same(ours.where(cond, extra, pad=0), ref.where(cond, ref_extra, pad=0))
    with pytest.raises(KeyError, match="pad"):
        ours.where(cond, extra)
    target = ours.clone()
    assert ours.where(cond, 0.0, out=target) is target
    assert torch.equal(target["a"], ref.where(cond, 0.0)["a"])


def test_view_dtype_and_names() -> None:
    ours, ref = pair("tensordict")
    got, want = ours.view(torch.int32), ref.view(torch.int32)
    assert torch.equal(got["a"], want["a"]) and got.names == want.names
    assert got["a"].untyped_storage().data_ptr() == ours["a"].untyped_storage().data_ptr()


def test_non_tensor_stack_elements_move_with_the_batch() -> None:
    td = TensorDict(a=torch.arange(3), batch_size=[3])
    ref = tensordict.TensorDict(a=torch.arange(3), batch_size=[3])
    td["s"] = tdshare.NonTensorStack("x", "y", "z")
    ref["s"] = tensordict.NonTensorStack("x", "y", "z")
    for op in (
        lambda t: t.flip(0),
        lambda t: t.roll(1, 0),
        lambda t: t.gather(0, torch.tensor([2, 2, 0])),
        lambda t: t.unsqueeze(0).expand(2, 3),
        lambda t: t.reshape(3, 1),
    ):
        assert _plain(op(td)["s"]) == _plain(op(ref)["s"])


# -- bad arguments ---------------------------------------------------------------------------------
BAD: list[tuple[Callable[[Any], Any], type[Exception], str]] = [
    (lambda t: t.reshape(4, 2), BatchSizeError, r"invalid shape"),
    (lambda t: t.view(5), BatchSizeError, r"invalid shape"),
    (lambda t: t.flatten(0, 5), DimensionError, r"out of range"),
    (lambda t: t.flatten(1, 0), InvalidArgumentError, r"end_dim"),
    (lambda t: t.unflatten(1, (2, 2)), BatchSizeError, r"unflatten"),
    (lambda t: t.unflatten(3, (1, 1)), DimensionError, r"out of range"),
    (lambda t: t.squeeze(2), DimensionError, r"out of range"),
    (lambda t: t.unsqueeze(3), BatchSizeError, r"out of range"),
    (lambda t: t.permute(0, 0), InvalidArgumentError, r"permutation"),
    (lambda t: t.transpose(0, 2), InvalidArgumentError, r"batch dims"),
    (lambda t: t.movedim((0, 0), (1, 0)), BatchSizeError, r"repeated dim in source"),
    (lambda t: t.movedim((0,), (1, 0)), InvalidArgumentError, r"same number of elements"),
    (lambda t: t.movedim(0, 2), DimensionError, r"out of range"),
    (lambda t: t.expand(4, 3), BatchSizeError, r"only dims of size 1"),
    (lambda t: t.expand(3), BatchSizeError, r"fewer dims"),
    (lambda t: t.repeat(2), InvalidArgumentError, r"one\s+non-negative count"),
    (lambda t: t.repeat_interleave(torch.tensor([1, 2, 3]), dim=0), BatchSizeError, r"repeats"),
    (lambda t: t.roll(1, 2), DimensionError, r"out of range"),
    (lambda t: t.flip(-3), DimensionError, r"out of range"),
    (lambda t: t.narrow(1, 2, 2), BatchSizeError, r"within dim"),
    (lambda t: t.narrow(2, 0, 1), DimensionError, r"out of range"),
    (lambda t: t.split([1, 1], 1), BatchSizeError, r"sum exactly to 3"),
    (lambda t: t.split(0, 1), InvalidArgumentError, r"positive"),
    (lambda t: t.split("a", 1), TypeError, r"split_size"),
    (lambda t: t.chunk(0), InvalidArgumentError, r"positive"),
    (lambda t: t.tensor_split(0, 1), InvalidArgumentError, r"positive"),
    (lambda t: t.rot90(1, (0, 0)), BatchSizeError, r"2 distinct dims"),
    (lambda t: t[0].rot90(), BatchSizeError, r"at least 2"),
    (lambda t: t.gather(2, torch.zeros(2, 3, dtype=torch.long)), BatchSizeError, r"along dim 2"),
    (lambda t: t.gather(0, torch.zeros(2, 3, 1, dtype=torch.long)), BatchSizeError, r"1 to 2 dims"),
    (lambda t: t.masked_fill(torch.ones(3, dtype=torch.bool), 1.0), BatchSizeError, r"mask"),
]


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the reference warns before raising for some
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("op", "error", "match"), BAD)
def test_bad_arguments_raise_before_anything_is_built(
    kind: str, op: Callable[[Any], Any], error: type, match: str
) -> None:
    ours, ref = pair(kind)
    with pytest.raises(error, match=match):
        op(ours)
    builtin = next(c for c in error.__mro__ if c.__module__ == "builtins")
    if kind != "lazy":  # the reference's lazy stacks accept some of these (with a FutureWarning)
        with pytest.raises(builtin):  # the reference raises the same builtin
            op(ref)


def test_expand_as_a_tensordict_expands_every_leaf_as_its_match() -> None:
    def content(lib: Any) -> tuple[Any, Any]:
        small = lib.TensorDict({"a": torch.ones(3, 1, 4), "b": {"c": torch.ones(3, 2, 1, 4)}}, batch_size=[3])
        big = lib.TensorDict({"a": torch.zeros(2, 3, 5, 4), "b": {"c": torch.zeros(2, 3, 2, 6, 4)}}, batch_size=[2, 3])
        return small, big

    (small, big), (ref_small, ref_big) = content(tdshare), content(tensordict)
    got, want = small.expand_as(big), ref_small.expand_as(ref_big)
    assert got.batch_size == want.batch_size and got["b", "c"].shape == want["b", "c"].shape == (2, 3, 2, 6, 4)
    assert torch.equal(got["a"], want["a"])
    with pytest.raises(KeyError):
        small.expand_as(big.exclude("a"))


def test_split_keeps_nested_tensors_and_memory_mapped_leaves() -> None:
    jagged = torch.nested.as_nested_tensor([torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7])], layout=torch.jagged)
    first, second = TensorDict(ids=jagged, batch_size=[2]).chunk(2)
    assert first["ids"].is_nested and torch.equal(second["ids"].unbind(0)[0], torch.tensor([4, 5, 6, 7]))
    td = TensorDict(a=torch.arange(6.0), batch_size=[6]).memmap_(tempfile.mkdtemp())
    pieces = td.split([2, 4])
    assert [p["a"].tolist() for p in pieces] == [[0.0, 1.0], [2.0, 3.0, 4.0, 5.0]]
    assert all(p.is_locked for p in pieces)
    pieces[1]["a"][0] = -1.0  # a view: writes reach the mapped file
    assert td["a"][2] == -1.0
    ref = tensordict.TensorDict(a=torch.arange(6.0), batch_size=[6])
    assert [p.batch_size for p in TensorDict(a=torch.arange(6.0), batch_size=[6]).split(4)] == [
        p.batch_size for p in ref.split(4)
    ]


def test_nested_lazy_stack_and_tensorclass_entries_get_the_operation() -> None:
    inner = LazyStackedTensorDict(
        TensorDict(x=torch.zeros(3, 2), batch_size=[3]), TensorDict(x=torch.ones(3, 5), batch_size=[3]), stack_dim=1
    )
    outer = TensorDict(
        child=inner,
        pair=Pair(
            a=torch.arange(6.0).reshape(3, 2),
            n=TensorDict(b=torch.zeros(3, 2), batch_size=[3, 2]),
            s="p",
            batch_size=[3, 2],
        ),
        batch_size=[3, 2],
    )
    moved = outer.permute(1, 0)
    assert isinstance(moved["child"], LazyStackedTensorDict) and moved["child"].batch_size == (2, 3)
    assert moved["child"].stack_dim == 0 and moved["child"].tensordicts[1]["x"].shape == (3, 5)
    assert type(moved["pair"]) is Pair and torch.equal(moved["pair"].a, torch.arange(6.0).reshape(3, 2).T)
    flat = outer.flatten()
    assert flat["child"].batch_size == (6,) and flat["pair"].batch_size == (6,) and flat["pair"].s == "p"


def test_lazy_results_never_rename_the_original_members() -> None:
    ls, _ = pair("lazy")
    for op in (lambda t: t.roll(1), lambda t: t.tile((1, 1)), lambda t: t.reshape(3, 2), lambda t: t.flip(0)):
        op(ls)
        assert [m.names for m in ls.tensordicts] == [["y"], ["y"]] and ls.names == ["x", "y"]


def test_copies_own_their_non_tensor_values_views_share_them() -> None:
    td = TensorDict(a=torch.arange(3), s="text", batch_size=[3])
    flipped, viewed = td.flip(0), td.reshape(3, 1)
    flipped.set_("s", "copy")
    viewed.set_("s", "view")  # a view shares the value, as td[...] does
    assert td["s"] == "view" and flipped["s"] == "copy"
    flipped["a"][0] = 9  # a copy: the original keeps its tensor
    assert td["a"].tolist() == [0, 1, 2]


_VIEWS = {
    "permute": lambda t: t.permute(1, 0),
    "flatten": lambda t: t.flatten(0, 1),
    "unflatten": lambda t: t.unflatten(0, (2, 1)),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "squeeze": lambda t: t.squeeze(-1),
    "transpose": lambda t: t.transpose(0, 1),
    "view": lambda t: t.view(-1),
}


@pytest.mark.parametrize("name", sorted(_VIEWS))
@pytest.mark.parametrize("kind", ["tensordict", "lazy"])
def test_entries_set_in_a_block_over_a_view_reach_the_source_as_the_reference(name: str, kind: str) -> None:
    def source(lib: Any) -> Any:
        td = lib.TensorDict(a=torch.zeros(2, 1, 3), n={"b": torch.zeros(2, 1)}, batch_size=[2, 1])
        return td if kind == "tensordict" else lib.lazy_stack([td[0], td[1]], 0)

    results = []
    for lib in (tdshare, tensordict):
        td = source(lib)
        with _VIEWS[name](td) as view:
            view["new"] = torch.arange(float(view.numel())).reshape(view.shape)  # added
            view["a"] = view["a"] + 1  # replaced
            view["n", "c"] = torch.ones(view.shape)  # added in a nested level
        results.append(td)
    ours, theirs = results
    for key in ("new", "a", ("n", "c"), ("n", "b")):
        assert torch.equal(ours.get(key), theirs.get(key)), (name, key)


def test_a_block_over_a_view_of_a_memory_mapped_tensordict_writes_into_its_files(tmp_path: Any) -> None:
    td = TensorDict(a=torch.zeros(2, 3), batch_size=[2, 3]).memmap_(tmp_path / "td")
    with td.permute(1, 0) as view:  # the view of a locked tensordict is locked: written in place
        view["a"].add_(torch.arange(3.0).unsqueeze(-1))
    assert TensorDict.load_memmap(tmp_path / "td")["a"].tolist() == [[0.0, 1.0, 2.0]] * 2
    with pytest.raises(tdshare.LockedError), td.permute(1, 0) as view:
        view["new"] = torch.zeros(3, 2)  # a new entry cannot reach a locked tensordict
    assert "new" not in td.keys()
