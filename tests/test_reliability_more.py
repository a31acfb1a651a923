"""Reliability suites, continued (issue 18): concurrency, create-or-attach, resource limits, soak,
and pickles that run only when allowed.

Quick settings run in CI; ``TDSHARE_LONG_TESTS=1`` runs longer ones.  Processes are synchronised
with events and queues (never sleeps) and every wait has a timeout.  Counts (reads checked,
racers, cycles) go to ``COUNTS``, printed at the end of the module (``-s`` shows it).
"""

from __future__ import annotations

import contextlib
import errno
import io
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import tempfile
import threading
import uuid
import warnings
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
from tdshare.__main__ import main as cli
from tdshare._fd_pass import unreleased

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


def _one_save(path: str, j: int) -> int:
    _version(j).memmap_(path, atomic=True, existsok=True)
    return j


@pytest.mark.timeout(120)
@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "in-place"])
def test_a_save_goes_on_when_a_kept_result_was_replaced_by_another_process(tmp_path: Path, atomic: bool) -> None:
    """This process keeps what its save returned (its leaves not read yet), another process
    re-saves the prefix (those leaves' files are gone), then this process saves again: that save
    must not fail because of the kept tensordict, whose bytes were lost whatever it does."""
    path = str(tmp_path / f"td-{uuid.uuid4().hex[:8]}")
    kept = _version(1).memmap_(path)
    ctx = _ctx("fork")
    queue = ctx.Queue()
    with _reaped([ctx.Process(target=_guard, args=(_one_save, queue, path, 2))]):
        assert _results(queue, 1) == [2]
    _version(3).memmap_(path, atomic=atomic, existsok=True)
    assert _same(TensorDict.load_memmap(path), _version(3))
    assert kept.is_memmap() and kept.batch_size == _version(1).batch_size  # kept as it was, unread
    COUNTS["saves past a replaced kept result"] += 1


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


def _swapper(path: str, staged: str, marked: Any, go: Any) -> str:
    """An atomic writer stopped between its mark and its swap: it holds the tree's lock, the file
    epoch odd, until ``go``; then it swaps the staged tree in and bumps, as a re-save does."""
    registry = tdshare.SharedRegistry.for_directory(path)
    with registry.lock():
        registry.mark_replacing()
        marked.set()
        assert go.wait(WAIT)
        from tdshare._files import exchange

        assert exchange(staged, path)
        registry.bump(files_replaced=True)
    return "swapped"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", METHODS)
def test_a_load_during_a_replacement_waits_for_it(tmp_path: Path, method: str) -> None:
    """A load that reads the registry after a writer marked its replacement and the metadata
    before its swap would map the new files found after the swap (before the bump: no epoch
    step to see) under the old metadata; it waits for the writer's lock and loads the new tree."""
    ctx = _ctx(method)
    path, staged = str(tmp_path / "td"), str(tmp_path / "staged")
    _steady(0).memmap_(path)
    _steady(1).memmap(staged)
    marked, go, queue = ctx.Event(), ctx.Event(), ctx.Queue()
    writer = ctx.Process(target=_guard, args=(_swapper, queue, path, staged, marked, go))
    seen: list[int | None] = []
    with _reaped([writer]):
        assert marked.wait(WAIT)
        reader = threading.Thread(target=lambda: seen.append(_read_whole_after(path, queue)))
        reader.start()
        go.set()
        reader.join(WAIT)
    assert seen == [1]  # the whole new tree, never v0's metadata with v1's leaves


def _read_whole_after(path: str, done: Any) -> int | None:
    """Load (perhaps across the swap), let the writer finish, then read every leaf."""
    td = TensorDict.load_memmap(path)
    assert done.get(timeout=WAIT) == "swapped"
    j = int(td["s"][1:])
    for key in (("a",), ("n", "b")):
        value = td.get(key).as_subclass(torch.Tensor)
        assert value.unique().tolist() == [float(j)], f"a load mixed versions: v{j} but {key} holds {value.unique()}"
    return j


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


# -- resource limits: 10,000 leaves under ulimit -n 1024 ---------------------------------------------
LEAVES = 10_000


def _wide() -> TensorDict:
    """10,000 leaves: 100 levels of 100, leaf (i, j) holding two copies of i * 100 + j."""
    groups = {f"g{i}": {f"k{j}": torch.full((2,), float(i * 100 + j)) for j in range(100)} for i in range(100)}
    return TensorDict(groups, batch_size=[])


def _total(td: Any) -> float:
    return sum(float(v.sum()) for v in td.values(include_nested=True, leaves_only=True))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _maps() -> int:
    with open("/proc/self/maps", "rb") as f:
        return sum(1 for _ in f)


