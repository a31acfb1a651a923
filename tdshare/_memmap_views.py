"""The splitting methods of :class:`tdshare.MemoryMappedTensor` that return views of the same
memory (``unbind``, ``chunk``, ``split``), as a mixin; the host class turns each piece into a
MemoryMappedTensor view (``_same_memory``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

__all__ = ["MemmapViews"]


class MemmapViews:
    """``unbind``, ``chunk`` and ``split`` as views of the mapped memory."""

    if TYPE_CHECKING:  # provided by the host class

        def _same_memory(self, out: Any) -> Any: ...

    def unbind(self, dim: int = 0) -> tuple[Any, ...]:
        """Split along ``dim`` into its slices, each a MemoryMappedTensor view of the same memory.

        Args:
            dim: the dimension to remove.

        Returns:
            A tuple of ``self.shape[dim]`` views (writes to them reach the file).

        Raises:
            IndexError: ``dim`` is out of range (torch's error).

        >>> from tdshare import MemoryMappedTensor
        >>> rows = MemoryMappedTensor.from_tensor(torch.arange(6).reshape(2, 3)).unbind(0)
        >>> [type(r).__name__ for r in rows], rows[1].tolist()
        (['MemoryMappedTensor', 'MemoryMappedTensor'], [3, 4, 5])
        """
        return tuple(self._same_memory(t) for t in torch.Tensor.unbind(self, dim))  # type: ignore[arg-type]

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Any, ...]:
        """Split into ``chunks`` pieces along ``dim`` (as ``torch.chunk``), views of the same memory.

        Args:
            chunks: the number of pieces (the last may be smaller, and there may be fewer).
            dim: the dimension to split.

        Returns:
            A tuple of MemoryMappedTensor views.

        Raises:
            RuntimeError, IndexError: torch's errors for a bad ``chunks`` or ``dim``.

        >>> from tdshare import MemoryMappedTensor
        >>> t = MemoryMappedTensor.from_tensor(torch.arange(5))
        >>> first, second = t.chunk(2)
        >>> first[0] = 9
        >>> first.tolist(), second.tolist(), t[0].item()
        ([9, 1, 2], [3, 4], 9)
        """
        return tuple(self._same_memory(t) for t in torch.Tensor.chunk(self, chunks, dim))  # type: ignore[arg-type]

    def split(self, split_size: Any, dim: int = 0) -> tuple[Any, ...]:
        """Split along ``dim`` into pieces of ``split_size`` (as ``torch.split``), views of the same memory.

        Args:
            split_size: the size of each piece (the last may be smaller), or a list of sizes.
            dim: the dimension to split.

        Returns:
            A tuple of MemoryMappedTensor views.

        Raises:
            RuntimeError, IndexError: torch's errors for sizes that do not add up or a bad ``dim``.

        >>> from tdshare import MemoryMappedTensor
        >>> pieces = MemoryMappedTensor.from_tensor(torch.arange(5)).split([2, 3])
        >>> [type(p).__name__ for p in pieces], [p.tolist() for p in pieces]
        (['MemoryMappedTensor', 'MemoryMappedTensor'], [[0, 1], [2, 3, 4]])
        """
        return tuple(self._same_memory(t) for t in torch.Tensor.split(self, split_size, dim))  # type: ignore[arg-type]
