"""Reliability suites, continued (issue 18): concurrency, create-or-attach, resource limits, soak,
and pickles that run only when allowed.

Quick settings run in CI; ``TDSHARE_LONG_TESTS=1`` runs longer ones.  Processes are synchronised
with events and queues (never sleeps) and every wait has a timeout.  Counts (reads checked,
racers, cycles) go to ``COUNTS``, printed at the end of the module (``-s`` shows it).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from _kinds import KINDS, Sample, build

import tdshare
from tdshare import TensorDict, open_memmap

pytestmark = pytest.mark.reliability

LONG = os.environ.get("TDSHARE_LONG_TESTS") == "1"
SCALE = 10 if LONG else 1
METHODS = ["spawn", "fork", "forkserver"]
COUNTS: Counter[str] = Counter()
WAIT = 120.0  # seconds any one wait may take before the test fails


def _procs(method: str, n: int) -> int:
    """``n`` processes, fewer under spawn in CI (each spawned child imports torch: seconds of CPU)."""
    return n if LONG or method != "spawn" else max(1, n // 2)


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    print(f"\nreliability suites (more): {dict(COUNTS)}")


def _ctx(method: str) -> Any:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "tdshare", "_kinds"])
    return ctx


def _join(procs: list[Any]) -> None:
    for p in procs:
        p.join(WAIT)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    assert [p.exitcode for p in procs] == [0] * len(procs), "a child failed (its traceback is on stderr)"


@contextmanager
def _reaped(procs: list[Any]) -> Iterator[None]:
    """Start ``procs``; on leaving, join them (they must exit 0), killing any still alive after a
    failure so that no child outlives its test."""
    for p in procs:
        p.start()
    ok = False
    try:
        yield
        ok = True
    finally:
        if ok:
            _join(procs)
        else:
            for p in procs:
                if p.is_alive():
                    p.kill()
                p.join(10)


def _results(queue: Any, n: int) -> list[Any]:
    out = [queue.get(timeout=WAIT) for _ in range(n)]
    errors = [r for r in out if isinstance(r, tuple) and r and r[0] == "error"]
    assert not errors, errors
    return out


def _guard(fn: Any, queue: Any, *args: Any) -> None:
    """Run ``fn(*args)`` in a child; its result (or its error, as text) goes to ``queue``."""
    try:
        queue.put(fn(*args))
    except BaseException as err:  # reported to the parent, which fails the test with it
        queue.put(("error", f"{type(err).__name__}: {err}"))
        raise


# -- concurrency: readers refreshing while a writer adds -------------------------------------------
def _entry(i: int) -> torch.Tensor:
    return torch.full((256,), float(i)) + torch.arange(256) * 1e-3  # a torn read shows as a mismatch


def _writer(path: str, n: int, go: Any) -> int:
    td = TensorDict.load_memmap(path).memmap_()
    assert go.wait(WAIT)
    for i in range(n):
        if i % 2:
            td.make_memmap_from_tensor(("n", f"e{i}"), _entry(i))
        else:
            td.make_memmap(f"e{i}", [256]).copy_(_entry(i))  # data written after the file exists
            td.memmap_refresh_()
    return -n  # the writer's result, told apart from the readers' counts by its sign


def _reader(path: str, n: int, ready: Any) -> int:
    td = TensorDict.load_memmap(path).memmap_()
    ready.set()
    checked, seen = 0, set()
    while len(seen) < n:
        td.memmap_refresh_()
        for key in td.keys(include_nested=True, leaves_only=True):
            name = key[-1] if isinstance(key, tuple) else key
            if not name.startswith("e"):
                continue
            i = int(name[1:])
            value = td.get(key).as_subclass(torch.Tensor).clone()  # one snapshot of the live mapping
            if i % 2:  # make_memmap_from_tensor: the data is in the file before the entry is committed
                assert torch.equal(value, _entry(i)), f"torn read of {key}"
            else:  # make_memmap: each element zero until the writer's copy_ reaches it, then its value
                assert ((value == _entry(i)) | (value == 0)).all(), f"torn read of {key}"
            seen.add(i)
            checked += 1
    return checked


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", METHODS)
def test_readers_refreshing_never_see_a_torn_entry(tmp_path: Path, method: str) -> None:
    ctx = _ctx(method)
    path = str(tmp_path / f"td-{uuid.uuid4().hex[:8]}")
    TensorDict(a=torch.zeros(3), n={"b": torch.ones(3)}, batch_size=[]).memmap_(path)
    n = 60 * SCALE
    readers = _procs(method, 2)
    queue, go, readies = ctx.Queue(), ctx.Event(), [ctx.Event() for _ in range(readers)]
    procs = [ctx.Process(target=_guard, args=(_reader, queue, path, n, r)) for r in readies]
    procs.append(ctx.Process(target=_guard, args=(_writer, queue, path, n, go)))
    with _reaped(procs):
        for r in readies:
            assert r.wait(WAIT), "a reader did not start"
        go.set()
        results = _results(queue, readers + 1)
    assert sorted(results)[0] == -n
    assert min(sorted(results)[1:]) >= n  # each reader checked every entry at least once
    COUNTS["concurrent reads checked"] += sum(results) + n
    loaded = TensorDict.load_memmap(path)
    for i in range(n):
        key = ("n", f"e{i}") if i % 2 else f"e{i}"
        assert torch.equal(loaded[key].as_subclass(torch.Tensor), _entry(i))


# -- concurrency: disjoint adders ------------------------------------------------------------------
def _adder(path: str, rank: int, k: int, go: Any) -> int:
    td = TensorDict.load_memmap(path).memmap_()
    assert go.wait(WAIT)
    for i in range(k):
        td.make_memmap_from_tensor(f"p{rank}_{i}", torch.full((4,), float(rank * 1000 + i)))
    return rank


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", METHODS)
def test_processes_adding_disjoint_entries_all_land(tmp_path: Path, method: str) -> None:
    ctx = _ctx(method)
    path = str(tmp_path / f"td-{uuid.uuid4().hex[:8]}")
    mine = TensorDict(a=torch.zeros(4), batch_size=[4]).memmap_(path)
    procs_n, k = _procs(method, 4), 25 * SCALE
    queue, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_guard, args=(_adder, queue, path, r, k, go)) for r in range(procs_n)]
    with _reaped(procs):
        go.set()
        assert sorted(_results(queue, procs_n)) == list(range(procs_n))
    mine.memmap_refresh_()
    for td in (mine, TensorDict.load_memmap(path)):
        assert len(list(td.keys())) == 1 + procs_n * k
        for r in range(procs_n):
            for i in range(k):
                assert td[f"p{r}_{i}"].tolist() == [float(r * 1000 + i)] * 4
    COUNTS["disjoint entries added"] += procs_n * k


# -- concurrency: saving the same prefix at once ---------------------------------------------------
def _version(j: int) -> TensorDict:
    """Version ``j`` of a tree: values, shapes and keys tell every version apart."""
    n = 2 + j % 3
    fields: dict[str, Any] = {"a": torch.full((n,), float(j)), "n": {"b": torch.full((n, 3), float(j))}}
    fields[f"only{j}"] = torch.arange(n) + j
    fields["s"] = f"version {j}"
    return TensorDict(fields, batch_size=[n])


def _same(got: TensorDict, want: TensorDict) -> bool:
    keys = sorted(map(str, want.keys(True, True)))
    if got.batch_size != want.batch_size or sorted(map(str, got.keys(True, True))) != keys:
        return False
    for key in want.keys(True, True):
        b = want.get(key)
        if isinstance(b, torch.Tensor):
            if not torch.equal(got.get(key).as_subclass(torch.Tensor), b):
                return False
        elif got[key] != want[key]:
            return False
    return True


def _saver(path: str, first: int, times: int, go: Any) -> int:
    assert go.wait(WAIT)
    for t in range(times):
        _version(first + t).memmap_(path, atomic=True, existsok=True)
    return first


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", METHODS)
def test_threads_and_processes_saving_one_prefix_end_with_one_version(tmp_path: Path, method: str) -> None:
    ctx = _ctx(method)
    path = str(tmp_path / f"td-{uuid.uuid4().hex[:8]}")
    times = 5 * SCALE
    queue, go = ctx.Queue(), ctx.Event()
    firsts = [100 * r for r in range(1, 1 + _procs(method, 3))]
    procs = [ctx.Process(target=_guard, args=(_saver, queue, path, f, times, go)) for f in firsts]
    errors: list[BaseException] = []

    def thread_saver(first: int) -> None:
        try:
            _saver(path, first, times, go)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=thread_saver, args=(f,)) for f in (1000, 2000)]
    with _reaped(procs):
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join(WAIT)
        assert not errors, errors
        _results(queue, len(procs))
    loaded = TensorDict.load_memmap(path)
    candidates = [f + t for f in [*firsts, 1000, 2000] for t in range(times)]
    assert sum(_same(loaded, _version(j)) for j in candidates) == 1  # exactly one whole version
    assert [n for n in os.listdir(tmp_path) if n.startswith(".tdtmp-") or n.endswith(".tmp")] == []
    COUNTS["concurrent atomic saves"] += (len(firsts) + 2) * times


# -- concurrency: a reader while a writer re-saves atomically ----------------------------------------
def _steady(j: int) -> TensorDict:
    """Version ``j`` with the same keys and shapes as every other: only the values tell them apart,
    so a load that mixed two versions' files would show."""
    return TensorDict(a=torch.full((4,), float(j)), n={"b": torch.full((4, 3), float(j))}, s=f"v{j}", batch_size=[4])


