"""Trees of many small leaves in a folder: 10,000 and 100,000 leaves (1,000,000 with ``--huge``).

Past ``vm.max_map_count`` (65,530 by default) a library that maps one file per leaf fails; this
measures tdshare, tensordict 0.15.3 (its error class where it fails) and the raw per-file limit:

- ``memmap_`` of a fresh tree into a fresh folder; limit: ``mkdir`` per level and
  ``open`` + ``write`` + ``close`` per leaf file (the bytes every library must write);
- ``load_memmap`` of that folder (open only, every library loads the folder tdshare wrote: the
  format is the same); limit: reading and parsing every level's ``meta.json``;
- ``load_memmap`` + reading every leaf once; limit: ``open`` + ``read`` + ``close`` per leaf file;
- Python memory per loaded, untouched leaf (``tracemalloc`` around ``load_memmap``).

Each library runs in its own spawned process per size (so one library's mappings never count
against another's); the raw limits run in tdshare's, taking turns with it round by round ("vs
limit" is the median of the rounds' ratios).  Every time is the median of ``--reps`` repetitions
after one warm-up (one repetition, no warm-up, at 1,000,000).  Leaves are four float32 values (16 bytes), 100 levels
(1,000 at 1,000,000 leaves).

```bash
python -m benchmarks.million                 # 10,000 and 100,000 leaves on /dev/shm
python -m benchmarks.million --huge          # also 1,000,000 (about 5 minutes more)
python -m benchmarks.million --dir /tmp --reps 5
```
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
import tracemalloc
import uuid
from typing import Any

from ._common import describe_error, load_backends

__all__ = ["main", "measure"]


def shape_for(n: int) -> tuple[int, int]:
    """(levels, leaves per level) of an ``n``-leaf tree."""
    groups = 1000 if n >= 1_000_000 else 100
    return groups, n // groups


def _source(lib: Any, n: int) -> Any:
    import torch

    groups, leaves = shape_for(n)
    return lib.TensorDict(
        {f"g{i}": {f"x{j}": torch.full((4,), float(j)) for j in range(leaves)} for i in range(groups)}
    )


def _raw_write(folder: str, n: int) -> None:
    groups, leaves = shape_for(n)
    data = bytes(16)
    os.mkdir(folder)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for i in range(groups):
        level = f"{folder}/g{i}"
        os.mkdir(level)
        for j in range(leaves):
            fd = os.open(f"{level}/x{j}.memmap", flags, 0o666)
            os.write(fd, data)
            os.close(fd)


def _raw_parse(folder: str, n: int) -> None:
    groups, _ = shape_for(n)
    for level in [folder] + [f"{folder}/g{i}" for i in range(groups)]:
        with open(f"{level}/meta.json", "rb") as f:
            json.loads(f.read())


def _raw_parse_stat(folder: str, n: int) -> None:
    groups, _ = shape_for(n)
    for level in [folder] + [f"{folder}/g{i}" for i in range(groups)]:
        with open(f"{level}/meta.json", "rb") as f:
            meta = json.loads(f.read())
        for key, entry in meta.items():
            if isinstance(entry, dict) and "dtype" in entry:
                os.lstat(f"{level}/{key}.memmap")


def _raw_map(folder: str, n: int) -> None:
    import torch

    groups, leaves = shape_for(n)
    for i in range(groups):
        level = f"{folder}/g{i}"
        for j in range(leaves):
            torch.from_file(f"{level}/x{j}.memmap", True, 4, dtype=torch.float32)  # mapped, then unmapped


def _remap(td: Any, n: int) -> None:
    """Map every leaf of the loaded ``td`` and unmap it at once (what the bound's re-map costs)."""
    groups, _ = shape_for(n)
    for i in range(groups):
        for leaf in list(dict.values(td[f"g{i}"]._tensordict)):  # the handles, not mapped yet
            leaf.resolve()


def _raw_read(folder: str, n: int) -> None:
    groups, leaves = shape_for(n)
    for i in range(groups):
        level = f"{folder}/g{i}"
        for j in range(leaves):
            fd = os.open(f"{level}/x{j}.memmap", os.O_RDONLY)
            os.read(fd, 16)
            os.close(fd)


def _read_all(td: Any, n: int) -> float:
    groups, leaves = shape_for(n)
    total = 0.0
    for i in range(groups):
        sub = td[f"g{i}"]
        for j in range(leaves):
            total += float(sub[f"x{j}"][0])
    return total


def measure(name: str, n: int, reps: int, root: str, reference: str) -> dict[str, Any]:
    """Every measurement of one library at ``n`` leaves, in this process; ``reference``: a folder
    of the tree written by tdshare, which every library loads.  For tdshare the raw limits are
    measured in the same rounds (``limit_<op>``; the two take turns going first), and
    ``vs_limit_<op>`` is the median of the rounds' limit / tdshare ratios."""
    out: dict[str, Any] = {}
    lib = __import__(name)
    rounds = reps + (1 if n < 1_000_000 else 0)
    with_limit = name == "tdshare"

    def once(fn: Any, setup: Any) -> float:
        arg = setup() if setup is not None else None
        gc.collect()
        t0 = time.perf_counter()
        try:
            fn(arg)
        finally:
            elapsed = time.perf_counter() - t0
            folder = arg[1] if isinstance(arg, tuple) else arg
            del arg
            gc.collect()
            if isinstance(folder, str):  # a folder written: removed now (tmpfs has ~3M inodes)
                shutil.rmtree(folder, ignore_errors=True)
        return elapsed

    def timed(op: str, fn: Any, setup: Any = None, limit: Any = None, limit_setup: Any = None) -> None:
        times, limits = [], []
        for r in range(rounds):
            pair = [("lib", fn, setup), ("limit", limit, limit_setup)] if with_limit and limit is not None else []
            if not pair:
                pair = [("lib", fn, setup)]
            for which, f, st in pair if r % 2 == 0 else pair[::-1]:
                try:
                    elapsed = once(f, st)
                except Exception as e:  # the library's failure is the result
                    if which == "lib":
                        out[op] = describe_error(e)
                        return
                    raise
                if r >= rounds - reps:
                    (times if which == "lib" else limits).append(elapsed)
        out[op] = statistics.median(times)
        if limits:
            out[f"limit_{op}"] = statistics.median(limits)
            out[f"vs_limit_{op}"] = statistics.median(b / a for a, b in zip(times, limits, strict=True))

    def fresh() -> str:
        return os.path.join(root, f"{name}-{uuid.uuid4().hex}")

    timed(
        "memmap_",
        lambda a: a[0].memmap_(a[1]),
        lambda: (_source(lib, n), fresh()),
        lambda folder: _raw_write(folder, n),
        fresh,
    )
    timed("load", lambda _: lib.TensorDict.load_memmap(reference), None, lambda _: _raw_parse(reference, n))
    if with_limit:
        timed(
            "load_stat", lambda _: lib.TensorDict.load_memmap(reference), None, lambda _: _raw_parse_stat(reference, n)
        )
    timed(
        "read", lambda _: _read_all(lib.TensorDict.load_memmap(reference), n), None, lambda _: _raw_read(reference, n)
    )
    if with_limit:
        timed(
            "remap",
            lambda td: _remap(td, n),
            lambda: lib.TensorDict.load_memmap(reference),
            lambda _: _raw_map(reference, n),
        )
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        td = lib.TensorDict.load_memmap(reference)
        out["bytes_per_leaf"] = (tracemalloc.get_traced_memory()[0] - start) / n
        del td
    except Exception as e:
        out["bytes_per_leaf"] = describe_error(e)
    finally:
        tracemalloc.stop()
    return out


def _child(q: Any, *args: Any) -> None:
    try:
        q.put(measure(*args))
    except BaseException as e:
        q.put({"error": describe_error(e)})


def _in_child(*args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q, *args))
    p.start()
    try:
        return q.get(timeout=3600)
    finally:
        p.join(60)


