"""The plan of a save, and the write half that every backend implements.

:func:`plan_tree` walks the tree once (through :mod:`tdshare._nodes`) and returns one
:class:`PlannedLevel` per collection level: its ``meta.json`` entries, its tensor leaves with
their files, its non-tensor values encoded, its child levels.  Every backend writes from the
same plan: a folder and anonymous memory (:mod:`tdshare._write`), a ``.tdz`` archive
(:mod:`tdshare._archive`).  A bad key, dtype, existing file or pickle therefore raises before
anything is created, whatever the target.

A backend's write half is a :class:`TreeWriter`: its capabilities are data (``unsupported``: the
options it refuses, with the error), and :func:`tdshare._save.save_tree` checks them before the
backend plans anything.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch

from ._errors import FileExistsRuntimeError, InvalidArgumentError, NotSupportedError
from ._files import no_data_error
from ._format import (
    JAGGED_FIELD,
    LEAF_SUFFIX,
    LEVEL,
    PICKLE_FILE,
    PLAIN_KEY_MAX,
    RESERVED_KEYS,
    STACK,
    STACK_PICKLE_FILE,
    VALUE,
    VALUE_STACK,
    WRAPPED,
    WRAPPED_DIR,
    dumps_json,
    dumps_level,
    entry_file_name,
    lazy_stack_meta,
    leaf_entry,
    level_meta,
    shared_leaf_entry,
)
from ._lazy_leaves import PendingLeaf, raw_items
from ._leaf_files import LeafPlan, plain_leaf
from ._level_schema import LevelSchema, SchemaCache
from ._memmap import MemoryMappedTensor, already_mapped
from ._nodes import NodeKind, kind_of
from ._nontensor import NonTensorData
from ._nontensor_files import encode_nontensor, encode_nontensor_stack
from ._options import SaveOptions, Unsupported
from ._tensordict_base import TensorDictBase

__all__ = [
    "PlannedLeaf",
    "PlannedValue",
    "PlannedWrapper",
    "PlannedLevel",
    "plan_tree",
    "encode_value",
    "TreeWriter",
    "LevelEncodings",
]

_STRIDED = torch.strided
_Tensor = torch.Tensor


@dataclass(slots=True)
class PlannedLeaf:
    """A tensor leaf to write: its source, its file (None: anonymous memory), the result once written."""

    key: str
    src: torch.Tensor  # a reused leaf not mapped yet has its PendingLeaf here (only ``reuse`` is read then)
    path: str | None
    reuse: MemoryMappedTensor | PendingLeaf | None = None
    result: MemoryMappedTensor | PendingLeaf | None = None
    part: bool = False  # one of the two files of a nested tensor (see PlannedLevel.nested), not a leaf itself


@dataclass
class PlannedValue:
    """A non-tensor value to write: its folder and its encoded ``meta.json`` (and pickle)."""

    key: str
    value: NonTensorData
    path: str | None
    meta: bytes = b""
    pickled: bytes | None = None
    store: str | None = None  # the runtime store of an anonymous tree sharing the value (path is in it)
    pickle_name: str = PICKLE_FILE  # a NonTensorStack's pickle is pickle.pkl


@dataclass
class PlannedWrapper:
    """A wrapped collection to write (a :data:`~tdshare._format.WRAPPED` kind, e.g. a tensorclass):
    its folder's ``meta.json`` (``_type`` and the kind's fields) and the collection in ``_tensordict/``."""

    key: str
    value: Any
    path: str | None
    kind: NodeKind
    fields: dict[str, Any]
    inner: PlannedLevel
    meta: bytes = b""


@dataclass
class PlannedLevel:
    """One collection level to write: its entries, leaves, values and child levels."""

    src: TensorDictBase
    path: str | None
    entries: dict[str, dict] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # the JSON of the leaf entries (dumps_level)
    leaves: list[PlannedLeaf] = field(default_factory=list)
    # nested tensors: (key, packed elements, size table), both also in ``leaves`` as parts
    # (jagged: whether it came from the jagged layout, and is installed so again)
    nested: list[tuple[str, PlannedLeaf, PlannedLeaf, bool]] = field(default_factory=list)
    # plain leaves, the common case, kept lean: dense non-empty tensors under keys that are their file names
    plain_keys: list[str] = field(default_factory=list)
    plain: list[tuple[torch.Tensor, str, LeafPlan]] = field(default_factory=list)  # (tensor, file, info)
    plain_out: Sequence[MemoryMappedTensor | PendingLeaf] = field(default_factory=list)  # their leaves, once written
    nontensors: list[PlannedValue] = field(default_factory=list)
    wrapped: list[PlannedWrapper] = field(default_factory=list)
    children: list[tuple[str, PlannedLevel]] = field(default_factory=list)
    share: bool = False  # install non-tensor leaves as SharedNonTensorData (share_non_tensor=True)
    names: list | None = None  # the dim names written to meta.json (see _inherit_names)
    empty: bool = False  # its folder held nothing when this write began (made by it, or found empty)
    # a lazy stack (a STACK kind): ``children`` are its members "0", "1"..., ``stack_meta`` its meta.json
    stack: NodeKind | None = None
    stack_meta: bytes = b""
    # a level of plain leaves only, planned as the equal levels before it: their shared schema
    schema: LevelSchema | None = None

    def walk(self) -> list[PlannedLevel]:
        """Every level, children before their parent."""
        out: list[PlannedLevel] = []
        self._walk_into(out)
        return out

    def _walk_into(self, out: list[PlannedLevel]) -> None:
        add = out.append
        for _, child in self.children:
            if child.children or child.wrapped:
                child._walk_into(out)
            else:  # a level without sub-levels (a lazy stack's thousand members): no call
                add(child)
        for w in self.wrapped:
            w.inner._walk_into(out)
        add(self)


class LevelEncodings:
    """The ``meta.json`` of the levels of one write, made once per distinct level.

    Levels of leaves only whose entries, batch size and dim names are equal (a lazy stack's
    members, usually) share one metadata dict (what each remembers as seen: it is never changed)
    and one encoding of it.

    >>> enc = LevelEncodings()
    >>> import tdshare
    >>> a, b = (plan_tree(tdshare.TensorDict(x=torch.ones(2)), f"/x/{i}", True, False, False) for i in "ab")
    >>> enc.meta(a) is enc.meta(b), enc.data(a) is enc.data(b)
    (True, True)
    >>> tree = tdshare.TensorDict(a=tdshare.TensorDict(x=torch.ones(2)), b=tdshare.TensorDict(x=torch.zeros(2)))
    >>> a, b = (level for _, level in plan_tree(tree, "/x", True, False, True).children)  # one schema
    >>> a.schema is b.schema, enc.meta(a) is enc.meta(b), enc.data(a) is enc.data(b)
    (True, True, True)
    """

    def __init__(self) -> None:
        self._seen: dict[Any, list[Any]] = {}  # key (or schema) -> [metadata dict, its bytes or None]
        self._last: tuple[PlannedLevel | None, list[Any]] = (None, [])  # meta() then data() of one level

    def _entry(self, level: PlannedLevel) -> list[Any]:
        if self._last[0] is level:
            return self._last[1]
        hit = self._lookup(level)
        self._last = (level, hit)
        return hit

    def _lookup(self, level: PlannedLevel) -> list[Any]:
        key: Any = (id(level),)  # a level with other entries: its own (it lives as long as the write)
        schema = level.schema
        if schema is not None:  # planned through its schema, which holds both (keyed by itself)
            hit = self._seen.get(schema)
            if hit is None:
                hit = self._seen[schema] = [schema.meta, schema.data]
            return hit
        if len(level.texts) == len(level.entries):  # every entry a leaf whose JSON text is known
            names = level.names
            key = (tuple(level.texts.items()), tuple(level.src.batch_size), None if names is None else tuple(names))
        hit = self._seen.get(key)
        if hit is None:
            hit = self._seen[key] = [level_meta(level.entries, level.src.batch_size, level.names), None]
        return hit

    def meta(self, level: PlannedLevel) -> dict:
        """The metadata of ``level`` (a collection level), as its ``meta.json`` holds it."""
        return self._entry(level)[0]

    def data(self, level: PlannedLevel) -> bytes:
        """The bytes of ``level``'s ``meta.json``."""
        entry = self._entry(level)
        if entry[1] is None:
            entry[1] = dumps_level(level.entries, level.texts, level.src.batch_size, level.names)
        return entry[1]


