"""Level schemas: what equal levels of a save share, planned and encoded once.

A tree of many small leaves is usually many levels of the same shape: the hundred folders of a
replay buffer, the members of a lazy stack.  Their leaves have the same keys, dtypes and shapes
in the same order, and the levels the same batch size and dim names, so everything a write
derives from those (each leaf's metadata entry, its JSON text and its
:class:`~tdshare._leaf_files.LeafPlan`, each file's name, the level's metadata dict and its
encoded ``meta.json``) is the same too.  A :class:`LevelSchema` holds it once; a
:class:`SchemaCache` finds a level's schema with one pass over its values, checking only what
could differ (each value a plain dense tensor of the schema's dtype and shape) against the
schema the previous level had.  The general writer (:func:`tdshare._plan.plan_tree`) and the lazy
stack's writer (:mod:`tdshare._stack_write`) both plan their levels through it.

A schema covers a level whose every entry is a non-empty, dense, non-nested ``torch.Tensor``
(not a subclass: a memory-mapped tensor may be reused in place) under a plain key
(:func:`tdshare._format.plain_key`: the key is its own file name); any other level is planned
entry by entry, which writes the same bytes.
"""

from __future__ import annotations

from typing import Any

import torch

from ._format import LEAF_SUFFIX, dumps_level, level_meta, plain_key
from ._leaf_files import LeafPlan, plain_leaf

__all__ = ["LevelSchema", "SchemaCache"]

_Tensor = torch.Tensor
_STRIDED = torch.strided


class LevelSchema:
    """The keys, dtypes and shapes of a level's leaves, its batch size and dim names, and all
    that a write derives from them (see the module docstring).

    The dicts are shared by every level of the schema and must never be changed.
    """

    __slots__ = ("_data", "batch", "dims", "dtypes", "entries", "files", "infos", "keys", "meta", "shapes", "texts")

    def __init__(
        self, keys: tuple[str, ...], values: list[torch.Tensor], batch: tuple[int, ...], dims: tuple | None
    ) -> None:
        self.keys = keys
        self.dtypes = [v.dtype for v in values]
        self.shapes = [v.shape for v in values]
        self.batch = batch
        self.dims = dims
        self.files = [key + LEAF_SUFFIX for key in keys]
        self.entries: dict[str, dict] = {}
        self.texts: dict[str, str] = {}
        self.infos: list[LeafPlan] = []
        for key, value in zip(keys, values, strict=True):
            self.entries[key], self.texts[key], info = plain_leaf(value.shape, value.dtype)
            self.infos.append(info)
        names = None if dims is None else list(dims)
        self.meta = level_meta(self.entries, batch, names)  # what each level remembers as seen
        self._data: bytes | None = None

    @property
    def data(self) -> bytes:
        """The bytes of the ``meta.json`` of every level of this schema."""
        if self._data is None:
            names = None if self.dims is None else list(self.dims)
            self._data = dumps_level(self.entries, self.texts, self.batch, names)
        return self._data

    def matches(self, keys: tuple[str, ...], values: list[Any], batch: tuple[int, ...], dims: tuple | None) -> bool:
        """Whether a level of these keys, values, batch size and dim names has this schema."""
        if keys != self.keys or batch != self.batch or dims != self.dims:
            return False
        for v, dtype, shape in zip(values, self.dtypes, self.shapes, strict=True):
            if type(v) is not _Tensor or v.dtype is not dtype or v.shape != shape or v.layout is not _STRIDED:
                return False
            if v.is_nested:
                return False
        return True


class SchemaCache:
    """The schemas of one write: a level's is found by comparing it with the previous level's,
    then with every distinct one seen (by keys); a new one is made when the level is covered.

    >>> import torch
    >>> cache = SchemaCache()
    >>> a = cache.of({"x": torch.ones(2)}, (), None)
    >>> a is cache.of({"x": torch.zeros(2)}, (), None), cache.of({"x": torch.ones(3)}, (), None) is a
    (True, False)
    >>> cache.of({"x": torch.ones(0)}, (), None) is None  # an empty leaf: planned entry by entry
    True
    """

    __slots__ = ("_by_keys", "_last", "_plain")

    def __init__(self) -> None:
        self._last: LevelSchema | None = None
        self._by_keys: dict[tuple[str, ...], list[LevelSchema]] = {}
        self._plain: dict[str, bool] = {}  # key -> plain_key(key), for the keys of new schemas

    def of(self, entries: dict, batch: tuple[int, ...], dims: list | None) -> LevelSchema | None:
        """The schema of the level whose ``_tensordict`` is ``entries`` (read raw: a pending leaf
        is no plain tensor), batch size ``batch`` and dim names ``dims``; None when not covered."""
        keys = tuple(dict.keys(entries))
        if not keys:
            return None
        values = list(dict.values(entries))
        dim_key = None if dims is None else tuple(dims)
        last = self._last
        if last is not None and last.matches(keys, values, batch, dim_key):
            return last
        same_keys = self._by_keys.get(keys)
        for schema in same_keys or ():
            if schema is not last and schema.matches(keys, values, batch, dim_key):
                self._last = schema
                return schema
        if not self._covered(keys, values):
            return None
        schema = LevelSchema(keys, values, batch, dim_key)
        self._by_keys.setdefault(keys, []).append(schema)
        self._last = schema
        return schema

    def _covered(self, keys: tuple[str, ...], values: list[Any]) -> bool:
        plain = self._plain
        for key, v in zip(keys, values, strict=True):
            ok = plain.get(key)
            if ok is None:
                ok = plain[key] = plain_key(key)
            if not ok or type(v) is not _Tensor or v.layout is not _STRIDED or v.is_nested or not v.numel():
                return False
        return True
