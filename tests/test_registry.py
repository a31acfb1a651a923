"""Live entries and refresh between real processes: make_memmap*, memmap_refresh_, share_non_tensor,
the SharedRegistry lock and generation counter, concurrency and crashes.

Processes synchronise through queues and events only (no sleeps); every get/join/wait has a
timeout.  Most cross-process checks talk to one long-lived helper process per start method (a
"peer" that runs the ``_p_*`` functions of this module on request), so that spawn's start-up cost
(importing torch) is paid once per start method, not once per test.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import pickle
import queue
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import tdshare
from tdshare import (
    BatchSizeError,
    LockedError,
    MemoryMappedTensor,
    NonTensorData,
    NotMemmapError,
    TensorDict,
)
from tdshare._control_files import control_paths
from tdshare._coordination import SharedRegistry

WAIT = 60  # seconds any single hand-off may take (a spawn child imports torch first)
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
BIG = "x" * 1_000_000 + "end"


def _ctx(method: str) -> Any:
    ctx = mp.get_context(method)
    if method == "forkserver":
        # children of the fork server start with torch and tdshare already imported (effective only
        # if this is the first use of the fork server in this process)
        ctx.set_forkserver_preload(["torch", "tdshare"])
    return ctx


# -- the peer: a helper process that runs this module's _p_* functions on request ---------------
def _serve(commands: Any, replies: Any) -> None:
    state: dict[str, Any] = {}
    while True:
        try:
            msg = commands.get(timeout=600)  # exits on its own if the parent went away
        except queue.Empty:
            return
        if msg is None:
            return
        name, args = msg
        try:
            replies.put(("ok", globals()[name](state, *args)))
        except BaseException:
            replies.put(("error", traceback.format_exc()))


class Peer:
    """One helper process; ``call(fn, *args)`` runs ``fn(state, *args)`` there and returns its result."""

    def __init__(self, method: str) -> None:
        ctx = _ctx(method)
        self.method = method
        self.commands, self.replies = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_serve, args=(self.commands, self.replies), daemon=True)
        self.proc.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.commands.put((fn.__name__, args))
        try:
            tag, payload = self.replies.get(timeout=WAIT)
        except queue.Empty:
            self.proc.kill()  # out of step with us: the next test starts a new peer
            self.proc.join(timeout=WAIT)
            raise
        if tag == "error":
            pytest.fail(f"the {self.method} peer failed in {fn.__name__}:\n{payload}")
        return payload

    def close(self) -> None:
        if self.proc.is_alive():
            self.commands.put(None)
        self.proc.join(timeout=WAIT)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=WAIT)


@pytest.fixture(scope="module")
def peers() -> Iterator[dict[str, Peer]]:
    started: dict[str, Peer] = {}
    yield started
    for p in started.values():
        p.close()


@pytest.fixture(params=METHODS)
def peer(request: pytest.FixtureRequest, peers: dict[str, Peer]) -> Peer:
    method = request.param
    if method not in peers or not peers[method].proc.is_alive():
        peers[method] = Peer(method)
    peers[method].call(_p_reset)
    return peers[method]


def _p_reset(state: dict[str, Any]) -> None:
    state.clear()


def _p_take(state: dict[str, Any], name: str, td: TensorDict) -> bool:
    """Keep a tensordict received through the queue."""
    state[name] = td
    return td.is_memmap()


def _p_unpickle(state: dict[str, Any], name: str, data: bytes) -> bool:
    state[name] = pickle.loads(data)
    return state[name].is_memmap()


def _p_load(state: dict[str, Any], name: str, folder: str) -> bool:
    """Load the folder and memory-map it again (which maps its files and writes nothing)."""
    state[name] = TensorDict.load(folder).memmap_()
    return state[name].is_memmap()


def _p_refresh(state: dict[str, Any], name: str, allow_pickle: bool | None = None) -> None:
    state[name].memmap_refresh_(allow_pickle=allow_pickle)


def _p_keys(state: dict[str, Any], name: str) -> list[str]:
    return sorted(map(str, state[name].keys(include_nested=True, leaves_only=True)))


def _p_values(state: dict[str, Any], name: str, keys: list[Any]) -> list[Any]:
    td = state[name]
    out = []
    for key in keys:
        value = td[key]
        out.append(value.tolist() if isinstance(value, torch.Tensor) else value)
    return out


def _p_ids(state: dict[str, Any], name: str) -> dict[str, int]:
    """id() of every leaf and nested tensordict."""
    td = state[name]
    return {str(k): id(td[k]) for k in td.keys(include_nested=True)}


def _p_write(state: dict[str, Any], name: str, key: Any, index: int, value: float) -> None:
    state[name][key][index] = value


def _p_set_(state: dict[str, Any], name: str, key: Any, value: Any) -> None:
    state[name].set_(key, value)


def _p_make(state: dict[str, Any], name: str, key: Any, values: list[Any]) -> list[Any]:
    return state[name].make_memmap_from_tensor(key, torch.tensor(values)).tolist()


def _p_make_memmap(state: dict[str, Any], name: str, key: Any, shape: list[int]) -> None:
    state[name].make_memmap(key, shape)


def _p_nontensor(state: dict[str, Any], name: str) -> dict[str, Any]:
    """The shared non-tensor values (the big string by length and tail only)."""
    td = state[name]
    s = td["s"]
    return {"s": s if len(s) < 100 else (len(s), s[-3:]), "j": td["j"], "o": td["o"]}


def _p_atomic_resave(state: dict[str, Any], folder: str) -> None:
    TensorDict(a=torch.full((4,), 9.0), fresh=torch.ones(4, 2), s="resaved", batch_size=[4]).memmap(folder, atomic=True)


# -- helpers ------------------------------------------------------------------------------------
def _base() -> TensorDict:
    return TensorDict(
        {"a": torch.arange(4, dtype=torch.float32), "n": {"b": torch.zeros(4, 2)}, "s": "start"}, batch_size=[4]
    )


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder under ``root`` (the saved folder and its control files): inode, size, mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _meta(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "meta.json").read_text())


def _leaf_keys(td: TensorDict) -> list[str]:
    return sorted(map(str, td.keys(include_nested=True, leaves_only=True)))


def _storage_at(path: Path, nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage.from_file(str(path), shared=True, nbytes=nbytes)


def _from_storage(td: TensorDict, key: Any, shape: Any, own_file: bool = False) -> MemoryMappedTensor:
    """``make_memmap_from_storage`` with the entry's own file (``own_file``) or a file-less storage."""
    if not own_file:
        return td.make_memmap_from_storage(key, torch.ones(shape).untyped_storage(), shape)
    parts = (key,) if isinstance(key, str) else key
    level = Path(td.saved_path, *parts[:-1])
    level.mkdir(parents=True, exist_ok=True)
    return td.make_memmap_from_storage(key, _storage_at(level / f"{parts[-1]}.memmap", 4 * math.prod(shape)), shape)