def _fmt_time(seconds: float, n: int) -> str:
    each = seconds / n * 1e6
    text = f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"
    return f"{text} ({each:.3g} µs each)"


def _cell(value: Any, n: int, kind: str) -> str:
    if value is None:
        return "not run"
    if isinstance(value, str):
        return value
    return _fmt_time(value, n) if kind == "time" else f"{value:,.0f} B"


def _ratio(a: Any, b: Any) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
        r = a / b
        return f"{r:.2f}" if r < 10 else f"{r:.3g}"
    return ""


_ROWS = [  # (op, label, limit label)
    ("memmap_", "memmap_ {n:,} leaves -> fresh folder on /dev/shm", "create + write {n:,} files of 16 B"),
    ("load", "load_memmap {n:,} leaves (open only)", "read + parse every level's meta.json"),
    ("load_stat", "load_memmap {n:,} leaves (open only), against a checked load", "parse + lstat every leaf file"),
    ("read", "load_memmap {n:,} leaves + read every leaf once", "open + read {n:,} files"),
    ("remap", "map + unmap every leaf of a loaded tree (the bound's re-map)", "torch.from_file {n:,} files"),
]


def rows(results: dict[int, dict[str, dict[str, Any]]]) -> list[str]:
    """The Markdown rows: one group per size, the columns of the README's Performance table."""
    out = []
    for n, res in results.items():
        ours, ref = res.get("tdshare", {}), res.get("tensordict", {})
        out.append(f"| **{n:,} leaves in a folder** | | | | | |")
        for op, label, limit_label in _ROWS:
            a, b = ours.get(op), ref.get("load" if op == "load_stat" else op)
            if op == "remap" and b is None:
                b = "not run"
            limit, vs = ours.get(f"limit_{op}"), ours.get(f"vs_limit_{op}")
            vs_text = f"{vs:.2f}" if isinstance(vs, float) else ""
            out.append(
                f"| {label.format(n=n)} | {_cell(a, n, 'time')} | {_cell(b, n, 'time')} | {_ratio(b, a)} | "
                f"{limit_label.format(n=n)}: {_cell(limit, n, 'time')} | {vs_text} |"
            )
        a, b = ours.get("bytes_per_leaf"), ref.get("bytes_per_leaf")
        out.append(
            f"| Python memory per loaded, untouched leaf, {n:,} leaves | {_cell(a, n, 'bytes')} | "
            f"{_cell(b, n, 'bytes')} | {_ratio(b, a)} |  |  |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the workload and print the table (progress on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.million", description=__doc__.split("\n")[0])
    parser.add_argument("--huge", action="store_true", help="also 1,000,000 leaves")
    parser.add_argument("--dir", default="/dev/shm", help="where the folders are written (default /dev/shm)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions after one warm-up (default 3)")
    parser.add_argument("--sizes", default=None, help="comma-separated leaf counts (default 10000,100000)")
    parser.add_argument("--libs", default="tdshare,tensordict", help="libraries to measure")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [10_000, 100_000]
    if args.huge and 1_000_000 not in sizes:
        sizes.append(1_000_000)
    backends, missing = load_backends(tuple(args.libs.split(",")))
    for lib, why in missing.items():
        print(f"{lib}: {why}", file=sys.stderr)
    root = os.path.join(args.dir, f"tdshare-bench-million-{uuid.uuid4().hex}")
    os.makedirs(root)
    results: dict[int, dict[str, dict[str, Any]]] = {}
    try:
        import tdshare

        for n in sizes:
            reference = os.path.join(root, f"reference-{n}")
            _source(tdshare, n).memmap_(reference)
            reps = 1 if n >= 1_000_000 else args.reps
            results[n] = {}
            for name in [b.name for b in backends]:
                print(f"[million] {n:,} leaves: {name}", file=sys.stderr, flush=True)
                results[n][name] = _in_child(name, n, reps, root, reference)
                print(f"[million]   {results[n][name]}", file=sys.stderr, flush=True)
            shutil.rmtree(reference, ignore_errors=True)
            for entry in os.listdir(root):
                shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| workload | tdshare | tensordict | ratio (tensordict / tdshare) | raw limit | tdshare vs limit |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
