"""Kernel limits on memory mappings and open files, the bound tdshare keeps under them, and the error past them.

Every mapped leaf file is one entry of the process's memory map, and Linux refuses more than
``vm.max_map_count`` of them (65,530 by default): torch then fails with a bare ``RuntimeError:
unable to mmap ... Cannot allocate memory (12)``.  A mapping holds no descriptor once made
(torch closes the file), so ``RLIMIT_NOFILE`` only bounds the files open at one time, which the
write and read paths keep at one.

tdshare stays under both:

* a folder write returns leaves that are mapped on first read, as a load does
  (:mod:`tdshare._lazy_leaves`);
* the leaves tdshare maps on first read are kept in a least-recently-used list of at most
  :func:`max_mapped_leaves`: past it the oldest one that nobody else references is unmapped (it
  is mapped again, from the same file, when read next);
* where the number of mappings a call needs is known before it starts, :func:`check_mappings`
  raises :class:`ResourceLimitError` before anything is written; a limit reached anyway is
  turned into the same error by :func:`limit_error`.

>>> from tdshare import max_mapped_leaves
>>> max_mapped_leaves() <= max_map_count()
True
"""

from __future__ import annotations

import errno
import os
import resource
import threading

from ._errors import InvalidArgumentError, ResourceLimitError

__all__ = [
    "check_descriptors",
    "check_mappings",
    "is_limit_error",
    "limit_error",
    "live_mappings",
    "map_room",
    "max_map_count",
    "max_mapped_leaves",
    "open_files",
    "open_files_limit",
    "set_max_mapped_leaves",
]

_MAX_MAP_COUNT_FILE = "/proc/sys/vm/max_map_count"
_MAPS_FILE = "/proc/self/maps"
_DEFAULT_MAX_MAP_COUNT = 65530  # Linux's default, where /proc cannot be read
_CAP = 8192  # the default bound: re-mapping a leaf costs ~10 us, a mapping ~200 bytes of kernel memory
_override: list[int | None] = [None]

_FIX = (
    "Touch fewer leaves at once (drop the references to leaves no longer needed: tdshare itself keeps at "
    "most {bound} of the leaves it maps, see tdshare.set_max_mapped_leaves), consolidate the tree into one "
    "file (td.consolidate(filename)), or save it as one archive (a prefix ending in '.tdz')"
)


def max_map_count(fresh: bool = False) -> int:
    """The kernel's limit on memory mappings per process (``/proc/sys/vm/max_map_count``), read once
    per process (``fresh``: read it again now; every limit error does).

    >>> max_map_count() > 0
    True
    """
    if fresh or _limit[0] is None:
        try:
            with open(_MAX_MAP_COUNT_FILE, "rb") as f:
                _limit[0] = int(f.read())
        except (OSError, ValueError):
            _limit[0] = _DEFAULT_MAX_MAP_COUNT
    return _limit[0] or _DEFAULT_MAX_MAP_COUNT


_limit: list[int | None] = [None]


