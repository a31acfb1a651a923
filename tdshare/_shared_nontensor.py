"""Non-tensor values shared live between processes (``share_non_tensor=True``).

The store is the saved folder itself, not a server process: each shared value lives in its own
folder's ``meta.json`` (and ``other.pickle`` or, for a stack, ``pickle.pkl`` when JSON cannot hold
it), exactly where the format puts it anyway.  A write takes the tree's lock, replaces those files
whole and bumps the generation; a read compares the generation with the one it last saw (one
memory read) and re-reads the value only when something was committed since.  So there is no
size cap on strings, any JSON value works (any picklable one with ``allow_pickle=True``), and the
handle pickles as a path: it works under fork, spawn and forkserver, through queues and with
plain pickle.  :class:`SharedNonTensorData` shares one value; :class:`SharedNonTensorStack` one
value per element (a ``NonTensorStack``), written whole on every change.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, TypeGuard

import torch

from ._coordination import SharedRegistry, unchanged_since
from ._errors import CorruptDataError, PickleRefusedError
from ._format import META_FILE, PICKLE_FILE, STACK_PICKLE_FILE, loads_json
from ._nontensor import NonTensorData, NonTensorStack, flatten_values, nest_values
from ._nontensor_files import encode_nontensor, encode_nontensor_stack, write_nontensor
from ._runtime import register_user

__all__ = ["SharedNonTensorData", "SharedNonTensorStack", "LiveFolder", "is_shared_value"]


class LiveFolder:
    """The folder a shared value lives in, the registry that orders its writes, and the state last read.

    ``store``: the runtime store of an anonymous tree whose value this is (its registry
    coordinates the writes, and every process that holds the value keeps the store alive); None
    for a value inside a saved folder, coordinated by that folder's tree.
    """

    __slots__ = ("allow_pickle", "folder", "registry", "state", "store")

    def __init__(self, folder: str, allow_pickle: bool | None, store: str | None, fresh: bool = True) -> None:
        self.folder = folder
        self.store = store
        if store is not None:
            register_user(store)  # the store lives as long as a process that reads through it
        self.registry = SharedRegistry.for_directory(folder if store is None else store)
        self.allow_pickle = allow_pickle
        self.state = self.registry.state() if fresh else None  # None: read the committed value at first use

    def changed(self) -> Any:
        """The registry's state if something was committed since the last read, else None."""
        state = self.registry.state()
        return None if unchanged_since(self.state, state) else state

    def commit(self, meta: bytes, pickled: bytes | None, pickle_name: str) -> None:
        """Replace the value's files under the tree's lock and bump the generation."""
        with self.registry.lock():
            before = self.registry.state()
            write_nontensor(self.folder, meta, pickled, pickle_name)
            after = self.registry.bump()
        if unchanged_since(self.state, before):
            self.state = after  # nobody else wrote since our last read: our value is the committed one

    def read(self, pickle_name: str) -> Any:
        """The committed ``data`` field: inline JSON, or the pickle ``pickle_name`` (needs allow_pickle)."""
        with open(os.path.join(self.folder, META_FILE), "rb") as f:
            meta = loads_json(f.read(), os.path.join(self.folder, META_FILE))
        data = meta.get("data")
        if "data" in meta and data != pickle_name:
            return data
        path = os.path.join(self.folder, pickle_name)
        if self.allow_pickle is not True:
            raise PickleRefusedError(
                f"The shared non-tensor value in {path!r} is pickled; pass allow_pickle=True when memory-mapping "
                "or loading to read it (pickle can execute arbitrary code)."
            )
        with open(path, "rb") as f:
            stored = pickle.load(f)
        if pickle_name == STACK_PICKLE_FILE:
            return stored
        if not isinstance(stored, dict) or "data" not in stored:
            raise CorruptDataError(f"{path} holds no 'data' field.")
        return stored["data"]


