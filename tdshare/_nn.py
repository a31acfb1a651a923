"""``torch.nn`` helpers of tensor collections: a module's parameters and buffers as a tensordict
(``from_module``, ``from_modules``), a tensordict's tensors put into a module (``to_module``),
and the ``state_dict`` / ``load_state_dict`` pair.  A mixin of
:class:`tdshare._tensordict_base.TensorDictBase`.

Entries are nested as the modules are (``td["0", "weight"]`` for ``Sequential``'s first layer);
parameters stay ``nn.Parameter`` objects, buffers stay tensors.  ``to_module`` returns the values
it replaced, and used as a context manager (``with params.to_module(module): ...``) it puts them
back when the block ends.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from ._errors import InvalidArgumentError, MissingKeyError, NotSupportedError, StateDictKeysError
from ._format import LAZY_STACK_TYPE
from ._key_ops import collection_of, is_node
from ._keys import unravel_key
from ._nodes import kind_for_tag

__all__ = ["NnOps", "set_params_wrapper"]

_LEGACY_KEYS = frozenset({"__batch_size", "__device"})  # metadata entries of older state dicts

T = TypeVar("T", bound="NnOps")

# the class that as_module=True wraps a result in (TensorDictParams, a higher layer, registers itself)
_PARAMS_WRAPPER: list[Callable[..., Any]] = []


def set_params_wrapper(wrapper: Callable[..., Any]) -> None:
    """Register the module class that ``from_module(s)(as_module=True)`` wraps its result in.

    Args:
        wrapper: called as ``wrapper(tensordict, no_convert=True, lock=...)`` (``tdshare.TensorDictParams``).
    """
    _PARAMS_WRAPPER[:] = [wrapper]


def _as_module(td: Any, lock: bool, what: str) -> Any:
    if not _PARAMS_WRAPPER:
        raise NotSupportedError(f"{what}(as_module=True): the TensorDictParams class is not loaded (import tdshare).")
    return _PARAMS_WRAPPER[0](td, no_convert=True, lock=lock)  # buffers stay tensors, as in the reference


class NnOps:
    """Module parameters in and out of a tensordict; the host provides the storage and accessors."""

    @classmethod
    def from_module(
        cls,
        module: nn.Module,
        as_module: bool = False,
        lock: bool = False,
        use_state_dict: bool = False,
        filter_empty: bool = True,
    ) -> Any:
        """A tensordict (batch size ``[]``) of ``module``'s parameters and buffers, nested by submodule.

        Args:
            module: the module.
            as_module: return a ``tdshare.TensorDictParams`` (an ``nn.Module``) holding the result.
            lock: lock the result.
            use_state_dict: read ``module.state_dict()`` (its hooks run; values are detached).
            filter_empty: leave out submodules without parameters or buffers.

        >>> from tdshare import TensorDict
        >>> params = TensorDict.from_module(torch.nn.Linear(3, 4))
        >>> params["weight"].shape, type(params["weight"]).__name__
        (torch.Size([4, 3]), 'Parameter')
        """
        level: Any = cls._level_class()  # type: ignore[attr-defined]
        if use_state_dict:
            out = level()
            for name, value in module.state_dict().items():
                out.set(tuple(name.split(".")), value)
        else:
            out = _module_td(level, module, filter_empty)
        if as_module:
            return _as_module(out, lock, "from_module")
        return out.lock_() if lock else out

    @classmethod
    def from_modules(
        cls,
        *modules: nn.Module,
        as_module: bool = False,
        lock: bool = True,
        use_state_dict: bool = False,
        lazy_stack: bool = False,
        expand_identical: bool = False,
    ) -> Any:
        """The parameters of modules of one structure, stacked along a new first dim.

        Stacked parameters are new ``nn.Parameter`` objects (gradients reach them, not the modules').

        Args:
            *modules: modules with the same parameters and buffers.
            as_module: return a ``tdshare.TensorDictParams`` holding the stacked parameters.
            lock: lock the result.
            use_state_dict: read each module's ``state_dict()``.
            lazy_stack: a lazy stack of each module's tensordict (the modules' own parameters).
            expand_identical: a tensor all modules share is expanded, not copied (and not a Parameter).

        Raises:
            RuntimeError: ``lazy_stack=True`` with lazy (uninitialized) modules.

        >>> from tdshare import TensorDict
        >>> TensorDict.from_modules(torch.nn.Linear(3, 4), torch.nn.Linear(3, 4))["weight"].shape
        torch.Size([2, 4, 3])
        """
        if not modules:
            raise InvalidArgumentError("from_modules needs at least one module.")
        if lazy_stack and any(
            isinstance(p, nn.parameter.UninitializedParameter) for m in modules for p in m.parameters()
        ):
            raise RuntimeError("lasy_stack=True is not compatible with lazy modules.")  # the reference's words
        if lazy_stack and as_module:
            raise RuntimeError("A lazy stack cannot be held within a TensorDictParams; pass as_module=False.")
        tds = [cls.from_module(m, use_state_dict=use_state_dict) for m in modules]
        if lazy_stack:
            kind = kind_for_tag(LAZY_STACK_TYPE)
            if kind is None:
                raise NotSupportedError("from_modules(lazy_stack=True): the lazy stack class is not loaded.")
            stacked = kind.cls(*tds, stack_dim=0)
        else:
            stacked = _stack_params(tds, expand_identical)
        if as_module:
            return _as_module(stacked, lock, "from_modules")
        return stacked.lock_() if lock else stacked

    def to_module(
        self,
        module: nn.Module,
        *,
        inplace: bool | None = None,
        return_swap: bool = True,
        swap_dest: Any = None,
        use_state_dict: bool = False,
        non_blocking: bool = False,
        preserve_module_state: bool = True,
        memo: Any = None,
    ) -> Any:
        """Put this tensordict's tensors into ``module`` as its parameters and buffers.

        Args:
            module: the module (nested entries go to its submodules).
            inplace: copy the values into the module's tensors instead of replacing them.
            return_swap: return the values that were replaced (else None).
            swap_dest: a tensordict to write the replaced values into.
            use_state_dict: go through ``module.load_state_dict``.
            non_blocking: accepted for compatibility.
            preserve_module_state: accepted for compatibility.
            memo: accepted for compatibility.

        Returns:
            A tensordict of the replaced values (a context manager that puts them back), or None.

        Raises:
            MissingKeyError: an entry with no submodule of that name.
            NotSupportedError: a lazy stack (put a member into the module).

        >>> from tdshare import TensorDict
        >>> lin = torch.nn.Linear(2, 2)
        >>> zeros = TensorDict.from_module(lin).detach().clone().zero_()
        >>> with zeros.to_module(lin):
        ...     inside = lin.weight.abs().sum().item()
        >>> inside, lin.weight.abs().sum().item() > 0
        (0.0, True)
        """
        td: Any = self
        if td._lazy_members() is not None:
            raise NotSupportedError("to_module of a lazy stack: put one member into the module (ls.tensordicts[i]).")
        if use_state_dict:
            old = type(self).from_module(module, use_state_dict=True) if return_swap else None
            module.load_state_dict(td.flatten_keys(".").to_dict(), strict=False)
            swap = old
        else:
            swap = _swap_into(td, module, bool(inplace))
        if swap_dest is not None and swap is not None:
            swap_dest.update(swap)
            swap = swap_dest
        if not return_swap or swap is None:
            return None
        swap._last_op[:] = [lambda: swap.to_module(module, inplace=inplace, return_swap=False)]
        return swap

    def state_dict(
        self, destination: Any = None, prefix: str = "", keep_vars: bool = False, flatten: bool = True
    ) -> OrderedDict[str, Any]:
        """The tensors as an ``OrderedDict`` (keys ``"a.b"`` when ``flatten``, else nested dicts).

        Args:
            destination: a mapping to fill (default: a new ``OrderedDict``).
            prefix: put before every key.
            keep_vars: keep the tensors themselves (default: detached).
            flatten: join nested keys with ``"."`` (else nested ``OrderedDict``\\ s).

        >>> from tdshare import TensorDict
        >>> TensorDict(a={"b": torch.zeros(2)}, batch_size=[2]).state_dict()["a.b"].tolist()
        [0.0, 0.0]
        """
        td: Any = self
        out: Any = OrderedDict() if destination is None else destination
        if not hasattr(out, "_metadata"):
            out._metadata = OrderedDict()  # as torch's state dicts: one entry per level, "" for the top
        out._metadata[prefix[:-1]] = {"batch_size": td.batch_size, "device": td.device}
        for key in td.keys():
            value = td._get_leaf((key,))
            inner = collection_of(value)  # a tensordict, a lazy stack, a tensorclass's tensordict
            if inner is not None:
                if flatten:
                    inner.state_dict(out, f"{prefix}{key}.", keep_vars, True)
                else:
                    out[prefix + key] = inner.state_dict(keep_vars=keep_vars, flatten=False)
            elif isinstance(value, torch.Tensor):
                out[prefix + key] = value if keep_vars else value.detach()
        return out

    def load_state_dict(
        self: T, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False, from_flatten: Any = None
    ) -> T:
        """Load a ``state_dict`` (flat ``"a.b"`` keys or nested dicts) into the existing entries.

        Args:
            state_dict: the mapping.
            strict: every tensor of this tensordict must be given, and nothing else.
            assign: replace the entries by the given tensors (default: copy into them).
            from_flatten: whether the keys are flat (None: flat when a value is not a mapping and
                a key holds a ``"."``).

        Raises:
            StateDictKeysError: with ``strict``, a missing or unexpected key (a ``KeyError`` and a ``RuntimeError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(a={"b": torch.zeros(2)}, batch_size=[2])
        >>> td.load_state_dict({"a.b": torch.ones(2)})["a", "b"].tolist()
        [1.0, 1.0]
        """
        td: Any = self
        state_dict = {k: v for k, v in state_dict.items() if k not in _LEGACY_KEYS}
        flat = from_flatten
        if flat is None:
            flat = not any(isinstance(v, Mapping) for v in state_dict.values())
        given = dict(_nested_items(state_dict, flat))
        mine = {unravel_key(k) for k, v in _tensor_items(td)}
        if strict and set(given) != mine:
            missing, extra = sorted(map(".".join, mine - set(given))), sorted(map(".".join, set(given) - mine))
            lead = f"Key '{extra[0]}' wasn't expected in the state-dict. " if extra else ""  # the reference's words
            raise StateDictKeysError(
                f"{lead}load_state_dict(strict=True): missing keys {missing}, unexpected keys {extra}; "
                "pass strict=False to load what matches."
            )
        for key, value in given.items():
            if assign or td._get_leaf(key, None) is None:
                td.set(key, value)
            else:
                td.set_(key, value)
        return self


def _module_td(level: Any, module: nn.Module, filter_empty: bool) -> Any:
    out = level()
    for name, param in module._parameters.items():
        if param is not None:
            out._tensordict[name] = param
    for name, buffer in module._buffers.items():
        if buffer is not None:
            out._tensordict[name] = buffer
    for name, child in module._modules.items():
        if child is None:
            continue
        sub = _module_td(level, child, filter_empty)
        if filter_empty and sub.is_empty():
            continue
        out._tensordict[name] = sub
    return out


def _stack_params(tds: list[Any], expand_identical: bool) -> Any:
    first = tds[0]
    out = first.empty()
    out._batch_size = torch.Size([len(tds)])
    for key in first.keys():
        values = [td._get_leaf((key,)) for td in tds]
        if is_node(values[0]):
            out._tensordict[key] = _stack_params(values, expand_identical)
            continue
        if expand_identical and all(v is values[0] for v in values):
            stacked: torch.Tensor = values[0].expand(len(values), *values[0].shape)  # grads reach the shared tensor
        else:
            stacked = torch.stack([v.data for v in values])
            if isinstance(values[0], nn.Parameter):
                stacked = nn.Parameter(stacked, requires_grad=values[0].requires_grad)
        out._tensordict[key] = stacked
    return out


def _swap_into(td: Any, module: nn.Module, inplace: bool) -> Any:
    swap = td.empty()
    for key in td.keys():
        value = td._get_leaf((key,))
        if is_node(value):
            child = module._modules.get(key)
            if child is None:
                raise MissingKeyError(f"to_module: the module has no submodule {key!r} for the nested entry {key!r}.")
            swap._tensordict[key] = _swap_into(value, child, inplace)
            continue
        if not isinstance(value, torch.Tensor):
            continue
        old = module._parameters.get(key, module._buffers.get(key, getattr(module, key, None)))
        if inplace and isinstance(old, torch.Tensor):
            swap._tensordict[key] = old.detach().clone()
            with torch.no_grad():
                old.copy_(value)
            continue
        if old is not None:
            swap._tensordict[key] = old
        _put_tensor(module, key, value)
    return swap


def _put_tensor(module: nn.Module, key: str, value: torch.Tensor) -> None:
    """Make ``value`` the module's tensor ``key``: a parameter when it is one, else a buffer or attribute."""
    if isinstance(value, nn.Parameter):
        module._buffers.pop(key, None)
        module.__dict__.pop(key, None)
        module._parameters[key] = value
    elif key in module._buffers:
        module._buffers[key] = value
    else:
        module._parameters.pop(key, None)
        module.__dict__[key] = value


def _nested_items(state: Mapping[str, Any], flat: bool, prefix: tuple[str, ...] = ()) -> Any:
    for key, value in state.items():
        parts = (*prefix, *(key.split(".") if flat else unravel_key(key)))
        if isinstance(value, Mapping):
            yield from _nested_items(value, flat, parts)
        else:
            yield parts, value


def _tensor_items(td: Any, prefix: tuple[str, ...] = ()) -> Any:
    for key in td.keys():
        value = td._get_leaf((key,))
        if (inner := collection_of(value)) is not None:
            yield from _tensor_items(inner, (*prefix, key))
        elif isinstance(value, torch.Tensor):
            yield (*prefix, key), value