def open_files_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` of this process (``resource.getrlimit``, read now).

    >>> open_files_limit() > 0
    True
    """
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 31 if soft == resource.RLIM_INFINITY else int(soft)


def live_mappings() -> int:
    """How many memory mappings this process holds now (lines of ``/proc/self/maps``; 0 where unreadable).

    >>> live_mappings() >= 0
    True
    """
    # Counted through one buffer made at import, a chunk at a time: this runs when the memory map
    # is full (building the limit error), where reading the whole file (~5 MB at 65,530 mappings)
    # needs a mapping of its own and raised MemoryError instead of the error.
    with _MAPS_LOCK:
        try:
            with open(_MAPS_FILE, "rb", buffering=0) as f:
                count, view = 0, _MAPS_VIEW
                while got := f.readinto(view):
                    count += _MAPS_BUFFER.count(b"\n", 0, got)
                return count
        except (OSError, MemoryError):
            return 0


_MAPS_BUFFER = bytearray(1 << 16)
_MAPS_VIEW = memoryview(_MAPS_BUFFER)
_MAPS_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _MAPS_LOCK
    _MAPS_LOCK = threading.Lock()  # (another thread may have held it at the fork)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _headroom(limit: int) -> int:
    # what the interpreter, torch and the allocator map besides leaves
    return min(1024, limit // 16)


def map_room() -> int:
    """How many more mappings this process may make and still leave headroom for the interpreter.

    >>> map_room() > 0
    True
    """
    limit = max_map_count(fresh=True)
    return limit - _headroom(limit) - live_mappings()


def max_mapped_leaves() -> int:
    """How many of the leaves it maps on first read tdshare keeps mapped at once (least recently
    used ones past it are unmapped, and mapped again when read next).

    The default is ``min(8192, vm.max_map_count // 8)``, read at each call; the mappings of
    leaves held elsewhere (a tensor the caller keeps) are the caller's and are never taken.

    >>> from tdshare import max_mapped_leaves
    >>> 64 <= max_mapped_leaves() <= 8192
    True
    """
    bound = _override[0]
    if bound is not None:
        return bound
    return max(64, min(_CAP, max_map_count() // 8))


def set_max_mapped_leaves(bound: int | None) -> int | None:
    """Set how many lazily mapped leaves tdshare keeps mapped at once; None restores the default.

    Args:
        bound: a positive number of leaves, or None for ``min(8192, vm.max_map_count // 8)``.

    Returns:
        The bound set before (None: the default was in use).

    Raises:
        InvalidArgumentError: ``bound`` is not a positive int or None.

    >>> import tdshare
    >>> old = tdshare.set_max_mapped_leaves(100)
    >>> tdshare.max_mapped_leaves()
    100
    >>> _ = tdshare.set_max_mapped_leaves(old)
    """
    if bound is not None and (type(bound) is not int or bound < 1):
        raise InvalidArgumentError(f"set_max_mapped_leaves takes a positive int or None (the default), got {bound!r}.")
    old = _override[0]
    _override[0] = bound
    return old


def check_mappings(needed: int, what: str, fix: str | None = None) -> None:
    """Raise :class:`ResourceLimitError` when ``needed`` more mappings would not fit under
    ``vm.max_map_count`` (with headroom); ``what`` names the call in the message, ``fix`` (when
    given) leads the ways out it lists.

    >>> check_mappings(1, "one leaf")
    """
    if needed <= 0:
        return
    limit = max_map_count(fresh=True)
    live = live_mappings()
    if live + needed + _headroom(limit) > limit:
        lead = f"{fix}; or t" if fix else "T"
        generic = _FIX.format(bound=max_mapped_leaves())
        raise ResourceLimitError(
            f"{what} needs {needed} memory mappings at once, and this process holds {live} of the "
            f"vm.max_map_count={limit} the kernel allows: nothing was written or mapped. "
            + lead
            + generic[1:]
            + ", or raise the limit (sysctl -w vm.max_map_count=...)."
        )


def open_files() -> int:
    """How many descriptors this process holds open now (entries of ``/proc/self/fd``; 0 where unreadable).

    >>> open_files() > 0
    True
    """
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def check_descriptors(needed: int, what: str) -> None:
    """Raise :class:`ResourceLimitError` when ``needed`` more open files would pass ``RLIMIT_NOFILE``;
    ``what`` names the call in the message.

    >>> check_descriptors(1, "one file")
    """
    limit = open_files_limit()
    held = open_files()
    if held + needed > limit:
        raise ResourceLimitError(
            f"{what} needs {needed} more open files at once, and this process holds {held} of the "
            f"RLIMIT_NOFILE={limit} it may open: nothing was written. Close files this process no longer "
            "needs, or raise the limit (ulimit -n, or resource.setrlimit(resource.RLIMIT_NOFILE, ...))."
        )


def is_limit_error(err: BaseException) -> bool:
    """Whether ``err`` is the kernel refusing a mapping (ENOMEM) or a descriptor (EMFILE, ENFILE):
    torch's ``RuntimeError: unable to mmap ... (12)`` or an ``OSError``.

    >>> is_limit_error(RuntimeError("unable to mmap 16 bytes from file <x>: Cannot allocate memory (12)"))
    True
    """
    if isinstance(err, ResourceLimitError):
        return False
    if isinstance(err, OSError):
        return err.errno in (errno.ENOMEM, errno.EMFILE, errno.ENFILE)
    if isinstance(err, RuntimeError):
        text = str(err)
        return "(12)" in text or "(24)" in text or "(23)" in text or "Too many open files" in text
    return False


def limit_error(err: BaseException, path: str, needed: int | None = None) -> ResourceLimitError:
    """The :class:`ResourceLimitError` for ``err`` (see :func:`is_limit_error`) raised on ``path``.

    ``needed``: how many mappings the call needed in all, when known.

    >>> e = limit_error(OSError(24, "Too many open files"), "/tmp/x.memmap")
    >>> "RLIMIT_NOFILE" in str(e)
    True
    """
    text = str(err)
    files = (isinstance(err, OSError) and err.errno in (errno.EMFILE, errno.ENFILE)) or (
        not isinstance(err, OSError) and ("(24)" in text or "(23)" in text or "Too many open files" in text)
    )
    of = f" (the call needed {needed})" if needed is not None else ""
    if files:
        held = open_files()
        return ResourceLimitError(
            f"Opening {path!r} failed ({text}): this process holds {held} open files and RLIMIT_NOFILE is "
            f"{open_files_limit()}{of}. Close files this process no longer needs, or raise the limit "
            "(ulimit -n, or resource.setrlimit(resource.RLIMIT_NOFILE, ...))."
        )
    return ResourceLimitError(
        f"Mapping {path!r} failed ({text}): this process holds {live_mappings()} memory mappings and "
        f"vm.max_map_count is {max_map_count(fresh=True)}{of}. "
        + _FIX.format(bound=max_mapped_leaves())
        + ", or raise the limit (sysctl -w vm.max_map_count=...)."
    )
