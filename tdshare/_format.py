"""The on-disk format, shared with tensordict 0.15.3 (the writer and the reader both use this module).

Layout
------
A saved TensorDict is a directory per nesting level. Each level holds:

``meta.json``
    A JSON object.  First one entry per key, in insertion order:

    * a tensor leaf: ``{"device": "cpu", "shape": [...], "dtype": "torch.float32", "is_nested": false}``;
    * a nested collection: ``{"type": "TensorDict"}`` (or ``"NonTensorData"``...), a marker only:
      the nested level's own ``meta.json`` says what it is.

    Then the level's fields: ``"shape"`` (the batch size), ``"device"`` (``"cpu"``), ``"_type"``
    (``"<class 'tensordict._td.TensorDict'>"``), ``"_format_version"`` (1), ``"_class"``
    (``"tensordict:TensorDict"``) and, when the batch dimensions are named, ``"_names"``.
    Keys equal to a field name are refused at save time (the reference silently loses them).
    Files without ``_format_version`` are version 0 and read the same way.  tdshare adds one
    field of its own, ``"_tdshare_journal": true``, to a level before it first appends to the
    level's ``meta.jsonl`` (see :mod:`tdshare._journal`): a level without it has no record, so
    a lazy stack's members are loaded without a probe for one (tensordict skips a field whose
    value is not an object).

``<enc(key)>.memmap``
    One file per non-empty tensor leaf: the raw elements in C order, native byte order, no
    header.  Its size must be exactly ``numel * itemsize``.  Zero-element leaves have no file.

``<enc(key)>/``
    A nested level.  A non-tensor value is a level whose ``meta.json`` is
    ``{"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": ..., "_metadata": null,
    "_is_non_tensor": true}``; a value that JSON cannot hold is left out of ``meta.json`` and
    pickled into ``other.pickle`` as ``{"data": value}``.

``enc`` is the robust-key encoding of :mod:`tdshare._keys` (or the raw key with
``robust_key=False``).  JSON is written with Python's default separators, ``ensure_ascii`` and
``NaN`` literals, like the reference, and read in either spacing style.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ._errors import CorruptDataError, InvalidArgumentError, LegacyKeyError, UnsupportedFormatError
from ._keys import encode_key, is_safe_legacy_name

__all__ = [
    "FORMAT_VERSION",
    "META_FILE",
    "JOURNAL_FIELD",
    "JOURNAL_FILE",
    "PICKLE_FILE",
    "LEAF_SUFFIX",
    "TD_TYPE",
    "TD_CLASS",
    "NONTENSOR_TYPE",
    "NONTENSOR_STACK_TYPE",
    "LAZY_STACK_TYPE",
    "STACK_PICKLE_FILE",
    "lazy_stack_meta",
    "nontensor_stack_meta",
    "dumps_compact_json",
    "RESERVED_KEYS",
    "NO_FILE_FIELD",
    "JAGGED_FIELD",
    "dtype_to_str",
    "str_to_dtype",
    "leaf_entry",
    "level_meta",
    "nontensor_meta",
    "is_json_value",
    "dumps_json",
    "dumps_level",
    "shared_leaf_entry",
    "loads_json",
    "LevelMeta",
    "LeafInfo",
    "parse_level",
    "LEVEL",
    "LEVEL_FIELDS",
    "VALUE",
    "VALUE_STACK",
    "STACK",
    "WRAPPED",
    "WRAPPED_DIR",
    "layout_of",
    "NAME_MAX",
    "PLAIN_KEY_MAX",
    "plain_key",
    "entry_file_name",
]

FORMAT_VERSION = 1
META_FILE = "meta.json"
PICKLE_FILE = "other.pickle"
#: The append-only record of a level's entries added since its meta.json was last compacted
#: (:mod:`tdshare._journal`); tensordict ignores it and reads meta.json only.
JOURNAL_FILE = "meta.jsonl"
LEAF_SUFFIX = ".memmap"
TD_TYPE = "<class 'tensordict._td.TensorDict'>"
TD_CLASS = "tensordict:TensorDict"
NONTENSOR_TYPE = "<class 'tensordict.tensorclass.NonTensorData'>"
NONTENSOR_STACK_TYPE = "<class 'tensordict.tensorclass.NonTensorStack'>"
LAZY_STACK_TYPE = "<class 'tensordict._lazy.LazyStackedTensorDict'>"
#: the pickle of a NonTensorStack whose values JSON cannot hold (its meta.json "data" names it)
STACK_PICKLE_FILE = "pickle.pkl"
#: Marks a leaf entry whose data has no file (added from a file-less storage): readers drop it.
NO_FILE_FIELD = "_tdshare_no_file"
#: Marks a nested leaf saved from the jagged layout (the reference reads it as strided, ignoring the field).
JAGGED_FIELD = "_tdshare_jagged"
#: Marks a level that may have a record of new entries (``meta.jsonl``): written before its first line.
JOURNAL_FIELD = "_tdshare_journal"
#: Level fields of meta.json: a user key with one of these names would be overwritten by them.
RESERVED_KEYS = frozenset({"shape", "device", "_type", "_format_version", "_class", "_names", JOURNAL_FIELD})
#: The level fields that describe the level itself (a change means it was restructured): all but the record's.
LEVEL_FIELDS = RESERVED_KEYS - {JOURNAL_FIELD}

# -- layouts: what a level's folder holds, as its meta.json says -------------------------------
#: entries of a tensor collection (leaf files, sub-level folders) and the batch fields ("shape"...)
LEVEL = "level"
#: one non-tensor value: ``data`` in meta.json, or ``other.pickle``
VALUE = "value"
#: a stack of non-tensor values: ``data`` (a list, or the name of a pickle), or members ``0/``...
VALUE_STACK = "value-stack"
#: a lazy stack: members in ``0/``, ``1/``... and a ``stack_dim``
STACK = "stack"
#: a class around a collection saved in the ``_tensordict/`` sub-folder (a tensorclass)
WRAPPED = "wrapped"
#: the sub-folder of a wrapped level that holds its collection
WRAPPED_DIR = "_tensordict"
_LAYOUTS = {NONTENSOR_TYPE: VALUE, NONTENSOR_STACK_TYPE: VALUE_STACK, LAZY_STACK_TYPE: STACK}


def layout_of(meta: dict) -> str:
    """The layout (:data:`LEVEL`, :data:`VALUE`, ...) of the level whose meta.json is ``meta``.

    The ``_type`` marker decides; a level with no known marker is a collection when it has a
    batch size (``"shape"``: older writers and version 0), otherwise a wrapped class.

    >>> layout_of({"_type": NONTENSOR_TYPE, "data": 1}), layout_of({"shape": [3]})
    ('value', 'level')
    """
    if meta.get("_is_non_tensor"):
        return VALUE
    tag = meta.get("_type")
    layout = _LAYOUTS.get(tag) if type(tag) is str else None
    if layout is not None:
        return layout
    return LEVEL if "shape" in meta else WRAPPED


# -- file names of entries --------------------------------------------------------------------
NAME_MAX = 255  # bytes in one file name, on every Linux file system
PLAIN_KEY_MAX = 60  # characters: a plain key's file name stays far below NAME_MAX bytes


def plain_key(key: str) -> bool:
    """The common case: a key that is its own robust file name, no field of meta.json and short."""
    return key.isidentifier() and len(key) <= PLAIN_KEY_MAX and key not in RESERVED_KEYS


def entry_file_name(key: str, robust: bool, suffix: str, where: str, directory: bool) -> str:
    """The file name (without ``suffix``) that the entry ``key`` gets in its level's folder.

    ``robust``: percent-encode what a file name cannot hold (:func:`tdshare._keys.encode_key`);
    otherwise the key itself, which must then be a safe name.  ``directory``: the entry is a
    folder (a nested level or a non-tensor value).  ``where`` names the level in messages.

    Raises:
        InvalidArgumentError: a key named like a field of meta.json, one that cannot be a file
            name with ``robust=False``, one that would collide with the level's own files, or one
            whose name is longer than a file name may be.

    >>> entry_file_name("obs", True, ".memmap", "the tensordict", False)
    'obs'
    """
    if robust and plain_key(key):
        return key
    if key in RESERVED_KEYS:
        raise InvalidArgumentError(
            f"The key {key!r} (in {where}) is a field name of meta.json and would be lost on reload; "
            "rename the entry before saving."
        )
    if robust:
        name = encode_key(key)
    else:
        if not is_safe_legacy_name(key, directory=directory):
            as_path = (
                " (written as a path, its folder would be missing: No such file or directory)" if "/" in key else ""
            )
            raise LegacyKeyError(
                f"The key {key!r} (in {where}) cannot be a file name with robust_key=False{as_path}; save with "
                "robust_key=True, which percent-encodes it."
            )
        name = key
    if directory and name in (META_FILE, PICKLE_FILE, JOURNAL_FILE):
        raise InvalidArgumentError(
            f"The nested key {key!r} (in {where}) would collide with the level's own {name}; rename it."
        )
    if len((name + suffix).encode("utf-8")) > NAME_MAX:
        raise InvalidArgumentError(
            f"The key {key[:40]!r}... (in {where}) is too long: its file name {name + suffix!r} exceeds "
            f"{NAME_MAX} bytes. Use a shorter key."
        )
    return name


_DTYPES: dict[str, torch.dtype] = {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def dtype_to_str(dtype: torch.dtype) -> str:
    return str(dtype)


def str_to_dtype(name: object, where: str) -> torch.dtype:
    """Parse a dtype string of meta.json, naming ``where`` (the file) on failure."""
    dtype = _DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise UnsupportedFormatError(
            f"{where}: unknown dtype {name!r}; this torch ({torch.__version__}) knows "
            f"{sorted(_DTYPES)}. Load it with the torch version that wrote it."
        )
    return dtype


def leaf_entry(shape: Sequence[int], dtype: torch.dtype, *, is_nested: bool = False) -> dict:
    return {"device": "cpu", "shape": list(shape), "dtype": str(dtype), "is_nested": is_nested}


@functools.lru_cache(maxsize=1024)
def shared_leaf_entry(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[dict, str]:
    """``leaf_entry(shape, dtype)`` and its JSON, made once per (shape, dtype): levels repeat them.

    The dict is shared by every leaf of that shape and dtype, so it must never be changed.
    """
    entry = leaf_entry(shape, dtype)
    return entry, json.dumps(entry)


def dumps_level(
    entries: dict[str, dict], known: dict[str, str], batch_size: Sequence[int], names: list | None
) -> bytes:
    """``json.dumps(level_meta(entries, batch_size, names)).encode()``, byte for byte, made faster.

    ``known`` maps keys to the JSON text of their entries (leaf entries, from
    :func:`shared_leaf_entry`): a level of thousands of leaves is then mostly joined, not encoded.
    Each run of other entries (sub-levels, non-tensor values) is encoded by one call, and the
    level's own fields, which follow the entries, come from a cache.  No entry may be named like a
    field (the write path refuses such keys), so the fields never replace an entry in place.
    """
    parts: list[str] = []
    run: dict[str, Any] = {}
    get, add = known.get, parts.append
    for key, value in entries.items():
        text = get(key)
        if text is None:
            run[key] = value
            continue
        if run:
            add(json.dumps(run)[1:-1])
            run = {}
        if key.isascii() and key.isidentifier():  # json.dumps writes such a key as is
            add(f'"{key}": {text}')
        else:
            add(f"{json.dumps(key)}: {text}")
    if run:
        add(json.dumps(run)[1:-1])
    add(_fields_json(tuple(batch_size), None if names is None else tuple(names)))
    return ("{" + ", ".join(parts) + "}").encode("utf-8")


@functools.lru_cache(maxsize=256)
def _fields_json(batch_size: tuple[int, ...], names: tuple | None) -> str:
    """The JSON of a level's own fields, as :func:`dumps_level` appends it (without braces)."""
    return json.dumps(level_meta({}, batch_size, None if names is None else list(names)))[1:-1]


