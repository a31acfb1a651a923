"""Reliability: debris of dead writers, failed saves that keep the old tree, strict loading.

The crash-consistency and hostile-input suites live in tests/test_reliability_suites.py.
"""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from _kinds import KINDS, build

import tdshare
import tdshare._atomic
import tdshare._files
import tdshare._write
from tdshare import TensorDict
from tdshare.__main__ import main as cli

pytestmark = pytest.mark.reliability


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _tree(tmp_path: Path, value: float = 1.0) -> Path:
    path = tmp_path / "td"
    TensorDict(a=torch.full((3,), value), n={"b": torch.full((3, 2), value)}, batch_size=[3]).save(path)
    return path


def _plant_debris(path: Path, pid: int) -> list[Path]:
    """Debris as a writer ``pid`` killed part way leaves it: staging, temporary files, an orphan leaf."""
    staging = path.parent / f".tdtmp-{pid}-abc123"
    (staging / "new").mkdir(parents=True)
    (staging / "new" / "a.memmap").write_bytes(b"\0" * 64)
    tmp_leaf = path / f".a.memmap.tdshare-{pid}-deadbeef0.tmp"
    tmp_leaf.write_bytes(b"\0" * 12)
    tmp_meta = path / "n" / f".meta.json.tdshare-{pid}-deadbeef1.tmp"
    tmp_meta.write_bytes(b"{")
    return [staging, tmp_leaf, tmp_meta]


# -- 1. debris after a crash ----------------------------------------------------------------------
def test_next_save_removes_dead_writers_debris_and_keeps_live_ones(tmp_path: Path) -> None:
    path = _tree(tmp_path)
    dead = _plant_debris(path, _dead_pid())
    live = _plant_debris(path, os.getpid())
    orphan = path / "n" / "gone.memmap"  # a make_memmap killed between its file and its metadata
    orphan.write_bytes(b"\0" * 8)
    td = TensorDict.load_memmap(path)
    TensorDict(a=torch.full((3,), 2.0), n={"b": torch.full((3, 2), 2.0)}, batch_size=[3]).save(path)
    assert [p for p in dead if p.exists()] == []
    assert not orphan.exists()
    assert all(p.exists() for p in live)  # a live writer's staging and temporary files are never touched
    assert TensorDict.load_memmap(path)["n", "b"].tolist() == [[2.0, 2.0]] * 3
    assert td["a"].tolist() == [1.0] * 3  # the old mapping still reads the old bytes


def test_atomic_save_removes_dead_staging(tmp_path: Path) -> None:
    path = _tree(tmp_path)
    staging = _plant_debris(path, _dead_pid())[0]
    TensorDict(a=torch.zeros(3), batch_size=[3]).memmap_(path, atomic=True, existsok=True)
    assert not staging.exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".tdtmp-")] == []


