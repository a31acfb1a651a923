"""The coordination state of a tree lives in the runtime folder: nothing beside or inside the
folder, one lock across atomic swaps, a counter that readers learn swaps from, ``wait_for_change``
across processes, ``gc`` of the control files of trees that are gone."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import IS_ROOT, as_other_user

import tdshare
from tdshare import SharedRegistry, TensorDict
from tdshare._control_files import control_paths, reap_trees

METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
WAIT = 60


def _td() -> TensorDict:
    return TensorDict({"a": torch.arange(4.0), "n": {"b": torch.zeros(4, 2)}, "s": "text"}, batch_size=[4])


def test_nothing_is_written_beside_the_prefix(tmp_path: Path) -> None:
    parent = tmp_path / "checkpoints"
    parent.mkdir()
    prefix = parent / "run1"
    td = _td().memmap_(prefix, share_non_tensor=True)
    td.memmap_refresh_()
    td.make_memmap("x", [4])
    td.make_memmap_from_tensor(("n", "y"), torch.ones(4))
    td.set_("s", "changed")  # a shared non-tensor write
    _td().memmap(prefix, atomic=True)
    _td().save(prefix)
    TensorDict.load(prefix).memmap_().memmap_refresh_()
    assert os.listdir(parent) == ["run1"]


def test_an_atomic_resave_leaves_exactly_the_new_trees_files(tmp_path: Path) -> None:
    prefix = tmp_path / "td"
    td = _td().memmap_(prefix)
    td.make_memmap("extra", [4])
    TensorDict({"only": torch.ones(4)}, batch_size=[4]).memmap(prefix, atomic=True)
    files = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*"))
    assert files == ["meta.json", "only.memmap"]


def test_tensordict_loads_every_folder_tdshare_shared(tmp_path: Path) -> None:
    tensordict = pytest.importorskip("tensordict")
    prefix = tmp_path / "td"
    td = _td().memmap_(prefix)
    td.memmap_refresh_()
    td.make_memmap("x", [4])[:] = 3.0
    ref = tensordict.TensorDict.load_memmap(prefix)
    assert ref["x"].tolist() == [3.0] * 4 and ref["n", "b"].shape == (4, 2) and ref["s"] == "text"


def test_readers_learn_of_an_atomic_swap_through_the_old_counter(tmp_path: Path) -> None:
    prefix = tmp_path / "td"
    reader = _td().memmap_(prefix)
    reader.memmap_refresh_()  # maps the counter
    registry = SharedRegistry.for_tensordict(reader)
    before = registry.generation
    new = _td()
    new["a"] = torch.full((4,), 9.0)
    new.memmap(prefix, atomic=True)
    assert registry.generation == before + 1
    reader.memmap_refresh_()
    assert reader["a"].tolist() == [9.0] * 4


def test_the_registry_api(tmp_path: Path) -> None:
    prefix = tmp_path / "td"
    td = _td().memmap_(prefix)
    reg = SharedRegistry.for_path(prefix)
    assert SharedRegistry.for_path(prefix / "n") is reg is SharedRegistry.for_tensordict(td)
    gen = reg.generation
    with reg.lock():  # reentrant: a writer inside the lock may add entries
        td.make_memmap("x", [4])
    assert reg.generation == gen + 1
    info = reg.describe()
    assert info["tree"] == str(prefix) and info["generation"] == gen + 1 and info["owned"] is True
    assert (info["lock"], info["counter"]) == control_paths(str(prefix))
    assert reg.wait_for_change(timeout=0.01) == gen + 1  # nothing committed meanwhile: times out
    assert reg.wait_for_change(gen, timeout=0.01) == gen + 1  # already past ``since``: at once
    with pytest.raises(tdshare.MissingMetadataError, match=r"meta\.json"):
        SharedRegistry.for_path(tmp_path / "nothing")
    with pytest.raises(tdshare.NotMemmapError, match="memmap_"):
        SharedRegistry.for_tensordict(_td())
    anon = _td().memmap_()
    anon_reg = SharedRegistry.for_tensordict(anon)
    assert anon_reg is not reg and anon_reg.generation == 0


def test_every_path_to_a_tree_names_the_same_control_files(tmp_path: Path) -> None:
    """A link to the tree, a link to a folder above it, and a tree not created yet: the control
    files are the tree's by its parent's inode and its real name, however it is reached."""
    real = tmp_path / "data" / "td"
    real.parent.mkdir()
    td = _td().memmap_(real)
    (tmp_path / "link-to-tree").symlink_to(real)
    (tmp_path / "link-to-parent").symlink_to(real.parent)
    paths = control_paths(str(real))
    assert control_paths(str(tmp_path / "link-to-tree")) == paths
    assert control_paths(str(tmp_path / "link-to-parent" / "td")) == paths
    assert control_paths(str(tmp_path / "data" / "other")) != paths  # a sibling, not created yet
    assert control_paths(str(tmp_path / "link-to-parent" / "other")) == control_paths(str(tmp_path / "data" / "other"))
    reader = TensorDict.load_memmap(tmp_path / "link-to-parent" / "td").memmap_()  # (writes nothing)
    td.make_memmap("added", [4])[:] = 3.0
    assert reader.memmap_refresh_()["added"].tolist() == [3.0] * 4


def _waiter(prefix: str, since: int, ready: Any, out: Any) -> None:
    reg = SharedRegistry.for_path(prefix)
    ready.set()
    gen = reg.wait_for_change(since, timeout=WAIT)
    out.put((gen, time.perf_counter()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_wait_for_change_wakes_another_process(tmp_path: Path, method: str) -> None:
    prefix = tmp_path / "td"
    td = _td().memmap_(prefix)
    reg = SharedRegistry.for_tensordict(td)
    since = reg.generation
    ctx = mp.get_context(method)
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_waiter, args=(str(prefix), since, ready, out))
    proc.start()
    try:
        assert ready.wait(WAIT)
        td.make_memmap("x", [4])
        gen, woke = out.get(timeout=WAIT)
        assert gen == since + 1
        assert woke > 0
    finally:
        proc.join(WAIT)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0


def test_gc_removes_the_files_of_trees_that_are_gone(tmp_path: Path) -> None:
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    for prefix in (gone, kept):
        _td().memmap_(prefix).make_memmap("x", [4])  # makes the lock and the counter
    gone_files, kept_files = control_paths(str(gone)), control_paths(str(kept))
    for path in (*gone_files, *kept_files):
        assert os.path.exists(path)
    for child in gone.rglob("*"):
        if child.is_file():
            child.unlink()
    for child in sorted(gone.rglob("*"), reverse=True):
        child.rmdir()
    gone.rmdir()
    import gc as _gc

    _gc.collect()  # drop this process's mapping of the removed tree's counter
    removed = reap_trees()
    assert str(gone) in removed and str(kept) not in removed
    assert not any(os.path.exists(p) for p in gone_files) and all(os.path.exists(p) for p in kept_files)
    out = subprocess.run([sys.executable, "-m", "tdshare", "gc"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0


def test_gc_keeps_the_files_a_live_process_maps(tmp_path: Path) -> None:
    prefix = tmp_path / "td"
    td = _td().memmap_(prefix)
    td.memmap_refresh_()  # this process maps the counter and keeps it (td holds the registry)
    gen_path = control_paths(str(prefix))[1]
    os.rename(prefix, tmp_path / "moved")  # the tree at the recorded path is gone
    assert str(prefix) not in reap_trees()
    assert os.path.exists(gen_path)
    del td


def test_status_command(tmp_path: Path) -> None:
    prefix = tmp_path / "td"
    _td().memmap_(prefix).make_memmap("x", [4])
    out = subprocess.run(
        [sys.executable, "-m", "tdshare", "status", str(prefix)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert f"tree: {prefix}" in out.stdout and "generation: 1" in out.stdout


@pytest.mark.skipif(not IS_ROOT, reason="needs root to run a check as another user")
def test_a_tree_of_another_user_is_reread_at_every_refresh(shared_dir: Path) -> None:
    prefix = shared_dir / "td"
    td = _td().memmap_(prefix)
    os.chmod(prefix, 0o755)

    def check() -> str:
        other = TensorDict.load(prefix, mode="r")
        reg = SharedRegistry.for_path(prefix)
        assert reg.state() is None and reg.describe()["owned"] is False
        return str(other["a"].tolist())

    assert as_other_user(check) == str([0.0, 1.0, 2.0, 3.0])
    assert td.is_memmap()


@pytest.mark.skipif(not IS_ROOT, reason="needs root to run a check as another user")
def test_a_tree_in_a_read_only_parent_coordinates_and_refreshes(shared_dir: Path) -> None:
    """The parent belongs to someone else and is read-only to the tree's owner: before, no control
    file could be made beside the tree; now they live in the owner's runtime folder."""
    prefix = shared_dir / "td"
    _td().memmap_(prefix)
    for path in [prefix, *prefix.rglob("*")]:
        os.chown(path, 65534, 65534)

    def check() -> str:
        td = TensorDict.load(prefix).memmap_()  # maps the files, writes nothing new
        other = TensorDict.load(prefix).memmap_()
        other.make_memmap("x", [4])[:] = 2.0
        reg = SharedRegistry.for_tensordict(td)
        seen = reg.generation
        td.memmap_refresh_()
        assert td["x"].tolist() == [2.0] * 4 and reg.generation == seen
        return ",".join(sorted(os.listdir(shared_dir)))

    assert as_other_user(check) == "td"