def _limited(folder: str, archive: str, received: dict[str, Any]) -> dict[str, Any]:
    """In a spawned child under RLIMIT_NOFILE 1024: memmap, load and read 10,000-leaf trees, and
    read the trees the parent sent."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    want = 2.0 * sum(range(LEAVES))
    out: dict[str, Any] = {"limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}
    td = _wide()
    out["folder"] = _total(td.memmap(folder)) == want and _total(TensorDict.load_memmap(folder)) == want
    anon = td.memmap()
    out["anonymous"] = _total(anon) == want and _total(pickle.loads(pickle.dumps(anon))) == want
    td.save(archive)
    out["archive"] = _total(TensorDict.load_memmap(archive)) == want
    for name, got in received.items():
        out[f"received {name}"] = _total(got) == want
    received["anonymous"]["g0", "k0"][0] = -1.0  # shared memory: the parent sees it
    out["fds"] = _fds()
    return out


@pytest.mark.timeout(300)
def test_ten_thousand_leaves_under_ulimit_1024(tmp_path: Path) -> None:
    ctx = _ctx("spawn")
    td = _wide()
    sent = {
        "folder": td.memmap(tmp_path / "sent"),
        "anonymous": td.memmap(),
        "archive": (td.save(tmp_path / "sent.tdz"), TensorDict.load_memmap(tmp_path / "sent.tdz"))[1],
    }
    queue = ctx.Queue()
    child = ctx.Process(target=_guard, args=(_limited, queue, str(tmp_path / "f"), str(tmp_path / "a.tdz"), sent))
    with _reaped([child]):
        (result,) = _results(queue, 1)
    assert result.pop("limit") == 1024 and result.pop("fds") < 1024
    assert result == dict.fromkeys(
        ["folder", "anonymous", "archive", "received folder", "received anonymous", "received archive"], True
    )
    assert sent["anonymous"]["g0", "k0"].tolist() == [-1.0, 0.0]
    COUNTS["10k-leaf trees under ulimit -n 1024"] += 6


# -- resource limits: a full disk, a full /dev/shm -------------------------------------------------
@contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``where`` (root only: the test is skipped with the reason otherwise)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip(
            "a full file system needs a small tmpfs, and mounting one needs root (the injected ENOSPC tests run)"
        )
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=False).returncode:
        pytest.skip("this container cannot mount a tmpfs")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(folder: str) -> None:
    with open(os.path.join(folder, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def _attempts(calls: list[tuple[str, Any]]) -> dict[str, str]:
    out = {}
    for name, call in calls:
        try:
            call()
            out[name] = "no error"
        except OSError as err:
            out[name] = f"errno {err.errno}: {err}"
    return out


def _on_full_disk(mnt: str) -> dict[str, str]:
    td = TensorDict(a=torch.zeros(4), batch_size=[]).memmap_(os.path.join(mnt, "td"))
    big = torch.ones(200_000)  # 800,000 bytes, more than the whole file system
    return _attempts(
        [
            ("make_memmap", lambda: td.make_memmap("big", [200_000])),
            ("make_memmap_from_tensor", lambda: td.make_memmap_from_tensor("big", big)),
            ("save", lambda: TensorDict(b=big, batch_size=[]).save(os.path.join(mnt, "new"))),
            ("atomic", lambda: TensorDict(b=big, batch_size=[]).memmap_(os.path.join(mnt, "at"), atomic=True)),
            ("resave", lambda: TensorDict(a=big, batch_size=[]).save(os.path.join(mnt, "td"))),
            ("archive", lambda: TensorDict(b=big, batch_size=[]).save(os.path.join(mnt, "new.tdz"))),
            ("file", lambda: tdshare.MemoryMappedTensor.empty(200_000, filename=os.path.join(mnt, "x.memmap"))),
        ]
    )


def _on_full_runtime(runtime: str, folder: str) -> dict[str, str]:
    os.environ["XDG_RUNTIME_DIR"] = runtime  # where anonymous trees publish, as /dev/shm/tdshare-<uid>
    _fill(runtime)
    anon = TensorDict(a=torch.zeros(4), batch_size=[]).memmap_()
    out = _attempts(
        [
            ("anonymous make_memmap", lambda: anon.make_memmap("new", [4])),
            ("shared non-tensor", lambda: TensorDict(s="x", batch_size=[]).memmap_(share_non_tensor=True)),
        ]
    )
    td = TensorDict(a=torch.zeros(4), batch_size=[]).memmap_(folder)  # a folder tree still works
    td.make_memmap("b", [4]).fill_(1.0)
    td.memmap_refresh_()
    out["folder"] = repr(TensorDict.load_memmap(folder)["b"].tolist())
    return out


def _in_child(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a spawned child: a SIGBUS would kill the child (exit code -7), not the test.

    Spawned, not forked: a fork of the (threaded) test worker hung once in a full parallel run.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_guard, args=(fn, queue, *args))
    child.start()
    try:
        result = queue.get(timeout=WAIT)
    finally:
        child.join(WAIT)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0, f"the child died with exit code {child.exitcode} (-7: SIGBUS)"
    assert not (isinstance(result, tuple) and result[0] == "error"), result
    return result


def test_full_disk_raises_enospc_naming_path_and_sizes(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "mnt", "256k") as mnt:
        got = _in_child(_on_full_disk, str(mnt))
        for name, message in got.items():
            assert message.startswith("errno 28: "), (name, message)
            assert str(mnt) in message and ".tdtmp-" not in message, (name, message)
            assert "800000" in message or "bytes" in message, (name, message)
        assert TensorDict.load_memmap(mnt / "td")["a"].tolist() == [0.0] * 4  # the old tree is whole
    COUNTS["full-disk writes refused"] += len(got)


def test_full_runtime_folder_raises_naming_the_file(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "rt", "64k") as runtime:
        got = _in_child(_on_full_runtime, str(runtime), str(tmp_path / "td"))
    assert got.pop("folder") == repr([1.0] * 4)
    for name, message in got.items():
        assert message.startswith("errno 28: ") and str(runtime) in message, (name, message)
        assert "bytes" in message, (name, message)
    COUNTS["full-runtime writes refused"] += len(got)


def test_injected_enospc_names_path_and_sizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without root: the file system's refusal injected where the space is reserved."""

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    td = TensorDict(a=torch.zeros(4), batch_size=[]).memmap_(tmp_path / "td")
    anon = TensorDict(a=torch.zeros(4), batch_size=[]).memmap_()
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(OSError, match=r"cannot reserve 4000 bytes for '.*big\.memmap'") as info:
        td.make_memmap("big", [1000])
    assert info.value.errno == errno.ENOSPC and str(tmp_path / "td") in str(info.value)
    with pytest.raises(OSError, match=r"shared memory for a segment of \d+ bytes") as info:
        anon.make_memmap("big", [1000])
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert "big" not in TensorDict.load_memmap(tmp_path / "td").keys()  # a failed call leaves no trace
    assert "big" not in td.keys() and "big" not in anon.keys()


