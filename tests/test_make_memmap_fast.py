"""The fast path of make_memmap / make_memmap_from_tensor (tdshare/_adder.py).

Once a level has a record (meta.jsonl), an addition by the process that committed last to the
tree skips re-validating the level.  These tests check that what it writes (files, meta.json,
meta.jsonl) is byte for byte what the general path writes, that other processes see every entry,
that every change it cannot see by itself (another process's commit, a torn line, a compaction at
another process's exit, a file left at the name) sends it to the general path, and that the
errors are the general path's.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import tensordict
import torch
from _kinds import KINDS, build

import tdshare
import tdshare._adder as adder_mod
import tdshare._entries as entries_mod
import tdshare._live_entries as live_mod
from tdshare import MemmapError, SharedRegistry, TensorDict
from tdshare._compaction import WRITE_THROUGH
from tdshare._errors import BatchSizeError, InvalidArgumentError
from tdshare._journal import compact_level

N = 3 * WRITE_THROUGH + 7  # past the write-through entries and two compactions
TIMEOUT = 60
METHODS = ["spawn", "fork", "forkserver"]


def _general_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_mod, "fast_add", lambda *args: None)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the additions that took the general path."""
    calls: list[int] = []
    real = entries_mod.add_entry

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(live_mod, "add_entry", counted)
    return calls