ADDERS: dict[str, Callable[..., MemoryMappedTensor]] = {
    "make_memmap": lambda td, key, shape, own_file=False: td.make_memmap(key, shape),
    "make_memmap_from_tensor": lambda td, key, shape, own_file=False: td.make_memmap_from_tensor(
        key, torch.ones(shape)
    ),
    "make_memmap_from_storage": _from_storage,
}


def _add(kind: str, td: TensorDict, key: Any, shape: Any, own_file: bool = False) -> MemoryMappedTensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # a file-less storage warns; not the point here
        return ADDERS[kind](td, key, shape, own_file=own_file)


# -- make_memmap* rules -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(ADDERS))
def test_adding_requires_a_memory_mapped_tensordict(kind: str, tmp_path: Path) -> None:
    plain = _base()
    with pytest.raises(RuntimeError, match="memory-mapped"):
        _add(kind, plain, "x", (4,))
    mapped = _base().memmap_(tmp_path / "td")
    before = _snapshot(tmp_path)
    mapped.unlock_()  # is_memmap() is False from here on
    assert not mapped.is_memmap()
    with pytest.raises(RuntimeError, match="memory-mapped"):
        _add(kind, mapped, "x", (4,))
    loaded = TensorDict.load(tmp_path / "td")  # a load result is not memory-mapped until memmap_()
    with pytest.raises(NotMemmapError):
        _add(kind, loaded, "x", (4,))
    assert "x" not in plain and "x" not in mapped and "x" not in loaded
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", list(ADDERS))
def test_entry_is_added_although_locked(kind: str, tmp_path: Path) -> None:
    td = _base().memmap_(tmp_path / "td")
    assert td.is_locked
    out = _add(kind, td, "x", (4, 3), own_file=True)
    assert isinstance(out, MemoryMappedTensor) and td["x"] is out
    assert td.is_locked and td.is_memmap()
    with pytest.raises(LockedError):
        td["y"] = torch.zeros(4)  # still locked for ordinary structural changes


@pytest.mark.parametrize("kind", list(ADDERS))
def test_existing_key_raises(kind: str, tmp_path: Path) -> None:
    td = _base().memmap_(tmp_path / "td")
    before = _snapshot(tmp_path)
    for key in ["a", ("n", "b"), "s", "n"]:
        with pytest.raises(RuntimeError, match="already exists"):
            _add(kind, td, key, (4,))
    assert _snapshot(tmp_path) == before
    assert td["a"].tolist() == [0.0, 1.0, 2.0, 3.0] and td["s"] == "start"