# -- resource limits: 1,000 create/share/drop cycles -----------------------------------------------
def _shm_bytes() -> int:
    """Bytes in this user's runtime folder ($XDG_RUNTIME_DIR/tdshare-<uid> where set, else /dev/shm/tdshare-<uid>)."""
    total = 0
    roots = [f"/dev/shm/tdshare-{os.getuid()}"]
    if os.environ.get("XDG_RUNTIME_DIR"):  # set by the test: only its own folder counts
        roots = [os.path.join(os.environ["XDG_RUNTIME_DIR"], f"tdshare-{os.getuid()}")]
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass
    return total


def _consumer(inbox: Any, outbox: Any) -> None:
    counts = None
    while True:
        item = inbox.get(timeout=WAIT)
        if item is None:
            break
        i, td = item
        value = float(td["a"].sum()) + float(td["n", "b"].sum())
        if i % 10 == 0:
            td.make_memmap(f"x{i}", [2]).fill_(1.0)  # an entry added by the receiver, then dropped
        del td, item
        if i == WARMUP - 1:
            counts = (_fds(), _maps())
        outbox.put((i, value))
    outbox.put((counts, (_fds(), _maps())))


WARMUP = 20


@pytest.mark.timeout(300)
def test_descriptors_mappings_and_shm_return_to_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc as collector

    # a runtime folder of this test's own: the shared one changes with the tests running beside it
    (tmp_path / "rt").mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "rt"))
    cycles = 1000 * SCALE
    ctx = mp.get_context("fork")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=_consumer, args=(inbox, outbox))
    with _reaped([worker]):
        for i in range(cycles + WARMUP):
            if i == WARMUP:
                collector.collect()
                # the sender's duplicates of the segments handed off (see tdshare._fd_pass) close
                # when its release thread next polls (every 20 ms, later under load) after the
                # receiver took them: several of the last hand-offs' can still be open here, so
                # close them first (unreleased() does); what stays are the duplicates of pickles
                # that earlier tests of this process never received, held until it exits
                never = unreleased()
                base = (_fds(), _maps(), _shm_bytes())
            fields = {"a": torch.full((16,), float(i)), "n": {"b": torch.ones(4)}}
            if i % 10 == 5:  # now and then a folder-backed tree, removed once dropped
                td = TensorDict(fields, batch_size=[]).memmap_(tmp_path / f"f{i}")
            else:
                td = TensorDict(fields, batch_size=[]).memmap_()
            inbox.put((i, td))
            assert outbox.get(timeout=WAIT) == (i, 16.0 * i + 4.0)
            del td
            if i % 10 == 5:
                shutil.rmtree(tmp_path / f"f{i}")
        inbox.put(None)
        worker_warm, worker_end = outbox.get(timeout=WAIT)
    collector.collect()
    assert unreleased() == never  # every hand-off of this test was received
    end = (_fds(), _maps(), _shm_bytes())
    assert end[0] == base[0], f"descriptors: {base[0]} -> {end[0]}"
    assert end[1] <= base[1] + 8, f"mappings: {base[1]} -> {end[1]}"
    assert end[2] <= base[2], f"/dev/shm bytes: {base[2]} -> {end[2]}"
    assert worker_end[0] <= worker_warm[0] + 2 and worker_end[1] <= worker_warm[1] + 8, (worker_warm, worker_end)
    COUNTS["create/share/drop cycles"] += cycles


