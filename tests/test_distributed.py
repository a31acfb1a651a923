"""tdshare.distributed over real gloo process groups (spawned ranks, a FileStore under tmp_path).

Each test starts one group and runs a worker function on every rank; the workers check values
bitwise where they are and send summaries back through a queue, which the test checks again.
Every wait is bounded (queue timeouts, the group's timeout, ``timeout=`` on transfers).
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _kinds import KINDS, build

import tdshare
from tdshare import LazyStackedTensorDict, NonTensorData, PickleRefusedError, TensorDict
from tdshare import distributed as tdd

ROOT = Path(__file__).resolve().parents[1]
DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16, torch.int32,
    torch.int64, torch.bool, torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.uint64,
    torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip


def _entry(
    rank: int, world: int, store_path: str, out: Any, fn: Callable[..., Any], args: tuple, backend: str = "gloo"
) -> None:
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend,
            store=dist.FileStore(store_path, world),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=30),
        )
        out.put((rank, "ok", fn(rank, world, *args)))
    except BaseException:  # report anything to the parent
        out.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(
    world: int,
    fn: Callable[..., Any],
    tmp_path: Path,
    *args: Any,
    timeout: float = 60.0,
    backend: str = "gloo",
    reports: int | None = None,
) -> dict[int, Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks; return each rank's result
    (``reports``: how many ranks report, where the others die on purpose; default all)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = str(tmp_path / f"store-{os.getpid()}-{fn.__name__}")
    procs = [ctx.Process(target=_entry, args=(r, world, store, out, fn, args, backend)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world if reports is None else reports):
            rank, status, value = out.get(timeout=timeout)
            assert status == "ok", f"rank {rank} failed:\n{value}"
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return results


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _all_dtypes(offset: int) -> TensorDict:
    g = torch.Generator().manual_seed(offset)
    leaves = {}
    for i, dtype in enumerate(DTYPES):
        raw = torch.randint(0, 256, (3, 2 + i % 3, dtype.itemsize), dtype=torch.uint8, generator=g)
        leaves[str(dtype).removeprefix("torch.")] = raw.view(dtype).reshape(3, 2 + i % 3)
    return TensorDict(leaves, nested={"x": torch.arange(3.0) + offset, "empty": torch.zeros(3, 0)}, batch_size=[3])


def _big_and_strided(offset: int) -> TensorDict:
    """A leaf over the direct-message size (1 MiB), a transposed (non-contiguous) one, a small one."""
    big = torch.arange(300_000, dtype=torch.float64) + offset  # 2.4 MB: its own message
    strided = (torch.arange(12.0).view(3, 4) + offset).t()
    return TensorDict(big=big, strided=strided, small=torch.tensor([offset]), batch_size=[])


# -- point to point ---------------------------------------------------------------------------


def _p2p(rank: int, world: int, folder: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    if rank == 0:
        for kind in KINDS:
            tdd.send(build(kind, 1.0), 1, timeout=20)  # into a new tree
            tdd.send(build(kind, 2.0), 1, timeout=20)  # into a preallocated one
        tdd.send(_all_dtypes(1), 1)
        tdd.send(_all_dtypes(2), 1)  # the same schema: no schema resent, in place
        td = TensorDict(a=torch.arange(4.0), s="v1", batch_size=[4])
        tdd.send(td, 1)
        td["s"] = "v2"  # a changed non-tensor value: new schema, same buffers
        tdd.send(td, 1)
        td["b"] = torch.ones(4, dtype=torch.int16)  # a new key mid-stream
        tdd.send(td, 1)
        tdd.send(td, 1, tag=3)  # into the memory-mapped receiver
        handle = tdd.isend(td, 1, tag=4)
        assert handle.wait(timeout=20) is td
        with pytest.raises(PickleRefusedError, match=r"allow_pickle"):
            tdd.send(TensorDict(obj={1, 2}, batch_size=[]), 1, tag=5)
        tdd.send(TensorDict(obj={1, 2}, batch_size=[]), 1, tag=5, allow_pickle=True)
        tdd.send(TensorDict(obj={3}, batch_size=[]), 1, tag=6, allow_pickle=True)
        tdd.send(_big_and_strided(1), 1, tag=7)
        tdd.send(_big_and_strided(2), 1, tag=7)
        return report
    for kind in KINDS:
        fresh = tdd.recv(None, 0, timeout=20)
        assert type(fresh) is type(build(kind))
        assert (fresh == build(kind, 1.0)).all()
        target = build(kind)
        ptrs = [t.data_ptr() for t in tdd.leaves_of(target)]  # the stored leaves (a lazy stack's members')
        got = tdd.recv(target, 0, timeout=20)
        assert got is target and [t.data_ptr() for t in tdd.leaves_of(target)] == ptrs
        assert (target == build(kind, 2.0)).all()
        report[kind] = [_bits(t) for t in tdd.leaves_of(target)]
    report["dtypes_new"] = {k: _bits(v) for k, v in tdd.recv(None, 0).items(True, True) if isinstance(v, torch.Tensor)}
    target = _all_dtypes(0)
    ptrs = {k: v.data_ptr() for k, v in target.items(True, True)}
    tdd.recv(target, 0)
    assert {k: v.data_ptr() for k, v in target.items(True, True)} == ptrs
    report["dtypes_inplace"] = {k: _bits(v) for k, v in target.items(True, True)}
    target = TensorDict(a=torch.zeros(4), s="old", batch_size=[4])
    tdd.recv(target, 0)
    assert target["s"] == "v1"
    a_ptr = target["a"].data_ptr()
    tdd.recv(target, 0)
    assert target["s"] == "v2" and target["a"].data_ptr() == a_ptr
    with pytest.raises(tdd.SchemaMismatchError, match=r"another layout") as info:
        tdd.recv(target, 0)
    assert target.keys() == ["a", "s"]  # untouched
    report["changed"] = info.value.received["b"].tolist()
    mm = TensorDict(a=torch.zeros(4), s="v2", b=torch.zeros(4, dtype=torch.int16), batch_size=[4]).memmap_(folder)
    ptr = mm["b"].data_ptr()
    tdd.recv(mm, 0, tag=3)
    assert mm["b"].data_ptr() == ptr
    report["memmap_files"] = TensorDict.load(folder)["a"].tolist()  # read back through the files
    handle = tdd.irecv(None, 0, tag=4)
    report["irecv"] = handle.wait(timeout=20)["b"].tolist()
    with pytest.raises(PickleRefusedError, match=r"allow_pickle"):
        tdd.recv(None, 0, tag=5)
    report["pickled"] = tdd.recv(None, 0, tag=6, allow_pickle=True)["obj"]
    report["big_new"] = {k: _bits(v) for k, v in tdd.recv(None, 0, tag=7).items()}
    target = _big_and_strided(0)
    ptrs = {k: v.data_ptr() for k, v in target.items()}
    tdd.recv(target, 0, tag=7)
    assert {k: v.data_ptr() for k, v in target.items()} == ptrs
    report["big_inplace"] = {k: _bits(v) for k, v in target.items()}
    return report


def test_send_recv_every_kind_dtype_and_schema_change(tmp_path: Path) -> None:
    res = _run(2, _p2p, tmp_path, str(tmp_path / "mm"))[1]
    for kind in KINDS:
        assert res[kind] == [_bits(t) for t in tdd.leaves_of(build(kind, 2.0))]
    expected = {k: _bits(v) for k, v in _all_dtypes(1).items(True, True)}
    assert res["dtypes_new"] == expected
    assert res["dtypes_inplace"] == {k: _bits(v) for k, v in _all_dtypes(2).items(True, True)}
    assert res["changed"] == [1, 1, 1, 1]
    assert res["memmap_files"] == [0.0, 1.0, 2.0, 3.0]
    assert res["irecv"] == [1, 1, 1, 1]
    assert res["pickled"] == {3}
    assert res["big_new"] == {k: _bits(v) for k, v in _big_and_strided(1).items()}
    assert res["big_inplace"] == {k: _bits(v) for k, v in _big_and_strided(2).items()}


# -- kept plans: a changed tree is never sent or received through a stale layout --------------


def _tree(offset: float) -> TensorDict:
    return TensorDict(
        a=torch.arange(6.0) + offset,
        m=(torch.arange(9.0) + offset).view(3, 3),
        n={"i": torch.arange(4) + int(offset), "flag": torch.tensor([True, False])},
        note="x",
        batch_size=[],
    )


def test_plan_is_kept_while_the_tree_is_unchanged_and_rebuilt_on_any_change() -> None:
    from tdshare._wire_plan import _PLANS, plan_for

    td = _tree(0.0)
    first = plan_for(td, False)
    assert plan_for(td, False) is first
    td["a"].add_(1)  # a data write: the same layout
    assert plan_for(td, False) is first
    changes: list[Callable[[TensorDict], Any]] = [
        lambda t: t.set("a", torch.zeros(6)),  # a replaced leaf (same shape)
        lambda t: t["m"].transpose_(0, 1),  # strides only (a square leaf)
        lambda t: t["a"].unsqueeze_(0),  # shape only, in place
        lambda t: t.set(("n", "new"), torch.zeros(1)),  # a new key in a nested level
        lambda t: t.set_("note", "y"),  # a non-tensor value
        lambda t: t["n"]["i"].share_memory_(),  # the memory moved under the same tensor
    ]
    for change in changes:
        before = plan_for(td, False)
        change(td)
        after = plan_for(td, False)
        assert after is not before
        assert [_bits(t) for t in after.leaves] == [_bits(t) for t in tdd.leaves_of(td)]
        assert after.schema.digest == tdd.schema_of(td).digest
    key = (id(td), False)
    assert key in _PLANS
    del td, before, after, first
    assert key not in _PLANS  # dropped with its tree


def test_consolidated_schema_is_one_storage_and_matches_the_plain_layout() -> None:
    from tdshare._wire_plan import plan_for

    td = _tree(1.0)
    c = td.consolidate()
    plain, whole = plan_for(td, False), plan_for(c, False)
    assert whole.storage is not None and whole.schema.storage == whole.storage.numel()
    assert [(g.dtype, g.numel) for g in whole.schema.groups] == [(torch.uint8, whole.storage.numel())]
    assert whole.schema.layout_digest == plain.schema.layout_digest  # one may be received into the other
    assert whole.schema.wire_digest != plain.schema.wire_digest and whole.schema.digest != plain.schema.digest
    assert whole.schema.content_digest == plain.schema.content_digest  # same values: nothing to assign
    again = tdd.Schema.from_json(whole.schema.to_json())
    assert again.digest == whole.schema.digest and again.slots == whole.schema.slots
    msgs = whole.buffers(_CpuTransport(), True)
    assert len(msgs) == 1 and msgs[0].data_ptr() == whole.storage.data_ptr()  # the storage itself, no copy
    assert whole.storage_version is not None  # one version counter for every leaf
    c["a"].add_(1)  # a data write: the same plan
    assert plan_for(c, False) is whole
    c["m"].transpose_(0, 1)  # an in-place stride change on one view: seen through the shared counter
    moved = plan_for(c, False)
    assert moved is not whole and moved.storage is None  # no longer the storage's own layout
    assert [_bits(t) for t in moved.leaves] == [_bits(t) for t in tdd.leaves_of(c)]


def test_consolidated_in_memory_keeps_a_header_room_that_nothing_else_sees(tmp_path: Path) -> None:
    import pickle

    import tensordict

    from tdshare._consolidate import HEAD_ROOM, consolidated_message
    from tdshare._transport import HEADER_BYTES
    from tdshare._wire_plan import plan_for

    c = _tree(2.0).consolidate()
    storage, schema = tdshare.consolidated_parts(c)
    framed = consolidated_message(c)
    assert HEAD_ROOM == HEADER_BYTES and framed is not None
    assert framed.numel() == HEAD_ROOM + storage.numel() and framed[HEAD_ROOM:].data_ptr() == storage.data_ptr()
    plan = plan_for(c, False)
    assert plan.buffers(_CpuTransport(), True, HEADER_BYTES)[0].data_ptr() == framed.data_ptr()  # no copy
    assert (pickle.loads(pickle.dumps(c)) == c).all()
    assert consolidated_message(tdshare.from_consolidated_parts(storage.clone(), schema)) is None
    path = tmp_path / "c.bin"
    filed = _tree(2.0).consolidate(filename=path)
    assert consolidated_message(filed) is None  # a file holds the storage, then the schema: no room
    assert tensordict.TensorDict.from_consolidated(str(path))["a"].tolist() == c["a"].tolist()


class _CpuTransport:
    device = torch.device("cpu")


@pytest.mark.parametrize("fused", [True, False])
def test_packing_keeps_every_byte(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """One indexed gather per dtype group; without it (over the index limit), cat in chunks under the grain."""
    from tdshare import _wire_span
    from tdshare._transport import GRAIN, HEADER_BYTES, data_layout, group_views
    from tdshare._wire_plan import plan_for
    from tdshare._wire_span import FusedCopy

    if not fused:
        monkeypatch.setattr(_wire_span, "SPAN_WORDS", 1000)
    sizes = [100, 40_000, 30_000, 5_000, 2_000, 31_000, 0, 7]  # runs of cat under the grain, big ones alone
    g = torch.Generator().manual_seed(3)
    td = TensorDict(
        {f"f{i}": torch.randn(n, generator=g) for i, n in enumerate(sizes)},
        b=torch.ones(3, dtype=torch.bool),
        h={"a": torch.arange(5, dtype=torch.int16), "b": torch.arange(3, dtype=torch.int16) + 5},  # 2-byte words
    )
    plan = plan_for(td, False)
    ops = plan._send_layout(_CpuTransport(), HEADER_BYTES)[0]  # type: ignore[arg-type,index]
    assert ops is not None
    if fused:
        assert [type(part) for _, _, _, part in ops] == [FusedCopy, torch.Tensor, FusedCopy]  # the bools: one run
        assert [ops[0][3].unit, ops[2][3].unit] == [4, 2]  # the widest word every address and size allows
    else:
        assert all(n < GRAIN or isinstance(part, torch.Tensor) for _, _, n, part in ops)
    assert sum(n for _, _, n, _ in ops) == sum(sizes) + 3 + 8
    for reuse in (True, False, True):
        message = plan.buffers(_CpuTransport(), reuse, HEADER_BYTES)[0]  # type: ignore[arg-type]
        assert message.numel() == HEADER_BYTES + data_layout(plan.schema)[0]
        f32, flags, h = group_views(plan.schema, message[HEADER_BYTES:])
        assert _bits(f32) == b"".join(_bits(td[f"f{i}"]) for i in range(len(sizes)))
        assert flags.tolist() == [True] * 3 and h.tolist() == list(range(8))
        td["f0"].add_(1)  # new values, the same plan


def test_fused_copy_scatters_bit_for_bit_and_refuses_what_does_not_qualify() -> None:
    from tdshare._wire_span import fused_copy

    g = torch.Generator().manual_seed(5)
    dst = [torch.zeros(7, dtype=torch.float16), torch.zeros(3, dtype=torch.bool), torch.zeros(2, 4), torch.zeros(0)]
    raw = torch.randint(0, 256, (14 + 3 + 32,), dtype=torch.uint8, generator=g)
    raw[14:17] = torch.tensor([0, 1, 255], dtype=torch.uint8)  # a bool byte other than 0 and 1 stays as it is
    src = list(raw.split([14, 3, 32]))
    flat = [t.view(torch.uint8).view(-1) for t in dst]
    copy = fused_copy(flat, [*src, torch.zeros(0, dtype=torch.uint8)])
    assert copy is not None and copy.unit == 1 and copy.src.index is None and copy.dst.index is not None
    copy()
    assert b"".join(_bits(t) for t in dst) == _bits(raw)
    spread = raw[::2][:3]  # the sources need not be one run either
    out = [torch.zeros(1, dtype=torch.uint8) for _ in range(3)]
    copy = fused_copy(out, list(spread.contiguous().split(1)))
    assert copy is not None
    copy()
    assert [int(t) for t in out] == spread.tolist()
    base = torch.zeros(8)
    assert fused_copy([base[:4], base[2:6]], [torch.ones(4), torch.ones(4)]) is None  # overlapping destinations
    assert fused_copy([torch.zeros(4, 2).t()], [torch.ones(8)]) is None  # not contiguous
    assert fused_copy([torch.zeros(4)], [torch.ones(3)]) is None  # different sizes


@pytest.mark.parametrize("gathered_first", [False, True])
def test_fused_scatter_in_wide_words_keeps_nan_payloads_and_the_bytes_between(gathered_first: bool) -> None:
    """Leaves of 64-byte rows are written in 16-byte words by scatter_: every bit moves (NaN
    payloads, signalling ones too), and the memory between the leaves is never touched."""
    from tdshare._wire_span import fused_copy

    g = torch.Generator().manual_seed(11)
    arena = torch.full((40 * 32,), -7, dtype=torch.int64)  # leaves spread over it, with gaps
    dst = [arena[i * 32 : i * 32 + 8 * (1 + i % 3)] for i in range(40)]
    raw = torch.randint(-(2**62), 2**62, (sum(t.numel() for t in dst),), dtype=torch.int64, generator=g)
    raw[:4] = torch.tensor([0x7FF0000000000001, 0x7FF8DEADBEEF0001, -1, 0x0000000000000001])  # sNaN, qNaN, ...
    if gathered_first:  # neither side one run: gathered in rows, then scattered in 16-byte words
        spread = torch.zeros(raw.numel() * 2, dtype=torch.int64)
        src, at = [], 0
        for t in dst:
            spread[2 * at : 2 * at + t.numel()] = raw[at : at + t.numel()]
            src.append(spread[2 * at : 2 * at + t.numel()])
            at += t.numel()
    else:
        src = list(raw.split([t.numel() for t in dst]))
    copy = fused_copy([t.view(torch.float64) for t in dst], [s.view(torch.float64) for s in src])
    assert copy is not None and copy.unit == 64 and copy.dst.unit == 16 and copy.dst.index is not None
    copy()
    assert b"".join(_bits(t) for t in dst) == _bits(raw)
    written = torch.zeros(arena.numel(), dtype=torch.bool)
    for t in dst:
        start = (t.data_ptr() - arena.data_ptr()) // 8
        written[start : start + t.numel()] = True
    assert (arena[~written] == -7).all()  # the gaps as they were


def _plans(rank: int, world: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    if rank == 0:
        td = _tree(1.0)
        tdd.send(td, 1)  # the schema, then the data
        tdd.send(td, 1)  # unchanged: header and data message posted together
        td["a"].mul_(10)
        tdd.send(td, 1)  # new values, same plan
        td["a"] = torch.full((6,), 7.0)  # a replaced leaf
        tdd.send(td, 1)
        td["m"].transpose_(0, 1)  # new strides: packed from the transposed view
        tdd.send(td, 1)
        td["a"].unsqueeze_(0)  # a new shape, in place: a new schema
        tdd.send(td, 1)
        c = _tree(3.0).consolidate()
        for _ in range(4):  # into a consolidated tree, a plain one, a new one, and an irecv
            tdd.send(c, 1, tag=1)
        tdd.send(_tree(4.0), 1, tag=1)  # plain into a consolidated tree
        for i in range(5):  # two schemas in turn on one stream: each schema's text is sent once
            tdd.send(_tree(float(i)) if i % 2 else TensorDict(b=torch.full((2,), i), batch_size=[2]), 1, tag=2)
        return report
    target = _tree(0.0)
    ptrs = [t.data_ptr() for t in tdd.leaves_of(target)]
    for name in ("first", "again", "scaled"):
        tdd.recv(target, 0)
        assert [t.data_ptr() for t in tdd.leaves_of(target)] == ptrs
        report[name] = [_bits(t) for t in tdd.leaves_of(target)]
    target["a"] = torch.zeros(6)  # a replaced target leaf gets the data, not the old one
    new_a = target["a"].data_ptr()
    tdd.recv(target, 0)
    assert target["a"].data_ptr() == new_a
    report["replaced"] = target["a"].tolist()
    tdd.recv(target, 0)
    report["transposed"] = target["m"].tolist()
    with pytest.raises(tdd.SchemaMismatchError, match=r"another layout") as info:
        tdd.recv(target, 0)
    report["reshaped"] = list(info.value.received["a"].shape)
    whole = _tree(0.0).consolidate()
    storage = tdshare.consolidated_parts(whole)[0]
    leaf_ptrs = [t.data_ptr() for t in tdd.leaves_of(whole)]
    tdd.recv(whole, 0, tag=1)
    assert tdshare.consolidated_parts(whole)[0].data_ptr() == storage.data_ptr()
    assert [t.data_ptr() for t in tdd.leaves_of(whole)] == leaf_ptrs
    report["consolidated_inplace"] = [_bits(t) for t in tdd.leaves_of(whole)]
    plain = _tree(0.0)
    tdd.recv(plain, 0, tag=1)
    report["consolidated_to_plain"] = [_bits(t) for t in tdd.leaves_of(plain)]
    report["consolidated_new"] = [_bits(t) for t in tdd.leaves_of(tdd.recv(None, 0, tag=1))]
    report["consolidated_irecv"] = [_bits(t) for t in tdd.leaves_of(tdd.irecv(None, 0, tag=1).wait(timeout=20))]
    tdd.recv(whole, 0, tag=1)
    assert [t.data_ptr() for t in tdd.leaves_of(whole)] == leaf_ptrs
    report["plain_to_consolidated"] = [_bits(t) for t in tdd.leaves_of(whole)]
    parsed: list[int] = []
    parse = tdd.Schema.from_json
    tdd.Schema.from_json = lambda text: (parsed.append(1), parse(text))[1]  # type: ignore[method-assign,assignment]
    report["alternating"] = [[_bits(t) for t in tdd.leaves_of(tdd.recv(None, 0, tag=2))] for _ in range(5)]
    report["parsed"] = len(parsed)
    return report


def test_changed_trees_and_consolidated_trees_arrive_bitwise(tmp_path: Path) -> None:
    res = _run(2, _plans, tmp_path)[1]
    one = _tree(1.0)
    assert res["first"] == res["again"] == [_bits(t) for t in tdd.leaves_of(one)]
    one["a"].mul_(10)
    assert res["scaled"] == [_bits(t) for t in tdd.leaves_of(one)]
    assert res["replaced"] == [7.0] * 6
    assert res["transposed"] == (torch.arange(9.0) + 1).view(3, 3).t().tolist()
    assert res["reshaped"] == [1, 6]
    three = [_bits(t) for t in tdd.leaves_of(_tree(3.0))]
    for name in ("consolidated_inplace", "consolidated_to_plain", "consolidated_new", "consolidated_irecv"):
        assert res[name] == three, name
    assert res["plain_to_consolidated"] == [_bits(t) for t in tdd.leaves_of(_tree(4.0))]
    sent = [_tree(float(i)) if i % 2 else TensorDict(b=torch.full((2,), i), batch_size=[2]) for i in range(5)]
    assert res["alternating"] == [[_bits(t) for t in tdd.leaves_of(td)] for td in sent]
    assert res["parsed"] == 2


# -- steady streams: one message per unchanged transfer, every change seen ---------------------


def _small(offset: float, note: str = "n") -> TensorDict:
    return TensorDict(f=torch.arange(6.0) + offset, i=torch.arange(3) + int(offset), note=note, batch_size=[])


def _whole(offset: float) -> TensorDict:
    """A consolidated tree over the inline size (1 MiB): its storage travels as a message of its own."""
    big = torch.arange(300_000, dtype=torch.float32) + offset
    return TensorDict(big=big, i=torch.arange(3), batch_size=[]).consolidate()


def _steady(rank: int, world: int) -> dict[str, Any]:
    from tdshare._consolidate import consolidated_message
    from tdshare._transport import Header, Transport

    counts: list[int] = []
    post, bcast = Transport.post_send, Transport.broadcast_one

    def counted_post(self: Transport, msgs: list[torch.Tensor], dst: int, tag: int) -> list[Any]:
        counts.append(len(msgs))
        return post(self, msgs, dst, tag)

    def counted_bcast(self: Transport, message: torch.Tensor, src: int, peer: str) -> Any:
        counts.append(1)
        return bcast(self, message, src, peer)

    Transport.post_send = counted_post  # type: ignore[method-assign]
    Transport.broadcast_one = counted_bcast  # type: ignore[method-assign]
    report: dict[str, Any] = {}
    if rank == 0:
        td = _small(1.0)
        for _ in range(3):  # the schema once, then the header and the data in one message
            td["f"].add_(1)
            tdd.send(td, 1)
        tdd.send(td, 1)  # the receiver's target changed meanwhile: still in its new leaf
        td["note"] = "m"  # a changed value: the old-size first message, then the schema and the data
        tdd.send(td, 1)
        tdd.send(td, 1)
        for i in range(3):  # a big consolidated tree: header and storage, then a small tree again
            tdd.send(_whole(float(i)), 1, tag=1)
        tdd.send(_small(9.0), 1, tag=1)
        c = _small(1.0).consolidate()
        for _ in range(3):  # a small consolidated tree: from the room before its storage, one message
            c["f"].add_(1)
            tdd.send(c, 1, tag=8)
        other = TensorDict(f=torch.arange(7.0), i=torch.arange(3), note="n", batch_size=[]).consolidate()
        tdd.send(other, 1, tag=8)  # another layout into the receiver's own storage: refused, untouched
        tdd.send(c, 1, tag=8)  # the first schema again: its text is known
        report["p2p"], report["broadcast"] = list(counts), []

        def broadcast(tree: TensorDict) -> None:
            before = len(counts)
            tdd.broadcast(tree, 0)
            report["broadcast"].append(len(counts) - before)  # collectives of this call

        for _ in range(3):
            td["f"].add_(1)
            broadcast(td)
        td["note"] = "o"
        broadcast(td)
        for i in range(2):
            broadcast(_whole(float(i)))
        broadcast(_small(5.0))
        for _ in range(2):
            broadcast(c)  # consolidated, up to 1 MiB: one collective from the room
        return report
    target = _small(0.0)
    ptrs = [t.data_ptr() for t in tdd.leaves_of(target)]
    for i in range(3):
        tdd.recv(target, 0)
        assert [t.data_ptr() for t in tdd.leaves_of(target)] == ptrs
        report[f"p2p {i}"] = target["f"].tolist()
    target["f"] = torch.zeros(6)  # a replaced leaf: the kept plan is stale while the message travels
    tdd.recv(target, 0)
    report["replaced"] = target["f"].tolist()
    with pytest.raises(tdd.SchemaMismatchError, match=r"another layout"):
        tdd.recv(TensorDict(f=torch.zeros(7), i=torch.zeros(3, dtype=torch.int64), note="", batch_size=[]), 0)
    tdd.recv(target, 0)
    report["note"] = target["note"]
    whole = _whole(-1.0)
    storage = tdshare.consolidated_parts(whole)[0]
    for i in range(2):
        tdd.recv(whole, 0, tag=1)
        assert tdshare.consolidated_parts(whole)[0].data_ptr() == storage.data_ptr()  # in place
        report[f"whole {i}"] = _bits(whole["big"]) == _bits(_whole(float(i))["big"])
    report["whole new"] = _bits(tdd.recv(None, 0, tag=1)["big"]) == _bits(_whole(2.0)["big"])
    report["small after big"] = tdd.recv(None, 0, tag=1)["f"].tolist()
    mine = _small(0.0).consolidate()
    storage, framed = tdshare.consolidated_parts(mine)[0], consolidated_message(mine)
    assert framed is not None
    for i in range(3):
        tdd.recv(mine, 0, tag=8)
        assert tdshare.consolidated_parts(mine)[0].data_ptr() == storage.data_ptr() and mine.is_consolidated()
        report[f"consolidated {i}"] = mine["f"].tolist()
    assert Header.from_tensor(framed).inline  # the header landed in the room before the storage
    before = _bits(storage)
    with pytest.raises(tdd.SchemaMismatchError, match=r"another layout") as info:
        tdd.recv(mine, 0, tag=8)
    assert _bits(storage) == before and info.value.received["f"].tolist() == list(range(7))
    tdd.recv(mine, 0, tag=8)
    report["consolidated again"] = mine["f"].tolist()
    for i in range(3):
        tdd.broadcast(target, 0)
        report[f"broadcast {i}"] = target["f"].tolist()
    tdd.broadcast(target, 0)
    report["broadcast note"] = target["note"]
    for i in range(2):
        tdd.broadcast(whole, 0)
        report[f"broadcast whole {i}"] = _bits(whole["big"]) == _bits(_whole(float(i))["big"])
    report["broadcast small"] = tdd.broadcast(None, 0)["f"].tolist()
    for i in range(2):
        tdd.broadcast(mine, 0)
        assert tdshare.consolidated_parts(mine)[0].data_ptr() == storage.data_ptr()
        report[f"broadcast consolidated {i}"] = mine["f"].tolist()
    return report


def test_unchanged_transfers_are_one_message_and_changes_are_never_misread(tmp_path: Path) -> None:
    res = _run(2, _steady, tmp_path)
    # first: the header, the schema, the data; then one message each; a change: first message,
    # schema, data; the consolidated stream: header + storage (in place), then another schema
    # a small consolidated stream: the schema once, one message each, another layout, the first again
    assert res[0]["p2p"] == [3, 1, 1, 1, 3, 1, 3, 2, 2, 4, 3, 1, 1, 3, 2]
    assert res[0]["broadcast"] == [3, 1, 1, 3, 3, 2, 3, 3, 1]
    for i in range(3):
        assert res[1][f"p2p {i}"] == (torch.arange(6.0) + 2 + i).tolist()
        assert res[1][f"broadcast {i}"] == (torch.arange(6.0) + 5 + i).tolist()
    assert res[1]["replaced"] == (torch.arange(6.0) + 4).tolist()
    assert res[1]["note"] == "m" and res[1]["broadcast note"] == "o"
    assert res[1]["whole 0"] and res[1]["whole 1"] and res[1]["whole new"]
    assert res[1]["small after big"] == (torch.arange(6.0) + 9).tolist()
    assert res[1]["broadcast whole 0"] and res[1]["broadcast whole 1"]
    assert res[1]["broadcast small"] == (torch.arange(6.0) + 5).tolist()
    for i in range(3):
        assert res[1][f"consolidated {i}"] == (torch.arange(6.0) + 2 + i).tolist()
    assert res[1]["consolidated again"] == res[1]["broadcast consolidated 0"] == (torch.arange(6.0) + 4).tolist()
    assert res[1]["broadcast consolidated 1"] == (torch.arange(6.0) + 4).tolist()


# -- collectives ------------------------------------------------------------------------------


def _collectives(rank: int, world: int, folder: str) -> dict[str, Any]:
    report: dict[str, Any] = _sync(rank, world, folder)
    src_td = TensorDict(x=torch.arange(6.0).reshape(3, 2), n={"i": torch.arange(3)}, tag="b", batch_size=[3])
    target = TensorDict(x=torch.zeros(3, 2), n={"i": torch.zeros(3, dtype=torch.int64)}, tag="", batch_size=[3])
    got = tdd.broadcast(src_td if rank == 1 else target, 1, timeout=20)
    assert got is (src_td if rank == 1 else target)
    report["broadcast"] = (got["x"].tolist(), got["n", "i"].tolist(), got["tag"])
    mine = TensorDict(v=torch.full((2,), float(rank)), r=torch.tensor([rank]), who=f"rank{rank}", batch_size=[])
    stacked = tdd.all_gather(mine, timeout=20)
    report["all_gather"] = (list(stacked.batch_size), stacked["v"].tolist(), stacked["r"].tolist(), stacked["who"])
    ls = LazyStackedTensorDict(*[TensorDict(a=torch.tensor([float(i)]), batch_size=[]) for i in range(world)])
    piece = tdd.scatter(ls if rank == 0 else None, 0, timeout=20)
    report["scatter"] = piece["a"].tolist()
    for kind in KINDS:  # every container kind through broadcast and all_gather
        target = build(kind)
        ptrs = [t.data_ptr() for t in tdd.leaves_of(target)]
        got = tdd.broadcast(build(kind, 5.0) if rank == 2 else target, 2, timeout=20)
        if rank != 2:
            assert got is target and [t.data_ptr() for t in tdd.leaves_of(target)] == ptrs
        gathered = tdd.all_gather(build(kind, float(rank)), timeout=20)
        assert type(gathered) is type(build(kind)) and gathered.batch_size == (world, 4)
        report[f"{kind} broadcast"] = [_bits(t) for t in tdd.leaves_of(got)]
        report[f"{kind} all_gather"] = (_bits(gathered["a"]), _bits(gathered["n", "b"]))
    return report


def test_broadcast_all_gather_scatter_sync_world_4(tmp_path: Path) -> None:
    res = _run(4, _collectives, tmp_path, str(tmp_path))
    for rank in range(4):
        assert res[rank]["first"] == [0.0, 1.0, 2.0, 3.0]  # sync: the first call sends every leaf
        assert res[rank]["new"] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # make_memmap on rank 0, in each folder
        assert res[rank]["mode"] == "eval" and res[rank]["live"] == "eval"
        assert res[rank]["broadcast"] == ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], [0, 1, 2], "b")
        assert res[rank]["all_gather"] == (
            [4],
            [[float(r)] * 2 for r in range(4)],
            [[r] for r in range(4)],
            [f"rank{r}" for r in range(4)],
        )
        assert res[rank]["scatter"] == [float(rank)]
        for kind in KINDS:
            assert res[rank][f"{kind} broadcast"] == [_bits(t) for t in tdd.leaves_of(build(kind, 5.0))]
            expected = torch.stack([build(kind, float(r)) for r in range(4)], 0)
            assert res[rank][f"{kind} all_gather"] == (_bits(expected["a"]), _bits(expected["n", "b"]))


# -- replicated refresh -----------------------------------------------------------------------


class _CountingStore:
    """A Store that records the calls made through it."""

    def __init__(self, store: Any) -> None:
        self.store, self.calls = store, []

    def get(self, key: str) -> bytes:
        self.calls.append("get")
        return self.store.get(key)

    def set(self, key: str, value: str) -> None:
        self.calls.append("set")
        self.store.set(key, value)


def _sync(rank: int, world: int, folder: str) -> dict[str, Any]:
    td = TensorDict(a=torch.zeros(4), mode="train", batch_size=[4]).memmap_(f"{folder}/{rank}")
    if rank == 0:
        td["a"].copy_(torch.arange(4.0))
    tdd.sync(td, 0, timeout=20)  # the first call sends every leaf
    first = td["a"].tolist()
    if rank == 0:
        td.make_memmap(("n", "new"), [4, 2], dtype=torch.int32).copy_(torch.arange(8, dtype=torch.int32).view(4, 2))
        td.set_("mode", "eval")
    tdd.sync(td, 0, timeout=20)
    counting = _CountingStore(dist.distributed_c10d._get_default_store())
    tdd.sync(td, 0, store=counting, timeout=20)  # unchanged
    assert counting.calls == (["set"] if rank == 0 else ["get"])  # one Store round trip, no data
    loaded = TensorDict.load(f"{folder}/{rank}")  # the additions are in this rank's own folder
    return {"first": first, "new": loaded["n", "new"].tolist(), "mode": loaded["mode"], "live": td["mode"]}


# -- failures ---------------------------------------------------------------------------------


def _dead_peer(rank: int, world: int, gone: Any = None) -> str:
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        # not before rank 0's own init is done: gloo's init may return on one rank while the
        # other still connects its pairs, which a peer dying then fails (not what is tested)
        store.wait(["up"], timedelta(seconds=20))
        store.set("ready", "1")
        os._exit(0)  # dies without sending
    store.set("up", "1")
    store.wait(["ready"], timedelta(seconds=20))
    if gone is not None:  # the peer is dead before the call: gloo refuses to post the receive itself
        assert gone.wait(30)
    with pytest.raises(tdd.PeerError, match=r"rank 1") as info:
        tdd.recv(None, 1, timeout=2)
    return str(info.value)


@pytest.mark.parametrize("when", ["during", "before"])
def test_dead_peer_is_an_error_naming_it(tmp_path: Path, when: str) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    gone = ctx.Event() if when == "before" else None
    store = str(tmp_path / "store-dead")
    procs = [ctx.Process(target=_entry, args=(r, 2, store, out, _dead_peer, (gone,))) for r in range(2)]
    for p in procs:
        p.start()
    try:
        if gone is not None:
            procs[1].join(timeout=30)
            assert procs[1].exitcode == 0
            gone.set()
        rank, status, value = out.get(timeout=60)
        assert (rank, status) == (0, "ok"), value
        assert "rank 1" in value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    with pytest.raises(queue.Empty):
        out.get(timeout=0.1)


def test_errors_before_any_transfer() -> None:
    with pytest.raises(RuntimeError, match=r"init_process_group"):
        tdd.send(TensorDict(a=torch.zeros(1), batch_size=[]), 1)
    with pytest.raises(TypeError, match=r"tensordict"):
        tdd.schema_of(torch.zeros(2))


def test_schema_hashes_separate_values_from_layout() -> None:
    a = tdd.schema_of(TensorDict(x=torch.zeros(2), s="a", batch_size=[2]))
    b = tdd.schema_of(TensorDict(x=torch.ones(2), s="b", batch_size=[2]))
    c = tdd.schema_of(TensorDict(x=torch.ones(3), s="a", batch_size=[3]))
    assert a.layout_digest == b.layout_digest != c.layout_digest
    assert a.digest != b.digest and a.digest == tdd.Schema.from_json(a.to_json()).digest
    assert isinstance(NonTensorData("x"), NonTensorData) and tdshare.distributed is tdd


def _nccl(rank: int, world: int) -> dict[str, Any]:
    dev = torch.device("cuda", torch.cuda.current_device())
    td = TensorDict(a=torch.arange(4.0, device=dev) + rank, i=torch.arange(4, device=dev), s="x", batch_size=[4])
    if rank == 0:
        tdd.send(td, 1, timeout=60)
    else:
        target = td.clone().zero_()
        ptr = target["a"].data_ptr()
        tdd.recv(target, 0, timeout=60)
        assert target["a"].data_ptr() == ptr and target["a"].is_cuda
        td = target
    got = tdd.broadcast(td, 0, timeout=60)
    stacked = tdd.all_gather(td, timeout=60)
    return {"a": got["a"].cpu().tolist(), "gathered": stacked["i"].cpu().tolist()}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a CUDA device per rank (2); this has fewer")
def test_nccl_send_recv_broadcast_all_gather(tmp_path: Path) -> None:
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL")
    res = _run(2, _nccl, tmp_path, backend="nccl", timeout=120)
    for rank in range(2):
        assert res[rank]["a"] == [0.0, 1.0, 2.0, 3.0]
        assert res[rank]["gathered"] == [[0, 1, 2, 3]] * 2


def test_example_runs_under_spawn(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "distributed_pair.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rank 1 received obs sum=28.0 tag=hello" in proc.stdout


def test_example_runs_under_torchrun(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(ROOT / "examples" / "distributed_pair.py"),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 1 received obs sum=28.0 tag=hello" in proc.stdout
