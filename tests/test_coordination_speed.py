"""The coordination path at speed: the per-level record of new entries (meta.jsonl) and its
compaction, a writer killed mid-append, and leaves mapped on first read against eager ones."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import Gather
from _kinds import KINDS, build

import tdshare
from tdshare import CorruptDataError, TensorDict, compact_metadata
from tdshare._compaction import WRITE_THROUGH
from tdshare._lazy_leaves import LazyLeaves, PendingLeaf

WAIT = 60
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
MANY = WRITE_THROUGH + 40  # past the write-through size: the later entries go to the record


def _ctx(method: str) -> Any:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "tdshare"])
    return ctx


def _meta_keys(folder: Path) -> list[str]:
    return [k for k in json.loads((folder / "meta.json").read_text()) if k.startswith("k")]


def _add(td: Any, start: int, stop: int) -> None:
    for i in range(start, stop):
        td.make_memmap_from_tensor(f"k{i}", torch.full((3,), float(i)))


# -- the record and its compaction -------------------------------------------------------------
def test_small_levels_write_meta_json_at_once(tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    td = TensorDict({}, batch_size=[]).memmap_(tmp_path / "t")
    _add(td, 0, 10)
    assert not (tmp_path / "t" / "meta.jsonl").exists()
    ref = tensordict.TensorDict.load_memmap(tmp_path / "t")
    assert sorted(ref.keys()) == sorted(f"k{i}" for i in range(10)) and ref["k7"].tolist() == [7.0] * 3


def test_tensordict_lags_until_compaction_tdshare_does_not(tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    folder = tmp_path / "t"
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    _add(td, 0, MANY)
    assert (folder / "meta.jsonl").exists()
    on_disk = _meta_keys(folder)
    assert len(on_disk) < MANY  # meta.json lags: the rest is in the record
    assert on_disk == [f"k{i}" for i in range(len(on_disk))]  # a prefix, in order
    ours = TensorDict.load_memmap(folder)
    assert list(ours.keys()) == [f"k{i}" for i in range(MANY)]
    assert all(ours[f"k{i}"].tolist() == [float(i)] * 3 for i in range(MANY))
    ref = tensordict.TensorDict.load_memmap(folder)
    assert sorted(ref.keys()) == sorted(on_disk)  # up to the last compaction
    assert compact_metadata(td) == 1
    assert not (folder / "meta.jsonl").exists()
    assert _meta_keys(folder) == [f"k{i}" for i in range(MANY)]
    ref = tensordict.TensorDict.load_memmap(folder)
    assert ref[f"k{MANY - 1}"].tolist() == [float(MANY - 1)] * 3 and len(list(ref.keys())) == MANY
    assert compact_metadata(str(folder)) == 0  # nothing left to do


def test_compaction_cost_is_bounded_by_the_level_size(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    n = 4 * WRITE_THROUGH + 7
    for i in range(n):
        td.make_memmap(f"k{i}", [1])
        record = folder / "meta.jsonl"
        pending = record.read_bytes().count(b"\n") if record.exists() else 0
        fields = len(json.loads((folder / "meta.json").read_text()))
        assert pending <= max(WRITE_THROUGH, fields)  # never more than meta.json holds
    assert len(list(TensorDict.load_memmap(folder).keys())) == n


def test_nested_levels_and_refresh_read_the_record(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    writer = TensorDict({"n": TensorDict({}, batch_size=[])}, batch_size=[]).memmap_(folder)
    reader = TensorDict.load_memmap(folder).memmap_(folder)
    reader.memmap_refresh_()
    for i in range(MANY):
        writer.make_memmap_from_tensor(("n", f"k{i}"), torch.full((2,), float(i)))
        if i % 37 == 0:
            reader.memmap_refresh_()
            assert ("n", f"k{i}") in reader.keys(True)
    writer.make_memmap_from_tensor(("m", "deep"), torch.ones(2))
    reader.memmap_refresh_()
    assert [k for k in reader["n"].keys()] == [f"k{i}" for i in range(MANY)]
    assert reader["n", f"k{MANY - 1}"].tolist() == [float(MANY - 1)] * 2 and reader["m", "deep"].tolist() == [1.0, 1.0]
    compact_metadata(folder)
    writer.make_memmap("after", [2])
    reader.memmap_refresh_()
    assert "after" in reader.keys() and len(list(reader["n"].keys())) == MANY


def test_a_whole_resave_drops_the_record(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    _add(td, 0, MANY)
    assert (folder / "meta.jsonl").exists()
    TensorDict({"only": torch.ones(2)}, batch_size=[]).memmap(folder)
    assert not (folder / "meta.jsonl").exists()
    assert list(TensorDict.load_memmap(folder).keys()) == ["only"]


def test_a_torn_last_line_is_ignored_then_cut_off(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    _add(td, 0, MANY)
    with open(folder / "meta.jsonl", "ab") as f:
        f.write(b'{"torn": {"shape": [3], "dty')  # a writer killed mid-append
    assert list(TensorDict.load_memmap(folder).keys()) == [f"k{i}" for i in range(MANY)]
    other = TensorDict.load_memmap(folder).memmap_(folder)
    other.make_memmap_from_tensor("next", torch.ones(3))
    loaded = TensorDict.load_memmap(folder)
    assert list(loaded.keys())[-1] == "next" and "torn" not in loaded.keys()
    assert all(line.endswith(b"}") for line in (folder / "meta.jsonl").read_bytes().splitlines())


def test_a_damaged_record_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    _add(td, 0, MANY)
    with open(folder / "meta.jsonl", "ab") as f:
        f.write(b"garbage\n")
    with pytest.raises(CorruptDataError, match=r"meta\.jsonl"):
        TensorDict.load_memmap(folder)


def _appender(folder: str, ready: Any, release: Any) -> None:
    td = TensorDict.load_memmap(folder).memmap_(folder)
    _add(td, 0, MANY)
    ready.set()
    i = MANY
    while not release.is_set():  # keeps appending until killed
        td.make_memmap_from_tensor(f"k{i}", torch.full((3,), float(i)))
        i += 1


def _exits_normally(folder: str, done: Any) -> None:
    td = TensorDict.load_memmap(folder).memmap_(folder)
    _add(td, 0, MANY)
    done.set()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_sigkill_mid_append_leaves_a_folder_both_libraries_load(method: str, tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    ctx = _ctx(method)
    folder = tmp_path / f"t-{uuid.uuid4().hex}"
    TensorDict({}, batch_size=[]).memmap_(folder)
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_appender, args=(str(folder), ready, release), daemon=True)
    proc.start()
    try:
        assert ready.wait(timeout=WAIT)
    finally:
        proc.kill()
        proc.join(timeout=WAIT)
    assert proc.exitcode == -signal.SIGKILL
    ours = TensorDict.load_memmap(folder)
    keys = list(ours.keys())
    assert keys[:MANY] == [f"k{i}" for i in range(MANY)]  # every entry committed before the kill
    assert keys == [f"k{i}" for i in range(len(keys))]
    assert all(ours[k].tolist() == [float(k[1:])] * 3 for k in keys)
    ref = tensordict.TensorDict.load_memmap(folder)
    assert sorted(ref.keys()) == sorted(_meta_keys(folder))  # up to the last compaction
    TensorDict.load_memmap(folder).memmap_(folder).make_memmap("after", [3])  # the lock is free
    assert "after" in TensorDict.load_memmap(folder).keys()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_a_writer_that_exits_normally_compacts(method: str, tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    ctx = _ctx(method)
    folder = tmp_path / f"t-{uuid.uuid4().hex}"
    TensorDict({}, batch_size=[]).memmap_(folder)
    done = ctx.Event()
    proc = ctx.Process(target=_exits_normally, args=(str(folder), done))
    proc.start()
    assert done.wait(timeout=WAIT)
    proc.join(timeout=WAIT)
    assert proc.exitcode == 0
    assert not (folder / "meta.jsonl").exists()
    assert len(list(tensordict.TensorDict.load_memmap(folder).keys())) == MANY


# -- leaves mapped on first read -----------------------------------------------------------------
def _mapped(path: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(path) for line in f)


def _saved(tmp_path: Path) -> tuple[TensorDict, Path]:
    src = TensorDict(
        a=torch.arange(12.0).reshape(4, 3),
        b=torch.arange(4),
        n=TensorDict(c=torch.ones(4, 2, dtype=torch.float64), batch_size=[4]),
        batch_size=[4],
    )
    folder = tmp_path / "lazy"
    src.memmap(folder)
    return src, folder


def test_a_loaded_leaf_is_mapped_only_when_read(tmp_path: Path) -> None:
    src, folder = _saved(tmp_path)
    td = TensorDict.load_memmap(folder)
    raw = td._tensordict
    assert isinstance(raw, LazyLeaves) and type(dict.__getitem__(raw, "a")) is PendingLeaf
    path_a = str(folder / "a.memmap")
    assert not _mapped(path_a)
    assert td["b"].tolist() == [0, 1, 2, 3]
    assert not _mapped(path_a) and type(dict.__getitem__(raw, "a")) is PendingLeaf
    assert torch.equal(td["a"], src["a"]) and _mapped(path_a)
    assert isinstance(td["a"], tdshare.MemoryMappedTensor) and td["a"].filename == path_a


def test_lazy_leaves_read_exactly_like_eager_ones(tmp_path: Path) -> None:
    src, folder = _saved(tmp_path)

    def fresh() -> dict:
        return TensorDict.load_memmap(folder)["n"]._tensordict | {}  # resolved through the mapping protocol

    for read in (
        lambda d: dict(d),
        lambda d: {**d},
        lambda d: dict(d.copy()),
        lambda d: dict(d.items()),
        lambda d: dict(zip(d.keys(), d.values(), strict=True)),
        lambda d: {k: d.get(k) for k in d},
        lambda d: {k: d[k] for k in list(d)},
        lambda d: pickle.loads(pickle.dumps(d)),
    ):
        lazy = TensorDict.load_memmap(folder)._tensordict
        got = read(lazy)
        for key, value in dict.items(got):
            assert type(value) is not PendingLeaf
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, src[key])
    assert set(fresh()) == {"c"}
    lazy = TensorDict.load_memmap(folder)._tensordict
    assert lazy.pop("a").tolist() == src["a"].tolist() and lazy.setdefault("b").tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("kind", KINDS)
def test_loaded_kinds_equal_their_source_through_every_reader(kind: str, tmp_path: Path) -> None:
    src = build(kind)
    src.memmap(tmp_path / kind)
    lazy = type(src).load_memmap(tmp_path / kind)
    assert (lazy == src).all()
    pairs = zip(lazy.values(True, True), src.values(True, True), strict=True)
    assert all(torch.equal(a, b) if isinstance(b, torch.Tensor) else a == b for a, b in pairs)
    assert [k for k, _ in lazy.items(True, True)] == [k for k, _ in src.items(True, True)]
    assert (lazy.apply(lambda t: t * 2) == src.apply(lambda t: t * 2)).all()
    again = pickle.loads(pickle.dumps(type(src).load_memmap(tmp_path / kind)))
    assert (again == src).all()


def test_a_leaf_removed_after_load_is_named_when_read(tmp_path: Path) -> None:
    _, folder = _saved(tmp_path)
    td = TensorDict.load_memmap(folder)
    os.unlink(folder / "a.memmap")
    with pytest.raises(CorruptDataError, match=r"a\.memmap"):
        td["a"]
    os.truncate(folder / "n" / "c.memmap", 8)
    with pytest.raises(CorruptDataError, match=r"c\.memmap.*truncated"):
        td["n", "c"]
    assert td["b"].tolist() == [0, 1, 2, 3]


def test_load_still_checks_every_file(tmp_path: Path) -> None:
    _, folder = _saved(tmp_path)
    os.truncate(folder / "a.memmap", 4)
    with pytest.raises(CorruptDataError, match=r"a\.memmap"):
        TensorDict.load_memmap(folder)


def _read_one(td: Any, key: Any, out: Any) -> None:
    raw = td._tensordict
    out.put((type(raw).__name__, td[key].tolist(), sum(type(v) is PendingLeaf for v in dict.values(raw))))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("anonymous", [False, True], ids=["folder", "anonymous"])
def test_a_handed_off_td_maps_only_what_the_worker_reads(method: str, anonymous: bool, tmp_path: Path) -> None:
    ctx = _ctx(method)
    src = TensorDict({f"x{i}": torch.full((2,), float(i)) for i in range(20)}, batch_size=[])
    td = src.memmap_(None if anonymous else tmp_path / f"t-{uuid.uuid4().hex}")
    out = ctx.Queue()
    proc = ctx.Process(target=_read_one, args=(td, "x7", out))
    proc.start()
    try:
        kind, value, pending = out.get(timeout=WAIT)
    finally:
        proc.join(timeout=WAIT)
    assert value == [7.0, 7.0]
    if method != "fork":  # a forked child inherits the parent's mapped leaves; the others unpickle handles
        assert kind == "LazyLeaves" and pending == 19


def test_a_pending_leaf_pickles_as_a_handle_without_mapping(tmp_path: Path) -> None:
    src, folder = _saved(tmp_path)
    td = TensorDict.load_memmap(folder).memmap_(folder)  # writes nothing: the files are the same
    loaded = TensorDict.load_memmap(folder)
    loaded._memmap_prefix = str(folder)
    again = pickle.loads(pickle.dumps(loaded))
    assert type(dict.__getitem__(again._tensordict, "a")) is PendingLeaf
    assert (again == src).all() and (td == src).all()


# -- the ring of changes: a refresh reads only the levels that changed ---------------------------
def test_refresh_follows_the_ring_and_falls_back_when_it_cannot(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    src = TensorDict(
        {f"s{j}": TensorDict({"x": torch.zeros(2)}, batch_size=[]) for j in range(5)}, s="old", batch_size=[]
    )
    writer = src.memmap_(folder)
    reader = TensorDict.load_memmap(folder).memmap_(folder)
    reader.memmap_refresh_()
    writer.make_memmap_from_tensor(("s3", "y"), torch.ones(2))  # one nested level changed: in the ring
    writer.make_memmap_from_tensor("top", torch.full((2,), 2.0))
    reader.memmap_refresh_()
    assert reader["s3", "y"].tolist() == [1.0, 1.0] and reader["top"].tolist() == [2.0, 2.0]
    writer.set_("s", "new")  # a non-tensor write says no level: every level is read
    writer.make_memmap_from_tensor(("s1", "y"), torch.ones(2))
    reader.memmap_refresh_()
    assert reader["s"] == "new" and ("s1", "y") in reader.keys(True)
    for i in range(70):  # more commits than the ring holds
        writer.make_memmap(("s0", f"z{i}"), [1])
    writer.make_memmap_from_tensor(("fresh", "deep"), torch.ones(2))  # a new nested level
    reader.memmap_refresh_()
    assert len([k for k in reader["s0"].keys() if k.startswith("z")]) == 70
    assert reader["fresh", "deep"].tolist() == [1.0, 1.0]
    sub = TensorDict.load_memmap(folder, subpath="s2").memmap_(folder / "s2")
    sub.memmap_refresh_()
    writer.make_memmap(("s2", "w"), [2])
    writer.make_memmap(("s4", "w"), [2])  # outside the sub-level: nothing to do there
    sub.memmap_refresh_()
    assert sorted(sub.keys()) == ["w", "x"]
    assert sorted(TensorDict.load_memmap(folder)["s4"].keys()) == ["w", "x"]


def test_packing_a_folder_with_a_record_keeps_every_entry(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    _add(td, 0, MANY)
    assert (folder / "meta.jsonl").exists()
    archive = tdshare.pack_memmap(folder, tmp_path / "t.tdz")
    loaded = TensorDict.load_memmap(archive)
    assert list(loaded.keys()) == [f"k{i}" for i in range(MANY)]
    assert loaded[f"k{MANY - 1}"].tolist() == [float(MANY - 1)] * 3


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_read_lazy_leaves_like_eager_ones(method: str, tmp_path: Path) -> None:
    src, folder = _saved(tmp_path)
    lazy = TensorDict.load_memmap(folder)
    assert type(dict.__getitem__(lazy._tensordict, "a")) is PendingLeaf
    loader = torch.utils.data.DataLoader(
        range(4), batch_size=2, num_workers=1, collate_fn=Gather(lazy), multiprocessing_context=method
    )
    got = [batch for batch in loader]
    assert [b["a"].tolist() for b in got] == [src["a"][:2].tolist(), src["a"][2:].tolist()]
    assert [b["n", "c"].tolist() for b in got] == [src["n", "c"][:2].tolist(), src["n", "c"][2:].tolist()]


def test_a_resave_here_keeps_unread_leaves_a_file_replaced_elsewhere_is_named(tmp_path: Path) -> None:
    src, folder = _saved(tmp_path)
    held = TensorDict.load_memmap(folder)
    assert type(dict.__getitem__(held._tensordict, "a")) is PendingLeaf
    TensorDict(a=torch.zeros(4, 3), b=torch.zeros(4, dtype=torch.int64), batch_size=[4]).memmap(folder)
    assert torch.equal(held["a"], src["a"])  # mapped before this process replaced the file
    other = TensorDict.load_memmap(folder)
    tmp = folder / "b.memmap.new"
    tmp.write_bytes(torch.arange(4).numpy().tobytes())
    os.replace(tmp, folder / "b.memmap")  # what another process's re-save does
    with pytest.raises(CorruptDataError, match=r"b\.memmap.*replaced"):
        other["b"]
    assert TensorDict.load_memmap(folder)["b"].tolist() == [0, 1, 2, 3]  # loading again reads the new file


def test_a_partial_resave_here_leaves_the_other_unread_leaves_readable(tmp_path: Path) -> None:
    """A re-save by this process that rewrites one file and reuses another: the loaded leaf of the
    rewritten file keeps its bytes, the one whose file was left alone reads it (this process's own
    epoch step is no replacement of it), as eager leaves would."""
    src, folder = _saved(tmp_path)
    held = TensorDict.load_memmap(folder)
    assert type(dict.__getitem__(held._tensordict, "a")) is PendingLeaf
    assert type(dict.__getitem__(held._tensordict, "b")) is PendingLeaf
    reused = TensorDict.load_memmap(folder)["b"]  # mapped: saved back in place, not rewritten
    TensorDict(a=torch.full((4, 3), 7.0), b=reused, batch_size=[4]).memmap_(folder, existsok=True)
    assert torch.equal(held["a"], src["a"])  # its file was replaced: mapped first
    assert torch.equal(held["b"], src["b"])  # its file is the same: read as it is
    assert TensorDict.load_memmap(folder)["a"].tolist() == [[7.0] * 3] * 4


def test_the_info_command_lists_entries_not_compacted_yet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tdshare.__main__ import main

    folder = tmp_path / "t"
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    _add(td, 0, MANY)
    assert (folder / "meta.jsonl").exists()
    assert main(["info", str(folder)]) == 0
    assert f"k{MANY - 1}  float32  [3]" in capsys.readouterr().out


# -- hand-off to a live worker: a pickle of levels' codes, remembered on both sides ----------------
def _live_worker(inbox: Any, outbox: Any) -> None:
    """Answer each request: ("take", td, keys) keeps td and reports those keys, ("refresh", keys)
    refreshes the kept td first, ("read", keys) reads the kept td, ("hold", td) only keeps it;
    None stops."""
    held: Any = None
    while (msg := inbox.get()) is not None:
        if msg[0] == "hold":
            held = msg[1]
            outbox.put("held")
            continue
        try:
            if msg[0] == "take":
                held = msg[1]
            elif msg[0] == "refresh":
                held.memmap_refresh_()
            values = {}
            for key in msg[-1]:
                value = held.get(key)
                values[key] = value.tolist() if isinstance(value, torch.Tensor) else value.data
            outbox.put(("ok", values, held.is_locked, held.is_memmap(), sorted(map(str, held.keys(True, True)))))
        except Exception as err:  # reported to the parent, which asserts on it
            outbox.put(("error", type(err).__name__, str(err)))


def _view(td: Any, keys: list[Any]) -> tuple[Any, ...]:
    """What the worker reports, computed here from the parent's td."""
    values = {}
    for key in keys:
        value = td.get(key)
        values[key] = value.tolist() if isinstance(value, torch.Tensor) else value.data
    return ("ok", values, td.is_locked, td.is_memmap(), sorted(map(str, td.keys(True, True))))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("anonymous", [False, True], ids=["folder", "anonymous"])
