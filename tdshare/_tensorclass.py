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
import inspect
import sys
import types
from types import FunctionType
from typing import Any, ClassVar, TypeVar

from ._errors import ArgumentTypeError, ReservedFieldError
from ._format import RESERVED_KEYS, WRAPPED, WRAPPED_DIR
from ._nodes import NodeKind, register
from ._tensorclass_io import class_tag
from ._tensorclass_ops import FIELDS_ATTR, TensorClassOps, is_tensorclass
from ._tensorclass_options import TensorClassOptions, check_tensor_only
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase

__all__ = ["TensorClass", "is_tensorclass", "tensorclass"]

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
# the public members an instance has (its own methods and the TensorDict ones it forwards to):
# a field of that name would hide one, which only shadow=True allows
_MEMBERS = frozenset(n for n in (*_OPS, *dir(TensorDict)) if not n.startswith("_"))
_FREE_MEMBERS = frozenset({"data", "fields"})  # as in the reference, a field of these names hides the member
# never a field, even with shadow=True: the storage's private names and the saved format's keys
_RESERVED_FIELDS = frozenset(n for n in _OPS if n.startswith("_") and not n.startswith("__")) | (
    RESERVED_KEYS | {WRAPPED_DIR, "_tensordict"}
)


_CONSTRUCTOR_ORDER = ("batch_size", "device", "names")
_CONSTRUCTOR = frozenset(_CONSTRUCTOR_ORDER)  # the constructor's own keywords


def tensorclass(
    cls: C | None = None,
    /,
    *,
    autocast: bool = False,
    frozen: bool = False,
    nocast: bool = False,
    shadow: bool = False,
    tensor_only: bool = False,
    skip_post_init_on_rebuild: bool = False,
    kw_only: bool = False,
) -> Any:
    """Make ``cls`` a tensorclass: a dataclass whose fields live in a :class:`tdshare.TensorDict`.

    Tensor fields (and nested tensordicts and tensorclasses) share the batch size given as
    ``batch_size=`` (default ``[]``); ``int``/``float``/``bool``/numpy values become tensors (a field
    annotated ``int``/``float``/``bool`` keeps the Python value when the instance has batch
    dimensions), lists follow :meth:`TensorDict.set`, and any other value (str, dict, any picklable
    object) is a non-tensor field; a field set to None is unset.  The class gets construction with
    ``batch_size=``/``device=``/``names=``, attribute access and assignment, ``get``/``set``,
    indexing and ``obj[idx] = other``, ``to``/``clone``/``apply``, ``torch.stack``/``torch.cat``,
    ``to_tensordict``/``from_tensordict``, ``==``, ``repr``, pickling, locking, and the
    memory-mapping family (``memmap_``, ``memmap``, ``save``, ``load_memmap``, ``make_memmap*``,
    ``memmap_refresh_``...), saved in the reference's tensorclass layout.  Other TensorDict methods
    are reached through the instance too.  Subclassing :class:`tdshare.TensorClass` does the same,
    and static type checkers then see the methods.

    Args:
        cls: the class (``@tensorclass`` and ``@tensorclass(...)`` both work).
        autocast: convert each value set to its field's annotation (``int("3")``, a list to a
            tensor for a ``torch.Tensor`` field...).  Excludes ``nocast`` and ``tensor_only``.
        frozen: assigning or deleting a field raises :class:`tdshare.FrozenFieldError` (a
            ``dataclasses.FrozenInstanceError``); in-place writes (``set_``) still work.
        nocast: keep ``int``, ``float``, ``bool``, numpy values and lists as Python values.
        shadow: allow fields named like a method of the class (``sum``, ``to``...); the field
            then hides the method.  The constructor's ``batch_size``, ``device`` and ``names`` and
            the format's reserved keys stay refused.
        tensor_only: every field must be annotated with a tensor type or a tensor collection;
            values are converted to tensors.
        skip_post_init_on_rebuild: accepted for the reference's API; tdshare runs ``__post_init__``
            only in the constructor, never when it rebuilds an instance (indexing, ``clone``,
            loading, unpickling), which is what this flag asks of the reference.
        kw_only: the constructor takes the fields as keywords only.

    Returns:
        The same class, changed in place (or, without ``cls``, a decorator).

    Raises:
        ArgumentTypeError: ``cls`` is not a class; ``autocast`` with ``nocast``, ``tensor_only`` with
            either; a ``tensor_only`` field annotated with something else than a tensor type.
        ReservedFieldError: a field whose name the class or the saved format needs
            (``batch_size``, ``shape``, ``_tensordict``, a method without ``shadow=True``...); it is
            both an ``InvalidArgumentError`` (ValueError) and an ``AttributeError``.

    >>> import torch, tdshare
    >>> @tdshare.tensorclass
    ... class Obs:
    ...     x: torch.Tensor
    ...     label: str = "train"
    >>> obs = Obs(x=torch.zeros(4, 3), batch_size=[4])
    >>> obs[1:3].x.shape, obs.label
    (torch.Size([2, 3]), 'train')
    """
    options = TensorClassOptions(autocast, frozen, nocast, shadow, tensor_only, skip_post_init_on_rebuild, kw_only)
    if cls is None:
        return functools.partial(_decorate, options=options)
    return _decorate(cls, options)


