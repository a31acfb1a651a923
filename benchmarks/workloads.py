"""The workloads.  Each group function builds its data once, measures every library (and the raw
limit that applies) interleaved with :func:`benchmarks._common.run_interleaved`, cleans up its
files, and returns table rows.

Timed regions hold the operation and nothing else: building the source tensordict, removing
folders and checking results happen outside them.  Writes go to a fresh folder every repetition.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import pickle
import time
import zlib
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import psutil
import torch

from . import _workers, limits
from ._common import (
    LIMIT,
    Backend,
    Cell,
    Config,
    Row,
    Scratch,
    UnsupportedError,
    describe_error,
    log,
    require,
    run_interleaved,
)
from .distributed import distributed
from .map_rows import map_rows

__all__ = [
    "EXTRA_GROUPS",
    "GROUPS",
    "big_leaves",
    "consolidate",
    "dataloader",
    "family",
    "handoff",
    "handoff_live",
    "loader",
    "make_memmap",
    "refresh",
    "small_leaves",
    "tdz",
]

Case = Callable[[], "float | Mapping[str, float]"]


def _leaves(td: Any) -> list[torch.Tensor]:
    """Every tensor leaf, depth first (works for both libraries)."""
    out: list[torch.Tensor] = []
    for key in list(td.keys()):
        value = td[key]
        if isinstance(value, torch.Tensor):
            out.append(value)
        else:
            out.extend(_leaves(value))
    return out


def _sum_all(td: Any) -> float:
    return sum(float(t.sum()) for t in _leaves(td))


def _as(metric: str, case: Callable[[], float]) -> Case:
    """Report a one-number case under ``metric``."""
    return lambda: {metric: case()}


_write_errors: dict[str, BaseException] = {}


def _write_folders(backends: list[Backend], scratch: Scratch, build: Callable[[Backend], Any]) -> dict[str, str]:
    """Write ``build(b)`` with ``memmap_`` to a fresh folder per library (untimed setup).

    A failure is remembered and raised again by :func:`_raise_if_failed` inside the case, so the
    cell shows it.
    """
    folders = {}
    for b in backends:
        folders[b.name] = scratch.fresh(b.name)
        try:
            td = build(b).memmap_(folders[b.name])
            del td
        except Exception as e:
            _write_errors[folders[b.name]] = e
    gc.collect()
    return folders


def _raise_if_failed(folders: dict[str, str], b: Backend) -> None:
    error = _write_errors.get(folders[b.name])
    if error is not None:
        raise error


# -- big leaves -------------------------------------------------------------------------------
def big_leaves(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """memmap_ / save / load + sum of a few big leaves, against write() and map + sum."""
    group = f"{cfg.big_leaves} x {cfg.big_leaf_bytes >> 20} MiB"
    src = [torch.randn(cfg.big_leaf_bytes // 4) for _ in range(cfg.big_leaves)]
    nbytes = cfg.big_bytes
    rows: list[Row] = []

    def build(b: Backend) -> Any:
        return b.TensorDict({f"x{i}": t for i, t in enumerate(src)}, batch_size=[])

    def write_case(b: Backend, how: str, threads: int) -> Case:
        def case() -> float:
            td, folder = build(b), scratch.fresh(b.name)
            t0 = time.perf_counter()
            if how == "memmap_":
                td.memmap_(folder, num_threads=threads)
            else:
                out = td.save(folder, num_threads=threads)
                del out
            dt = time.perf_counter() - t0
            del td
            scratch.remove(folder)
            return dt

        return case

    for how, threads in (("memmap_", 0), ("memmap_", 2), ("save", 0)):
        log(f"  {group}: {how} num_threads={threads}")
        cases: dict[str, Case] = {b.name: write_case(b, how, threads) for b in backends}
        cases[LIMIT] = limits.write_files_case(scratch, src, max(1, threads))
        res = run_interleaved(cases, cfg.reps, cfg.warmup)
        name = f"{how} {group} -> fresh folder" + (f", num_threads={threads}" if threads else "")
        limit = f"write() {max(1, threads)} thread{'s' if threads > 1 else ''}"
        rows.append(Row(group, name, "time", res[""], nbytes=nbytes, limit_name=limit))

    log(f"  {group}: load_memmap + sum")
    folders = _write_folders(backends, scratch, build)
    raw = scratch.fresh("raw")
    limits.write_files(raw, src)

    def load_case(b: Backend) -> Case:
        def case() -> dict[str, float]:
            _raise_if_failed(folders, b)
            t0 = time.perf_counter()
            td = b.TensorDict.load_memmap(folders[b.name])
            t1 = time.perf_counter()
            _sum_all(td)
            t2 = time.perf_counter()
            return {"open": t1 - t0, "open+sum": t2 - t0}

        return case

    cases = {b.name: load_case(b) for b in backends}
    cases[LIMIT] = _as("open+sum", limits.map_sum_case(raw, [t.numel() for t in src]))
    res = run_interleaved(cases, cfg.reps, cfg.warmup)
    rows.append(Row(group, f"load_memmap {group} (open only)", "time", dict(res.get("open", {}))))
    rows.append(
        Row(
            group,
            f"load_memmap {group} + sum of every leaf",
            "time",
            dict(res.get("open+sum", {})),
            nbytes=nbytes,
            limit_name="map + sum",
        )
    )
    for folder in [*folders.values(), raw]:
        scratch.remove(folder)
    return rows


def _load_case(b: Backend, saved: dict[str, str], archive: bool = False) -> Case:
    """Time ``load_memmap`` of what ``b`` saved (``archive``: it must be a .tdz file)."""

    def case() -> float:
        _raise_if_failed(saved, b)
        if archive and not os.path.isfile(saved[b.name]):
            raise UnsupportedError("save(*.tdz) did not write an archive")
        t0 = time.perf_counter()
        td = b.TensorDict.load_memmap(saved[b.name])
        dt = time.perf_counter() - t0
        del td
        return dt

    return case


# -- many small leaves ----------------------------------------------------------------------------
def small_td(b: Backend, leaves: list[torch.Tensor], subtds: int) -> Any:
    """``subtds`` sub-tensordicts sharing ``leaves`` evenly (unbatched)."""
    per = -(-len(leaves) // subtds)
    return b.TensorDict(
        {
            f"sub{s}": b.TensorDict({f"x{j}": t for j, t in enumerate(leaves[s * per : (s + 1) * per])}, batch_size=[])
            for s in range(min(subtds, len(leaves)))
        },
        batch_size=[],
    )


def small_leaves(cfg: Config, backends: list[Backend], scratch: Scratch, shm: Scratch | None = None) -> list[Row]:
    """memmap_ into a fresh folder (both file systems), into anonymous memory, and load_memmap."""
    rows: list[Row] = []
    payload = bytes(cfg.small_leaf_floats * 4)
    for n in cfg.small_counts:
        group = f"{n:,} small leaves"
        leaves = [torch.randn(cfg.small_leaf_floats) for _ in range(n)]

        def write_case(b: Backend, store: Scratch | None, leaves: list[torch.Tensor] = leaves) -> Case:
            def case() -> float:
                td = small_td(b, leaves, cfg.small_subtds)
                folder = store.fresh(b.name) if store is not None else None
                t0 = time.perf_counter()
                td.memmap_(folder)
                dt = time.perf_counter() - t0
                del td
                if folder is not None and store is not None:
                    store.remove(folder)
                return dt

            return case

        stores: list[tuple[str, Scratch | None]] = [("fresh folder", scratch)]
        if shm is not None:
            stores.append(("fresh folder on /dev/shm", shm))
        stores.append(("anonymous memory (prefix=None)", None))
        for label, store in stores:
            log(f"  {group}: memmap_ -> {label}")
            cases: dict[str, Case] = {b.name: write_case(b, store) for b in backends}
            if store is not None:
                cases[LIMIT] = limits.create_files_case(store, n, cfg.small_subtds, payload)
                limit = f"create {n:,} files of {len(payload)} B"
            else:
                cases[LIMIT] = limits.segment_case(leaves)
                limit = "copy into views of one memfd"
            # each case starts with nothing left to write back: the cases before it wrote thousands of files
            res = run_interleaved(cases, cfg.small_reps, cfg.warmup, before=os.sync if store is not None else None)
            rows.append(
                Row(
                    group,
                    f"memmap_ {n:,} leaves ({cfg.small_subtds} sub-tds) -> {label}",
                    "time",
                    res[""],
                    limit_name=limit,
                    note=_slow_creation_note(res[""].get(LIMIT), n) if store is not None else None,
                )
            )

        log(f"  {group}: load_memmap")
        folders = _write_folders(backends, scratch, lambda b, leaves=leaves: small_td(b, leaves, cfg.small_subtds))
        raw = scratch.fresh("raw")
        paths = limits.make_small_files(raw, n, cfg.small_subtds, payload)

        cases = {b.name: _load_case(b, folders) for b in backends}
        cases[LIMIT] = limits.map_files_case(paths, cfg.small_leaf_floats)
        res = run_interleaved(cases, cfg.small_reps, cfg.warmup)
        rows.append(Row(group, f"load_memmap {n:,} leaves", "time", res[""], limit_name=f"map {n:,} files"))
        for folder in [*folders.values(), raw]:
            scratch.remove(folder)
        del leaves
        gc.collect()
    return rows


# -- the family: lazy stacks and tensorclasses ----------------------------------------------------
def family(cfg: Config, backends: list[Backend], scratch: Scratch, shm: Scratch | None = None) -> list[Row]:
    """memmap_ into a fresh folder and load_memmap of a lazy stack of n one-leaf members and of a
    tensorclass whose tensordict field holds n small leaves (n = the smallest small-leaf count).

    The target is "at least the TensorDict rows' ratios", so each row's rounds also measure the
    same n leaves as a plain TensorDict (100 sub-tds, as the small-leaf rows): a companion row
    "(same rounds)" whose ratio was measured in the same minutes, and so compares with it.
    """
    n = min(cfg.small_counts)
    store = shm if shm is not None else scratch
    where = "/dev/shm" if shm is not None else "--dir"
    payload = bytes(cfg.small_leaf_floats * 4)
    leaves = [torch.randn(cfg.small_leaf_floats) for _ in range(n)]
    classes: dict[str, Any] = {}

    def lazy(b: Backend) -> Any:
        stack = require(b.module, "LazyStackedTensorDict")
        return stack(*(b.TensorDict({"x": t}, batch_size=[]) for t in leaves), stack_dim=0)

    def tensorclass_of(b: Backend) -> Any:
        if b.name not in classes:
            decorate = require(b.module, "tensorclass")

            class Data:
                fields: Any

            Data.__annotations__ = {"fields": b.TensorDict}
            classes[b.name] = decorate(Data)
        return classes[b.name](fields=small_td(b, leaves, cfg.small_subtds), batch_size=[])

    def plain_of(b: Backend) -> Any:
        return small_td(b, leaves, cfg.small_subtds)

    def loader_of(b: Backend, kind: str) -> Any:
        if kind == "lazy":
            return require(b.module, "LazyStackedTensorDict").load_memmap
        if kind == "plain":
            return b.TensorDict.load_memmap
        return classes[b.name].load_memmap

    rows: list[Row] = []
    for kind, label, build, folders in (
        ("lazy", f"a lazy stack of {n:,} one-leaf members", lazy, n),
        (
            "tensorclass",
            f"a tensorclass of {n:,} leaves ({cfg.small_subtds} sub-tds)",
            tensorclass_of,
            cfg.small_subtds,
        ),
    ):

        def write_case(b: Backend, build: Callable[[Backend], Any] = build) -> Case:
            def case() -> float:
                obj = build(b)
                folder = store.fresh(b.name)
                t0 = time.perf_counter()
                obj.memmap_(folder)
                dt = time.perf_counter() - t0
                del obj
                store.remove(folder)
                return dt

            return case

        log(f"  family: memmap_ {label}")
        cases: dict[str, Case] = {b.name: write_case(b) for b in backends}
        cases.update({_PLAIN + b.name: write_case(b, plain_of) for b in backends})
        cases[LIMIT] = limits.create_files_case(store, n, folders, payload)
        res = run_interleaved(cases, cfg.small_reps, cfg.warmup, before=os.sync)
        mine, plain = _split_plain(res[""])
        rows.append(
            Row(
                "family",
                f"memmap_ {label} -> fresh folder on {where}",
                "time",
                mine,
                limit_name=f"create {n:,} files of {len(payload)} B in {folders:,} folders",
            )
        )
        rows.append(
            Row(
                "family",
                f"memmap_ a TensorDict of {n:,} leaves ({cfg.small_subtds} sub-tds) -> fresh folder on {where}"
                " (same rounds)",
                "time",
                plain,
                limit_name=f"create {n:,} files of {len(payload)} B in {folders:,} folders",
            )
        )

        log(f"  family: load_memmap {label}")
        saved: dict[str, str] = {}
        builders = [(b.name, b, build) for b in backends] + [(_PLAIN + b.name, b, plain_of) for b in backends]
        for name, b, make in builders:
            try:
                folder = store.fresh(f"{name}-saved".replace(" ", "-"))
                make(b).memmap_(folder)
                saved[name] = folder
            except Exception as e:  # the library lacks the container: its cell says why
                saved[name] = f"FAILED {type(e).__name__}: {e}"

        def load_case(b: Backend, kind: str = kind, saved: dict[str, str] = saved, name: str = "") -> Case:
            name = name or b.name

            def case() -> float:
                if saved[name].startswith("FAILED"):
                    raise UnsupportedError(saved[name])
                t0 = time.perf_counter()
                obj = loader_of(b, kind)(saved[name])
                dt = time.perf_counter() - t0
                del obj
                return dt

            return case

        raw = store.fresh("raw")
        paths = limits.make_small_files(raw, n, folders, payload)
        cases = {b.name: load_case(b) for b in backends}
        cases.update({_PLAIN + b.name: load_case(b, "plain", name=_PLAIN + b.name) for b in backends})
        cases[LIMIT] = limits.map_files_case(paths, cfg.small_leaf_floats)
        res = run_interleaved(cases, cfg.small_reps, cfg.warmup)
        mine, plain = _split_plain(res[""])
        rows.append(Row("family", f"load_memmap {label}", "time", mine, limit_name=f"map {n:,} files"))
        rows.append(
            Row(
                "family",
                f"load_memmap a TensorDict of {n:,} leaves ({cfg.small_subtds} sub-tds) (same rounds)",
                "time",
                plain,
                limit_name=f"map {n:,} files",
            )
        )
        for folder in [*(f for f in saved.values() if not f.startswith("FAILED")), raw]:
            store.remove(folder)
    return rows


_PLAIN = "TensorDict, "  # the cases of a family row's companion (a plain TensorDict in the same rounds)


def _split_plain(cells: dict[str, Cell]) -> tuple[dict[str, Cell], dict[str, Cell]]:
    """A family row's cells and its companion's (the limit in both)."""
    mine = {k: c for k, c in cells.items() if not k.startswith(_PLAIN)}
    plain = {k[len(_PLAIN) :]: c for k, c in cells.items() if k.startswith(_PLAIN)}
    if LIMIT in cells:
        plain[LIMIT] = cells[LIMIT]
    return mine, plain


def _slow_creation_note(limit: Cell | None, files: int) -> str | None:
    """A note when creating files cost far more than on a quiet file system during a row."""
    per_file = None if limit is None or limit.value is None else limit.value / files * 1e6
    if per_file is None or per_file <= _SLOW_CREATE_US:
        return None
    return (
        f"creating a file cost {per_file:.0f} µs during this row (5-15 µs on a quiet ext4 here): "
        "the file system's state, which every library pays alike, pulls this ratio toward 1"
    )


_SLOW_CREATE_US = 40.0


# -- refresh ------------------------------------------------------------------------------------
def refresh(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """memmap_refresh_ of a memory-mapped tensordict: nothing changed, and one entry added by
    another handle on the same folder (``make_memmap`` on a second memory-mapped tensordict)."""
    n = cfg.refresh_leaves
    group = "refresh"
    leaves = [torch.randn(cfg.small_leaf_floats) for _ in range(n)]
    state: dict[str, tuple[Any, Any, str]] = {}
    added = {b.name: 0 for b in backends}

    def setup(b: Backend) -> tuple[Any, Any, str]:
        if b.name not in state:
            require(b.TensorDict, "memmap_refresh_")
            folder = scratch.fresh(b.name)
            td = small_td(b, leaves, cfg.small_subtds).memmap_(folder)
            writer = b.TensorDict.load_memmap(folder)
            writer.memmap_(folder)
            state[b.name] = (td, writer, folder)
        return state[b.name]

    def noop_case(b: Backend) -> Case:
        def case() -> float:
            td, _, _ = setup(b)
            t0 = time.perf_counter()
            td.memmap_refresh_()
            dt = time.perf_counter() - t0
            if dt < 1e-3:  # a fast no-op: the mean of 1,000 calls, as the limit's stat() is measured
                t0 = time.perf_counter()
                for _ in range(1000):
                    td.memmap_refresh_()
                dt = (time.perf_counter() - t0) / 1000
            return dt

        return case

    def added_case(b: Backend) -> Case:
        def case() -> float:
            td, writer, _ = setup(b)
            key = f"added{added[b.name]}"
            added[b.name] += 1
            require(writer, "make_memmap")(key, (cfg.small_leaf_floats,))
            t0 = time.perf_counter()
            td.memmap_refresh_()
            dt = time.perf_counter() - t0
            if key not in td.keys():
                raise RuntimeError(f"memmap_refresh_ did not pick up {key!r}")
            return dt

        return case

    raw = scratch.fresh("raw")
    paths = limits.make_small_files(raw, 1, 1, bytes(cfg.small_leaf_floats * 4))
    meta = os.path.join(raw, "meta.json")
    with open(meta, "w") as f:
        json.dump({f"x{i}": {"shape": [cfg.small_leaf_floats], "dtype": "torch.float32"} for i in range(n)}, f)

    log(f"  {group}: no-op memmap_refresh_")
    cases: dict[str, Case] = {b.name: noop_case(b) for b in backends}
    cases[LIMIT] = limits.stat_case(meta)
    res = run_interleaved(cases, cfg.reps, cfg.warmup)
    rows = [Row(group, f"memmap_refresh_ {n:,} leaves, nothing changed", "time", res[""], limit_name="one stat()")]

    log(f"  {group}: memmap_refresh_ after one entry added")
    cases = {b.name: added_case(b) for b in backends}
    cases[LIMIT] = limits.stat_parse_map_case(meta, paths[0], cfg.small_leaf_floats)
    res = run_interleaved(cases, cfg.reps, cfg.warmup)
    rows.append(
        Row(
            group,
            f"memmap_refresh_ {n:,} leaves, one entry added elsewhere",
            "time",
            res[""],
            limit_name=f"stat + parse {n:,}-entry JSON + map 1 file",
        )
    )
    rows.append(_wakeup_row(cfg, backends, scratch))
    for _, _, folder in state.values():
        scratch.remove(folder)
    state.clear()
    scratch.remove(raw)
    return rows


def _wakeup_row(cfg: Config, backends: list[Backend], scratch: Scratch) -> Row:
    """How long after a commit a process blocked in ``SharedRegistry.wait_for_change`` wakes up.

    tensordict has no way to wait for another process's commit (a reader polls
    ``memmap_refresh_``); the limit is a process blocked in ``read()`` on a pipe.  Both waiters
    run at once and take turns round by round (the order alternating), three times the
    repetitions of the other rows: a wake-up on this machine moves by 3-5x from one moment to
    the next (10-150 µs), so rounds apart would measure the moments.
    """
    log("  refresh: wake-up of a process waiting for a commit")
    rounds = 3 * cfg.reps + cfg.warmup
    ctx = mp.get_context("fork")
    cells: dict[str, Cell] = {}
    wakers: dict[str, Callable[[], float]] = {}
    procs: list[Any] = []
    folders: list[str] = []
    for b in backends:
        if not hasattr(b.module, "SharedRegistry"):
            cells[b.name] = Cell(error="n/a")
            continue
        folder = scratch.fresh(f"wake-{b.name}")
        folders.append(folder)
        b.TensorDict({"a": torch.zeros(2)}, batch_size=[2]).memmap_(folder)
        registry = b.module.SharedRegistry.for_path(folder)
        here, there = ctx.Pipe()
        proc = ctx.Process(target=_workers.registry_waiter, args=(b.module, folder, rounds, there))
        proc.start()
        procs.append(proc)
        here.recv()

        def commit(registry: Any = registry, here: Any = here) -> float:
            with registry.lock():
                t0 = time.perf_counter()
                registry.bump()
            return float(here.recv() - t0)

        wakers[b.name] = commit
    r, w = os.pipe()
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_workers.pipe_waiter, args=(r, rounds, there))
    proc.start()
    procs.append(proc)
    here.recv()

    def write(here: Any = here) -> float:
        t0 = time.perf_counter()
        os.write(w, b"x")
        return float(here.recv() - t0)

    wakers[LIMIT] = write
    values: dict[str, list[float]] = {name: [] for name in wakers}
    for i in range(rounds):
        for name in list(wakers)[:: 1 if i % 2 else -1]:
            time.sleep(0.02)  # let the waiter block in the kernel again
            values[name].append(wakers[name]())
    for proc in procs:
        proc.join(30)
    os.close(r)
    os.close(w)
    for name, v in values.items():
        cells[name] = Cell(values=v[cfg.warmup :])
    for folder in folders:
        scratch.remove(folder)
    return Row(
        "refresh",
        "wait_for_change: wake-up after a commit in another process",
        "time",
        cells,
        limit_name="wake from read() on a pipe",
    )


# -- make_memmap* -------------------------------------------------------------------------------
FLOOR = "floor"  # a second limit, taking turns with the rest: the floor of a mapped, locked addition


def make_memmap(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """make_memmap / make_memmap_from_tensor of many entries, one by one, into a memory-mapped
    tensordict (the entries land in its folder)."""
    n = cfg.make_entries
    group = "make_memmap"
    src = [torch.randn(cfg.small_leaf_floats) for _ in range(n)]
    rows: list[Row] = []

    def case_for(b: Backend, method: str) -> Case:
        def case() -> float:
            require(b.TensorDict, method)
            folder = scratch.fresh(b.name)
            td = b.TensorDict({}, batch_size=[]).memmap_(folder)
            make = require(td, method)
            t0 = time.perf_counter()
            if method == "make_memmap":
                for i in range(n):
                    make(f"k{i}", (cfg.small_leaf_floats,))
            else:
                for i in range(n):
                    make(f"k{i}", src[i])
            dt = time.perf_counter() - t0
            if len(list(td.keys())) != n:
                raise RuntimeError(f"{method} left {len(list(td.keys()))} entries, not {n}")
            del td, make
            scratch.remove(folder)
            return dt

        return case

    # the raw limit: per entry, create + write one file and append its line to an index
    entry = {"device": "cpu", "shape": [cfg.small_leaf_floats], "dtype": "torch.float32", "is_nested": False}
    lines = [(json.dumps({f"k{i}": entry}) + "\n").encode() for i in range(n)]
    for method in ("make_memmap", "make_memmap_from_tensor"):
        log(f"  {group}: {method} x {n}")
        cases: dict[str, Case] = {b.name: case_for(b, method) for b in backends}
        payload = bytes(cfg.small_leaf_floats * 4)
        cases[LIMIT] = limits.create_indexed_files_case(scratch, payload, lines)
        cases[FLOOR] = limits.create_mapped_indexed_files_case(scratch, payload, lines)
        res = run_interleaved(cases, cfg.reps, cfg.warmup)
        floor = res[""].pop(FLOOR)
        rows.append(
            Row(
                group,
                f"{method} of {n:,} entries, one by one",
                "time",
                res[""],
                per=n,
                limit_name=f"create {n:,} files + append {n:,} index lines",
            )
        )
        rows.append(  # the same measurements, against the floor of an addition that maps and locks
            Row(
                group,
                f"{method} of {n:,} entries, one by one, against a mapped addition under a lock",
                "time",
                {**res[""], LIMIT: floor},
                per=n,
                limit_name=f"lock + create + write + map + append + unlock, {n:,} times",
            )
        )
    rows.append(_from_storage_row(cfg, backends, scratch))
    rows.extend(_flatness_rows(cfg, backends, scratch))
    return rows


def _flatness_rows(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """Whether an addition costs the same however many entries the level holds: 10 x n entries one
    by one into one level and into 100 levels, timed per 100; tdshare only (tensordict's cost grows
    with the level, 10 x n additions would take minutes). Rows: the time per entry of the second
    hundred and of the last hundred."""
    n = max(10 * cfg.make_entries, 200)  # at least two hundreds
    ours = [b for b in backends if hasattr(b.module, "compact_metadata")]
    rows: list[Row] = []
    for levels in (1, 100):
        early: list[float] = []
        late: list[float] = []
        for rep in range(cfg.reps + cfg.warmup):
            for b in ours:
                folder = scratch.fresh(b.name)
                subs = {f"s{j}": b.TensorDict({}, batch_size=[]) for j in range(levels)} if levels > 1 else {}
                td = b.TensorDict(subs, batch_size=[]).memmap_(folder)
                batches = []
                for start in range(0, n, 100):
                    t0 = time.perf_counter()
                    for i in range(start, start + 100):
                        td.make_memmap((f"s{i % levels}", f"k{i}") if levels > 1 else f"k{i}", (cfg.small_leaf_floats,))
                    batches.append((time.perf_counter() - t0) / 100)
                if rep >= cfg.warmup:
                    early.append(batches[1])
                    late.append(batches[-1])
                del td
                scratch.remove(folder)
        where = "one level" if levels == 1 else f"{levels} levels"
        for label, values in (("entries 101-200", early), (f"entries {n - 99:,}-{n:,}", late)):
            cells = {b.name: Cell(values=values) for b in ours}
            cells.update({b.name: Cell(error="not run") for b in backends if b not in ours})
            rows.append(
                Row("make_memmap", f"make_memmap of {n:,} entries into {where}: each of {label}", "time", cells)
            )
    return rows


def _from_storage_row(cfg: Config, backends: list[Backend], scratch: Scratch) -> Row:
    """make_memmap_from_storage of n entries whose files exist already (written untimed); the
    limit is one stat() per file."""
    n = cfg.make_entries
    payload = bytes(cfg.small_leaf_floats * 4)

    def case_for(b: Backend) -> Case:
        def case() -> float:
            require(b.TensorDict, "make_memmap_from_storage")
            folder = scratch.fresh(b.name)
            td = b.TensorDict({}, batch_size=[]).memmap_(folder)
            storages = []
            for i in range(n):
                path = os.path.join(folder, f"k{i}.memmap")
                with open(path, "wb") as f:
                    f.write(payload)
                storages.append(torch.UntypedStorage.from_file(path, shared=True, nbytes=len(payload)))
            make = require(td, "make_memmap_from_storage")
            t0 = time.perf_counter()
            for i in range(n):
                make(f"k{i}", storages[i], (cfg.small_leaf_floats,), dtype=torch.float32)
            dt = time.perf_counter() - t0
            if len(list(td.keys())) != n:
                raise RuntimeError(f"make_memmap_from_storage left {len(list(td.keys()))} entries, not {n}")
            del td, make, storages
            scratch.remove(folder)
            return dt

        return case

    raw = scratch.fresh("raw-storage")
    paths = limits.make_small_files(raw, n, 1, payload)

    def stat_all() -> float:
        t0 = time.perf_counter()
        for p in paths:
            os.stat(p)
        return time.perf_counter() - t0

    log(f"  make_memmap: make_memmap_from_storage x {n}")
    cases: dict[str, Case] = {b.name: case_for(b) for b in backends}
    cases[LIMIT] = stat_all
    res = run_interleaved(cases, cfg.reps, cfg.warmup)
    scratch.remove(raw)
    return Row(
        "make_memmap",
        f"make_memmap_from_storage of {n:,} entries (the files exist), one by one",
        "time",
        res[""],
        per=n,
        limit_name=f"stat {n:,} files",
    )


# -- hand-off to another process ------------------------------------------------------------------
def handoff(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """Pickled size of memory-mapped tensordicts, load cost against payload size, and the time
    to hand one to a spawned worker until the worker has read one value."""
    group = "hand-off"
    rows: list[Row] = []
    n = cfg.pickle_leaves
    big = cfg.pickle_big_bytes
    big_label = f"{big >> 30} GiB" if big >= 1 << 30 else f"{big >> 20} MiB"
    leaves = [torch.randn(cfg.small_leaf_floats) for _ in range(n)]
    tds: dict[str, dict[str, Any]] = {"many": {}, "big": {}, "tiny": {}}
    paths: dict[tuple[str, str], str] = {}
    builders: dict[str, Callable[[Backend], Any]] = {
        "many": lambda b: small_td(b, leaves, cfg.small_subtds),
        # torch.empty: the pages were never touched, so the source costs no memory.
        "big": lambda b: b.TensorDict({"x": torch.empty(big // 4)}, batch_size=[]),
        "tiny": lambda b: b.TensorDict({"x": torch.zeros(cfg.small_leaf_floats)}, batch_size=[]),
    }
    log(f"  {group}: writing the tensordicts")
    for b in backends:
        for what, build in builders.items():
            folder = paths[what, b.name] = scratch.fresh(f"{b.name}-{what}")
            try:
                tds[what][b.name] = build(b).memmap_(folder)
            except Exception as e:
                _write_errors[folder] = e
        gc.collect()

    def size_case(b: Backend, what: str) -> Case:
        def case() -> float:
            _raise_if_failed({b.name: paths[what, b.name]}, b)
            return float(len(ForkingPickler.dumps(tds[what][b.name])))

        return case

    for what, label in (("many", f"{n:,} leaves"), ("big", f"one {big_label} leaf")):
        res = run_interleaved({b.name: size_case(b, what) for b in backends}, reps=1, warmup=0)
        rows.append(Row(group, f"pickled size of a memory-mapped td, {label} (bytes)", "bytes", res[""]))

    def open_case(b: Backend, what: str) -> Case:
        def case() -> float:
            folder = paths[what, b.name]
            _raise_if_failed({b.name: folder}, b)
            t0 = time.perf_counter()
            td = b.TensorDict.load_memmap(folder)
            dt = time.perf_counter() - t0
            del td
            return dt

        return case

    log(f"  {group}: load_memmap of a tiny and a big leaf")
    for what, label in (("tiny", f"one leaf of {cfg.small_leaf_floats * 4} B"), ("big", f"one leaf of {big_label}")):
        res = run_interleaved({b.name: open_case(b, what) for b in backends}, cfg.reps, cfg.warmup)
        rows.append(Row(group, f"load_memmap, {label} (open only)", "time", res[""]))

    ctx = mp.get_context("spawn")

    def spawn_case(b: Backend, what: str) -> Case:
        def case() -> float:
            _raise_if_failed({b.name: paths[what, b.name]}, b)
            td = tds[what][b.name]
            parent, child = ctx.Pipe(duplex=False)
            t0 = time.perf_counter()
            proc = ctx.Process(target=_workers.read_one, args=(td, child))
            proc.start()
            child.close()
            try:
                if not parent.poll(120):
                    raise TimeoutError("the worker did not answer in 120 s")
                parent.recv()
            except EOFError:
                raise RuntimeError(f"the worker died (exit code {proc.exitcode})") from None
            finally:
                dt = time.perf_counter() - t0
                proc.join(60)
                parent.close()
            return dt

        return case

    rows.extend(_live_handoff(cfg, backends, tds, paths, leaves))
    spawn_what = [("many", f"{n:,} leaves")] + ([("big", f"one {big_label} leaf")] if cfg.spawn_big_handoff else [])
    for what, label in spawn_what:
        log(f"  {group}: spawned worker receives a td with {label}")
        cases: dict[str, Case] = {b.name: spawn_case(b, what) for b in backends}
        cases[LIMIT] = limits.spawn_case()
        res = run_interleaved(cases, cfg.reps, cfg.spawn_warmup)
        rows.append(
            Row(
                group,
                f"spawn a worker with a memory-mapped td ({label}) until it reads one value",
                "time",
                res[""],
                limit_name="empty spawn",
            )
        )
    tds.clear()
    gc.collect()
    for folder in paths.values():
        scratch.remove(folder)
    return rows


def _live_handoff(
    cfg: Config,
    backends: list[Backend],
    tds: dict[str, dict[str, Any]],
    paths: dict[tuple[str, str], str],
    leaves: list[torch.Tensor],
) -> list[Row]:
    """Hand a memory-mapped td of many leaves (from a folder, and anonymous) to a live spawned
    worker through a queue, until the worker has read one value; the limit is the same round
    trip of a small message."""
    group = "hand-off"
    ctx = mp.get_context("spawn")
    n = cfg.pickle_leaves
    rows: list[Row] = []
    anon: dict[str, Any] = {}
    for b in backends:
        try:
            anon[b.name] = small_td(b, leaves, cfg.small_subtds).memmap_(None)
        except Exception as e:  # a library without anonymous memory maps
            anon[b.name] = e
    inbox, (here, there) = ctx.Queue(), ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_workers.live_reader, args=(inbox, there))
    proc.start()
    there.close()
    if not here.poll(120):
        raise TimeoutError("the live worker did not start in 120 s")
    here.recv()

    def round_trip(obj: Any) -> float:
        t0 = time.perf_counter()
        inbox.put(obj)
        if not here.poll(60):
            raise TimeoutError("the live worker did not answer in 60 s")
        here.recv()
        dt = time.perf_counter() - t0
        if not here.poll(60) or here.recv() != "idle":  # untimed: the worker has dropped what it got
            raise TimeoutError("the live worker did not become idle in 60 s")
        return dt

    def case_for(b: Backend, where: str) -> Case:
        def case() -> float:
            if where == "folder":
                _raise_if_failed({b.name: paths["many", b.name]}, b)
                return round_trip(tds["many"][b.name])
            td = anon[b.name]
            if isinstance(td, Exception):
                raise td
            return round_trip(td)

        return case

    for where in ("folder", "anonymous"):
        log(f"  {group}: a live worker receives a td with {n:,} leaves ({where})")
        cases: dict[str, Case] = {b.name: case_for(b, where) for b in backends}
        cases[LIMIT] = lambda: round_trip(b"x")
        # Before each case (untimed), after this process's clean-up of the case before (a
        # collection after tensordict's 1,000 storages, the round's full collection: tens to
        # hundreds of ms, while the worker sleeps), a small message wakes the worker, so that
        # every case starts from a worker that has just run, as in a loop of hand-offs.
        res = run_interleaved(cases, cfg.reps, cfg.warmup, before=lambda: round_trip(b"x"))
        rows.append(
            Row(
                group,
                f"hand a memory-mapped td ({n:,} leaves, {where}) to a live worker until it reads one value",
                "time",
                res[""],
                limit_name="queue round trip of a small message",
            )
        )
    inbox.put(None)
    proc.join(60)
    anon.clear()
    return rows


def handoff_live(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """Only the hand-off group's two live-worker rows (a folder, anonymous memory): the group's
    spawned rows take minutes, these seconds (``--only handoff-live``)."""
    leaves = [torch.randn(cfg.small_leaf_floats) for _ in range(cfg.pickle_leaves)]
    tds: dict[str, dict[str, Any]] = {"many": {}}
    paths: dict[tuple[str, str], str] = {}
    log("  hand-off: writing the tensordicts")
    for b in backends:
        folder = paths["many", b.name] = scratch.fresh(f"{b.name}-many")
        try:
            tds["many"][b.name] = small_td(b, leaves, cfg.small_subtds).memmap_(folder)
        except Exception as e:
            _write_errors[folder] = e
    gc.collect()
    rows = _live_handoff(cfg, backends, tds, paths, leaves)
    tds.clear()
    gc.collect()
    for folder in paths.values():
        scratch.remove(folder)
    return rows


# -- .tdz archives --------------------------------------------------------------------------------
def tdz(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """Save a tensordict as a ``.tdz`` archive, open it, and sum every leaf: stored and deflated; then
    open stored archives of many small leaves (each library its own archive; no payload is read)."""
    import zipfile

    rows: list[Row] = []
    for compression, nbytes in ((None, cfg.tdz_stored_bytes), ("deflate", cfg.tdz_deflated_bytes)):
        kind = "stored" if compression is None else "deflated"
        group = f".tdz {kind}"
        size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
        src = [torch.randn(nbytes // 16) for _ in range(4)]

        def case_for(b: Backend, compression: str | None = compression, src: list[torch.Tensor] = src) -> Case:
            def case() -> dict[str, float]:
                td = b.TensorDict({f"x{i}": t for i, t in enumerate(src)}, batch_size=[])
                path = scratch.fresh(b.name, ".tdz")
                try:
                    t0 = time.perf_counter()
                    out = td.save(path) if compression is None else td.save(path, compression=compression)
                    t1 = time.perf_counter()
                    del out
                    if not os.path.isfile(path):  # a folder named *.tdz: no archive support
                        raise UnsupportedError("save(*.tdz) did not write an archive")
                    t2 = time.perf_counter()
                    loaded = b.TensorDict.load_memmap(path)
                    t3 = time.perf_counter()
                    _sum_all(loaded)
                    t4 = time.perf_counter()
                    del loaded
                finally:
                    scratch.remove(path)
                return {"save": t1 - t0, "open": t3 - t2, "open+sum": t4 - t2}

            return case

        cases: dict[str, Case] = {b.name: case_for(b) for b in backends}
        raw = scratch.fresh("raw")
        limits.write_files(raw, src)
        if compression is None:
            write = limits.write_files_case(scratch, src, 1)
            map_sum = limits.map_sum_case(raw, [t.numel() for t in src])

            def raw_case(
                write: Callable[[], float] = write, map_sum: Callable[[], float] = map_sum
            ) -> dict[str, float]:
                return {"save": write(), "open+sum": map_sum()}

            cases[LIMIT] = raw_case
            limit_names = {"save": "write() 1 thread", "open+sum": "map + sum"}
        else:
            blobs = [limits.tensor_bytes(t).tobytes() for t in src]
            packed = [zlib.compress(x, 6) for x in blobs]

            def zlib_case(blobs: list[bytes] = blobs, packed: list[bytes] = packed) -> dict[str, float]:
                t0 = time.perf_counter()
                for x in blobs:
                    zlib.compress(x, 6)
                t1 = time.perf_counter()
                for x in packed:
                    zlib.decompress(x)
                t2 = time.perf_counter()
                return {"save": t1 - t0, "open+sum": t2 - t1}

            cases[LIMIT] = zlib_case
            limit_names = {"save": "zlib deflate -6, 1 thread", "open+sum": "zlib inflate, 1 thread"}
        log(f"  {group}: save / open / sum, {size}")
        res = run_interleaved(cases, cfg.reps, cfg.warmup)
        rows.append(
            Row(
                group,
                f"save {size} as .tdz ({kind})",
                "time",
                dict(res.get("save", {})),
                nbytes=nbytes,
                limit_name=limit_names["save"],
            )
        )
        rows.append(Row(group, f"open {size} .tdz ({kind})", "time", dict(res.get("open", {}))))
        rows.append(
            Row(
                group,
                f"open {size} .tdz ({kind}) + sum of every leaf",
                "time",
                dict(res.get("open+sum", {})),
                nbytes=nbytes,
                limit_name=limit_names["open+sum"],
            )
        )
        # A library that failed every repetition leaves no metric: show its reason in every row.
        for row in rows[-3:]:
            for name, cell in res.get("", {}).items():
                row.cells.setdefault(name, cell)
        scratch.remove(raw)
    for n in cfg.small_counts:
        group = f".tdz {n:,} small leaves"
        leaves = [torch.randn(cfg.small_leaf_floats) for _ in range(n)]
        paths: dict[str, str] = {}
        for b in backends:  # untimed setup; a failure shows in the cell (see _raise_if_failed)
            paths[b.name] = scratch.fresh(b.name, ".tdz")
            try:
                saved = small_td(b, leaves, cfg.small_subtds).save(paths[b.name])
                del saved
            except Exception as e:
                _write_errors[paths[b.name]] = e

        def list_case(path: str = paths[backends[0].name]) -> float:
            t0 = time.perf_counter()
            with zipfile.ZipFile(path) as z:
                z.infolist()
            return time.perf_counter() - t0

        cases = {b.name: _load_case(b, paths, archive=True) for b in backends}
        cases[LIMIT] = list_case
        log(f"  {group}: load_memmap")
        res = run_interleaved(cases, cfg.reps, cfg.warmup)
        rows.append(
            Row(
                group,
                f"open {n:,}-leaf .tdz ({cfg.small_subtds} sub-tds, stored)",
                "time",
                res[""],
                limit_name="zipfile: list the entries",
            )
        )
        for path in paths.values():
            scratch.remove(path)
        del leaves
        gc.collect()
    return rows


# -- DataLoader-like --------------------------------------------------------------------------------
def loader(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """Spawned workers gather batches of random rows from one memory-mapped tensordict.

    Every variant (each library, and plain mapped tensors as the limit) gets its own workers,
    spawned once; each repetition asks every worker of one variant for ``loader_batches``
    batches and times the whole round.  Peak RSS and PSS are read in the workers at the end.
    """
    group = "DataLoader-like"
    rows_n, w = cfg.loader_rows, cfg.loader_workers
    columns: dict[str, torch.Tensor] = {
        "obs": torch.randn(rows_n, 32),
        "action": torch.randint(0, 10, (rows_n,)),
        "reward": torch.randn(rows_n),
        "done": torch.zeros(rows_n, dtype=torch.bool),
        "next_obs": torch.randn(rows_n, 32),
    }
    folders: list[str] = []
    payloads: dict[str, tuple[Any, bool]] = {}
    errors: dict[str, str] = {}
    log(f"  {group}: writing {rows_n:,} rows")
    for b in backends:
        folder = scratch.fresh(b.name)
        folders.append(folder)
        try:
            td = b.TensorDict(
                {
                    "obs": columns["obs"],
                    "action": columns["action"],
                    "reward": columns["reward"],
                    "done": columns["done"],
                    "next": b.TensorDict({"obs": columns["next_obs"]}, batch_size=[rows_n]),
                },
                batch_size=[rows_n],
            )
            payloads[b.name] = (td.memmap_(folder), False)
        except Exception as e:
            errors[b.name] = type(e).__name__
    raw = scratch.fresh("raw")
    folders.append(raw)
    limits.write_files(raw, list(columns.values()))
    spec = [
        (name, os.path.join(raw, f"{i}.bin"), tuple(t.shape), str(t.dtype).split(".")[1])
        for i, (name, t) in enumerate(columns.items())
    ]
    payloads[LIMIT] = (spec, True)
    del columns

    ctx = mp.get_context("spawn")
    pools: dict[str, list[tuple[Any, Connection]]] = {}
    log(f"  {group}: spawning {w} workers per variant")
    for name, (payload, raw_flag) in payloads.items():
        pool = []
        for k in range(w):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_workers.loader_worker, args=(payload, raw_flag, cfg.loader_batch, k, child))
            proc.start()
            child.close()
            pool.append((proc, parent))
        pools[name] = pool

    def ask(name: str, msg: tuple[Any, ...]) -> list[Any]:
        for _, conn in pools[name]:
            conn.send(msg)
        out = []
        for proc, conn in pools[name]:
            if not conn.poll(300):
                raise TimeoutError("a worker did not answer in 300 s")
            try:
                out.append(conn.recv())
            except EOFError:
                raise RuntimeError(f"a worker died (exit code {proc.exitcode})") from None
        return out

    def ready(name: str) -> None:
        for proc, conn in pools[name]:
            if not conn.poll(300):
                raise TimeoutError("a worker did not start in 300 s")
            try:
                conn.recv()
            except EOFError:
                raise RuntimeError(f"a worker died while starting (exit code {proc.exitcode})") from None

    def run_case(name: str) -> Case:
        started = False

        def case() -> dict[str, float]:
            nonlocal started
            if not started:
                ready(name)
                started = True
            t0 = time.perf_counter()
            ask(name, ("run", cfg.loader_batches))
            return {"rate": w * cfg.loader_batches / (time.perf_counter() - t0)}

        return case

    order = [LIMIT, *[b.name for b in backends if b.name in pools]]
    cases: dict[str, Case] = {name: run_case(name) for name in order if name in pools}
    try:
        res = run_interleaved(cases, cfg.reps, cfg.warmup)
        mem: dict[str, dict[str, Any]] = {"rss": {}, "pss": {}}
        for name in cases:
            cell = res.get("rate", {}).get(name)
            if cell is not None and cell.error is not None:
                continue
            try:
                stats = ask(name, ("stats",))
            except Exception:
                continue
            mem["rss"][name] = [sum(s[0] for s in stats) / len(stats)]
            mem["pss"][name] = [sum(s[1] for s in stats) / len(stats)]
    finally:
        for pool in pools.values():
            for _, conn in pool:
                try:
                    conn.send(("exit",))
                except OSError:
                    pass
        for pool in pools.values():
            for proc, conn in pool:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
                conn.close()
        payloads.clear()
        gc.collect()
        for folder in folders:
            scratch.remove(folder)

    def cells(values: dict[str, list[float]]) -> dict[str, Cell]:
        out = {name: Cell(values=list(v)) for name, v in values.items()}
        for name, why in errors.items():
            out[name] = Cell(error=why)
        for name, cell in res.get("rate", {}).items():
            if cell.error is not None:
                out[name] = Cell(error=cell.error)
        return out

    rate_cells = dict(res.get("rate", {}))
    for name, why in errors.items():
        rate_cells[name] = Cell(error=why)
    label = f"{w} spawned workers, batches of {cfg.loader_batch} random rows of a {rows_n:,}-row td"
    return [
        Row(group, f"{label} (batches/s)", "rate", rate_cells, limit_name="plain mapped tensors"),
        Row(group, "peak RSS per worker (MiB)", "mib", cells(mem["rss"]), limit_name="plain mapped tensors"),
        Row(group, "PSS per worker at the end (MiB)", "mib", cells(mem["pss"]), limit_name="plain mapped tensors"),
    ]


# -- torch's DataLoader ---------------------------------------------------------------------------
def _dataloader_rows(cfg: Config) -> int:
    return {"full": 100_000, "quick": 20_000}.get(cfg.mode, 1_000)


def dataloader(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """``DataLoader(td, batch_size=256, num_workers=2)`` over a memory-mapped tensordict.

    One shuffled epoch per repetition, with persistent spawned workers (the warm-up epoch starts
    them); the collate is the DataLoader's default, so each library's own batch fetch
    (``__getitems__``) and collate entry are what is measured.  The limit is the same columns as
    plain mapped tensors in a map-style Dataset with ``__getitems__`` (one gather per column)
    and a collate that passes the batch on.
    """
    from torch.utils.data import DataLoader, RandomSampler

    group = "DataLoader"
    rows_n, w, batch = _dataloader_rows(cfg), cfg.loader_workers, cfg.loader_batch
    columns: dict[str, torch.Tensor] = {
        "obs": torch.randn(rows_n, 32),
        "action": torch.randint(0, 10, (rows_n,)),
        "reward": torch.randn(rows_n),
        "done": torch.zeros(rows_n, dtype=torch.bool),
        "next_obs": torch.randn(rows_n, 32),
    }
    folders: list[str] = []
    datasets: dict[str, tuple[Any, Any]] = {}
    errors: dict[str, str] = {}
    log(f"  {group}: writing {rows_n:,} rows")
    for b in backends:
        folder = scratch.fresh(b.name)
        folders.append(folder)
        try:
            td = b.TensorDict(
                {
                    "obs": columns["obs"],
                    "action": columns["action"],
                    "reward": columns["reward"],
                    "done": columns["done"],
                    "next": b.TensorDict({"obs": columns["next_obs"]}, batch_size=[rows_n]),
                },
                batch_size=[rows_n],
            )
            datasets[b.name] = (td.memmap_(folder), None)
        except Exception as e:
            errors[b.name] = type(e).__name__
    raw = scratch.fresh("raw")
    folders.append(raw)
    limits.write_files(raw, list(columns.values()))
    spec = [
        (name, os.path.join(raw, f"{i}.bin"), tuple(t.shape), str(t.dtype).split(".")[1])
        for i, (name, t) in enumerate(columns.items())
    ]
    datasets[LIMIT] = (_workers.MappedColumns(spec), _workers.identity)
    del columns
    loaders: dict[str, Any] = {}
    for name, (dataset, collate) in datasets.items():
        loaders[name] = DataLoader(
            dataset,
            batch_size=batch,
            sampler=RandomSampler(range(rows_n), generator=torch.Generator().manual_seed(0)),
            num_workers=w,
            multiprocessing_context="spawn",
            persistent_workers=True,
            collate_fn=collate,
        )

    def epoch(name: str) -> Case:
        loader = loaders[name]

        def case() -> dict[str, float]:
            n = 0
            it = iter(loader)  # persistent workers: started by the first epoch, reused after
            workers = [psutil.Process(p.pid) for p in getattr(loader._iterator, "_workers", [])]
            cpu0 = _cpu_seconds(workers)
            t0 = time.perf_counter()
            for got in it:
                if n == 0 and name != LIMIT and tuple(got.batch_size) != (batch,):
                    raise RuntimeError(f"{name}: a batch of batch size {tuple(got.batch_size)}, not ({batch},)")
                n += 1
            wall = time.perf_counter() - t0
            return {"rate": n / wall, "cpu": (_cpu_seconds(workers) - cpu0) / n}

        return case

    log(f"  {group}: one epoch of {-(-rows_n // batch):,} batches per repetition, {w} spawned workers each")
    try:
        res = run_interleaved(
            {name: epoch(name) for name in [LIMIT, *[b.name for b in backends]] if name in loaders},
            cfg.reps,
            max(cfg.warmup, 1),
        )
    finally:
        for loader in loaders.values():
            iterator = getattr(loader, "_iterator", None)
            if iterator is not None:
                iterator._shutdown_workers()  # persistent workers: end them now, not at exit
        loaders.clear()
        datasets.clear()
        gc.collect()
        for folder in folders:
            scratch.remove(folder)
    rows = []
    label = f"DataLoader(td, batch_size={batch}, num_workers={w}), {rows_n:,} mapped rows, one shuffled epoch"
    for metric, kind, what in (("rate", "rate", "batches/s"), ("cpu", "time", "CPU time per batch, main + workers")):
        cells = dict(res.get(metric, {}))
        for name, why in errors.items():
            cells[name] = Cell(error=why)
        limit_name = "plain mapped tensors, Dataset.__getitems__"
        rows.append(Row(group, f"{label} ({what})", kind, cells, limit_name=limit_name))
    return rows


def _cpu_seconds(workers: list[Any]) -> float:
    """User + system CPU seconds of this process (every thread) and of the ``workers`` (psutil processes)."""
    own = os.times()
    total = own.user + own.system
    for proc in workers:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


# -- consolidate ---------------------------------------------------------------------------------
def consolidate(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """``consolidate()`` of a tensordict of small leaves, and the pickle round trip it buys.

    The leaves are ``cfg.pickle_leaves`` leaves of 16 floats in 100 sub-tensordicts.  The pickle
    rows pickle and unpickle the consolidated tensordict (``pickle``, in memory); the limit is
    the same round trip of its buffer alone, a single ``uint8`` tensor.
    """
    group = "consolidate"
    n = cfg.pickle_leaves
    per = max(1, n // cfg.small_subtds)

    def source(b: Backend) -> Any:
        return b.TensorDict(
            {f"g{i}": {f"x{j}": torch.full((16,), float(j)) for j in range(per)} for i in range(cfg.small_subtds)},
            batch_size=[],
        )

    sources = {b.name: source(b) for b in backends}
    made: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for b in backends:
        try:
            made[b.name] = require(sources[b.name], "consolidate")()
        except Exception as e:
            made[b.name] = e
    buffer = torch.zeros(n * 64, dtype=torch.uint8)

    def make(name: str) -> Case:
        def case() -> float:
            fn = require(sources[name], "consolidate")
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

        return case

    def round_trip(obj: Any) -> Case:
        def case() -> float:
            if isinstance(obj, Exception):
                raise obj
            t0 = time.perf_counter()
            pickle.loads(pickle.dumps(obj))
            return time.perf_counter() - t0

        return case

    res_make = run_interleaved({b.name: make(b.name) for b in backends}, cfg.small_reps, cfg.warmup)
    cases = {LIMIT: round_trip(buffer), **{name: round_trip(obj) for name, obj in made.items()}}
    cases.update({f"{name} (not consolidated)": round_trip(td) for name, td in sources.items()})
    res_pickle = run_interleaved(cases, cfg.small_reps, cfg.warmup)[""]
    sizes: dict[str, Cell] = {}
    for name, obj in made.items():
        sizes[name] = (
            Cell(error=describe_error(obj)) if isinstance(obj, Exception) else Cell(values=[len(pickle.dumps(obj))])
        )
        plain[name] = res_pickle.get(f"{name} (not consolidated)")
    sizes[LIMIT] = Cell(values=[len(pickle.dumps(buffer))])
    rows = [
        Row(group, f"consolidate() of {n:,} leaves ({cfg.small_subtds} sub-tds)", "time", res_make[""]),
        Row(
            group,
            f"pickle.dumps + loads of the consolidated td, {n:,} leaves",
            "time",
            {k: v for k, v in res_pickle.items() if "(not" not in k},
            limit_name="the buffer alone",
        ),
        Row(
            group,
            f"pickled size of the consolidated td, {n:,} leaves (bytes)",
            "bytes",
            sizes,
            limit_name="the buffer alone",
        ),
    ]
    not_consolidated = {name: cell for name, cell in plain.items() if cell is not None}
    if not_consolidated:
        rows.append(
            Row(group, f"pickle.dumps + loads of the same td not consolidated, {n:,} leaves", "time", not_consolidated)
        )
    return rows


Group = Callable[..., list[Row]]

#: name -> (function, needs the /dev/shm scratch)
GROUPS: dict[str, tuple[Group, bool]] = {
    "big": (big_leaves, False),
    "small": (small_leaves, True),
    "family": (family, True),
    "refresh": (refresh, False),
    "make_memmap": (make_memmap, False),
    "handoff": (handoff, False),
    "tdz": (tdz, False),
    "loader": (loader, False),
    "dataloader": (dataloader, False),
    "consolidate": (consolidate, False),
    "map": (map_rows, False),
    "distributed": (distributed, False),
}

#: name -> (function, needs the /dev/shm scratch): parts of a group, run only when named in --only
EXTRA_GROUPS: dict[str, tuple[Group, bool]] = {
    "handoff-live": (handoff_live, False),
}
