"""The options of :func:`tdshare.tensorclass` and how a field's value is stored under them.

A tensorclass keeps every field in its tensordict; what a value becomes there depends on the
class's options, as in tensordict 0.15.3:

- by default, tensors and tensor collections are stored as they are; ``int``, ``float``, ``bool``
  and numpy values become tensors (a field annotated ``int``/``float``/``bool`` keeps the Python
  value while the instance has batch dimensions, where a 0-d tensor would not fit); lists go
  through :meth:`TensorDict.set` (numbers become a tensor, anything else one value per element);
  every other value is a non-tensor entry;
- ``autocast=True``: the value is converted to the field's annotation (``int("3")``, ``str(4)``,
  ``torch.as_tensor([1, 2])`` for a ``torch.Tensor`` field);
- ``nocast=True``: nothing but tensors and collections becomes a tensor;
- ``tensor_only=True``: every annotation must be a tensor type, a tensor collection or
  ``NonTensorData``, and values are converted to it (a mapping for a collection field becomes
  that collection, keeping the tensordicts it holds).
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ._errors import ArgumentTypeError
from ._nontensor import NonTensorData
from ._tensordict_base import TensorDictBase, wrapped_collection

__all__ = ["TensorClassOptions", "annotations_of", "check_tensor_only", "stored_value"]

_SCALARS = (int, float, bool)


@dataclasses.dataclass(frozen=True)
class TensorClassOptions:
    """The class flags of a tensorclass (see :func:`tdshare.tensorclass` for each)."""

    autocast: bool = False
    frozen: bool = False
    nocast: bool = False
    shadow: bool = False
    tensor_only: bool = False
    skip_post_init_on_rebuild: bool = False
    kw_only: bool = False

    def __post_init__(self) -> None:
        if self.autocast and self.nocast:
            raise ArgumentTypeError("tensorclass: autocast=True and nocast=True exclude each other; pick one.")
        if self.tensor_only and (self.autocast or self.nocast):
            raise ArgumentTypeError(
                "tensorclass: tensor_only=True excludes autocast and nocast (it casts every value to a tensor)."
            )


def annotations_of(cls: type) -> dict[str, Any]:
    """The fields' annotations of ``cls``, resolved to objects where they can be (cached on the class)."""
    cached = cls.__dict__.get("__tdshare_hints__")
    if cached is not None:
        return cached
    raw = {f.name: f.type for f in dataclasses.fields(cls)}
    module = sys.modules.get(cls.__module__)
    scope = {"torch": torch, "Tensor": torch.Tensor, **(vars(module) if module else {}), cls.__name__: cls}
    hints = {name: _resolve(value, scope) for name, value in raw.items()}
    type.__setattr__(cls, "__tdshare_hints__", hints)
    return hints


def _resolve(annotation: Any, scope: dict[str, Any]) -> Any:
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, dict(scope))
        except Exception:
            return Any  # a name the module does not define at run time (TYPE_CHECKING imports...)
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _resolve(args[0], scope) if len(args) == 1 else Any
    if isinstance(annotation, types.GenericAlias) and _is_class(origin) and issubclass(origin, TensorDictBase):
        return origin  # TensorDict[str, torch.Tensor]: the class
    return annotation


def _is_class(target: Any) -> bool:
    """A real class (``typing.Any`` is a class too on Python 3.11+, but annotates "anything")."""
    return isinstance(target, type) and target is not Any and target is not object


def _is_collection_type(target: Any) -> bool:
    return _is_class(target) and (
        issubclass(target, TensorDictBase) or isinstance(getattr(target, "__tdshare_fields__", None), tuple)
    )


def check_tensor_only(cls: type, fields: list[str]) -> None:
    """Refuse a ``tensor_only`` class with a field that is neither a tensor type nor a collection.

    Raises:
        ArgumentTypeError: the first such field, named.
    """
    hints = annotations_of(cls)
    for name in fields:
        target = hints.get(name, Any)
        if not (_is_class(target) and issubclass(target, (torch.Tensor, NonTensorData))) and not _is_collection_type(
            target
        ):
            raise ArgumentTypeError(
                f"{cls.__qualname__}: tensor_only=True needs every field to be a tensor, a tensor collection or "
                f"None, but {name!r} is annotated {target!r}; drop tensor_only or change the annotation."
            )