@pytest.mark.parametrize("kind", list(ADDERS))
def test_tuple_key_creates_nested_tensordicts(kind: str, tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    out = _add(kind, td, ("x", "y", "z"), (4, 3), own_file=True)
    _add(kind, td, ("n", "c"), (4,), own_file=True)  # into an existing nested level
    assert td["x", "y", "z"] is out
    for level in (td["x"], td["x", "y"]):
        assert isinstance(level, TensorDict) and level.batch_size == torch.Size([4])
        assert level.is_memmap() and level.is_locked
    assert _meta(folder)["x"] == {"type": "TensorDict"}
    assert _meta(folder / "x")["y"] == {"type": "TensorDict"}
    fresh = TensorDict.load(folder)  # on disk too
    assert _leaf_keys(fresh) == _leaf_keys(td) == sorted(["a", "('n', 'b')", "('n', 'c')", "('x', 'y', 'z')", "s"])
    assert fresh["x", "y", "z"].shape == torch.Size([4, 3]) and fresh["x"].batch_size == torch.Size([4])
    out[0, 0] = 3.0
    assert fresh["x", "y", "z"].tolist() == out.tolist()


def test_storage_with_another_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    outside = _storage_at(tmp_path / "outside.bin", 16)
    (folder / "n" / "q.memmap").write_bytes(bytes(16))
    wrong_level = _storage_at(folder / "n" / "q.memmap", 16)  # the file of ("n", "q"), not of "q"
    other_leaf = torch.from_file(str(folder / "a.memmap"), shared=True, size=4).untyped_storage()
    before = _snapshot(tmp_path)
    for storage in (outside, wrong_level, other_leaf):
        with pytest.raises(RuntimeError, match="filename"):
            td.make_memmap_from_storage("q", storage, (4,))
    assert "q" not in td and _snapshot(tmp_path) == before


def test_storage_with_robust_key_false_is_checked_against_the_raw_name(tmp_path: Path) -> None:
    """robust_key=False: the entry's file is the key unchanged; a storage file that is not it, or a
    key that cannot be a file name, is the page's RuntimeError, naming both names."""
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    encoded = _storage_at(folder / "a%20b.memmap", 16)  # the robust name of "a b", not its raw name
    with pytest.raises(RuntimeError, match="filename") as info:
        td.make_memmap_from_storage("a b", encoded, (4,), robust_key=False)
    assert str(folder / "a b.memmap") in str(info.value) and "a%20b.memmap" in str(info.value)
    raw = _storage_at(folder / "a b.memmap", 16)
    assert td.make_memmap_from_storage("a b", raw, (4,), robust_key=False).tolist() == [0.0] * 4
    with pytest.raises(RuntimeError, match="cannot be the file of the entry") as bad:
        td.make_memmap_from_storage("x/y", encoded, (4,), robust_key=False)
    assert type(bad.value) is tdshare.MemmapError and "x/y" in str(bad.value) and "a%20b.memmap" in str(bad.value)
    assert "x/y" not in td.keys()


def test_file_less_storage_warning_points_at_the_caller(tmp_path: Path) -> None:
    td = _base().memmap_(tmp_path / "td")
    with pytest.warns(FutureWarning) as record:
        td.make_memmap_from_storage("mem", torch.ones(4).untyped_storage(), (4,))
    assert record[0].filename == __file__


def test_storage_with_the_entry_file_is_used_without_copy(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    storage = _storage_at(folder / "q.memmap", 4 * 8)
    direct = torch.empty(0, dtype=torch.int64).set_(storage, 0, (4,), (1,))
    direct.copy_(torch.tensor([5, 6, 7, 8]))
    out = td.make_memmap_from_storage("q", storage, (4,), dtype=torch.int64)
    nested_storage = _storage_at(folder / "n" / "r.memmap", 4 * 4)
    td.make_memmap_from_storage(("n", "r"), nested_storage, (4,))
    assert out.tolist() == [5, 6, 7, 8]
    direct[0] = 50  # the same memory: no copy was made
    assert td["q"][0] == 50
    fresh = TensorDict.load(folder)
    assert fresh["q"].tolist() == [50, 6, 7, 8] and fresh["q"].dtype == torch.int64
    assert fresh["n", "r"].tolist() == [0.0] * 4


def test_file_less_storage_warns_and_is_dropped_on_load_and_refresh(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    other = TensorDict.load(folder).memmap_()
    source = torch.arange(4, dtype=torch.float32)
    with pytest.warns(FutureWarning, match="0.17"):
        out = td.make_memmap_from_storage("mem", source.untyped_storage(), (4,))
    source[0] = 100.0  # used as it is: the same memory
    assert td["mem"] is out and out.tolist() == [100.0, 1.0, 2.0, 3.0]
    assert not any(p.name.startswith("mem") for p in folder.iterdir())  # not written to the folder
    assert "mem" not in TensorDict.load(folder)
    other.memmap_refresh_()
    assert "mem" not in other
    td.memmap_refresh_()  # the process that added it drops it too
    assert "mem" not in td
    assert td.make_memmap("mem", (4,)).tolist() == [0.0] * 4  # and the key can be used again
    assert TensorDict.load(folder)["mem"].tolist() == [0.0] * 4
    # an empty storage needs no file: it is kept (as in the reference), without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        td.make_memmap_from_storage("empty", torch.UntypedStorage(0), (4, 0))
    assert TensorDict.load(folder)["empty"].shape == torch.Size([4, 0])
    # anonymous memory has no folder to drop it from: no warning, the entry stays
    anon = _base().memmap_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        anon.make_memmap_from_storage("mem", torch.ones(4).untyped_storage(), (4,))
    assert anon["mem"].tolist() == [1.0] * 4


def test_dtype_none_is_the_default_dtype(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert td.make_memmap("d", (4,)).dtype == torch.float64
        storage = _storage_at(folder / "e.memmap", 4 * 8)
        assert td.make_memmap_from_storage("e", storage, (4,)).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    assert td.make_memmap("f", (4,)).dtype == previous
    assert td.make_memmap("g", (4,), dtype=torch.int16).dtype == torch.int16
    fresh = TensorDict.load(folder)
    assert [fresh[k].dtype for k in "defg"] == [torch.float64, torch.float64, previous, torch.int16]


def _failing_calls(folder: Path) -> list[tuple[str, Callable[[TensorDict], Any], type[BaseException]]]:
    other_file = _storage_at(folder.parent / "elsewhere.bin", 64)
    own_file = _storage_at(folder / "x.memmap", 64)  # the user's file, at the entry's path: kept as it is
    no_file = torch.ones(16).untyped_storage()
    return [
        ("batch size", lambda td: td.make_memmap("x", (3,)), BatchSizeError),
        ("nested batch size", lambda td: td.make_memmap(("new", "x"), (2, 4)), BatchSizeError),
        ("tensor batch size", lambda td: td.make_memmap_from_tensor("x", torch.ones(5)), BatchSizeError),
        ("storage batch size", lambda td: td.make_memmap_from_storage("x", own_file, (2, 2)), BatchSizeError),
        ("file-less batch size", lambda td: td.make_memmap_from_storage("x", no_file, (2, 2)), BatchSizeError),
        ("storage elsewhere", lambda td: td.make_memmap_from_storage("x", other_file, (4,)), RuntimeError),
        ("negative dim", lambda td: td.make_memmap(("new", "x"), (4, -1)), RuntimeError),
        ("storage too small", lambda td: td.make_memmap_from_storage("x", torch.UntypedStorage(4), (4,)), RuntimeError),
        ("reserved key", lambda td: td.make_memmap("shape", (4,)), ValueError),
        ("nested reserved key", lambda td: td.make_memmap(("new", "_type"), (4,)), ValueError),
        ("key type", lambda td: td.make_memmap(5, (4,)), TypeError),  # type: ignore[arg-type]
        ("legacy key", lambda td: td.make_memmap("a/b", (4,), robust_key=False), ValueError),
        ("through a leaf", lambda td: td.make_memmap(("a", "x"), (4,)), RuntimeError),
        ("existing key", lambda td: td.make_memmap("a", (4,)), RuntimeError),
        ("existing nested key", lambda td: td.make_memmap_from_tensor(("n", "b"), torch.ones(4, 2)), RuntimeError),
        ("existing non-tensor", lambda td: td.make_memmap("s", (4,)), RuntimeError),
        ("meta tensor", lambda td: td.make_memmap_from_tensor("x", torch.ones(4, device="meta")), NotImplementedError),
    ]


def test_a_failing_call_leaves_no_trace(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    registry = SharedRegistry.for_directory(str(folder))
    for name, call, error in _failing_calls(folder):
        before, state, keys = _snapshot(folder), registry.state(), _leaf_keys(td)
        with pytest.raises(error), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            call(td)
        assert _snapshot(folder) == before, name  # no file, no folder, no meta.json change
        assert registry.state() == state, name  # nothing committed
        assert _leaf_keys(td) == keys and "new" not in td and "x" not in td, name  # nothing in memory
    assert _leaf_keys(TensorDict.load(folder)) == _leaf_keys(td)


def test_a_new_entry_never_reuses_stale_bytes(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    garbage = torch.full((64,), 7.0).numpy().tobytes()
    (folder / "b.memmap").write_bytes(garbage)
    (folder / "n" / "c.memmap").write_bytes(garbage)
    (folder / "t.memmap").write_bytes(garbage)
    assert td.make_memmap("b", (4,)).tolist() == [0.0] * 4
    assert td.make_memmap(("n", "c"), (4, 2)).tolist() == [[0.0, 0.0]] * 4
    assert td.make_memmap_from_tensor("t", torch.ones(4, 3), copy_data=False).tolist() == [[0.0] * 3] * 4
    # no data to copy: a tensor on the meta device gives its shape and dtype
    made = td.make_memmap_from_tensor("m", torch.ones(4, 2, dtype=torch.int16, device="meta"), copy_data=False)
    assert made.tolist() == [[0, 0]] * 4 and made.dtype == torch.int16
    fresh = TensorDict.load(folder)
    assert fresh["b"].tolist() == [0.0] * 4 and fresh["n", "c"].sum() == 0 and fresh["t"].sum() == 0
    assert (folder / "b.memmap").stat().st_size == 16  # a new file, not the old one extended or cut


def test_key_added_on_disk_by_another_process_raises(peer: Peer, tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    peer.call(_p_take, "td", td)
    assert peer.call(_p_make, "td", "shared", [1.0, 2.0, 3.0, 4.0]) == [1.0, 2.0, 3.0, 4.0]
    peer.call(_p_make, "td", ("deep", "k"), [1, 2, 3, 4])
    assert "shared" not in td  # not refreshed yet
    before = _snapshot(folder)
    for kind in ADDERS:
        with pytest.raises(RuntimeError, match="memmap_refresh_"):
            _add(kind, td, "shared", (4,))
        with pytest.raises(RuntimeError, match="memmap_refresh_"):
            _add(kind, td, ("deep", "k"), (4,))
        with pytest.raises(RuntimeError, match="memmap_refresh_"):  # a leaf on disk cannot become a level
            _add(kind, td, ("shared", "k"), (4,))
    assert _snapshot(folder) == before and "shared" not in td and "deep" not in td
    td.memmap_refresh_()
    assert td["shared"].tolist() == [1.0, 2.0, 3.0, 4.0] and td["deep", "k"].tolist() == [1, 2, 3, 4]
    # a sibling in the level the other process created: the existing nested meta.json is extended
    td.make_memmap(("deep", "k2"), (4,))
    peer.call(_p_refresh, "td")
    assert peer.call(_p_keys, "td") == _leaf_keys(td)


# -- visibility across processes ----------------------------------------------------------------
def test_new_entries_are_visible_after_refresh(peer: Peer, tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    assert peer.call(_p_take, "got", td)  # through the queue
    assert peer.call(_p_load, "loaded", str(folder))  # loaded from the folder, then memmap_()
    td.make_memmap_from_tensor("new", torch.tensor([1, 2, 3, 4]))
    td.make_memmap(("n", "deep", "x"), (4, 2))[1, 0] = 5.0
    td.make_memmap(("other", "y"), (4,))
    expected = _leaf_keys(td)
    for name in ("got", "loaded"):
        assert "new" not in peer.call(_p_keys, name)  # refresh is how other processes discover entries
        peer.call(_p_refresh, name)
        assert peer.call(_p_keys, name) == expected
        new, deep = peer.call(_p_values, name, ["new", ("n", "deep", "x")])
        assert new == [1, 2, 3, 4] and deep == [[0, 0], [5, 0], [0, 0], [0, 0]]
    # and the other way round
    peer.call(_p_make, "got", ("p", "q"), [9.0, 9.0, 9.0, 9.0])
    assert "p" not in td
    td.memmap_refresh_()
    assert td["p", "q"].tolist() == [9.0] * 4 and td["p"].is_memmap() and td["p"].is_locked
    peer.call(_p_refresh, "loaded")
    assert peer.call(_p_keys, "loaded") == _leaf_keys(td) == _leaf_keys(TensorDict.load(folder))


def test_anonymous_entries_are_visible_after_refresh(peer: Peer) -> None:
    td = _base().memmap_()  # anonymous shared memory: no folder
    assert peer.call(_p_take, "td", td)
    td.make_memmap("new", (4,)).fill_(2.0)
    td.make_memmap_from_tensor(("n", "x"), torch.ones(4, dtype=torch.int64))
    assert "new" not in peer.call(_p_keys, "td")
    peer.call(_p_refresh, "td")
    assert peer.call(_p_keys, "td") == _leaf_keys(td)
    assert peer.call(_p_values, "td", ["new", ("n", "x")]) == [[2.0] * 4, [1] * 4]
    td["new"][0] = -2.0  # the same memory
    assert peer.call(_p_values, "td", ["new"]) == [[-2.0, 2.0, 2.0, 2.0]]
    peer.call(_p_make, "td", "from_peer", [5.0, 6.0, 7.0, 8.0])
    td.memmap_refresh_()
    assert td["from_peer"].tolist() == [5.0, 6.0, 7.0, 8.0]
    peer.call(_p_write, "td", "from_peer", 0, 50.0)
    assert td["from_peer"][0] == 50.0


def test_tensor_writes_are_seen_without_refresh(peer: Peer, tmp_path: Path) -> None:
    td = _base().memmap_(tmp_path / "td")
    peer.call(_p_take, "td", td)
    td.make_memmap("late", (4,))
    peer.call(_p_refresh, "td")
    td["a"][0] = 42.0
    td["late"][1] = 7.0
    td["n", "b"][2, 1] = -1.0
    assert peer.call(_p_values, "td", ["a", "late", ("n", "b")]) == [
        [42.0, 1.0, 2.0, 3.0],
        [0.0, 7.0, 0.0, 0.0],
        [[0.0, 0.0], [0.0, 0.0], [0.0, -1.0], [0.0, 0.0]],
    ]
    peer.call(_p_write, "td", "late", 3, 8.0)
    peer.call(_p_write, "td", "a", 3, 30.0)
    assert td["late"].tolist() == [0.0, 7.0, 0.0, 8.0] and td["a"][3] == 30.0


def test_non_tensor_write_is_visible_after_refresh(peer: Peer, tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)  # share_non_tensor=False: values travel through meta.json
    peer.call(_p_take, "td", td)
    td.set_("s", "written by the parent")
    assert peer.call(_p_values, "td", ["s"]) == ["start"]
    peer.call(_p_refresh, "td")
    assert peer.call(_p_values, "td", ["s"]) == ["written by the parent"]
    peer.call(_p_set_, "td", "s", "written by the peer")
    assert td["s"] == "written by the parent"
    td.memmap_refresh_()
    assert td["s"] == "written by the peer" == TensorDict.load(folder)["s"]


def test_refresh_without_changes_is_a_no_op(peer: Peer, tmp_path: Path) -> None:
    td = _base().memmap_(tmp_path / "td")
    peer.call(_p_take, "td", td)
    peer.call(_p_refresh, "td")
    ids = peer.call(_p_ids, "td")
    peer.call(_p_refresh, "td")
    peer.call(_p_refresh, "td")
    assert peer.call(_p_ids, "td") == ids  # the same leaf and nested objects
    td.make_memmap("new", (4,))
    peer.call(_p_refresh, "td")
    after = peer.call(_p_ids, "td")
    # only the new entry was mapped (non-tensor values are re-read: their own meta.json may have changed)
    assert {k: v for k, v in after.items() if k not in ("new", "s")} == {k: v for k, v in ids.items() if k != "s"}
    # and in the writing process
    own = {k: id(td[k]) for k in td.keys(include_nested=True)}
    td.memmap_refresh_()
    assert {k: id(td[k]) for k in td.keys(include_nested=True)} == own


def test_refresh_never_writes(peer: Peer, tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    peer.call(_p_take, "td", td)
    td.make_memmap(("n", "x"), (4,))
    td.set_("s", "changed")
    before = _snapshot(tmp_path)  # the folder, its meta.json files, the lock and counter files
    peer.call(_p_refresh, "td")  # a refresh that re-reads
    peer.call(_p_refresh, "td")  # and one that does not
    td.memmap_refresh_()
    assert _snapshot(tmp_path) == before
    assert peer.call(_p_keys, "td") == _leaf_keys(td)


def test_refresh_after_an_atomic_resave(peer: Peer, tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    peer.call(_p_take, "td", td)
    assert td["a"].tolist() == [0.0, 1.0, 2.0, 3.0]  # mapped now (a written leaf maps on first read)
    old_inode = folder.stat().st_ino
    peer.call(_p_atomic_resave, str(folder))  # another process swaps the whole folder
    assert folder.stat().st_ino != old_inode
    assert td["a"].tolist() == [0.0, 1.0, 2.0, 3.0]  # the old files stay mapped until the refresh
    with pytest.raises(tdshare.CorruptDataError, match=r"load the folder again") as info:
        td["n", "b"].sum()  # never read before the swap: its old file is gone, and the error says so
    assert "b.memmap" in str(info.value)
    td.memmap_refresh_()
    assert td["a"].tolist() == [9.0] * 4 and td["fresh"].tolist() == [[1.0, 1.0]] * 4
    assert td["s"] == "resaved" and "n" not in td
    td["a"][0] = -9.0  # writes reach the new files
    assert TensorDict.load(folder)["a"][0] == -9.0
    td.make_memmap("after", (4,))  # and entries go into the new folder
    peer.call(_p_refresh, "td")
    assert peer.call(_p_keys, "td") == _leaf_keys(td) == ["a", "after", "fresh", "s"]
    assert peer.call(_p_values, "td", ["a"]) == [[-9.0, 9.0, 9.0, 9.0]]


def test_refresh_of_a_tensordict_that_is_not_memory_mapped_raises(tmp_path: Path) -> None:
    _base().memmap_(tmp_path / "td")
    unlocked = _base().memmap_(tmp_path / "td2")
    unlocked.unlock_()
    for td in (_base(), unlocked, TensorDict.load(tmp_path / "td")):
        with pytest.raises(RuntimeError, match="refresh"):
            td.memmap_refresh_()


# -- share_non_tensor=True ----------------------------------------------------------------------
BACKENDS = ["folder", "anonymous"]


def _shared(folder: Path | None) -> TensorDict:
    """Shared non-tensor values in ``folder``, or in anonymous memory (the runtime store) for None."""
    return TensorDict(a=torch.zeros(4), s="short", j=NonTensorData({"k": [1, 2]}), o={1, 2}, batch_size=[4]).memmap_(
        folder, share_non_tensor=True
    )


def _shared_on(backend: str, tmp_path: Path) -> TensorDict:
    return _shared(tmp_path / "td" if backend == "folder" else None)


NESTED_JSON = {"n": {"m": [1, [2, 3.5]], "z": None, "t": True}, "list": [{"a": "b"}]}


def _check_shared_round_trip(td: TensorDict, read: Callable[[], dict[str, Any]], write: Callable[..., Any]) -> None:
    """The parent writes, the other process reads without refresh, and the other way round."""
    assert read() == {"s": "short", "j": {"k": [1, 2]}, "o": {1, 2}}
    td.set_("s", BIG)  # no size cap
    td.update_({"j": NonTensorData(NESTED_JSON)})
    td.set_("o", NonTensorData({3, 4}))  # a picklable value
    assert read() == {"s": (len(BIG), "end"), "j": NESTED_JSON, "o": {3, 4}}
    write("s", "from the other process")
    assert td["s"] == "from the other process"


@pytest.mark.parametrize(("backend", "how"), [("folder", "queue"), ("folder", "pickle"), ("anonymous", "queue")])
def test_shared_non_tensor_through_a_queue_or_pickle(peer: Peer, backend: str, how: str, tmp_path: Path) -> None:
    td = _shared_on(backend, tmp_path)
    if how == "queue":
        peer.call(_p_take, "td", td)
    else:
        peer.call(_p_unpickle, "td", pickle.dumps(td))
    _check_shared_round_trip(
        td, lambda: peer.call(_p_nontensor, "td"), lambda key, value: peer.call(_p_set_, "td", key, value)
    )
    if backend == "folder":
        assert TensorDict.load(tmp_path / "td", allow_pickle=True)["o"] == {3, 4}  # on disk as well


def test_shared_non_tensor_stays_shared_across_refreshes(peer: Peer, tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _shared(folder)
    peer.call(_p_take, "td", td)
    td.make_memmap("x", (4,))
    peer.call(_p_refresh, "td", False)  # a full re-read; allow_pickle=False: the shared pickle is not reloaded
    td.set_("s", "after a refresh")
    assert peer.call(_p_nontensor, "td") == {"s": "after a refresh", "j": {"k": [1, 2]}, "o": {1, 2}}
    new = TensorDict(a=torch.ones(4), s="resaved", j=NonTensorData([1]), o={5}, batch_size=[4])
    new = new.memmap(folder, atomic=True, share_non_tensor=True)
    peer.call(_p_refresh, "td")
    assert peer.call(_p_nontensor, "td") == {"s": "resaved", "j": [1], "o": {5}}
    new.set_("s", "written after the re-save")
    assert peer.call(_p_nontensor, "td")["s"] == "written after the re-save"  # still shared, no refresh
    assert td["s"] == "written after the re-save"


def _shared_child(td: TensorDict, replies: Any, wrote: Any, child_wrote: Any) -> None:
    try:
        replies.put(("read", _p_nontensor({"td": td}, "td")))
        assert wrote.wait(timeout=WAIT)
        replies.put(("read", _p_nontensor({"td": td}, "td")))
        td.set_("s", "from the other process")
        child_wrote.set()
    except BaseException:
        replies.put(("error", traceback.format_exc()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_shared_non_tensor_as_process_arguments(method: str, backend: str, tmp_path: Path) -> None:
    ctx = _ctx(method)
    td = _shared_on(backend, tmp_path)
    replies, wrote, child_wrote = ctx.Queue(), ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_shared_child, args=(td, replies, wrote, child_wrote), daemon=True)
    proc.start()
    try:
        phase = [0]

        def read() -> dict[str, Any]:
            if phase[0]:
                wrote.set()
            phase[0] += 1
            tag, payload = replies.get(timeout=WAIT)
            assert tag == "read", payload
            return payload

        def write(key: str, value: Any) -> None:
            assert child_wrote.wait(timeout=WAIT)

        _check_shared_round_trip(td, read, write)
    finally:
        proc.join(timeout=WAIT)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=WAIT)
    assert proc.exitcode == 0


def test_shared_non_tensor_in_process(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _shared(folder)
    again = pickle.loads(pickle.dumps(td))
    td.set_("s", BIG)
    assert again["s"] == BIG
    again.update_({"j": NonTensorData(NESTED_JSON)})
    assert td["j"] == NESTED_JSON
    assert _meta(folder / "s")["data"] == BIG and _meta(folder / "j")["data"] == NESTED_JSON
    td.make_memmap("x", (4,))  # other commits do not disturb the shared values
    assert again["s"] == BIG and td["j"] == NESTED_JSON


# -- stress ---------------------------------------------------------------------------------------
def _stress_child(td: TensorDict, rank: int, per_proc: int, total: int, replies: Any, go: Any) -> None:
    try:
        for i in range(per_proc):
            t = td.make_memmap(f"r{rank}_{i}", (4,), dtype=torch.int64)
            t.fill_(rank * 1000 + i)
            td.set_("status", f"{rank}:{i}")
            status = td["status"]
            assert isinstance(status, str) and status.count(":") == 1, status
            td.memmap_refresh_()
            keys = set(td.keys())
            assert all(f"r{rank}_{j}" in keys for j in range(i + 1)), keys
        replies.put(("added", rank))
        assert go.wait(timeout=WAIT)
        td.memmap_refresh_()
        values = {k: td[k][0].item() for k in td.keys() if k.startswith("r")}
        assert len(values) == total, len(values)
        replies.put(("done", (rank, values, td["status"])))
    except BaseException:
        replies.put(("error", traceback.format_exc()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("method", "n_procs", "per_proc"), [("fork", 32, 4), ("forkserver", 8, 3), ("spawn", 2, 3)])
def test_many_processes_add_entries_and_refresh(method: str, n_procs: int, per_proc: int, tmp_path: Path) -> None:
    if method not in METHODS:
        pytest.skip(f"no {method} start method")
    ctx = _ctx(method)
    folder = tmp_path / "td"
    td = TensorDict(a=torch.zeros(4), status="init", batch_size=[4]).memmap_(folder, share_non_tensor=True)
    replies, go = ctx.Queue(), ctx.Event()
    total = n_procs * per_proc
    procs = [
        ctx.Process(target=_stress_child, args=(td, r, per_proc, total, replies, go), daemon=True)
        for r in range(n_procs)
    ]
    for p in procs:
        p.start()
    try:
        added = set()
        while len(added) < n_procs:
            tag, payload = replies.get(timeout=WAIT)
            assert tag == "added", payload
            added.add(payload)
        go.set()
        expected = {f"r{r}_{i}": r * 1000 + i for r in range(n_procs) for i in range(per_proc)}
        for _ in procs:
            tag, payload = replies.get(timeout=WAIT)
            assert tag == "done", payload
            _, values, status = payload
            assert values == expected
            assert status.count(":") == 1
    finally:
        go.set()
        for p in procs:
            p.join(timeout=WAIT)
            if p.is_alive():
                p.kill()
                p.join(timeout=WAIT)
    assert [p.exitcode for p in procs] == [0] * n_procs
    meta = _meta(folder)  # intact, and it names every entry
    assert {k for k in meta if k.startswith("r")} == set(expected)
    fresh = TensorDict.load(folder)
    assert {k: fresh[k][0].item() for k in fresh.keys() if k.startswith("r")} == expected
    assert not [p.name for p in folder.rglob("*") if "tmp" in p.name]  # no temporary file left
    td.memmap_refresh_()
    assert set(td.keys()) == set(fresh.keys())


def _reader(folder: str, target: int, started: Any, replies: Any) -> None:
    try:
        counts = []
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            td = TensorDict.load(folder)
            keys = [k for k in td.keys() if k.startswith("k")]
            counts.append(len(keys))
            if keys:  # the data is written before the metadata that names it
                last = max(keys, key=lambda k: int(k[1:]))
                assert td[last].tolist() == [float(last[1:])] * 4, (last, td[last])
            started.set()
            if len(keys) == target:
                break
        replies.put(("counts", counts))
    except BaseException:
        replies.put(("error", traceback.format_exc()))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", [m for m in ("fork", "forkserver") if m in METHODS])
def test_reader_never_sees_partial_metadata(method: str, tmp_path: Path) -> None:
    ctx = _ctx(method)
    folder = tmp_path / "td"
    td = TensorDict(a=torch.zeros(4), batch_size=[4]).memmap_(folder)
    started, replies = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_reader, args=(str(folder), 200, started, replies), daemon=True)
    proc.start()
    try:
        assert started.wait(timeout=WAIT)
        for i in range(200):
            td.make_memmap_from_tensor(f"k{i}", torch.full((4,), float(i)))
        tag, counts = replies.get(timeout=WAIT)
        assert tag == "counts", counts
    finally:
        proc.join(timeout=WAIT)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=WAIT)
    assert proc.exitcode == 0
    assert counts[-1] == 200 and counts == sorted(counts)  # non-decreasing, no exception


# -- crash ----------------------------------------------------------------------------------------
def _crash_writer(folder: str, holding: Any, release: Any) -> None:
    """Add a nested entry, but stop for good half-way through the commit, holding the lock.

    The new level's meta.json is replaced (the commit writes the deepest level first); the root's
    is left half-written in its temporary file.
    """
    import tdshare._entries as entries
    from tdshare._files import tmp_name

    real_replace = entries.replace_file

    def stuck_replace(path: str, data: Any) -> None:
        if os.path.dirname(path) != folder:
            return real_replace(path, data)
        with open(tmp_name(path), "wb") as f:
            f.write(bytes(data)[: len(data) // 2])
        holding.set()
        release.wait(timeout=WAIT)  # never set: the parent kills this process

    entries.replace_file = stuck_replace
    td = TensorDict.load(folder).memmap_()
    td.make_memmap_from_tensor(("new", "k"), torch.full((4,), 7.0))


def _lock_holder(folder: str, go: Any, holding: Any, release: Any) -> None:
    """Once told to, take the registry lock (waiting for whoever holds it) and keep it."""
    assert go.wait(timeout=WAIT)
    SharedRegistry.for_directory(folder).lock().acquire(timeout=WAIT)
    holding.set()
    release.wait(timeout=WAIT)  # never set: the parent kills this process


def _kill(proc: Any) -> None:
    proc.kill()  # SIGKILL
    proc.join(timeout=WAIT)
    assert proc.exitcode == -signal.SIGKILL


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", METHODS)
def test_sigkill_mid_commit_leaves_a_loadable_folder_and_a_free_lock(method: str, tmp_path: Path) -> None:
    ctx = _ctx(method)
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    keys = _leaf_keys(td)
    lock = SharedRegistry.for_directory(str(folder)).lock()
    go, writer_holds, holder_holds, release = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    writer = ctx.Process(target=_crash_writer, args=(str(folder), writer_holds, release), daemon=True)
    holder = ctx.Process(target=_lock_holder, args=(str(folder), go, holder_holds, release), daemon=True)
    writer.start()
    holder.start()  # both start at once: spawn pays its start-up cost once
    try:
        assert writer_holds.wait(timeout=WAIT)  # killed half-way through replacing meta.json
        with pytest.raises(TimeoutError):  # filelock.Timeout: the lock is really held
            lock.acquire(timeout=0.05)
        go.set()  # the holder now waits for the lock
        _kill(writer)
        fresh = TensorDict.load(folder)  # the old state: the half-written meta.json never replaced it
        assert _leaf_keys(fresh) == keys and fresh["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
        assert holder_holds.wait(timeout=WAIT)  # another process got the dead writer's lock
        _kill(holder)  # and dies holding it
        lock.acquire(timeout=WAIT)  # the kernel releases a dead process's flock
        lock.release()
    finally:
        for proc in (writer, holder):
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=WAIT)
    # the killed writer's files: a data file and a nested meta.json that the root never names
    assert (folder / "new" / "k.memmap").exists() and "k" in _meta(folder / "new")
    assert _leaf_keys(TensorDict.load(folder)) == keys
    td.memmap_refresh_()
    assert "new" not in td
    td.make_memmap(("new", "j"), (4,))  # the leftover level is replaced, and linked this time
    assert _leaf_keys(TensorDict.load(folder)) == sorted([*keys, "('new', 'j')"])
    assert td.make_memmap(("new", "k"), (4,)).tolist() == [0.0] * 4  # a fresh file, not the dead writer's 7s
    assert TensorDict.load(folder)["new", "k"].tolist() == [0.0] * 4


def test_control_files_live_in_the_runtime_folder(tmp_path: Path) -> None:
    folder = tmp_path / "td"
    td = _base().memmap_(folder)
    lock_path, gen_path = control_paths(str(folder))
    runtime = os.path.dirname(lock_path)
    assert os.path.dirname(gen_path) == runtime and not runtime.startswith(str(tmp_path))
    assert os.path.basename(os.path.dirname(runtime)).startswith("tdshare-")
    # a plain save coordinates with nobody: no control files until someone refreshes or adds
    assert sorted(os.listdir(tmp_path)) == ["td"] and not os.path.exists(gen_path)
    TensorDict.load(folder)
    assert not os.path.exists(gen_path)
    td.memmap_refresh_()
    assert os.path.getsize(gen_path) == 16
    registry = SharedRegistry.for_directory(str(folder))
    assert SharedRegistry.for_directory(str(folder / "n")) is registry  # a nested level shares it
    state = registry.state()
    assert state is not None
    gen, epoch = state
    td.make_memmap("x", (4,))
    assert registry.state() == (gen + 1, epoch)  # a new entry replaces no file
    _base().memmap(folder, atomic=True)
    assert registry.state() == (gen + 2, epoch + 2)  # a re-save does: marked before the swap, bumped after
    assert control_paths(str(folder)) == (lock_path, gen_path)  # the swapped folder: the same files
    assert sorted(os.listdir(tmp_path)) == ["td"]  # nothing was ever written beside the folder


def test_anonymous_shared_values_live_in_the_runtime_store() -> None:
    td = _shared(None)
    store = td._anon_store[0]
    assert os.path.isdir(os.path.join(store, "values", "s")) and "data" in _meta(Path(store) / "values" / "s")
    td.set_("s", BIG)
    assert _meta(Path(store) / "values" / "s")["data"] == BIG
    td["a"][0] = 5.0
    assert isinstance(td["a"], MemoryMappedTensor) and td["a"]._segment is not None  # leaves stay in the segment
    other = TensorDict(a=torch.zeros(4), s="x", batch_size=[4]).memmap_(share_non_tensor=True)
    assert other._anon_store[0] != store  # one store per tree
    td.make_memmap("added", (4,))  # entries published through the same store
    assert td["s"] == BIG


@pytest.mark.timeout(120)
def test_anonymous_store_is_removed_with_its_last_user() -> None:
    code = (
        "import os, torch\n"
        "from tdshare import TensorDict\n"
        "td = TensorDict(a=torch.zeros(2), s='v', batch_size=[2]).memmap_(share_non_tensor=True)\n"
        "print(td._anon_store[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    store = out.stdout.strip()
    assert store and not os.path.exists(store)  # a clean exit of its only user removes it


def test_a_swap_that_reuses_the_folders_inode_number_is_seen(tmp_path: Path) -> None:
    """A re-save whose new folder got the old one's inode number (file systems reuse a freed one at
    once) keeps the folder's identity; the load still sees the swap by the tree's file epoch."""
    from tdshare._coordination import EpochGuard
    from tdshare._read import _stamp, _swapped
    from tdshare._store import DirectoryStore

    path = str(tmp_path / "td")
    TensorDict(a=torch.ones(2)).memmap_(path)
    reg = SharedRegistry.for_directory(path)
    store = DirectoryStore(path, True, None, None)
    store.guard = EpochGuard(reg, reg.state(create=True))
    before = _stamp(path)
    assert not _swapped(path, before, store)
    reg.mark_replacing()  # what an atomic re-save does, with the lock held, before its swap
    assert _stamp(path) == before and _swapped(path, before, store)
