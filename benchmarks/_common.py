"""Shared pieces: sizes, the two libraries, interleaved timing, results, scratch folders.

Every measurement is a *case*: a function that performs one repetition (its own untimed setup
and cleanup included) and returns what it measured, either one number or a dict of named
numbers.  :func:`run_interleaved` calls the cases of one workload in turn (tdshare rep,
tensordict rep, limit rep, ...), drops the warm-up repetitions and keeps the medians.
"""

from __future__ import annotations

import compileall
import errno
import gc
import importlib
import itertools
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LIBRARIES",
    "Backend",
    "Cell",
    "Config",
    "Row",
    "Scratch",
    "byte_compile",
    "UnsupportedError",
    "config_for",
    "describe_error",
    "load_backends",
    "log",
    "require",
    "settle",
    "run_interleaved",
    "timed",
]

LIBRARIES = ("tdshare", "tensordict")
LIMIT = "limit"
MiB = 1 << 20
GiB = 1 << 30


class UnsupportedError(Exception):
    """The library lacks the feature a workload needs: the cell says "unsupported"."""


def log(msg: str) -> None:
    """Progress goes to stderr, so stdout holds only the table."""
    print(msg, file=sys.stderr, flush=True)


# -- configuration --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """Sizes and repetition counts for one run (``full``, ``quick`` or ``tiny`` for tests)."""

    mode: str
    reps: int
    small_reps: int  # the small-leaf rows: milliseconds each, and the noisiest ratios
    warmup: int
    big_leaves: int
    big_leaf_bytes: int
    small_counts: tuple[int, ...]
    small_subtds: int
    small_leaf_floats: int
    refresh_leaves: int
    make_entries: int
    pickle_leaves: int
    pickle_big_bytes: int
    spawn_big_handoff: bool
    spawn_warmup: int
    tdz_stored_bytes: int
    tdz_deflated_bytes: int
    loader_rows: int
    loader_batch: int
    loader_batches: int
    loader_workers: int
    base_dir: str
    shm_dir: str | None

    @property
    def big_bytes(self) -> int:
        return self.big_leaves * self.big_leaf_bytes


def config_for(mode: str, base_dir: str, shm_dir: str | None, reps: int | None = None) -> Config:
    """The sizes the README describes for ``mode`` (``full``, ``quick`` or ``tiny``)."""
    if mode == "full":
        cfg = dict(
            reps=5,
            small_reps=9,
            warmup=1,
            big_leaves=4,
            big_leaf_bytes=256 * MiB,
            small_counts=(1_000, 10_000),
            refresh_leaves=1_000,
            make_entries=1_000,
            pickle_leaves=1_000,
            pickle_big_bytes=GiB,
            spawn_big_handoff=True,
            spawn_warmup=1,
            tdz_stored_bytes=256 * MiB,
            tdz_deflated_bytes=16 * MiB,
            loader_rows=1_000_000,
            loader_batches=2_000,
        )
    elif mode == "quick":
        cfg = dict(
            reps=3,
            small_reps=5,
            warmup=1,
            big_leaves=4,
            big_leaf_bytes=32 * MiB,
            small_counts=(1_000,),
            refresh_leaves=1_000,
            make_entries=100,
            pickle_leaves=1_000,
            pickle_big_bytes=64 * MiB,
            spawn_big_handoff=False,
            spawn_warmup=0,
            tdz_stored_bytes=32 * MiB,
            tdz_deflated_bytes=2 * MiB,
            loader_rows=200_000,
            loader_batches=500,
        )
    elif mode == "tiny":
        cfg = dict(
            reps=1,
            small_reps=1,
            warmup=0,
            big_leaves=2,
            big_leaf_bytes=MiB,
            small_counts=(20,),
            refresh_leaves=20,
            make_entries=5,
            pickle_leaves=20,
            pickle_big_bytes=MiB,
            spawn_big_handoff=False,
            spawn_warmup=0,
            tdz_stored_bytes=MiB,
            tdz_deflated_bytes=64 * 1024,
            loader_rows=1_000,
            loader_batches=10,
        )
    else:
        raise ValueError(f"unknown mode {mode!r}")
    if reps is not None:
        cfg["reps"] = cfg["small_reps"] = reps
    return Config(
        mode=mode,
        small_subtds=100 if mode != "tiny" else 2,
        small_leaf_floats=16,
        loader_batch=256,
        loader_workers=2,
        base_dir=base_dir,
        shm_dir=shm_dir,
        **cfg,  # type: ignore[arg-type]
    )


# -- the libraries ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backend:
    """One library under test: its module, ``TensorDict`` and ``MemoryMappedTensor``."""

    name: str
    module: Any
    version: str

    @property
    def TensorDict(self) -> Any:  # noqa: N802 - mirrors the library's class name
        return self.module.TensorDict

    @property
    def MemoryMappedTensor(self) -> Any:  # noqa: N802
        return self.module.MemoryMappedTensor


