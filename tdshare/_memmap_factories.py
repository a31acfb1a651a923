"""The public factories of :class:`tdshare.MemoryMappedTensor`: ``empty``, ``zeros``, ``ones``,
``full`` and their ``*_like`` forms.

Each is a thin classmethod over the class's ``_factory`` (in :mod:`tdshare._memmap`), which
checks the arguments, creates the file or segment and maps it; they live here so that the class's
module holds what a mapped tensor *is*, and this one the ways to make a new one.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import torch

__all__ = ["MemmapFactories"]

M = TypeVar("M", bound="MemmapFactories")


class MemmapFactories:
    """The factory classmethods of :class:`tdshare.MemoryMappedTensor` (see each)."""

    @classmethod
    def _factory(
        cls: type[M], size: tuple, shape: Any, dtype: Any, device: Any, filename: Any, existsok: bool, fill: Any
    ) -> M:
        raise NotImplementedError  # MemoryMappedTensor's

    @classmethod
    def empty(
        cls: type[M],
        *size: Any,
        shape: Any = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: str | os.PathLike | None = None,
        existsok: bool = False,
    ) -> M:
        """A new mapped tensor; fresh files and segments are zero-filled, never holding stale bytes.

        Args:
            *size: the shape, as ints (``2, 3``) or as one sequence, ``torch.Size`` or 1-D tensor
                (``(2, 3)``); or pass ``shape=`` instead.  A 0-dimensional tensor needs an empty
                shape, ``()``: a call with no shape at all raises.
            shape: the shape, when not given positionally.
            dtype: the element type (default: ``torch.get_default_dtype()``).
            device: None or ``"cpu"``.
            filename: the file to create (None: anonymous shared memory).
            existsok: replace an existing ``filename`` instead of raising.

        Returns:
            A new MemoryMappedTensor.

        Raises:
            ArgumentTypeError: no shape was given.
            InvalidArgumentError: a negative, non-integer or doubly given size.
            FileExistsRuntimeError: ``filename`` exists and ``existsok`` is False.
            MemmapError: ``filename`` is a symbolic link, or ``device`` is not the CPU.

        Example:
            >>> from tdshare import MemoryMappedTensor
            >>> MemoryMappedTensor.empty(2, 3).shape
            torch.Size([2, 3])
        """
        return cls._factory(size, shape, dtype, device, filename, existsok, None)

    @classmethod
    def zeros(
        cls: type[M],
        *size: Any,
        shape: Any = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: str | os.PathLike | None = None,
        existsok: bool = False,
    ) -> M:
        """A new mapped tensor filled with zeros.

        Args:
            *size: the shape, as ints (``2, 3``) or as one sequence, ``torch.Size`` or 1-D tensor
                (``(2, 3)``); or pass ``shape=`` instead.  A 0-dimensional tensor needs an empty
                shape, ``()``: a call with no shape at all raises.
            shape: the shape, when not given positionally.
            dtype: the element type (default: ``torch.get_default_dtype()``).
            device: None or ``"cpu"``.
            filename: the file to create (None: anonymous shared memory).
            existsok: replace an existing ``filename`` instead of raising.

        Returns:
            A new MemoryMappedTensor.

        Raises:
            ArgumentTypeError: no shape was given.
            InvalidArgumentError: a negative, non-integer or doubly given size.
            FileExistsRuntimeError: ``filename`` exists and ``existsok`` is False.
            MemmapError: ``filename`` is a symbolic link, or ``device`` is not the CPU.

        Example:
            >>> from tdshare import MemoryMappedTensor
            >>> MemoryMappedTensor.zeros((2,)).tolist()
            [0.0, 0.0]
        """
        return cls._factory(size, shape, dtype, device, filename, existsok, None)

    @classmethod
    def ones(
        cls: type[M],
        *size: Any,
        shape: Any = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: str | os.PathLike | None = None,
        existsok: bool = False,
    ) -> M:
        """A new mapped tensor filled with ones.

        Args:
            *size: the shape, as ints (``2, 3``) or as one sequence, ``torch.Size`` or 1-D tensor
                (``(2, 3)``); or pass ``shape=`` instead.  A 0-dimensional tensor needs an empty
                shape, ``()``: a call with no shape at all raises.
            shape: the shape, when not given positionally.
            dtype: the element type (default: ``torch.get_default_dtype()``).
            device: None or ``"cpu"``.
            filename: the file to create (None: anonymous shared memory).
            existsok: replace an existing ``filename`` instead of raising.

        Returns:
            A new MemoryMappedTensor.

        Raises:
            ArgumentTypeError: no shape was given.
            InvalidArgumentError: a negative, non-integer or doubly given size.
            FileExistsRuntimeError: ``filename`` exists and ``existsok`` is False.
            MemmapError: ``filename`` is a symbolic link, or ``device`` is not the CPU.

        Example:
            >>> from tdshare import MemoryMappedTensor
            >>> MemoryMappedTensor.ones(2, dtype=torch.int64).tolist()
            [1, 1]
        """
        return cls._factory(size, shape, dtype, device, filename, existsok, 1)

    @classmethod
    def full(
        cls: type[M],
        *size: Any,
        fill_value: Any,
        shape: Any = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
        filename: str | os.PathLike | None = None,
        existsok: bool = False,
    ) -> M:
        """A new mapped tensor with every element ``fill_value``.

        Args:
            *size: the shape, as ints (``2, 3``) or as one sequence, ``torch.Size`` or 1-D tensor
                (``(2, 3)``); or pass ``shape=`` instead.  A 0-dimensional tensor needs an empty
                shape, ``()``: a call with no shape at all raises.
            fill_value: the value of every element.
            shape: the shape, when not given positionally.
            dtype: the element type (default: ``torch.get_default_dtype()``).
            device: None or ``"cpu"``.
            filename: the file to create (None: anonymous shared memory).
            existsok: replace an existing ``filename`` instead of raising.

        Returns:
            A new MemoryMappedTensor.

        Raises:
            ArgumentTypeError: no shape was given.
            InvalidArgumentError: a negative, non-integer or doubly given size.
            FileExistsRuntimeError: ``filename`` exists and ``existsok`` is False.
            MemmapError: ``filename`` is a symbolic link, or ``device`` is not the CPU.

        Example:
            >>> from tdshare import MemoryMappedTensor
            >>> MemoryMappedTensor.full(2, fill_value=7.0).tolist()
            [7.0, 7.0]
        """
        return cls._factory(size, shape, dtype, device, filename, existsok, fill_value)

    @classmethod
    def empty_like(cls: type[M], input: torch.Tensor, *, filename: str | os.PathLike | None = None) -> M:
        """A new memory-mapped tensor of ``input``'s shape and dtype (zero-filled: a fresh file or
        segment never holds stale bytes).

        Args:
            input: the tensor whose shape and dtype are copied (its data is not).
            filename: the file to create; None maps anonymous shared memory.

        Returns:
            The new :class:`MemoryMappedTensor`.

        Raises:
            MemmapError: ``filename`` is a symbolic link.

        >>> from tdshare import MemoryMappedTensor
        >>> MemoryMappedTensor.empty_like(torch.ones(2, 3)).shape
        torch.Size([2, 3])
        """
        return cls._factory((), input.shape, input.dtype, None, filename, False, None)

    @classmethod
    def zeros_like(cls: type[M], input: torch.Tensor, *, filename: str | os.PathLike | None = None) -> M:
        """A new memory-mapped tensor of ``input``'s shape and dtype, filled with zeros.

        Args:
            input: the tensor whose shape and dtype are copied (its data is not).
            filename: the file to create; None maps anonymous shared memory.

        Returns:
            The new :class:`MemoryMappedTensor`.

        >>> from tdshare import MemoryMappedTensor
        >>> MemoryMappedTensor.zeros_like(torch.ones(2)).tolist()
        [0.0, 0.0]
        """
        return cls._factory((), input.shape, input.dtype, None, filename, False, None)

    @classmethod
    def ones_like(cls: type[M], input: torch.Tensor, *, filename: str | os.PathLike | None = None) -> M:
        """A new memory-mapped tensor of ``input``'s shape and dtype, filled with ones.

        Args:
            input: the tensor whose shape and dtype are copied (its data is not).
            filename: the file to create; None maps anonymous shared memory.

        Returns:
            The new :class:`MemoryMappedTensor`.

        >>> from tdshare import MemoryMappedTensor
        >>> MemoryMappedTensor.ones_like(torch.zeros(2, dtype=torch.int64)).tolist()
        [1, 1]
        """
        return cls._factory((), input.shape, input.dtype, None, filename, False, 1)

    @classmethod
    def full_like(
        cls: type[M], input: torch.Tensor, fill_value: Any, *, filename: str | os.PathLike | None = None
    ) -> M:
        """A new memory-mapped tensor of ``input``'s shape and dtype, filled with ``fill_value``.

        Args:
            input: the tensor whose shape and dtype are copied (its data is not).
            fill_value: the value of every element.
            filename: the file to create; None maps anonymous shared memory.

        Returns:
            The new :class:`MemoryMappedTensor`.

        >>> from tdshare import MemoryMappedTensor
        >>> MemoryMappedTensor.full_like(torch.zeros(2), 7.0).tolist()
        [7.0, 7.0]
        """
        return cls._factory((), input.shape, input.dtype, None, filename, False, fill_value)
