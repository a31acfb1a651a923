"""The container kinds that shared test sets run over (imported as ``_kinds``).

``build(kind)`` gives the same content in each kind: a float leaf ``a`` of 4 rows, a nested
``("n", "b")`` of 4 x 2 zeros, and a non-tensor ``s == "text"``.  ``Sample`` is the tensorclass; it
lives in an importable module so that spawned children can unpickle it.
"""

from __future__ import annotations

from typing import Any

import torch

from tdshare import LazyStackedTensorDict, TensorDict, TypedTensorDict, tensorclass

KINDS = ["tensordict", "tensorclass", "lazy"]


@tensorclass
class Sample:
    """The family's tensorclass."""

    a: torch.Tensor
    n: TensorDict
    s: str


class TypedSample(TypedTensorDict):
    """A typed tensordict of two fields (tests/test_kinds_more.py; importable for spawned children)."""

    a: torch.Tensor
    b: torch.Tensor


class TypedWithNested(TypedTensorDict):
    """A typed tensordict with a nested tensordict field."""

    a: torch.Tensor
    n: TensorDict


def build(kind: str, offset: float = 0.0) -> Any:
    a = torch.arange(4.0) + offset
    b = torch.zeros(4, 2) + offset
    if kind == "tensordict":
        return TensorDict(a=a, n={"b": b}, s="text", batch_size=[4])
    if kind == "tensorclass":
        return Sample(a=a, n=TensorDict(b=b, batch_size=[4]), s="text", batch_size=[4])
    members = [TensorDict(a=a[i], n={"b": b[i]}, s="text", batch_size=[]) for i in range(4)]
    return LazyStackedTensorDict(*members, stack_dim=0)