def load_backends(names: tuple[str, ...] = LIBRARIES) -> tuple[list[Backend], dict[str, str]]:
    """Import each library; returns the importable ones and, for the others, why not."""
    found: list[Backend] = []
    missing: dict[str, str] = {}
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as e:  # an absent or broken install: report, run the rest
            missing[name] = f"not importable ({type(e).__name__}: {e})"
            continue
        found.append(Backend(name, module, str(getattr(module, "__version__", "?"))))
        byte_compile(module)
    return found, missing


def byte_compile(module: Any) -> bool:
    """Write the bytecode of a library's modules where it is missing or stale, as ``pip install``
    does; returns whether every module compiled.

    Spawned workers import the library afresh: with no ``.pyc`` (an editable checkout run under
    ``PYTHONDONTWRITEBYTECODE=1``) each spawn compiles every module again, about 150-290 ms for
    tdshare's 120 modules here, which the spawn rows would then charge to the library.
    """
    folder = os.path.dirname(getattr(module, "__file__", "") or "")
    if not folder or not os.access(folder, os.W_OK):
        return False
    return bool(compileall.compile_dir(folder, quiet=2, workers=1))


def require(obj: Any, attr: str) -> Any:
    """``getattr(obj, attr)``, or :class:`UnsupportedError` when the library has no such feature."""
    value = getattr(obj, attr, None)
    if value is None:
        raise UnsupportedError(f"no {attr}")
    return value


# -- results --------------------------------------------------------------------------------------
@dataclass
class Cell:
    """The median of the kept repetitions, or why there is no number."""

    values: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def value(self) -> float | None:
        if self.error is not None or not self.values:
            return None
        return float(statistics.median(self.values))

    def to_json(self) -> dict[str, Any]:
        return {"median": self.value, "values": self.values, "error": self.error}


@dataclass
class Row:
    """One line of the table.

    ``kind``: ``time`` (seconds, lower is better), ``bytes`` and ``mib`` (lower is better) or
    ``rate`` (per second, higher is better).  ``nbytes`` turns a time into GB/s on display,
    ``per`` into a time per item.  ``cells`` holds ``tdshare``, ``tensordict`` and, where a raw
    limit applies, ``limit``, described by ``limit_name``.
    """

    group: str
    name: str
    kind: str
    cells: dict[str, Cell]
    nbytes: int | None = None
    per: int | None = None
    limit_name: str | None = None
    note: str | None = None

    @property
    def higher_is_better(self) -> bool:
        return self.kind == "rate"

    def ratio(self, a: str, b: str) -> float | None:
        """How much better ``a`` is than ``b`` (``b``'s time / ``a``'s time for times).

        Times and rates measured round by round (:func:`run_interleaved`, both cases back to back
        in each round) give the median of the rounds' ratios: this machine has slow phases of
        seconds, and a phase that covers some rounds then cancels out instead of moving one
        library's median.  Other rows give the ratio of the medians.
        """
        ca, cb = self.cells.get(a, Cell()), self.cells.get(b, Cell())
        va, vb = ca.value, cb.value
        if va is None or vb is None or va <= 0 or vb <= 0:
            return None
        if self.kind in ("time", "rate") and len(ca.values) == len(cb.values) >= 3 and min(ca.values + cb.values) > 0:
            rounds = [x / y if self.higher_is_better else y / x for x, y in zip(ca.values, cb.values, strict=True)]
            return float(statistics.median(rounds))
        return va / vb if self.higher_is_better else vb / va

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "name": self.name,
            "kind": self.kind,
            "nbytes": self.nbytes,
            "per": self.per,
            "limit_name": self.limit_name,
            "note": self.note,
            "cells": {k: c.to_json() for k, c in self.cells.items()},
            "ratio_tensordict_over_tdshare": self.ratio("tdshare", "tensordict"),
            "tdshare_of_limit": self.ratio("tdshare", LIMIT),
            "tensordict_of_limit": self.ratio("tensordict", LIMIT),
        }


def describe_error(e: BaseException) -> str:
    """A short cell text: "unsupported" for a missing feature, else the error class (and errno)."""
    if isinstance(e, (UnsupportedError, NotImplementedError)):
        return "unsupported"
    if isinstance(e, TypeError) and "unexpected keyword argument" in str(e):
        return "unsupported"
    name = type(e).__name__
    if isinstance(e, OSError) and e.errno is not None and e.errno in errno.errorcode:
        return f"{name} {errno.errorcode[e.errno]}"
    return name


Measure = Callable[[], "float | Mapping[str, float]"]


