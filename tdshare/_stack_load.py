"""Loading the members of a saved lazy stack: one fused loop over the stack's folder.

A lazy stack of n members is n levels of a few leaves each, so its load is bound by the
per-member work: the system calls that cannot be shared (reading its ``meta.json``, one ``stat``
per leaf file) and the Python around them.  No member is probed for a record of new entries
(``meta.jsonl``): tdshare marks a level's ``meta.json`` before it starts one (see
:mod:`tdshare._journal`), so only a member whose ``meta.json`` carries the mark has its record read.
:func:`load_members` does that work in one loop, through one descriptor of the stack's folder
(the paths it hands the kernel are ``"7/meta.json"``, not absolute ones), and nothing else:

- The members of a stack usually hold the same ``meta.json`` bytes (the same keys, shapes and
  dtypes): each distinct content is parsed once, and a :class:`MemberTemplate` derives from it,
  once, everything a member's level needs that does not depend on its folder (the leaf file
  names, the bytes each file must hold, the batch size, the dim names, the device).
- Each member then costs its ``meta.json`` read, one ``stat`` per leaf, and a new tensordict of
  pending leaves (:class:`tdshare._lazy_leaves.PendingLeaf`).

Anything unusual goes to the general walker (:func:`tdshare._read.load_level`), one member at a
time and in order, so its errors are the ones a load raises, naming the member and the file: a
member folder that is a symbolic link, is marked as having a record of new entries, or has no
readable, small, plain ``meta.json``; a level the template does not cover (a nested level, a
nested-tensor or empty leaf, another layout); a leaf file that is missing, short or irregular.
Only a fresh load takes the loop (``mode`` None or ``"r"``, robust key names, no target device
other than the CPU); a gap in the member numbering raises before any member is read.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable
from typing import Any

import torch

from ._format import JOURNAL_FIELD, LEAF_SUFFIX, LEVEL, META_FILE, layout_of, loads_json
from ._keys import encode_key
from ._lazy_leaves import PendingLeaf, new_lazy_leaves, track_below
from ._store import DirectoryStore, Store, checked_members, member_entries
from ._tensordict_base import TensorDictBase

__all__ = ["MemberTemplate", "member_template", "templates_apply", "load_members"]


class MemberTemplate:
    """What every member level with one parsed ``meta.json`` shares.

    Attributes:
        meta: the parsed metadata (shared by the members, never changed).
        leaves: per leaf, ``(key, "/" and its file's name, bytes the file must hold, dtype, shape)``,
            in the metadata's order.
        batch_size: the members' batch size.
        names: the dim names, or None.
        device: the device of a loaded member.
    """

    __slots__ = ("batch_size", "device", "leaves", "meta", "names")

    def __init__(
        self,
        meta: dict,
        leaves: list[tuple[str, str, int, torch.dtype, tuple[int, ...]]],
        batch_size: torch.Size,
        names: list | None,
        device: torch.device | None,
    ) -> None:
        self.meta, self.leaves = meta, leaves
        self.batch_size, self.names, self.device = batch_size, names, device


def templates_apply(store: Store, device: Any) -> bool:
    """Whether the members of a stack in ``store``, loaded to ``device``, may be built from templates.

    Args:
        store: the store being loaded.
        device: the ``device`` the load was asked for (None: the saved one).

    Returns True for a fresh load of a folder (``mode`` None or ``"r"``, robust key names,
    leaves mapped on first read) to the CPU or the saved device; False otherwise.

    >>> templates_apply(None, None)  # not a folder's store
    False
    """
    if not isinstance(store, DirectoryStore):
        return False
    if not store.robust or store.mode == "r+" or not store.lazy or store.defers:
        return False
    return device is None or torch.device(device).type == "cpu"


def member_template(store: Store, meta: dict, where: str, device: Any) -> MemberTemplate | None:
    """The template for the member levels whose parsed metadata is ``meta``.

    Args:
        store: the store being loaded (only a folder's members have templates).
        meta: the parsed ``meta.json`` the members share.
        where: how errors name that file.
        device: the ``device`` the load was asked for (None: the saved one).

    Returns None when such members need the general walker (see the module's docstring).

    Raises:
        CorruptDataError: ``meta`` is not a valid level (naming ``where``).

    >>> member_template(None, {"shape": []}, "meta.json", None) is None  # not a folder's store
    True
    """
    if not templates_apply(store, device) or layout_of(meta) != LEVEL or JOURNAL_FIELD in meta:
        return None
    parsed = store.parse(meta, where)
    if parsed.children:
        return None
    batch = tuple(parsed.batch_size) if parsed.batch_size is not None else ()
    leaves = []
    for key, shape, dtype, nested in parsed.leaves:
        numel = math.prod(shape)
        if nested or not numel or shape[: len(batch)] != batch:
            return None  # the general walker builds it, or raises naming the leaf
        name = (key if key.isidentifier() else encode_key(key)) + LEAF_SUFFIX
        leaves.append((key, os.sep + name, numel * dtype.itemsize, dtype, shape))
    names = None if parsed.names is None else list(parsed.names)
    loaded_on = torch.device(device) if device is not None else store.default_device(meta)
    return MemberTemplate(meta, leaves, torch.Size(batch), names, loaded_on)


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_READ = 1 << 16  # a meta.json this long or longer goes the general way (read in full there)
_DIR_FD = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd


def load_members(
    cls: type[TensorDictBase],
    store: DirectoryStore,
    level: str,
    template_of: Callable[[dict, str], MemberTemplate | None],
    general: Callable[[int, str, dict | None, bool], TensorDictBase],
) -> list[TensorDictBase] | None:
    """The members ``0/``, ``1/``... of the lazy stack saved in the folder ``level``, in order.

    Args:
        cls: the collection class of the member levels.
        store: the folder being loaded (see :func:`templates_apply`).
        level: the stack's folder.
        template_of: the template for a parsed member ``meta.json`` and how errors name it, or
            None (:func:`member_template`).
        general: builds member ``index`` in folder ``sub`` the general way, from its parsed
            ``meta``, or reading it when None; ``plain``: the folder is known to be no symbolic link.

    Returns the members (those built here hold pending leaves and are tracked for re-saves
    under ``level``), or None when the folder cannot be opened or listed (the general walker
    then raises the error).

    Raises:
        CorruptDataError: a gap in the member numbering (before any member is read), a
            ``meta.json`` that is not valid JSON, and whatever ``general`` raises (naming the member).

    >>> import tempfile, tdshare
    >>> folder = tempfile.mkdtemp()
    >>> _ = tdshare.LazyStackedTensorDict(tdshare.TensorDict(), tdshare.TensorDict()).memmap_(folder)
    >>> len(tdshare.LazyStackedTensorDict.load_memmap(folder).tensordicts)
    2
    """
    if not _DIR_FD:  # pragma: no cover - platforms without *at() system calls
        return None
    try:
        dfd = os.open(level, _DIR_FLAGS)
    except OSError:
        return None
    try:
        try:
            with os.scandir(dfd) as scan:
                plain = {e.name: not e.is_symlink() for e in member_entries(scan)}
        except OSError:
            return None
        try:
            return _build(cls, store, dfd, level, plain, template_of, general)
        except Exception:
            # a gap in the numbering is what the general walker raises first, before any member's error
            checked_members(store, level, {int(name) for name in plain}, lambda i: f"{level}{os.sep}{i}", False)
            raise
    finally:
        os.close(dfd)


def _build(
    cls: type[TensorDictBase],
    store: DirectoryStore,
    dfd: int,
    level: str,
    plain: dict[str, bool],
    template_of: Callable[[dict, str], MemberTemplate | None],
    general: Callable[[int, str, dict | None, bool], TensorDictBase],
) -> list[TensorDictBase]:
    """The loop of :func:`load_members`: member ``i`` is read through ``dfd`` as ``"i/..."``; a
    name missing from ``plain`` (a gap) raises ``KeyError`` (the caller raises the gap's error)."""
    open_, read, close, stat_, isreg = os.open, os.read, os.close, os.stat, stat.S_ISREG
    new_leaves, pending, from_leaves = new_lazy_leaves, PendingLeaf, cls._from_leaves
    nofollow, meta_file = _NOFOLLOW, os.sep + META_FILE
    mode, guard, annotate = store.mode, store.guard, store.annotate
    inline = type(store).annotate is DirectoryStore.annotate  # then what it does is written out below
    keep = mode != "r"  # (a folder's annotate: a read-only load keeps no folder to memmap_ into)
    parsed: dict[bytes, tuple[dict, MemberTemplate | None]] = {}  # meta.json bytes -> (meta, template)
    shared = store.parsed_meta  # so that the members the general walker builds share the parses too
    base = level + os.sep
    members: list[TensorDictBase] = []
    add = members.append
    built: list[dict] = []
    last: bytes | None = None  # the previous member's meta.json bytes, whose parse ``hit`` holds
    hit: tuple[dict, MemberTemplate | None] = ({}, None)
    for index in range(len(plain)):
        name = str(index)
        if not plain[name]:
            add(general(index, base + name, None, False))  # a link is checked there
            continue
        try:
            fd = open_(name + meta_file, nofollow, dir_fd=dfd)
        except OSError:
            add(general(index, base + name, None, True))  # missing, a link, unreadable: named there
            continue
        try:
            raw = read(fd, _READ)
        except OSError:  # a directory, an I/O error: named there
            raw = b""
        finally:
            close(fd)
        sub = base + name
        if raw != last:  # (members usually repeat the previous one's bytes: one comparison, no hash)
            if not raw or len(raw) >= _READ:  # empty: not valid JSON; long: read in full; named there
                add(general(index, sub, None, True))
                continue
            got = parsed.get(raw)
            if got is None:
                meta = shared.get(raw)
                if meta is None:
                    meta = shared[raw] = loads_json(raw, sub + meta_file)
                got = parsed[raw] = (meta, template_of(meta, sub + meta_file))
            hit, last = got, raw
        meta, template = hit
        if template is None:  # (a marked member: its record is read there, before its meta.json again)
            add(general(index, sub, None if JOURNAL_FIELD in meta else meta, True))
            continue
        where = sub + meta_file
        leaves = template.leaves
        values: dict = new_leaves() if leaves else {}
        for key, file, need, dtype, shape in leaves:
            try:
                st = stat_(name + file, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                break
            if st.st_size < need or not isreg(st.st_mode):
                break
            # a plain store: LazyLeaves keeps dict's own __setitem__ (no call of dict.__setitem__ per leaf)
            values[key] = pending(dtype, shape, sub + file, mode, None, 0, st.st_ino, where, guard)
        else:
            names = template.names
            member = from_leaves(values, template.batch_size, template.device, None if names is None else list(names))
            if inline:
                member._memmap_prefix, member._meta_seen = sub if keep else None, meta
            else:
                annotate(member, sub, meta)
            if leaves:
                built.append(values)
            add(member)
            continue
        add(general(index, sub, meta, True))  # a missing, short or irregular file: named there
    track_below(built, level)  # a re-save here or in a member's folder maps their pending leaves first
    return members
