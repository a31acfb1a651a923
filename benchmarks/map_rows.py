"""The ``map`` workload: a cheap function over the rows of a memory-mapped tensordict, 2 workers.

Each variant gets its own pool of spawned workers, started once outside the timed region (the
pool's start-up is the same empty spawn for everyone and would hide the libraries' own costs):

- tdshare and tensordict: ``td.map(map_add_one, pool=pool)`` over a memory-mapped tensordict of
  ``cfg.loader_rows`` rows (1,000,000 in a full run): one chunk per worker, each worker adds one
  to every leaf of its chunk and returns the result, which the caller joins with ``torch.cat``;
- the limit: the same pool machinery with no tensordict: ``pool.map`` of the same function over
  the row ranges of the same columns written as plain files, each worker mapping them with
  ``torch.from_file``, the caller joining the returned tensors column by column.

A second row runs the whole call, pool included (``num_workers=2``, forked workers; the limit
forks its own ``multiprocessing.Pool(2)``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import torch

from . import _workers, limits
from ._common import LIMIT, Backend, Cell, Config, Row, Scratch, log, run_interleaved

__all__ = ["map_rows"]


def _columns(rows: int) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.randn(rows, 8),
        "reward": torch.randn(rows),
        "action": torch.randint(0, 10, (rows,)),
    }


def map_rows(cfg: Config, backends: list[Backend], scratch: Scratch) -> list[Row]:
    """``map`` with a given pool, and with the pool made by the call, against a plain pool."""
    group = "map"
    rows, workers = cfg.loader_rows, 2
    columns = _columns(rows)
    folders: list[str] = []
    tds: dict[str, Any] = {}
    errors: dict[str, str] = {}
    log(f"  {group}: writing {rows:,} rows")
    for b in backends:
        folder = scratch.fresh(b.name)
        folders.append(folder)
        try:
            tds[b.name] = b.TensorDict(dict(columns), batch_size=[rows]).memmap_(folder)
        except Exception as e:
            errors[b.name] = type(e).__name__
    raw = scratch.fresh("raw")
    folders.append(raw)
    limits.write_files(raw, list(columns.values()))
    spec = [
        (os.path.join(raw, f"{i}.bin"), tuple(t.shape), str(t.dtype).split(".")[1])
        for i, t in enumerate(columns.values())
    ]
    bounds = [(start, min(start + -(rows // -workers), rows)) for start in range(0, rows, -(rows // -workers))]
    del columns

    ctx = mp.get_context("spawn")
    log(f"  {group}: spawning {workers} workers per variant")
    pools = {name: ctx.Pool(workers, torch.set_num_threads, (1,)) for name in [LIMIT, *tds]}
    generator = torch.Generator  # fresh, unseeded-alike generators: no seed warning, same work

    def given(name: str) -> Any:
        def case() -> float:
            t0 = time.perf_counter()
            if name == LIMIT:
                parts = pools[name].starmap(_workers.plain_add_one, [(spec, a, z) for a, z in bounds])
                out = [torch.cat([p[i] for p in parts]) for i in range(len(spec))]
            else:
                out = tds[name].map(_workers.map_add_one, pool=pools[name])
            elapsed = time.perf_counter() - t0
            _check(out, name)
            return elapsed

        return case

    def own(name: str) -> Any:
        def case() -> float:
            t0 = time.perf_counter()
            if name == LIMIT:
                with mp.get_context("fork").Pool(workers, torch.set_num_threads, (1,)) as pool:
                    parts = pool.starmap(_workers.plain_add_one, [(spec, a, z) for a, z in bounds])
                out = [torch.cat([p[i] for p in parts]) for i in range(len(spec))]
            else:
                out = tds[name].map(
                    _workers.map_add_one, num_workers=workers, generator=generator(), mp_start_method="fork"
                )
            elapsed = time.perf_counter() - t0
            _check(out, name)
            return elapsed

        return case

    try:
        order = [LIMIT, *tds]
        res_given = run_interleaved({n: given(n) for n in order}, cfg.reps, cfg.warmup)
        res_own = run_interleaved({n: own(n) for n in order}, cfg.reps, cfg.warmup)
    finally:
        for pool in pools.values():
            pool.terminate()
            pool.join()
        tds.clear()
        for folder in folders:
            scratch.remove(folder)

    def cells(res: dict[str, dict[str, Cell]]) -> dict[str, Cell]:
        out = dict(res.get("", {}))
        for name, why in errors.items():
            out[name] = Cell(error=why)
        return out

    label = f"map of x + 1 over {rows:,} rows (3 leaves), {workers} workers"
    return [
        Row(group, f"{label}, given a spawned pool", "time", cells(res_given), limit_name="plain Pool.starmap"),
        Row(group, f"{label}, the call's own forked pool", "time", cells(res_own), limit_name="plain Pool.starmap"),
    ]


def _check(out: Any, name: str) -> None:
    """The result is right (outside the timed region): one more than the input's first row."""
    first = out[0][0] if name == LIMIT else out["obs"][0]
    if first.shape != (8,):
        raise AssertionError(f"{name}: wrong result shape {tuple(first.shape)}")
