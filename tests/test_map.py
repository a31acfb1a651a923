"""``map`` and ``map_iter`` (tdshare._map) under spawn, fork and forkserver, against tensordict 0.15.3;
and the in-place sharing paths that ``map`` relies on (unbind parts, sub-tensordicts, lazy stack
members, locked tensordicts sent through a pool)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import psutil
import pytest
import tensordict
import torch
from _kinds import KINDS, Sample, build
from tensordict.utils import _split_tensordict

from tdshare import (
    ArgumentTypeError,
    BatchSizeError,
    InvalidArgumentError,
    LazyStackedTensorDict,
    MemoryMappedTensor,
    NotSupportedError,
    TensorDict,
)
from tdshare._map import chunk_bounds

METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
WAIT = 60  # seconds any one wait on another process may take

pytestmark = pytest.mark.timeout(300)


# -- functions the workers run (module level: spawned workers import them) -----------------------
def add_one(chunk: Any) -> Any:
    return chunk.apply(lambda t: t + 1)


def add_ten_in_place(chunk: Any) -> None:
    chunk.apply_(lambda t: t + 10)  # into the chunk's own tensors (a lazy stack's: its members')


def where_am_i(chunk: Any) -> TensorDict:
    a = chunk["a"]
    mapped = isinstance(a, MemoryMappedTensor) and not a.is_anonymous
    return TensorDict(
        pid=torch.full(chunk.batch_size, os.getpid()),
        mapped=torch.full(chunk.batch_size, mapped),
        shared=torch.full(chunk.batch_size, bool(a.is_shared())),
        batch_size=chunk.batch_size,
    )


def draw(chunk: Any) -> TensorDict:
    return TensorDict(
        r=torch.randint(0, 1 << 30, chunk.batch_size),
        s=torch.as_tensor(np.random.randint(0, 1 << 30, tuple(chunk.batch_size))),
        batch_size=chunk.batch_size,
    )


def draw_reference(chunk: Any) -> tensordict.TensorDict:
    return tensordict.TensorDict(
        r=torch.randint(0, 1 << 30, chunk.batch_size),
        s=torch.as_tensor(np.random.randint(0, 1 << 30, tuple(chunk.batch_size))),
        batch_size=chunk.batch_size,
    )


def threads(chunk: Any) -> TensorDict:
    return TensorDict(n=torch.full(chunk.batch_size, torch.get_num_threads()), batch_size=chunk.batch_size)


def fails(chunk: Any) -> None:
    raise ValueError(f"fn failed on a chunk of {chunk.batch_size[0]} rows")


def tag_row(row: Any) -> Any:
    """Rows with an even ``a`` get an extra key, so the results differ in keys."""
    out = row.clone()
    if int(row["a"]) % 2 == 0:
        out["even"] = torch.ones(())
    return out


def select_a(chunk: Any) -> Any:
    return chunk.select("a")


def is_locked_and_shared(td: Any) -> tuple[bool, bool, bool, bool, str]:
    nested = td.get("n") if isinstance(td, TensorDict) else td._tensordict.get("n")
    return td.is_locked, nested.is_locked, td.is_memmap(), td.is_shared(), td["a"].filename


# -- helpers ------------------------------------------------------------------------------------
def reference_td(n: int) -> tensordict.TensorDict:
    return tensordict.TensorDict(a=torch.arange(n), batch_size=[n])


def same_values(ours: Any, theirs: Any) -> None:
    ours_td = ours._tensordict if isinstance(ours, Sample) else ours
    for key in theirs.keys(True, True):
        mine, ref = ours_td[key], theirs[key]
        if isinstance(ref, torch.Tensor):
            assert torch.equal(torch.as_tensor(mine), ref), key
        else:
            assert mine == ref, key


def children() -> set[int]:
    """Our live descendants, but for multiprocessing's long-lived helpers (forkserver, resource tracker).

    A forkserver's workers are its children and share its command line, so only our own direct
    children are told apart by it.
    """
    helpers = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.ppid() == os.getpid() and any(h in part for part in p.cmdline() for h in helpers):
                continue
            out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def torch_shm(pids: set[int]) -> set[str]:
    """The shared-memory files torch made in /dev/shm for these processes (it names them by pid)."""
    return {name for name in os.listdir("/dev/shm") if any(name.startswith(f"torch_{pid}_") for pid in pids)}


@pytest.fixture(scope="module", params=METHODS)
def pool(request: pytest.FixtureRequest) -> Iterator[Any]:
    # one torch thread in the workers: a forked child's OpenMP team, inherited mid-state from a parent
    # that ran parallel ops, hangs at its first parallel op (what map's own pools do too)
    with mp.get_context(request.param).Pool(2, torch.set_num_threads, (1,)) as p:
        yield p


@pytest.fixture(scope="module")
def ref_pool() -> Iterator[Any]:
    """A pool for tensordict's own map, to compare with."""
    with mp.get_context("fork").Pool(1, torch.set_num_threads, (1,)) as p:
        yield p