def _same_file(t: MemoryMappedTensor, path: str) -> bool:
    return (
        t._filename == path
        and t._mode != "r"
        and t.storage_offset() == 0
        and t.is_contiguous()
        and t.numel() * t.dtype.itemsize == t.untyped_storage().nbytes()
    )


def plan_tree(
    td: TensorDictBase,
    path: str | None,
    robust: bool,
    copy_existing: bool,
    existsok: bool,
    where: str = "the tensordict",
    parent_names: list | None = None,
    schemas: SchemaCache | None = None,
) -> PlannedLevel:
    """Plan the save of ``td`` into ``path``: every file name, key, dtype, existing file and pickle
    checked, nothing touched on disk.

    ``path`` None plans anonymous memory (no names), ``""`` an archive (paths relative to its
    root).  ``where`` names the level in messages.  ``schemas``: the schemas of the levels planned
    so far in this write (a level of plain leaves only, into a folder, is planned as the equal
    level before it: :mod:`tdshare._level_schema`).

    Raises:
        InvalidArgumentError: a key that cannot be a file name, two keys stored under one name.
        MemmapError: a leaf mapped to another file without ``copy_existing``.
        FileExistsRuntimeError: an existing file with ``existsok=False`` (a ``MemmapError``).
        NotSupportedError: a nested or sparse tensor, a kind of node that cannot be saved.
    """
    own = kind_of(td)
    if own is not None and own.layout == STACK:
        return _plan_stack(td, own, path, robust, copy_existing, existsok, where, schemas)
    level = PlannedLevel(td, path, names=_inherit_names(td, parent_names))
    head = path + os.sep if path and robust and existsok else None
    if head is not None:
        if schemas is None:
            schemas = SchemaCache()
        schema = schemas.of(td._tensordict, tuple(td.batch_size), level.names)
        if schema is not None:  # plain leaves only (the many small levels of a large tree)
            values = list(dict.values(td._tensordict))
            level.schema = schema
            level.plain_keys = list(schema.keys)
            level.plain = list(zip(values, [head + name for name in schema.files], schema.infos, strict=True))
            level.entries, level.texts = schema.entries, schema.texts  # shared: never changed
            return level
    used: dict[str, str] = {}  # file name -> key: a leaf "a" and a folder "a.memmap" would collide
    plain_keys, plain, entries, texts = level.plain_keys, level.plain, level.entries, level.texts
    for key, value in raw_items(td._tensordict):  # a leaf not mapped yet stays so (see _plan_pending)
        if type(value) is PendingLeaf:
            value = _plan_pending(level, key, value, path, robust, copy_existing, existsok, where, used)
            if value is None:
                continue
        if (  # the common leaf, in few steps: a plain dense tensor under a _plain_key (written out)
            head is not None
            and type(value) is _Tensor
            and value.layout is _STRIDED
            and not value.is_nested
            and key.isidentifier()
            and len(key) <= PLAIN_KEY_MAX
            and key not in RESERVED_KEYS
        ):
            name = key + LEAF_SUFFIX
            entry, text, info = plain_leaf(value.shape, value.dtype)
            if info.numel and name not in used:
                used[name] = key
                plain_keys.append(key)
                plain.append((value, head + name, info))
                entries[key], texts[key] = entry, text
                continue
        kind = kind_of(value)
        if kind is None and value.is_nested:
            _plan_nested(level, key, value, path, robust, existsok, where, used)
            continue
        if kind is None and path is None:  # anonymous memory: no file name, no metadata entry
            level.leaves.append(_plan_leaf(key, value, None, copy_existing, existsok, where))
            continue
        name = entry_file_name(key, robust, LEAF_SUFFIX if kind is None else "", where, directory=kind is not None)
        if kind is None:
            name += LEAF_SUFFIX
        if name in used:
            raise InvalidArgumentError(
                f"The keys {used[name]!r} and {key!r} (in {where}) would both be stored as {name!r}; rename one."
            )
        used[name] = key
        sub = None if path is None else (path + os.sep + name if path else name)  # "" plans an archive
        if kind is None:
            level.leaves.append(_plan_leaf(key, value, sub, copy_existing, existsok, where))
            entries[key], texts[key] = shared_leaf_entry(value.shape, value.dtype)
            continue
        here = _here(where, key)
        if kind.layout == LEVEL:
            child = plan_tree(value, sub, robust, copy_existing, existsok, here, level.names, schemas)
            level.children.append((key, child))
        elif kind.layout == STACK:
            level.children.append((key, plan_tree(value, sub, robust, copy_existing, existsok, here, None, schemas)))
        elif kind.layout in (VALUE, VALUE_STACK):
            nt = PlannedValue(key, value, sub)
            if path is not None:
                nt.meta, nt.pickled, nt.pickle_name = encode_value(value, here)
            level.nontensors.append(nt)
        elif kind.layout == WRAPPED and kind.unwrap is not None and kind.type_tag is not None:
            inner, fields = kind.unwrap(value)
            inner_path = None if sub is None else sub + os.sep + WRAPPED_DIR
            planned = plan_tree(inner, inner_path, robust, copy_existing, existsok, here, level.names, schemas)
            w = PlannedWrapper(key, value, sub, kind, fields, planned)
            if path is not None:
                w.meta = dumps_json({"_type": kind.type_tag, **fields})
            level.wrapped.append(w)
        else:
            raise NotSupportedError(f"The entry {here} is a {kind.name}, which tdshare cannot save yet.")
        entries[key] = kind.entry
    return level