def test_a_live_worker_sees_what_the_parent_has_at_every_hand_off(method: str, anonymous: bool, tmp_path: Path) -> None:
    ctx = _ctx(method)
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_live_worker, args=(inbox, outbox))
    proc.start()  # before the td exists: a forked worker inherits nothing of it

    def ask(*msg: Any) -> Any:
        inbox.put(msg)
        return outbox.get(timeout=WAIT)

    try:
        src = TensorDict(
            {"a": torch.arange(6.0).reshape(2, 3), "n": {"c": torch.zeros(2), "e": torch.ones(4)}, "note": "hello"},
            batch_size=[],
        )
        td = src.memmap_(None if anonymous else tmp_path / f"t-{uuid.uuid4().hex}")
        keys: list[Any] = ["a", ("n", "c"), "note"]
        for _ in range(3):  # the same td again and again: the codes remembered on both sides
            assert ask("take", td, keys) == _view(td, keys)
        td["a"].mul_(2)  # shared memory: the worker sees the new values through the same pages
        assert ask("read", keys) == _view(td, keys)
        td["a"].t_()  # in place, the geometry: the next hand-off carries the new shape
        got = ask("take", td, keys)
        assert got == _view(td, keys) and got[1]["a"] == [[0.0, 6.0], [2.0, 8.0], [4.0, 10.0]]
        td["a"].t_()
        assert ask("take", td, keys) == _view(td, keys)
        if not anonymous:
            td.make_memmap_from_tensor(("n", "d"), torch.full((3,), 5.0))
            wider = [*keys, ("n", "d")]
            loaded = TensorDict.load_memmap(td._memmap_prefix)  # a second handle on the folder, lazy
            assert ask("take", loaded, wider) == _view(loaded, wider)
            got = ask("take", td, wider)  # a new entry: a level's codes differ from the remembered ones
            assert got == _view(td, wider) and got[1][("n", "d")] == [5.0] * 3
            td.make_memmap_from_tensor("k", torch.full((2,), 7.0))
            got = ask("refresh", [*wider, "k"])  # the kept td follows additions made here
            assert got[0] == "ok" and got[1]["k"] == [7.0, 7.0] and got[1][("n", "d")] == [5.0] * 3
            td.make_memmap_from_tensor(("n", "f"), torch.zeros(2))
            assert ask("hold", td) == "held"  # the worker reads nothing of it
            os.remove(Path(td._memmap_prefix) / "n" / "f.memmap")
            status, name, message = ask("read", [("n", "f")])
            assert (status, name) == ("error", "CorruptDataError") and "f.memmap" in message
        td.unlock_()
        if not anonymous:
            del td["n", "f"]
        td["note"] = "bye"  # in-memory state: a non-tensor value and the lock
        got = ask("take", td, keys)
        assert got == _view(td, keys) and got[1]["note"] == "bye" and got[2] is False
        td.lock_()
        assert ask("take", td, keys)[2] is True
    finally:
        inbox.put(None)
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0


