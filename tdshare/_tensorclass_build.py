"""The class methods that build a tensorclass instance: ``from_dict``, ``from_list``, ``fromkeys``,
and the stacking ones (``stack``, ``cat``, ``lazy_stack``, ``maybe_dense_stack``) called on the
class, as the reference exposes TensorDict's class methods on every tensorclass.

Each builds a :class:`tdshare.TensorDict` the way its TensorDict namesake does, then dresses it in
the class: a nested dict for a field annotated with a tensorclass becomes an instance of that class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch

from ._errors import InvalidArgumentError
from ._keys import NestedKey
from ._lazy import dense_compatible, wrapped_stack
from ._tensorclass_options import annotations_of
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase

__all__ = ["TensorClassBuild"]

T = TypeVar("T")


class TensorClassBuild:
    """Class methods building instances (see the module docstring)."""

    @classmethod
    def from_dict(
        cls: type[T],
        input_dict: Mapping[Any, Any],
        *,
        auto_batch_size: bool | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
        device: torch.device | str | None = None,
        batch_dims: int | None = None,
        names: Sequence[str | None] | None = None,
    ) -> T:
        """An instance whose fields are the entries of the (nested) dict ``input_dict``.

        The arguments are those of :meth:`tdshare.TensorDict.from_dict`; a nested dict for a field
        annotated with a tensorclass becomes an instance of that class.

        Raises:
            FieldError: a key of ``input_dict`` is not a field.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        ...     label: str
        >>> obs = Obs.from_dict({"x": torch.zeros(3), "label": "a"}, auto_batch_size=True)
        >>> type(obs).__name__, obs.batch_size, obs.label
        ('Obs', torch.Size([3]), 'a')
        """
        td = TensorDict.from_dict(
            input_dict,
            auto_batch_size=auto_batch_size,
            batch_size=batch_size,
            device=device,
            batch_dims=batch_dims,
            names=names,
        )
        return _dressed(cls, td)

    @classmethod
    def from_list(
        cls: type[T],
        input: Sequence[Any],
        *,
        auto_batch_size: bool | None = None,
        batch_size: Sequence[int] | torch.Size | None = None,
        device: torch.device | str | None = None,
        batch_dims: int | None = None,
        names: Sequence[str | None] | None = None,
        lazy: bool | None = None,
    ) -> T:
        """An instance stacking the dicts (or instances) of ``input`` along a new first dim.

        The arguments are those of :meth:`tdshare.TensorDict.from_list`; ``lazy`` is accepted and
        the rows are stacked densely.

        Raises:
            InvalidArgumentError: an empty list, or ``batch_size[0]`` is not its length.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs.from_list([{"x": torch.zeros(2)}, {"x": torch.ones(2)}]).x.tolist()
        [[0.0, 0.0], [1.0, 1.0]]
        """
        del lazy
        td = TensorDict.from_list(
            [i._tensordict if isinstance(i, cls) else i for i in input],  # type: ignore[attr-defined]
            auto_batch_size=auto_batch_size,
            batch_size=batch_size,
            device=device,
            batch_dims=batch_dims,
            names=names,
            lazy=False,
        )
        return _dressed(cls, td)

    @classmethod
    def fromkeys(cls: type[T], keys: Sequence[NestedKey], value: Any = 0) -> T:
        """An instance of batch size ``[]`` with ``value`` in each field of ``keys``.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        ...     y: torch.Tensor
        >>> Obs.fromkeys(["x", "y"], 1).y.item()
        1
        """
        return _dressed(cls, TensorDict.fromkeys(keys, value))

    @classmethod
    def stack(cls: type[T], input: Sequence[Any], dim: int = 0, *, out: Any = None) -> T:
        """``torch.stack`` of instances of the class along a new batch dim ``dim``.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(3), batch_size=[3])
        >>> Obs.stack([obs, obs]).batch_size
        torch.Size([2, 3])
        """
        return _into(out, torch.stack(_of_class(cls, input, "stack"), dim))

    @classmethod
    def cat(cls: type[T], input: Sequence[Any], dim: int = 0, *, out: Any = None) -> T:
        """``torch.cat`` of instances of the class along the batch dim ``dim``.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(3), batch_size=[3])
        >>> Obs.cat([obs, obs]).batch_size
        torch.Size([6])
        """
        return _into(out, torch.cat(_of_class(cls, input, "cat"), dim))

    @classmethod
    def lazy_stack(cls: type[T], input: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> T:
        """The instances stacked lazily along ``dim``: an instance of the class around a
        :class:`tdshare.LazyStackedTensorDict` of their tensordicts (nothing is copied; the keywords
        of ``LazyStackedTensorDict.lazy_stack`` are accepted).

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> both = Obs.lazy_stack([Obs(x=torch.zeros(2), batch_size=[]), Obs(x=torch.ones(3), batch_size=[])])
        >>> type(both).__name__, type(both._tensordict).__name__, both[1].x.tolist()
        ('Obs', 'LazyStackedTensorDict', [1.0, 1.0, 1.0])
        """
        stacked = wrapped_stack(_of_class(cls, input, "lazy_stack"), dim, **kwargs)
        return _into(out, stacked)

    @classmethod
    def maybe_dense_stack(cls: type[T], input: Sequence[Any], dim: int = 0, *, out: Any = None, **kwargs: Any) -> T:
        """The instances stacked along ``dim``: densely when their fields agree in shape, else lazily
        (see :meth:`lazy_stack`).

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(3), batch_size=[3])
        >>> Obs.maybe_dense_stack([obs, obs]).batch_size
        torch.Size([2, 3])
        """
        items = _of_class(cls, input, "maybe_dense_stack")
        if not dense_compatible(items):
            return cls.lazy_stack(items, dim, out=out, **kwargs)  # type: ignore[attr-defined]
        return _into(out, torch.stack(items, dim))


def _of_class(cls: type, input: Sequence[Any], what: str) -> list[Any]:
    items = list(input)
    if not items:
        raise InvalidArgumentError(f"{cls.__name__}.{what} needs at least one instance.")
    return items


def _into(out: Any, result: Any) -> Any:
    if out is None:
        return result
    out.update_(result._tensordict if hasattr(result, "_tensordict") else result)
    return out


def _dressed(cls: Any, td: TensorDictBase) -> Any:
    """``td`` as an instance of ``cls``: an entry that is a plain tensordict, for a field annotated
    with a tensorclass, becomes an instance of that class (recursively)."""
    hints = annotations_of(cls)
    for key in list(td.keys()):
        target = hints.get(key)
        value = td._tensordict[key]
        if (
            isinstance(target, type)
            and isinstance(getattr(target, "__tdshare_fields__", None), tuple)
            and type(value) is TensorDict
        ):
            td._tensordict[key] = _dressed(target, value)
    return cls.from_tensordict(td)