def _plan_stack(
    td: Any,
    kind: NodeKind,
    path: str | None,
    robust: bool,
    copy_existing: bool,
    existsok: bool,
    where: str,
    schemas: SchemaCache | None,
) -> PlannedLevel:
    """Plan a lazy stack: its members as the levels ``0/``, ``1/``... and its own ``meta.json``."""
    if kind.unwrap is None:
        raise NotSupportedError(f"{where} is a {kind.name}, which tdshare cannot save yet.")
    members, fields = kind.unwrap(td)
    level = PlannedLevel(td, path, stack=kind)
    for i, member in enumerate(members):
        sub = None if path is None else (path + os.sep + str(i) if path else str(i))
        here = f"member {i}" if where == "the tensordict" else f"{where} member {i}"
        level.children.append((str(i), plan_tree(member, sub, robust, copy_existing, existsok, here, None, schemas)))
    if path is not None:
        level.stack_meta = dumps_json(lazy_stack_meta(fields["stack_dim"], fields.get("stack_dim_name")))
    return level


def encode_value(value: NonTensorData, where: str) -> tuple[bytes, bytes | None, str]:
    """The ``meta.json`` bytes, the pickle (or None) and the pickle's file name of a non-tensor node.

    Raises:
        NotSupportedError: an ``UnbatchedTensor`` entry (the reference cannot save one either).
    """
    if value._tensor_payload:
        raise NotSupportedError(
            f"The entry {where} is an UnbatchedTensor, which cannot be memory-mapped or saved (tensordict 0.15.3 "
            "refuses it too: it would load back as a batched tensor). Exclude it first (td.exclude(key)) and "
            "store it beside the folder, or memory-map without a prefix (memmap_() keeps it in memory)."
        )
    kind = kind_of(value)
    if kind is not None and kind.layout == VALUE_STACK:
        meta, pickled = encode_nontensor_stack(value.tolist(), where)
        return meta, pickled, STACK_PICKLE_FILE
    meta, pickled = encode_nontensor(value.data, where)
    return meta, pickled, PICKLE_FILE