# -- soak: a replay-buffer-like loop ---------------------------------------------------------------
CAPACITY = 256


def _storage() -> TensorDict:
    return TensorDict(obs=torch.zeros(CAPACITY, 8), stamp=torch.zeros(CAPACITY, dtype=torch.int64), batch_size=[])


def _soak_writer(path: str, rank: int, steps: int, go: Any) -> dict[str, Any]:
    import time

    buf = open_memmap(path, _storage)
    assert go.wait(WAIT)
    times, counts = [], []
    rows = torch.arange(rank, CAPACITY, 2)
    for i in range(steps):
        t0 = time.perf_counter()
        idx = rows[(i * 4) % len(rows) : (i * 4) % len(rows) + 4]
        buf["obs"][idx] = float(i)  # write a batch of rows into the ring
        buf["stamp"][idx] = i
        buf.make_memmap_from_tensor(f"ep{rank}_{i}", torch.full((4,), float(i)))  # a new episode entry
        times.append(time.perf_counter() - t0)
        counts.append((_fds(), _maps() - i))  # each added entry holds its one mapping
    return {"role": "writer", "times": times, "counts": counts}


def _soak_sampler(path: str, steps: int, go: Any) -> dict[str, Any]:
    import time

    buf = open_memmap(path, _storage)
    assert go.wait(WAIT)
    gen = torch.Generator().manual_seed(0)
    times, counts = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        buf.memmap_refresh_()
        idx = torch.randint(0, CAPACITY, (32,), generator=gen)
        batch = buf["obs"][idx].clone()
        stamps = buf["stamp"][idx].clone()
        assert (batch >= 0).all() and (stamps >= 0).all()
        times.append(time.perf_counter() - t0)
        counts.append((_fds(), _maps()))
    keys = [k for k in buf.keys() if k.startswith("ep")]
    return {"role": "sampler", "times": times, "counts": counts, "entries": len(keys)}


def _decile_ratio(times: list[float]) -> float:
    # the last three deciles against the third to fifth: a level's first 64 entries are cheaper by
    # design (meta.json swapped in; later ones append to its record), and three deciles a side keep
    # a burst of the machine's load from deciding; 0.2 ms of slack, since a sampler step is ~50 µs
    n = max(1, len(times) // 10)
    first, last = sorted(times[2 * n : 5 * n]), sorted(times[-3 * n :])
    return last[len(last) // 2] / (first[len(first) // 2] + 2e-4) if first else 1.0


@pytest.mark.timeout(300)
def test_soak_replay_buffer_stays_flat(tmp_path: Path) -> None:
    steps = 300 * SCALE
    ctx = _ctx("fork")
    # on tmpfs: the steps' latency is the library's; on ext4 its journal commits and inode
    # allocation (which drift with what other tests deleted) moved the last decile by 2-3x
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="soak-test-", dir=shm)) if shm.is_dir() else tmp_path
    path = str(root / "buffer")
    try:
        _soak(ctx, path, steps)
    finally:
        if root != tmp_path:
            shutil.rmtree(root, ignore_errors=True)


