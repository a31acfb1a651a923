"""``TensorDictParams``: an ``nn.Module`` whose parameters are the leaves of a tensordict.

The tensordict's floating-point tensors become ``nn.Parameter`` objects (``no_convert=True``
keeps them as they are) and are registered with the module, so ``parameters()``,
``named_parameters()``, optimisers and ``module.to(...)`` see them; every other attribute
(``td_params["a"]``, ``batch_size``, ``keys()``, ``lock_()``, ``memmap_()``...) is the wrapped
tensordict's, and a tensordict result of the same batch comes back wrapped.  ``map`` is refused,
as in the reference: its workers would write into copies of the parameters.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ._errors import ArgumentTypeError, NotSupportedError
from ._nn import set_params_wrapper
from ._tensordict_base import TensorDictBase

__all__ = ["TensorDictParams"]

_OWN = frozenset({"_param_td", "_no_convert"})


def _as_parameter(value: torch.Tensor) -> torch.Tensor:
    if isinstance(value, nn.Parameter) or not (value.is_floating_point() or value.is_complex()):
        return value
    return nn.Parameter(value)


class TensorDictParams(nn.Module):
    """A module holding a tensordict whose tensors are its parameters.

    Args:
        parameters: the tensordict (a ``TensorDict``, lazy stack...) or a dict of tensors.
        no_convert: keep the tensors as they are instead of making ``nn.Parameter`` objects of the
            floating-point ones.
        lock: lock the tensordict.

    Raises:
        ArgumentTypeError: ``parameters`` is neither a tensordict nor a mapping.

    >>> import torch
    >>> from tdshare import TensorDict, TensorDictParams
    >>> params = TensorDictParams(TensorDict(w=torch.zeros(3), b=torch.ones(()), batch_size=[]))
    >>> sorted(name for name, _ in params.named_parameters()), type(params["w"]).__name__
    (['b', 'w'], 'Parameter')
    """

    def __init__(self, parameters: Any = None, *, no_convert: bool = False, lock: bool = False) -> None:
        super().__init__()
        if parameters is None:
            parameters = {}
        if isinstance(parameters, dict):
            from ._tensordict import TensorDict

            parameters = TensorDict(parameters, batch_size=[])
        if not isinstance(parameters, TensorDictBase):
            raise ArgumentTypeError(
                f"TensorDictParams takes a tensordict or a dict of tensors, got {type(parameters).__name__}."
            )
        if not no_convert:
            parameters = parameters.apply(_as_parameter)
        object.__setattr__(self, "_no_convert", no_convert)
        object.__setattr__(self, "_param_td", parameters)
        self._register()
        if lock:
            parameters.lock_()

    def _register(self) -> None:
        """Register the tensordict's tensors with the module (names joined by dots)."""
        self._parameters.clear()
        self._buffers.clear()
        for key, value in self._param_td.items(include_nested=True, leaves_only=True):
            if not isinstance(value, torch.Tensor):
                continue
            name = key if isinstance(key, str) else ".".join(key)
            if isinstance(value, nn.Parameter):
                self._parameters[name] = value
            else:
                self._buffers[name] = value

    def map(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: workers would write into copies of the parameters.

        Raises:
            NotSupportedError: always (a ``NotImplementedError``, so a ``RuntimeError`` as in the reference).

        >>> import torch
        >>> from tdshare import TensorDict, TensorDictParams, NotSupportedError
        >>> try:
        ...     TensorDictParams(TensorDict(w=torch.zeros(2))).map(lambda t: t)
        ... except NotSupportedError as e:
        ...     print(str(e)[:38])
        Cannot call map on a TensorDictParams
        """
        raise NotSupportedError(
            "Cannot call map on a TensorDictParams object: its workers would write into copies of the "
            "parameters. Call map on params.data (a plain tensordict) instead."
        )

    map_iter = map

    @property
    def data(self) -> TensorDictBase:
        """The tensordict of the parameters' data (plain tensors, no gradient history).

        The tensors share the parameters' memory: writing into them changes the parameters.

        >>> from tdshare import TensorDict, TensorDictParams
        >>> params = TensorDictParams(TensorDict(w=torch.zeros(3)))
        >>> data = params.data
        >>> data["w"] += 1
        >>> type(data["w"]).__name__, data["w"].requires_grad, params["w"].tolist()
        ('Tensor', False, [1.0, 1.0, 1.0])
        """
        return self._param_td.apply(lambda t: t.data)

    def to_tensordict(self, *args: Any, **kwargs: Any) -> TensorDictBase:
        """A plain tensordict copy of the parameters' data (see ``TensorDict.to_tensordict``).

        Args:
            *args, **kwargs: as for ``TensorDict.to_tensordict``.

        Returns:
            A new ``TensorDict`` whose tensors are copies (writing into them leaves the parameters).

        >>> from tdshare import TensorDict, TensorDictParams
        >>> params = TensorDictParams(TensorDict(w=torch.zeros(3)))
        >>> copy = params.to_tensordict()
        >>> copy["w"] += 1
        >>> type(copy).__name__, copy["w"].tolist(), params["w"].tolist()
        ('TensorDict', [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
        """
        return self.data.to_tensordict(*args, **kwargs)

    def __getitem__(self, idx: Any) -> Any:
        return self._wrap(self._param_td[idx])

    def __setitem__(self, idx: Any, value: Any) -> None:
        self._param_td[idx] = value if self._no_convert or not isinstance(value, torch.Tensor) else _as_parameter(value)
        self._register()

    def __iter__(self) -> Any:
        return iter(self._param_td)

    def __len__(self) -> int:
        return len(self._param_td)

    def __contains__(self, key: object) -> bool:
        return key in self._param_td

    def __eq__(self, other: object) -> Any:
        return self._param_td == (other._param_td if isinstance(other, TensorDictParams) else other)

    __hash__ = nn.Module.__hash__

    def _wrap(self, value: Any) -> Any:
        return value

    def __getattr__(self, name: str) -> Any:
        if name in _OWN or name.startswith("__"):
            raise AttributeError(name)
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules
        except AttributeError:
            pass
        td = self.__dict__.get("_param_td")
        if td is None:
            raise AttributeError(f"'TensorDictParams' object has no attribute {name!r}")
        attr = getattr(td, name)
        if callable(attr) and not isinstance(attr, (TensorDictBase, torch.Tensor)):
            return functools.partial(_forward, self, attr)
        return attr

    def __repr__(self) -> str:
        return f"TensorDictParams(params={self._param_td!r})"


def _forward(module: TensorDictParams, method: Any, *args: Any, **kwargs: Any) -> Any:
    result = method(*args, **kwargs)
    if result is module._param_td:
        return module  # in-place methods (lock_, memmap_, update_...) return the module
    return result


set_params_wrapper(TensorDictParams)  # from_module(s)(as_module=True) wraps its result in this class
