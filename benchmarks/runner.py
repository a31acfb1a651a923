"""The command line: pick sizes and workloads, run them, print the table, save JSON."""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import sys
import time
from typing import Any

import psutil
import torch

from . import limits, report
from ._common import LIBRARIES, Config, Row, Scratch, config_for, filesystem_of, load_backends, log, settle
from .workloads import EXTRA_GROUPS, GROUPS

__all__ = ["main", "machine", "select_groups"]


def select_groups(only: list[str] | None) -> list[str]:
    """The workload groups named by ``--only`` (exact names or unique prefixes), in run order; a
    part of a group (``EXTRA_GROUPS``, e.g. ``handoff-live``) runs only when named exactly."""
    names = ["limits", *GROUPS]
    if not only:
        return names
    every = names + list(EXTRA_GROUPS)
    wanted: list[str] = []
    for item in ",".join(only).split(","):
        item = item.strip().lower()
        if not item:
            continue
        matches = [n for n in every if n == item] or [n for n in names if n.startswith(item)]
        if len(matches) != 1:
            raise SystemExit(f"--only {item!r}: choose from {', '.join(every)}")
        wanted.append(matches[0])
    return [n for n in every if n in wanted]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _quiet(scratch: Scratch) -> None:
    """Flush what earlier groups wrote and let file creation settle before the next group.

    The big-leaf groups leave gigabytes of dirty pages; while the kernel writes them back, creating
    small files on ext4 here cost 5-10x its normal time, whichever library was being measured.
    """
    os.sync()
    per_file, waited = settle(scratch, limit_s=120.0)
    if waited >= 1:
        log(f"  (waited {waited:.0f} s for file creation to settle: {per_file:.0f} µs a file)")


def machine(cfg: Config) -> dict[str, Any]:
    """What the run ran on: enough to judge whether two runs compare."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "dir": cfg.base_dir,
        "dir_filesystem": filesystem_of(cfg.base_dir),
        "shm_filesystem": filesystem_of(cfg.shm_dir) if cfg.shm_dir else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "mode": cfg.mode,
        "reps": cfg.reps,
        "small_reps": cfg.small_reps,
        "warmup": cfg.warmup,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="tdshare against tensordict 0.15.3 and against the raw limits of this machine, in one run.",
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, 3 repetitions (about a minute)")
    parser.add_argument("--json", metavar="FILE", help="also save every repetition and the medians as JSON")
    parser.add_argument(
        "--only",
        metavar="NAME",
        action="append",
        help="run only these workloads (repeat or comma-separate): "
        + ", ".join(["limits", *GROUPS])
        + f"; parts of a group: {', '.join(EXTRA_GROUPS)}",
    )
    parser.add_argument("--dir", metavar="DIR", help="where the temporary folders go (default: the temp dir, /tmp)")
    parser.add_argument("--reps", type=int, help="repetitions per measurement (default 5, quick 3)")
    parser.add_argument("--libs", default=",".join(LIBRARIES), help="libraries to run (default: %(default)s)")
    args = parser.parse_args(argv)

    groups = select_groups(args.only)
    backends, missing = load_backends(tuple(x.strip() for x in args.libs.split(",") if x.strip()))
    for name, why in missing.items():
        log(f"{name}: {why}; its column stays empty")
    if args.dir is not None:
        os.makedirs(args.dir, exist_ok=True)
    scratch = Scratch(args.dir)
    shm = Scratch("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    cfg = config_for("quick" if args.quick else "full", scratch.root, shm.root if shm else None, args.reps)
    header = machine(cfg)
    header["libraries"] = {b.name: b.version for b in backends} | {n: None for n in missing}
    log(
        f"{cfg.mode} run, {cfg.reps} reps ({cfg.small_reps} for small leaves) after {cfg.warmup} warm-up, "
        f"in {header['dir_filesystem']}; " + ", ".join(f"{b.name} {b.version}" for b in backends)
    )
    per_file, waited = settle(scratch)
    header["file_create_us_at_start"] = round(per_file, 1)
    wait_note = f" (after waiting {waited:.0f} s for the file system to settle)" if waited >= 1 else ""
    log(f"creating a file in {scratch.root} costs {per_file:.0f} µs{wait_note}")
    rows: list[Row] = []
    gc.freeze()  # the imports' objects: keep them out of every later collection (see run_interleaved)
    t0 = time.perf_counter()
    try:
        for name in groups:
            log(f"[{time.perf_counter() - t0:6.1f} s] {name}")
            if name == "limits":
                rows += limits.raw_limits(cfg, scratch, shm, spawn="handoff" not in groups)
                continue
            func, wants_shm = GROUPS[name] if name in GROUPS else EXTRA_GROUPS[name]
            _quiet(scratch)
            rows += func(cfg, backends, scratch, shm) if wants_shm else func(cfg, backends, scratch)
    except KeyboardInterrupt:
        log("interrupted: the table holds what was measured")
    finally:
        scratch.close()
        if shm is not None:
            shm.close()
    header["elapsed_s"] = round(time.perf_counter() - t0, 1)
    header["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    log(f"[{header['elapsed_s']:6.1f} s] done")

    print(
        f"{header['date']}; {header['cpus']} CPUs ({header['cpu']}), {header['memory_gib']} GiB, "
        f"folders in {header['dir_filesystem']}; torch {header['torch']}; "
        + ", ".join(f"{k} {v}" for k, v in header["libraries"].items())
        + f"; {cfg.mode}: median of {cfg.reps} ({cfg.small_reps} for small leaves) after {cfg.warmup} warm-up; "
        f"{header['elapsed_s']} s; "
        f"load average {header['load_average_start'][0]} at the start, {header['load_average_end'][0]} at the end; "
        f"creating a file cost {header['file_create_us_at_start']} µs at the start"
    )
    print()
    print(report.render(rows))
    if args.json:
        report.save_json(args.json, header, rows)
        log(f"saved {args.json}")
    sys.stdout.flush()
    return 0