def _in_threads(fn: Callable[[int], None], n: int) -> list[BaseException]:
    """Run ``fn(0)`` ... ``fn(n - 1)`` in ``n`` threads started together; the errors they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def run(t: int) -> None:
        try:
            start.wait(TIMEOUT)
            fn(t)
        except BaseException as err:  # pragma: no cover - reported by the caller
            errors.append(err)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT)
    return errors


def _value(i: int) -> torch.Tensor:
    return [torch.arange(6.0) + i, torch.full((2, 3), i, dtype=torch.int64), torch.tensor(i % 2 == 0)][i % 3]


def _fill(td: TensorDict, n: int = N) -> None:
    for i in range(n):
        if i % 2:
            td.make_memmap(f"k{i}", [3, i % 4 + 1], dtype=torch.float16 if i % 3 else torch.int32)
        else:
            td.make_memmap_from_tensor(f"k{i}", _value(i))


def _folder_bytes(folder: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def test_files_and_metadata_equal_the_general_paths(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = TensorDict({}, batch_size=[]).memmap_(str(tmp_path) + "/fast")
    calls = _counting(monkeypatch)
    _fill(fast)
    assert len(calls) < N // 2  # most additions took the fast path
    with monkeypatch.context() as m:
        _general_only(m)
        slow = TensorDict({}, batch_size=[]).memmap_(str(tmp_path) + "/slow")
        _fill(slow)
    assert _folder_bytes(str(tmp_path) + "/fast") == _folder_bytes(str(tmp_path) + "/slow")
    assert "meta.jsonl" in os.listdir(str(tmp_path) + "/fast")  # the record is compared too
    for i in range(N):
        a, b = fast[f"k{i}"], slow[f"k{i}"]
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        assert a.filename == os.path.join(str(tmp_path), "fast", f"k{i}.memmap")
    assert torch.equal(fast["k6"], _value(6)) and fast["k1"].sum() == 0
    # the returned tensors are the files: a write is in the file; pickled they map the same file
    fast["k0"][0] = 42.0
    loaded = TensorDict.load_memmap(str(tmp_path) + "/fast")
    assert loaded["k0"][0] == 42.0 and sorted(loaded.keys()) == sorted(slow.keys())
    tdshare.compact_metadata(fast)
    ref = tensordict.TensorDict.load_memmap(str(tmp_path) + "/fast")
    assert set(ref.keys()) == {f"k{i}" for i in range(N)} and torch.equal(ref["k6"], _value(6))


def test_nested_level_and_batch(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    td = TensorDict(sub=TensorDict(x=torch.zeros(2, 1), batch_size=[2]), batch_size=[2]).memmap_(str(tmp_path))
    calls = _counting(monkeypatch)
    for i in range(N):
        td.make_memmap_from_tensor(("sub", f"v{i}"), torch.full((2, 2), float(i)))
    assert len(calls) < N // 2
    with pytest.raises(BatchSizeError, match=r"does not start with the batch size"):
        td.make_memmap(("sub", "bad"), [3, 2])
    loaded = TensorDict.load_memmap(str(tmp_path))
    assert [loaded["sub", f"v{i}"][1, 1].item() for i in range(N)] == [float(i) for i in range(N)]
    reg = SharedRegistry.for_tensordict(td)
    seen = reg.generation
    td.make_memmap(("sub", "last"), [2])
    assert reg.changes_since(seen, reg.generation) == ["sub"]  # the ring names the level, as before


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind(tmp_path: object, kind: str) -> None:
    obj = build(kind).memmap_(str(tmp_path))
    target = obj.tensordicts[1] if kind == "lazy" else obj  # a lazy stack adds to a member
    keys = [f"e{i}" if kind == "lazy" else ("n", f"e{i}") for i in range(N)]  # a tensorclass: into a field
    rows = 1 if kind == "lazy" else 4
    for i, key in enumerate(keys):
        target.make_memmap_from_tensor(key, torch.full((rows, 2) if rows > 1 else (2,), float(i)))
    back = type(obj).load_memmap(str(tmp_path))
    level = back.tensordicts[1] if kind == "lazy" else back
    assert [level[key].sum().item() for key in keys] == [2.0 * rows * i for i in range(N)]
    assert torch.equal(back["a"], build(kind)["a"])  # the rest of the tree is untouched


def _adder_child(folder: str, ready: object, go: object, out: object) -> None:
    td = TensorDict.load_memmap(folder).memmap_()
    td.make_memmap_from_tensor("child", torch.arange(3.0))  # between two of the parent's additions
    ready.set()  # type: ignore[attr-defined]
    go.wait(TIMEOUT)  # type: ignore[attr-defined]
    try:
        td.make_memmap("p_after", [1])
    except MemmapError as err:
        out.put(str(err))  # type: ignore[attr-defined]
    else:
        out.put("added")  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", METHODS)
def test_other_process_commits_between(tmp_path: object, method: str) -> None:
    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(WRITE_THROUGH + 5):  # the fast path is warm
        td.make_memmap(f"p{i}", [2])
    ctx = mp.get_context(method)
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_adder_child, args=(folder, ready, go, out))
    proc.start()
    try:
        assert ready.wait(TIMEOUT)
        td.make_memmap_from_tensor("p_next", torch.ones(2))  # must see the child's line, not overwrite it
        with pytest.raises(MemmapError, match=r"already exists .*added by another process"):
            td.make_memmap("child", [3])  # not in memory here, on disk: the general path's error
        td.make_memmap("p_after", [1])
        go.set()
        assert "already exists" in out.get(timeout=TIMEOUT)
    finally:
        proc.join(TIMEOUT)
    assert proc.exitcode == 0
    loaded = TensorDict.load_memmap(folder)
    assert loaded["child"].tolist() == [0.0, 1.0, 2.0] and loaded["p_next"].tolist() == [1.0, 1.0]
    assert {f"p{i}" for i in range(WRITE_THROUGH + 5)} <= set(loaded.keys())
    assert td.memmap_refresh_()["child"].tolist() == [0.0, 1.0, 2.0]


def test_a_small_levels_entries_take_the_fast_path_and_tensordict_sees_each(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under WRITE_THROUGH entries a level has no record: after the first (general) addition, the
    next ones rewrite its meta.json by the fast path, and tensordict reads each one at once."""
    folder = str(tmp_path)
    td = TensorDict({"s0": {}, "s1": {}}, batch_size=[]).memmap_(folder)
    calls = _counting(monkeypatch)
    n = WRITE_THROUGH - 10  # meta.json's fields (shape, device, ...) count towards WRITE_THROUGH too
    for i in range(n):
        for level in ("s0", "s1"):
            td.make_memmap_from_tensor((level, f"k{i}"), torch.full((2,), float(i)))
    assert len(calls) == 2  # the first addition to each level
    assert not any(name.endswith(".jsonl") for _, _, names in os.walk(folder) for name in names)
    ref = tensordict.TensorDict.load_memmap(folder)
    for level in ("s0", "s1"):
        assert [ref[level, f"k{i}"][0].item() for i in range(n)] == [float(i) for i in range(n)]


