"""Helpers shared by test modules (imported as ``_helpers``: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

#: dtypes that both tdshare and tensordict 0.15.3 save and load
COMMON_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]
#: float8 kinds this torch has (tdshare reads them back; the reference cannot load them)
FLOAT8_DTYPES = [
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)
]

IS_ROOT = os.geteuid() == 0
NOBODY = 65534


def as_other_user(check: Callable[[], str]) -> str:
    """Run ``check`` as the unprivileged user ``nobody`` when we are root (root may write any file).

    The check runs in a forked child (the interpreter lives under /root, which ``nobody`` cannot
    enter, so a fresh process could not start); its result or error comes back through a pipe.
    """
    if not IS_ROOT:
        return check()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            reply = "ok:" + check()
        except BaseException as err:
            reply = f"error:{type(err).__name__}: {err}"
        try:
            os.write(w, reply.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        reply = f.read().decode()
    os.waitpid(pid, 0)
    assert reply.startswith("ok:"), reply
    return reply[3:]


class Point:
    """A picklable value that JSON cannot hold (defined in an importable module, so any process unpickles it)."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.x == self.x

    def __hash__(self) -> int:
        return hash(self.x)

    def __repr__(self) -> str:
        return f"Point({self.x})"


def plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor (comparisons without the MemoryMappedTensor subclass)."""
    return torch.Tensor.as_subclass(t, torch.Tensor)


def assert_same_tensordict(a: Any, b: Any, *, ordered: bool = True, bitwise: bool = False) -> None:
    """Equal batch sizes, keys (in order unless ``ordered=False``), dtypes and values (non-tensor values by ==).

    ``bitwise``: tensors hold the same bytes (NaN equals NaN; the dtypes torch.equal cannot compare work).
    """
    assert a.batch_size == b.batch_size
    if ordered:
        assert list(a.keys(True, True)) == list(b.keys(True, True))
    else:
        assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key, value in a.items(True, True):
        other = b.get(key)
        if isinstance(value, torch.Tensor):
            assert value.dtype == other.dtype and value.shape == other.shape, key
            if bitwise:
                mine, theirs = plain(value).contiguous(), plain(other).contiguous()
                assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8)), key
            else:
                assert torch.equal(plain(value), plain(other)), key
        else:
            assert value == other, key


class Gather:
    """A DataLoader collate function that indexes a tensordict (pickled to spawned workers)."""

    def __init__(self, td: Any) -> None:
        self.td = td

    def __call__(self, idx: list[int]) -> Any:
        return self.td[torch.tensor(idx)]


def proc_fd_passing() -> bool:
    """Whether a memfd's descriptor can be handed through ``/proc/<pid>/fd`` here (a real probe:
    hand one over and open it back); where not, the hand-off uses multiprocessing's sharer."""
    from tdshare._fd_pass import receive_fd, send_fd

    fd = os.memfd_create("probe")
    try:
        code = send_fd(fd)
        if code is None:
            return False
        os.close(receive_fd(code))
        return True
    finally:
        os.close(fd)


def add_record(level: Any, entries: dict[str, dict]) -> None:
    """Append ``entries`` to the record (``meta.jsonl``) of the saved level in folder ``level``, as
    tdshare's writer does: the level's ``meta.json`` gets the record field before the first line."""
    import json
    from pathlib import Path

    folder = Path(level)
    meta = json.loads((folder / "meta.json").read_text())
    if meta.get("_tdshare_journal") is not True:
        meta["_tdshare_journal"] = True
        (folder / "meta.json").write_text(json.dumps(meta))
    with open(folder / "meta.jsonl", "a") as f:
        for key, entry in entries.items():
            f.write(json.dumps({key: entry}) + "\n")


def memfd_counts() -> tuple[int, int]:
    """(descriptors, mappings) of this process's anonymous segments (memfds named ``tdshare*``)."""
    fds = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:tdshare")
        except OSError:
            continue
    with open("/proc/self/maps") as f:
        maps = sum("/memfd:tdshare" in line for line in f)
    return fds, maps


def counts_under(root: str) -> tuple[int, int]:
    """(descriptors, mappings) of this process on files under the folder ``root``."""
    root = os.path.realpath(root) + os.sep
    fds = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fds += os.readlink(f"/proc/self/fd/{name}").startswith(root)
        except OSError:
            continue
    with open("/proc/self/maps") as f:
        maps = sum(line.rstrip("\n").split(maxsplit=5)[-1].startswith(root) for line in f if "/" in line)
    return fds, maps