def level_meta(entries: dict[str, dict], batch_size: Sequence[int], names: list | None) -> dict:
    """A TensorDict level's meta.json object (entries first, level fields last)."""
    meta: dict[str, Any] = dict(entries)
    meta["shape"] = list(batch_size)
    meta["device"] = "cpu"
    meta["_type"] = TD_TYPE
    meta["_format_version"] = FORMAT_VERSION
    meta["_class"] = TD_CLASS
    if names is not None and any(n is not None for n in names):  # all-None names: none, as the reference
        meta["_names"] = list(names)
    return meta


def is_json_value(value: Any) -> bool:
    """Whether ``value`` is stored inline as JSON: str, int, float, bool, None, lists/tuples of
    such, and dicts with string keys and such values (recursively). Tuples come back as lists."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_json_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json_value(v) for k, v in value.items())
    return False


def nontensor_meta(data: Any, json_ok: bool) -> dict:
    meta: dict[str, Any] = {"_type": NONTENSOR_TYPE}
    if json_ok:
        meta["data"] = data
    meta["_metadata"] = None
    meta["_is_non_tensor"] = True
    return meta


def dumps_json(obj: Any) -> bytes:
    return json.dumps(obj).encode("utf-8")


def dumps_compact_json(obj: Any) -> bytes:
    """JSON without spaces after separators: how the reference writes a NonTensorStack's meta.json."""
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def lazy_stack_meta(stack_dim: int, stack_dim_name: str | None) -> dict:
    """A lazy stack's meta.json (no batch size, no device: the members carry them).

    >>> list(lazy_stack_meta(1, None))
    ['_type', '_format_version', '_class', 'stack_dim', 'stack_dim_name']
    """
    return {
        "_type": LAZY_STACK_TYPE,
        "_format_version": FORMAT_VERSION,
        "_class": "tensordict:LazyStackedTensorDict",
        "stack_dim": stack_dim,
        "stack_dim_name": stack_dim_name,
    }