def stored_value(cls: type, options: TensorClassOptions, name: str, value: Any, batch: torch.Size) -> Any:
    """What the field ``name`` of ``cls`` stores for ``value`` (see the module docstring).

    Returns a tensor, a collection, ``NonTensorData``, or the value unchanged for the tensordict's
    own rules (lists, other objects).

    Raises:
        ArgumentTypeError: ``autocast``/``tensor_only`` cannot convert the value (the field is named).
    """
    if options.autocast and isinstance(value, torch.Tensor) and value.numel() == 1:
        target = annotations_of(cls).get(name, Any)
        if target in (int, float, bool):  # a one-element tensor given to a number field: the number, as the reference
            return _plain(target(value.item()))
    if isinstance(value, (torch.Tensor, TensorDictBase, NonTensorData)) or wrapped_collection(value) is not None:
        return value
    if options.nocast:
        return _plain(value)
    if options.tensor_only:
        return _tensor_only_value(cls, name, value, batch)
    if options.autocast:
        return _autocast(cls, name, value, batch)
    if isinstance(value, (*_SCALARS, np.ndarray, np.generic)):
        target = annotations_of(cls).get(name, Any)
        if batch and isinstance(target, type) and target in _SCALARS and isinstance(value, target):
            return _plain(value)  # a 0-d tensor would not fit the batch dimensions
        return torch.as_tensor(value)
    return value  # lists go through TensorDict.set's rules; anything else is non-tensor data


def _tensor_only_value(cls: type, name: str, value: Any, batch: torch.Size) -> Any:
    """A ``tensor_only`` field's value: a mapping for a collection field becomes that collection
    (nested mappings become nested levels, tensordicts in it are kept as they are), a value for a
    ``NonTensorData`` field is wrapped, anything else is converted to a tensor."""
    target = annotations_of(cls).get(name, Any)
    if _is_class(target) and issubclass(target, NonTensorData):
        return _plain(value)
    if isinstance(value, Mapping) and _is_collection_type(target):
        plain = _plain_dicts(value)
        if issubclass(target, TensorDictBase):
            return _convert(name, lambda v: target(v, batch_size=batch), plain, target.__name__)
        build: Any = target  # a tensorclass: its constructor takes the fields and batch_size=
        return _convert(name, lambda v: build(**v, batch_size=batch), plain, target.__name__)
    return _convert(name, torch.as_tensor, value, "a tensor")


def _plain_dicts(value: Mapping) -> dict[str, Any]:
    """``value`` (any mapping) as dicts, level by level; collections and other values unchanged."""
    return {
        k: _plain_dicts(v) if isinstance(v, Mapping) and not isinstance(v, TensorDictBase) else v
        for k, v in value.items()
    }


def _autocast(cls: type, name: str, value: Any, batch: torch.Size) -> Any:
    target = annotations_of(cls).get(name, Any)
    if not _is_class(target):
        if isinstance(value, (*_SCALARS, np.ndarray, np.generic)):
            return torch.as_tensor(value)
        return value
    if issubclass(target, torch.Tensor):
        return _convert(name, torch.as_tensor, value, "a tensor")
    if _is_collection_type(target) and isinstance(value, dict):
        if issubclass(target, TensorDictBase):
            return value  # the tensordict builds the nested level from the dict
        build: Any = target  # a tensorclass: its constructor takes the fields and batch_size=
        return _convert(name, lambda v: build(**v, batch_size=batch), value, target.__name__)
    if isinstance(value, target):
        return _plain(value)
    return _plain(_convert(name, target, value, target.__name__))


def _convert(name: str, fn: Any, value: Any, what: str) -> Any:
    try:
        return fn(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ArgumentTypeError(
            f"Cannot store {type(value).__name__} {value!r:.60} in the field {name!r}: converting it to {what} "
            f"failed ({exc}). Pass a value of that type, or change the field's annotation."
        ) from None


def _plain(value: Any) -> NonTensorData:
    return value if isinstance(value, NonTensorData) else NonTensorData(value)
