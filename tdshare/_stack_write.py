"""A lazy stack's first save into a folder: its members written in one loop.

A lazy stack of n one-leaf members is n folders, n leaf files and n ``meta.json`` files: the
general writer (:mod:`tdshare._write`) plans n levels, walks them three times (folders, leaves,
metadata) and installs each, about half of the time of the system calls themselves on top of
them.  :func:`write_stack` does the same work for the common stack in one pass:

- **Planning** is one look at each member: a plain collection level (no nested level, no
  non-tensor value) whose entries are all plain dense tensors under plain keys (each its own file
  name), with data.  Members whose entries have equal keys, shapes and dtypes (with equal batch
  size and dim names) share one schema (:class:`tdshare._level_schema.LevelSchema`, as the levels
  of the general writer do): one metadata dict and one encoded ``meta.json``, written as bytes
  into each of their folders.
- **Writing**, per member and in order: its folder, each leaf file (create, write, ``fstat`` for
  the inode, close) and its ``meta.json`` after them; the stack's own ``meta.json`` last, replaced
  whole, so a reader sees no stack or all of it.  The bytes of the small leaves are taken in
  one step across members (:func:`tdshare._leaf_files.leaf_bytes`).
- **Installing**: each member gets its leaves as :class:`~tdshare._lazy_leaves.PendingLeaf`
  handles (mapped on first read), as the general writer gives them, and is locked.

It applies to a first save only (no ``meta.json`` in the folder, which is new or empty), not
atomic, in the calling thread, with robust key names, ``existsok`` and no progress callback;
anything else, and any member it does not cover, goes the general way, which writes the same
bytes.  A failure removes the folders it made, and the tensordict is left as it was.
"""

from __future__ import annotations

import os
import shutil
from typing import TypeVar

import torch

from ._files import check_not_symlink, replace_file
from ._format import (
    LEVEL,
    META_FILE,
    STACK,
    dumps_json,
    lazy_stack_meta,
)
from ._lazy_leaves import PendingLeaf, new_lazy_leaves, track_below
from ._leaf_files import leaf_bytes
from ._level_schema import LevelSchema, SchemaCache
from ._mapping_limits import check_descriptors, is_limit_error, limit_error
from ._nodes import kind_of
from ._options import SaveOptions
from ._tensordict_base import TensorDictBase
from ._write_install import blank

__all__ = ["stack_applies", "write_stack"]

T = TypeVar("T", bound=TensorDictBase)

_CPU = torch.device("cpu")
_STRIDED = torch.strided
_Tensor = torch.Tensor
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_FILES_PER_WRITE = 8  # a leaf file, a metadata file, with room (as the general writer checks)


def stack_applies(td: TensorDictBase, opts: SaveOptions) -> bool:
    """Whether :func:`write_stack` may take the first save of ``td`` with ``opts`` (it may still
    find a member it does not cover, and hand the save back).

    Args:
        td: the tensordict being saved.
        opts: the save's options.

    Returns True for a lazy stack saved in the calling thread, not atomically, with robust key
    names, ``existsok=True`` and no progress callback.

    >>> import torch
    >>> from tdshare import LazyStackedTensorDict, TensorDict
    >>> from tdshare._options import SaveOptions
    >>> ls = LazyStackedTensorDict(TensorDict(x=torch.ones(2)), TensorDict(x=torch.zeros(2)))
    >>> stack_applies(ls, SaveOptions.of("/tmp/x")), stack_applies(ls[0], SaveOptions.of("/tmp/x"))
    (True, False)
    """
    kind = kind_of(td)
    return (
        kind is not None
        and kind.layout == STACK
        and kind.unwrap is not None
        and not opts.atomic
        and opts.num_threads <= 1
        and opts.progress is None
        and bool(opts.robust_key)
        and opts.existsok
    )


# a member, planned: its source, its leaf tensors (in its schema's key order) and its schema
_Member = tuple[TensorDictBase, list[torch.Tensor], LevelSchema]


def _plan(members: list[TensorDictBase]) -> list[_Member] | None:
    """Each member's leaves and schema, or None when one is not covered (see the module docstring)."""
    levels: dict[type, bool] = {}
    schemas = SchemaCache()
    out: list[_Member] = []
    for member in members:
        tp = type(member)
        ok = levels.get(tp)
        if ok is None:
            kind = kind_of(member)
            ok = levels[tp] = kind is not None and kind.layout == LEVEL and kind.unwrap is None
        if not ok:
            return None
        entries = member._tensordict
        schema = schemas.of(entries, tuple(member.batch_size), member._names)
        if schema is None:
            return None
        out.append((member, list(dict.values(entries)), schema))
    return out


def _open_root(path: str) -> bool | None:
    """Make the stack's folder: True when made, False when found empty, None when it holds anything."""
    try:
        os.mkdir(path)
        return True
    except OSError:
        pass
    try:
        check_not_symlink(path)
        with os.scandir(path) as entries:
            return False if next(entries, None) is None else None
    except OSError:  # missing parents, a file, unreadable: the general writer makes or reports it
        return None


