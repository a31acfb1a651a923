"""One set of memmap-family tests over every container kind: a TensorDict, a tensorclass and a lazy
stack, on every backend (a folder, a ``.tdz`` archive, anonymous memory) and across processes.

Each kind is built with the same content: a float leaf ``a`` of 4 rows, a nested ``("n", "b")`` of
4 x 2, and a non-tensor ``s``.  The kind-specific tests live beside their modules
(``test_tensorclass.py``, ``test_lazy.py``); these check that the spec's promises hold for all.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
import torch
from _kinds import KINDS, build

import tdshare
from tdshare import LazyStackedTensorDict, MemoryMappedTensor

METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]
WAIT = 60


def values(obj: Any) -> tuple[list[float], list[list[float]]]:
    return obj.get("a").tolist(), obj.get(("n", "b")).tolist()


def expected(offset: float = 0.0) -> tuple[list[float], list[list[float]]]:
    return (torch.arange(4.0) + offset).tolist(), (torch.zeros(4, 2) + offset).tolist()


def leaves_mapped(obj: Any) -> bool:
    inner = obj.tensordicts if isinstance(obj, LazyStackedTensorDict) else [obj]
    return all(isinstance(m.get("a"), MemoryMappedTensor) for m in inner)


@pytest.mark.parametrize("kind", KINDS)
def test_memmap_in_place_returns_self_locked_and_mapped(tmp_path: Path, kind: str) -> None:
    obj = build(kind)
    out = obj.memmap_(tmp_path / "td")
    assert out is obj and obj.is_memmap() and obj.is_locked and leaves_mapped(obj)
    back = type(obj).load_memmap(tmp_path / "td")
    assert type(back) is type(obj) and values(back) == expected()


@pytest.mark.parametrize("backend", ["folder", "archive", "anonymous"])
@pytest.mark.parametrize("kind", KINDS)
def test_memmap_copy_on_every_backend(tmp_path: Path, kind: str, backend: str) -> None:
    prefix = {"folder": tmp_path / "td", "archive": tmp_path / "td.tdz", "anonymous": None}[backend]
    obj = build(kind)
    out = obj.memmap(prefix)
    assert out is not obj and type(out) is type(obj) and not obj.is_memmap()
    assert values(out) == expected()
    if prefix is not None:
        back = tdshare.load(prefix)  # the saved class comes back, whatever loads it
        assert type(back) is type(obj) and values(back) == expected()


@pytest.mark.parametrize("kind", KINDS)
def test_save_overwrites_and_atomic_replaces(tmp_path: Path, kind: str) -> None:
    build(kind).save(tmp_path / "td")
    build(kind, 5.0).save(tmp_path / "td")  # existsok=True
    assert values(type(build(kind)).load_memmap(tmp_path / "td")) == expected(5.0)
    build(kind, 9.0).memmap(tmp_path / "td", atomic=True)
    assert values(type(build(kind)).load_memmap(tmp_path / "td")) == expected(9.0)


@pytest.mark.parametrize("kind", KINDS)
def test_existsok_false_refuses_existing_files(tmp_path: Path, kind: str) -> None:
    build(kind).save(tmp_path / "td")
    with pytest.raises(RuntimeError, match="existsok"):
        build(kind, 1.0).memmap(tmp_path / "td", existsok=False)
    assert values(type(build(kind)).load_memmap(tmp_path / "td")) == expected()


@pytest.mark.parametrize("kind", KINDS)
def test_load_memmap_into_an_instance(tmp_path: Path, kind: str) -> None:
    build(kind, 3.0).save(tmp_path / "td")
    target = build(kind)
    assert target.load_memmap_(tmp_path / "td") is target
    assert values(target) == expected(3.0)


@pytest.mark.parametrize("kind", ["tensordict", "tensorclass"])
def test_entries_added_elsewhere_appear_after_a_refresh(tmp_path: Path, kind: str) -> None:
    obj = build(kind).memmap_(tmp_path / "td")
    other = type(obj).load_memmap(tmp_path / "td").memmap_()
    # inside the nested tensordict: a tensorclass takes no keys beyond its declared fields
    other.make_memmap(("n", "m"), [4])[:] = 2.0
    other.make_memmap_from_tensor(("n", "t"), torch.full((4,), 3.0))
    assert obj.memmap_refresh_() is obj
    assert obj.get(("n", "m")).tolist() == [2.0] * 4 and obj.get(("n", "t")).tolist() == [3.0] * 4


def test_a_lazy_stack_adds_entries_through_its_members(tmp_path: Path) -> None:
    obj = build("lazy").memmap_(tmp_path / "td")
    with pytest.raises(NotImplementedError, match="member"):
        obj.make_memmap("m", [4])
    obj.tensordicts[0].make_memmap("m", [])
    assert "m" in type(obj).load_memmap(tmp_path / "td").tensordicts[0].keys()


@pytest.mark.parametrize("kind", ["tensordict", "tensorclass"])
def test_shared_non_tensor_values(tmp_path: Path, kind: str) -> None:
    obj = build(kind).memmap_(tmp_path / "td", share_non_tensor=True)
    other = type(obj).load_memmap(tmp_path / "td").memmap_(share_non_tensor=True)
    obj.set_("s", "changed")
    assert other.get("s") == "changed"


def _child_writes(obj: Any, out: Any) -> None:
    try:
        obj.set_("a", torch.full((4,), 42.0))
        out.put(("ok", obj.get("a").tolist()))
    except BaseException as err:  # reported to the parent
        out.put(("error", repr(err)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["folder", "anonymous"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", METHODS)
def test_a_child_writes_in_place_into_the_parents_memory(tmp_path: Path, method: str, kind: str, backend: str) -> None:
    obj = build(kind).memmap_(tmp_path / "td" if backend == "folder" else None)
    ctx = mp.get_context(method)
    out = ctx.Queue()
    proc = ctx.Process(target=_child_writes, args=(obj, out))
    proc.start()
    tag, payload = out.get(timeout=WAIT)
    proc.join(WAIT)
    assert tag == "ok", payload
    assert payload == [42.0] * 4 and obj.get("a").tolist() == [42.0] * 4


@pytest.mark.parametrize("kind", KINDS)
def test_progress_reports_every_leaf_file(tmp_path: Path, kind: str) -> None:
    calls: list[tuple[int, int]] = []
    build(kind).memmap_(tmp_path / "td", progress=lambda done, total: calls.append((done, total)))
    total = calls[-1][1]
    assert calls[-1] == (total, total) and total == (8 if kind == "lazy" else 2)  # a lazy stack: 2 per member


def _child_sets_one_element(obj: Any, out: Any) -> None:
    try:
        element = obj[1].clone()
        element.set("s", "new")
        obj[1] = element  # one element of the shared stack: the whole list is written, under the lock
        out.put(("ok", list(obj.get("s"))))
    except BaseException as err:  # reported to the parent
        out.put(("error", repr(err)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["folder", "anonymous"])
@pytest.mark.parametrize("kind", ["tensordict", "tensorclass"])
@pytest.mark.parametrize("method", METHODS)
def test_a_shared_non_tensor_stack_is_live_across_processes(
    tmp_path: Path, method: str, kind: str, backend: str
) -> None:
    obj = build(kind)
    obj.set("s", ["t0", "t1", "t2", "t3"])  # a list of strings: one value per element
    obj = obj.memmap_(tmp_path / "td" if backend == "folder" else None, share_non_tensor=True)
    ctx = mp.get_context(method)
    out = ctx.Queue()
    proc = ctx.Process(target=_child_sets_one_element, args=(obj, out))
    proc.start()
    tag, payload = out.get(timeout=WAIT)
    proc.join(WAIT)
    assert tag == "ok", payload
    assert payload == ["t0", "new", "t2", "t3"]
    assert list(obj.get("s")) == ["t0", "new", "t2", "t3"]  # no refresh: the parent reads the shared value
    if backend == "folder":
        assert list(type(obj).load_memmap(tmp_path / "td").get("s")) == ["t0", "new", "t2", "t3"]


SPEC_METHODS = ["memmap_", "memmap", "save", "dumps", "load", "load_memmap", "load_memmap_", "make_memmap_from_storage"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_abstract_base_has_the_family_and_loads_the_saved_class(tmp_path: Path, kind: str) -> None:
    """Every tensordict class and every tensorclass has the spec's methods, the abstract
    TensorDictBase too; a load through the base gives the class the folder was saved from."""
    obj = build(kind)
    assert all(callable(getattr(tdshare.TensorDictBase, m)) for m in SPEC_METHODS)
    assert all(callable(getattr(type(obj), m)) for m in SPEC_METHODS)
    assert isinstance(obj, tdshare.TensorDictBase) is (kind != "tensorclass")  # as in the reference
    obj.save(tmp_path / "f")
    for backend in ("f", "a.tdz"):
        if backend != "f":
            obj.save(tmp_path / backend)
        loaded = tdshare.TensorDictBase.load_memmap(tmp_path / backend)
        assert type(loaded) is type(obj) and values(loaded) == expected()
    with pytest.raises(TypeError, match="abstract"):
        tdshare.TensorDictBase()


@pytest.mark.parametrize("call", ["memmap", "memmap_", "save", "memmap_like"])
@pytest.mark.parametrize("backend", ["folder", "anonymous"])
@pytest.mark.parametrize("kind", KINDS)
def test_return_early_with_threads_gives_a_future_on_every_backend(
    tmp_path: Path, kind: str, backend: str, call: str
) -> None:
    # the spec: "if True and num_threads > 1, returns a TensorDictFuture" (anonymous memory too)
    obj = build(kind)
    prefix = tmp_path / "td" if backend == "folder" else None
    future = getattr(obj, call)(prefix, num_threads=2, return_early=True)
    assert isinstance(future, tdshare.TensorDictFuture)
    out = future.result(timeout=WAIT)
    assert future.done() and type(out) is type(obj) and out.is_memmap()
    assert (out is obj) == (call == "memmap_")
    assert values(out) == (([0.0] * 4, [[0.0, 0.0]] * 4) if call == "memmap_like" else expected())


@pytest.mark.parametrize("backend", ["folder", "archive", "anonymous"])
@pytest.mark.parametrize("kind", KINDS)
def test_memmap_like_zeroes_every_kind_and_keeps_the_original(tmp_path: Path, kind: str, backend: str) -> None:
    prefix = {"folder": tmp_path / "td", "archive": tmp_path / "td.tdz", "anonymous": None}[backend]
    obj = build(kind, offset=1.0)
    like = obj.memmap_like(prefix)
    assert type(like) is type(obj) and like.batch_size == obj.batch_size and like.get("s") == "text"
    assert values(like) == ([0.0] * 4, [[0.0, 0.0]] * 4) and values(obj) == expected(1.0)  # not changed
    like.update_({"a": torch.tensor([0.0, 0.0, 7.0, 0.0])})
    if prefix is not None:  # the write reaches the files (an archive's too: it is loaded with mode="r+")
        assert tdshare.load(prefix).get("a").tolist() == [0.0, 0.0, 7.0, 0.0]
    assert like.is_locked == (backend != "archive")  # as the reference: an archive's result is unlocked
    if prefix is None:
        with pytest.raises(ValueError, match="archive=True needs a prefix"):
            obj.memmap_like(None, archive=True)
    if backend == "archive":  # refused before anything is written, whatever num_threads says
        for threads in (0, 2):
            with pytest.raises(NotImplementedError, match="return_early"):
                obj.memmap_like(tmp_path / f"early{threads}.tdz", num_threads=threads, return_early=True)
            assert not (tmp_path / f"early{threads}.tdz").exists()


@pytest.mark.parametrize("backend", ["folder", "anonymous"])
def test_memmap_like_of_an_expanded_buffer_writes_no_page(tmp_path: Path, backend: str) -> None:
    # a replay buffer larger than memory: 1,000,000 x 84 x 84 bytes (7 GB) on a 24 GiB machine
    template = tdshare.TensorDict(obs=torch.ones(84, 84, dtype=torch.uint8), reward=torch.ones(())).expand(10**6)
    prefix = tmp_path / "buffer" if backend == "folder" else None
    buffer = template.memmap_like(prefix)
    assert buffer["obs"].shape == (10**6, 84, 84) and buffer["reward"].dtype == torch.float32
    assert int(buffer["obs"][-1].sum()) == 0 and int(buffer["obs"][0].sum()) == 0
    buffer["obs"][123_456] = 9
    assert int(buffer["obs"][123_456].sum()) == 9 * 84 * 84
    if prefix is not None:
        # sparse files: created at their size, the only page written is the row just set
        blocks = (prefix / "obs.memmap").stat().st_blocks * 512
        assert (prefix / "obs.memmap").stat().st_size == 84 * 84 * 10**6 and blocks <= 1 << 20
        assert int(tdshare.TensorDict.load_memmap(prefix)["obs"][123_456, 0, 0]) == 9


def test_a_zero_broadcast_tensor_is_saved_without_being_materialized(tmp_path: Path) -> None:
    zeros = torch.zeros((), dtype=torch.int64).expand(1000, 1000)  # 8 MB, one element in memory
    minus_zero = torch.tensor(-0.0).expand(1000, 1000)  # all zero values, not all zero bytes
    td = tdshare.TensorDict(z=zeros, m=minus_zero).memmap(tmp_path / "td")
    assert (tmp_path / "td" / "z.memmap").stat().st_blocks == 0  # no page written
    assert int(td["z"].abs().sum()) == 0 and torch.equal(td["m"].view(torch.int32), minus_zero.view(torch.int32))