def run_interleaved(
    cases: Mapping[str, Measure], reps: int, warmup: int, before: Callable[[], object] | None = None
) -> dict[str, dict[str, Cell]]:
    """Run ``warmup + reps`` rounds; in each, every case once, in an order shuffled per round.

    The order of round ``r`` is the same in every process (a generator seeded with ``r``), so the
    ranks of a distributed case run the same case at the same time; a fixed rotation would make
    each case always follow the same one (after another library's case, its caches cold).

    ``before`` runs (untimed) before every case: e.g. ``os.sync``, so that no case is measured
    while the kernel writes back what the one before it wrote.  Returns ``{metric: {case: Cell}}``;
    a case that returns a plain number reports metric ``""``.  A case that raises is recorded with
    :func:`describe_error` and not called again.
    """
    out: dict[str, dict[str, Cell]] = {}
    failed: dict[str, str] = {}
    names = list(cases)
    for rnd in range(warmup + reps):
        # Whatever one case leaves behind (a journal to commit, pages to free, cold caches) falls
        # on every case in turn: a new order each round, and the first round starts in order.
        order = names[:]
        if rnd:
            random.Random(rnd).shuffle(order)
        for name in order:
            case = cases[name]
            if name in failed:
                continue
            if before is not None:
                before()
            try:
                got = case()
            except Exception as e:
                failed[name] = describe_error(e)
                log(f"    {name}: {failed[name]} ({type(e).__name__}: {str(e)[:200]})")
                continue
            finally:
                gc.collect(1)  # young cycles (a dropped tensordict's maps and descriptors): cheap
            metrics = got if isinstance(got, Mapping) else {"": got}
            if rnd < warmup:
                continue
            for metric, value in metrics.items():
                out.setdefault(metric, {}).setdefault(name, Cell()).values.append(float(value))
        gc.collect()  # everything else, once a round
    if not out:
        out[""] = {}
    for cells in out.values():
        for name, reason in failed.items():
            cells[name] = Cell(values=[], error=reason)
    return {metric: {n: cells[n] for n in names if n in cells} for metric, cells in out.items()}


@contextmanager
def timed(into: dict[str, float], key: str) -> Iterator[None]:
    """Add the wall time of the block to ``into[key]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[key] = into.get(key, 0.0) + time.perf_counter() - t0


# -- scratch folders ----------------------------------------------------------------------------
class Scratch:
    """Fresh, never-used paths under one base folder; everything is removed by :meth:`close`."""

    _counter = itertools.count()

    def __init__(self, parent: str | None, prefix: str = "tdshare-bench-") -> None:
        self.root = tempfile.mkdtemp(prefix=prefix, dir=parent)

    def fresh(self, name: str = "d", suffix: str = "") -> str:
        """A path that does not exist yet (its parent does)."""
        return os.path.join(self.root, f"{name}-{next(self._counter)}{suffix}")

    def remove(self, path: str) -> None:
        """Delete ``path``; a folder of many files is only moved aside, and deleted by :meth:`close`.

        On ext4 without a journal (this project's machines) the kernel skips inodes freed in the
        last ~30 s when it allocates new ones, one buffer lookup each: creating 1,000 files right
        after deleting 10,000 measured 400-500 us of kernel time per file instead of ~15 us (perf:
        ``recently_deleted`` in ``find_inode_bit``).  Deleting each repetition's thousands of leaf
        files would make the next repetition measure that, for every library alike.
        """
        if os.path.isdir(path) and not os.path.islink(path):
            if sum(len(files) for _, _, files in os.walk(path)) > _DEFER_FILES:
                os.makedirs(self._trash, exist_ok=True)
                os.rename(path, os.path.join(self._trash, os.path.basename(path)))
            else:
                shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)

    @property
    def _trash(self) -> str:
        return os.path.join(self.root, ".removed")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


_DEFER_FILES = 100  # folders with more files than this are deleted at the end of the run


def settle(scratch: Scratch, *, normal_us: float = 25.0, limit_s: float = 180.0, calm: int = 2) -> tuple[float, float]:
    """Wait until creating files in ``scratch`` costs what it normally does; return (µs per file, s waited).

    Right after many files were deleted anywhere on the file system (a previous run's clean-up, a
    test suite), ext4 without a journal makes each new file cost 100-500 µs instead of 5-15 for
    minutes (see :meth:`Scratch.remove`): the "fresh folder" rows would show that state, not the
    libraries.  A probe creates 1,000 empty files in 50 new folders, the shape of those rows: new
    folders land in other block groups than a single folder's files, and a one-folder probe can
    look calm while they do not.  Settled means ``calm`` probes in a row at most ``normal_us`` a
    file.  Probes are kept until the run ends, since deleting them would prolong the state waited out.
    """
    t0 = time.perf_counter()
    good = 0
    while True:
        top = scratch.fresh("settle")
        os.mkdir(top)
        start = time.perf_counter()
        for d in range(50):
            folder = os.path.join(top, str(d))
            os.mkdir(folder)
            for i in range(20):
                os.close(os.open(os.path.join(folder, f"f{i}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        per_file = (time.perf_counter() - start) / 1000 * 1e6
        waited = time.perf_counter() - t0
        good = good + 1 if per_file <= normal_us else 0
        if good >= calm or waited >= limit_s:
            return per_file, waited
        time.sleep(5)


def filesystem_of(path: str) -> str:
    """``"ext4 (/dev/vda on /)"``: the mount holding ``path``, from /proc/mounts."""
    path = os.path.realpath(path)
    best = ("?", "?", "")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[2]):
                    best = (fstype, dev, mnt)
    except OSError:
        pass
    return f"{best[0]} ({best[1]} on {best[2]})"
