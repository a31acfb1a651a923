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
from ._format import META_FILE, PICKLE_FILE, dumps_json, is_json_value, nontensor_meta

__all__ = ["encode_nontensor", "write_nontensor", "replace_if_changed"]


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


def write_nontensor(path: str, meta: bytes, pickled: bytes | None) -> bool:
    """Write one non-tensor folder: ``other.pickle`` first (if any), then ``meta.json``.

    Returns whether anything changed on disk.
    """
    os.makedirs(path, exist_ok=True)
    check_not_symlink(path)
    pickle_path = os.path.join(path, PICKLE_FILE)
    changed = False
    if pickled is not None:
        changed = replace_if_changed(pickle_path, pickled)
    changed = replace_if_changed(os.path.join(path, META_FILE), meta) or changed
    if pickled is None and os.path.exists(pickle_path):
        os.unlink(pickle_path)  # stale: the value is JSON now
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
