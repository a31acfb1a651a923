"""Targets of spawned processes.

This module imports torch and nothing from either library: a child that receives a tensordict
imports its library while unpickling it, so that cost counts for the library that needs it, and
the empty-spawn limit (:func:`noop`) pays exactly the rest.
"""

from __future__ import annotations

import os
import resource
import time
from multiprocessing.connection import Connection
from typing import Any

import psutil
import torch

__all__ = [
    "MappedColumns",
    "identity",
    "loader_worker",
    "map_add_one",
    "noop",
    "pipe_waiter",
    "plain_add_one",
    "read_one",
    "registry_waiter",
]


def noop(conn: Connection) -> None:
    """The empty spawn round trip: the child has imported torch; say so."""
    conn.send(0.0)
    conn.close()


def first_leaf_value(td: Any) -> float:
    """Read one element of the first leaf (depth first), so the leaf is really mapped."""
    node = td
    while True:
        key = next(iter(node.keys()))
        node = node[key]
        if isinstance(node, torch.Tensor):
            return float(node.reshape(-1)[0].item())


def read_one(td: Any, conn: Connection) -> None:
    """Hand-off: the tensordict arrived (unpickled) with the spawn; read one value, reply."""
    conn.send(first_leaf_value(td))
    conn.close()


def live_reader(inbox: Any, conn: Connection) -> None:
    """Hand-off to a live worker: each tensordict that arrives on ``inbox`` (None: stop) has one
    value read, then the worker replies (its first message says it is ready).  After each reply it
    drops what it received and says ``"idle"``: the sender waits for that (untimed), so that no
    hand-off is measured while the worker still unmaps the one before (1,000 mapped files of the
    case before took ~2 ms, which fell on whichever case came next)."""
    conn.send("ready")
    while (td := inbox.get()) is not None:
        conn.send(0.0 if isinstance(td, bytes) else first_leaf_value(td))
        del td
        conn.send("idle")
    conn.close()


def peak_rss_mib() -> float:
    """This process's peak RSS in MiB: ``VmHWM``, which starts afresh at ``exec``.

    (``getrusage``'s ``ru_maxrss`` would not: Linux keeps the parent's peak across fork + exec.)
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _memory() -> tuple[float, float]:
    """(peak RSS, current PSS) of this process in MiB."""
    peak_rss = peak_rss_mib()
    try:
        pss = float(psutil.Process(os.getpid()).memory_full_info().pss) / (1 << 20)
    except (psutil.Error, AttributeError):
        pss = float("nan")
    return peak_rss, pss


def _raw_tensors(spec: list[tuple[str, str, tuple[int, ...], str]]) -> dict[str, torch.Tensor]:
    """Map raw files (name, path, shape, dtype name) as plain tensors: the DataLoader limit."""
    out = {}
    for name, path, shape, dtype_name in spec:
        dtype = getattr(torch, dtype_name)
        n = 1
        for s in shape:
            n *= s
        out[name] = torch.from_file(path, shared=True, size=n, dtype=dtype).view(shape)
    return out


class MappedColumns:
    """The DataLoader limit: plain mapped tensors in a map-style Dataset with ``__getitems__``.

    It pickles as its file spec (a few bytes) and maps the files in each worker on first use,
    so a batch costs exactly one gather per column, and collate is :func:`identity`.
    """

    def __init__(self, spec: list[tuple[str, str, tuple[int, ...], str]]) -> None:
        self.spec = spec
        self.rows = spec[0][2][0]
        self._columns: dict[str, torch.Tensor] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "rows": self.rows, "_columns": None}

    def __len__(self) -> int:
        return self.rows

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        if self._columns is None:
            self._columns = _raw_tensors(self.spec)
        idx = torch.as_tensor(indices)
        return {k: v[idx] for k, v in self._columns.items()}


def identity(batch: Any) -> Any:
    """A collate_fn that passes the fetched batch on (a dict of gathered columns)."""
    return batch


def loader_worker(payload: Any, raw: bool, batch: int, seed: int, conn: Connection) -> None:
    """A DataLoader-like worker: on each ``("run", n)``, gather ``n`` batches of random rows.

    ``payload`` is a memory-mapped tensordict (unpickled with the spawn) or, with ``raw``, a
    file spec for plain mapped tensors.  Replies with the loop's wall time; ``("stats",)``
    replies with (peak RSS, PSS) in MiB; ``("exit",)`` ends the worker.
    """
    torch.set_num_threads(1)  # as torch.utils.data workers do
    gen = torch.Generator().manual_seed(seed)
    data = _raw_tensors(payload) if raw else payload
    rows = next(iter(data.values())).shape[0] if raw else int(data.batch_size[0])

    def sample(count: int) -> None:
        for _ in range(count):
            idx = torch.randint(rows, (batch,), generator=gen)
            if raw:
                out = {k: v[idx] for k, v in data.items()}
            else:
                out = data[idx]
            del out

    sample(20)  # warm the code paths before the first timed run
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "run":
            t0 = time.perf_counter()
            sample(int(msg[1]))
            conn.send(time.perf_counter() - t0)
        elif msg[0] == "stats":
            conn.send(_memory())
        else:
            break
    conn.close()


def registry_waiter(module: Any, folder: str, rounds: int, conn: Connection) -> None:
    """Wake-up latency: wait for each commit to the tree at ``folder``, reply with the wake time."""
    registry = module.SharedRegistry.for_path(folder)
    seen = registry.generation
    conn.send(seen)
    for _ in range(rounds):
        seen = registry.wait_for_change(seen, timeout=30.0)
        conn.send(time.perf_counter())
    conn.close()


def pipe_waiter(wake: int, rounds: int, conn: Connection) -> None:
    """The raw limit: block in read() on a pipe, reply with the wake time."""
    conn.send(0)
    for _ in range(rounds):
        os.read(wake, 1)
        conn.send(time.perf_counter())
    conn.close()


def _plus_one(t: torch.Tensor) -> torch.Tensor:
    return t + 1


def map_add_one(chunk: Any) -> Any:
    """The ``map`` workload's function, for either library: one more in every leaf of the chunk."""
    return chunk.apply(_plus_one)


def plain_add_one(spec: list[tuple[str, tuple[int, ...], str]], start: int, end: int) -> list[torch.Tensor]:
    """The ``map`` limit: rows ``start:end`` of the raw files (path, shape, dtype name), plus one."""
    out = []
    for path, shape, dtype_name in spec:
        n = 1
        for s in shape:
            n *= s
        column = torch.from_file(path, shared=True, size=n, dtype=getattr(torch, dtype_name)).view(shape)
        out.append(column[start:end] + 1)
    return out