def _soak(ctx: Any, path: str, steps: int) -> None:
    open_memmap(path, _storage)
    queue, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_guard, args=(_soak_writer, queue, path, r, steps, go)) for r in range(2)]
    procs.append(ctx.Process(target=_guard, args=(_soak_sampler, queue, path, steps, go)))
    with _reaped(procs):
        go.set()
        results = _results(queue, 3)
    for res in results:
        ratio = _decile_ratio(res["times"])
        assert ratio < 2.0, f"{res['role']}: the last deciles' median step is {ratio:.2f}x the earlier ones' (+0.2 ms)"
        warm, end = res["counts"][len(res["counts"]) // 10], res["counts"][-1]
        assert end[0] <= warm[0] + 2, f"{res['role']}: descriptors {warm[0]} -> {end[0]}"
        assert end[1] <= warm[1] + 8, f"{res['role']}: mappings {warm[1]} -> {end[1]}"
        COUNTS[f"soak steps ({res['role']})"] += len(res["times"])
    sampler = next(r for r in results if r["role"] == "sampler")
    assert sampler["entries"] > 0
    assert len([k for k in TensorDict.load_memmap(path).keys() if k.startswith("ep")]) == 2 * steps


# -- pickles run only when allowed -----------------------------------------------------------------
class _Bomb:
    """Unpickling it creates the folder ``path``: proof that the pickle's code ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _bombed(where: str, tmp_path: Path) -> tuple[Path, Path, Any]:
    """A saved tree whose pickled value, in place ``where``, creates a marker folder when loaded."""
    marker = tmp_path / "marker"
    bomb = _Bomb(str(marker))
    if where == "top":
        td: Any = TensorDict(a=torch.zeros(2), obj=bomb, batch_size=[2])
    elif where == "nested":
        td = TensorDict(a=torch.zeros(2), n={"m": {"obj": bomb}}, batch_size=[2])
    elif where == "stack":
        td = TensorDict(a=torch.zeros(2), batch_size=[2])
        td["objs"] = tdshare.NonTensorStack(bomb, _Bomb(str(marker) + "-2"))
    elif where == "lazy":
        td = tdshare.LazyStackedTensorDict(TensorDict(obj=bomb), TensorDict(obj=_Bomb(str(marker) + "-2")))
    elif where == "tensorclass":
        td = Sample(a=torch.zeros(2), n=TensorDict(b=torch.zeros(2, 2), batch_size=[2]), s=bomb, batch_size=[2])
    else:
        raise AssertionError(where)
    path = tmp_path / "td"
    td.save(path)
    assert not marker.exists()
    return path, marker, td


WHERE = ["top", "nested", "stack", "lazy", "tensorclass"]


@pytest.mark.parametrize("archive", [False, True], ids=["folder", "archive"])
@pytest.mark.parametrize("where", WHERE)
def test_a_pickle_runs_only_when_pickles_are_allowed(tmp_path: Path, where: str, archive: bool) -> None:
    path, marker, _ = _bombed(where, tmp_path)
    if archive:  # packed from the folder (td.save(x.tdz) reads its own pickles back: see the README)
        path = Path(tdshare.pack_memmap(path, tmp_path / "td.tdz"))
    with pytest.raises(tdshare.PickleRefusedError, match=r"allow_pickle"):
        TensorDict.load_memmap(path, allow_pickle=False)
    assert not marker.exists()
    if not archive:
        with pytest.raises(tdshare.PickleRefusedError):
            TensorDict(a=torch.zeros(2), batch_size=[2]).load_memmap_(path, allow_pickle=False)
        assert not marker.exists()
    for argv in (["info", str(path)], ["verify", str(path)]):  # the command line never unpickles
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli(argv)
        assert not marker.exists(), argv
    with pytest.warns(FutureWarning, match=r"^Running the code of a pickle") as record:
        TensorDict.load_memmap(path)  # the default, None: runs it, and says so first
    assert marker.exists() and "allow_pickle=False" in str(record[0].message)
    os.rmdir(marker)
    if os.path.exists(str(marker) + "-2"):
        os.rmdir(str(marker) + "-2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TensorDict.load_memmap(path, allow_pickle=True)
    assert marker.exists()
    COUNTS["pickle policy cases"] += 1


def test_a_received_pickled_value_runs_only_when_allowed(tmp_path: Path) -> None:
    """The transported form (a schema with the pickle inline) follows the same rule."""
    from tdshare._schema import build_tree, leaves_of, schema_of

    marker = tmp_path / "marker"
    td = TensorDict(a=torch.zeros(2), obj=_Bomb(str(marker)), batch_size=[2])
    schema, tensors = schema_of(td, allow_pickle=True), leaves_of(td)
    with pytest.raises(tdshare.PickleRefusedError, match=r"allow_pickle"):
        build_tree(schema, tensors)
    assert not marker.exists()
    build_tree(schema, tensors, allow_pickle=True)
    assert marker.exists()
