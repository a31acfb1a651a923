"""Process-wide behaviour switches under the reference's names.

- :func:`list_to_stack` / :class:`set_list_to_stack`: whether a list set into a tensordict becomes
  a tensor (numbers) or a ``NonTensorStack`` (one value per element), as in tensordict 0.15.3's
  default, or is kept as one non-tensor value;
- :func:`capture_non_tensor_stack` / :class:`set_capture_non_tensor_stack`: whether stacking equal
  non-tensor values gives one ``NonTensorData`` (tdshare's default) or a ``NonTensorStack``;
- :func:`lazy_legacy` / :class:`set_lazy_legacy`: whether ``torch.stack`` of tensordicts gives a
  lazy stack (the reference's legacy behaviour) or a dense one (the default).

Each ``set_*`` works as a context manager, as a decorator, or (``.set()``) for the rest of the
process; the state is one value per process, as in the reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from ._errors import ArgumentTypeError

__all__ = [
    "capture_non_tensor_stack",
    "lazy_legacy",
    "list_to_stack",
    "set_capture_non_tensor_stack",
    "set_lazy_legacy",
    "set_list_to_stack",
]

F = TypeVar("F", bound=Callable[..., Any])
_STATE = {"list_to_stack": True, "capture_non_tensor_stack": True, "lazy_legacy": False}


class _Switch:
    """A boolean setting: a context manager, a decorator, or ``.set()`` for good."""

    _name: ClassVar[str]

    def __init__(self, mode: bool) -> None:
        if not isinstance(mode, bool):
            raise ArgumentTypeError(f"{type(self).__name__} takes True or False, got {mode!r}.")
        self.mode = mode
        self._saved: list[bool] = []

    def set(self) -> None:
        """Use the mode from now on in this process (until another ``set()``; a ``with`` block
        restores the mode that was current when it began).

        >>> import tdshare
        >>> tdshare.set_list_to_stack(False).set()
        >>> tdshare.list_to_stack()
        False
        >>> tdshare.set_list_to_stack(True).set()  # back to the default
        """
        _STATE[self._name] = self.mode

    def __enter__(self) -> None:
        self._saved.append(_STATE[self._name])
        _STATE[self._name] = self.mode

    def __exit__(self, *exc: object) -> None:
        _STATE[self._name] = self._saved.pop()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with type(self)(self.mode):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class set_list_to_stack(_Switch):  # noqa: N801 -- the reference's name
    """Whether lists set into a tensordict are converted (True, the default) or kept as one value.

    Args:
        mode: True: a list of numbers becomes a tensor, any other list a ``NonTensorStack``;
            False: the list is one non-tensor value.

    Raises:
        ArgumentTypeError: ``mode`` is not a bool.

    >>> import tdshare
    >>> with tdshare.set_list_to_stack(False):
    ...     td = tdshare.TensorDict(a=[1, 2])
    >>> td["a"]
    [1, 2]
    """

    _name = "list_to_stack"


class set_capture_non_tensor_stack(_Switch):  # noqa: N801 -- the reference's name
    """Whether stacking equal non-tensor values gives one value (True, the default) or a ``NonTensorStack``.

    Args:
        mode: True: equal values stay one ``NonTensorData``; False: every stack of non-tensor
            values is a ``NonTensorStack``, as the reference does by default.

    Raises:
        ArgumentTypeError: ``mode`` is not a bool.

    >>> import torch, tdshare
    >>> td = tdshare.TensorDict(s="a")
    >>> with tdshare.set_capture_non_tensor_stack(False):
    ...     type(torch.stack([td, td])._tensordict["s"]).__name__
    'NonTensorStack'
    """

    _name = "capture_non_tensor_stack"


class set_lazy_legacy(_Switch):  # noqa: N801 -- the reference's name
    """Whether ``torch.stack`` of tensordicts gives a lazy stack (True) or a dense one (False, the default).

    Under the legacy mode ``torch.stack([td0, td1])`` (and ``tdshare.stack``) returns a
    :class:`tdshare.LazyStackedTensorDict` holding the tensordicts themselves, as tensordict did
    before 0.5. Shape operations (``permute``, ``unsqueeze``, ``squeeze``...) give views of the
    leaves in either mode: writes through them land in the original tensordict's memory.

    Args:
        mode: True: stacking is lazy; False: stacking copies into a dense tensordict.

    Raises:
        ArgumentTypeError: ``mode`` is not a bool.

    >>> import torch, tdshare
    >>> td = tdshare.TensorDict(a=torch.zeros(3), batch_size=[3])
    >>> with tdshare.set_lazy_legacy(True):
    ...     type(torch.stack([td, td])).__name__
    'LazyStackedTensorDict'
    """

    _name = "lazy_legacy"


def lazy_legacy(allow_none: bool = False) -> bool:
    """The current :class:`set_lazy_legacy` mode.

    Args:
        allow_none: accepted for the reference's signature; the mode is always a bool here.

    >>> import tdshare
    >>> tdshare.lazy_legacy()
    False
    """
    return _STATE["lazy_legacy"]


def list_to_stack() -> bool:
    """The current :class:`set_list_to_stack` mode.

    >>> import tdshare
    >>> tdshare.list_to_stack()
    True
    """
    return _STATE["list_to_stack"]


def capture_non_tensor_stack() -> bool:
    """The current :class:`set_capture_non_tensor_stack` mode.

    >>> import tdshare
    >>> tdshare.capture_non_tensor_stack()
    True
    """
    return _STATE["capture_non_tensor_stack"]
