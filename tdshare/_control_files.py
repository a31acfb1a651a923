"""Where the control files of shared trees live: this user's private runtime folder, each tree's
file-name key, and their removal (``python -m tdshare gc``).  What the files hold and how they are
used is :mod:`tdshare._coordination`'s docstring.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile

from ._errors import MemmapError

__all__ = [
    "control_paths",
    "identity",
    "reap_trees",
    "remove_control_files",
    "reserve_blocks",
    "runtime_root",
    "tree_root",
    "trees_dir",
]

_TREES = ".trees"  # a dot name: the reaper of anonymous stores passes it over


def runtime_root() -> str:
    """This user's private runtime folder (created with mode 0700, checked to be ours).

    ``$XDG_RUNTIME_DIR/tdshare-<uid>``, else ``/dev/shm/tdshare-<uid>``, else the temp folder's.

    Raises:
        MemmapError: the folder exists but is not a private directory of this user.
    """
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base or not os.access(base, os.W_OK):
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    root = os.path.join(base, f"tdshare-{os.getuid()}")
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise MemmapError(
            f"The runtime folder {root!r} is not a private directory owned by this user; remove it and retry."
        )
    return root


_TREES_DIR: dict[int, str] = {}  # pid -> the folder, checked once per process


def trees_dir() -> str:
    """The folder of the trees' control files, ``<runtime_root>/.trees`` (created once per process)."""
    path = _TREES_DIR.get(os.getpid())
    if path is None:
        path = os.path.join(runtime_root(), _TREES)
        os.makedirs(path, mode=0o700, exist_ok=True)
        _TREES_DIR[os.getpid()] = path
    return path


def reserve_blocks(fd: int, size: int) -> None:
    """Make the file at ``fd`` at least ``size`` bytes with its blocks allocated (zero-extended, so
    two processes may race to create it).  A mapping of a sparse file on a full file system dies
    with SIGBUS at its first write; ``posix_fallocate`` raises ``OSError(ENOSPC)`` instead."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
            raise
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)  # a file system without fallocate: best effort


def identity(root: str) -> str:
    """The file-name key of the tree at ``root`` (absolute, normalized): its parent folder's device
    and inode, its name's hash.

    The parent's inode is the same by every path that leads to it, so only a ``root`` that is
    itself a symbolic link needs resolving (``realpath`` stats every component: 7 µs a load).
    """
    parent, name = os.path.split(root)
    try:
        link = not parent or not name or stat.S_ISLNK(os.lstat(root).st_mode)
    except FileNotFoundError:
        link = False  # a tree not created yet: its name in the real parent
    if link:
        parent, name = os.path.split(os.path.realpath(root))
    st = os.stat(parent)
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return f"{st.st_dev:x}-{st.st_ino:x}-{digest}"


def control_paths(root: str) -> tuple[str, str]:
    """The lock file and the counter file of the tree at ``root`` (in the runtime folder)."""
    base = os.path.join(trees_dir(), identity(root))
    return base + ".lock", base + ".gen"


def remove_control_files(root: str) -> None:
    """Remove the control files of the tree at ``root`` (a tree nobody uses any more)."""
    try:
        base = os.path.join(trees_dir(), identity(root))
    except FileNotFoundError:
        return  # its parent folder is gone: gc finds the files by their recorded path
    _remove_base(base)


def _remove_base(base: str) -> None:
    for suffix in (".gen", ".lock", ".path", ".changes"):
        try:
            os.unlink(base + suffix)
        except FileNotFoundError:
            pass


def tree_root(directory: str) -> str:
    """The top directory of the saved tree that ``directory`` belongs to.

    Walks up while the parent holds a ``meta.json`` too, so a nested level loaded on its own
    (``subpath=``) shares the registry of the whole tree.
    """
    current = os.path.abspath(directory)
    while True:
        parent = os.path.dirname(current)
        if parent == current or not os.path.isfile(os.path.join(parent, "meta.json")):
            return current
        current = parent


def _mapped_paths() -> set[str]:
    """Every file that a live process of this user maps (from ``/proc/*/maps``)."""
    found: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6:
                        found.add(os.fsdecode(parts[5].rstrip(b"\n")).removesuffix(" (deleted)"))
        except OSError:
            continue  # gone, or another user's
    return found


def reap_trees() -> list[str]:
    """Remove the control files of trees that no longer exist and that no live process maps.

    Returns the paths of the trees whose files were removed.
    """
    folder = trees_dir()
    mapped = _mapped_paths()
    removed = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".path"):
            continue
        base = os.path.join(folder, name[: -len(".path")])
        try:
            with open(base + ".path", encoding="utf-8", errors="surrogateescape") as f:
                tree = f.read()
        except OSError:
            continue
        try:
            alive = os.path.isdir(tree) and identity(tree) == os.path.basename(base)
        except OSError:
            alive = False
        if alive or base + ".gen" in mapped:
            continue
        _remove_base(base)
        removed.append(tree)
    return removed
