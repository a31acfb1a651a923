"""The receiver's hand-off caches (tdshare._handoff) keep nothing of a tree once the tree is gone.

A receiver remembers the last schemas it rebuilt (a folder tree's pending leaves, an anonymous
tree's template) to rebuild the same bytes again in one copy.  Whatever it remembers must not
hold what a tree made of it: after a received tree is dropped, the receiver holds no mapping and
no descriptor of its files or segments and none of its levels, whether the schema was new or
known, from a folder or anonymous, for more schemas than the caches hold; a leaf kept elsewhere
keeps only its own file or segment.  In one process (the counts compared with those of the source
alone) and in a live worker under spawn, fork and forkserver.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import pickle
import weakref
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import counts_under, memfd_counts, proc_fd_passing

from tdshare import TensorDict, _handoff
from tdshare._fd_pass import unreleased

WAIT = 60
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
HAS_PROC = proc_fd_passing()
SCHEMAS = _handoff._TREES_MAX + 3  # more schemas than the caches keep


def _fields(schema: int) -> dict[str, Any]:
    """A tree of 3 sub-levels (one nested deeper) whose keys depend on ``schema``; values distinct."""
    return {
        "a": torch.arange(4, dtype=torch.int64) + schema,
        **{
            f"s{schema}_{i}": {f"x{j}": torch.arange(3.0) + 100 * schema + 10 * i + j for j in range(3)}
            for i in range(3)
        },
        "deep": {"n": {f"y{schema}": torch.full((2,), float(schema))}},
    }


def _folder_tree(root: Path, schema: int) -> TensorDict:
    """A tree of schema ``schema`` memory-mapped to a folder under ``root``."""
    td = TensorDict(_fields(schema), batch_size=[]).memmap_(root / f"t{schema}")
    assert td.__reduce__()[0] is _handoff.rebuild_tree  # (pickled as one schema)
    return td


def _anon_tree(schema: int) -> TensorDict:
    return TensorDict(_fields(schema), batch_size=[]).memmap_(None)


def _values(td: Any) -> dict[Any, list[Any]]:
    return {k: v.tolist() for k, v in td.items(include_nested=True, leaves_only=True)}


def _want(schema: int) -> dict[Any, list[Any]]:
    return _values(TensorDict(_fields(schema), batch_size=[]))


def _levels(td: Any) -> list[weakref.ref[Any]]:
    """Weak references to every level of ``td`` (raw entries: nothing is mapped)."""
    out, todo = [], [td]
    while todo:
        node = todo.pop()
        out.append(weakref.ref(node))
        todo.extend(v for v in dict.values(node._tensordict) if isinstance(v, TensorDict))
    return out


def _alive(levels: list[weakref.ref[Any]]) -> int:
    return sum(r() is not None for r in levels)


def _hand_off(src: TensorDict) -> TensorDict:
    got = pickle.loads(ForkingPickler.dumps(src))
    assert type(got) is TensorDict
    return got


def _receive_read_drop(src: TensorDict, want: dict[Any, list[Any]]) -> list[weakref.ref[Any]]:
    got = _hand_off(src)
    assert _values(got) == want  # every leaf mapped
    levels = _levels(got)
    assert len(levels) == 6
    del got
    gc.collect()
    return levels


@pytest.mark.timeout(120)
def test_a_dropped_folder_tree_leaves_no_mapping_and_no_level_behind(tmp_path: Path) -> None:
    src = _folder_tree(tmp_path, 0)
    gc.collect()
    base = counts_under(str(tmp_path))  # the source's own
    want = _want(0)
    for round_ in range(3):  # a new schema, then a known one, twice
        levels = _receive_read_drop(src, want)
        assert _alive(levels) == 0, round_  # no level of it is held (the cache's dicts)
        assert counts_under(str(tmp_path)) == base, round_  # and no leaf of it stays mapped
    assert _values(src) == want


@pytest.mark.timeout(120)
def test_folder_trees_of_more_schemas_than_the_cache_holds_leave_nothing_behind(tmp_path: Path) -> None:
    sources = [_folder_tree(tmp_path, s) for s in range(SCHEMAS)]
    gc.collect()
    base = counts_under(str(tmp_path))
    for round_ in range(2):
        for s, src in enumerate(sources):
            levels = _receive_read_drop(src, _want(s))
            assert _alive(levels) == 0, (round_, s)
            assert counts_under(str(tmp_path)) == base, (round_, s)
    # two live trees of one schema (the second from the cached schema) are independent
    one, two = _hand_off(sources[1]), _hand_off(sources[1])
    one["s1_0", "x1"][0] = -5.0  # written through to the file ...
    assert two["s1_0", "x1"][0].item() == -5.0  # ... which the other maps on its own
    assert one["s1_0"] is not two["s1_0"]
    del one, two
    gc.collect()
    assert counts_under(str(tmp_path)) == base


@pytest.mark.skipif(not HAS_PROC, reason="descriptors cannot be handed through /proc here")
@pytest.mark.timeout(120)
def test_anonymous_trees_of_several_schemas_leave_no_descriptor_and_no_mapping(tmp_path: Path) -> None:
    gc.collect()
    before = memfd_counts()
    for round_ in range(2):
        for s in range(SCHEMAS):
            src = _anon_tree(s)
            levels = _receive_read_drop(src, _want(s))
            assert _alive(levels) == 0, (round_, s)
            del src
            gc.collect()
            assert unreleased() == 0  # (received in this process: each duplicate released at once)
            assert memfd_counts() == before, (round_, s)  # the cached templates hold no segment


@pytest.mark.skipif(not HAS_PROC, reason="descriptors cannot be handed through /proc here")
@pytest.mark.timeout(120)
def test_a_leaf_kept_elsewhere_keeps_only_its_own_file_or_segment(tmp_path: Path) -> None:
    # folder: the kept leaf's file stays mapped (once), no other file of the tree
    src = _folder_tree(tmp_path, 1)
    want = _want(1)
    gc.collect()
    base = counts_under(str(tmp_path))
    for round_ in range(2):
        got = _hand_off(src)
        assert _values(got) == want
        kept = got["s1_2", "x0"]
        del got
        gc.collect()
        assert counts_under(str(tmp_path)) == (base[0], base[1] + 1), round_
        assert kept.tolist() == want[("s1_2", "x0")]
        del kept
        gc.collect()
        assert counts_under(str(tmp_path)) == base, round_
    # anonymous: a tree over two segments; the kept leaf keeps its own segment, the other is freed
    gc.collect()
    before = memfd_counts()
    for round_ in range(2):
        first, second = _anon_tree(2), _anon_tree(3)
        mixed = TensorDict(one=first, two=second, batch_size=[])
        assert mixed["one", "a"]._segment is not mixed["two", "a"]._segment
        code = ForkingPickler.dumps(mixed)
        del first, second, mixed
        gc.collect()
        got = pickle.loads(code)
        del code
        assert _values(got["one"]) == _want(2) and _values(got["two"]) == _want(3)
        kept = got["two", "s3_1", "x2"]
        del got
        gc.collect()
        assert unreleased() == 0
        assert memfd_counts() == (before[0] + 1, before[1] + 1), round_  # the kept leaf's segment alone
        assert kept.tolist() == _want(3)[("s3_1", "x2")]
        del kept
        gc.collect()
        assert memfd_counts() == before, round_


def _worker(inbox: Any, out: Any, root: str) -> None:
    gc.collect()
    out.put(memfd_counts())
    while True:
        item = inbox.get(timeout=WAIT)
        if item is None:
            break
        td, want = item
        values = _values(td)
        levels = _levels(td)
        del td, item
        gc.collect()
        out.put((values == want, _alive(levels), counts_under(root), memfd_counts()))


@pytest.mark.skipif(not HAS_PROC, reason="descriptors cannot be handed through /proc here")
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", METHODS)
def test_a_live_worker_holds_nothing_of_the_trees_it_dropped(method: str, tmp_path: Path) -> None:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "tdshare"])
    inbox, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_worker, args=(inbox, out, str(tmp_path)))
    proc.start()  # before any tree exists: a forked worker must not inherit one
    try:
        before = out.get(timeout=WAIT)
        folders = [_folder_tree(tmp_path, s) for s in range(SCHEMAS)]
        anonymous = [_anon_tree(s) for s in range(3)]
        for round_ in range(2):
            for s, src in [*enumerate(folders), *enumerate(anonymous)]:
                inbox.put((src, _want(s)))
                same, alive, under, segments = out.get(timeout=WAIT)
                assert same and alive == 0, (round_, s)
                assert under == (0, 0) and segments == before, (round_, s, under, segments, before)
    finally:
        inbox.put(None)
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0
