"""TensorDictFuture: the handle that ``memmap*(num_threads>1, return_early=True)`` returns."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Generic, TypeVar

__all__ = ["TensorDictFuture"]

T = TypeVar("T")


class TensorDictFuture(Generic[T]):
    """Futures of a write in progress and the tensordict they fill.

    ``result()`` waits for every future, re-raises the first error and returns the tensordict.

    Args:
        futures: the futures of the writes.
        resulting_td: the tensordict they fill.

    >>> import tempfile
    >>> from tdshare import TensorDict, TensorDictFuture
    >>> td = TensorDict(a=torch.zeros(3), b=torch.ones(3), batch_size=[3])
    >>> with tempfile.TemporaryDirectory() as path:
    ...     future = td.memmap_(path, num_threads=2, return_early=True)
    ...     print(isinstance(future, TensorDictFuture), future.result() is td, td.is_memmap())
    True True True
    """

    def __init__(self, futures: list[concurrent.futures.Future[Any]], resulting_td: T) -> None:
        self.futures = futures
        self.resulting_td = resulting_td

    def done(self) -> bool:
        """Whether every write has finished (successfully or not); never blocks.

        Returns:
            True once every future is done.

        >>> import tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     future = TensorDict(a=torch.zeros(3)).memmap(path, num_threads=2, return_early=True)
        ...     _ = future.result()
        ...     print(future.done(), repr(future))
        True TensorDictFuture(done, ...)
        """
        return all(f.done() for f in self.futures)

    def result(self, timeout: float | None = None) -> T:
        """Wait for every write (at most ``timeout`` seconds), re-raise the first error, and return
        the tensordict.

        Args:
            timeout: seconds to wait; None waits as long as it takes.

        Returns:
            The memory-mapped tensordict.

        Raises:
            TimeoutError: the writes did not finish within ``timeout``.
            Exception: the first error a write raised.

        >>> import tempfile
        >>> from tdshare import TensorDict
        >>> with tempfile.TemporaryDirectory() as path:
        ...     future = TensorDict(a=torch.arange(3)).memmap(path, num_threads=2, return_early=True)
        ...     print(future.result(timeout=60)["a"].tolist())
        [0, 1, 2]
        """
        concurrent.futures.wait(self.futures, timeout=timeout)
        for f in self.futures:
            f.result(timeout=0 if timeout is not None else None)
        return self.resulting_td

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"TensorDictFuture({state}, {len(self.futures)} future(s))"