def write_stack(td: T, path: str, opts: SaveOptions, *, inplace: bool) -> T | None:
    """The first save of the lazy stack ``td`` into the folder ``path``, or None when it is not
    covered (nothing was written then: the general writer saves it).

    Args:
        td: a lazy stack (see :func:`stack_applies`).
        path: the absolute path of a folder that holds no saved tree (new or empty).
        opts: the save's options.
        inplace: ``memmap_`` (install into ``td``) rather than ``memmap`` (into a new stack).

    Returns the memory-mapped, locked stack (``td`` itself when ``inplace``).

    Raises:
        ResourceLimitError: the kernel refuses a descriptor.
        OSError: a folder or file cannot be written (what was made is removed).

    >>> import tempfile, torch
    >>> from tdshare import LazyStackedTensorDict, TensorDict
    >>> from tdshare._options import SaveOptions
    >>> ls = LazyStackedTensorDict(TensorDict(x=torch.ones(2)), TensorDict(x=torch.zeros(2)))
    >>> folder = tempfile.mkdtemp()
    >>> write_stack(ls, folder, SaveOptions.of(folder), inplace=True) is ls, ls.is_memmap()
    (True, True)
    """
    kind = kind_of(td)
    assert kind is not None and kind.unwrap is not None
    members, fields = kind.unwrap(td)
    planned = _plan(members)
    if planned is None:
        return None
    check_descriptors(_FILES_PER_WRITE, f"Saving to {path!r}")
    made_root = _open_root(path)
    if made_root is None:
        return None
    head = path + os.sep
    made: list[str] = []
    written: list[list[PendingLeaf]] = []
    try:
        files = [f"{head}{i}{os.sep}{name}" for i, m in enumerate(planned) for name in m[2].files]
        srcs = [src for m in planned for src in m[1]]
        blobs = leaf_bytes(srcs, [info for m in planned for info in m[2].infos], files)
        data = list(zip(files, blobs, strict=True))
        _write_members(planned, head, data, made, written)
        replace_file(head + META_FILE, dumps_json(lazy_stack_meta(fields["stack_dim"], fields.get("stack_dim_name"))))
    except BaseException as err:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        if made_root:
            try:
                os.rmdir(path)
            except OSError:
                pass
        if isinstance(err, OSError) and is_limit_error(err):
            raise limit_error(err, path) from err
        raise
    dest = td if inplace else blank(td)
    _install(kind.unwrap(dest)[0], planned, written, head)
    dest._is_memmap, dest._is_shared, dest._memmap_prefix, dest._is_locked = True, False, path, True
    dest._generation = None
    return dest


def _write_members(
    planned: list[_Member],
    head: str,
    data: list[tuple[str, memoryview | bytes]],
    made: list[str],
    written: list[list[PendingLeaf]],
) -> None:
    """Each member's folder, leaf files and ``meta.json``, in order (the loop runs once a member:
    written out, since a function call costs about as much as a system call here)."""
    mkdir, open_, write, fstat, close = os.mkdir, os.open, os.write, os.fstat, os.close
    new, pending, meta_file = _NEW_FILE, PendingLeaf, os.sep + META_FILE
    files = iter(data)
    for i, (_, _, schema) in enumerate(planned):
        sub = head + str(i)
        mkdir(sub)
        made.append(sub)
        where = sub + meta_file
        out = []
        for info in schema.infos:
            file, blob = next(files)
            fd = open_(file, new, 0o666)
            try:
                done = write(fd, blob)
                while done < len(blob):  # the kernel stops at ~2 GiB a call
                    done += write(fd, memoryview(blob)[done:])
                ino = fstat(fd).st_ino
            finally:
                close(fd)
            out.append(pending(info.dtype, info.shape, file, None, None, 0, ino, where))
        written.append(out)
        fd = open_(where, new, 0o666)
        try:
            blob = schema.data
            done = write(fd, blob)
            while done < len(blob):
                done += write(fd, memoryview(blob)[done:])
        finally:
            close(fd)


def _install(dests: list[TensorDictBase], planned: list[_Member], written: list[list[PendingLeaf]], head: str) -> None:
    """Put each member's pending leaves into its destination (its source for ``memmap_``) and lock it."""
    made: list[dict] = []
    setitem = dict.__setitem__
    for i, (member, (src, _, schema), out) in enumerate(zip(dests, planned, written, strict=True)):
        values = new_lazy_leaves()
        for key, leaf in zip(schema.keys, out, strict=True):
            setitem(values, key, leaf)
        member._tensordict = values
        made.append(values)
        member._device, member._names, member._memmap_prefix = _CPU, src._names, head + str(i)
        member._is_memmap, member._is_shared, member._is_locked = True, False, True
        src._meta_seen = schema.meta
    track_below(made, head.rstrip(os.sep))
