"""``map`` and ``map_iter``: a function run over chunks of a tensor collection in worker processes.

:class:`MapOps` is a mixin of :class:`tdshare._memmap_family.MemmapFamily`, so ``TensorDict`` and
``LazyStackedTensorDict`` get the methods from here, and a tensorclass through its forwarding to
its tensordict (``fn`` then receives tensordict chunks, and a tensordict result becomes an
instance again, as in the reference).

How a call runs:

- The collection is split along ``dim`` as tensordict 0.15.3 splits it: ``num_chunks`` pieces of
  ``ceil(n / num_chunks)`` rows (fewer when that covers ``n`` sooner), pieces of ``chunksize``
  rows, or single rows unbound along ``dim`` for ``chunksize=0``.  :func:`chunk_bounds` gives the
  boundaries; a chunk is an index of the collection, a view, never a copy.
- The workers receive handles, never the data: memory-mapped and shared leaves already pickle as
  handles (a file and a view of it, a segment and an offset); plain CPU leaves are moved to shared
  memory once, in place, before the first chunk is sent (what torch would do while pickling the
  first chunk), so every chunk after that is a handle to the same memory.  A worker that writes
  into its chunk writes into the caller's tensors.
- Results come back through shared memory too (torch's reductions move a returned tensor's
  storage to shared memory and send its descriptor) and are joined in the caller: ``torch.cat``,
  or a stack for ``chunksize=0`` (dense when the results agree, a lazy stack otherwise).  An
  ``out`` in shared memory or memory-mapped is split alike and each worker writes its result
  into its part; any other ``out`` is filled in the caller.
- A pool made for the call seeds worker ``i`` with ``base + i`` (torch) and a state derived
  from both (NumPy), ``base`` drawn from ``generator``; it is closed when the call returns; when
  ``map_iter`` is left early or an error escapes, it hands out no more chunks, and its workers
  finish the queued ones and exit before the call returns, so no worker stays behind.  A
  ``pool`` that the caller passes is used as it is and never closed.
- An exception in ``fn`` is raised in the caller, its cause a ``RemoteTraceback`` that holds the
  worker's traceback (``multiprocessing`` sends both).
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import multiprocessing.pool
import os
import pickle
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch

from ._errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError, NotSupportedError
from ._format import LAZY_STACK_TYPE
from ._indexing import check_dim
from ._nodes import kind_for_tag
from ._progress import TerminalProgress
from ._tensordict_base import TensorDictBase

__all__ = ["MapOps", "chunk_bounds"]

T = TypeVar("T", bound="MapOps")
_SEED_WARNING = (
    "{method}() got no generator: its workers are seeded from a new torch.Generator, so every call "
    "seeds them alike (tensordict 0.15.3 does the same, and warns that 0.17 will draw the seed from the "
    "global torch RNG). Pass generator=torch.default_generator to draw it from the global RNG, or "
    "generator=torch.Generator() to keep these seeds without this warning."
)


def chunk_bounds(n: int, chunksize: int | None, num_chunks: int | None, num_workers: int) -> list[int | slice]:
    """The indices along the mapped dimension of each chunk, as tensordict 0.15.3 computes them.

    Args:
        n: the size of the mapped dimension.
        chunksize: rows per chunk (the last one may be shorter); ``0`` gives one integer index per
            row (the rows unbound); None to use ``num_chunks``.
        num_chunks: the number of chunks (at most ``n``; each ``ceil(n / num_chunks)`` rows, so
            there may be fewer); None to use ``chunksize``.
        num_workers: the number of chunks when neither is given.

    Returns:
        A list of slices (or of ints for ``chunksize=0``).

    Raises:
        InvalidArgumentError: both ``chunksize`` and ``num_chunks`` given, or a negative
            ``chunksize``, or a ``num_chunks`` below 1.

    >>> chunk_bounds(10, None, 4, 2)
    [slice(0, 3, None), slice(3, 6, None), slice(6, 9, None), slice(9, 10, None)]
    >>> chunk_bounds(3, 0, None, 2)
    [0, 1, 2]
    """
    if chunksize is not None and num_chunks is not None:
        raise InvalidArgumentError(
            f"Either chunksize or num_chunks must be provided, but not both (got chunksize={chunksize!r} and "
            f"num_chunks={num_chunks!r}): pass one of them, or neither for one chunk per worker."
        )
    if chunksize is None and num_chunks is None:
        num_chunks = num_workers
    if num_chunks is not None:
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
            raise InvalidArgumentError(f"num_chunks must be an int of at least 1, got {num_chunks!r}.")
        if n == 0:
            return []
        size = -(n // -min(n, num_chunks))
    else:
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 0:
            raise InvalidArgumentError(
                f"chunksize must be an int >= 0 (0 passes the rows one by one), got {chunksize!r}."
            )
        if chunksize == 0:
            return list(range(n))
        size = chunksize
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _init_worker(base_seed: int, numbers: Any, workers: int, num_threads: int) -> None:
    """A pool worker's initializer: a worker number from ``numbers``, seeds, torch threads.

    ``numbers`` is a queue that holds the next free number of each of the pool's ``workers``
    slots: a worker takes one and puts back the number its replacement will take.
    """
    torch.set_num_threads(num_threads)  # first: a forked child must not enter the parent's OpenMP team
    worker_id = numbers.get()
    numbers.put(worker_id + workers)
    torch.manual_seed(base_seed + worker_id)
    from torch.utils.data._utils.worker import _generate_state  # the seed DataLoader workers give NumPy

    np.random.seed(_generate_state(base_seed, worker_id))


class _WriteInto:
    """The task of a worker that fills its part of a shared ``out``: ``out_part.update_(fn(part))``."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, item_and_out: tuple[Any, Any]) -> None:
        item, out = item_and_out
        result = self.fn(item)
        if result is not None:
            out.update_(result)


