"""Sharing memory-mapped TensorDicts between real processes (spawn, fork, forkserver).

Processes synchronise through queues only (no sleeps); every wait has a timeout, and a worker
that fails sends its traceback instead of leaving the parent waiting.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import queue
import subprocess
import sys
import textwrap
import time
import traceback
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch

from tdshare import MemoryMappedTensor, TensorDict

WAIT = 60  # seconds any single hand-off may take (a spawn child imports torch first)
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]


def _make_td() -> TensorDict:
    return TensorDict(
        {
            "a": torch.arange(4, dtype=torch.float32),
            "i": torch.arange(8, dtype=torch.int64).reshape(4, 2),
            "n": {"b": torch.zeros(4, 3), "flag": torch.tensor([True, False, True, False])},
        },
        batch_size=[4],
    )


def _describe(td: TensorDict) -> dict[str, Any]:
    leaves = {key: td[key] for key in td.keys(include_nested=True, leaves_only=True)}
    return {
        "types": sorted({type(v).__name__ for v in leaves.values()}),
        "anonymous": sorted({v.is_anonymous for v in leaves.values() if isinstance(v, MemoryMappedTensor)}),
        "is_memmap": td.is_memmap(),
        "locked": td.is_locked,
        "batch_size": list(td.batch_size),
        "values": {str(k): v.tolist() for k, v in leaves.items()},
    }


def _worker(td_arg: TensorDict, commands: Any, replies: Any) -> None:
    try:
        # 1. the tensordict received as a Process argument
        replies.put(("arg", _describe(td_arg)))
        td_arg["a"][0] = 42.0
        td_arg["n", "b"][0, 0] = -1.0
        replies.put(("wrote", None))
        # 2. the parent writes after the hand-off; we must see it
        assert commands.get(timeout=WAIT) == "parent-wrote"
        replies.put(("sees", (td_arg["a"][1].item(), td_arg["n", "b"][3].tolist())))
        # 3. the same tensordict again, through the queue, to this running process
        td_q = commands.get(timeout=WAIT)
        replies.put(("queued", _describe(td_q)))
        td_q["a"][2] = 43.0
        td_q["i"][3].fill_(-7)
        replies.put(("wrote", None))
        # 4. a view, td[1:3]
        view = commands.get(timeout=WAIT)
        replies.put(("view", _describe(view)))
        view["a"][0] = 99.0  # the parent's row 1
        view["n", "b"][1] = 5.0  # the parent's row 2
        replies.put(("done", _shm_usage()))
    except BaseException:
        replies.put(("error", traceback.format_exc()))


def _get(replies: Any, expected: str, proc: Any = None) -> Any:
    """The next reply, which must be ``expected``; fails at once if the worker died instead."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            tag, payload = replies.get(timeout=0.5)
            break
        except queue.Empty:
            if proc is not None and not proc.is_alive():
                pytest.fail(f"the worker exited with code {proc.exitcode} before replying {expected!r}")
            if time.monotonic() > deadline:
                raise
    if tag == "error":
        pytest.fail(f"the worker failed:\n{payload}")
    assert tag == expected
    return payload


def _finish(proc: Any, ok: bool) -> None:
    """Wait for a worker that succeeded; stop at once one that did not (it may wait on a queue)."""
    if not ok and proc.is_alive():
        proc.kill()
    proc.join(timeout=WAIT)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=WAIT)


def _shm_usage() -> list[str]:
    """This process's descriptors and mappings in /dev/shm (tdshare needs none).

    multiprocessing's own named semaphores (``sem.*``, the locks of a Queue) are not counted, nor
    torch's own shared memory (see below).
    """
    out: list[str] = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            out.append(target)
    with open("/proc/self/maps") as f:
        out.extend(line.split(None, 5)[-1].strip() for line in f if "/dev/shm/" in line)
    # torch's shared memory (``torch_<pid>_...``): share_memory_() of plain tensors in other tests of
    # the same worker process may still hold some; tdshare's memory-mapping makes none
    return [p for p in out if not p.startswith(("/dev/shm/sem.", "/dev/shm/torch_"))]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["file", "anonymous"])