def _resaver(path: str, times: int, ready: Any) -> int:
    assert ready.wait(WAIT)
    for j in range(1, times + 1):
        _steady(j).memmap_(path, atomic=True, existsok=True)
    return times


def _read_whole(path: str) -> int | None:
    """Load and read every leaf; the version seen, or None when the folder was swapped after the
    load and before a leaf was first read (the documented "load the folder again")."""
    try:
        td = TensorDict.load_memmap(path)
        values = {str(k): td.get(k).as_subclass(torch.Tensor).clone() for k in (("a",), ("n", "b"))}
        label = td["s"]
    except tdshare.CorruptDataError as err:
        assert "load the folder again" in str(err) and path in str(err), err
        return None
    j = int(label[1:])
    for key, value in values.items():
        assert value.unique().tolist() == [float(j)], f"a load mixed versions: {label} but {key} holds {value.unique()}"
    return j


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", METHODS)
def test_reader_keeps_reading_while_a_writer_resaves_atomically(tmp_path: Path, method: str) -> None:
    ctx = _ctx(method)
    path = str(tmp_path / f"td-{uuid.uuid4().hex[:8]}")
    _steady(0).memmap_(path)
    times = 100 * SCALE
    queue, ready = ctx.Queue(), ctx.Event()
    writer = ctx.Process(target=_guard, args=(_resaver, queue, path, times, ready))
    with _reaped([writer]):
        ready.set()
        versions: list[int] = []
        retries = 0
        while not versions or versions[-1] != times:
            j = _read_whole(path)
            if j is None:
                retries += 1
            else:
                versions.append(j)
        assert queue.get(timeout=WAIT) == times
    assert versions == sorted(versions)  # each load sees the same or a later version
    assert len(versions) > retries  # most loads read the whole tree
    COUNTS["whole loads during atomic re-saves"] += len(versions)
    COUNTS["loads to retry during atomic re-saves"] += retries
    COUNTS["atomic re-saves under a reader"] += times