def test_a_pickle_follows_in_place_changes_of_a_leaf(tmp_path: Path) -> None:
    td = TensorDict({"a": torch.arange(12.0).reshape(3, 4), "b": torch.zeros(5)}, batch_size=[]).memmap_(tmp_path / "t")
    first = pickle.dumps(td)
    assert pickle.dumps(td) == first  # unchanged: the same bytes (the remembered codes)
    for change in (lambda t: t.unsqueeze_(0), lambda t: t.squeeze_(0), lambda t: t.t_(), lambda t: t.t_()):
        change(td["a"])
        again = pickle.loads(pickle.dumps(td))
        assert again["a"].shape == td["a"].shape and torch.equal(again["a"], td["a"])
    renamed = td.unlock_().rename_key_("a", "z")  # the same tensor under another key: not a.memmap's code
    again = pickle.loads(pickle.dumps(renamed))
    assert again["z"].tolist() == td["z"].tolist() and "a" not in again.keys()


# -- the hand-off's last costs: keys() maps nothing, a rebuild's lock walk, meta.json swapped in ---
def _first_leaf(inbox: Any, ready: Any, go: Any, out: Any) -> None:
    """Take a nested td from ``inbox``; report what reading the first key of the first level
    mapped; once ``go`` is set, read the same leaf again (the parent wrote it meanwhile)."""
    td = inbox.get(timeout=WAIT)
    first = next(iter(td.keys()))
    level = td[first]
    names = list(level.keys())  # keys only: maps none of the level's leaves
    pending_after_keys = sum(type(v) is PendingLeaf for v in dict.values(level._tensordict))
    value = level[names[0]].tolist()
    pending_after_read = sum(type(v) is PendingLeaf for v in dict.values(level._tensordict))
    ready.set()
    assert go.wait(timeout=WAIT)
    out.put((first, names, pending_after_keys, value, pending_after_read, level[names[0]].tolist()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("anonymous", [False, True], ids=["folder", "anonymous"])
def test_a_received_tree_maps_only_the_leaf_read_and_sees_later_writes(
    method: str, anonymous: bool, tmp_path: Path
) -> None:
    ctx = _ctx(method)
    src = TensorDict(
        {f"sub{s}": {f"x{j}": torch.full((3,), float(10 * s + j)) for j in range(6)} for s in range(4)}, batch_size=[]
    )
    td = src.memmap_(None if anonymous else tmp_path / f"t-{uuid.uuid4().hex}")
    inbox, out, ready, go = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_first_leaf, args=(inbox, ready, go, out))
    proc.start()  # before the td exists: even a forked worker gets it only through the queue
    try:
        inbox.put(td)
        assert ready.wait(timeout=WAIT)
        td["sub0", "x0"].fill_(-1.0)  # after the worker unpickled and read it: shared pages
        go.set()
        first, names, pending_keys, value, pending_read, again = out.get(timeout=WAIT)
    finally:
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0
    assert (first, names) == ("sub0", [f"x{j}" for j in range(6)])
    assert value == [0.0, 0.0, 0.0] and again == [-1.0, -1.0, -1.0]
    assert (pending_keys, pending_read) == (6, 5)  # keys() mapped nothing, the read mapped one leaf


def test_keys_of_a_loaded_tree_map_no_leaf(tmp_path: Path) -> None:
    src = TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(2), "m": {"c": torch.zeros(1)}}}, batch_size=[])
    src.memmap(tmp_path / "t")
    td = TensorDict.load_memmap(tmp_path / "t")
    assert sorted(map(str, td.keys(True, True))) == sorted(map(str, src.keys(True, True)))
    assert list(td["n"].keys()) == ["b", "m"]
    for level in (td, td["n"], td["n", "m"]):
        assert all(type(v) is PendingLeaf for v in dict.values(level._tensordict) if not isinstance(v, TensorDict))
    assert (td == src).all()  # reading still maps (values, ==)


