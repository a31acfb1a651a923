"""Pausing Python's cyclic garbage collector while a bulk operation builds a large tree.

Saving or loading ten thousand leaves allocates a few hundred thousand container objects that
all stay alive.  The collector, triggered by the allocation count, would traverse the whole
heap over and over without finding garbage: it measured a quarter of the time of a
10,000-leaf ``memmap_``.  :func:`paused_gc` turns it off for the operation and back on after,
unless something else had turned it off before (then it is left alone).  Reference counting
still frees everything that is not part of a cycle during the pause.  When the collector goes
back on, the objects the operation left in the youngest generation are moved to the oldest
without a scan (:func:`_promote_young`): a load of 100,000 leaves measured 0.6-0.9 µs per leaf
for that first scan, and as much again in the code that ran next.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

__all__ = ["paused_gc", "bulk"]

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()
_depth = 0  # bulk operations running, in all threads: the last one out turns the collector on


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic collector off (when it was on); nests and works across threads."""
    global _depth
    with _lock:
        ours = _depth > 0 or gc.isenabled()
        if ours:
            _depth += 1
            gc.disable()
    try:
        yield
    finally:
        if ours:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    _promote_young()
                    gc.enable()


def _promote_young() -> None:
    """Move the objects the pause let pile up in the youngest generation to the oldest, unscanned.

    Back on, the collector would otherwise traverse every one of them at the next allocation (a
    tree of a million leaves: a million objects, a second) only to find them alive.  A freeze
    and unfreeze moves them in O(1); they are scanned at the next full collection, as objects
    that survive two collections are.  Skipped when the process froze objects itself
    (``gc.freeze()`` before a fork): those must stay frozen.  Small operations skip it.
    """
    # only after an operation that left many objects: ``get_freeze_count`` walks the frozen
    # objects (12 ms per call in a process that froze its heap), which a small save or load must not pay
    if gc.get_count()[0] >= _MANY and gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


_MANY = 50_000  # young objects left (tracked allocations since the last collection): a load of ~40,000 leaves


def bulk(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a bulk operation: it runs under :func:`paused_gc`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused_gc():
            return fn(*args, **kwargs)

    return wrapper


def _after_fork_in_child() -> None:
    # forked while another thread was in a bulk operation: that thread does not exist here
    global _lock, _depth
    _lock = threading.Lock()
    if _depth:
        _depth = 0
        gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