def _inherit_names(td: TensorDictBase, parent_names: list | None) -> list | None:
    """A nested level's dim names: its parent's, then its own for its extra batch dims.

    The reference writes them so and refuses to load a nested level whose names do not
    extend its parent's."""
    if parent_names is None:
        return td._names
    return list(parent_names) + td.names[len(parent_names) :]


def _here(where: str, key: str) -> str:
    return f"{where}[{key!r}]" if where != "the tensordict" else f"key {key!r}"


def _plan_nested(
    level: PlannedLevel,
    key: str,
    value: torch.Tensor,
    path: str | None,
    robust: bool,
    existsok: bool,
    where: str,
    used: dict[str, str],
) -> None:
    """A strided nested tensor, in the reference's layout: its elements packed one piece after the
    other in ``<key>.memmap``, its pieces' shapes in ``<key>.shape.memmap`` (int64 ``[pieces, ndim]``),
    and ``"is_nested": true`` with the table's shape in meta.json."""
    here = _here(where, key)
    jagged = value.layout is torch.jagged
    if value.layout is not _STRIDED and not jagged:
        raise NotSupportedError(
            f"The entry {here} is a nested tensor with the {value.layout} layout, which the saved format cannot "
            "hold; convert it to the strided or jagged layout."
        )
    if value.device.type == "meta":
        raise no_data_error(f"The entry {here}")
    pieces = [p.detach().contiguous() for p in value.unbind()]
    ndim = value.dim() - 1
    sizes = torch.tensor([list(p.shape) for p in pieces], dtype=torch.int64).reshape(len(pieces), ndim)
    packed = torch.cat([p.reshape(-1) for p in pieces]) if pieces else torch.empty(0, dtype=value.dtype)
    data_file = sizes_file = None
    if path is not None:
        name = entry_file_name(key, robust, LEAF_SUFFIX, where, directory=False)
        for file in (name + LEAF_SUFFIX, name + ".shape" + LEAF_SUFFIX):
            if file in used:
                raise InvalidArgumentError(
                    f"The keys {used[file]!r} and {key!r} (in {where}) would both be stored as {file!r}; rename one."
                )
            used[file] = key
        head = path + os.sep if path else ""
        data_file, sizes_file = head + name + LEAF_SUFFIX, head + name + ".shape" + LEAF_SUFFIX
        for file in (data_file, sizes_file):
            if not existsok and os.path.lexists(file):
                raise FileExistsRuntimeError(
                    f"The file {file!r} already exists and existsok=False. Pass existsok=True to overwrite it."
                )
        level.entries[key] = leaf_entry(sizes.shape, value.dtype, is_nested=True)
        if jagged:  # the reference reads the same files as a strided nested tensor
            level.entries[key][JAGGED_FIELD] = True
    data = PlannedLeaf(key, packed, data_file, part=True)
    table = PlannedLeaf(key, sizes, sizes_file, part=True)
    level.leaves += [data, table]
    level.nested.append((key, data, table, jagged))


