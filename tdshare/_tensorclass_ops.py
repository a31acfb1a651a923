"""The in-memory methods of a tensorclass instance: :class:`TensorClassOps`.

:func:`tdshare.tensorclass` (:mod:`tdshare._tensorclass`) copies these methods, and those of
:class:`tdshare._tensorclass_io.TensorClassIO` (the memory-mapping family), onto the class it
decorates.  An instance holds one thing, ``_tensordict``: tensor fields, nested tensordicts and
tensorclasses are its entries, every other value is a ``NonTensorData`` entry, and a field set to
None has no entry at all, as in the reference.  Other TensorDict methods are reached through
``__getattr__``, which forwards to the tensordict and wraps a tensordict result back into the class.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import torch

from ._arithmetic import OPERATORS
from ._combine import comparable
from ._compact_repr import compact_repr
from ._errors import (
    ArgumentTypeError,
    FieldError,
    FrozenFieldError,
    InvalidArgumentError,
    MissingKeyError,
    NotSupportedError,
)
from ._future import TensorDictFuture
from ._indexing import is_key
from ._keys import NestedKey, unravel_key
from ._nontensor import NonTensorData
from ._pointwise import LIKE_FUNCTIONS, LOSS_FUNCTIONS, TORCH_FUNCTIONS
from ._shape_torch import shape_torch_function
from ._tensorclass_build import TensorClassBuild
from ._tensorclass_io import TensorClassIO
from ._tensorclass_options import TensorClassOptions, stored_value
from ._tensorclass_stack import combine_instances, plain_collection
from ._tensorclass_state import TensorClassState
from ._tensordict import TensorDict
from ._tensordict_base import TensorDictBase, wrapped_collection

__all__ = ["FIELDS_ATTR", "TensorClassOps", "is_tensorclass", "rebuild_tensorclass"]

_ABSENT: Any = object()

C = TypeVar("C", bound=type)
T = TypeVar("T", bound="TensorClassOps")
_NO_DEFAULT: Any = object()
FIELDS_ATTR = "__tdshare_fields__"


def is_tensorclass(obj: Any) -> bool:
    """Whether ``obj`` is a class made by :func:`tensorclass` or an instance of one.

    >>> import torch, tdshare
    >>> @tdshare.tensorclass
    ... class Obs:
    ...     x: torch.Tensor
    >>> tdshare.is_tensorclass(Obs), tdshare.is_tensorclass(torch.zeros(1))
    (True, False)
    """
    cls = obj if isinstance(obj, type) else type(obj)
    return isinstance(getattr(cls, FIELDS_ATTR, None), tuple)


class TensorClassOps(TensorClassIO, TensorClassState, TensorClassBuild):
    """The in-memory methods that :func:`tensorclass` gives a class (see its docstring)."""

    _tensordict: TensorDict
    __tdshare_fields__: ClassVar[tuple[str, ...]] = ()
    __tdshare_defaults__: ClassVar[dict[str, tuple[bool, Any]]] = {}  # name -> (is a factory, value)
    __tdshare_options__: ClassVar[TensorClassOptions] = TensorClassOptions()

    def __init__(
        self,
        *args: Any,
        batch_size: Any = None,
        device: torch.device | str | int | None = None,
        names: Any = None,
        **kwargs: Any,
    ) -> None:
        cls = type(self)
        fields = cls.__tdshare_fields__
        if args and cls.__tdshare_options__.kw_only:
            raise ArgumentTypeError(
                f"{cls.__name__}() takes its fields as keywords only (kw_only=True), but {len(args)} positional "
                f"value(s) were given; pass {list(fields)[: len(args)]} by name."
            )
        if len(args) > len(fields):
            raise ArgumentTypeError(
                f"{cls.__name__}() takes at most {len(fields)} positional field values ({list(fields)}), "
                f"but {len(args)} were given."
            )
        values = dict(zip(fields, args, strict=False))
        for name, value in kwargs.items():
            if name not in fields:
                raise FieldError(
                    f"{cls.__name__}() got the argument {name!r}, which is not one of its fields {list(fields)}; "
                    "declare it as a field of the class, or drop it."
                )
            if name in values:
                raise ArgumentTypeError(f"{cls.__name__}() got two values for the field {name!r}.")
            values[name] = value
        missing = [n for n in fields if n not in values and n not in cls.__tdshare_defaults__]
        if missing:
            plural = "s" if len(missing) > 1 else ""
            raise ArgumentTypeError(
                f"{cls.__name__}.__init__() missing {len(missing)} required positional argument{plural}: "
                f"{', '.join(map(repr, missing))}; pass them, or give the fields defaults."
            )
        self.__dict__["_tensordict"] = TensorDict({}, batch_size=batch_size, device=device)
        # a subclass's own __setattr__ sees the constructor's fields too, as the reference's does
        put = self.__setattr__ if cls.__setattr__ is not TensorClassOps.__setattr__ else self._set_field
        for name in fields:
            if name in values:
                value = values[name]
            else:
                factory, value = cls.__tdshare_defaults__[name]
                value = value() if factory else value
            put(name, value)
        if names is not None:
            self._tensordict.names = names
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()
        if cls.__tdshare_options__.frozen:
            self._tensordict.lock_()  # as the reference: a frozen instance is locked (in-place writes only)

    @classmethod
    def _from_tensordict(cls: type[T], td: TensorDictBase, fields: dict[str, Any] | None = None) -> T:
        """Wrap ``td`` without copying or checking; ``fields``: JSON fields from a wrapper's meta.json."""
        out = cls.__new__(cls)
        out.__dict__["_tensordict"] = td
        for name, value in (fields or {}).items():
            if name in cls.__tdshare_fields__ and name not in td._tensordict:  # older writers kept them there
                td._tensordict[name] = NonTensorData(value)
        return out

    @classmethod
    def from_tensordict(cls: type[T], td: TensorDictBase, non_tensordict: dict[str, Any] | None = None) -> T:
        """An instance whose fields are the entries of ``td`` (no copy: the instance uses ``td``).

        Args:
            td: a :class:`tdshare.TensorDict` whose keys are fields of the class.
            non_tensordict: more field values (non-tensor ones, typically).

        Returns:
            The new instance.

        Raises:
            ArgumentTypeError: ``td`` is not a TensorDict.
            FieldError: a key of ``td`` is not a field.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs.from_tensordict(tdshare.TensorDict(x=torch.ones(2), batch_size=[2])).x.tolist()
        [1.0, 1.0]
        """
        if not isinstance(td, TensorDictBase):
            raise ArgumentTypeError(f"{cls.__name__}.from_tensordict expects a TensorDict, got {type(td).__name__}.")
        unknown = [k for k in td.keys() if k not in cls.__tdshare_fields__]  # (a lazy stack has no one level)
        if unknown:
            raise FieldError(
                f"{cls.__name__}.from_tensordict: the keys {unknown} are not fields of {cls.__name__} "
                f"({list(cls.__tdshare_fields__)}); select the fields first (td.exclude(...))."
            )
        out = cls._from_tensordict(td)
        for name, value in (non_tensordict or {}).items():
            out._set_field(out._field_key(name), value)  # type: ignore[arg-type]
        return out

    @property
    def _non_tensordict(self) -> dict[str, Any]:
        """The reference's store of non-tensor fields kept beside the tensordict: always empty, as
        every field (non-tensor ones as ``NonTensorData``) lives in the tensordict."""
        return {}

    # -- fields -------------------------------------------------------------------------------
    def _field_key(self, key: NestedKey) -> NestedKey:
        parts = unravel_key(key)
        if parts[0] not in type(self).__tdshare_fields__:
            raise FieldError(self._no_field(parts[0]))
        return key

    def _no_field(self, name: str) -> str:
        cls = type(self)
        return (
            f"{name!r} is not a field of {cls.__name__}; its fields are {list(cls.__tdshare_fields__)}. Declare it "
            "in the class body to store it."
        )

    def _set_field(self, name: str, value: Any, inplace: bool = False) -> None:
        td = self._tensordict
        if value is None:  # a None field has no entry, as in the reference
            if name in td.keys():
                td.pop(name)
            return
        value = stored_value(type(self), type(self).__tdshare_options__, name, value, td.batch_size)
        stored = (torch.Tensor, TensorDictBase, NonTensorData, list)  # lists: TensorDict.set's rules
        if not isinstance(value, stored) and wrapped_collection(value) is None:
            value = NonTensorData(value)
        td.set(name, value, inplace=inplace)

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails: fields (no class attributes) and TensorDict methods
        td = self.__dict__.get("_tensordict")
        if td is not None and name in type(self).__tdshare_fields__:  # private field names too (``_c``)
            leaf = td._tensordict.get(name) if td._stack_parts() is None else td._get_leaf((name,), None)
            return leaf.data if isinstance(leaf, NonTensorData) else leaf
        if td is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        attr = getattr(td, name, _NO_DEFAULT)
        if attr is _NO_DEFAULT:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if callable(attr):
            return functools.partial(_forward, self, attr)
        return _rewrap(self, attr) if isinstance(attr, TensorDictBase) else attr  # ``grad``, ``data``...

    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        if name in cls.__tdshare_fields__:
            if cls.__tdshare_options__.frozen:
                raise FrozenFieldError(f"cannot assign to field {name!r}: {cls.__name__} is frozen (frozen=True).")
            self._set_field(name, value)
        elif name.startswith("_") or isinstance(getattr(cls, name, None), property):
            object.__setattr__(self, name, value)
        else:
            raise FieldError(f"Cannot set the attribute {name!r}: {self._no_field(name)}")

    def __delattr__(self, name: str) -> None:
        if name in type(self).__tdshare_fields__:
            if type(self).__tdshare_options__.frozen:
                raise FrozenFieldError(f"cannot delete field {name!r}: {type(self).__name__} is frozen (frozen=True).")
            self._set_field(name, None)
        else:
            object.__delattr__(self, name)

    def get(self, key: NestedKey, default: Any = _NO_DEFAULT, **options: Any) -> Any:
        """The value of the field ``key`` (a nested key reads inside a nested field); the keywords of
        :meth:`tdshare.TensorDict.get` (``as_list=``, ``as_padded_tensor=``...) read through the
        instance's tensordict (a lazy stack's ragged entries).

        Returns:
            The field's value (None for a field that is unset), or ``default`` (None if not given,
            as the reference) if the key is not a field.

        Raises:
            InvalidArgumentError: without a default, a nested key runs through a leaf field.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        ...     label: str = "a"
        >>> Obs(x=torch.ones(1), batch_size=[1]).get("label")
        'a'
        """
        parts = unravel_key(key)
        if options:  # as_list=, as_padded_tensor=, as_nested_tensor=...: the tensordict reads them
            self._field_key(key)
            return self._tensordict.get(key, None if default is _NO_DEFAULT else default, **options)
        if parts[0] not in type(self).__tdshare_fields__:
            if len(parts) == 1 and isinstance(getattr(type(self), parts[0], None), property):
                return getattr(self, parts[0])  # as the reference: get("batch_size") reads the property
            return None if default is _NO_DEFAULT else default
        value = getattr(self, parts[0])
        if len(parts) == 1:
            return value
        if not hasattr(value, "get") or isinstance(value, torch.Tensor):
            if default is not _NO_DEFAULT:
                return default
            raise InvalidArgumentError(
                f"Cannot read {key!r}: the field {parts[0]!r} holds a leaf, not a collection; pass a default to get()."
            )
        if value is None:
            return None if default is _NO_DEFAULT else default
        rest = parts[1:] if len(parts) > 2 else parts[1]
        return value.get(rest) if default is _NO_DEFAULT else value.get(rest, default)

    def set(self: T, key: NestedKey, value: Any, inplace: bool = False) -> T:
        """Set the field ``key`` to ``value`` (a nested key sets inside a nested field); return ``self``.

        Raises:
            FieldError: ``key`` is not a field.
            LockedError: the instance is locked (use :meth:`set_` for an in-place write).
            BatchSizeError: the value's leading dimensions are not the batch size.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs(x=torch.ones(1), batch_size=[1]).set("x", torch.zeros(1)).x.tolist()
        [0.0]
        """
        parts = unravel_key(self._field_key(key))
        if len(parts) == 1:
            self._set_field(parts[0], value, inplace)
        else:
            self.get(parts[0]).set(parts[1:] if len(parts) > 2 else parts[1], value, inplace=inplace)
        return self

    def set_(self: T, key: NestedKey, value: Any) -> T:
        """Write ``value`` into the existing field ``key`` (allowed while locked); return ``self``.

        Raises:
            FieldError: ``key`` is not a field.
            MissingKeyError: the field is unset.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs(x=torch.ones(1), batch_size=[1]).lock_().set_("x", torch.zeros(1)).x.tolist()
        [0.0]
        """
        parts = unravel_key(self._field_key(key))
        if len(parts) == 1:
            self._tensordict.set_(parts[0], value)
        else:
            self.get(parts[0]).set_(parts[1:] if len(parts) > 2 else parts[1], value)
        return self

    def update(self: T, input_dict_or_td: Any = None, clone: bool = False, inplace: bool = False, **kwargs: Any) -> T:
        """Set every field of ``input_dict_or_td`` (an instance, a TensorDict or a mapping) and of the
        field keywords on ``self`` (the keywords win); return ``self``.

        A mapping or collection for a field that holds a collection updates it, level by level.  The
        other keywords are those of :meth:`tdshare.TensorDict.update` (``keys_to_update``...).

        Raises:
            FieldError: a key that is not a field.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        ...     y: torch.Tensor
        >>> obs = Obs(x=torch.ones(1), y=torch.ones(1), batch_size=[1])
        >>> obs.update({"x": torch.zeros(1)}, y=torch.full((1,), 2.0)).x.tolist(), obs.y.tolist()
        ([0.0], [2.0])
        """
        entries = {k: kwargs.pop(k) for k in list(kwargs) if k in type(self).__tdshare_fields__}
        source = input_dict_or_td._tensordict if is_tensorclass(input_dict_or_td) else input_dict_or_td
        if kwargs:  # the keywords of TensorDict.update (keys_to_update, ...): the tensordict does it
            self._tensordict.update(source, clone, inplace, **kwargs, **entries)
            return self
        items = list(_items(source)) if source is not None else []
        for key, value in [*items, *entries.items()]:
            current = self.get(key) if is_key(key) and unravel_key(key)[0] in type(self).__tdshare_fields__ else None
            if (
                current is not None
                and (isinstance(current, TensorDictBase) or is_tensorclass(current))
                and (isinstance(value, Mapping) or isinstance(value, TensorDictBase) or is_tensorclass(value))
                and not isinstance(value, NonTensorData)
            ):
                current.update(value, clone, inplace)
                continue
            self.set(key, value.clone() if clone and hasattr(value, "clone") else value, inplace=inplace)
        return self

    def update_(self: T, input_dict_or_td: Any = None, clone: bool = False, **kwargs: Any) -> T:
        """Write every field of ``input_dict_or_td`` and of the field keywords into the existing
        fields (allowed while locked); return ``self``.  Other keywords are those of
        :meth:`tdshare.TensorDict.update_`.

        Raises:
            MissingKeyError: a field that is unset.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.ones(2), batch_size=[2]).lock_()
        >>> obs.update_(x=torch.zeros(2)).x.tolist()
        [0.0, 0.0]
        """
        source = input_dict_or_td._tensordict if is_tensorclass(input_dict_or_td) else input_dict_or_td
        self._tensordict.update_(source, clone, **kwargs)
        return self

    # -- indexing -----------------------------------------------------------------------------
    def __getitem__(self: T, idx: Any) -> Any:
        if is_key(idx):
            value = self.get(idx, _ABSENT)
            if value is _ABSENT:  # tc[key] raises where tc.get(key) gives None, as a TensorDict
                raise MissingKeyError(f"Cannot read {idx!r}: {self._no_field(unravel_key(idx)[0])}")
            return value
        return type(self)._from_tensordict(self._tensordict[idx])

    __getitems__ = __getitem__  # torch's DataLoader fetches a batch in one call

    def __setitem__(self, idx: Any, value: Any) -> None:
        if is_key(idx):
            self.set(idx, value)
            return
        if is_tensorclass(value):
            if type(value) is not type(self) and set(type(value).__tdshare_fields__) != set(
                type(self).__tdshare_fields__
            ):
                raise InvalidArgumentError(
                    f"__setitem__ is only allowed for same-class or compatible class (i.e. same members) assignment: "
                    f"{type(self).__name__} has the fields {sorted(type(self).__tdshare_fields__)}, the value, a "
                    f"{type(value).__name__}, {sorted(type(value).__tdshare_fields__)}."
                )
            value = value._tensordict
        self._tensordict[idx] = value

    def __iter__(self: T) -> Iterator[T]:
        for td in self._tensordict:
            yield type(self)._from_tensordict(td)

    def unbind(self: T, dim: int = 0) -> tuple[T, ...]:
        """The instances along the batch dimension ``dim``.

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> [o.x.item() for o in Obs(x=torch.arange(2), batch_size=[2]).unbind(0)]
        [0, 1]
        """
        return tuple(type(self)._from_tensordict(td) for td in self._tensordict.unbind(dim))

    # -- copies, devices, maps ------------------------------------------------------------------
    def to(self: T, *args: Any, **kwargs: Any) -> T:
        """Move to a device and/or cast to a dtype, like ``torch.Tensor.to`` (``self`` if nothing changes).

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs(x=torch.ones(1), batch_size=[1]).to(torch.float64).x.dtype
        torch.float64
        """
        td = self._tensordict.to(*args, **kwargs)
        return self if td is self._tensordict else type(self)._from_tensordict(td)

    def cpu(self: T) -> T:
        """``to("cpu")``: a copy on the CPU (``self`` when every field already is there).

        Returns:
            An instance of the class whose device is the CPU.

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(2), batch_size=[2]).cpu()
        >>> type(obs).__name__, obs.device
        ('Obs', device(type='cpu'))
        """
        return self.to("cpu")

    def clone(self: T, recurse: bool = True) -> T:
        """A copy (``recurse=False``: the tensors are shared, only the structure is new).

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.ones(1), batch_size=[1])
        >>> obs.clone().x.data_ptr() != obs.x.data_ptr()
        True
        """
        return type(self)._from_tensordict(self._tensordict.clone(recurse))

    def contiguous(self: T, *, canonical: bool = False, inplace: bool = False) -> T:
        """A copy whose tensors are contiguous (``self`` with ``inplace=True``); see ``TensorDict.contiguous``.

        Args:
            canonical, inplace: as for ``TensorDict.contiguous``.

        Returns:
            A new instance of the class, or ``self`` with ``inplace=True``.

        >>> from tdshare import TensorClass
        >>> class Obs(TensorClass):
        ...     x: torch.Tensor
        >>> obs = Obs(x=torch.zeros(3, 2).t(), batch_size=[2])
        >>> out = obs.contiguous()
        >>> type(out).__name__, obs.x.is_contiguous(), out.x.is_contiguous()
        ('Obs', False, True)
        """
        out = self._tensordict.contiguous(canonical=canonical, inplace=inplace)
        return self if inplace else type(self)._from_tensordict(out)

    def apply(self: T, fn: Callable[..., Any], *others: Any, batch_size: Any = None, **kwargs: Any) -> T:
        """A new instance with ``fn(tensor, *other_tensors)`` for every tensor (nested fields included).

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> Obs(x=torch.ones(1), batch_size=[1]).apply(lambda t: t + 1).x.tolist()
        [2.0]
        """
        tds = [o._tensordict if is_tensorclass(o) else o for o in others]
        result = self._tensordict.apply(fn, *tds, batch_size=batch_size, **kwargs)  # the keywords of TensorDict.apply
        return _rewrap(self, result)

    def to_tensordict(self, *, retain_none: bool | None = None) -> TensorDict:
        """A :class:`tdshare.TensorDict` copy of the fields (nested tensorclasses become tensordicts).

        >>> import torch, tdshare
        >>> @tdshare.tensorclass
        ... class Obs:
        ...     x: torch.Tensor
        >>> type(Obs(x=torch.ones(1), batch_size=[1]).to_tensordict()).__name__
        'TensorDict'
        """
        return plain_collection(self._tensordict).clone()

    # -- comparison, representation, pickling, torch functions -------------------------------
    def __eq__(self: T, other: object) -> T:  # type: ignore[override]
        theirs = getattr(other, "_tensordict") if is_tensorclass(other) else other  # noqa: B009
        if not comparable(theirs):
            return NotImplemented  # ``tc == "z"`` is False, as for a tensordict
        return type(self)._from_tensordict(self._tensordict._compare(theirs, lambda a, b: a == b))

    def __ne__(self: T, other: object) -> T:  # type: ignore[override]
        theirs = getattr(other, "_tensordict") if is_tensorclass(other) else other  # noqa: B009
        if not comparable(theirs):
            return NotImplemented
        return type(self)._from_tensordict(self._tensordict._compare(theirs, lambda a, b: a != b))

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise NotSupportedError(
            f"Converting a tensordict to boolean value is not permitted: the truth value of a {type(self).__name__} "
            "is ambiguous. Use .all() or .any() to reduce a comparison (e.g. (a == b).all())."
        )

    def __repr__(self) -> str:
        return compact_repr(self)  # the reference's compact form: Name(batch_size=[...], fields={...})

    def __reduce__(self) -> tuple[Any, ...]:
        # the class by its qualified name, the tensordict as its own compact pickle (leaf handles)
        return (rebuild_tensorclass, (type(self), self._tensordict))

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.stack or func is torch.cat:
            items = kwargs.pop("tensors", args[0] if args else None)
            dim = kwargs.pop("dim", args[1] if len(args) > 1 else 0)
            return combine_instances(list(items), dim, new_dim=func is torch.stack)
        if func is torch.unbind:
            return args[0].unbind(*args[1:], **kwargs)
        if func is torch.where and len(args) >= 2:
            cond, first, *rest = args
            second = rest[0] if rest else kwargs.pop("other")
            if is_tensorclass(first):
                return first.where(cond, second, **kwargs)
            return second.where(cond.logical_not(), first, **kwargs)
        if func in LIKE_FUNCTIONS and args and is_tensorclass(args[0]):  # torch.zeros_like(obj)...
            return _rewrap(args[0], func(args[0]._tensordict, *args[1:], **kwargs))
        if func is torch.autograd.grad and args:  # torch.autograd.grad(outputs, inputs, grad_outputs)
            unwrap = lambda a: a._tensordict if is_tensorclass(a) else a  # noqa: E731
            parts: list[Any] = [tuple(unwrap(x) for x in a) if isinstance(a, tuple) else unwrap(a) for a in args]
            inputs = args[1][0] if isinstance(args[1], tuple) and len(args[1]) == 1 else args[1]
            grad: Any = func
            return _rewrap(inputs, grad(*parts, **{k: unwrap(v) for k, v in kwargs.items()}))
        if func in LOSS_FUNCTIONS and args and is_tensorclass(args[0]):  # F.mse_loss(obj, target)...
            inputs = [a._tensordict if is_tensorclass(a) else a for a in args]
            return _rewrap(args[0], func(*inputs, **kwargs))
        name = TORCH_FUNCTIONS.get(func)
        if name is not None and args and is_tensorclass(args[0]):  # torch.exp(obj), torch.sum(obj, 0)...
            return getattr(args[0], name)(*args[1:], **kwargs)
        return shape_torch_function(func, args, kwargs)  # torch.flatten(tc), torch.split(tc, 2)...