@pytest.mark.parametrize("method", METHODS)
def test_share_with_a_process(method: str, kind: str, tmp_path: Path) -> None:
    ctx = mp.get_context(method)
    td = _make_td()
    if kind == "file":
        td.memmap_(tmp_path / "td")
    else:
        td.memmap_()
    expected = _describe(td)
    assert expected["types"] == ["MemoryMappedTensor"]
    assert expected["anonymous"] == [kind == "anonymous"]

    commands, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_worker, args=(td, commands, replies), daemon=True)
    proc.start()
    ok = False
    try:
        # 1. as a Process argument: MemoryMappedTensor leaves, memmap, locked, the parent's values
        assert _get(replies, "arg", proc) == expected
        _get(replies, "wrote", proc)
        assert td["a"][0] == 42.0 and td["n", "b"][0, 0] == -1.0  # child writes reach the parent
        # 2. parent writes after the hand-off reach the child
        td["a"][1] = 7.0
        td["n", "b"][3] = 3.0
        commands.put("parent-wrote")
        assert _get(replies, "sees", proc) == (7.0, [3.0, 3.0, 3.0])
        # 3. through a Queue to the running process
        before = _describe(td)  # the child writes once it has described what it received
        commands.put(td)
        assert _get(replies, "queued", proc) == before
        _get(replies, "wrote", proc)
        assert td["a"][2] == 43.0 and td["i"][3].tolist() == [-7, -7]
        # 4. a view
        view = td[1:3]
        assert view.batch_size == torch.Size([2])
        assert all(isinstance(v, MemoryMappedTensor) for v in view.values(include_nested=True, leaves_only=True))
        before = _describe(view)  # the child writes into the view once it has described it
        commands.put(view)
        seen = _get(replies, "view", proc)
        assert seen["values"] == before["values"] and seen["batch_size"] == [2]
        assert seen["types"] == ["MemoryMappedTensor"]
        child_shm = _get(replies, "done", proc)
        assert td["a"].tolist() == [42.0, 99.0, 43.0, 3.0]
        assert td["n", "b"][2].tolist() == [5.0, 5.0, 5.0] and td["n", "b"][1].tolist() == [0.0, 0.0, 0.0]
        assert child_shm == []
        ok = True
    finally:
        _finish(proc, ok)
    assert proc.exitcode == 0
    assert _shm_usage() == []


@pytest.mark.parametrize("kind", ["file", "anonymous"])
def test_pickled_tensordict_is_a_small_handle(kind: str, tmp_path: Path) -> None:
    """The bytes that cross the process boundary do not grow with the data."""
    sizes = []
    for n in (10, 1_000_000):
        td = TensorDict({"x": torch.zeros(n), "y": {"z": torch.ones(n, dtype=torch.int8)}}, batch_size=[n])
        td.memmap_(tmp_path / str(n)[:1]) if kind == "file" else td.memmap_()
        data = ForkingPickler.dumps(td) if kind == "anonymous" else pickle.dumps(td)
        assert len(data) < 4096
        sizes.append(len(data))
        back = pickle.loads(data)
        back["x"][-1] = 5.0
        assert td["x"][-1] == 5.0
    assert abs(sizes[0] - sizes[1]) <= 32


# -- descriptors and /dev/shm ----------------------------------------------------------------------
MANY_LEAVES = """
    import gc, os, pickle, resource
    from multiprocessing.reduction import ForkingPickler
    import torch
    from tdshare import MemoryMappedTensor, TensorDict

    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    def nfds():
        return len(os.listdir("/proc/self/fd"))

    def memfd_maps():
        with open("/proc/self/maps") as f:
            return sum("memfd:" in line for line in f)

    td = TensorDict(
        {f"n{i}": TensorDict({f"l{j}": torch.full((3,), float(i * 100 + j)) for j in range(100)}, [])
         for i in range(100)},
        [],
    )
    before, maps_before = nfds(), memfd_maps()
    td.memmap_()
    leaves = list(td.values(include_nested=True, leaves_only=True))
    assert len(leaves) == 10_000 and all(isinstance(v, MemoryMappedTensor) and v.is_anonymous for v in leaves)
    assert td["n42", "l7"].tolist() == [4207.0] * 3 and td.is_memmap() and td.is_locked
    used = nfds() - before
    # and the whole tree still crosses a process boundary as one descriptor
    back = pickle.loads(ForkingPickler.dumps(td))
    back["n99", "l99"][0] = -1.0
    assert td["n99", "l99"][0] == -1.0
    print(used, memfd_maps() - maps_before)
"""


@pytest.mark.timeout(120)
def test_ten_thousand_anonymous_leaves_under_a_small_fd_limit(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MANY_LEAVES)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    fds, maps = (int(x) for x in out.stdout.split())
    assert fds <= 4, f"memmap_() of 10,000 leaves kept {fds} descriptors open"
    assert maps <= 4, f"memmap_() of 10,000 leaves made {maps} mappings"