def _decorate(cls: Any, options: TensorClassOptions) -> Any:
    if not isinstance(cls, type):
        raise ArgumentTypeError(f"@tensorclass decorates a class, got {type(cls).__name__} {cls!r}.")
    _as_dataclass(cls)
    fields = [f for f in dataclasses.fields(cls) if f._field_type is dataclasses._FIELD]  # type: ignore[attr-defined]
    for f in fields:
        _check_field_name(cls, f.name, options)
    if options.tensor_only:
        check_tensor_only(cls, [f.name for f in fields])
    defaults: dict[str, tuple[bool, Any]] = {}
    for f in fields:
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = (False, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = (True, f.default_factory)
        if f.name in vars(cls):
            delattr(cls, f.name)  # the value lives in the tensordict: no class attribute may hide it
    own = vars(cls)
    names = {f.name for f in fields}
    inherits = issubclass(cls, TensorClassOps)  # a TensorClass subclass: super() reaches the storage's methods
    for name, value in _OPS.items():
        if name in names:
            continue  # a shadowing field: its value hides the method
        if name not in own or (name in _ALWAYS_OURS and not inherits):  # the class body's wins, but the storage's
            setattr(cls, name, value)
    for name in names & set(dir(cls)):
        if any(name in vars(base) for base in cls.__mro__[1:]):  # inherited (a TensorClass subclass): the field wins
            setattr(cls, name, _FieldSlot(name))
    setattr(cls, FIELDS_ATTR, tuple(f.name for f in fields))
    cls.__expected_keys__ = {f.name for f in fields}  # type: ignore[attr-defined]  # the reference's name
    cls.__signature__ = _signature(fields, options)  # type: ignore[attr-defined]
    cls.__tdshare_defaults__ = defaults  # type: ignore[attr-defined]
    cls.__tdshare_options__ = options  # type: ignore[attr-defined]
    for flag in ("autocast", "nocast", "frozen", "shadow", "tensor_only"):
        setattr(cls, f"_{flag}", getattr(options, flag))  # the reference's class attributes (``Cls._autocast``)
    if options.frozen:
        cls.__hash__ = object.__hash__  # type: ignore[assignment]  # a frozen instance is a dict key, by identity
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


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _signature(fields: list[dataclasses.Field], options: TensorClassOptions) -> inspect.Signature:
    """The constructor's signature, as ``inspect.signature(cls)`` shows it: the fields, then
    ``batch_size``, ``device`` and ``names``."""
    kind = inspect.Parameter.KEYWORD_ONLY if options.kw_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = []
    for f in fields:
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = _FACTORY  # made per instance: not called here
        else:
            default = inspect.Parameter.empty
        params.append(inspect.Parameter(f.name, kind, default=default, annotation=f.type))
    if not options.kw_only and any(p.default is not inspect.Parameter.empty for p in params):
        # a field without a default after one with: the signature reads it as keyword-only, as Python would
        seen_default = False
        for i, p in enumerate(params):
            seen_default = seen_default or p.default is not inspect.Parameter.empty
            if seen_default and p.default is inspect.Parameter.empty:
                params[i:] = [q.replace(kind=inspect.Parameter.KEYWORD_ONLY) for q in params[i:]]
                break
    for name in _CONSTRUCTOR_ORDER:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)


def _check_field_name(cls: type, name: str, options: TensorClassOptions) -> None:
    if name in _RESERVED_FIELDS or name in _CONSTRUCTOR or name.startswith("__tdshare"):
        what, fix = "a key of the saved format or an argument of the constructor", "rename the field"
    elif name in _MEMBERS and not options.shadow and name not in _FREE_MEMBERS:
        what, fix = "a method of tensorclasses", "rename the field, or pass shadow=True to let it hide the method"
    else:
        return
    raise ReservedFieldError(
        f"Attribute name {name} can't be used with @tensorclass ({cls.__qualname__}): the class or the saved format "
        f"uses that name ({what}); {fix}."
    )


class _FieldSlot:
    """A class attribute that gives way to the instance's field of the same name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return obj.__getattr__(self.name)


class TensorClass(TensorClassOps):
    """Base class form of :func:`tensorclass`: ``class Obs(TensorClass): ...`` makes ``Obs`` a tensorclass.

    Flags go in brackets, as in the reference: ``class Obs(TensorClass["nocast", "frozen"])``.
    Static type checkers see the methods (``memmap_``, ``load_memmap``, ``get``...) and the
    fields' types; the constructor is typed loosely (fields as keywords, ``batch_size=``,
    ``device=``, ``names=``), and a checker reads the bracket form as a generic subscription.

    >>> import torch, tdshare
    >>> class Obs(tdshare.TensorClass):
    ...     x: torch.Tensor
    >>> Obs(x=torch.zeros(2), batch_size=[2]).memmap_().is_memmap()
    True
    """

    __tdshare_flags__: ClassVar[dict[str, bool]] = {}
    _autocast: ClassVar[bool] = False
    _nocast: ClassVar[bool] = False
    _frozen: ClassVar[bool] = False
    _shadow: ClassVar[bool] = False
    _tensor_only: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        known = {f.name for f in dataclasses.fields(TensorClassOptions)}
        flags = {**cls.__tdshare_flags__, **{k: bool(kwargs.pop(k)) for k in list(kwargs) if k in known}}
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("__tdshare_flag_base__"):
            return  # the class TensorClass["..."] made: its subclasses are the tensorclasses
        _decorate(cls, TensorClassOptions(**flags))

    def __class_getitem__(cls, flags: str | tuple[str, ...]) -> type[TensorClass]:
        chosen = (flags,) if isinstance(flags, str) else tuple(flags)
        known = {f.name for f in dataclasses.fields(TensorClassOptions)}
        for flag in chosen:
            if flag not in known:
                raise ArgumentTypeError(f"TensorClass[...] takes the flags {sorted(known)}, got {flag!r}.")
        return _flag_base(frozenset(chosen))


@functools.cache
def _flag_base(flags: frozenset[str]) -> type[TensorClass]:
    namespace = {"__tdshare_flags__": dict.fromkeys(flags, True), "__tdshare_flag_base__": True}
    return type(f"TensorClass[{', '.join(sorted(flags))}]", (TensorClass,), namespace)


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