def test_a_rebuilt_locked_tree_records_its_lock_parents(tmp_path: Path) -> None:
    src = TensorDict({"n": {"m": {"c": torch.zeros(2)}, "b": torch.ones(2)}, "a": torch.zeros(2)}, batch_size=[])
    for prefix in (tmp_path / "t", None):
        again = pickle.loads(pickle.dumps(src.clone().memmap_(prefix))) if prefix else None
        if again is None:  # anonymous memory travels by descriptor: through multiprocessing's pickler
            from multiprocessing.reduction import ForkingPickler

            again = pickle.loads(ForkingPickler.dumps(src.clone().memmap_(None)))
        n, m = again.get("n"), again.get(("n", "m"))
        assert again.is_locked and n.is_locked and m.is_locked
        assert again._lock_parents_weakrefs == []  # locked itself
        assert any(ref() is again for ref in n._lock_parent_refs)
        assert {id(ref()) for ref in m._lock_parent_refs} >= {id(again), id(n)}
        again.unlock_()
        assert not n.is_locked and not m.is_locked and torch.equal(again["n", "b"], torch.ones(2))


def test_a_known_file_is_swapped_in_atomically(tmp_path: Path) -> None:
    from tdshare._files import TMP_MARK, replace_file

    path = tmp_path / "meta.json"
    path.write_bytes(b'{"old": 1}')
    old_ino = path.stat().st_ino
    with open(path, "rb") as reader:  # a reader that opened the old file keeps its bytes
        replace_file(str(path), b'{"new": 2}', existing=True)
        assert reader.read() == b'{"old": 1}'
    assert path.read_bytes() == b'{"new": 2}' and path.stat().st_ino != old_ino
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]  # the old file is gone, no temporary left
    gone = tmp_path / "gone.json"  # "existing" but missing: created as by a rename
    replace_file(str(gone), b"{}", existing=True)
    assert gone.read_bytes() == b"{}" and not any(TMP_MARK in p.name for p in tmp_path.iterdir())