# -- create-or-attach ------------------------------------------------------------------------------
def _racer(path: str, kind: str, rank: int, go: Any, created: Any) -> tuple[int, str, str]:
    assert go.wait(WAIT)
    if os.path.isdir(path):  # what a racer can see of the folder: nothing, or a whole tree
        assert os.path.isfile(os.path.join(path, "meta.json")), "a half-made folder"

    def factory() -> Any:
        created.put(rank)
        return build(kind, offset=float(rank))

    got = open_memmap(path, factory)
    assert got.is_memmap() and got.is_locked
    return rank, type(got).__name__, repr(_fingerprint(got))


def _fingerprint(got: Any) -> list[Any]:
    """Every leaf's key and value, for any container kind."""
    if isinstance(got, tdshare.LazyStackedTensorDict):
        got = got.to_tensordict()
    elif not isinstance(got, TensorDict):
        got = got._tensordict  # a tensorclass
    out = []
    for k in sorted(got.keys(True, True), key=str):
        value = got.get(k)
        out.append((str(k), value.tolist() if isinstance(value, torch.Tensor) else got[k]))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", KINDS)
def test_one_of_32_racing_processes_creates(tmp_path: Path, kind: str) -> None:
    _race(tmp_path, kind, "fork", 32)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_create_or_attach_race_under_other_start_methods(tmp_path: Path, method: str) -> None:
    _race(tmp_path, "tensordict", method, _procs(method, 4) * SCALE)


