"""``tensorclass``: a dataclass whose fields live in a :class:`tdshare.TensorDict`.

The decorator makes the class a dataclass (for its fields and defaults), then gives it the
methods of :class:`tdshare._tensorclass_ops.TensorClassOps` (construction, attribute access,
indexing, stacking, copies, comparison, pickling, locking) and of
:class:`tdshare._tensorclass_io.TensorClassIO` (the memory-mapping family).  Each decorated class
is one node kind (:mod:`tdshare._nodes`, layout ``WRAPPED``), so a tensordict holding an instance
saves it in the reference's layout (``<key>/meta.json`` with ``_type``, ``<key>/_tensordict/``) and
loads it back as its class.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from types import FunctionType
from typing import Any, TypeVar

from ._errors import ArgumentTypeError, InvalidArgumentError
from ._format import RESERVED_KEYS, WRAPPED, WRAPPED_DIR
from ._nodes import NodeKind, register
from ._tensorclass_io import class_tag
from ._tensorclass_ops import FIELDS_ATTR, TensorClassOps, is_tensorclass
from ._tensordict_base import TensorDictBase

__all__ = ["tensorclass", "is_tensorclass"]

C = TypeVar("C", bound=type)


# -- the decorator ------------------------------------------------------------------------------
_NOT_COPIED = frozenset(
    {
        "__dict__",
        "__weakref__",
        "__module__",
        "__qualname__",
        "__doc__",
        "__annotations__",
        "__parameters__",
        "__orig_bases__",
        "__slots__",
        "__abstractmethods__",
        "_abc_impl",
        "__firstlineno__",
        "__static_attributes__",
    }
)
# always the decorator's, even where the class body defines them: the storage depends on them
_ALWAYS_OURS = frozenset({"__getattr__", "__setattr__", "__delattr__", "__reduce__", "_from_tensordict", "_set_field"})


def _namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {}
    for base in reversed(TensorClassOps.__mro__[:-1]):  # the most derived definition wins
        for name, value in vars(base).items():
            if name not in _NOT_COPIED and (
                isinstance(value, (FunctionType, classmethod, staticmethod, property)) or name == "__hash__"
            ):
                ns[name] = value
    return ns


_OPS = _namespace()
_RESERVED_FIELDS = frozenset(n for n in _OPS if not n.startswith("__")) | RESERVED_KEYS | {WRAPPED_DIR}


def tensorclass(cls: C | None = None) -> Any:
    """Make ``cls`` a tensorclass: a dataclass whose fields live in a :class:`tdshare.TensorDict`.

    Tensor fields (and nested tensordicts and tensorclasses) share the batch size given as
    ``batch_size=`` (default ``[]``); any other value (str, int, float, bool, list, dict, any
    picklable object) is a non-tensor field; a field set to None is unset.  The class gets
    construction with ``batch_size=``/``device=``/``names=``, attribute access and assignment,
    ``get``/``set``, indexing and ``obj[idx] = other``, ``to``/``clone``/``apply``,
    ``torch.stack``/``torch.cat``, ``to_tensordict``/``from_tensordict``, ``==``, ``repr``,
    pickling, locking, and the memory-mapping family (``memmap_``, ``memmap``, ``save``,
    ``load_memmap``, ``make_memmap*``, ``memmap_refresh_``...), saved in the reference's
    tensorclass layout.  Other TensorDict methods are reached through the instance too.

    Args:
        cls: the class (``@tensorclass`` and ``@tensorclass()`` both work).

    Returns:
        The same class, changed in place.

    Raises:
        ArgumentTypeError: ``cls`` is not a class.
        InvalidArgumentError: a field whose name the class or the saved format needs
            (``batch_size``, ``shape``, ``to``, ``_tensordict``...).

    >>> import torch, tdshare
    >>> @tdshare.tensorclass
    ... class Obs:
    ...     x: torch.Tensor
    ...     label: str = "train"
    >>> obs = Obs(x=torch.zeros(4, 3), batch_size=[4])
    >>> obs[1:3].x.shape, obs.label
    (torch.Size([2, 3]), 'train')
    """
    if cls is None:
        return tensorclass
    if not isinstance(cls, type):
        raise ArgumentTypeError(f"@tensorclass decorates a class, got {type(cls).__name__} {cls!r}.")
    _as_dataclass(cls)
    fields = [f for f in dataclasses.fields(cls) if f._field_type is dataclasses._FIELD]  # type: ignore[attr-defined]
    for f in fields:
        if f.name in _RESERVED_FIELDS:
            raise InvalidArgumentError(
                f"{cls.__qualname__}: the field {f.name!r} cannot be a tensorclass field, because the class or "
                f"the saved format uses that name ({'a method' if f.name in _OPS else 'a reserved key'}); rename it."
            )
    defaults: dict[str, tuple[bool, Any]] = {}
    for f in fields:
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = (False, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = (True, f.default_factory)
        if f.name in vars(cls):
            delattr(cls, f.name)  # the value lives in the tensordict: no class attribute may hide it
    own = vars(cls)
    for name, value in _OPS.items():
        if name not in own or name in _ALWAYS_OURS:  # a method of the class body wins, except the storage's
            setattr(cls, name, value)
    setattr(cls, FIELDS_ATTR, tuple(f.name for f in fields))
    cls.__tdshare_defaults__ = defaults  # type: ignore[attr-defined]
    register(
        NodeKind(
            cls.__name__,
            WRAPPED,
            cls.__name__,
            cls,
            type_tag=class_tag(cls),
            unwrap=_unwrap,
            wrap=functools.partial(_wrap, cls),
        )
    )
    return cls


def _as_dataclass(cls: type) -> None:
    # dataclasses reads string annotations ("from __future__ import annotations") in the namespace
    # of sys.modules[cls.__module__]; code run by exec() under a module name that was never
    # imported has none, so it gets an empty stand-in for the time of the call
    name = cls.__module__
    stand_in = name not in sys.modules
    if stand_in:
        sys.modules[name] = types.ModuleType(name)
    try:
        dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    finally:
        if stand_in:
            del sys.modules[name]


def _unwrap(tc: Any) -> tuple[TensorDictBase, dict[str, Any]]:
    return tc._tensordict, {}


def _wrap(cls: Any, td: TensorDictBase, fields: dict[str, Any]) -> Any:
    return cls._from_tensordict(td, fields)