class SharedNonTensorData(NonTensorData):
    """A non-tensor leaf whose value is read from, and written to, its folder on every change."""

    __slots__ = ("_live", "_value")

    def __init__(self, value: Any, folder: str, allow_pickle: bool | None = None, store: str | None = None) -> None:
        self._live = LiveFolder(folder, allow_pickle, store)
        self._value = value

    @property
    def _folder(self) -> str:
        return self._live.folder

    @property
    def _store(self) -> str | None:
        return self._live.store

    @property
    def data(self) -> Any:
        state = self._live.changed()
        if state is not None:
            self._value = self._live.read(PICKLE_FILE)
            self._live.state = state
        return self._value

    @data.setter
    def data(self, value: Any) -> None:
        self.write(value)

    def write(self, value: Any) -> None:
        """Replace the shared value (seen by every process at its next read)."""
        meta, pickled = encode_nontensor(value, self._live.folder)
        self._live.commit(meta, pickled, PICKLE_FILE)
        self._value = value

    def relocated(self, folder: str) -> SharedNonTensorData:
        """The same value, shared through ``folder`` (the tree was renamed), coordinated by its tree."""
        return SharedNonTensorData(self.data, folder, allow_pickle=True)

    def __repr__(self) -> str:
        return f"SharedNonTensorData(data={self.data!r}, folder={self._live.folder!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        live = self._live
        return (_rebuild, (self._value, live.folder, live.allow_pickle, live.store))


def _rebuild(value: Any, folder: str, allow_pickle: bool | None, store: str | None = None) -> SharedNonTensorData:
    out = SharedNonTensorData.__new__(SharedNonTensorData)
    out._live = LiveFolder(folder, allow_pickle, store, fresh=False)
    out._value = value
    return out


class SharedNonTensorStack(NonTensorStack):
    """A ``NonTensorStack`` whose values are read from, and written to, its folder on every change.

    Element writes (``td[i] = other``, ``stack.data = [...]``) replace the whole list in the folder
    under the tree's lock; every process sees them at its next read.
    """

    __slots__ = ("_cache", "_live")

    def __init__(
        self, data: Any, batch: torch.Size, folder: str, allow_pickle: bool | None = None, store: str | None = None
    ) -> None:
        """``data``: the nested lists of values (what ``tolist()`` gives), of batch shape ``batch``."""
        self._live = LiveFolder(folder, allow_pickle, store)
        self._cache = flatten_values(data, torch.Size(batch), folder)
        self._batch_size, self._device = torch.Size(batch), None

    @property
    def _folder(self) -> str:
        return self._live.folder

    @property
    def _store(self) -> str | None:
        return self._live.store

    @property
    def _values(self) -> list[Any]:
        state = self._live.changed()
        if state is not None:
            self._cache = flatten_values(self._live.read(STACK_PICKLE_FILE), self._batch_size, self._live.folder)
            self._live.state = state
        return self._cache

    @_values.setter
    def _values(self, values: list[Any]) -> None:
        values = list(values)
        meta, pickled = encode_nontensor_stack(nest_values(values, self._batch_size), self._live.folder)
        self._live.commit(meta, pickled, STACK_PICKLE_FILE)
        self._cache = values

    def write(self, value: Any) -> None:
        """Replace every element with the nested list ``value`` (seen by every process at its next read)."""
        self.data = value

    def relocated(self, folder: str) -> SharedNonTensorStack:
        """The same values, shared through ``folder`` (the tree was renamed), coordinated by its tree."""
        return SharedNonTensorStack(self.tolist(), self._batch_size, folder, allow_pickle=True)

    def __repr__(self) -> str:
        return f"SharedNonTensorStack({self.tolist()!r}, batch_size={self._batch_size}, folder={self._live.folder!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        live = self._live
        return (_rebuild_stack, (self._cache, tuple(self._batch_size), live.folder, live.allow_pickle, live.store))


def _rebuild_stack(
    values: list[Any], batch: tuple[int, ...], folder: str, allow_pickle: bool | None, store: str | None
) -> SharedNonTensorStack:
    out = SharedNonTensorStack.__new__(SharedNonTensorStack)
    out._live = LiveFolder(folder, allow_pickle, store, fresh=False)
    out._cache, out._batch_size, out._device = list(values), torch.Size(batch), None
    return out


def is_shared_value(value: Any) -> TypeGuard[SharedNonTensorData | SharedNonTensorStack]:
    """Whether ``value`` is a non-tensor value shared live through its folder."""
    return isinstance(value, (SharedNonTensorData, SharedNonTensorStack))
