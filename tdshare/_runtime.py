"""The runtime store of an anonymous tensordict: how entries added later reach other processes.

A tensordict memory-mapped without a folder (``memmap_()`` with no prefix) has no files, so its
registry lives in a private per-user runtime folder (``$XDG_RUNTIME_DIR/tdshare-<uid>``, else
``/dev/shm/tdshare-<uid>``, mode 0700).  Each anonymous tree gets a store path there when it is
memory-mapped; the store is only created when a process first adds an entry with ``make_memmap*``:

``<store>/users/<pid>-<start time>``
    One empty file per process that published or mapped an entry through the store.
``<store>/manifest.json``
    The added entries: nested key, dtype, shape, and where the data is (the creator's pid and
    descriptor of a ``memfd`` segment).  Replaced whole, under the store's lock, then the
    generation is bumped (the same :class:`SharedRegistry` as for folders).

Another process maps an entry by opening ``/proc/<pid>/fd/<fd>``: the adding process must still
be alive when the others first refresh (afterwards the memory lives as long as anyone maps it).
A store is removed, with its control files, by its last user's clean exit, or (after a crash)
by the next store created and by ``python -m tdshare gc`` once all its recorded users have
exited.  The memory itself is never in the store: the kernel frees it with the last process that
maps it.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.util
import os
import secrets
import shutil
import time
from typing import Any

from ._control_files import remove_control_files, runtime_root
from ._errors import CorruptDataError
from ._files import replace_file

__all__ = [
    "runtime_root",
    "new_store_path",
    "ensure_store",
    "register_user",
    "read_manifest",
    "write_manifest",
    "reap",
]

_USERS = "users"


def _psutil() -> Any:
    """psutil, imported when first needed: it costs a third of tdshare's import time (a spawned
    worker pays it before it reads anything), and only anonymous stores use it."""
    import psutil

    return psutil


_MANIFEST = "manifest.json"


def new_store_path() -> str:
    """A fresh store path (nothing is created until an entry is added)."""
    return os.path.join(runtime_root(), secrets.token_hex(8))


def ensure_store(path: str) -> None:
    """Create the store folder (reaping stores nobody uses first) and record this process in it."""
    if not os.path.isdir(path):
        reap(os.path.dirname(path))
        os.makedirs(os.path.join(path, _USERS), mode=0o700, exist_ok=True)
    register_user(path)


_registered: set[tuple[str, int]] = set()


def register_user(path: str) -> None:
    """Record this process as a user of the store (once per process): a store is reaped only
    when every process that published or mapped through it has exited."""
    if (path, os.getpid()) in _registered:
        return
    me = _psutil().Process()
    users = os.path.join(path, _USERS)
    os.makedirs(users, mode=0o700, exist_ok=True)
    with open(os.path.join(users, f"{me.pid}-{me.create_time():.3f}"), "wb"):
        pass
    if not any(pid == os.getpid() for _, pid in _registered):
        atexit.register(_cleanup_at_exit)
        # a multiprocessing child leaves through os._exit, skipping atexit: its finalizers run
        multiprocessing.util.Finalize(None, _cleanup_at_exit, exitpriority=0)
    _registered.add((path, os.getpid()))


def _cleanup_at_exit() -> None:
    """On a clean exit, remove the stores of this process that no other live process uses."""
    for path, pid in list(_registered):
        if pid != os.getpid():
            continue
        me = _psutil().Process()
        try:
            os.unlink(os.path.join(path, _USERS, f"{me.pid}-{me.create_time():.3f}"))
        except OSError:
            pass
        if not _in_use(path) or not os.listdir(os.path.join(path, _USERS)):
            _remove_store(path)


def read_manifest(path: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(path, _MANIFEST), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    try:
        entries = json.loads(raw)["entries"]
    except (ValueError, KeyError, TypeError):
        raise CorruptDataError(f"{os.path.join(path, _MANIFEST)} is not a valid tdshare manifest.") from None
    if not isinstance(entries, list):
        raise CorruptDataError(f"{os.path.join(path, _MANIFEST)} is not a valid tdshare manifest.")
    return entries


def write_manifest(path: str, entries: list[dict[str, Any]]) -> None:
    replace_file(os.path.join(path, _MANIFEST), json.dumps({"entries": entries}).encode())


def _in_use(store: str) -> bool:
    users = os.path.join(store, _USERS)
    try:
        names = os.listdir(users)
    except FileNotFoundError:
        names = []
    if not names:  # being created right now (folder made, first user not yet recorded)?
        try:
            return os.stat(store).st_mtime > time.time() - 60
        except OSError:
            return False
    ps = _psutil()
    for name in names:
        pid, _, created = name.partition("-")
        try:
            if abs(ps.Process(int(pid)).create_time() - float(created)) < 1.0:
                return True
        except (ValueError, ps.Error):
            continue
    return False


def reap(root: str | None = None) -> list[str]:
    """Remove the stores (and their control files) whose owner process is dead; return them."""
    root = root or runtime_root()
    removed = []
    for name in os.listdir(root):
        store = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(store) or _in_use(store):
            continue
        _remove_store(store)
        removed.append(store)
    return removed


def _remove_store(store: str) -> None:
    shutil.rmtree(store, ignore_errors=True)
    remove_control_files(store)
