"""torch.distributed transfers between two local gloo ranks (``--only distributed``).

Two spawned ranks run the same cases in the same order (:func:`run_interleaved`, each round
starting one case later); every repetition starts after a barrier and is timed on the receiving
rank, to the moment its tree is complete.  Cases, for a 1,000-leaf tensordict (800 float32 leaves
of 64 elements, 200 int64 leaves of 16) and for ``big_leaves`` float32 leaves of
``big_leaf_bytes``:

- tdshare ``send``/``recv`` into a preallocated tree, and ``broadcast``;
- tdshare with both trees ``memmap_()``-ed into anonymous memory (each dtype's leaves one run: one
  copy per dtype on each side);
- tdshare with both trees ``consolidate()``-d (1,000 leaves only: one message of the storage,
  received into the receiver's own storage), against tensordict's ``send(consolidated=True)``;
- tensordict's own ``td.send`` / ``td.recv`` (one message per leaf);
- a per-leaf loop of plain ``torch.distributed.send`` / ``recv`` (in the row's note);
- the raw limit: one ``send`` of one flat buffer of the same bytes.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ._common import Backend, Cell, Config, Row, Scratch, log, run_interleaved

__all__ = ["distributed"]


def _many(lib: Any) -> Any:
    leaves: dict[str, torch.Tensor] = {f"f{i}": torch.randn(64) for i in range(800)}
    leaves.update({f"i{i}": torch.arange(16) + i for i in range(200)})
    return lib.TensorDict({"a": dict(list(leaves.items())[:500]), "b": dict(list(leaves.items())[500:])}, batch_size=[])


def _big(lib: Any, n: int, nbytes: int) -> Any:
    return lib.TensorDict({f"x{i}": torch.full((nbytes // 4,), float(i)) for i in range(n)}, batch_size=[])


def _leaves(td: Any) -> list[torch.Tensor]:
    return [v for _, v in sorted(td.items(True, True), key=lambda kv: str(kv[0])) if isinstance(v, torch.Tensor)]


def _cases(rank: int, workload: str, cfg: dict[str, Any], libs: list[str]) -> dict[str, Any]:
    import tdshare
    from tdshare import distributed as tdd

    def make(lib: Any) -> Any:
        return _many(lib) if workload == "many" else _big(lib, cfg["n"], cfg["nbytes"])

    # each rank builds only its side: rank 0 the sources, rank 1 the targets (memory for 4 x 256 MiB)
    src = dst = make(tdshare) if rank == 0 else make(tdshare).zero_()
    mm_src = mm_dst = make(tdshare).memmap_()
    leaves = _leaves(src)
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in leaves])

    def timed(op: Any) -> Any:
        def case() -> float:
            dist.barrier()
            start = time.perf_counter()
            op()
            return time.perf_counter() - start

        return case

    cases: dict[str, Any] = {
        # one tag per tree, as a stream of one kind of tree would have (the header then goes with the data)
        "tdshare": timed(lambda: tdd.send(src, 1, tag=1) if rank == 0 else tdd.recv(dst, 0, tag=1)),
        "tdshare broadcast": timed(lambda: tdd.broadcast(src if rank == 0 else dst, 0)),
        "tdshare memmap_": timed(lambda: tdd.send(mm_src, 1, tag=2) if rank == 0 else tdd.recv(mm_dst, 0, tag=2)),
        "per-leaf loop": timed(
            lambda: [dist.send(t, 1) for t in leaves] if rank == 0 else [dist.recv(t, 0) for t in leaves]
        ),
        "limit": timed(lambda: dist.send(flat, 1) if rank == 0 else dist.recv(flat, 0)),
    }
    if workload == "many":  # a second copy of 4 x 256 MiB per rank would crowd the machine
        whole = src.consolidate()
        cases["tdshare consolidated"] = timed(
            lambda: tdd.send(whole, 1, tag=3) if rank == 0 else tdd.recv(whole, 0, tag=3)
        )
    if "tensordict" in libs:
        import tensordict

        ref_src = ref_dst = make(tensordict) if rank == 0 else make(tensordict).zero_()
        cases["tensordict"] = timed(lambda: ref_src.send(1) if rank == 0 else ref_dst.recv(0))
        if workload == "many":
            ref_whole = ref_src.consolidate()
            cases["tensordict consolidated"] = timed(
                lambda: ref_whole.send(1, consolidated=True) if rank == 0 else ref_whole.recv(0, consolidated=True)
            )
    return cases


def _rank(rank: int, store: str, cfg: dict[str, Any], libs: list[str], out: Any) -> None:
    try:
        dist.init_process_group(
            "gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=timedelta(seconds=300)
        )
        results = {}
        for workload in ("many", "big"):
            reps = cfg["reps_many"] if workload == "many" else cfg["reps"]
            cells = run_interleaved(_cases(rank, workload, cfg, libs), reps, cfg["warmup"])[""]
            results[workload] = {name: (c.values, c.error) for name, c in cells.items()}
        out.put((rank, results))
    except BaseException:
        out.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def distributed(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """send/recv and broadcast of a 1,000-leaf tree and of a few big leaves between two gloo ranks."""
    group = "torch.distributed (2 local gloo ranks)"
    libs = [b.name for b in backends]
    # the 1,000-leaf cases take milliseconds, and a loaded machine spreads them most: more rounds
    params = {
        "n": cfg.big_leaves,
        "nbytes": cfg.big_leaf_bytes,
        "reps": cfg.reps,
        "reps_many": 3 * cfg.small_reps,
        "warmup": cfg.warmup,
    }
    log(f"  {group}: spawning 2 ranks")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    folder = tempfile.mkdtemp(dir=scratch.root)
    store = os.path.join(folder, "store")
    procs = [ctx.Process(target=_rank, args=(r, store, params, libs, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    scratch.remove(folder)
    if isinstance(got[1], str) or isinstance(got[0], str):
        raise RuntimeError(f"a benchmark rank failed:\n{got[1] if isinstance(got[1], str) else got[0]}")
    rows = []
    n, size = cfg.big_leaves, cfg.big_leaf_bytes >> 20
    labels = {"many": "1,000 leaves (800 f32 x 64, 200 i64 x 16)", "big": f"{n} x {size} MiB"}
    nbytes = {"many": 800 * 64 * 4 + 200 * 16 * 8, "big": n * cfg.big_leaf_bytes}
    for workload, cells in got[1].items():

        def cell(name: str, cells: dict[str, Any] = cells) -> Cell:
            values, error = cells.get(name, ([], "unsupported"))
            return Cell(values=list(values), error=error)

        per_leaf, mine = cell("per-leaf loop"), cell("tdshare")
        note = None
        if per_leaf.value and mine.value:
            note = (
                f"{labels[workload]}: a per-leaf torch.distributed send/recv loop takes "
                f"{per_leaf.value * 1e3:.2f} ms, {per_leaf.value / mine.value:.1f}x tdshare's send/recv"
            )
        for case, what, ref in (
            ("tdshare", "send -> recv into a preallocated td", "tensordict"),
            ("tdshare broadcast", "broadcast into a preallocated td", None),
            ("tdshare memmap_", "send -> recv, both tds memmap_()-ed (anonymous)", None),
            ("tdshare consolidated", "send -> recv, both tds consolidate()-d", "tensordict consolidated"),
        ):
            if case not in cells:
                continue
            cells_row = {"tdshare": cell(case), "limit": cell("limit")}
            if ref is not None and "tensordict" in libs:
                cells_row["tensordict"] = cell(ref)
            rows.append(
                Row(
                    group,
                    f"{labels[workload]}: {what}",
                    "time",
                    cells_row,
                    nbytes=nbytes[workload],
                    limit_name="one dist.send of one flat buffer",
                    note=note if case == "tdshare" else None,
                )
            )
    return rows