def _nfds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _memfd_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:" in line for line in f)


def test_no_descriptor_or_mapping_leak() -> None:
    """Anonymous memmap_() calls release their descriptor and mapping with the last tensor."""
    pickle.loads(ForkingPickler.dumps(_make_td().memmap_()))  # start multiprocessing's fd server once
    gc.collect()
    fds, maps = _nfds(), _memfd_mappings()
    for i in range(60):
        td = _make_td()
        td.memmap_()
        td["a"].add_(1)  # use the memory
        copy = td.memmap()  # a memory-mapped copy in anonymous memory
        nested = TensorDict({f"k{j}": torch.ones(2) for j in range(20)}, []).memmap_()
        if i % 10 == 0:
            back = pickle.loads(ForkingPickler.dumps(td))  # received handles are released as well
            assert back["a"].tolist() == td["a"].tolist()
            del back
        del td, copy, nested
    anon = [MemoryMappedTensor.from_tensor(torch.ones(3)) for _ in range(50)]
    del anon
    gc.collect()
    assert _nfds() <= fds
    assert _memfd_mappings() <= maps


def test_no_descriptor_leak_saving_many_folders(tmp_path: Path) -> None:
    """Saving to many folders and dropping the tensordicts gives every descriptor back."""
    TensorDict({"x": torch.ones(3)}, [3]).memmap_(tmp_path / "warm")
    gc.collect()
    fds = _nfds()
    for i in range(30):
        TensorDict({"x": torch.ones(3)}, [3]).memmap_(tmp_path / f"d{i}")
    gc.collect()
    assert _nfds() - fds <= 2, f"{_nfds() - fds} descriptors stay open after saving 30 folders"


@pytest.mark.timeout(120)
def test_anonymous_memory_leaves_nothing_in_dev_shm() -> None:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this system")
    before = set(os.listdir("/dev/shm"))
    td = _make_td()
    td.memmap_()
    big = TensorDict({"x": torch.zeros(1 << 20)}, []).memmap_()
    assert _shm_usage() == []
    ctx = mp.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_worker, args=(td, commands, replies), daemon=True)
    proc.start()
    ok = False
    try:
        _get(replies, "arg", proc)
        _get(replies, "wrote", proc)
        commands.put("parent-wrote")
        _get(replies, "sees", proc)
        commands.put(td)
        _get(replies, "queued", proc)
        _get(replies, "wrote", proc)
        commands.put(td[1:3])
        _get(replies, "view", proc)
        assert _get(replies, "done", proc) == []  # the child maps nothing from /dev/shm either
        ok = True
    finally:
        _finish(proc, ok)
    assert proc.exitcode == 0
    del td, big
    gc.collect()
    pids = {str(os.getpid()), str(proc.pid)}
    new = set(os.listdir("/dev/shm")) - before
    # other programs may use /dev/shm meanwhile: only names that could be ours count
    ours = sorted(n for n in new if "tdshare" in n or any(p in n for p in pids))
    assert ours == []


def _produce_and_exit(kind: str, folder: str, out: Any) -> None:
    td = _make_td()
    if kind == "folder":
        td.memmap_(os.path.join(folder, "td"))
    elif kind == "archive":
        td = td.save(os.path.join(folder, "td.tdz"))
    else:
        td.memmap_()
    td["a"][1] = 7.0 if kind != "archive" else 0.0
    out.put(td)  # the process exits right after: the queue's feeder flushes first


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["folder", "archive", "anonymous"])
def test_producer_may_exit_right_after_putting(kind: str, tmp_path: Path) -> None:
    """Folder- and archive-backed tensordicts open by path after their sender exited; anonymous memory
    cannot outlive its last process, and says so instead of failing obscurely."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_produce_and_exit, args=(kind, str(tmp_path), out))
    proc.start()
    proc.join(timeout=WAIT)
    assert proc.exitcode == 0
    if kind == "anonymous":
        with pytest.raises(RuntimeError, match=r"exited .* before it was received"):
            out.get(timeout=WAIT)
        return
    td = out.get(timeout=WAIT)
    assert isinstance(td["a"], MemoryMappedTensor)
    expected = [0.0, 7.0, 2.0, 3.0] if kind == "folder" else [0.0, 1.0, 2.0, 3.0]
    assert td["a"].tolist() == expected
    assert td["n", "b"].shape == (4, 3) and td["i"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
