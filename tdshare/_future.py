"""TensorDictFuture: the handle that ``memmap*(num_threads>1, return_early=True)`` returns."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Generic, TypeVar

__all__ = ["TensorDictFuture"]

T = TypeVar("T")


class TensorDictFuture(Generic[T]):
    """Futures of a write in progress and the tensordict they fill.

    ``result()`` waits for every future, re-raises the first error and returns the tensordict.
    """

    def __init__(self, futures: list[concurrent.futures.Future[Any]], resulting_td: T) -> None:
        self.futures = futures
        self.resulting_td = resulting_td

    def done(self) -> bool:
        """Whether every write has finished (successfully or not); never blocks."""
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
        """
        concurrent.futures.wait(self.futures, timeout=timeout)
        for f in self.futures:
            f.result(timeout=0 if timeout is not None else None)
        return self.resulting_td

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"TensorDictFuture({state}, {len(self.futures)} future(s))"