class _ByValue:
    """``fn`` whose results travel by value (their bytes through the pool's pipe).

    With ``max_tasks_per_child`` a worker may exit right after its last task, before this process
    has fetched the shared-memory descriptors that torch would send for the result's tensors (they
    are served by the sending process), so such results are pickled with their bytes instead.
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, item: Any) -> Any:
        return _Packed(self.fn(item))


class _Packed:
    """A result that unpickles as itself, pickled with plain ``pickle`` (no descriptor passing)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (pickle.loads, (pickle.dumps(self.value, protocol=pickle.HIGHEST_PROTOCOL),))


def _share_in_place(td: Any) -> None:
    """Move every plain CPU tensor of ``td`` to shared memory in place (views follow their storage)."""
    for leaf in td._stored_tensors():
        if leaf.device.type == "cpu" and not leaf.is_shared() and not leaf.is_nested:
            leaf.share_memory_()


def _stack_results(items: list[Any], dim: int) -> Any:
    """The results of ``chunksize=0`` stacked: densely when they agree, else as a lazy stack."""
    if all(isinstance(item, torch.Tensor) for item in items):
        return torch.stack(items, dim)
    try:
        shapes = [_layout(item) for item in items]
    except (RuntimeError, KeyError, ValueError, NotImplementedError):
        shapes = []
    if shapes and all(s == shapes[0] for s in shapes):
        return torch.stack(items, dim)
    return _lazy_stack_class().lazy_stack(items, dim)


def _lazy_stack_class() -> Any:
    """The lazy stack class, found through the node registry (``_lazy`` derives from this mixin)."""
    kind = kind_for_tag(LAZY_STACK_TYPE)
    if kind is None:  # pragma: no cover - tdshare registers it on import
        raise NotSupportedError("No lazy stack kind is registered: import tdshare first.")
    return kind.cls


def _layout(item: Any) -> tuple[Any, ...]:
    if not isinstance(item, TensorDictBase) and hasattr(item, "_tensordict"):
        item = item._tensordict  # a tensorclass
    if not isinstance(item, TensorDictBase):
        raise ValueError("not a tensordict")
    leaves = []
    for key, value in item.items(True, True):
        leaves.append((key, tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__))
    return (type(item), tuple(item.batch_size), tuple(sorted(leaves, key=repr)))