class SpyPool:
    """A pool that records the pickled size of every task it is handed (what the workers receive)."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.sizes = pool, []
        self._processes = 2

    def _record(self, tasks: Any) -> Iterator[Any]:
        for task in tasks:
            self.sizes.append(len(ForkingPickler.dumps(task)))
            yield task

    def imap(self, fn: Any, tasks: Any, chunksize: int = 1) -> Any:
        return self.pool.imap(fn, self._record(tasks), chunksize)

    def imap_unordered(self, fn: Any, tasks: Any, chunksize: int = 1) -> Any:
        return self.pool.imap_unordered(fn, self._record(tasks), chunksize)


# -- chunk boundaries and argument checks (no process) -------------------------------------------
@pytest.mark.parametrize("n", [1, 7, 10, 20])
@pytest.mark.parametrize(
    "chunksize,num_chunks,workers",
    [(None, None, 2), (None, None, 3), (None, 3, 2), (None, 4, 2), (None, 30, 2), (3, None, 2), (50, None, 2)],
)
def test_chunk_bounds_are_the_references(n: int, chunksize: int | None, num_chunks: int | None, workers: int) -> None:
    for lazy in (False, True):
        theirs = [len(c) for c in _split_tensordict(reference_td(n), chunksize, num_chunks, workers, 0, lazy)]
        ours = [b.stop - b.start for b in chunk_bounds(n, chunksize, num_chunks, workers)]  # type: ignore[union-attr]
        assert ours == theirs


def test_chunksize_zero_gives_rows() -> None:
    assert chunk_bounds(4, 0, None, 2) == [0, 1, 2, 3]
    assert [c.batch_size for c in _split_tensordict(reference_td(4), 0, None, 2, 0)] == [torch.Size([])] * 4


def test_bad_arguments_are_refused_before_any_process() -> None:
    td = build("tensordict")
    before = children()
    with pytest.raises(ValueError, match=r"but not both"):
        td.map(add_one, chunksize=2, num_chunks=2)
    with pytest.raises(InvalidArgumentError, match=r"chunksize must be an int >= 0"):
        td.map(add_one, chunksize=-1)
    with pytest.raises(InvalidArgumentError, match=r"num_chunks must be an int of at least 1"):
        td.map(add_one, num_chunks=0)
    with pytest.raises(IndexError, match=r"out of range"):
        td.map(add_one, dim=1)
    with pytest.raises(ArgumentTypeError, match=r"fn must be callable"):
        td.map("add_one")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"mp_start_method must be one of"):
        td.map(add_one, mp_start_method="thread")
    with pytest.raises(InvalidArgumentError, match=r"num_workers must be an int of at least 1"):
        td.map(add_one, num_workers=0)
    with pytest.raises(InvalidArgumentError, match=r"max_tasks_per_child"):
        td.map(add_one, max_tasks_per_child=0)
    with pytest.raises(ArgumentTypeError, match=r"generator must be a torch.Generator"):
        td.map(add_one, generator=0)  # type: ignore[arg-type]
    with pytest.raises(BatchSizeError, match=r"needs 4 rows"):
        td.map(add_one, out=TensorDict(a=torch.zeros(3), batch_size=[3]).memmap_())
    with pytest.raises(RuntimeError, match=r"index_with_generator"):
        td.map_iter(add_one, shuffle=True, index_with_generator=False)  # refused at the call, not at next()
    with pytest.raises(NotSupportedError):
        td.map_iter(add_one, shuffle=True, index_with_generator=False)
    assert children() == before


def test_empty_dimension_maps_nothing() -> None:
    td = TensorDict(a=torch.zeros(0), batch_size=[0])
    assert td.map(add_one, num_workers=1) is None
    out = TensorDict(a=torch.zeros(0), batch_size=[0])
    assert td.map(add_one, num_workers=1, out=out) is out
    assert list(td.map_iter(add_one, num_workers=1)) == []


# -- with a given pool (one per start method, left open) --------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunksize,num_chunks", [(None, None), (None, 3), (3, None), (0, None)])
def test_map_values_over_every_kind(
    kind: str, chunksize: int | None, num_chunks: int | None, pool: Any, ref_pool: Any
) -> None:
    td = build(kind)
    out = td.map(add_one, pool=pool, chunksize=chunksize, num_chunks=num_chunks)
    expected = {"tensordict": TensorDict, "tensorclass": Sample, "lazy": (TensorDict, LazyStackedTensorDict)}[kind]
    assert isinstance(out, expected)
    assert out.batch_size == torch.Size([4])
    assert out["a"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert out["n", "b"].tolist() == [[1.0, 1.0]] * 4
    ref = tensordict.TensorDict(a=torch.arange(4.0), n={"b": torch.zeros(4, 2)}, s="text", batch_size=[4])
    theirs = ref.map(add_one, pool=ref_pool, chunksize=chunksize, num_chunks=num_chunks)
    same_values(out, theirs)
    assert pool.apply(os.getpid) > 0  # the pool is still open


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_map_along_other_dims(dim: int, pool: Any) -> None:
    td = TensorDict(a=torch.arange(24.0).reshape(4, 3, 2), batch_size=[4, 3])
    out = td.map(add_one, dim=dim, pool=pool, num_chunks=2)
    assert torch.equal(out["a"], td["a"] + 1)
    rows = td.map(add_one, dim=dim, pool=pool, chunksize=0)
    assert rows.batch_size == td.batch_size and torch.equal(rows["a"], td["a"] + 1)


@pytest.mark.parametrize("source", ["plain", "shared", "folder", "anonymous"])
def test_workers_get_handles_and_write_in_place(source: str, pool: Any, tmp_path: Any) -> None:
    n = 200_000
    td = TensorDict(a=torch.arange(float(n)), b=torch.zeros(n, 4), batch_size=[n])
    if source == "shared":
        td.share_memory_()
    elif source == "folder":
        td.memmap_(tmp_path / "td")
    elif source == "anonymous":
        td.memmap_()
    spy = SpyPool(pool)
    assert td.map(add_ten_in_place, pool=spy, num_chunks=4) is None
    assert torch.equal(td["a"], torch.arange(float(n)) + 10)  # the workers wrote into our memory
    assert len(spy.sizes) == 4 and max(spy.sizes) < 4096  # handles, not 800 KB of rows per chunk
    seen = td.map(where_am_i, pool=spy, num_chunks=2)
    assert seen["shared"].all() and bool(seen["mapped"].all()) is (source == "folder")


def test_lazy_stack_members_are_shared(pool: Any, tmp_path: Any) -> None:
    members = [TensorDict(a=torch.zeros(3), batch_size=[3]) for _ in range(4)]
    members[0].memmap_(tmp_path / "m0")
    ls = LazyStackedTensorDict(*members, stack_dim=0)
    ls.map(add_ten_in_place, pool=pool, chunksize=1)
    assert [m["a"].tolist() for m in members] == [[10.0] * 3] * 4


@pytest.mark.parametrize("chunksize", [0, 2])
@pytest.mark.parametrize("out_kind", ["folder", "anonymous", "shared", "plain"])
def test_out_is_filled(out_kind: str, chunksize: int, pool: Any, tmp_path: Any) -> None:
    td = TensorDict(a=torch.arange(10), b=torch.arange(10), batch_size=[10])
    out = TensorDict(a=torch.zeros(10, dtype=torch.int64), batch_size=[10])
    if out_kind == "folder":
        out.memmap_(tmp_path / "out")
    elif out_kind == "anonymous":
        out.memmap_()
    elif out_kind == "shared":
        out.share_memory_()
    assert td.map(select_a, pool=pool, chunksize=chunksize, out=out) is out
    assert out["a"].tolist() == list(range(10))
    if out_kind == "folder":
        assert TensorDict.load_memmap(tmp_path / "out")["a"].tolist() == list(range(10))


def test_rows_with_different_keys_give_a_lazy_stack(pool: Any) -> None:
    td = TensorDict(a=torch.arange(4), batch_size=[4])
    out = td.map(tag_row, pool=pool, chunksize=0)
    assert isinstance(out, LazyStackedTensorDict)
    assert ["even" in m.keys() for m in out.tensordicts] == [True, False, True, False]
    assert out["a"].tolist() == [0, 1, 2, 3]
    members = [TensorDict(a=torch.tensor(i), batch_size=[]) for i in range(2)]
    ls = LazyStackedTensorDict(*members)
    back = ls.map(add_one, pool=pool, chunksize=0)
    assert type(back) is TensorDict and back["a"].tolist() == [1, 2]


def test_exception_in_fn_raises_here_with_the_workers_traceback(pool: Any) -> None:
    td = build("tensordict")
    with pytest.raises(ValueError, match=r"fn failed on a chunk of 2 rows") as info:
        td.map(fails, pool=pool, num_chunks=2)
    cause = info.value.__cause__
    assert type(cause).__name__ == "RemoteTraceback" and "in fails" in str(cause)
    with pytest.raises(ValueError, match=r"fn failed"):
        list(td.map_iter(fails, pool=pool))
    assert pool.apply(os.getpid) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_map_iter_yields_in_order(kind: str, pool: Any) -> None:
    td = build(kind)
    got = [r["a"].tolist() for r in td.map_iter(add_one, pool=pool, chunksize=3)]
    assert got == [[1.0, 2.0, 3.0], [4.0]]
    rows = [float(r["a"]) for r in td.map_iter(add_one, pool=pool, chunksize=0)]
    assert rows == [1.0, 2.0, 3.0, 4.0]


def test_map_iter_shuffle_covers_every_row(pool: Any) -> None:
    td = TensorDict(a=torch.arange(100), batch_size=[100])
    torch.manual_seed(0)
    chunks = [r["a"] for r in td.map_iter(select_a, pool=pool, shuffle=True, chunksize=10)]
    assert sorted(torch.cat(chunks).tolist()) == list(range(100))
    assert torch.cat(chunks).tolist() != list(range(100))


def test_index_with_generator_gives_the_same_result(pool: Any) -> None:
    td = TensorDict(a=torch.arange(10), b=torch.arange(10), batch_size=[10])
    for kwargs in ({"chunksize": 0}, {"chunksize": 2}, {"num_chunks": 5}, {"num_chunks": 10}):
        eager = td.map(select_a, pool=pool, **kwargs)  # type: ignore[arg-type]
        lazy = td.map(select_a, pool=pool, index_with_generator=True, **kwargs)  # type: ignore[arg-type]
        assert eager["a"].tolist() == lazy["a"].tolist() == list(range(10))


# -- with a pool made for the call ---------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_own_pool_seeds_like_the_reference_and_leaves_no_worker(method: str, ref_pool: Any) -> None:
    td = TensorDict(a=torch.arange(6), batch_size=[6])
    before = children()
    ours = td.map(draw, num_workers=1, chunksize=1, generator=torch.Generator().manual_seed(3), mp_start_method=method)
    assert children() == before
    theirs = reference_td(6).map(
        draw_reference, num_workers=1, chunksize=1, generator=torch.Generator().manual_seed(3), mp_start_method="fork"
    )
    # one worker, numbered 0: torch seeded with base + 0, NumPy from (base, 0), both drawn alike
    assert ours["r"].tolist() == theirs["r"].tolist() and ours["s"].tolist() == theirs["s"].tolist()
    assert len(set(ours["r"].tolist())) == 6
    wanted = 1 if method == "fork" else 2  # OpenMP teams do not survive fork: keep forked workers at one thread
    with pytest.warns(FutureWarning, match=r"got no generator"):
        counts = td.map(threads, num_workers=2, worker_threads=wanted, mp_start_method=method)
    assert counts["n"].tolist() == [wanted] * 6
    assert children() == before


def test_replaced_workers_get_new_seeds() -> None:
    td = TensorDict(a=torch.arange(4), batch_size=[4])
    before = children()
    out = td.map(
        where_am_i,
        num_workers=2,
        chunksize=1,
        max_tasks_per_child=1,
        generator=torch.Generator(),
        mp_start_method="fork",
    )
    assert out["pid"].unique().numel() == 4  # each chunk in a fresh worker, and the call returned
    drawn = td.map(draw, num_workers=2, chunksize=1, max_tasks_per_child=1, generator=torch.Generator())
    assert drawn["r"].unique().numel() == 4
    assert children() == before


@pytest.mark.parametrize("method", METHODS)
def test_map_iter_left_early_leaves_no_worker(method: str) -> None:
    td = TensorDict(a=torch.arange(100), b=torch.zeros(100, 8), batch_size=[100])
    before = children()
    it = td.map_iter(add_one, num_workers=2, chunksize=1, generator=torch.Generator(), mp_start_method=method)
    first = next(it)
    assert first["a"].tolist() == [1]
    workers = children() - before
    assert len(workers) >= 2
    it.close()  # what breaking out of the loop and dropping the iterator does
    assert children() == before
    assert torch_shm({os.getpid(), *workers}) == set()  # descriptors only, nothing named left behind
    with pytest.raises(ValueError, match=r"fn failed"):
        td.map(fails, num_workers=2, generator=torch.Generator(), mp_start_method=method)
    assert children() == before


def test_pbar_runs_without_tqdm() -> None:
    td = TensorDict(a=torch.arange(4), batch_size=[4])
    out = td.map(add_one, num_workers=1, chunksize=1, pbar=True, generator=torch.Generator(), mp_start_method="fork")
    assert out["a"].tolist() == [1, 2, 3, 4]


# -- in-place sharing with child processes --------------------------------------------------
def _child_writes(part: Any, index: int, todo: Any, done: Any) -> None:
    for cmd in iter(todo.get, "stop"):
        if cmd == "read":
            done.put(part["b"].tolist())
        elif cmd == "set_":
            part.set_("a", torch.full((2,), float(index)))
            done.put("ok")
        elif cmd == "update_":
            part.update_(TensorDict(a=part["a"] + 1, batch_size=part.batch_size))
            done.put("ok")
        elif cmd == "setitem":
            part[0] = TensorDict(a=torch.full((2,), -1.0), b=torch.full((1,), 5.0), batch_size=[])
            done.put("ok")


def _shared(td_type: str) -> Any:
    td = TensorDict(a=torch.zeros(2, 2, 2), b=torch.zeros(2, 2, 1), batch_size=[2, 2])
    if td_type == "shared":
        return td.share_memory_()
    if td_type == "memmap":
        return td.memmap_()
    members = [td[0].clone(), td[1].clone()]
    for m in members:
        m.memmap_() if td_type == "memmap_stack" else m.share_memory_()
    return TensorDict.lazy_stack(members, 0)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("td_type", ["shared", "memmap", "shared_stack", "memmap_stack"])
@pytest.mark.parametrize("view", ["unbind", "subtd", "index"])
def test_children_write_through_views(method: str, td_type: str, view: str) -> None:
    td = _shared(td_type)
    parts = (
        td.unbind(0)
        if view == "unbind"
        else [td._get_sub_tensordict(i) for i in range(2)]
        if view == "subtd"
        else [td[i] for i in range(2)]
    )
    ctx = mp.get_context(method)
    queues = [(ctx.Queue(), ctx.Queue()) for _ in range(2)]
    procs = [ctx.Process(target=_child_writes, args=(parts[i], i, *queues[i])) for i in range(2)]
    for p in procs:
        p.start()
    try:

        def ask(cmd: str) -> list[Any]:
            for todo, _ in queues:
                todo.put(cmd)
            return [done.get(timeout=WAIT) for _, done in queues]

        td.set_("b", torch.full((2, 2, 1), 3.0))  # parent -> children
        assert ask("read") == [[[3.0], [3.0]]] * 2
        assert ask("set_") == ["ok", "ok"]  # children -> parent
        assert td["a"][:, :, 0].tolist() == [[0.0, 0.0], [1.0, 1.0]]
        assert ask("update_") == ["ok", "ok"]
        assert td["a"][:, :, 0].tolist() == [[1.0, 1.0], [2.0, 2.0]]
        assert ask("setitem") == ["ok", "ok"]
        assert td["a"][:, 0].tolist() == [[-1.0, -1.0]] * 2 and td["b"][:, 0, 0].tolist() == [5.0, 5.0]
        for todo, _ in queues:
            todo.put("stop")
    finally:
        for p in procs:
            p.join(WAIT)
            if p.is_alive():
                p.terminate()
    assert [p.exitcode for p in procs] == [0, 0]


def test_sub_tensordict_refuses_copies() -> None:
    td = TensorDict(a=torch.zeros(4), batch_size=[4])
    with pytest.raises(NotSupportedError, match=r"give a view"):
        td._get_sub_tensordict(torch.tensor([0, 1]))
    sub = td._get_sub_tensordict(slice(1, 3))
    sub.set_("a", torch.ones(2))
    assert td["a"].tolist() == [0.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("where", ["folder", "anonymous"])
def test_locked_tensordict_through_a_pool_stays_locked_and_shared(where: str, pool: Any, tmp_path: Any) -> None:
    td = TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3)}, batch_size=[3])
    td.memmap_(tmp_path / "td" if where == "folder" else None)
    assert td.is_locked
    if where == "folder":
        locked, nested, memmap, shared, filename = pool.apply(is_locked_and_shared, (td,))
        assert (locked, nested, memmap, shared) == (True, True, True, False)  # memory-mapped, not shared memory
        assert filename == td["a"].filename
    else:
        assert pool.apply(_locked_flags, (td,)) == (True, True, True, False)
    sample = build("tensorclass").memmap_()
    assert pool.apply(_locked_flags, (sample,)) == (True, True, True, False)
    shared = TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3)}, batch_size=[3]).share_memory_()
    assert pool.apply(_locked_flags, (shared,)) == (True, True, False, True)
    assert pickle.loads(pickle.dumps(td) if where == "folder" else ForkingPickler.dumps(td)).is_locked


def _locked_flags(td: Any) -> tuple[bool, bool, bool, bool]:
    return td.is_locked, td.get("n").is_locked, td.is_memmap(), td.is_shared()


_NO_ARENA_SCRIPT = """
import torch, tdshare
def add_one(chunk):
    return chunk.apply(lambda t: t + 1)
if __name__ == "__main__":
    td = tdshare.TensorDict(x=torch.arange(8.0), batch_size=[8])
    out = td.map(add_one, num_workers=2, generator=torch.Generator(), max_tasks_per_child=1, chunksize=2)
    assert out["x"].tolist() == [float(i + 1) for i in range(8)], out["x"]
    print([line.split()[-2] for line in open("/proc/self/maps") if "/dev/shm/pym-" in line])
"""


@pytest.mark.timeout(120)
def test_a_pool_made_for_the_call_maps_no_shared_heap_into_the_caller(tmp_path: Any) -> None:
    # a ctx.Value (the old worker counter) maps a multiprocessing heap arena from /dev/shm into the
    # caller for the rest of its life; the worker numbers now travel through a queue
    import subprocess
    import sys

    script = tmp_path / "map_no_arena.py"
    script.write_text(_NO_ARENA_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