def nontensor_stack_meta(data: Any) -> dict:
    """A NonTensorStack's meta.json: ``data`` is the nested list, or :data:`STACK_PICKLE_FILE`."""
    return {
        "_type": NONTENSOR_STACK_TYPE,
        "_format_version": FORMAT_VERSION,
        "_class": "tensordict:NonTensorStack",
        "stack_dim": 0,
        "device": None,
        "data": data,
    }


def loads_json(raw: bytes, where: str) -> dict:
    try:
        # UTF-8 text without a BOM (every writer's) skips json's encoding detection on bytes
        obj = json.loads(raw.decode("utf-8") if raw[:1] == b"{" else raw)
    except RecursionError:
        raise CorruptDataError(
            f"{where} nests its JSON too deeply to parse (deeper than Python's recursion limit); no writer "
            "produces that, the file is damaged or hostile. Save the tensordict again."
        ) from None
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptDataError(
            f"{where} is not valid JSON ({err}); the file is truncated or was not written by "
            "tensordict/tdshare. Save the tensordict again."
        ) from None
    if not isinstance(obj, dict):
        raise CorruptDataError(f"{where} must hold a JSON object, found {type(obj).__name__}.")
    version = obj.get("_format_version", 0)
    if isinstance(version, dict):
        version = 0  # a user leaf named "_format_version" (the reference's setdefault kept it): version 0
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CorruptDataError(f"{where}: _format_version must be a non-negative integer, found {version!r}.")
    if version > FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"{where} was saved in format version {version}, but tdshare reads versions up to "
            f"{FORMAT_VERSION}. Upgrade tdshare to load it."
        )
    return obj


