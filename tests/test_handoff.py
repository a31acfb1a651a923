"""Handing a memory-mapped tree to a live worker: one schema per tree (tdshare._handoff) and
anonymous segments opened through /proc (tdshare._fd_pass).

Behaviour, not timings: under spawn, fork and forkserver the worker reads the right values, sees
a leaf written after pickling, and an anonymous tree's memory is freed once both sides drop it;
in one process, the one-piece rebuild gives exactly what the level-by-level one gives.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import uuid
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import proc_fd_passing

import tdshare
from tdshare import MemmapError, TensorDict
from tdshare._fd_pass import receive_fd, send_fd, unreleased
from tdshare._handoff import reduce_tree
from tdshare._lazy_leaves import PendingLeaf

WAIT = 60
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]


HAS_PROC = proc_fd_passing()


def _ctx(method: str) -> Any:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "tdshare"])
    return ctx


def _tree(prefix: str | None) -> TensorDict:
    """Three levels, leaves of several dtypes and shapes, a child between two leaves (key order)."""
    td = TensorDict(
        {
            "a": torch.arange(6.0).reshape(2, 3),
            "sub": TensorDict(
                {"x": torch.arange(4, dtype=torch.int64), "deep": TensorDict({"y": torch.ones(2, 2)}, batch_size=[2])},
                batch_size=[],
            ),
            "b": torch.tensor([True, False]),
            "key with space": torch.full((3,), 2.5),
        },
        batch_size=[],
    )
    return td.memmap_(prefix)


def _levels(td: Any, path: tuple[str, ...] = ()) -> list[Any]:
    """Everything a hand-off must keep, level by level (raw entries: nothing is mapped)."""
    out = [
        (
            path,
            list(dict.keys(td._tensordict)),
            tuple(td.batch_size),
            td._is_locked,
            td._is_memmap,
            td._memmap_prefix,
            td._anon_store,
        )
    ]
    for key, value in dict.items(td._tensordict):
        if isinstance(value, TensorDict):
            out += _levels(value, (*path, key))
    return out


def _values(td: TensorDict) -> dict[Any, list[Any]]:
    return {k: v.tolist() for k, v in td.items(include_nested=True, leaves_only=True)}


@pytest.mark.parametrize("where", ["folder", "anonymous"])
def test_one_piece_rebuild_keeps_every_level_and_value(where: str, tmp_path: Path) -> None:
    td = _tree(str(tmp_path / "td") if where == "folder" else None)
    assert reduce_tree(td) is not None  # the one-piece path is taken
    got = ForkingPickler.loads(ForkingPickler.dumps(td))
    assert _levels(got) == _levels(td)
    assert list(got.keys()) == ["a", "sub", "b", "key with space"]
    assert all(type(v) is PendingLeaf for v in dict.values(got["sub"]._tensordict) if not isinstance(v, TensorDict))
    assert _values(got) == _values(td)
    got["sub", "deep", "y"][0, 0] = 5.0  # the same memory
    assert td["sub", "deep", "y"][0, 0].item() == 5.0


def test_lock_parents_are_recorded_as_level_by_level(tmp_path: Path) -> None:
    td = _tree(str(tmp_path / "td"))
    got = pickle.loads(pickle.dumps(td))
    sub, deep = got._tensordict["sub"], got._tensordict["sub"]._tensordict["deep"]
    assert got._is_locked and sub._is_locked and deep._is_locked
    assert [r() for r in sub._lock_parent_refs] == [got]
    assert [r() for r in deep._lock_parent_refs] == [sub, got]  # the nearest first, as pickle rebuilds
    assert got._lock_parents_weakrefs == []  # the root: locked by itself


def test_a_tree_that_cannot_travel_in_one_piece_pickles_level_by_level(tmp_path: Path) -> None:
    td = TensorDict({"a": torch.zeros(3), "sub": TensorDict({"b": torch.ones(2)}, batch_size=[])}, batch_size=[])
    td = td.memmap_(str(tmp_path / "td"))
    td.unlock_()["plain"] = torch.arange(3.0)  # a plain tensor: pickles itself
    assert reduce_tree(td) is None
    got = pickle.loads(pickle.dumps(td))
    assert _values(got) == _values(td)
    shared = TensorDict({"s": TensorDict({"c": torch.ones(1)}, batch_size=[])}, batch_size=[]).memmap_(None)
    dict.__setitem__(shared._tensordict, "t", shared._tensordict["s"])  # one level at two places
    assert reduce_tree(shared) is None
    got = pickle.loads(pickle.dumps(shared))
    assert got._tensordict["s"] is got._tensordict["t"]  # stays one object, as pickle's memo keeps it


def test_the_remembered_schema_follows_every_change(tmp_path: Path) -> None:
    td = _tree(str(tmp_path / "td"))
    first = reduce_tree(td)
    assert first is not None
    again = reduce_tree(td)
    assert again is not None and again[1][1] is first[1][1]  # unchanged: the same bytes, not re-encoded
    td["a"].unsqueeze_(0)  # shape changed in place (its version counter moves)
    changed = reduce_tree(td)
    assert changed is not None and changed[1][1] != first[1][1]
    assert pickle.loads(pickle.dumps(td))["a"].shape == (1, 2, 3)
    td["sub"].make_memmap("z", [5])  # an entry added below (a locked tree takes new entries)
    got = pickle.loads(pickle.dumps(td))
    assert got["sub", "z"].shape == (5,) and list(got["sub"].keys()) == ["x", "deep", "z"]
    td.unlock_()
    del td["sub"]["x"]  # an entry removed
    assert "x" not in pickle.loads(pickle.dumps(td))["sub"].keys()


def test_a_receiver_that_gets_the_same_tree_again_gets_independent_levels(tmp_path: Path) -> None:
    td = _tree(str(tmp_path / "td"))
    blob = ForkingPickler.dumps(td)
    one, two = pickle.loads(blob), pickle.loads(blob)
    assert one is not two and one["sub"] is not two["sub"]
    one.unlock_()["new"] = torch.zeros(1)
    assert "new" not in two.keys()
    assert one["a"].data_ptr() != two["a"].data_ptr() or one["a"] is not two["a"]  # each maps its own
    assert one["a"].tolist() == two["a"].tolist() == td["a"].tolist()


def test_a_leaf_written_after_pickling_is_seen_and_a_replaced_file_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _tree(str(folder))
    blob = pickle.dumps(td)
    td["a"][1, 2] = 42.0  # after pickling, before the receiver's first read
    got = pickle.loads(blob)
    assert got["a"][1, 2].item() == 42.0
    other = pickle.loads(blob)
    os.remove(folder / "b.memmap")  # the file gone before the first read: the error names it
    with pytest.raises(tdshare.CorruptDataError, match=r"b\.memmap"):
        other["b"]


# -- across processes ------------------------------------------------------------------------
def _reader(inbox: Any, go: Any, out: Any) -> None:
    while (item := inbox.get(timeout=WAIT)) is not None:
        td, note = item
        out.put(("received", note))  # unpickled (so pickled): nothing read yet
        assert go.get(timeout=WAIT) == note
        out.put((note, _values(td), td["sub", "x"].data_ptr() != 0))
        del td, item
        gc.collect()
        out.put("dropped")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["folder", "anonymous"])
@pytest.mark.parametrize("method", METHODS)
def test_a_live_worker_reads_the_values_and_later_writes(method: str, where: str, tmp_path: Path) -> None:
    ctx = _ctx(method)
    td = _tree(str(tmp_path / f"td-{uuid.uuid4().hex}") if where == "folder" else None)
    inbox, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_reader, args=(inbox, go, out))
    proc.start()
    try:
        for round_ in range(3):  # the same tree again and again (the remembered schema, the copies)
            td["a"][0, 0] = float(round_)
            inbox.put((td, round_))
            assert out.get(timeout=WAIT) == ("received", round_)
            td["key with space"][0] = 10.0 + round_  # written after the pickling: seen at the first read
            go.put(round_)
            note, values, mapped = out.get(timeout=WAIT)
            assert note == round_ and mapped
            assert values == _values(td)
            assert values["key with space"][0] == 10.0 + round_ and values["a"][0][0] == float(round_)
            assert out.get(timeout=WAIT) == "dropped"
    finally:
        inbox.put(None)
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0


def _segments_of_this_process() -> set[str]:
    """The inodes of this process's anonymous segments, from its mappings and descriptors."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            if "/memfd:tdshare" in line:
                found.add(line.split()[4])
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("/memfd:tdshare"):
            found.add(str(os.stat(f"/proc/self/fd/{name}").st_ino))
    return found