def _race(tmp_path: Path, kind: str, method: str, n: int) -> None:
    ctx = _ctx(method)
    path = str(tmp_path / "deep" / f"td-{uuid.uuid4().hex[:8]}")
    queue, created, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_guard, args=(_racer, queue, path, kind, r, go, created)) for r in range(n)]
    with _reaped(procs):
        go.set()
        results = _results(queue, n)
    creator = created.get(timeout=WAIT)
    assert created.empty()  # exactly one process created
    assert {r[1] for r in results} == {type(build(kind)).__name__}
    assert {r[2] for r in results} == {repr(_fingerprint(build(kind, offset=float(creator))))}
    assert sorted(r[0] for r in results) == list(range(n))
    assert sorted(os.listdir(os.path.dirname(path))) == [os.path.basename(path)]  # no staging left
    COUNTS[f"create-or-attach racers ({method})"] += n


@pytest.mark.parametrize("kind", KINDS)
def test_open_memmap_attaches_to_an_existing_tree(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "t"
    build(kind, offset=5.0).memmap(path)
    calls: list[int] = []
    got = open_memmap(path, lambda: calls.append(1) or build(kind))
    assert calls == [] and got["a"].tolist() == [5.0, 6.0, 7.0, 8.0]
    assert isinstance(got, type(build(kind)))
    (got.tensordicts[0]["a"] if kind == "lazy" else got["a"][0]).fill_(-1.0)  # attached: writes reach the folder
    assert TensorDict.load_memmap(path)["a"][0] == -1.0
    if kind == "tensordict":  # additions too (a tensorclass adds only declared fields, a lazy stack per member)
        got.make_memmap("extra", [4]).fill_(2.0)
        assert TensorDict.load_memmap(path)["extra"].tolist() == [2.0] * 4
    again = TensorDict.open_memmap(path, build(kind))
    assert again["a"].tolist() == [-1.0, 6.0, 7.0, 8.0] and type(again) is type(got)


def test_open_memmap_creates_in_an_empty_folder_and_checks_arguments(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    got = open_memmap(tmp_path / "empty", build("tensordict"))
    assert got.saved_path == str(tmp_path / "empty") and got["s"] == "text"
    assert isinstance(open_memmap(tmp_path / "tc", build("tensorclass")), Sample)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(tdshare.MemmapError, match=r"no saved tensordict"):
        open_memmap(tmp_path / "other", build("tensordict"))
    assert os.listdir(tmp_path / "other") == ["notes.txt"]
    with pytest.raises(tdshare.ArgumentTypeError, match=r"like must be a tensor collection"):
        open_memmap(tmp_path / "x", {"a": torch.zeros(1)})
    with pytest.raises(tdshare.ArgumentTypeError, match=r"like\(\) must return a tensor collection"):
        open_memmap(tmp_path / "x", lambda: 3)
    with pytest.raises(tdshare.ArgumentTypeError, match=r"prefix must be a folder path"):
        open_memmap(3, build("tensordict"))  # type: ignore[arg-type]
    with pytest.raises(tdshare.InvalidArgumentError, match=r"timeout must be >= 0"):
        open_memmap(tmp_path / "x", build("tensordict"), timeout=-1)
    with pytest.raises(tdshare.InvalidArgumentError, match=r"archive"):
        open_memmap(tmp_path / "x.tdz", build("tensordict"))
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.tdz").exists()


def _holder(lock_path: str, held: Any, release: Any) -> None:
    with tdshare.SharedRegistry.for_directory(lock_path).lock():
        held.set()
        release.wait(WAIT)


def test_open_memmap_waits_on_the_lock_and_times_out(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    path = str(tmp_path / "t")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_holder, args=(path, held, release))
    with _reaped([holder]):
        try:
            assert held.wait(WAIT)
            with pytest.raises(TimeoutError, match=r"lock"):
                open_memmap(path, build("tensordict"), timeout=0.05)
            assert not os.path.exists(path)
        finally:
            release.set()
    assert open_memmap(path, build("tensordict"), timeout=WAIT)["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