def test_killed_between_the_two_renames_is_put_back(tmp_path: Path) -> None:
    """A writer killed after moving the old tree out and before moving the new one in."""
    path = _tree(tmp_path)
    work = tmp_path / f".tdtmp-{_dead_pid()}-xyz"
    work.mkdir()
    (work / "target").write_text("td")
    TensorDict(a=torch.full((3,), 5.0), batch_size=[3]).save(work / "new")
    os.rename(path, work / "old")
    assert cli(["gc", str(tmp_path)]) == 0
    assert TensorDict.load_memmap(path)["a"].tolist() == [5.0] * 3  # the complete new tree
    assert not work.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_an_atomic_resave_swaps_the_folders_in_one_step(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the file system can exchange two folders, the target is never renamed away."""
    path = str(tmp_path / "td")
    build(kind).memmap_(path)
    if not tdshare._files.exchange(str(tmp_path / "td"), str(tmp_path / "td")):
        pytest.skip("this file system has no renameat2(RENAME_EXCHANGE)")  # (a path swapped with itself)
    before = os.stat(path).st_ino
    renamed: list[str] = []
    real_rename = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b, **kw: (renamed.append(str(a)), real_rename(a, b, **kw))[1])
    build(kind, 1.0).memmap_(path, atomic=True)
    assert path not in renamed and os.stat(path).st_ino != before
    assert tdshare.load_memmap(path)["a"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert [n for n in os.listdir(tmp_path) if n != "td"] == []  # the old tree and the staging are gone


def test_an_atomic_resave_falls_back_to_two_renames(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "td")
    TensorDict(a=torch.zeros(3), batch_size=[3]).memmap_(path)
    monkeypatch.setattr(tdshare._atomic, "exchange", lambda a, b: False)
    TensorDict(a=torch.ones(3), batch_size=[3]).memmap_(path, atomic=True)
    assert TensorDict.load_memmap(path)["a"].tolist() == [1.0] * 3 and os.listdir(tmp_path) == ["td"]


def test_archive_save_removes_dead_temporary_archives(tmp_path: Path) -> None:
    target = tmp_path / "x.tdz"
    dead = tmp_path / f".x.tdz.tdshare-{_dead_pid()}-0a1.tmp"
    live = tmp_path / f".x.tdz.tdshare-{os.getpid()}-0a2.tmp"
    other = tmp_path / f".y.tdz.tdshare-{_dead_pid()}-0a3.tmp"
    for p in (dead, live, other):
        p.write_bytes(b"PK")
    TensorDict(a=torch.ones(2), batch_size=[2]).save(target)
    assert not dead.exists() and live.exists() and other.exists()  # only this archive's, only the dead's
    assert TensorDict.load_memmap(target)["a"].tolist() == [1.0, 1.0]


def test_gc_path_removes_debris_and_reports_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _tree(tmp_path)
    dead = _plant_debris(path, _dead_pid())
    (path / "orphan.memmap").write_bytes(b"\0" * 100)
    live = _plant_debris(path, os.getpid())
    capsys.readouterr()
    assert cli(["gc", str(path)]) == 0
    out = capsys.readouterr().out
    assert [p for p in dead if p.exists()] == [] and not (path / "orphan.memmap").exists()
    assert all(p.exists() for p in live)
    assert "freed 177 bytes (4 paths)" in out  # 64 + 12 + 1 + 100 bytes
    assert str(dead[1]) in out
    assert TensorDict.load_memmap(path)["a"].tolist() == [1.0] * 3
    capsys.readouterr()
    assert cli(["gc", str(path)]) == 0  # a second run finds nothing of ours to clean
    assert "freed" not in capsys.readouterr().out


def test_gc_of_a_missing_path_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["gc", str(tmp_path / "nope")]) == 1
    assert "nope" in capsys.readouterr().err


# -- 2. a failed non-atomic save never damages the previous tree -----------------------------------
def _failing_nth_leaf(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    real = tdshare._files._write_all
    calls = [0]

    def failing(fd: int, data: Any, path: str) -> None:
        if ".memmap" in path:
            calls[0] += 1
            if calls[0] == n:
                raise OSError(errno.ENOSPC, "No space left on device (injected)", path)
        real(fd, data, path)

    monkeypatch.setattr(tdshare._files, "_write_all", failing)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2])
def test_failed_resave_leaves_the_old_tree_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, n: int
) -> None:
    path = tmp_path / "td"
    build(kind, 1.0).memmap(path)
    before = sorted(os.listdir(path))
    _failing_nth_leaf(monkeypatch, n)
    new = build(kind, 7.0)
    with pytest.raises(OSError, match="injected"):
        new.memmap_(path, existsok=True)
    monkeypatch.undo()
    loaded = type(build(kind)).load_memmap(path)
    expected = build(kind, 1.0)
    assert (loaded == expected).all()
    assert sorted(os.listdir(path)) == before  # no staged file left behind
    assert not new.is_memmap()  # the source was not changed either


def test_failed_threaded_resave_keeps_the_old_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "td"
    TensorDict({f"k{i}": torch.full((2,), float(i)) for i in range(8)}, [2]).save(path)
    _failing_nth_leaf(monkeypatch, 5)
    with pytest.raises(OSError, match="injected"):
        TensorDict({f"k{i}": torch.full((2,), 9.0) for i in range(8)}, [2]).memmap_(path, num_threads=4)
    monkeypatch.undo()
    loaded = TensorDict.load_memmap(path)
    assert [loaded[f"k{i}"].tolist() for i in range(8)] == [[float(i)] * 2 for i in range(8)]
    assert not [n for n in os.listdir(path) if ".tmp" in n]


def test_too_little_free_space_is_refused_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _tree(tmp_path)
    real = os.statvfs

    class Full:
        def __init__(self, st: Any) -> None:
            self.f_frsize, self.f_bavail = st.f_frsize, 1

    monkeypatch.setattr(os, "statvfs", lambda p: Full(real(p)))
    with pytest.raises(OSError, match=r"need 4812 bytes, the file system has 4096 free") as info:
        TensorDict(a=torch.zeros(3), n={"b": torch.zeros(3, 400)}, batch_size=[3]).save(path)
    assert info.value.errno == errno.ENOSPC and str(path) in str(info.value)
    monkeypatch.undo()
    assert TensorDict.load_memmap(path)["n", "b"].tolist() == [[1.0, 1.0]] * 3


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounting a tmpfs needs root")
@pytest.mark.parametrize("checked", [True, False])
def test_full_tmpfs_resave_keeps_the_old_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checked: bool) -> None:
    """A real full disk: refused up front by the free-space check, or (check off) part way through."""
    if not checked:
        monkeypatch.setattr(tdshare._write, "_check_space", lambda root, path: None)
    mnt = tmp_path / f"mnt-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=False).returncode:
        pytest.skip("this container cannot mount a tmpfs")
    try:
        path = mnt / "td"
        TensorDict(a=torch.ones(8000), b=torch.ones(8000), batch_size=[]).save(path)  # 64 kB of 256
        # 240 kB of new leaves, 192 kB free: the old files stay until every new one is written
        grown = TensorDict(a=torch.zeros(20000), b=torch.zeros(20000), c=torch.zeros(20000), batch_size=[])
        with pytest.raises(OSError) as info:
            grown.save(path)
        assert info.value.errno == errno.ENOSPC
        loaded = TensorDict.load_memmap(path)
        assert loaded["a"].sum().item() == 8000 and set(loaded.keys()) == {"a", "b"}
        assert sorted(os.listdir(path)) == ["a.memmap", "b.memmap", "meta.json"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _child_writes(path: str, ready: Any, stop: Any) -> None:
    TensorDict(a=torch.ones(2), batch_size=[2]).memmap_(path, existsok=True)
    ready.set()
    stop.wait(30)


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_a_live_writers_staging_survives_another_save(tmp_path: Path, method: str) -> None:
    """A live process's staging folder (named by its pid) is kept by another process's save."""
    ctx = mp.get_context(method)
    ready, stop = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_child_writes, args=(str(tmp_path / f"c-{uuid.uuid4().hex}"), ready, stop))
    proc.start()
    try:
        assert ready.wait(60)
        staging = tmp_path / f".tdtmp-{proc.pid}-live"
        staging.mkdir()
        _tree(tmp_path)
        TensorDict(a=torch.zeros(3), batch_size=[3]).memmap_(tmp_path / "td", atomic=True, existsok=True)
        assert staging.exists()
    finally:
        stop.set()
        proc.join(60)
    assert proc.exitcode == 0
    TensorDict(a=torch.zeros(3), batch_size=[3]).save(tmp_path / "td")  # now it is dead: removed
    assert not staging.exists()


def test_meta_is_json(tmp_path: Path) -> None:
    # the format is unchanged by the staging: the reference's json reader takes it
    path = _tree(tmp_path)
    TensorDict(a=torch.zeros(3), batch_size=[3]).save(path)
    assert json.loads((path / "meta.json").read_text())["a"]["shape"] == [3]


# -- 3. strict loading -----------------------------------------------------------------------------
def _edit_meta(path: Path, edit: Any) -> None:
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m.update(a=[3]), r"the entry 'a' must be a JSON object .* found list"),
        (lambda m: m.update(a="torch.float32"), r"the entry 'a' must be a JSON object .* found str"),
        (lambda m: m.update(a=m["a"] | {"dtyp": m["a"].pop("dtype")}), r"the leaf entry 'a' has no 'dtype' field"),
        (lambda m: m.update(a={"shape": [3]}), r"the leaf entry 'a' has no 'dtype' field"),
        (lambda m: m.update(a={}), r"the leaf entry 'a' has no 'dtype' and no 'shape' field"),
        (lambda m: m.update(n={"type": 7}), r"the 'type' of the nested entry 'n' must be a string"),
        (lambda m: m.update(a=m["a"] | {"shape": [3, 2.0]}), r"the shape of 'a' must be a list"),
    ],
)
def test_malformed_entries_raise_naming_file_and_key(tmp_path: Path, edit: Any, match: str) -> None:
    path = _tree(tmp_path)
    _edit_meta(path, edit)
    with pytest.raises(tdshare.CorruptDataError, match=match) as info:
        TensorDict.load_memmap(path)
    assert str(path / "meta.json") in str(info.value)


def test_deeply_nested_meta_json_is_a_format_error(tmp_path: Path) -> None:
    path = _tree(tmp_path)
    (path / "n" / "meta.json").write_text('{"x": ' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(tdshare.CorruptDataError, match=r"n/meta\.json nests its JSON too deeply"):
        TensorDict.load_memmap(path)


def test_truncated_leaf_is_refused_and_longer_reference_leaf_allowed(tmp_path: Path) -> None:
    import tensordict

    path = _tree(tmp_path)
    with open(path / "a.memmap", "r+b") as f:
        f.truncate(8)
    with pytest.raises(tdshare.CorruptDataError, match=r"a\.memmap' holds 8 bytes .* expects 12 .* truncated"):
        TensorDict.load_memmap(path)
    # the format allows a longer file: tensordict 0.15.3 re-saves over one without truncating it
    ref = tmp_path / "ref"
    tensordict.TensorDict(a=torch.arange(10.0), batch_size=[10]).memmap(ref)
    tensordict.TensorDict(a=torch.ones(2), batch_size=[2]).memmap(ref)
    assert (ref / "a.memmap").stat().st_size == 40
    assert TensorDict.load_memmap(ref)["a"].tolist() == tensordict.TensorDict.load_memmap(ref)["a"].tolist()