def _small_level_child(folder: str, out: object) -> None:
    td = TensorDict.load_memmap(folder).memmap_()
    td.make_memmap_from_tensor(("s0", "child"), torch.arange(3.0))
    out.put("added")  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", METHODS)
def test_other_process_rewrites_a_small_level_between(
    tmp_path: object, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process adds to a small level; this process then adds to another level (the
    general path: the generation moved) and back to the first: its meta.json is not the one this
    process wrote, so the general path adds, keeping the other process's entry."""
    folder = str(tmp_path)
    td = TensorDict({"s0": {}, "s1": {}}, batch_size=[]).memmap_(folder)
    for level in ("s0", "s1"):
        td.make_memmap((level, "first"), [2])
        td.make_memmap((level, "second"), [2])  # the fast path is warm for both levels
    ctx = mp.get_context(method)
    out = ctx.Queue()
    proc = ctx.Process(target=_small_level_child, args=(folder, out))
    proc.start()
    try:
        assert out.get(timeout=TIMEOUT) == "added"
    finally:
        proc.join(TIMEOUT)
    assert proc.exitcode == 0
    calls = _counting(monkeypatch)
    td.make_memmap_from_tensor(("s1", "p1"), torch.ones(2))
    td.make_memmap_from_tensor(("s0", "p0"), torch.full((2,), 5.0))
    assert len(calls) == 2
    td.make_memmap_from_tensor(("s0", "p0b"), torch.full((2,), 6.0))
    assert len(calls) == 2  # this process wrote s0 last again: the fast path
    for back in (TensorDict.load_memmap(folder), tensordict.TensorDict.load_memmap(folder)):
        assert set(back["s0"].keys()) == {"first", "second", "child", "p0", "p0b"}
        assert back["s0", "child"].tolist() == [0.0, 1.0, 2.0] and back["s0", "p0b"].tolist() == [6.0, 6.0]
        assert set(back["s1"].keys()) == {"first", "second", "p1"}


def _reader_child(folder: str, n: int, out: object) -> None:
    td = TensorDict.load_memmap(folder)
    out.put([td[f"k{i}"].sum().item() for i in range(n)])  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", METHODS)
def test_readers_in_other_processes_see_every_entry(tmp_path: object, method: str) -> None:
    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(N):
        td.make_memmap_from_tensor(f"k{i}", torch.full((4,), float(i)))
    ctx = mp.get_context(method)
    out = ctx.Queue()
    proc = ctx.Process(target=_reader_child, args=(folder, N, out))
    proc.start()
    try:
        assert out.get(timeout=TIMEOUT) == [4.0 * i for i in range(N)]
    finally:
        proc.join(TIMEOUT)
    assert proc.exitcode == 0


def _fork_adder(td: TensorDict, out: object) -> None:
    td.make_memmap_from_tensor("from_child", torch.full((2,), 7.0))  # the inherited adder is not used
    out.put("ok")  # type: ignore[attr-defined]


def test_forked_child_with_warm_adder(tmp_path: object) -> None:
    td = TensorDict({}, batch_size=[]).memmap_(str(tmp_path))
    for i in range(WRITE_THROUGH + 3):
        td.make_memmap(f"k{i}", [2])
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_fork_adder, args=(td, out))
    proc.start()
    assert out.get(timeout=TIMEOUT) == "ok"
    proc.join(TIMEOUT)
    assert proc.exitcode == 0
    td.make_memmap("after", [2])  # the child committed (and compacted at its exit): general path
    assert td.memmap_refresh_()["from_child"].tolist() == [7.0, 7.0]
    assert {"after", "from_child", "k0"} <= set(TensorDict.load_memmap(str(tmp_path)).keys())


