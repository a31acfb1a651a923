"""Raw limits: what the machine does with the same bytes, files and processes, without any
tensordict.  Each ``*_case`` returns a case for :func:`benchmarks._common.run_interleaved`, so a
workload can measure its limit interleaved with the libraries; :func:`raw_limits` measures the
standalone ones (copy bandwidth, file write and read on both file systems, file creation, spawn).
"""

from __future__ import annotations

import fcntl
import json
import mmap
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from . import _workers
from ._common import Config, Row, Scratch, log, run_interleaved

__all__ = [
    "create_files_case",
    "create_indexed_files_case",
    "map_files_case",
    "map_sum_case",
    "memcpy_case",
    "raw_limits",
    "segment_case",
    "spawn_case",
    "stat_parse_map_case",
    "write_files",
    "write_files_case",
]

_WRITE_MAX = 1 << 30  # one write() moves at most ~2 GiB on Linux; stay well below


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    return memoryview(t.contiguous().view(torch.uint8).reshape(-1).numpy()).cast("B")


def _write_all(fd: int, buf: memoryview) -> None:
    done = 0
    while done < len(buf):
        done += os.write(fd, buf[done : done + _WRITE_MAX])


def write_files(folder: str, tensors: Sequence[torch.Tensor], threads: int = 1) -> None:
    """Create ``folder`` and write each tensor to its own file with ``write()`` (no fsync)."""
    os.makedirs(folder)

    def one(i: int) -> None:
        fd = os.open(os.path.join(folder, f"{i}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, tensor_bytes(tensors[i]))
        finally:
            os.close(fd)

    if threads <= 1:
        for i in range(len(tensors)):
            one(i)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(len(tensors))))


def write_files_case(scratch: Scratch, tensors: Sequence[torch.Tensor], threads: int = 1) -> Callable[[], float]:
    """Write the tensors to a fresh folder: the floor for ``memmap_`` of big leaves."""

    def case() -> float:
        folder = scratch.fresh("raw-write")
        t0 = time.perf_counter()
        write_files(folder, tensors, threads)
        dt = time.perf_counter() - t0
        scratch.remove(folder)
        return dt

    return case


def read_files_case(folder: str, sizes: Sequence[int]) -> Callable[[], float]:
    """``readinto`` every file of ``folder`` into one preallocated buffer (page cache warm)."""
    buf = bytearray(max(sizes))
    view = memoryview(buf)

    def case() -> float:
        t0 = time.perf_counter()
        for i, size in enumerate(sizes):
            with open(os.path.join(folder, f"{i}.bin"), "rb", buffering=0) as f:
                got = 0
                while got < size:
                    n = f.readinto(view[got:size])
                    if not n:
                        break
                    got += n
        return time.perf_counter() - t0

    return case


def map_sum_case(folder: str, numels: Sequence[int]) -> Callable[[], float]:
    """Map every float32 file of ``folder`` and sum it: the floor for load + read."""

    def case() -> float:
        t0 = time.perf_counter()
        total = 0.0
        for i, n in enumerate(numels):
            total += float(torch.from_file(os.path.join(folder, f"{i}.bin"), shared=False, size=n).sum())
        return time.perf_counter() - t0

    return case


def memcpy_case(nbytes: int, threads: int) -> Callable[[], float]:
    """Copy ``nbytes`` into a preallocated (already touched) buffer with ``threads`` threads."""
    src = torch.ones(nbytes // 4)
    dst = torch.zeros(nbytes // 4)
    src_parts, dst_parts = src.chunk(threads), dst.chunk(threads)

    def case() -> float:
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            t0 = time.perf_counter()
            if threads == 1:
                dst.copy_(src)
            else:
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda p: p[0].copy_(p[1]), zip(dst_parts, src_parts, strict=True)))
            return time.perf_counter() - t0
        finally:
            torch.set_num_threads(old)

    return case


