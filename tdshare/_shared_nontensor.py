"""Non-tensor values shared live between processes (``share_non_tensor=True``).

The store is the saved folder itself, not a server process: each shared value lives in its own
folder's ``meta.json`` (and ``other.pickle`` when JSON cannot hold it), exactly where the format
puts it anyway.  A write takes the tree's lock, replaces those files whole and bumps the
generation; a read compares the generation with the one it last saw (one memory read) and
re-reads the value only when something was committed since.  So there is no size cap on strings,
any JSON value works (any picklable one with ``allow_pickle=True``), and the handle pickles as a
path: it works under fork, spawn and forkserver, through queues and with plain pickle.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

from ._coordination import SharedRegistry, unchanged_since
from ._errors import CorruptDataError, PickleRefusedError
from ._format import META_FILE, PICKLE_FILE, loads_json
from ._nontensor import NonTensorData
from ._nontensor_files import encode_nontensor, write_nontensor
from ._runtime import register_user

__all__ = ["SharedNonTensorData"]


class SharedNonTensorData(NonTensorData):
    """A non-tensor leaf whose value is read from, and written to, its folder on every change.

    ``folder`` holds the value (``meta.json``, and ``other.pickle`` when JSON cannot hold it).
    ``store``: the runtime store of an anonymous tree whose value this is (its registry
    coordinates the writes, and every process that holds the value keeps the store alive); None
    for a value inside a saved folder, coordinated by that folder's tree.
    """

    __slots__ = ("_allow_pickle", "_folder", "_registry", "_state", "_store", "_value")

    def __init__(self, value: Any, folder: str, allow_pickle: bool | None = None, store: str | None = None) -> None:
        self._folder = folder
        self._store = store
        if store is not None:
            register_user(store)  # the store lives as long as a process that reads through it
        self._registry = SharedRegistry.for_directory(folder if store is None else store)
        self._allow_pickle = allow_pickle
        self._state = self._registry.state()
        self._value = value

    @property
    def data(self) -> Any:
        state = self._registry.state()
        if not unchanged_since(self._state, state):
            self._value = self._read()
            self._state = state
        return self._value

    @data.setter
    def data(self, value: Any) -> None:
        self.write(value)

    def write(self, value: Any) -> None:
        """Replace the shared value (seen by every process at its next read)."""
        meta, pickled = encode_nontensor(value, self._folder)
        with self._registry.lock():
            before = self._registry.state()
            write_nontensor(self._folder, meta, pickled)
            after = self._registry.bump()
        self._value = value
        if unchanged_since(self._state, before):
            self._state = after

    def _read(self) -> Any:
        with open(os.path.join(self._folder, META_FILE), "rb") as f:
            meta = loads_json(f.read(), os.path.join(self._folder, META_FILE))
        if "data" in meta:
            return meta["data"]
        path = os.path.join(self._folder, PICKLE_FILE)
        if self._allow_pickle is not True:
            raise PickleRefusedError(
                f"The shared non-tensor value in {path!r} is pickled; pass allow_pickle=True when memory-mapping "
                "or loading to read it (pickle can execute arbitrary code)."
            )
        with open(path, "rb") as f:
            stored = pickle.load(f)
        if not isinstance(stored, dict) or "data" not in stored:
            raise CorruptDataError(f"{path} holds no 'data' field.")
        return stored["data"]

    def __repr__(self) -> str:
        return f"SharedNonTensorData(data={self.data!r}, folder={self._folder!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._value, self._folder, self._allow_pickle, self._store))


def _rebuild(value: Any, folder: str, allow_pickle: bool | None, store: str | None = None) -> SharedNonTensorData:
    out = SharedNonTensorData(value, folder, allow_pickle, store)
    out._state = None  # unknown: read the committed value at first use
    return out