def test_torn_line_of_a_killed_writer(tmp_path: object) -> None:
    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(WRITE_THROUGH + 3):
        td.make_memmap(f"k{i}", [2])
    with open(os.path.join(folder, "meta.jsonl"), "ab") as f:
        f.write(b'{"dead": {"device": "cp')  # a writer killed mid-append: no newline, no bump
    td.make_memmap_from_tensor("next", torch.ones(2))
    td.make_memmap_from_tensor("next2", torch.ones(2) * 2)
    with open(os.path.join(folder, "meta.jsonl"), "rb") as f:
        record = f.read()
    assert b"dead" not in record and record.endswith(b"\n")
    loaded = TensorDict.load_memmap(folder)
    assert "dead" not in loaded and loaded["next2"].tolist() == [2.0, 2.0]


def test_compaction_elsewhere_without_a_bump(tmp_path: object) -> None:
    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(WRITE_THROUGH + 3):
        td.make_memmap(f"k{i}", [2])
    reg = SharedRegistry.for_tensordict(td)
    gen = reg.generation
    with reg.lock():
        assert compact_level(folder)  # what another process does at its normal exit: no bump
    assert reg.generation == gen
    td.make_memmap_from_tensor("after", torch.ones(2))  # an append to the unlinked record would be lost
    loaded = TensorDict.load_memmap(folder)
    assert loaded["after"].tolist() == [1.0, 1.0] and "k0" in loaded


def test_file_left_at_the_name(tmp_path: object) -> None:
    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(WRITE_THROUGH + 3):
        td.make_memmap(f"k{i}", [2])
    with open(os.path.join(folder, "stale.memmap"), "wb") as f:
        f.write(b"\xff" * 8)  # a writer killed between its file and its line
    ino = os.stat(os.path.join(folder, "stale.memmap")).st_ino
    assert td.make_memmap("stale", [2]).tolist() == [0.0, 0.0]  # a new inode, zero-filled
    assert os.stat(os.path.join(folder, "stale.memmap")).st_ino != ino
    os.symlink("/etc/passwd", os.path.join(folder, "link.memmap"))
    with pytest.raises(MemmapError, match=r"symlink"):
        td.make_memmap("link", [2])
    assert "link" not in td and "link" not in TensorDict.load_memmap(folder)


def test_errors_are_the_general_paths(tmp_path: object) -> None:
    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[2]).memmap_(folder)
    for i in range(WRITE_THROUGH + 3):
        td.make_memmap(f"k{i}", [2])
    with pytest.raises(MemmapError, match=r"The key 'k1' already exists"):
        td.make_memmap("k1", [2])
    with pytest.raises(MemmapError, match=r"already exists"):
        td.make_memmap_from_tensor("k2", torch.ones(2))
    with pytest.raises(BatchSizeError, match=r"does not start with the batch size \[2\]"):
        td.make_memmap("short", [3])
    with pytest.raises(MemmapError, match=r"must not be negative"):
        td.make_memmap("neg", [2, -1])
    with pytest.raises(TypeError):
        td.make_memmap(3, [2])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"field name of meta.json"):
        td.make_memmap("shape", [2], robust_key=False)
    assert not {"short", "neg", "shape"} & set(td.keys())
    assert not {"short.memmap", "neg.memmap"} & set(os.listdir(folder))
    # keys the fast path leaves to the general one still work and name their files the same way
    td.make_memmap("a b", [2])
    td.make_memmap("é", [2])
    assert td["a b"].filename != td["é"].filename and os.path.exists(td["a b"].filename)
    assert len(list(TensorDict.load_memmap(folder).keys())) == WRITE_THROUGH + 5


def test_line_bytes_equal_entry_line(tmp_path: object) -> None:
    from tdshare._format import leaf_entry
    from tdshare._journal import entry_line

    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(WRITE_THROUGH + 1):
        td.make_memmap(f"k{i}", [1])
    adder = SharedRegistry.for_tensordict(td).adders[folder]
    assert isinstance(adder, adder_mod.Adder)
    for shape, dtype in (((3, 2), torch.bfloat16), ((), torch.bool), ((5,), torch.complex64)):
        td.make_memmap(f"x{len(shape)}", list(shape), dtype=dtype)
        with open(os.path.join(folder, "meta.jsonl"), "rb") as f:
            last = f.read().splitlines(keepends=True)[-1]
        assert last == entry_line(f"x{len(shape)}", leaf_entry(torch.Size(shape), dtype))


