"""InterProcessLock: exclusive between threads and processes, reentrant, fork-safe, crash-safe."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from tdshare._flock import InterProcessLock

METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
WAIT = 60


def test_reentrant_and_released_by_the_outermost(tmp_path: Path) -> None:
    lock = InterProcessLock(str(tmp_path / "x.lock"))
    with lock:
        with lock:
            assert lock.is_held
        assert lock.is_held
    assert not lock.is_held
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release()


def test_threads_exclude_each_other(tmp_path: Path) -> None:
    lock = InterProcessLock(str(tmp_path / "x.lock"))
    inside, release, got = threading.Event(), threading.Event(), []

    def holder() -> None:
        with lock:
            inside.set()
            release.wait(WAIT)

    t = threading.Thread(target=holder)
    t.start()
    assert inside.wait(WAIT)
    with pytest.raises(TimeoutError, match="another thread"):
        lock.acquire(timeout=0.05)
    release.set()
    t.join(WAIT)
    lock.acquire(timeout=WAIT)
    got.append(lock.is_held)
    lock.release()
    assert got == [True]


def _try_lock(path: str, timeout: float, out: Any) -> None:
    lock = InterProcessLock(path)
    try:
        lock.acquire(timeout=timeout)
    except TimeoutError:
        out.put("timeout")
        return
    out.put("acquired")
    lock.release()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_another_process_waits_for_the_holder(tmp_path: Path, method: str) -> None:
    path = str(tmp_path / "x.lock")
    lock = InterProcessLock(path)
    ctx = mp.get_context(method)
    out = ctx.Queue()
    with lock:
        proc = ctx.Process(target=_try_lock, args=(path, 0.2, out))
        proc.start()
        assert out.get(timeout=WAIT) == "timeout"
        proc.join(WAIT)
    proc = ctx.Process(target=_try_lock, args=(path, WAIT, out))
    proc.start()
    assert out.get(timeout=WAIT) == "acquired"
    proc.join(WAIT)


def _child_of_a_holder(lock: InterProcessLock, out: Any) -> None:
    # the lock object came through fork while the parent held it: the child does not hold it
    out.put(lock.is_held)
    try:
        lock.acquire(timeout=0.2)
        out.put("acquired")
    except TimeoutError:
        out.put("timeout")


@pytest.mark.timeout(120)
def test_a_forked_child_never_inherits_a_held_lock(tmp_path: Path) -> None:
    if "fork" not in METHODS:
        pytest.skip("no fork start method")
    lock = InterProcessLock(str(tmp_path / "x.lock"))
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with lock:
        proc = ctx.Process(target=_child_of_a_holder, args=(lock, out))
        proc.start()
        assert out.get(timeout=WAIT) is False
        assert out.get(timeout=WAIT) == "timeout"  # still the parent's
        proc.join(WAIT)
        assert lock.is_held  # the child's exit (closing its copy) did not release the parent's lock
        other = ctx.Process(target=_try_lock, args=(lock.path, 0.1, out))
        other.start()
        assert out.get(timeout=WAIT) == "timeout"
        other.join(WAIT)


def _hold_and_report(path: str, out: Any) -> None:
    lock = InterProcessLock(path)
    lock.acquire()
    out.put(os.getpid())
    threading.Event().wait(WAIT)  # until killed


@pytest.mark.timeout(120)
def test_the_lock_of_a_killed_holder_is_free(tmp_path: Path) -> None:
    path = str(tmp_path / "x.lock")
    ctx = mp.get_context(METHODS[0])
    out = ctx.Queue()
    proc = ctx.Process(target=_hold_and_report, args=(path, out), daemon=True)
    proc.start()
    pid = out.get(timeout=WAIT)
    lock = InterProcessLock(path)
    with pytest.raises(TimeoutError):
        lock.acquire(timeout=0.05)
    os.kill(pid, signal.SIGKILL)
    proc.join(WAIT)
    lock.acquire(timeout=WAIT)
    lock.release()
