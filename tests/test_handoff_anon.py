"""An anonymous tree's hand-off template (tdshare._handoff): cached per schema, lent to one tree
at a time, holding no segment while it waits.

In one process: a second hand-off of the same tree reuses the first one's pending leaves; a
dropped tree leaves no segment behind (the cached template holds none); a leaf that outlives its
tree elsewhere keeps its memory; a sub-level that outlives its root keeps the template lent; two
live trees of one pickle are independent; a received tree pickles again.  Under spawn, fork and
forkserver: a live worker receives the same tree again and again, reads every value, and after
each drop holds no descriptor and no mapping of it.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import pickle
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch
from _helpers import memfd_counts, proc_fd_passing

from tdshare import TensorDict, _handoff
from tdshare._fd_pass import unreleased
from tdshare._lazy_leaves import PendingLeaf

WAIT = 60
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]


HAS_PROC = proc_fd_passing()


def _tree(levels: int = 5, per: int = 4) -> TensorDict:
    """An anonymous tree of ``levels`` sub-levels of ``per`` leaves each, every value distinct."""
    subs = {
        f"sub{i}": TensorDict({f"x{j}": torch.arange(3.0) + 10 * i + j for j in range(per)}, batch_size=[])
        for i in range(levels)
    }
    return TensorDict({"a": torch.arange(4, dtype=torch.int64), **subs}, batch_size=[]).memmap_(None)


def _values(td: Any) -> dict[Any, list[Any]]:
    return {k: v.tolist() for k, v in td.items(include_nested=True, leaves_only=True)}


def _pending(td: Any) -> dict[tuple[str, ...], PendingLeaf]:
    """The tree's pending leaves by key (raw entries: nothing is mapped; no closure, so nothing of
    this is left for the garbage collector to free later)."""
    out: dict[tuple[str, ...], PendingLeaf] = {}
    todo: list[tuple[Any, tuple[str, ...]]] = [(td, ())]
    while todo:
        node, path = todo.pop()
        for key, value in dict.items(node._tensordict):
            if isinstance(value, TensorDict):
                todo.append((value, (*path, key)))
            elif type(value) is PendingLeaf:
                out[(*path, key)] = value
    return out


def _blob(td: TensorDict) -> bytes:
    memo = td.__dict__[_handoff._MEMO][0]  # (made by the first pickle of the tree)
    return memo.blob


def test_a_second_hand_off_reuses_the_template_and_reads_the_same_values() -> None:
    src = _tree()
    first = pickle.loads(ForkingPickler.dumps(src))
    blob = _blob(src)
    assert blob not in _handoff._ANON  # lent to ``first``
    leaves = {k: id(v) for k, v in _pending(first).items()}
    assert len(leaves) == 21
    assert _values(first) == _values(src)
    del first
    gc.collect()
    assert blob in _handoff._ANON  # returned, waiting for the next equal bytes
    assert all(v.segment is None for v in _handoff._ANON[blob].bound)  # and holding no segment
    second = pickle.loads(ForkingPickler.dumps(src))
    again = {k: id(v) for k, v in _pending(second).items()}
    # the same pending leaves, but the level freed last, which got new ones
    assert sum(leaves[k] == again[k] for k in leaves) >= len(leaves) - 4
    assert all(v.segment is src["a"]._segment for v in _pending(second).values())
    assert _values(second) == _values(src)
    second["sub2", "x1"][0] = -1.0  # the same memory as the source
    assert src["sub2", "x1"][0].item() == -1.0


def test_a_dropped_tree_leaves_no_segment_behind() -> None:
    src = _tree()
    seg = weakref.ref(src["a"]._segment)
    for _ in range(3):
        got = pickle.loads(ForkingPickler.dumps(src))
        assert _values(got) == _values(src)
        del got
    blob = _blob(src)
    del src
    gc.collect()
    assert blob in _handoff._ANON
    assert seg() is None  # freed: neither the cached template nor anything else holds it


def test_a_leaf_held_elsewhere_keeps_its_memory_when_its_tree_goes() -> None:
    src = _tree()
    want = _values(src)
    got = pickle.loads(ForkingPickler.dumps(src))
    elsewhere = got["sub1"]._tensordict.copy()  # a copy of the level's raw entries: pending leaves, shared
    assert type(dict.__getitem__(elsewhere, "x2")) is PendingLeaf
    seg = weakref.ref(src["a"]._segment)
    del got
    gc.collect()
    for _ in range(2):  # the template is lent and returned again meanwhile
        other = pickle.loads(ForkingPickler.dumps(src))
        assert _values(other) == want
        del other
        gc.collect()
    del src
    gc.collect()
    assert seg() is not None  # the leaves held elsewhere keep the segment alive
    assert {k: elsewhere[k].tolist() for k in ("x0", "x1", "x2", "x3")} == {
        f"x{j}": want[("sub1", f"x{j}")] for j in range(4)
    }
    del elsewhere
    gc.collect()
    assert seg() is None


def test_a_sub_level_that_outlives_its_root_keeps_the_template_lent() -> None:
    src = _tree()
    want = _values(src)
    got = pickle.loads(ForkingPickler.dumps(src))
    blob = _blob(src)
    sub = got["sub3"]
    del got
    gc.collect()
    assert blob not in _handoff._ANON  # still lent: a level of the tree lives
    fresh = pickle.loads(ForkingPickler.dumps(src))  # made afresh meanwhile
    assert _values(fresh) == want
    assert {k: v.tolist() for k, v in sub.items()} == {f"x{j}": want[("sub3", f"x{j}")] for j in range(4)}
    del sub, fresh
    gc.collect()
    assert blob in _handoff._ANON


def test_two_live_trees_of_one_source_are_independent_and_pickle_again() -> None:
    src = _tree()
    want = _values(src)
    one = pickle.loads(ForkingPickler.dumps(src))
    two = pickle.loads(ForkingPickler.dumps(src))
    assert not set(map(id, _pending(one).values())) & set(map(id, _pending(two).values()))
    del one
    gc.collect()
    assert _values(two) == want  # the second keeps working after the first is dropped
    again = pickle.loads(ForkingPickler.dumps(two))  # a received tree pickles again
    assert _values(again) == want
    del two
    gc.collect()
    assert _values(again) == want


def _fork_reads(td: Any, out: Any) -> None:
    out.put(_values(td))


@pytest.mark.timeout(120)
def test_a_forked_child_reads_a_received_tree_while_its_template_is_lent() -> None:
    src = _tree()
    want = _values(src)
    got = pickle.loads(ForkingPickler.dumps(src))
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_fork_reads, args=(got, out))
    proc.start()
    try:
        assert out.get(timeout=WAIT) == want
    finally:
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0
    assert _values(got) == want


def _receive_again_and_again(inbox: Any, out: Any) -> None:
    gc.collect()
    out.put(memfd_counts())
    while True:
        waiting = len(_handoff._ANON)
        td = inbox.get(timeout=WAIT)
        if td is None:
            break
        reused = len(_handoff._ANON) == waiting - 1  # a template waiting there is lent now
        values = _values(td)
        held = memfd_counts()
        back = ForkingPickler.dumps(td).tobytes()  # a received tree pickles again
        del td
        gc.collect()
        out.put((values, held, reused, back))
        assert inbox.get(timeout=WAIT) == "received"  # the sender has opened what ``back`` hands over
        out.put((unreleased(), memfd_counts()))


@pytest.mark.skipif(not HAS_PROC, reason="descriptors cannot be handed through /proc here")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
def test_a_live_worker_receives_the_same_tree_again_and_frees_it_each_time(method: str) -> None:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "tdshare"])
    inbox, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receive_again_and_again, args=(inbox, out))
    proc.start()  # before the tree exists: a forked worker must not inherit it
    try:
        before = out.get(timeout=WAIT)
        src = _tree(levels=20, per=10)
        want = _values(src)
        for round_ in range(4):
            inbox.put(src)
            values, held, reused, back = out.get(timeout=WAIT)
            assert values == want
            assert held[0] == before[0] + 1 and held[1] >= before[1] + 1  # one descriptor, one mapping
            assert reused == (round_ > 0)  # the template of the first hand-off serves the next ones
            returned = pickle.loads(back)
            assert _values(returned) == want
            del returned
            inbox.put("received")
            unreleased_there, after = out.get(timeout=WAIT)
            assert unreleased_there == 0 and after == before  # dropped: nothing of it left in the worker
    finally:
        inbox.put(None)
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0
