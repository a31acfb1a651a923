"""``TypedTensorDict``: a :class:`tdshare.TensorDict` whose fields are declared as class annotations.

A subclass lists its fields as annotations (``obs: torch.Tensor``), optionally with defaults; its
constructor takes the fields by keyword and refuses a missing or an unknown one before it builds
anything; fields read and write as attributes (``state.obs``) as well as keys (``state["obs"]``).
Everything else is a TensorDict's: indexing, ``apply``, stacking, ``map``, the memmap family and
pickling keep the subclass, and a memory-mapped instance crosses processes as a handle.  On disk
an instance is a plain TensorDict level (tensordict 0.15.3 writes its typed dicts the same way),
so a folder loads as a ``TensorDict``; ``Cls.from_tensordict(td)`` types it again.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

import torch

from ._errors import ArgumentTypeError, ReservedFieldError
from ._tensordict import TensorDict

__all__ = ["TypedTensorDict"]

T = TypeVar("T", bound="TypedTensorDict")
_NO_DEFAULT = object()
_CONSTRUCTOR_ARGS = frozenset({"batch_size", "device", "names", "non_blocking", "lock"})


class TypedTensorDict(TensorDict):
    """A TensorDict subclass whose fields are declared as class annotations.

    Keyword Args:
        batch_size: the batch size (default: empty).
        device: the device of the instance (default: none).
        names: the names of the batch dimensions.
        non_blocking: accepted for the reference's signature (copies here are synchronous).
        lock: lock the instance after building it.
        **fields: the value of each field; a field with a class-level default may be left out.

    Raises:
        ArgumentTypeError: a field without a default is missing, or a name is not a field
            (a ``TypeError``, as the reference raises).
        ReservedFieldError: a subclass declares a field named like a TensorDict attribute.

    >>> from tdshare import TypedTensorDict
    >>> import torch
    >>> class State(TypedTensorDict):
    ...     obs: torch.Tensor
    ...     reward: torch.Tensor
    >>> s = State(obs=torch.zeros(4, 3), reward=torch.ones(4), batch_size=[4])
    >>> s.obs.shape, type(s[1:3]).__name__, s[0]["reward"].item()
    (torch.Size([4, 3]), 'State', 1.0)
    """

    __tdshare_typed_fields__: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, Any] = {}
        for base in reversed(cls.__mro__[1:]):
            fields.update(getattr(base, "__tdshare_typed_fields__", {}))
        reserved = set(dir(TensorDict))
        for name in inspect.get_annotations(cls):
            if name.startswith("__") or name == "__tdshare_typed_fields__":
                continue
            if name in reserved or name in _CONSTRUCTOR_ARGS:
                raise ReservedFieldError(
                    f"{cls.__name__}: the field {name!r} has the name of a TensorDict attribute or "
                    "constructor argument; rename the field."
                )
            default = cls.__dict__.get(name, _NO_DEFAULT)
            if default is not _NO_DEFAULT:
                delattr(cls, name)  # the value is read from the tensordict, not the class
            fields[name] = default
        cls.__tdshare_typed_fields__ = fields

    def __init__(
        self,
        source: Any = None,
        batch_size: Sequence[int] | torch.Size | int | None = None,
        device: torch.device | str | int | None = None,
        names: Sequence[str | None] | None = None,
        non_blocking: bool | None = None,
        lock: bool = False,
        **fields: Any,
    ) -> None:
        declared = type(self).__tdshare_typed_fields__
        given = dict(source.items()) if source is not None else {}
        given.update(fields)
        unknown = [k for k in given if k not in declared]
        if unknown:
            raise ArgumentTypeError(
                f"{type(self).__name__}() got unknown fields {sorted(unknown)}; its fields are {list(declared)}."
            )
        values: dict[str, Any] = {}
        missing = []
        for name, default in declared.items():
            if name in given:
                values[name] = given[name]
            elif default is _NO_DEFAULT:
                missing.append(name)
            elif default is not None:
                values[name] = default.clone() if isinstance(default, torch.Tensor) else default
        if missing:
            raise ArgumentTypeError(
                f"{type(self).__name__}() is missing the fields {missing}: pass them by keyword or give "
                "them a default in the class."
            )
        super().__init__(values, batch_size=batch_size, device=device, names=names, lock=lock)

    @classmethod
    def from_tensordict(cls: type[T], td: TensorDict) -> T:
        """An instance of this class over the entries of ``td`` (the same tensors, nothing copied).

        Args:
            td: a tensordict holding every field without a default.

        Returns:
            The typed tensordict.

        Raises:
            ArgumentTypeError: a field is missing or ``td`` holds an entry that is not a field.

        >>> from tdshare import TensorDict, TypedTensorDict
        >>> import torch
        >>> class S(TypedTensorDict):
        ...     x: torch.Tensor
        >>> td = TensorDict(x=torch.zeros(2), batch_size=[2])
        >>> S.from_tensordict(td).x is td["x"]
        True
        """
        return cls(dict(td.items()), batch_size=td.batch_size, device=td.device)

    def __getattr__(self, name: str) -> Any:
        fields = type(self).__tdshare_typed_fields__
        if name in fields and "_tensordict" in self.__dict__:
            if name in self._tensordict:
                return self[name]
            if fields[name] is None:
                return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in type(self).__tdshare_typed_fields__:
            self[name] = value
            return
        super().__setattr__(name, value)