def make_small_files(folder: str, count: int, subfolders: int, payload: bytes) -> list[str]:
    """Create ``count`` files holding ``payload`` in ``subfolders`` folders; returns their paths."""
    paths = []
    os.makedirs(folder)
    per = max(1, -(-count // subfolders))
    for s in range(min(subfolders, count)):
        sub = os.path.join(folder, f"s{s}")
        os.mkdir(sub)
        for j in range(min(per, count - s * per)):
            path = os.path.join(sub, f"{j}.bin")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            if payload:
                os.write(fd, payload)
            os.close(fd)
            paths.append(path)
    return paths


def create_files_case(scratch: Scratch, count: int, subfolders: int, payload: bytes = b"") -> Callable[[], float]:
    """Create ``count`` files (empty, or holding ``payload``) in a fresh folder."""

    def case() -> float:
        folder = scratch.fresh("raw-create")
        t0 = time.perf_counter()
        make_small_files(folder, count, subfolders, payload)
        dt = time.perf_counter() - t0
        scratch.remove(folder)
        return dt

    return case


def create_indexed_files_case(scratch: Scratch, payload: bytes, lines: Sequence[bytes]) -> Callable[[], float]:
    """Per entry: create one file holding ``payload`` and append one line (``lines[i]``, as long as
    tdshare's record line for that entry) to an index file held open with ``O_APPEND``, with one
    ``write`` each: the raw limit of adding an entry to a level (issue 17).  No mapping, no lock."""

    def case() -> float:
        folder = scratch.fresh("raw-create-index")
        os.makedirs(folder)
        index = os.open(os.path.join(folder, "index"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            t0 = time.perf_counter()
            for i, line in enumerate(lines):
                fd = os.open(os.path.join(folder, f"{i}.bin"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                if payload:
                    os.write(fd, payload)
                os.close(fd)
                os.write(index, line)
            dt = time.perf_counter() - t0
        finally:
            os.close(index)
        scratch.remove(folder)
        return dt

    return case


def create_mapped_indexed_files_case(scratch: Scratch, payload: bytes, lines: Sequence[bytes]) -> Callable[[], float]:
    """What an addition that hands back a mapping and commits under a lock cannot go below: per
    entry, ``flock`` a lock file kept open, create the file relative to a folder kept open, write
    ``payload``, map it (Python's ``mmap``: ``fstat``, ``dup``, ``mmap``), close, append the line,
    unlock.  :func:`create_indexed_files_case` without the lock and the mapping, which
    ``make_memmap*`` need: it returns a mapped tensor, and other processes must never see a
    half-made entry (issue 17 asks for both)."""

    def case() -> float:
        folder = scratch.fresh("raw-create-map-index")
        os.makedirs(folder)
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        index = os.open("index", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644, dir_fd=dfd)
        lock = os.open("lock", os.O_RDWR | os.O_CREAT, 0o644, dir_fd=dfd)
        maps: list[mmap.mmap] = []
        try:
            t0 = time.perf_counter()
            for i, line in enumerate(lines):
                fcntl.flock(lock, fcntl.LOCK_EX)
                fd = os.open(f"{i}.bin", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
                os.write(fd, payload)
                maps.append(mmap.mmap(fd, len(payload)))
                os.close(fd)
                os.write(index, line)
                fcntl.flock(lock, fcntl.LOCK_UN)
            dt = time.perf_counter() - t0
        finally:
            for m in maps:
                m.close()
            for fd in (index, lock, dfd):
                os.close(fd)
        scratch.remove(folder)
        return dt

    return case


def map_files_case(paths: Sequence[str], numel: int) -> Callable[[], float]:
    """Map each of ``paths`` as a float32 tensor: the floor of loading one file per leaf."""

    def case() -> float:
        t0 = time.perf_counter()
        maps = [torch.from_file(p, shared=True, size=numel) for p in paths]
        dt = time.perf_counter() - t0
        del maps
        return dt

    return case


def segment_case(leaves: Sequence[torch.Tensor]) -> Callable[[], float]:
    """Copy small leaves into views of one anonymous ``memfd`` segment: the floor of memmap_()."""

    def case() -> float:
        t0 = time.perf_counter()
        total = sum(t.numel() for t in leaves)
        fd = os.memfd_create("bench")
        try:
            os.ftruncate(fd, max(4, total * 4))
            seg = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=max(1, total))
        finally:
            os.close(fd)
        views, off = [], 0
        for t in leaves:
            n = t.numel()
            v = seg[off : off + n].view(t.shape)
            v.copy_(t)
            views.append(v)
            off += n
        dt = time.perf_counter() - t0
        del views, seg
        return dt

    return case


def stat_parse_map_case(meta_path: str, leaf_path: str, numel: int) -> Callable[[], float]:
    """``stat`` + parse a metadata JSON + map one file: the floor of a one-entry refresh."""

    def case() -> float:
        t0 = time.perf_counter()
        os.stat(meta_path)
        with open(meta_path, "rb") as f:
            json.loads(f.read())
        t = torch.from_file(leaf_path, shared=True, size=numel)
        dt = time.perf_counter() - t0
        del t
        return dt

    return case


def stat_case(path: str, repeat: int = 1000) -> Callable[[], float]:
    """One ``os.stat`` (the mean of ``repeat``): the floor of a refresh that finds nothing changed."""

    def case() -> float:
        t0 = time.perf_counter()
        for _ in range(repeat):
            os.stat(path)
        return (time.perf_counter() - t0) / repeat

    return case


def spawn_case() -> Callable[[], float]:
    """Spawn a process that imports torch and answers; time until the answer arrives."""
    ctx = mp.get_context("spawn")

    def case() -> float:
        parent, child = ctx.Pipe(duplex=False)
        t0 = time.perf_counter()
        proc = ctx.Process(target=_workers.noop, args=(child,))
        proc.start()
        child.close()
        parent.recv()
        dt = time.perf_counter() - t0
        proc.join(60)
        parent.close()
        return dt

    return case


def raw_limits(cfg: Config, scratch: Scratch, shm: Scratch | None, spawn: bool = True) -> list[Row]:
    """The standalone limits: copy bandwidth, write/read on both file systems, creation, and
    (with ``spawn``; the hand-off workload measures it too) the empty spawn round trip."""
    rows: list[Row] = []
    nbytes = cfg.big_bytes
    tensors = [torch.full((cfg.big_leaf_bytes // 4,), 1.5) for _ in range(cfg.big_leaves)]
    numels = [t.numel() for t in tensors]
    sizes = [cfg.big_leaf_bytes] * cfg.big_leaves

    log("  copy bandwidth")
    cases = {"1 thread": memcpy_case(nbytes, 1), "2 threads": memcpy_case(nbytes, 2)}
    res = run_interleaved(cases, cfg.reps, cfg.warmup)
    for case, cell in res[""].items():
        name = f"memory copy {nbytes >> 20} MiB, {case}"
        rows.append(Row("limits", name, "time", {"limit": cell}, nbytes=nbytes))

    stores = [("tmp", scratch)] + ([("/dev/shm", shm)] if shm is not None else [])
    for label, store in stores:
        log(f"  file write/read on {label}")
        folder = store.fresh("raw-read")
        write_files(folder, tensors)
        where = "--dir" if label == "tmp" else label
        # Writes and reads apart: the writes' page-cache work would slow the reads down.
        for cases in (
            {
                "write() 1 thread": write_files_case(store, tensors, 1),
                "write() 2 threads": write_files_case(store, tensors, 2),
            },
            {
                "read() (page cache warm)": read_files_case(folder, sizes),
                "map + sum (page cache warm)": map_sum_case(folder, numels),
            },
        ):
            res = run_interleaved(cases, cfg.reps, cfg.warmup)
            for case, cell in res[""].items():
                name = f"{case} {cfg.big_leaves} files, {where}"
                rows.append(Row("limits", name, "time", {"limit": cell}, nbytes=nbytes))
        store.remove(folder)
    del tensors

    for count in cfg.small_counts:
        log(f"  create {count} empty files")
        cases = {label: create_files_case(store, count, cfg.small_subtds) for label, store in stores}
        res = run_interleaved(cases, cfg.reps, cfg.warmup)
        for label, cell in res[""].items():
            where = "--dir" if label == "tmp" else label
            name = f"create {count:,} empty files ({cfg.small_subtds} folders), {where}"
            rows.append(Row("limits", name, "time", {"limit": cell}, per=count))

    if not spawn:
        return rows
    log("  empty spawn round trip")
    res = run_interleaved({"spawn": spawn_case()}, cfg.reps, cfg.warmup)
    name = "spawn a process that imports torch, until it answers"
    rows.append(Row("limits", name, "time", {"limit": res[""]["spawn"]}))
    return rows