def rebuild_tensorclass(cls: type[T], td: TensorDictBase) -> T:
    """Rebuild a pickled tensorclass instance of class ``cls`` around its tensordict ``td``."""
    return cls._from_tensordict(td)


def _forward(tc: Any, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a TensorDict method of ``tc``'s tensordict; a tensordict result becomes an instance again
    (except where the call asks for a tensordict: ``select(..., as_tensordict=True)``)."""
    result = method(*args, **kwargs)
    return result if kwargs.get("as_tensordict") else _rewrap(tc, result)


def _rewrap(tc: Any, result: Any) -> Any:
    if result is tc._tensordict:
        return tc
    if isinstance(result, TensorDictFuture):  # memmap*(return_early=True): the future of an instance
        return TensorDictFuture(result.futures, _rewrap(tc, result.resulting_td))
    if isinstance(result, TensorDictBase) and all(k in type(tc).__tdshare_fields__ for k in result.keys()):
        return type(tc)._from_tensordict(result)
    if isinstance(result, tuple) and result and all(isinstance(r, TensorDictBase) for r in result):
        items = [_rewrap(tc, r) for r in result]
        return tuple(items) if type(result) is tuple else type(result)(items)  # e.g. torch.return_types.max
    return result


def _items(other: Any) -> Any:
    if isinstance(other, TensorDictBase):
        return other._tensordict.items()
    return dict(other).items()


def _operator(name: str) -> Callable[..., Any]:
    """A Python operator (``__add__``, ``__lt__``...) applied to the fields' tensordict, rewrapped."""

    def method(self: Any, *args: Any) -> Any:
        return _forward(self, getattr(self._tensordict, name), *args)

    method.__name__ = name
    method.__qualname__ = f"TensorClassOps.{name}"
    method.__doc__ = f"``{name}`` of the fields' tensordict; a tensordict result is an instance of the class again."
    return method


for _name in OPERATORS:  # Python looks operators up on the class, never through __getattr__
    setattr(TensorClassOps, _name, _operator(_name))
