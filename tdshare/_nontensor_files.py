"""Non-tensor leaf folders: encode a value as ``meta.json`` (+ ``other.pickle``) and write it.

A value goes inline as JSON when JSON can hold it (:func:`tdshare._format.is_json_value`),
otherwise it is pickled; the pickle is made before any file is opened, so an unpicklable value
leaves the folder untouched.  Files are replaced whole, and only when their bytes change, so
an unchanged value costs one read and no new inode.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from ._errors import InvalidArgumentError
from ._files import check_not_symlink, replace_file
from ._format import (
    META_FILE,
    PICKLE_FILE,
    STACK_PICKLE_FILE,
    dumps_compact_json,
    dumps_json,
    is_json_value,
    nontensor_meta,
    nontensor_stack_meta,
)

__all__ = ["encode_nontensor", "encode_nontensor_stack", "write_nontensor", "replace_if_changed"]


def encode_nontensor(value: Any, where: str) -> tuple[bytes, bytes | None]:
    """The ``meta.json`` bytes of a non-tensor value and, if JSON cannot hold it, its pickle."""
    json_ok = is_json_value(value)
    try:
        meta = dumps_json(nontensor_meta(value, json_ok))
    except (TypeError, ValueError):  # e.g. a float subclass json refuses
        json_ok = False
        meta = dumps_json(nontensor_meta(value, False))
    if json_ok:
        return meta, None
    try:
        return meta, pickle.dumps({"data": value})
    except Exception as err:
        raise InvalidArgumentError(
            f"The non-tensor value at {where} is neither JSON nor picklable ({err}); convert it before saving."
        ) from err


def encode_nontensor_stack(values: list, where: str) -> tuple[bytes, bytes | None]:
    """The ``meta.json`` bytes of a NonTensorStack (its nested list of values) and, if JSON cannot
    hold them, the pickle of the list (``pickle.pkl``), as the reference writes them."""
    if is_json_value(values):
        try:
            return dumps_compact_json(nontensor_stack_meta(values)), None
        except (TypeError, ValueError):
            pass
    try:
        pickled = pickle.dumps(values)
    except Exception as err:
        raise InvalidArgumentError(
            f"The non-tensor stack at {where} is neither JSON nor picklable ({err}); convert it before saving."
        ) from err
    return dumps_compact_json(nontensor_stack_meta(STACK_PICKLE_FILE)), pickled


def write_nontensor(path: str, meta: bytes, pickled: bytes | None, pickle_name: str = PICKLE_FILE) -> bool:
    """Write one non-tensor folder: its pickle ``pickle_name`` first (if any), then ``meta.json``.

    Returns whether anything changed on disk.
    """
    os.makedirs(path, exist_ok=True)
    check_not_symlink(path)
    changed = False
    if pickled is not None:
        changed = replace_if_changed(os.path.join(path, pickle_name), pickled)
    changed = replace_if_changed(os.path.join(path, META_FILE), meta) or changed
    for name in (PICKLE_FILE, STACK_PICKLE_FILE):
        stale = os.path.join(path, name)
        if (pickled is None or name != pickle_name) and os.path.exists(stale):
            os.unlink(stale)  # stale: the value is JSON now, or another kind of value
            changed = True
    return changed


def replace_if_changed(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            if f.read(len(data) + 1) == data:
                return False  # identical: no write, no new inode, no generation bump
    except OSError:
        pass
    replace_file(path, data)
    return True
