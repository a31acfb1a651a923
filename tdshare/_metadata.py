"""``MetaData``: a non-tensor entry that holds one Python object for the whole batch.

It is a :class:`tdshare.NonTensorData` (saved, loaded, shared and compared as one), whose value
is kept as the same object by indexing and copies of the tensordict.  ``MetaData[cls]`` is a
subclass (one per ``cls``, cached) whose constructor refuses a value that is not a ``cls``, as in
tensordict 0.15.3; instances of it pickle by value, so they cross processes like any entry.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ._errors import ArgumentTypeError
from ._nontensor import NonTensorData, NonTensorStack

__all__ = ["MetaData"]

_TYPED: dict[Any, type[MetaData]] = {}


class MetaData(NonTensorData):
    """One Python object for the whole batch (a ``NonTensorData`` of the batch's size).

    Args:
        data: the value (a ``NonTensorData`` is unwrapped).
        batch_size: the batch it stands for (default: ``[]``).
        device: kept for the reference's signature.
        names: kept for the reference's signature.

    Raises:
        ArgumentTypeError: for ``MetaData[cls]``, a value that is not a ``cls`` (a ``TypeError``).

    >>> import torch
    >>> from tdshare import MetaData, TensorDict
    >>> config = {"lr": 0.1}
    >>> td = TensorDict(a=torch.zeros(3), batch_size=[3])
    >>> td["config"] = MetaData(config, batch_size=[3])
    >>> td["config"] is config, td[1]["config"] is config
    (True, True)
    >>> MetaData[str]("dataset-a").data
    'dataset-a'
    """

    __slots__ = ()
    _expected_type: ClassVar[Any] = None
    _keeps_whole = True  # the batch operations keep the one value (its batch size is the tensordict's)

    def __init__(self, data: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(data, *args, **kwargs)
        expected = type(self)._expected_type
        if expected is not None and not isinstance(self.data, expected):
            raise ArgumentTypeError(
                f"Expected data of type {getattr(expected, '__name__', expected)}, got {type(self.data).__name__}: "
                f"a {type(self).__name__} holds {getattr(expected, '__name__', expected)} values only."
            )

    def __class_getitem__(cls, item: Any) -> type[MetaData]:
        """The subclass of ``MetaData`` that holds values of type ``item`` only (cached)."""
        if cls is not MetaData:
            raise ArgumentTypeError(f"Cannot specify a type for {cls.__name__}: use MetaData[{item!r}].")
        typed = _TYPED.get(item)
        if typed is None:
            name = f"MetaData[{getattr(item, '__name__', str(item))}]"
            typed = type(name, (MetaData,), {"__slots__": (), "_expected_type": item, "__qualname__": name})
            _TYPED[item] = typed
        return typed

    def clone(self) -> MetaData:
        """A new entry of the same class over the same value (not copied) and batch size.

        Returns:
            The new ``MetaData`` (a ``MetaData[cls]`` stays one).

        >>> from tdshare import MetaData
        >>> meta = MetaData[list]([1, 2], batch_size=[3])
        >>> copy = meta.clone()
        >>> copy is meta, copy.data is meta.data, type(copy).__name__, copy.batch_size
        (False, True, 'MetaData[list]', torch.Size([3]))
        """
        return type(self)(self.data, batch_size=self.batch_size, device=self.device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(data={self.data!r}, batch_size={self.batch_size})"

    @classmethod
    def _stack_values(cls, values: Any, batches: Any, dim: int, new_dim: bool) -> NonTensorData:
        """Stacking tensordicts keeps one ``MetaData`` when every member holds the same value;
        values that differ give a ``NonTensorStack`` (one value per element)."""
        first = values[0]
        if all(isinstance(v, MetaData) and (v is first or first == v) for v in values[1:]):
            return first
        return NonTensorStack._combine(list(values), list(batches), dim, new_dim)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_metadata, (type(self)._expected_type, self.data, tuple(self.batch_size), self.device))


def _rebuild_metadata(expected: Any, data: Any, batch: tuple[int, ...], device: torch.device | None) -> MetaData:
    cls = MetaData if expected is None else MetaData.__class_getitem__(expected)
    return cls(data, batch_size=batch, device=device)
