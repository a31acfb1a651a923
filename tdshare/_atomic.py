"""Atomic directory commit: write a whole tree next to its target, then rename it into place.

Readers see the old directory or the new one, never a mix.  An existing directory is replaced by
one ``renameat2(RENAME_EXCHANGE)`` of the two folders, so the target is never missing (Linux, on
the file systems that have it: ext4, xfs, btrfs, tmpfs); elsewhere by two renames, between which
the target is briefly missing.  The staging folder ``.tdtmp-*`` sits next to the target, so the
renames stay on one file system; it is removed on failure.  Its name carries the writer's pid
(``.tdtmp-<pid>-<random>``) and it holds a note naming the target, so the staging folder of a
killed writer is recognised and cleaned (or, killed between the renames, put back) by
:mod:`tdshare._debris`.  Nothing is synced to disk: this
guards against a killed process, not against a power failure.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from ._errors import AtomicTargetError, FileExistsRuntimeError, MemmapError, NotSupportedError
from ._files import exchange
from ._format import META_FILE

__all__ = [
    "check_atomic_target",
    "atomic_directory",
    "make_staging",
    "swap_in_progress",
    "STAGING_PREFIX",
    "TARGET_NOTE",
]

STAGING_PREFIX = ".tdtmp-"
TARGET_NOTE = "target"  # the file in a staging folder naming (by basename) the path it replaces


def make_staging(parent: str, target: str | None = None) -> str:
    """Create a staging folder ``.tdtmp-<pid>-<random>`` in ``parent`` and return its path.

    ``target`` (a path in ``parent``) is noted in it, so a sweep can put that tree back if the
    writer dies between moving it out and moving the new one in.

    >>> import os, tempfile
    >>> os.path.basename(make_staging(tempfile.mkdtemp())).startswith(f".tdtmp-{os.getpid()}-")
    True
    """
    work = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=parent)
    if target is not None:
        with open(os.path.join(work, TARGET_NOTE), "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(os.path.basename(target))
    return work


def swap_in_progress(target: str) -> bool:
    """Whether a staging folder beside ``target`` has moved the old ``target`` out (its writer is
    between its two renames, or died there).

    >>> import tempfile
    >>> swap_in_progress(tempfile.mkdtemp() + "/td")
    False
    """
    parent, name = os.path.split(os.path.realpath(target))
    try:
        works = [n for n in os.listdir(parent) if n.startswith(STAGING_PREFIX)]
    except OSError:
        return False
    for work in works:
        try:
            with open(os.path.join(parent, work, TARGET_NOTE), encoding="utf-8", errors="surrogateescape") as f:
                noted = f.read()
        except OSError:
            continue
        if noted == name and os.path.isdir(os.path.join(parent, work, "old")):
            return True
    return False


def check_atomic_target(prefix: str, existsok: bool) -> None:
    """Raise if ``prefix`` may not be replaced by an atomic write."""
    if sys.platform == "win32":
        raise NotSupportedError("atomic=True is not supported on Windows.")
    if not os.path.lexists(prefix):
        return
    if not os.path.isdir(prefix):
        raise AtomicTargetError(f"{prefix} exists and is not a directory: atomic=True replaces directories only.")
    if os.listdir(prefix):
        if not existsok:
            raise FileExistsRuntimeError(f"{prefix} is not empty and existsok=False.")
        if not os.path.isfile(os.path.join(prefix, META_FILE)):
            raise MemmapError(
                f"Refusing to replace {prefix} with atomic=True: it is not empty and holds no saved tensordict "
                f"(no {META_FILE}). Choose an empty or new directory."
            )


@contextmanager
def atomic_directory(prefix: str, existsok: bool) -> Iterator[str]:
    """Yield a staging directory; on success it replaces ``prefix`` whole, on error it is removed."""
    target = os.path.realpath(prefix)  # through a symlink, the pointed-to directory is replaced
    check_atomic_target(target, existsok)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    work = make_staging(parent, target)
    new = os.path.join(work, "new")
    old = os.path.join(work, "old")
    remove_work = True
    try:
        os.mkdir(new)
        yield new
        if os.path.lexists(target):
            shutil.copymode(target, new)
            if not exchange(new, target):  # swapped in one step, the old tree now at `new`, or:
                os.rename(target, old)
                try:
                    os.rename(new, target)
                except BaseException:
                    try:
                        os.rename(old, target)
                    except OSError:
                        remove_work = False  # the old tree only survives in `old`: never delete it
                    raise
        else:
            os.rename(new, target)
    finally:
        if remove_work:
            shutil.rmtree(work, ignore_errors=True)