def _progress(iterable: Iterable[Any], total: int, label: str) -> Iterator[Any]:
    """``iterable`` with a progress bar: tqdm's when it is installed, else a line on a terminal."""
    if importlib.util.find_spec("tqdm") is not None:
        tqdm = importlib.import_module("tqdm")
        yield from tqdm.tqdm(iterable, total=total)
        return
    bar = TerminalProgress(label)
    try:
        for done, item in enumerate(iterable, 1):
            yield item
            bar(done, total)
    finally:
        bar.close()


class _Plan:
    """A checked ``map``/``map_iter`` call: the chunks and how to feed them to a pool."""

    def __init__(
        self,
        td: Any,
        fn: Any,
        dim: int,
        out: Any,
        chunksize: int | None,
        num_chunks: int | None,
        num_workers: int,
        shuffle: bool,
        index_with_generator: bool,
    ) -> None:
        if not callable(fn):
            raise ArgumentTypeError(f"map: fn must be callable (a function defined at module level), got {fn!r}.")
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise ArgumentTypeError(f"map: dim must be an int, got {type(dim).__name__} {dim!r}.")
        self.dim = check_dim(dim, td.batch_dims)
        n = td.batch_size[self.dim]
        if shuffle and not index_with_generator:
            raise NotSupportedError(
                "Shuffling is not permitted unless index_with_generator is set to True (the chunks are indexed "
                "from a permutation as the workers ask for them): pass index_with_generator=True or shuffle=False."
            )
        self.bounds = chunk_bounds(n, chunksize, num_chunks, num_workers)
        self.unbound = chunksize == 0
        self.shared_out = False
        if out is not None:
            if not hasattr(out, "update_") or not hasattr(out, "batch_size"):
                raise ArgumentTypeError(f"map: out must be a tensordict or a tensorclass, got {type(out).__name__}.")
            self.shared_out = bool(out.is_shared() or out.is_memmap())
            if self.shared_out and (len(out.batch_size) <= self.dim or out.batch_size[self.dim] != n):
                raise BatchSizeError(
                    f"map: out (batch size {list(out.batch_size)}) is split into the workers' parts along dim "
                    f"{self.dim} like the input (batch size {list(td.batch_size)}), so it needs {n} rows there; "
                    "give an out of that size, or one that is not shared to have it filled in this process."
                )
        self.td, self.fn, self.out, self.workers = td, fn, out, num_workers
        self.shuffle, self.lazy = shuffle, index_with_generator
        self.stopped = False

    def _index(self, td: Any, at: int | slice | torch.Tensor) -> Any:
        return td[(slice(None),) * self.dim + (at,)]

    def _parts(self, td: Any, order: torch.Tensor | None) -> Iterator[Any]:
        for at in self.bounds:
            yield self._index(td, at if order is None else order[at])

    def tasks(self) -> tuple[Callable[[Any], Any], Iterable[Any]]:
        """The function each worker runs and its arguments (a list, or a generator when lazy)."""
        _share_in_place(self.td)
        order = None
        if self.shuffle:
            n = self.td.batch_size[self.dim]
            order = torch.randperm(n, device=self.td.device)
        parts: Iterable[Any] = self._parts(self.td, order)
        if not self.lazy:
            parts = list(parts)
        if not self.shared_out:
            return self.fn, parts
        outs = self._parts(self.out, order)
        if self.lazy:
            return _WriteInto(self.fn), zip(parts, outs, strict=True)
        return _WriteInto(self.fn), list(zip(parts, list(outs), strict=True))

    def run(self, pool: Any, pbar: bool, label: str, by_value: bool = False) -> Iterator[Any]:
        """The results of the chunks, in order (as they finish with ``shuffle``)."""
        fn, tasks = self.tasks()
        if by_value:
            fn = _ByValue(fn)
        results = (pool.imap_unordered if self.shuffle else pool.imap)(fn, self._fed(tasks), 1)
        return _progress(results, len(self.bounds), label) if pbar else results

    def _fed(self, tasks: Iterable[Any]) -> Iterator[Any]:
        """The tasks, as the pool's feeder thread takes them, until :meth:`stop` is called."""
        for task in tasks:
            if self.stopped:
                return
            yield task

    def stop(self) -> None:
        """Hand no more chunks to the pool (those already queued still run)."""
        self.stopped = True

    def gather(self, results: Iterator[Any]) -> Any:
        """Join the results (or write them into ``out``); None when every chunk returned None."""
        out, kept, start = self.out, [], 0
        base = (slice(None),) * self.dim
        for item in results:
            if item is None:
                continue
            if out is None:
                kept.append(item)
            else:
                end = start + 1 if self.unbound else start + item.shape[self.dim]
                at: tuple[Any, ...] = (*base, start if self.unbound else slice(start, end))
                out[at].update_(item)
                start = end
        if kept:
            return _stack_results(kept, self.dim) if self.unbound else torch.cat(kept, self.dim)
        return out


