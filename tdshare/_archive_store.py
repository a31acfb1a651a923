"""Reading a ``.tdz`` archive through the :class:`~tdshare._store.Store` interface.

The archive is mapped once: stored, aligned leaves are zero-copy views of the mapping,
misaligned ones are copies, and compressed ones are decompressed (CRC checked) once the whole
tree is known, on ``num_threads`` threads.
"""

from __future__ import annotations

import math
import operator
import pickle
from collections.abc import Iterator
from typing import Any

import torch

from ._crc import pool, results
from ._errors import CorruptDataError, InvalidArgumentError, MemmapError, MissingMetadataError
from ._files import jagged_from_buffer
from ._format import LEAF_SUFFIX, META_FILE, LeafInfo, loads_json
from ._keys import encode_key
from ._memmap import MemoryMappedTensor
from ._store import Deferred, Store, checked_members, empty_leaf
from ._tdz import METHOD_NAMES, Archive

__all__ = ["ArchiveStore"]

_OFFSET = operator.itemgetter(0)
_CPU = torch.device("cpu")


def _views(ar: Archive, spots: list[tuple[int, str, tuple[int, ...], torch.dtype]]) -> list[torch.Tensor]:
    """Views of the payloads at ``spots`` (sorted by byte offset, each aligned for its dtype).

    A run of evenly spaced payloads of one shape and dtype (a level of like leaves) is cut from
    one strided view by one ``unbind``: about a third of the cost of an ``as_strided`` per leaf.
    """
    out: list[torch.Tensor] = []
    i, n = 0, len(spots)
    while i < n:
        start, _, shape, dtype = spots[i]
        j, step = i + 1, spots[i + 1][0] - start if i + 1 < n else 0
        while j < n and spots[j][0] - spots[j - 1][0] == step and spots[j][3] is dtype and spots[j][2] == shape:
            j += 1
        flat, strides, k = ar.typed(dtype), ar.strides(shape), dtype.itemsize
        if j - i > 1:
            out += flat.as_strided((j - i, *shape), (step // k, *strides), start // k).unbind(0)
        else:
            out.append(flat.as_strided(shape, strides, start // k))
        i = j
    return out


class ArchiveStore(Store):
    """A ``.tdz`` archive, mapped once: stored leaves are views of the mapping, the rest copies."""

    root = ""
    defers = True

    def __init__(self, ar: Archive, robust: bool, allow_pickle: bool | None, num_threads: int = 0) -> None:
        super().__init__(robust, allow_pickle)
        self.ar = ar
        self.num_threads = num_threads

    def where(self, level: str, name: str = "") -> str:
        return f"{self.ar.path}:{level}{name}" if level or name else self.ar.path

    def sub(self, level: str, name: str) -> str:
        return f"{level}{name}/"

    def _locate(self, level: str, key: str, suffix: str) -> str | None:
        for name in self.candidates(key, suffix, False):
            if level + name in self.ar.entries:
                return level + name
        return None

    def read_meta(self, level: str) -> dict:
        name = level + META_FILE
        if name not in self.ar.entries:
            if level == "":
                raise InvalidArgumentError(
                    f"{self.ar.path!r} is a zip file but not a memory-mapped tensordict archive: it has no "
                    f"top-level {META_FILE} entry."
                )
            raise MissingMetadataError(f"No saved tensordict in {self.where(level)!r}: {META_FILE} is missing.")
        return loads_json(self.ar.read(name), self.where(level, META_FILE))

    def has_level(self, level: str) -> bool:
        return level + META_FILE in self.ar.entries

    def child(self, level: str, key: str) -> str | None:
        if self.robust:  # the robust name first, as candidates() orders them: one lookup
            sub = f"{level}{key if key.isidentifier() else encode_key(key)}/"
            if sub + META_FILE in self.ar.entries:
                return sub
        for name in self.candidates(key, "", True):
            if self.has_level(f"{level}{name}/"):
                return f"{level}{name}/"
        return None

    def members(self, level: str) -> Iterator[str]:
        found: set[int] = set()
        for name in self.ar.entries:
            if name.startswith(level) and "/" in name[len(level) :]:
                first = name[len(level) :].split("/", 1)[0]
                if first.isdigit() and str(int(first)) == first:
                    found.add(int(first))
        yield from checked_members(self, level, found, lambda i: f"{level}{i}/")

    def _read_pickle(self, level: str, name: str) -> Any:
        if level + name not in self.ar.entries:
            raise CorruptDataError(f"The pickled non-tensor value {self.where(level, name)!r} is missing.")
        return pickle.loads(self.ar.read(level + name))

    def default_device(self, meta: dict) -> torch.device | None:
        return _CPU  # an archive is always read into cpu memory

    def annotate(self, td: Any, level: str, meta: dict) -> None:
        """Nothing: an archive's levels are not memory-mapped folders (no ``memmap_`` target, no refresh)."""

    def open_leaves(
        self, level: str, infos: list[LeafInfo], meta_where: str, current: dict[str, Any]
    ) -> dict[str, Any]:
        """Every leaf of a level, with one fused loop for the common case.

        A stored, aligned entry under its robust name whose size matches becomes a view of the
        mapping here directly (loading thousands of small leaves is bound by per-leaf Python
        work); anything else (nested, empty, legacy name, compressed, misaligned, wrong size)
        goes through :meth:`open_leaf`, which copies or raises the precise error.
        """
        if not self.robust:
            return super().open_leaves(level, infos, meta_where, current)
        ar = self.ar
        get, prod = ar.entries.get, math.prod
        out: dict[str, Any] = {}
        spots: list[tuple[int, str, tuple[int, ...], torch.dtype]] = []  # (payload offset, key, shape, dtype)
        for info in infos:
            key, shape, dtype, nested = info
            e = None if nested else get(f"{level}{key if key.isidentifier() else encode_key(key)}{LEAF_SUFFIX}")
            if e is not None:
                _, method, _, _, _, size, _, data, _ = e
                k = dtype.itemsize
                if not method and not data % k and size == prod(shape) * k and size:
                    spots.append((data, key, shape, dtype))
                    continue
            out[key] = self.open_leaf(level, info, meta_where)
        spots.sort(key=_OFFSET)
        path, ino, mode = ar.path, ar.ino, "r+" if ar.mode == "r+" else "r"
        make, mmt = torch.Tensor._make_subclass, MemoryMappedTensor  # detached: no multi-output view (unbind)
        for (data, key, _, _), view in zip(spots, _views(ar, spots), strict=True):
            leaf = make(mmt, view)
            leaf._filename, leaf._offset, leaf._ino, leaf._mode = path, data, ino, mode
            out[key] = leaf
        return out

    def open_leaf(self, level: str, info: LeafInfo, meta_where: str, old: Any = None) -> Any:
        """A zero-copy view of a stored entry; a copy when misaligned; a :class:`Deferred` when compressed."""
        ar = self.ar
        if info.is_nested:
            return self._nested(level, info, meta_where)
        if info.numel == 0:
            return empty_leaf(info)
        name = self._locate(level, info.key, LEAF_SUFFIX)
        if name is None:
            raise self.missing_leaf(level, info, meta_where)
        e = ar.entries[name]
        if e.size != info.nbytes:
            raise CorruptDataError(
                f"{self.where(name)} holds {e.size} bytes but {meta_where} expects {info.nbytes} "
                f"(shape {list(info.shape)}, {info.dtype})."
            )
        view = ar.view(e, info.dtype, info.shape)
        if view is not None:
            out = MemoryMappedTensor._wrap(view, ar.path, None, "r+" if ar.mode == "r+" else "r")
            out._offset, out._ino = e.data, ar.ino
            return out
        if ar.mode == "r+":
            why = f"compressed ({METHOD_NAMES.get(e.method, e.method)})" if e.method else "not aligned for its dtype"
            raise MemmapError(
                f"Cannot open {ar.path!r} with mode='r+': entry {name!r} is {why}, so writes could not reach the "
                "file. Load it with mode='r', or save the archive uncompressed."
            )
        return Deferred(e, info) if e.method else ar.copy(e).view(info.dtype).view(info.shape)

    def _nested(self, level: str, info: LeafInfo, meta_where: str) -> torch.Tensor:
        """A nested tensor (reference layout: values in ``k.memmap``, sizes in ``k.shape.memmap``), copied."""
        sizes_name = self._locate(level, info.key, ".shape" + LEAF_SUFFIX)
        values_name = self._locate(level, info.key, LEAF_SUFFIX)
        if self.ar.mode == "r+" or len(info.shape) != 2 or sizes_name is None or values_name is None:
            raise CorruptDataError(
                f"{meta_where}: the nested leaf {info.key!r} is malformed or cannot be opened with mode='r+'."
            )
        raw_sizes = self.ar.copy(self.ar.entries[sizes_name])
        if raw_sizes.numel() != info.numel * 8:
            raise CorruptDataError(
                f"{self.where(sizes_name)} holds {raw_sizes.numel()} bytes, expected {info.numel * 8}."
            )
        sizes = raw_sizes.view(torch.int64).view(info.shape).tolist()
        values = self.ar.copy(self.ar.entries[values_name]).view(info.dtype)
        counts = [int(torch.Size(row).numel()) for row in sizes]
        if sum(counts) != values.numel():
            raise CorruptDataError(
                f"{self.where(values_name)} does not hold the {sum(counts)} elements its sizes need."
            )
        if info.is_nested == "jagged":
            return jagged_from_buffer(values, torch.tensor(sizes, dtype=torch.int64))
        return torch.nested.nested_tensor([v.reshape(row) for v, row in zip(values.split(counts), sizes, strict=True)])

    def finish(self, device: torch.device | None) -> None:
        """Decompress (and CRC-check) the deferred leaves, on ``num_threads`` threads."""
        entries = [p.entry for _, _, p in self.pending]
        if self.num_threads > 1 and len(entries) > 1:
            data = results([pool(self.num_threads).submit(self.ar.copy, e) for e in entries])
        else:
            data = [self.ar.copy(e) for e in entries]
        for (values, key, p), raw in zip(self.pending, data, strict=True):
            t = raw.view(p.info.dtype).view(p.info.shape)
            values[key] = t if device is None else t.to(device)
        self.pending.clear()