def test_from_tensor_sources(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(WRITE_THROUGH + 1):
        td.make_memmap(f"k{i}", [1])
    base = torch.arange(12.0).reshape(3, 4)
    sources = {
        "transposed": base.T,  # not contiguous
        "grad": torch.ones(3, requires_grad=True),
        "conj": (torch.arange(3.0) * (1 + 1j)).to(torch.complex64).conj(),  # a lazy conjugate
        "neg": torch.arange(3.0)._neg_view(),  # a lazy negation
        "zeros_like": base,  # copy_data=False below
    }
    calls = _counting(monkeypatch)
    for key, src in sources.items():
        td.make_memmap_from_tensor(key, src, copy_data=key != "zeros_like")
    assert not calls  # these went through the fast path
    loaded = TensorDict.load_memmap(folder)
    for key, src in sources.items():
        want = torch.zeros_like(base) if key == "zeros_like" else src.detach().resolve_conj().resolve_neg()
        assert torch.equal(loaded[key], want) and torch.equal(td[key], want), key
        assert not td[key].requires_grad


def test_round_robin_over_levels(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = str(tmp_path)
    levels = 3
    td = TensorDict({f"s{j}": TensorDict({}, batch_size=[]) for j in range(levels)}, batch_size=[]).memmap_(folder)
    calls = _counting(monkeypatch)
    n = levels * (WRITE_THROUGH + 40)
    for i in range(n):
        td.make_memmap_from_tensor((f"s{i % levels}", f"k{i}"), torch.full((2,), float(i)))
    # the first WRITE_THROUGH + 1 of each level take the general path; the rest, interleaved, the fast one
    assert len(calls) <= levels * (WRITE_THROUGH + 2)
    reg = SharedRegistry.for_tensordict(td)
    with reg.lock():
        reg.bump()  # a commit of another kind breaks the chain: the next addition re-validates
    before = len(calls)
    td.make_memmap_from_tensor(("s0", "after"), torch.ones(2))
    td.make_memmap_from_tensor(("s1", "after"), torch.ones(2))
    assert len(calls) == before + 2 and not set(reg.adders) - {os.path.join(folder, "s0"), os.path.join(folder, "s1")}
    loaded = TensorDict.load_memmap(folder)
    assert [loaded[f"s{i % levels}", f"k{i}"][0].item() for i in range(n)] == [float(i) for i in range(n)]
    assert loaded["s0", "after"].tolist() == [1.0, 1.0] == loaded["s1", "after"].tolist()


def test_threads_adding_to_one_level(tmp_path: object) -> None:

    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(WRITE_THROUGH + 1):
        td.make_memmap(f"w{i}", [1])

    def add(t: int) -> None:
        for i in range(150):
            td.make_memmap_from_tensor(f"t{t}_{i}", torch.full((2,), float(i)))

    assert not _in_threads(add, 3)
    loaded = TensorDict.load_memmap(folder)
    assert all(loaded[f"t{t}_{i}"].tolist() == [float(i)] * 2 for t in range(3) for i in range(150))
    tdshare.compact_metadata(folder)
    assert len(tensordict.TensorDict.load_memmap(folder).keys()) == WRITE_THROUGH + 1 + 450


def test_open_adders_are_bounded(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding to more levels than MAX_OPEN_ADDERS keeps at most that many open (two descriptors
    each); a level whose adder was closed opens it again and still takes the fast path."""
    monkeypatch.setattr(adder_mod, "MAX_OPEN_ADDERS", 4)
    folder = os.path.join(str(tmp_path), "td")
    td = TensorDict({f"s{i}": {"x": torch.zeros(2)} for i in range(10)}, batch_size=[]).memmap_(folder)
    rounds = WRITE_THROUGH + 4  # past the entries written through to meta.json: each level has a record
    fds_before = 0
    calls: list[int] = []
    for j in range(rounds):
        if j == 1:  # the tree's lock and control files are open by now; the adders come later
            fds_before = len(os.listdir("/proc/self/fd"))
        if j == rounds - 2:
            calls = _counting(monkeypatch)
        for i in range(10):
            td.make_memmap_from_tensor((f"s{i}", f"k{j}"), torch.full((2,), float(i * 1000 + j)))
    reg = SharedRegistry.for_tensordict(td)
    assert not calls  # the last two rounds: every level's adder reopened in turn, no general path
    assert len(reg.adders) == 10 and len(adder_mod._OPEN) <= 4
    assert sum(a.jfd >= 0 for a in reg.adders.values()) == len(adder_mod._OPEN)
    assert len(os.listdir("/proc/self/fd")) - fds_before <= 2 * 4
    back = TensorDict.load_memmap(folder)
    for i in range(10):
        for j in (0, WRITE_THROUGH - 1, WRITE_THROUGH, rounds - 1):
            assert back[f"s{i}", f"k{j}"].tolist() == [float(i * 1000 + j)] * 2


def test_a_closed_adder_whose_record_was_replaced_takes_the_general_path(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adder closed to make room reopens its level's record by path; a record that is another
    file by then (same bytes, a new inode) is not the one it knew: the general path adds."""
    folder = str(tmp_path)
    td = TensorDict({}, batch_size=[]).memmap_(folder)
    for i in range(WRITE_THROUGH + 2):
        td.make_memmap(f"k{i}", [1])
    adder = SharedRegistry.for_tensordict(td).adders[folder]
    adder.close()
    record = os.path.join(folder, "meta.jsonl")
    with open(record, "rb") as f:
        data = f.read()
    with open(record + ".new", "wb") as f:
        f.write(data)
    os.replace(record + ".new", record)
    calls = _counting(monkeypatch)
    td.make_memmap_from_tensor("after", torch.full((3,), 7.0))
    assert len(calls) == 1
    td.make_memmap_from_tensor("then", torch.full((3,), 8.0))
    assert len(calls) == 1  # readied again by the general path
    back = TensorDict.load_memmap(folder)
    assert back["after"].tolist() == [7.0] * 3 and back["then"].tolist() == [8.0] * 3
    assert len(back.keys()) == WRITE_THROUGH + 4


def test_threads_adding_to_trees_that_take_each_others_descriptors(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads adding to different trees, with room for fewer adders than levels: each closes the
    others' adders to open its own (under one lock, so no descriptor is closed while written)."""

    monkeypatch.setattr(adder_mod, "MAX_OPEN_ADDERS", 2)
    trees = []
    for t in range(3):
        td = TensorDict({"a": {}, "b": {}}, batch_size=[]).memmap_(os.path.join(str(tmp_path), f"t{t}"))
        for i in range(WRITE_THROUGH + 1):
            for level in ("a", "b"):
                td.make_memmap((level, f"w{i}"), [1])
        trees.append(td)

    def add(t: int) -> None:
        for i in range(200):
            value = torch.full((2,), float(t * 1000 + i))
            trees[t].make_memmap_from_tensor(("a" if i % 2 else "b", f"x{i}"), value)

    assert not _in_threads(add, 3) and len(adder_mod._OPEN) <= 2
    for t in range(3):
        back = TensorDict.load_memmap(os.path.join(str(tmp_path), f"t{t}"))
        got = [back["a" if i % 2 else "b", f"x{i}"][0].item() for i in range(200)]
        assert got == [float(t * 1000 + i) for i in range(200)]


def _fill_from_storage(td: TensorDict, folder: str, n: int = N) -> list[torch.UntypedStorage]:
    storages = []
    for i in range(n):
        path = os.path.join(folder, f"s{i}.memmap")
        with open(path, "wb") as f:
            f.write((torch.arange(4, dtype=torch.int32) + i).numpy().tobytes())
        storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=16)
        entry = td.make_memmap_from_storage(f"s{i}", storage, [2, 2] if i % 2 else [4], dtype=torch.int32)
        assert entry.untyped_storage().data_ptr() == storage.data_ptr() and entry.filename == path
        storages.append(storage)
    return storages


def test_from_storage_takes_the_fast_path(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    fast_dir, slow_dir = str(tmp_path) + "/fast", str(tmp_path) + "/slow"
    fast = TensorDict({}, batch_size=[]).memmap_(fast_dir)
    calls = _counting(monkeypatch)
    keep = _fill_from_storage(fast, fast_dir)
    assert len(calls) < N // 2  # most additions took the fast path
    with monkeypatch.context() as m:
        _general_only(m)
        slow = TensorDict({}, batch_size=[]).memmap_(slow_dir)
        keep += _fill_from_storage(slow, slow_dir)
    assert _folder_bytes(fast_dir) == _folder_bytes(slow_dir)
    fast["s3"][1, 1] = -7  # the entry is the file: another reader sees the write
    loaded = TensorDict.load_memmap(fast_dir)
    assert loaded["s3"].tolist() == [[3, 4], [5, -7]] and loaded["s4"].tolist() == [4, 5, 6, 7]
    tdshare.compact_metadata(fast)
    ref = tensordict.TensorDict.load_memmap(fast_dir)
    assert set(ref.keys()) == {f"s{i}" for i in range(N)} and ref["s3"].tolist() == [[3, 4], [5, -7]]
    # the general path's checks still run first: a storage of another file, too few bytes
    other = torch.UntypedStorage.from_file(os.path.join(fast_dir, "s0.memmap"), shared=True, nbytes=16)
    with pytest.raises(MemmapError, match="differs from the filename"):
        fast.make_memmap_from_storage("s_other", other, [4], dtype=torch.int32)
    with pytest.raises(MemmapError, match="needs 32"):
        fast.make_memmap_from_storage("s0x", other, [8], dtype=torch.int32)
    assert "s_other" not in fast.keys() and "s0x" not in fast.keys()


def test_a_loaded_level_with_a_record_saved_back_keeps_what_others_added(tmp_path: Path) -> None:
    """The record field is the folder's: a tensordict loaded from a marked level and saved back
    unchanged keeps its level (and so the entries another writer added since)."""
    import json

    td = TensorDict({f"a{i}": torch.zeros(1) for i in range(WRITE_THROUGH + 6)}).memmap_(tmp_path / "t")
    td.make_memmap("b0", (1,))
    assert json.loads((tmp_path / "t" / "meta.json").read_text())["_tdshare_journal"] is True
    other = TensorDict.load_memmap(tmp_path / "t")
    assert "_tdshare_journal" not in other.keys()
    td.make_memmap_from_tensor("b1", torch.ones(1))  # after the other's load
    other.memmap_()
    back = TensorDict.load_memmap(tmp_path / "t")
    assert back["b1"].tolist() == [1.0] and "b0" in back.keys()


def test_the_record_field_is_refused_as_a_key(tmp_path: Path) -> None:
    td = TensorDict({"a": torch.zeros(1)}).memmap_(tmp_path / "t")
    with pytest.raises(InvalidArgumentError, match=r"_tdshare_journal"):
        td.make_memmap("_tdshare_journal", (1,))


def test_a_reader_refreshing_past_the_record_field_keeps_its_leaves(tmp_path: Path) -> None:
    """The record field arriving in meta.json is no restructuring: a reader's refresh adds the new
    entry and keeps every leaf it had, mapped ones as they are and pending ones unmapped."""
    from tdshare._lazy_leaves import PendingLeaf

    n = WRITE_THROUGH + 6
    writer = TensorDict({f"a{i}": torch.full((1,), float(i)) for i in range(n)}).memmap_(tmp_path / "t")
    reader = TensorDict.load_memmap(tmp_path / "t").memmap_()  # (writes nothing: a handle on the folder)
    first = reader["a0"]
    before = _maps_under(tmp_path)
    for j in range(5):  # the first goes to the level's record: its meta.json gets the field first
        writer.make_memmap_from_tensor(f"b{j}", torch.full((1,), float(j)))
    reader.memmap_refresh_()
    raw = reader._tensordict
    assert all(type(dict.__getitem__(raw, k)) is PendingLeaf for k in [f"a{i}" for i in range(1, n)] + ["b1", "b4"])
    assert _maps_under(tmp_path) == before + 5  # the writer's five; none of the reader's
    assert reader["a0"] is first and [reader[f"b{j}"].item() for j in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]


def _maps_under(root: Path) -> int:
    prefix = os.path.realpath(root) + os.sep
    with open("/proc/self/maps") as f:
        return sum(line.rstrip("\n").split(maxsplit=5)[-1].startswith(prefix) for line in f if "/" in line)