def _plan_pending(
    level: PlannedLevel,
    key: str,
    value: PendingLeaf,
    path: str | None,
    robust: bool,
    copy_existing: bool,
    existsok: bool,
    where: str,
    used: dict[str, str],
) -> torch.Tensor | None:
    """Plan a leaf not mapped yet without mapping it: kept as it is when it already is its file
    in ``path`` (None returned: planned), else its bytes to copy (read from its file)."""
    if path and value.path is not None and value.segment is None and value.numel:
        name = entry_file_name(key, robust, LEAF_SUFFIX, where, directory=False) + LEAF_SUFFIX
        file = path + os.sep + name
        if value.path == file and value.mode != "r":
            if name in used:
                raise InvalidArgumentError(
                    f"The keys {used[name]!r} and {key!r} (in {where}) would both be stored as {name!r}; rename one."
                )
            if not existsok:
                raise FileExistsRuntimeError(
                    f"The file {file!r} already exists and existsok=False (the leaf already maps it: existsok=True "
                    "keeps that file and writes nothing). Pass existsok=True to overwrite it."
                )
            used[name] = key
            leaf = PlannedLeaf(key, cast(torch.Tensor, value), file)
            leaf.reuse = value
            level.leaves.append(leaf)
            level.entries[key], level.texts[key] = shared_leaf_entry(value.shape, value.dtype)
            return None
        if value.path != file and not copy_existing:
            raise already_mapped(f"the entry {_here(where, key)}", value.path, file)
    return value.copy_out()


def _plan_leaf(
    key: str, value: torch.Tensor, file: str | None, copy_existing: bool, existsok: bool, where: str
) -> PlannedLeaf:
    if value.layout != torch.strided:
        raise NotSupportedError(
            f"The entry {_here(where, key)} is a sparse tensor ({value.layout}), which the saved format cannot hold; "
            "store its indices and values as dense tensors."
        )
    leaf = PlannedLeaf(key, value, file)
    if type(value) is not torch.Tensor and isinstance(value, MemoryMappedTensor):
        here = _here(where, key)
        if file is None and value._segment is not None:
            leaf.reuse = value
        elif file is not None and _same_file(value, file):
            leaf.reuse = value
        elif file is not None and value._filename not in (None, file) and value._offset is None and not copy_existing:
            raise already_mapped(f"the entry {here}", value._filename, file)
    if not existsok and file is not None and os.path.lexists(file):  # the leaf's own file too, as the page says
        own = ""
        if leaf.reuse is not None:
            own = " (the leaf already maps it: existsok=True keeps that file and writes nothing)"
        raise FileExistsRuntimeError(
            f"The file {file!r} already exists and existsok=False{own}. Pass existsok=True to overwrite it."
        )
    return leaf


class TreeWriter(ABC):
    """The write half of a backend (a folder, an archive, anonymous memory).

    ``unsupported`` maps each option of :class:`SaveOptions` the backend cannot honour to the
    exception raised when it is set; :meth:`check` raises it before anything is planned.
    """

    name: ClassVar[str]
    unsupported: ClassVar[Unsupported]

    def check(self, opts: SaveOptions) -> None:
        """Refuse the options this backend cannot honour (the first set one, in declaration order)."""
        opts.refuse(self.unsupported)

    @abstractmethod
    def save(self, td: Any, opts: SaveOptions, *, inplace: bool) -> Any:
        """Write ``td`` (a tensor collection) and return it memory-mapped (``inplace``) or a new one.

        A future (:class:`tdshare.TensorDictFuture`) when the backend writes in the background.
        """