def _hold_until_told(inbox: Any, out: Any) -> None:
    td = inbox.get(timeout=WAIT)
    out.put(td["a"].sum().item())
    assert inbox.get(timeout=WAIT) == "drop"
    del td
    gc.collect()
    out.put(sorted(_segments_of_this_process()))


@pytest.mark.skipif(not HAS_PROC, reason="descriptors cannot be handed through /proc here")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_anonymous_memory_is_freed_once_both_sides_drop_it(method: str) -> None:
    ctx = _ctx(method)
    inbox, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_hold_until_told, args=(inbox, out))
    proc.start()  # before the tree exists: a forked worker must not inherit it
    gc.collect()
    before = _segments_of_this_process()
    td = _tree(None)
    ino = str(os.fstat(td["a"]._segment.fd).st_ino)
    try:
        inbox.put(td)
        del td  # the sender drops its tree right after put(): the queue's pickle holds it
        gc.collect()
        assert out.get(timeout=WAIT) == 15.0  # the worker has it, after the sender dropped it
        assert unreleased() == 0  # the worker cleared its slot before replying: the duplicate is closed
        assert ino not in _segments_of_this_process() - before  # nothing of it left here
        inbox.put("drop")
        assert ino not in out.get(timeout=WAIT)  # nor in the worker: the kernel frees it
    finally:
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0