class _PoolOptions:
    """The arguments of a pool made for one call, checked before anything starts."""

    def __init__(
        self,
        num_workers: int | None,
        generator: torch.Generator | None,
        max_tasks_per_child: int | None,
        worker_threads: int,
        mp_start_method: str | None,
    ) -> None:
        workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        for name, value in (("num_workers", workers), ("worker_threads", worker_threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"map: {name} must be an int of at least 1, got {value!r}.")
        limit = max_tasks_per_child
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidArgumentError(f"map: max_tasks_per_child must be None or an int of at least 1, got {limit!r}.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ArgumentTypeError(
                f"map: generator must be a torch.Generator or None, got {type(generator).__name__}."
            )
        methods = multiprocessing.get_all_start_methods()
        if mp_start_method is not None and mp_start_method not in methods:
            raise InvalidArgumentError(
                f"map: mp_start_method must be one of {methods} or None, got {mp_start_method!r}."
            )
        self.workers, self.generator, self.limit = workers, generator, limit
        self.threads, self.method = worker_threads, mp_start_method

    def make(self, caller: str) -> multiprocessing.pool.Pool:
        """The pool, its workers seeded from a base seed that the generator draws now."""
        generator = self.generator
        if generator is None:
            warnings.warn(_SEED_WARNING.format(method=caller), FutureWarning, stacklevel=3)
            generator = torch.Generator()
        seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
        ctx = multiprocessing.get_context(self.method)
        # worker numbers 0..workers-1, then the replacements' (a queue, not a ctx.Value: that one
        # maps a multiprocessing heap arena from /dev/shm into this process for good)
        numbers = ctx.SimpleQueue()
        for number in range(self.workers):
            numbers.put(number)
        return ctx.Pool(self.workers, _init_worker, (seed, numbers, self.workers, self.threads), self.limit)


def _workers(pool: Any, options: _PoolOptions | None) -> int:
    """The number of workers: the options', or the given pool's (one per CPU if it does not say)."""
    if options is not None:
        return options.workers
    if not hasattr(pool, "imap") or not hasattr(pool, "imap_unordered"):
        raise ArgumentTypeError(
            f"map: pool must be a multiprocessing pool (with imap and imap_unordered), got {type(pool).__name__}."
        )
    size = getattr(pool, "_processes", None)
    return size if isinstance(size, int) and size > 0 else os.cpu_count() or 1


class MapOps(TensorDictBase):
    """``map`` and ``map_iter``: run a function over chunks of the collection in worker processes.

    >>> from tdshare import TensorDict
    >>> callable(TensorDict.map) and callable(TensorDict.map_iter)
    True
    """

    def map(
        self,
        fn: Callable[[Any], Any],
        dim: int = 0,
        num_workers: int | None = None,
        *,
        out: Any = None,
        chunksize: int | None = None,
        num_chunks: int | None = None,
        pool: Any = None,
        generator: torch.Generator | None = None,
        max_tasks_per_child: int | None = None,
        worker_threads: int = 1,
        index_with_generator: bool = False,
        pbar: bool = False,
        mp_start_method: str | None = None,
    ) -> Any:
        """Call ``fn`` on chunks of this collection in worker processes and join the results.

        The collection is split along ``dim`` (views, never copies); each chunk goes to a worker
        as a handle to the same memory, so ``fn`` may also write into its chunk in place.

        Args:
            fn: a picklable function (defined at module level) called with each chunk; it returns
                a tensordict, a tensor or None.
            dim: the batch dimension to split along (negative counts from the end).
            num_workers: worker processes of the pool made for the call (default: one per CPU);
                ignored with ``pool``.
            out: a tensordict (or tensorclass) the results are written into and which is
                returned; one in shared memory or memory-mapped is filled by the workers
                themselves (it must have this collection's size along ``dim``).
            chunksize: rows per chunk; ``0`` calls ``fn`` on each row unbound along ``dim``.
            num_chunks: the number of chunks (each ``ceil(n / num_chunks)`` rows); with neither
                this nor ``chunksize``, one chunk per worker.
            pool: a ``multiprocessing`` pool to use; it is left open. ``num_workers``,
                ``generator``, ``max_tasks_per_child``, ``worker_threads`` and
                ``mp_start_method`` are then ignored (its workers are not seeded).
            generator: draws the base seed: worker ``i`` seeds torch with ``base + i`` and NumPy
                with a state derived from both. None uses a new ``torch.Generator`` (the same
                seeds on every call) and warns, as tensordict 0.15.3 does.
            max_tasks_per_child: chunks a worker handles before it is replaced (a replacement
                takes the next worker number, so a new seed); results then come back by value,
                since a worker may exit before its shared memory is fetched.
            worker_threads: torch threads in each worker. Keep 1 with ``"fork"`` once this process
                ran parallel torch ops: a forked child cannot use the OpenMP threads it inherits.
            index_with_generator: index each chunk when the pool asks for it instead of all up front.
            pbar: show progress (tqdm when installed, else one terminal line).
            mp_start_method: ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (the default method).

        Returns:
            The results joined along ``dim`` (``torch.cat``; for ``chunksize=0`` a stack, lazy when
            the results differ in keys or shapes); ``out`` when given; None when ``fn`` returned
            None for every chunk.

        Raises:
            InvalidArgumentError: both ``chunksize`` and ``num_chunks``, or an out-of-range count.
            ArgumentTypeError: ``fn`` not callable, ``dim`` not an int, a bad ``generator`` or ``out``.
            IndexError: ``dim`` out of range.
            BatchSizeError: a shared ``out`` whose size along ``dim`` differs.
            Exception: whatever ``fn`` raised in a worker, with the worker's traceback as its cause.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(x=torch.arange(6.0), batch_size=[6]).memmap_()
        >>> def double(chunk): return chunk.apply(lambda t: t * 2)
        >>> # td.map(double, num_workers=2).get("x")  (run from a script: workers import double)
        """
        options = (
            None
            if pool is not None
            else _PoolOptions(num_workers, generator, max_tasks_per_child, worker_threads, mp_start_method)
        )
        plan = _Plan(self, fn, dim, out, chunksize, num_chunks, _workers(pool, options), False, index_with_generator)
        if not plan.bounds:
            return out
        if pool is not None:
            return plan.gather(plan.run(pool, pbar, "map"))
        assert options is not None
        own = options.make("map")
        with _closing(own, plan):
            return plan.gather(plan.run(own, pbar, "map", options.limit is not None))

    def map_iter(
        self,
        fn: Callable[[Any], Any],
        dim: int = 0,
        num_workers: int | None = None,
        *,
        shuffle: bool = False,
        chunksize: int | None = None,
        num_chunks: int | None = None,
        pool: Any = None,
        generator: torch.Generator | None = None,
        max_tasks_per_child: int | None = None,
        worker_threads: int = 1,
        index_with_generator: bool = True,
        pbar: bool = False,
        mp_start_method: str | None = None,
    ) -> Generator[Any, None, None]:
        """Call ``fn`` on chunks of this collection in worker processes and yield each result.

        The iterator form of :meth:`map`, with the same arguments (no ``out``): the results come in
        the order of the chunks, or as the workers finish them with ``shuffle=True``. The
        arguments are checked at the call; the pool starts at the first ``next()``. Leaving the
        loop early (``break``, an exception, dropping the iterator) stops a pool made for the call:
        no more chunks are handed out, its workers finish the queued ones and exit, so no worker
        outlives the loop; a ``pool`` passed in is left open.

        Args:
            fn: a picklable function called with each chunk.
            dim: the batch dimension to split along.
            num_workers: worker processes of the pool made for the call (default: one per CPU).
            shuffle: chunks take their rows from a random permutation along ``dim`` (drawn from
                torch's global RNG), and results are yielded as they finish; needs
                ``index_with_generator=True``.
            chunksize: rows per chunk; ``0`` yields ``fn`` of each row unbound along ``dim``.
            num_chunks: the number of chunks; with neither, one chunk per worker.
            pool: a pool to use and leave open (the next four arguments are then ignored).
            generator: draws the workers' base seed (see :meth:`map`).
            max_tasks_per_child: chunks a worker handles before it is replaced.
            worker_threads: torch threads in each worker.
            index_with_generator: index each chunk when the pool asks for it (default True here).
            pbar: show progress (tqdm when installed, else one terminal line).
            mp_start_method: the start method of the workers, or None for the default.

        Returns:
            An iterator over the results of ``fn``.

        Raises:
            NotSupportedError: ``shuffle=True`` with ``index_with_generator=False`` (a ``RuntimeError``).
            InvalidArgumentError, ArgumentTypeError, IndexError: as for :meth:`map`.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(x=torch.arange(6.0), batch_size=[6])
        >>> batches = td.map_iter(print, chunksize=2)  # checked now; workers start on next()
        """
        options = (
            None
            if pool is not None
            else _PoolOptions(num_workers, generator, max_tasks_per_child, worker_threads, mp_start_method)
        )
        plan = _Plan(self, fn, dim, None, chunksize, num_chunks, _workers(pool, options), shuffle, index_with_generator)
        if options is None:
            return _in_given_pool(plan, pool, pbar)
        return _iterate(plan, options, pbar)

    # -- views handed to other processes ------------------------------------------------------
    @classmethod
    def lazy_stack(cls, tds: Any, dim: int = 0, **kwargs: Any) -> Any:
        """A :class:`tdshare.LazyStackedTensorDict` of ``tds`` along ``dim``, without copying them.

        The members stay the same objects: a member in shared memory or memory-mapped is sent to
        another process as a handle, so a child's in-place writes into it reach this process.

        Args:
            tds: the tensordicts to stack (equal batch sizes).
            dim: the new batch dimension.
            **kwargs: ``out``, ``stack_dim_name``, ``strict_shape``, as ``LazyStackedTensorDict.lazy_stack``.

        Returns:
            The lazy stack.

        Raises:
            BatchSizeError: members whose batch sizes differ.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> a, b = TensorDict(x=torch.zeros(2), batch_size=[2]), TensorDict(x=torch.ones(2), batch_size=[2])
        >>> ls = TensorDict.lazy_stack([a, b], 0)
        >>> ls.batch_size, ls.tensordicts[1] is b
        (torch.Size([2, 2]), True)
        """
        return _lazy_stack_class().lazy_stack(tds, dim, **kwargs)


def _in_given_pool(plan: _Plan, pool: Any, pbar: bool) -> Generator[Any, None, None]:
    """``map_iter`` over the caller's pool (left open: it is theirs)."""
    if plan.bounds:
        yield from plan.run(pool, pbar, "map_iter")


def _iterate(plan: _Plan, options: _PoolOptions, pbar: bool) -> Generator[Any, None, None]:
    """``map_iter`` over a pool made for it: closed at the end, stopped when left early."""
    if not plan.bounds:
        return
    pool = options.make("map_iter")
    with _closing(pool, plan):
        yield from plan.run(pool, pbar, "map_iter", options.limit is not None)


@contextlib.contextmanager
def _closing(pool: multiprocessing.pool.Pool, plan: _Plan) -> Iterator[None]:
    """Close ``pool`` and wait for its workers when the block ends.

    On an error, or when ``map_iter`` is left early (``GeneratorExit``), no more chunks are handed
    out and the workers finish the ones already queued, then exit normally (so each cleans up
    after itself: a killed worker would leave its ``multiprocessing`` temporary folder behind).
    A ``KeyboardInterrupt`` (or any other ``BaseException``) terminates them at once.
    """
    try:
        yield
    except (Exception, GeneratorExit):
        plan.stop()
        pool.close()
        pool.join()
        raise
    except BaseException:
        pool.terminate()
        pool.join()
        raise
    pool.close()
    pool.join()