class LeafInfo(NamedTuple):
    """One tensor entry of a level (a tuple: parsing thousands of them must cost little)."""

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    is_nested: bool | str  # False, True, or "jagged" (a nested leaf saved from the jagged layout)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class LevelMeta:
    """A parsed TensorDict-level meta.json."""

    leaves: list[LeafInfo]
    children: list[tuple[str, str]]  # (key, marker type name)
    batch_size: tuple[int, ...] | None
    names: list | None
    raw: dict


#: level fields other writers put in a collection's meta.json (not user entries)
_OTHER_FIELDS: frozenset[str] = frozenset()


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_list(value: object, what: str, where: str) -> tuple[int, ...]:
    if type(value) is list:
        if len(value) == 1:  # most leaves: no generator for one number (bool and float refused too)
            v = value[0]
            if type(v) is int and v >= 0:
                return (v,)
        elif all(type(v) is int and v >= 0 for v in value):
            return tuple(value)
    raise CorruptDataError(f"{where}: {what} must be a list of non-negative integers, found {value!r}.")


_new_leaf = tuple.__new__  # LeafInfo(...) runs a Python __new__: this skips it for thousands of leaves


def parse_level(meta: dict, where: str) -> LevelMeta:
    """Validate a TensorDict level's meta.json and split it into leaves and children.

    Leaves added from a file-less storage (``NO_FILE_FIELD``) are left out: no file holds them.
    """
    leaves: list[LeafInfo] = []
    children: list[tuple[str, str]] = []
    add, dtype_of, new_leaf = leaves.append, _DTYPES.get, _new_leaf
    shapes: dict[int, tuple[int]] = {}  # one tuple per 1-d shape: every leaf of that shape shares it
    tuples: dict[tuple[int, ...], tuple[int, ...]] = {}  # and per other shape
    for key, entry in meta.items():
        if type(entry) is dict:
            # the common leaf, in few steps: a known dtype and a shape of one non-negative integer
            shape = entry.get("shape")
            if type(shape) is list and len(shape) == 1 and "type" not in entry:
                v = shape[0]
                name = entry.get("dtype")
                dtype = dtype_of(name) if type(name) is str else None
                if dtype is not None and type(v) is int and v >= 0 and not entry.get(NO_FILE_FIELD):
                    one = shapes.get(v)
                    if one is None:
                        one = shapes[v] = (v,)
                    nested = entry.get("is_nested") is True and ("jagged" if entry.get(JAGGED_FIELD) is True else True)
                    add(new_leaf(LeafInfo, (key, one, dtype, nested)))
                    continue
        else:
            if key in RESERVED_KEYS or key in _OTHER_FIELDS:
                continue  # a level field; a dict under a field name is a user entry the reference kept
            raise CorruptDataError(
                f"{where}: the entry {key!r} must be a JSON object (a leaf's dtype and shape, or a nested "
                f"level's type), found {type(entry).__name__} {_short(entry)}. The file is damaged: save it again."
            )
        if "type" in entry:
            if type(entry["type"]) is not str:
                raise CorruptDataError(
                    f"{where}: the 'type' of the nested entry {key!r} must be a string, found {_short(entry['type'])}."
                )
            children.append((key, entry["type"]))
            continue
        name = entry.get("dtype")
        shape = entry.get("shape")
        if name is None or shape is None:
            if not entry.get(NO_FILE_FIELD) and ("dtype" not in entry or "shape" not in entry):
                missing = [f for f in ("dtype", "shape") if f not in entry]
                raise CorruptDataError(
                    f"{where}: the leaf entry {key!r} has no {' and no '.join(map(repr, missing))} field (it holds "
                    f"{sorted(entry)}); a leaf needs both, a nested level a 'type'. The file is damaged: save it again."
                )
        if entry.get(NO_FILE_FIELD):
            continue
        dtype = (_DTYPES.get(name) if type(name) is str else None) or str_to_dtype(name, where)
        if type(shape) is list and all(type(v) is int and v >= 0 for v in shape):
            shape = tuple(shape)
            shape = tuples.setdefault(shape, shape)  # shared by the leaves of this shape
        else:
            shape = _int_list(shape, f"the shape of {key!r}", where)  # raises
        nested = entry.get("is_nested") is True and ("jagged" if entry.get(JAGGED_FIELD) is True else True)
        add(new_leaf(LeafInfo, (key, shape, dtype, nested)))
    batch = meta.get("shape")
    batch_size = None if batch is None else _int_list(batch, "the batch size ('shape')", where)
    names = meta.get("_names")
    if isinstance(names, dict):
        names = None  # a user entry named "_names": the level has no dim names
    elif names is not None and (
        not isinstance(names, list)
        or (batch_size is not None and len(names) != len(batch_size))
        or not all(n is None or isinstance(n, str) for n in names)
    ):
        raise CorruptDataError(
            f"{where}: _names must be a list of {'' if batch_size is None else len(batch_size)} dimension names "
            f"(strings or null), one per batch dimension, found {names!r}."
        )
    return LevelMeta(leaves, children, batch_size, names, meta)
