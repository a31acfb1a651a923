"""The kept transfer plans of tdshare.distributed never go stale: every way of changing a tree
between two sends reaches the receiver (values bit for bit, a changed layout detected), a
consolidated receiver keeps receiving into its own storage, and a peer killed in the steady state
is an error, not a hang.

Real gloo groups on spawned ranks (``_run`` of test_distributed: a FileStore under tmp_path,
the group's timeout and ``timeout=`` on every transfer bound each wait).  Both ranks build the
same tree and apply the same changes, so the receiving rank knows what must arrive.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_distributed import _bits, _run

from tdshare import TensorDict
from tdshare import distributed as tdd


def _tree() -> TensorDict:
    return TensorDict(
        a=torch.arange(6.0).view(2, 3),
        m=torch.arange(4.0).view(2, 2),
        n=TensorDict(i=torch.arange(6).view(2, 3), x=torch.zeros(2, 2), batch_size=[2]),
        note="first",
        batch_size=[2],
    )


def _set_data(td: TensorDict) -> None:
    td["a"].data = torch.full((2, 3), 9.0)  # the memory moves, the version counter does not


def _raw_write(td: TensorDict) -> None:
    td._tensordict["a"] = torch.full((2, 3), -1.0)  # straight into the entry dict


def _replace_level(td: TensorDict) -> None:
    td["n"] = TensorDict(i=torch.arange(6).view(2, 3) + 100, x=torch.ones(2, 2), batch_size=[2])


def _batch_size(td: TensorDict) -> None:
    td.batch_size = torch.Size([])


# (name, change, whether the layout stays: keys, dtypes and shapes)
CHANGES: list[tuple[str, Callable[[TensorDict], Any], bool]] = [
    ("in place add_", lambda td: td["a"].add_(1), True),
    ("zero_ and fill", lambda td: td.zero_()["m"].fill_(3), True),
    ("apply_", lambda td: td.apply_(lambda t: t * 2 + 1), True),
    ("__setitem__ replacing a leaf", lambda td: td.__setitem__("a", td["a"] + 10), True),
    ("set of a nested leaf", lambda td: td.set(("n", "i"), td["n", "i"] * 3), True),
    ("update_ in place", lambda td: td.update_({"m": torch.full((2, 2), 5.0)}), True),
    ("transpose_ of a square leaf (strides only)", lambda td: td["m"].transpose_(0, 1), True),
    (".data = another tensor", _set_data, True),
    ("share_memory_ of one leaf", lambda td: (td["m"].share_memory_(), td["m"].add_(7)), True),
    ("a write into the entry dict itself", _raw_write, True),
    ("a non-tensor value replaced", lambda td: td.__setitem__("note", "second"), True),
    ("a non-tensor value set_ in place", lambda td: td.set_("note", "third"), True),
    ("a nested level replaced", _replace_level, True),
    ("a new key", lambda td: td.set("new", torch.full((2, 2), 7.0)), False),
    ("a new nested key", lambda td: td.set(("n", "z"), torch.ones(2, 1)), False),
    ("del", lambda td: td.__delitem__("new"), False),
    ("pop of a nested key", lambda td: td.pop(("n", "z")), False),
    ("rename_key_", lambda td: td.rename_key_("a", "b"), False),
    ("update adding a key", lambda td: td.update({"b": torch.full((2, 3), 4.0), "u": torch.ones(2)}), False),
    ("a leaf of another dtype, same shape", lambda td: td.__setitem__("u", torch.ones(2, dtype=torch.int64)), False),
    ("unsqueeze_ in place (shape)", lambda td: td["n", "x"].unsqueeze_(-1), False),
    ("batch size", _batch_size, False),
    ("in place after all of it", lambda td: td["b"].mul_(-2), True),
]


def _content(td: Any) -> dict[str, Any]:
    """Every entry: a tensor's dtype, shape and bits; a non-tensor's value; plus the batch size."""
    out: dict[str, Any] = {"batch_size": list(td.batch_size)}
    for key, value in td.items(True, True):
        if isinstance(value, torch.Tensor):
            out[str(key)] = (str(value.dtype), list(value.shape), _bits(value))
        else:
            out[str(key)] = value
    return out


def _ptrs(td: Any) -> list[int]:
    return [v.data_ptr() for v in td.values(True, True) if isinstance(v, torch.Tensor)]


def _changes(rank: int, world: int, consolidated: bool) -> list[tuple[str, bool, bool, bool]]:
    """Rank 0 changes its tree and sends it after each change; rank 1 applies the same change to
    its replica and receives into a preallocated tree (a new one after a layout change)."""
    td = _tree()
    if consolidated:  # every change below then starts from a consolidated tree (unlocked to change it)
        td = td.consolidate().unlock_()
    if rank == 0:
        tdd.send(td, 1, timeout=20)
        for _, change, _ in CHANGES:
            change(td)
            tdd.send(td, 1, timeout=20)
        return []
    target = _tree().zero_()
    tdd.recv(target, 0, timeout=20)
    report = []
    for name, change, _ in CHANGES:
        change(td)  # what rank 0 now holds
        ptrs = _ptrs(target)
        try:
            got = tdd.recv(target, 0, timeout=20)
            mismatch = False
        except tdd.SchemaMismatchError as err:
            got, mismatch = err.received, True
        same = _content(got) == _content(td)
        kept = not mismatch and _ptrs(got) == ptrs
        report.append((name, mismatch, same, kept))
        if mismatch:
            target = got  # the next change is received into the tree that arrived
    return report


@pytest.mark.parametrize("consolidated", [False, True], ids=["plain", "consolidated"])
def test_every_change_between_two_sends_arrives_and_a_new_layout_is_detected(
    tmp_path: Path, consolidated: bool
) -> None:
    report = _run(2, _changes, tmp_path, consolidated, timeout=120)[1]
    assert [r[0] for r in report] == [c[0] for c in CHANGES]
    for (name, mismatch, same, kept), (_, _, layout_stays) in zip(report, CHANGES, strict=True):
        assert same, f"{name}: the receiver does not hold what was sent"
        assert mismatch == (not layout_stays), f"{name}: the layout change was {'' if mismatch else 'not '}reported"
        assert kept == layout_stays, f"{name}: the receiving tree's tensors were {'' if kept else 'not '}kept"


def _consolidated_in_place(rank: int, world: int) -> dict[str, Any]:
    """Both trees consolidated: rank 1 receives into its own storage, round after round."""
    whole = _tree().consolidate()
    if rank == 0:
        for step in range(6):
            whole["a"].add_(step)  # in place: the consolidated tree stays as it is
            whole["n", "i"].mul_(2)
            tdd.send(whole, 1, tag=3, timeout=20)
        return {}
    target = _tree().zero_().consolidate()
    storage = tdd.leaves_of(target)[0].untyped_storage().data_ptr()
    ptrs = _ptrs(target)
    expected = _tree()
    seen = []
    for step in range(6):
        expected["a"].add_(step)
        expected["n", "i"].mul_(2)
        got = tdd.recv(target, 0, tag=3, timeout=20)
        seen.append(
            (
                got is target,
                _content(got) == _content(expected),
                _ptrs(got) == ptrs,
                tdd.leaves_of(got)[0].untyped_storage().data_ptr() == storage,
                got.is_consolidated(),
            )
        )
    return {"seen": seen}


def test_a_consolidated_receiver_receives_into_its_own_storage(tmp_path: Path) -> None:
    seen = _run(2, _consolidated_in_place, tmp_path, timeout=90)[1]["seen"]
    assert seen == [(True, True, True, True, True)] * 6


def _broadcast_changes(rank: int, world: int) -> list[bool]:
    """A consolidated tree broadcast to 3 ranks, changed in place and then in its layout."""
    td = _tree().consolidate()
    target = td if rank == 0 else _tree().zero_().consolidate()
    same = []
    for step in range(4):
        if step == 2:
            td = td.unlock_()
            td["a"] = td["a"] - 100  # a replaced leaf: no longer consolidated, the same layout
        if step == 3:
            td["new"] = torch.ones(2)  # a new key: another layout
        td["m"].add_(step)
        if rank == 0:
            tdd.broadcast(td, 0, timeout=20)
            continue
        try:
            got = tdd.broadcast(target, 0, timeout=20)
        except tdd.SchemaMismatchError as err:
            got = target = err.received
        same.append(_content(got) == _content(td))
    return same


def test_broadcast_of_a_changing_consolidated_tree_world_4(tmp_path: Path) -> None:
    results = _run(4, _broadcast_changes, tmp_path, timeout=120)
    assert all(results[r] == [True] * 4 for r in (1, 2, 3))


def _two_receipts_outstanding(rank: int, world: int, consolidated: bool) -> list[bool]:
    """In the steady state, two ``irecv`` on one stream posted before either is waited for: each
    gets its own transfer, in order (the header recognised at once, the stream's record kept)."""
    td = _tree().consolidate() if consolidated else _tree()
    if rank == 0:
        for step in range(5):
            td["a"].add_(step)  # in place: the layout stays
            tdd.send(td, 1, tag=6, timeout=20)
        return []
    expected = _tree()
    targets = [_tree().zero_() for _ in range(2)]
    tdd.recv(targets[0], 0, tag=6, timeout=20)
    expected["a"].add_(0)
    seen = [_content(targets[0]) == _content(expected)]
    for _ in range(2):
        handles = [tdd.irecv(t, 0, tag=6, timeout=20) for t in targets]
        for handle in handles:
            got = handle.wait(timeout=20)
            expected["a"].add_(len(seen))
            seen.append(_content(got) == _content(expected))
    return seen


@pytest.mark.parametrize("consolidated", [False, True], ids=["plain", "consolidated"])
def test_two_outstanding_irecv_in_the_steady_state_each_get_their_transfer(tmp_path: Path, consolidated: bool) -> None:
    assert _run(2, _two_receipts_outstanding, tmp_path, consolidated, timeout=120)[1] == [True] * 5


def _killed_in_steady_state(rank: int, world: int, consolidated: bool) -> str:
    td = _tree().consolidate() if consolidated else _tree()
    target = _tree().zero_().consolidate() if consolidated else _tree().zero_()
    for _ in range(3):  # the stream is steady: the header and the data are one message
        if rank == 0:
            tdd.send(td, 1, tag=5, timeout=20)
        else:
            tdd.recv(target, 0, tag=5, timeout=20)
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.wait(["posted"], timedelta(seconds=20))
        os._exit(0)  # dies with rank 1's receipt posted and no send coming
    store.set("posted", "1")
    with pytest.raises(tdd.PeerError, match=r"rank 0") as info:
        tdd.recv(target, 0, tag=5, timeout=5)
    return str(info.value)


@pytest.mark.parametrize("consolidated", [False, True], ids=["plain", "consolidated"])
def test_a_peer_killed_in_the_steady_state_is_an_error_not_a_hang(tmp_path: Path, consolidated: bool) -> None:
    message = _run_one(tmp_path, consolidated)
    assert "rank 0" in message


def _run_one(tmp_path: Path, consolidated: bool) -> str:
    """``_killed_in_steady_state`` on 2 ranks; only rank 1 reports (rank 0 dies)."""
    from test_distributed import _run

    results = _run(2, _killed_in_steady_state, tmp_path, consolidated, timeout=90, reports=1)
    assert list(results) == [1], results
    return str(results[1])


def _other() -> TensorDict:
    """A tree of another layout than ``_tree`` (one more key)."""
    td = _tree()
    td["extra"] = torch.full((2,), 5.0)
    return td


def _consolidated_stream_turns(rank: int, world: int) -> list[tuple[str, bool, bool, bool]]:
    """Both trees consolidated, the steady stream interrupted every way: another layout sent
    on the same tag (the receiver's quick receipt sees another header), the receiver's own tree
    changed between two receipts (in place, a non-tensor value, a new key), the sender's changed
    in place.  Rank 1 reports per step: what arrived is what was sent, whether it arrived in the
    target's own storage, and whether the stream's quick receipt is recorded after it."""
    from tdshare._wire_streams import framed_receipt

    whole = _tree().consolidate()
    other = _other().consolidate()
    # (name, what rank 0 sends, what rank 1 does to its target first)
    steps: list[tuple[str, Any, Callable[[Any], Any] | None]] = [
        ("first", whole, None),
        ("second (steady)", whole, None),
        ("third (quick)", whole, None),
        ("another layout on the tag", other, None),
        ("back to the first layout", whole, None),
        ("steady again", whole, None),
        ("quick again", whole, None),
        ("target changed in place", whole, lambda t: t["a"].add_(100)),
        ("sender changed in place", whole, None),
        ("quick after it", whole, None),
        # (no longer consolidated: received through the general path, the value sent back in)
        ("target's non-tensor value changed", whole, lambda t: t.set_("note", "mine")),
    ]
    if rank == 0:
        for name, tree, _ in steps:
            if name == "sender changed in place":
                whole["m"].add_(3)
            tdd.send(tree, 1, tag=9, timeout=20)
        return []
    target = _tree().zero_().consolidate()
    storage = tdd.leaves_of(target)[0].untyped_storage().data_ptr()
    expected = _tree()
    key = (id(dist.group.WORLD), 0, 9)
    report = []
    for name, _, local in steps:
        if name == "sender changed in place":
            expected["m"].add_(3)
        if local is not None:
            local(target)
        sent = _other() if name == "another layout on the tag" else expected
        try:
            got = tdd.recv(target, 0, tag=9, timeout=20)
        except tdd.SchemaMismatchError as err:
            got = err.received
        in_place = got is target and tdd.leaves_of(got)[0].untyped_storage().data_ptr() == storage
        report.append((name, _content(got) == _content(sent), in_place, framed_receipt(target, key) is not None))
    return report


def test_a_consolidated_stream_interrupted_every_way_stays_exact(tmp_path: Path) -> None:
    report = _run(2, _consolidated_stream_turns, tmp_path, timeout=120)[1]
    names = [r[0] for r in report]
    by_name = {r[0]: r[1:] for r in report}
    assert all(same for same, _, _ in by_name.values()), report
    # every receipt of the first layout lands in the target's own storage
    assert all(by_name[n][1] for n in names if n != "another layout on the tag"), report
    assert not by_name["another layout on the tag"][1]
    # the quick receipt is recorded once the stream is steady, and dropped by anything else
    recorded = [by_name[n][2] for n in names]
    assert recorded == [False, True, True, False, False, True, True, True, True, True, False], report


def _dropped_with_its_tree(rank: int, world: int) -> bool:
    """The streams' records of a consolidated tree never keep its storage alive."""
    import gc
    import weakref

    from tdshare import consolidated_parts

    whole = _tree().consolidate() if rank == 0 else _tree().zero_().consolidate()
    for _ in range(3):
        if rank == 0:
            tdd.send(whole, 1, tag=4, timeout=20)
        else:
            tdd.recv(whole, 0, tag=4, timeout=20)
    ref = weakref.ref(consolidated_parts(whole)[0])
    del whole
    gc.collect()
    return ref() is None


def test_a_consolidated_trees_stream_records_die_with_it(tmp_path: Path) -> None:
    assert _run(2, _dropped_with_its_tree, tmp_path, timeout=90) == {0: True, 1: True}
