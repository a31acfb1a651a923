"""Leaves that ``memmap_`` / ``memmap`` / ``save`` write into a folder stay unmapped until first read.

Each written leaf comes back as a pending leaf (its file written, closed and its inode known) and
is mapped on first access; these tests pin that the first access gives what an eagerly mapped
leaf gives (class, ``filename``, values, write-through, other processes, pickling, the readers of
a tensordict), over every container kind, and that nothing the caller holds is lost.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import uuid
from pathlib import Path
from typing import Any

import pytest
import tensordict
import torch
from _helpers import Gather
from _kinds import KINDS, build

from tdshare import CorruptDataError, MemoryMappedTensor, TensorDict, TensorDictFuture
from tdshare._lazy_leaves import LazyLeaves, PendingLeaf
from tdshare._mapping_limits import live_mappings

WAIT = 60
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]


def _ctx(method: str) -> Any:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "tdshare"])
    return ctx


def _mapped(path: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(path) for line in f)


def _level_of_a(td: Any, kind: str, folder: Path, member: int = 1) -> tuple[Any, Path]:
    """The tensordict level holding leaf ``a`` (member ``member`` of a lazy stack) and the file of ``a``."""
    if kind == "tensordict":
        return td, folder / "a.memmap"
    if kind == "tensorclass":
        return td._tensordict, folder / "_tensordict" / "a.memmap"
    return td.tensordicts[member], folder / str(member) / "a.memmap"


def _eager(path: Path, like: torch.Tensor) -> MemoryMappedTensor:
    """The file mapped at once, as an eager write would have returned it."""
    return MemoryMappedTensor.from_filename(str(path), dtype=like.dtype, shape=like.shape)


# -- what a first access gives -------------------------------------------------------------------
@pytest.mark.parametrize("atomic", [False, True], ids=["plain", "atomic"])
@pytest.mark.parametrize("kind", KINDS)
def test_written_leaves_are_mapped_only_when_read(kind: str, atomic: bool, tmp_path: Path) -> None:
    src = build(kind)
    folder = tmp_path / f"t-{uuid.uuid4().hex}"
    out = src.memmap_(folder, atomic=atomic)
    assert out is src and src.is_memmap() and src.is_locked
    level, path = _level_of_a(src, kind, folder)
    raw = level._tensordict
    assert isinstance(raw, LazyLeaves) and type(dict.__getitem__(raw, "a")) is PendingLeaf
    assert not _mapped(str(path))
    leaf = level["a"]
    assert type(leaf) is MemoryMappedTensor and leaf.filename == str(path) and _mapped(str(path))
    eager = _eager(path, leaf)
    assert torch.equal(leaf, eager) and leaf.dtype == eager.dtype and leaf.shape == eager.shape
    assert leaf._ino == os.stat(path).st_ino and leaf._mode is None
    assert level["a"] is leaf  # mapped once
    expected = build(kind)
    assert (src == expected).all()


@pytest.mark.parametrize("kind", KINDS)
def test_memmap_and_save_return_pending_leaves_and_leave_the_source_alone(kind: str, tmp_path: Path) -> None:
    src = build(kind)
    for name, call in (("m", lambda p: src.memmap(p)), ("s", lambda p: src.save(p))):
        folder = tmp_path / name
        out = call(folder)
        assert out is not src and not src.is_memmap() and out.is_memmap()
        level, path = _level_of_a(out, kind, folder)
        assert type(dict.__getitem__(level._tensordict, "a")) is PendingLeaf
        assert level["a"].filename == str(path)
        assert (out == src).all()


@pytest.mark.parametrize("kind", KINDS)
def test_writes_through_a_written_leaf_reach_the_file(kind: str, tmp_path: Path) -> None:
    src = build(kind)
    folder = tmp_path / "t"
    src.memmap_(folder)
    level, path = _level_of_a(src, kind, folder)
    level["a"].fill_(42.0)
    assert _eager(path, level["a"]).tolist() == level["a"].tolist()
    again = type(src).load_memmap(folder)
    assert _level_of_a(again, kind, folder)[0]["a"].tolist() == level["a"].tolist()
    if kind == "tensordict":  # and the reference reads the same file
        assert tensordict.TensorDict.load_memmap(folder)["a"].tolist() == [42.0] * 4


@pytest.mark.parametrize("kind", KINDS)
def test_written_kinds_equal_their_source_through_every_reader(kind: str, tmp_path: Path) -> None:
    src = build(kind)

    def written() -> Any:
        return build(kind).memmap_(tmp_path / f"t-{uuid.uuid4().hex}")

    assert (written() == src).all()
    pairs = zip(written().values(True, True), src.values(True, True), strict=True)
    assert all(torch.equal(a, b) if isinstance(b, torch.Tensor) else a == b for a, b in pairs)
    got = [(k, v) for k, v in written().items(True, True)]
    assert [k for k, _ in got] == [k for k, _ in src.items(True, True)]
    assert all(type(v) is not PendingLeaf for _, v in got)
    assert (written().apply(lambda t: t * 2) == src.apply(lambda t: t * 2)).all()
    again = pickle.loads(pickle.dumps(written()))
    assert (again == src).all()
    assert (written().clone() == src).all()


def test_the_level_dict_reads_like_a_plain_one(tmp_path: Path) -> None:
    src = TensorDict(a=torch.arange(3.0), b=torch.ones(2, dtype=torch.int64), batch_size=[])
    for read in (
        lambda d: dict(d),
        lambda d: {**d},
        lambda d: dict(d.items()),
        lambda d: dict(zip(d.keys(), d.values(), strict=True)),
        lambda d: {k: d.get(k) for k in d},
        lambda d: pickle.loads(pickle.dumps(d)),
    ):
        raw = src.clone().memmap_(tmp_path / f"t-{uuid.uuid4().hex}")._tensordict
        got = read(raw)
        assert set(got) == {"a", "b"}
        for key, value in got.items():
            assert type(value) is MemoryMappedTensor and torch.equal(value, src[key])


def test_a_written_tree_costs_no_mapping_until_read(tmp_path: Path) -> None:
    td = TensorDict({f"g{i}": {f"x{j}": torch.full((2,), float(j)) for j in range(50)} for i in range(6)})
    before = live_mappings()
    td.memmap_(tmp_path / "t")
    assert live_mappings() - before < 20  # 300 leaf files, none mapped
    assert td["g3", "x7"].tolist() == [7.0, 7.0]
    pending = sum(type(v) is PendingLeaf for v in dict.values(td["g3"]._tensordict))
    assert pending == 49


def test_a_second_memmap_of_a_written_tree_maps_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    td = build("tensordict").memmap_(folder)
    ino = os.stat(folder / "a.memmap").st_ino
    td.memmap_(folder)  # the files are the tree's own: kept as they are
    assert type(dict.__getitem__(td._tensordict, "a")) is PendingLeaf
    assert os.stat(folder / "a.memmap").st_ino == ino
    assert td["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


# -- nothing the caller holds is lost ------------------------------------------------------------
def test_the_source_tensors_the_caller_holds_stay_as_they_were(tmp_path: Path) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    view = base[:, 1]  # not contiguous: written from a copy
    held = torch.arange(3)
    td = TensorDict(v=view, h=held, batch_size=[3]).memmap_(tmp_path / "t")
    td["v"].fill_(-1.0)
    td["h"].fill_(-1)
    assert base[:, 1].tolist() == [1.0, 5.0, 9.0] and held.tolist() == [0, 1, 2]  # the caller's, untouched
    ref = tensordict.TensorDict(v=base[:, 1], h=torch.arange(3), batch_size=[3]).memmap_(tmp_path / "ref")
    assert ref["v"].tolist() == TensorDict.load_memmap(tmp_path / "ref")["v"].tolist() == [1.0, 5.0, 9.0]


@pytest.mark.parametrize("atomic", [False, True], ids=["plain", "atomic"])
def test_a_resave_here_keeps_the_written_bytes_of_unread_leaves(atomic: bool, tmp_path: Path) -> None:
    folder = tmp_path / "t"
    first = TensorDict(a=torch.arange(4.0), n={"b": torch.ones(2)}, batch_size=[])
    first.memmap_(folder)
    assert type(dict.__getitem__(first._tensordict, "a")) is PendingLeaf
    TensorDict(a=torch.zeros(4), n={"b": torch.zeros(2)}, batch_size=[]).memmap(folder, atomic=atomic)
    assert first["a"].tolist() == [0.0, 1.0, 2.0, 3.0]  # as an eager leaf: the old file's bytes
    assert first["n", "b"].tolist() == [1.0, 1.0]
    assert TensorDict.load_memmap(folder)["a"].tolist() == [0.0] * 4


def test_copy_existing_copies_a_leaf_mapped_elsewhere_and_keeps_the_old_file(tmp_path: Path) -> None:
    old = TensorDict(a=torch.arange(3.0), batch_size=[]).memmap_(tmp_path / "old")
    old_a = old["a"]  # mapped, held by the caller
    td = TensorDict(a=old_a, batch_size=[])
    with pytest.raises(RuntimeError, match=r"copy_existing"):
        td.memmap_(tmp_path / "new")
    td.memmap_(tmp_path / "new", copy_existing=True)
    assert type(dict.__getitem__(td._tensordict, "a")) is PendingLeaf
    td["a"].fill_(7.0)
    assert old_a.tolist() == [0.0, 1.0, 2.0] and td["a"].filename == str(tmp_path / "new" / "a.memmap")
    assert TensorDict.load_memmap(tmp_path / "old")["a"].tolist() == [0.0, 1.0, 2.0]


def test_existsok_false_leaves_the_tensordict_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    TensorDict(a=torch.zeros(2), batch_size=[]).memmap(folder)
    td = TensorDict(a=torch.ones(2), batch_size=[])
    with pytest.raises(RuntimeError, match=r"existsok=False"):
        td.memmap_(folder, existsok=False)
    assert not td.is_memmap() and type(td["a"]) is torch.Tensor and td["a"].tolist() == [1.0, 1.0]


def test_return_early_gives_pending_leaves_once_the_future_is_done(tmp_path: Path) -> None:
    td = TensorDict({f"x{i}": torch.full((3,), float(i)) for i in range(10)}, batch_size=[])
    future = td.memmap_(tmp_path / "t", num_threads=2, return_early=True)
    assert isinstance(future, TensorDictFuture)
    out = future.result()
    assert out is td and type(dict.__getitem__(td._tensordict, "x4")) is PendingLeaf
    assert [td[f"x{i}"][0].item() for i in range(10)] == [float(i) for i in range(10)]
    assert td["x4"].filename == str(tmp_path / "t" / "x4.memmap")


def test_a_file_replaced_by_another_process_before_the_first_read_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    td = TensorDict(a=torch.arange(4.0), batch_size=[]).memmap_(folder)
    tmp = folder / "a.memmap.new"
    tmp.write_bytes(torch.zeros(4).numpy().tobytes())
    os.replace(tmp, folder / "a.memmap")  # what another process's re-save does
    with pytest.raises(CorruptDataError, match=r"a\.memmap.*replaced"):
        td["a"]


# -- other processes -----------------------------------------------------------------------------
def _child(td: Any, folder: str, ready: Any, go: Any, out: Any) -> None:
    try:
        seen = td["a"].tolist()  # a handle unpickled (or, forked, the parent's pending leaf)
        loaded = TensorDict.load_memmap(folder)
        loaded["n", "b"][0] = 5.0  # a write the parent sees
        ready.set()
        go.wait(WAIT)
        out.put((seen, td["a"].tolist(), TensorDict.load_memmap(folder)["a"].tolist()))
    except BaseException as err:  # reported to the parent
        out.put(repr(err))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_other_processes_see_writes_through_written_leaves(method: str, tmp_path: Path) -> None:
    ctx = _ctx(method)
    folder = tmp_path / f"t-{uuid.uuid4().hex}"
    td = TensorDict(a=torch.arange(4.0), n={"b": torch.zeros(2)}, batch_size=[]).memmap_(folder)
    td["a"][0] = 9.0  # mapped by this write, before the hand-off
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_child, args=(td, str(folder), ready, go, out))
    proc.start()
    try:
        assert ready.wait(WAIT)
        assert type(dict.__getitem__(td["n"]._tensordict, "b")) is PendingLeaf  # unread here until now
        assert td["n", "b"].tolist() == [5.0, 0.0]  # the child's write, through the file
        td["a"][1] = 8.0
        go.set()
        got = out.get(timeout=WAIT)
    finally:
        proc.join(timeout=WAIT)
    assert got == ([9.0, 1.0, 2.0, 3.0], [9.0, 8.0, 2.0, 3.0], [9.0, 8.0, 2.0, 3.0]), got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_read_written_leaves(method: str, tmp_path: Path) -> None:
    src = TensorDict(a=torch.arange(12.0).reshape(4, 3), n={"c": torch.ones(4, 2)}, batch_size=[4])
    td = src.clone().memmap_(tmp_path / "t")
    assert type(dict.__getitem__(td._tensordict, "a")) is PendingLeaf
    loader = torch.utils.data.DataLoader(
        range(4), batch_size=2, num_workers=1, collate_fn=Gather(td), multiprocessing_context=method
    )
    got = list(loader)
    assert [b["a"].tolist() for b in got] == [src["a"][:2].tolist(), src["a"][2:].tolist()]
    assert [b["n", "c"].tolist() for b in got] == [src["n", "c"][:2].tolist(), src["n", "c"][2:].tolist()]