def test_a_small_level_commits_through_the_swap_and_tensordict_reads_it(tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    folder = tmp_path / "t"
    td = TensorDict({"a": torch.zeros(2)}, batch_size=[]).memmap_(folder)
    inodes = set()
    for i in range(5):  # a level under WRITE_THROUGH entries: meta.json rewritten at each addition
        td.make_memmap_from_tensor(f"k{i}", torch.full((2,), float(i)))
        inodes.add((folder / "meta.json").stat().st_ino)
        assert _meta_keys(folder) == [f"k{j}" for j in range(i + 1)]
    assert len(inodes) == 5 and not (folder / "meta.jsonl").exists()
    ref = tensordict.TensorDict.load_memmap(folder)
    assert [ref[f"k{i}"].tolist() for i in range(5)] == [[float(i)] * 2 for i in range(5)]
    assert sorted(os.listdir(folder)) == sorted(["meta.json", "a.memmap", *[f"k{i}.memmap" for i in range(5)]])


def test_the_benchmarks_byte_compile_the_library_a_spawned_worker_imports() -> None:
    import importlib.util
    import sys

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks._common import byte_compile

    assert byte_compile(tdshare) is True
    init = tdshare.__file__
    assert init is not None and os.path.exists(importlib.util.cache_from_source(init))


def _keep_two(inbox: Any, out: Any) -> None:
    first, second = inbox.get(timeout=WAIT), inbox.get(timeout=WAIT)
    with open("/proc/self/maps") as f:
        mappings = [line for line in f if "/memfd:tdshare" in line]  # one per mapping of a segment
    out.put((len(mappings), first["a"].data_ptr() == second["a"].data_ptr(), second["a"].tolist()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_an_anonymous_td_received_twice_is_mapped_once(method: str) -> None:
    ctx = _ctx(method)
    td = TensorDict({"a": torch.arange(4.0), "b": torch.ones(3)}, batch_size=[]).memmap_(None)
    inbox, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_keep_two, args=(inbox, out))
    proc.start()
    try:
        inbox.put(td)
        td["a"].add_(1)  # between the two hand-offs: both copies view the same pages
        inbox.put(td)
        count, same, value = out.get(timeout=WAIT)
    finally:
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0
    assert (count, same, value) == (1, True, [1.0, 2.0, 3.0, 4.0])
