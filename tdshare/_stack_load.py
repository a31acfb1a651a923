"""Loading the members of a saved lazy stack: one template per distinct member ``meta.json``.

A lazy stack of n members is n levels of a few leaves each, so its load is bound by the
per-level Python work, not by the system calls.  The members of a stack usually hold the
same ``meta.json`` bytes (the same keys, shapes and dtypes), which a load parses once
(:attr:`tdshare._store.Store.parsed_meta`).  A :class:`MemberTemplate` goes further and
derives, once per such parse, everything a member's level needs that does not depend on its
folder: the leaf file names, the bytes each file must hold, the batch size, the dim names, the
device.  Each member then costs what cannot be shared: reading its metadata, one ``lstat`` per
leaf, and a new tensordict of pending leaves (:class:`tdshare._lazy_leaves.PendingLeaf`).

Only the common shape of member takes this path: a plain level of a folder (no nested level,
no nested-tensor or empty leaf), loaded fresh (``mode`` None or ``"r"``, robust key names, no
target device other than the CPU).  Any other member, and any leaf whose file is not a regular
file large enough for its metadata, goes through the general walker
(:func:`tdshare._read.load_level`), which raises the precise errors, naming the file.
"""

from __future__ import annotations

import math
import os
import stat
from typing import Any

import torch

from ._format import LEAF_SUFFIX, LEVEL, META_FILE, layout_of
from ._keys import encode_key
from ._lazy_leaves import LazyLeaves, PendingLeaf
from ._store import DirectoryStore, Store
from ._tensordict_base import TensorDictBase

__all__ = ["MemberTemplate", "member_template"]


class MemberTemplate:
    """What every member level with one parsed ``meta.json`` shares.

    Attributes:
        store: the folder being loaded.
        meta: the parsed metadata (shared by the members, never changed).
        leaves: per leaf, ``(key, file name, bytes its file must hold, dtype, shape)``, in the
            metadata's order.
        batch_size: the members' batch size.
        names: the dim names, or None.
        device: the device of a loaded member.
    """

    __slots__ = ("batch_size", "device", "leaves", "meta", "names", "store")

    def __init__(
        self,
        store: DirectoryStore,
        meta: dict,
        leaves: list[tuple[str, str, int, torch.dtype, tuple[int, ...]]],
        batch_size: torch.Size,
        names: list | None,
        device: torch.device | None,
    ) -> None:
        self.store, self.meta, self.leaves = store, meta, leaves
        self.batch_size, self.names, self.device = batch_size, names, device

    def build(self, cls: type[TensorDictBase], level: str) -> TensorDictBase | None:
        """The member saved in the folder ``level``, as a ``cls`` of pending leaves.

        Args:
            cls: the collection class of the member levels.
            level: the member's folder (its ``meta.json`` parsed as :attr:`meta`).

        Returns the member, or None when a leaf needs the general walker (a missing, short or
        irregular file: the walker raises the error that names it).  Raises nothing itself.

        >>> import tempfile, tdshare
        >>> folder = tempfile.mkdtemp()
        >>> store = DirectoryStore(folder, True, None, None)
        >>> MemberTemplate(store, {}, [], torch.Size([]), None, None).build(tdshare.TensorDict, folder).batch_size
        torch.Size([])
        """
        store = self.store
        prefix = level + os.sep
        where = prefix + META_FILE
        mode = store.mode
        lstat, isreg, pending = os.lstat, stat.S_ISREG, PendingLeaf
        guard = store.guard
        values: dict = LazyLeaves() if self.leaves else {}
        for key, name, need, dtype, shape in self.leaves:
            path = prefix + name
            try:
                st = lstat(path)
            except OSError:
                return None
            if st.st_size < need or not isreg(st.st_mode):
                return None
            dict.__setitem__(values, key, pending(dtype, shape, path, mode, None, 0, st.st_ino, where, guard))
        out = cls._from_leaves(values, self.batch_size, self.device, None if self.names is None else list(self.names))
        store.annotate(out, level, self.meta)
        return out


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
    if not isinstance(store, DirectoryStore) or layout_of(meta) != LEVEL:
        return None
    if not store.robust or store.mode == "r+" or not store.lazy or store.defers:
        return None
    target = torch.device(device) if device is not None else None
    if target is not None and target.type != "cpu":
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
        leaves.append((key, name, numel * dtype.itemsize, dtype, shape))
    names = None if parsed.names is None else list(parsed.names)
    loaded_on = target if target is not None else store.default_device(meta)
    return MemberTemplate(store, meta, leaves, torch.Size(batch), names, loaded_on)
