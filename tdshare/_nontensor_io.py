"""A non-tensor value memory-mapped on its own: ``NonTensorData(...).memmap_(path)`` and back.

A ``NonTensorData`` saved alone is the folder its tensordict would give it: ``meta.json`` with
the value inline (or ``other.pickle`` beside it when JSON cannot hold it); a ``NonTensorStack``
is one ``meta.json`` holding the nested list (or naming ``pickle.pkl``).  That is the reference's
layout, so a folder saved by either library loads in the other.  After ``memmap_`` the value is
memory-mapped (``is_memmap()``) and locked: ``update_`` / ``update(..., inplace=True)`` rewrite
its folder, replacing a pickle that a JSON value no longer needs.
"""

from __future__ import annotations

import os
from typing import Any

from ._errors import ArgumentTypeError, InvalidArgumentError
from ._format import PICKLE_FILE, STACK_PICKLE_FILE
from ._nontensor_files import encode_nontensor, encode_nontensor_stack, write_nontensor

__all__ = ["NonTensorFiles"]

PathLike = str | os.PathLike


class NonTensorFiles:
    """The memory-mapping methods of a non-tensor value saved on its own (a mixin of ``NonTensorData``)."""

    __slots__ = ()

    # provided by NonTensorData
    __dict__: dict[str, Any]

    @classmethod
    def _tensordict_host(cls) -> Any:
        raise NotImplementedError

    def _is_stack(self) -> bool:
        raise NotImplementedError

    def _write_folder(self, prefix: str) -> None:
        """Write this value's folder at ``prefix`` (its meta.json, and a pickle if needed)."""
        value: Any = self
        where = repr(prefix)
        if self._is_stack():
            meta, pickled = encode_nontensor_stack(value.tolist(), where)
            write_nontensor(prefix, meta, pickled, STACK_PICKLE_FILE)
        else:
            meta, pickled = encode_nontensor(value.data, where)
            write_nontensor(prefix, meta, pickled, PICKLE_FILE)

    def _persist(self) -> None:
        """Rewrite the folder of a value memory-mapped on its own (nothing for any other value)."""
        prefix = self.__dict__.get("_memmap_prefix")
        if prefix is not None:
            self._write_folder(prefix)

    def memmap_(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = None,
    ) -> Any:
        """Write the value to the folder ``prefix`` (the reference's layout) and mark it memory-mapped.

        Args:
            prefix: the folder (created if missing; its old value files are replaced). None marks
                the value memory-mapped without writing anything (there is nothing to map).
            copy_existing, num_threads, return_early, share_non_tensor, existsok, robust_key:
                accepted for the tensordict signature (one small file needs none of them).

        Returns:
            ``self``, now locked: replace its value with ``update_``.

        Raises:
            InvalidArgumentError: the value is neither JSON nor picklable (nothing is written).

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> NonTensorData("cat").memmap_(tempfile.mkdtemp()).is_memmap()
        True
        """
        if prefix is not None:
            folder = os.path.abspath(os.fspath(prefix))
            self._write_folder(folder)
            self.__dict__["_memmap_prefix"] = folder
        self.__dict__.update(_is_memmap=True, _is_locked=True)
        return self

    def memmap(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = None,
    ) -> Any:
        """A memory-mapped copy of the value, written to ``prefix`` (see :meth:`memmap_`); ``self`` is unchanged.

        >>> import tempfile
        >>> from tdshare import NonTensorStack
        >>> NonTensorStack("a", "b").memmap(tempfile.mkdtemp()).tolist()
        ['a', 'b']
        """
        value: Any = self
        return value.clone().memmap_(prefix)

    def memmap_like(
        self,
        prefix: PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = None,
    ) -> Any:
        """As :meth:`memmap`: a non-tensor value has no empty form, so its value is written too.

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> NonTensorData(3).memmap_like(tempfile.mkdtemp()).data
        3
        """
        return self.memmap(prefix)

    def save(self, prefix: PathLike, copy_existing: bool = False, *, num_threads: int = 0, **kwargs: Any) -> Any:
        """Write the value to the folder ``prefix`` and return the memory-mapped copy (as :meth:`memmap`).

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> NonTensorData("x").save(tempfile.mkdtemp()).data
        'x'
        """
        return self.memmap(prefix)

    dumps = save

    @classmethod
    def load_memmap(
        cls,
        prefix: PathLike,
        device: Any = None,
        non_blocking: bool = False,
        *,
        out: Any = None,
        allow_pickle: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Load a non-tensor value saved on its own (by tdshare or the reference).

        Args:
            prefix: the value's folder.
            device, non_blocking, out: accepted for the tensordict signature.
            allow_pickle: None loads a pickled value with a ``FutureWarning``, False refuses it,
                True loads it.

        Returns:
            The value, memory-mapped: a ``NonTensorData`` or a ``NonTensorStack``.

        Raises:
            ArgumentTypeError: the folder holds something else (a tensordict: use
                ``TensorDict.load_memmap``), or a stack where ``cls`` is not a stack class.
            PickleRefusedError: a pickled value and ``allow_pickle=False``.

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> path = tempfile.mkdtemp()
        >>> _ = NonTensorData("dog").memmap(path)
        >>> NonTensorData.load_memmap(path).data
        'dog'
        """
        folder = os.path.abspath(os.fspath(prefix))
        loaded = cls._tensordict_host().load_memmap(folder, allow_pickle=allow_pickle)
        if not isinstance(loaded, cls):
            raise ArgumentTypeError(
                f"{cls.__name__}.load_memmap({folder!r}): the folder holds a {type(loaded).__name__}, not a "
                f"{cls.__name__}; load it with TensorDict.load_memmap()."
            )
        loaded.__dict__.update(_memmap_prefix=folder, _is_memmap=True, _is_locked=True)
        return loaded

    def load_memmap_(self, prefix: PathLike | None = None, *, allow_pickle: bool | None = None) -> Any:
        """Replace this value by the one saved in ``prefix`` (default: the folder it was mapped to).

        Returns:
            ``self``, memory-mapped from that folder.

        Raises:
            InvalidArgumentError: no ``prefix`` and the value was never memory-mapped to a folder.

        >>> import tempfile
        >>> from tdshare import NonTensorData
        >>> path = tempfile.mkdtemp()
        >>> _ = NonTensorData(1).memmap(path)
        >>> NonTensorData(0).load_memmap_(path).data
        1
        """
        if prefix is None:
            prefix = self.__dict__.get("_memmap_prefix")
            if prefix is None:
                raise InvalidArgumentError(
                    "load_memmap_() needs a prefix: this value was never memory-mapped to a folder."
                )
        folder = os.path.abspath(os.fspath(prefix))
        loaded = type(self).load_memmap(folder, allow_pickle=allow_pickle)
        value: Any = self
        value._take(loaded)
        self.__dict__.update(_memmap_prefix=folder, _is_memmap=True, _is_locked=True)
        return self
