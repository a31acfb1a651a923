"""What a killed writer leaves behind, and how it is found and removed.

A writer killed part way (SIGKILL, OOM, power to the process cut) can leave:

* a staging folder ``.tdtmp-<pid>-*`` of an atomic write, beside the target;
* temporary files ``.<name>.tdshare-<pid>-<hex>.tmp`` (a leaf, a ``meta.json`` or a ``.tdz``
  archive being written), in a level of the tree or beside the archive;
* leaf data files (``*.memmap``) that no ``meta.json`` (or its ``meta.jsonl`` record) names (a
  ``make_memmap`` killed between its file and its metadata).

Every name carries the writer's pid, so debris is removed only when that process is gone: a live
writer's files are never touched (a pid reused by another live process keeps its debris until
that process ends too: the safe side).  An unreferenced ``*.memmap`` file carries no pid; it is
removed only by a caller that holds the tree's lock, under which every writer that creates such
files (``make_memmap*``) works, so its writer is dead.  A staging folder whose writer died between
moving the old tree out and the new one in is moved back into place, not deleted.
"""

from __future__ import annotations

import os
import re
import shutil

from ._atomic import STAGING_PREFIX, TARGET_NOTE
from ._files import TMP_MARK
from ._format import JOURNAL_FILE, LEAF_SUFFIX, META_FILE, loads_json
from ._journal import merge_entries, parse_entries, read_journal
from ._keys import encode_key

__all__ = ["pid_alive", "sweep_staging", "sweep_tree", "sweep_archive", "Swept"]

_STAGING = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)-")
_TMP = re.compile(r"^\..*" + re.escape(TMP_MARK) + r"(\d+)-[0-9a-f]+\.tmp$")


class Swept(list[str]):
    """The paths a sweep removed (or restored), with the bytes it freed."""

    freed: int = 0


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts as alive).

    >>> pid_alive(os.getpid())
    True
    """
    if pid <= 0:
        return True  # never guess about the kernel's or a malformed pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _size(path: str) -> int:
    total = 0
    if os.path.isdir(path) and not os.path.islink(path):
        for root, _, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        return total
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _remove(path: str, out: Swept) -> None:
    size = _size(path)
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return
    out.append(path)
    out.freed += size


def _restore(work: str, out: Swept) -> None:
    """Put back the tree of a staging folder whose writer died between its two renames."""
    try:
        with open(os.path.join(work, TARGET_NOTE), encoding="utf-8", errors="surrogateescape") as f:
            name = f.read()
    except OSError:
        return
    if not name or os.sep in name or name in (".", ".."):
        return
    target = os.path.join(os.path.dirname(work), name)
    old, new = os.path.join(work, "old"), os.path.join(work, "new")
    if os.path.lexists(target) or not os.path.isdir(old):
        return
    # the old tree was moved out only once the new one was complete: finish the swap
    source = new if os.path.isfile(os.path.join(new, META_FILE)) else old
    os.rename(source, target)
    out.append(target)


def sweep_staging(parent: str, out: Swept | None = None) -> Swept:
    """Remove the staging folders of dead writers in ``parent``; return what was removed.

    >>> import tempfile
    >>> sweep_staging(tempfile.mkdtemp())
    []
    """
    out = Swept() if out is None else out
    try:
        # a folder of many saved trees (checkpoints side by side) is listed on every save: only
        # the few staging names get a Python step
        names = [name for name in os.listdir(parent) if name.startswith(STAGING_PREFIX)]
    except OSError:
        return out
    for name in names:
        m = _STAGING.match(name)
        if m is None or pid_alive(int(m.group(1))):
            continue
        work = os.path.join(parent, name)
        if os.path.islink(work) or not os.path.isdir(work):
            continue
        _restore(work, out)
        _remove(work, out)
    return out


def _dead_tmp(name: str) -> bool:
    m = _TMP.match(name)
    return m is not None and not pid_alive(int(m.group(1)))


def sweep_archive(path: str, out: Swept | None = None) -> Swept:
    """Remove dead writers' temporary files of the archive ``path`` (beside it).

    >>> import tempfile
    >>> sweep_archive(os.path.join(tempfile.mkdtemp(), "x.tdz"))
    []
    """
    out = Swept() if out is None else out
    parent, base = os.path.split(os.path.abspath(path))
    try:
        names = os.listdir(parent)
    except OSError:
        return out
    head = "." + base + TMP_MARK
    for name in names:
        if name.startswith(head) and _dead_tmp(name):
            _remove(os.path.join(parent, name), out)
    return out


def _referenced(level: str) -> set[str] | None:
    """The ``*.memmap`` names a level's ``meta.json`` and its record of new entries (``meta.jsonl``)
    may use (None: no readable metadata)."""
    try:
        with open(os.path.join(level, META_FILE), "rb") as f:
            meta = loads_json(f.read(), os.path.join(level, META_FILE))
        journal = read_journal(level)  # entries added since the last compaction are committed too
        if journal is not None:
            meta = merge_entries(meta, parse_entries(journal.raw, os.path.join(level, JOURNAL_FILE)))
    except (OSError, ValueError):
        return None
    names = set()
    for key in meta:
        for stem in (encode_key(key), key):
            names.add(stem + LEAF_SUFFIX)
            names.add(stem + ".shape" + LEAF_SUFFIX)
    return names


def sweep_tree(prefix: str, *, orphans: bool, out: Swept | None = None) -> Swept:
    """Remove dead writers' debris in the saved tree ``prefix``; return what was removed.

    Args:
        prefix: the saved folder (links are not followed).
        orphans: also remove ``*.memmap`` files no ``meta.json`` names; only a caller holding
            the tree's lock may ask (see the module docstring).
        out: a list to add to.

    >>> import tempfile
    >>> sweep_tree(tempfile.mkdtemp(), orphans=True)
    []
    """
    out = Swept() if out is None else out
    for level, dirs, files in os.walk(prefix):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(level, d))]
        referenced = _referenced(level) if orphans and META_FILE in files else None
        for name in files:
            path = os.path.join(level, name)
            if TMP_MARK in name:
                if _dead_tmp(name):
                    _remove(path, out)
            elif referenced is not None and name.endswith(LEAF_SUFFIX) and name not in referenced:
                if not os.path.islink(path):
                    _remove(path, out)
    return out