def _send_one(out: Any, ready: Any, done: Any) -> None:
    td = TensorDict(a=torch.arange(3.0), batch_size=[]).memmap_(None)
    out.put(ForkingPickler.dumps(td).tobytes())
    ready.wait(WAIT)
    done.set()


@pytest.mark.skipif(not HAS_PROC, reason="descriptors cannot be handed through /proc here")
@pytest.mark.timeout(120)
def test_a_pickle_is_received_once_and_not_after_its_sender_exited() -> None:
    ctx = mp.get_context("spawn")
    out, ready, done = ctx.Queue(), ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_send_one, args=(out, ready, done))
    proc.start()
    blob = out.get(timeout=WAIT)
    got = pickle.loads(blob)
    assert got["a"].tolist() == [0.0, 1.0, 2.0]
    again = pickle.loads(blob)  # this process maps it already: the same memory
    assert again["a"].data_ptr() == got["a"].data_ptr()
    ready.set()
    done.wait(WAIT)
    proc.join(timeout=WAIT)
    del got, again
    gc.collect()
    with pytest.raises(MemmapError, match=r"exited .* before it was received"):
        pickle.loads(blob)


@pytest.mark.skipif(not HAS_PROC, reason="descriptors cannot be handed through /proc here")
def test_a_descriptor_handed_within_one_process_is_released() -> None:
    fd = os.memfd_create("tdshare-test")
    try:
        code = send_fd(fd)
        assert code is not None and unreleased() >= 1
        got = receive_fd(code)
        assert os.fstat(got).st_ino == os.fstat(fd).st_ino
        os.close(got)
        assert unreleased() == 0
        with pytest.raises(MemmapError, match=r"released it before it was received|exited"):
            receive_fd(code)  # (its duplicate is closed: a second receive is refused)
    finally:
        os.close(fd)
