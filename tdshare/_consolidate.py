"""``consolidate``: every tensor leaf of a tree as a view of one flat ``uint8`` storage.

A consolidated tensordict is its storage plus a *schema*, in the layout tensordict 0.15.3 uses
(so that the files and the schema go both ways between the libraries).  Each level of the tree
is one dict::

    {"cls": "TensorDict",                      # or "LazyStackedTensorDict", "NonTensorStack",
                                               # or a tensorclass's "<class 'module.Name'>"
     "non_tensors": {key: [value, batch_size, device]},
     "leaves": {key: [dtype, shape, start, stop, pad]},   # bytes [start, stop) of the storage
     "cls_metadata": {"device", "names", "batch_size", "is_locked"},   # a lazy stack: stack_dim...
     <key of a nested level>: {...the same...}}

Each leaf's bytes are padded with zeros to a multiple of 8 (``pad`` bytes), so every leaf starts
8-aligned.  A lazy stack's members are the nested levels ``"0"``, ``"1"``...  A jagged nested
tensor is three leaves (``<NJT_VALUES>key``, optional ``<NJT_LENGTHS>key``, ``<NJT_OFFSETS>key``,
the last with the ragged dim as a sixth field).  A file written by ``consolidate(filename=...)``
holds the storage, then the schema as JSON, then the JSON's length as a little-endian int64.

In memory (no ``filename``), the storage is allocated :data:`HEAD_ROOM` bytes into a slightly
bigger buffer: :mod:`tdshare.distributed` writes a transfer's header into that room, so that the
header and the storage travel as one message, with no copy (:func:`consolidated_message`).  The
room is no part of the storage: offsets, the schema, files and :func:`consolidated_parts` never
see it (a pickle carries its 64 bytes with the storage's memory, as torch pickles a view).

Pickling a consolidated tensordict sends the storage once plus the schema, as long as its
content is still what ``consolidate`` made (see :meth:`ConsolidateOps.is_consolidated`);
:func:`consolidated_parts` and :func:`rebuild_consolidated` give and take the same two pieces,
for a transport such as ``torch.distributed`` (send the buffer, broadcast the schema).
"""

from __future__ import annotations

import json
import os
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from ._consolidated_read import (
    LAZY_CLS,
    NJT_PREFIXES,
    NT_STACK_CLS,
    SCHEMA_FIELDS,
    TD_CLS,
    Viewer,
    describe_where,
    file_identity,
    intact,
    level_views,
    marks_of,
    read_consolidated_file,
    rebuild_consolidated,
    unpickle_consolidated,
    unpickle_consolidated_file,
)
from ._errors import InvalidArgumentError, MemmapError, NotSupportedError
from ._format import LEVEL, STACK, VALUE, VALUE_STACK, WRAPPED
from ._future import TensorDictFuture
from ._nodes import kind_of
from ._nontensor import NonTensorData, NonTensorStack

__all__ = ["HEAD_ROOM", "ConsolidateOps", "consolidated_message", "consolidated_parts"]

T = TypeVar("T", bound="ConsolidateOps")
_ALIGN = 8
HEAD_ROOM = 64  # bytes before an in-memory storage, for a transfer's header (keeps the storage 64-aligned)


class ConsolidateOps:
    """``consolidate``/``is_consolidated``/``from_consolidated``: a mixin of ``TensorDictBase``."""

    #: ``{"storage", "metadata", "filename", "marks"}`` on a consolidated tensordict, else None
    _consolidated: dict[str, Any] | None = None
    _is_locked: bool

    def consolidate(
        self: T,
        filename: str | os.PathLike | None = None,
        *,
        num_threads: int | None = 0,
        device: torch.device | str | int | None = None,
        non_blocking: bool = False,
        inplace: bool = False,
        return_early: bool = False,
        use_buffer: bool = False,
        share_memory: bool = False,
        pin_memory: bool = False,
        metadata: bool = False,
    ) -> Any:
        """Copy every tensor leaf into one flat ``uint8`` storage; the result's leaves are views of it.

        The schema (keys, classes, dtypes, shapes, batch sizes, names, non-tensor values) is kept
        beside the storage, so the result pickles as one buffer plus the schema.  The result is
        locked: in-place writes go into the storage, structural changes are refused.

        Args:
            filename: put the storage in this file (memory-mapped, written to a new file that
                replaces the path), followed by the schema as JSON and its length (an int64), so
                that :meth:`from_consolidated` reads it back.
            num_threads: threads that copy the leaves (by chunks of about equal size); 0 or 1
                copies in the calling thread.
            device: the storage's device (default: the tensordict's, else the cpu); only the cpu
                goes with ``filename``.
            non_blocking: copy to another device asynchronously.
            inplace: replace the leaves of this tensordict by the views and return it.
            return_early: with ``num_threads > 1``, return a :class:`tdshare.TensorDictFuture` at
                once; ``result()`` waits for the copies.
            use_buffer: with ``filename``, copy into memory and write the file at the end (the
                leaves then view that memory, not the file).
            share_memory: put the storage in shared memory (it then travels to other processes
                as one shared segment).
            pin_memory: put the storage in pinned memory (needs an accelerator).
            metadata: accepted for the reference's signature; the schema is always kept.

        Returns:
            The consolidated tensordict (``self`` with ``inplace=True`` or when it already is
            consolidated), or a future of it with ``return_early=True`` and ``num_threads > 1``.

        Raises:
            NotSupportedError: ``return_early`` with ``use_buffer`` or ``non_blocking``; a strided
                nested tensor or an entry of a kind that cannot be consolidated (the key is named).
            MemmapError: ``filename`` with a device other than the cpu.
            InvalidArgumentError: a nested level named like a schema field (``cls``, ``leaves``...).

        >>> import pickle, torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), b={"c": torch.ones(3, dtype=torch.int16)}, batch_size=[3])
        >>> c = td.consolidate()
        >>> c.is_consolidated(), c["b", "c"].untyped_storage().data_ptr() == c["a"].untyped_storage().data_ptr()
        (True, True)
        >>> (pickle.loads(pickle.dumps(c)) == td).all()
        True
        """
        threads = num_threads or 0
        early = return_early and threads > 1
        if early and use_buffer:
            raise NotSupportedError(
                "consolidate(return_early=True) is not supported with use_buffer=True: the buffer is written "
                "to the file after the copies. Pass return_early=False."
            )
        if early and non_blocking:
            raise NotSupportedError(
                "consolidate(return_early=True) is not supported with non_blocking=True: the copies could not "
                "be synchronised. Pass non_blocking=False."
            )
        dev = None if device is None else torch.device(device)
        if filename is not None and dev is not None and dev.type != "cpu":
            raise MemmapError(
                f"consolidate: device={str(dev)!r} and filename= are mutually exclusive arguments (a file is "
                "mapped in cpu memory); drop one of them, or call .to(device) on the result."
            )
        if self.is_consolidated() and not pin_memory:
            own = self._consolidated.get("filename") if self._consolidated else None
            if filename is not None and (own is None or os.path.realpath(filename) != own):
                warnings.warn(
                    f"consolidate(filename={str(filename)!r}) writes nothing: the tensordict is already "
                    "consolidated. Call td.contiguous().consolidate(filename=...) to write a new file.",
                    UserWarning,
                    stacklevel=2,
                )
            return self
        plan = _Plan()
        schema = plan.node(self, ())
        size = plan.offset
        path = None if filename is None else os.fspath(filename)
        if path is None:
            target = dev if dev is not None else (getattr(self, "device", None) or torch.device("cpu"))
            framed = torch.empty(HEAD_ROOM + size, dtype=torch.uint8, device=target, pin_memory=pin_memory)
            if share_memory and framed.device.type == "cpu":
                framed.share_memory_()
            framed[:HEAD_ROOM].zero_()
            storage = framed[HEAD_ROOM:]
            whole = None
        else:
            footer = _footer(schema, path)
            whole = torch.empty(size + len(footer), dtype=torch.uint8) if use_buffer else _new_file(path, size, footer)
            whole[size:] = torch.frombuffer(bytearray(footer), dtype=torch.uint8)
            storage = whole[:size]
        futures = plan.copy(storage, threads, non_blocking, early)
        result_device = (
            torch.device("cpu") if path is not None else (dev if dev is not None else getattr(self, "device", None))
        )
        result = self if inplace else None
        built = _mirror(self, schema, Viewer(storage), result_device, inplace)
        if result is None:
            result = built
        if path is not None and use_buffer:
            assert whole is not None
            _replace_file(path, whole.numpy().tobytes())
        state: dict[str, Any] = {
            "storage": storage,
            "metadata": schema,
            "filename": None if path is None else os.path.realpath(path),
        }
        if path is None:
            state["framed"] = framed  # the room, then the storage
        if path is not None and not use_buffer:  # the leaves map the file: pickles name it
            state["file"] = (os.path.realpath(path), file_identity(path), size)
        result.lock_()
        state["marks"] = marks_of(result)
        result._consolidated = state
        if futures:
            return TensorDictFuture(futures, result)
        return result

    def is_consolidated(self) -> bool:
        """Whether the leaves are still the views of one storage that :meth:`consolidate` made.

        True while the tensordict holds the same entries as when it was made (in-place writes into
        tensors keep it); False after ``unlock_()`` of the locked result, an entry added, removed
        or replaced, a non-tensor value written, a batch size changed, or ``memmap_()``.

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(3), batch_size=[3])
        >>> td.is_consolidated(), td.consolidate().is_consolidated()
        (False, True)
        """
        state = self._consolidated
        if state is None:
            return False
        if not intact(state["marks"]):
            self._consolidated = None  # stale for good: a later lock_() does not bring it back
            return False
        return True

    @classmethod
    def from_consolidated(cls, filename: str | os.PathLike) -> Any:
        """Read a file that ``consolidate(filename=...)`` wrote (by tdshare or tensordict 0.15.3).

        The leaves view one copy-on-write mapping of the file (writes stay in this process); the
        result is consolidated and, as the reference's, not locked unless the schema says so.

        Args:
            filename: the file.

        Returns:
            The tensordict (a lazy stack when the file holds one).

        Raises:
            CorruptDataError: the file is too short, its schema is not valid JSON, or a leaf lies
                outside the data.
            UnsupportedFormatError: a tensorclass the schema names is not defined in this process.

        >>> import tempfile, torch
        >>> from tdshare import TensorDict
        >>> path = tempfile.mkdtemp() + "/td.bin"
        >>> _ = TensorDict(a=torch.arange(3), batch_size=[3]).consolidate(filename=path)
        >>> TensorDict.from_consolidated(path)["a"].tolist()
        [0, 1, 2]
        """
        storage, schema = read_consolidated_file(filename)
        return rebuild_consolidated(storage, schema, cls._level_class())

    @classmethod
    def from_consolidated_parts(cls, buffer: torch.Tensor, schema: dict[str, Any]) -> Any:
        """Rebuild a tensordict from the ``(buffer, schema)`` that :func:`tdshare.consolidated_parts` gave.

        The leaves are views of ``buffer`` (no copy): e.g. a buffer received with
        ``torch.distributed.recv`` and a schema sent with ``broadcast_object_list``.

        Args:
            buffer: the 1-D ``uint8`` storage.
            schema: its schema (the reference's consolidated metadata layout).

        Returns:
            The tensordict (a lazy stack or a tensorclass instance where the schema says so).

        Raises:
            InvalidArgumentError: ``buffer`` is not a 1-D ``uint8`` tensor.
            CorruptDataError: a malformed schema, or a leaf outside ``buffer``.
            UnsupportedFormatError: a tensorclass the schema names is not defined in this process.

        >>> import torch
        >>> from tdshare import TensorDict, consolidated_parts
        >>> buffer, schema = consolidated_parts(TensorDict(a=torch.ones(2), batch_size=[2]))
        >>> TensorDict.from_consolidated_parts(buffer.clone(), schema)["a"].tolist()
        [1.0, 1.0]
        """
        return rebuild_consolidated(buffer, schema, cls._level_class())

    def lock_(self: T) -> T:
        raise NotImplementedError

    def _consolidated_to(self: T, device: torch.device, non_blocking: bool) -> T:
        """``to(device)`` of a consolidated tensordict: its one storage moves, the result is consolidated."""
        state = self._consolidated
        assert state is not None
        storage = state["storage"].to(device, non_blocking=non_blocking)
        out = rebuild_consolidated(storage, state["metadata"], type(self)._level_class())
        out._propagate(lambda td: setattr(td, "_device", device))  # the schema names the old device
        if getattr(self, "is_locked", False):
            out.lock_()
            out._consolidated["marks"] = marks_of(out)
        return out

    @classmethod
    def _level_class(cls) -> type:
        raise NotImplementedError

    def __reduce_ex__(self, protocol: Any) -> Any:
        # a consolidated tensordict pickles as its storage (once) and the schema
        state = self._consolidated
        if state is not None and self.is_consolidated():
            if "file" in state:  # the receiver maps the same file: writes are shared, no bytes travel
                return (unpickle_consolidated_file, (type(self), *state["file"], state["metadata"]))
            return (unpickle_consolidated, (type(self), state["storage"], state["metadata"]))
        return self.__reduce__()


# -- the plan: the schema and the copy ------------------------------------------------------------
class _Plan:
    """Walks a tree once: builds its schema and lists the tensors to copy, at their offsets."""

    def __init__(self) -> None:
        self.tensors: list[tuple[torch.Tensor, int, int]] = []  # (tensor, start, bytes)
        self.offset = 0

    def node(self, node: Any, where: tuple[str, ...]) -> dict[str, Any]:
        kind = kind_of(node)
        layout = None if kind is None else kind.layout
        if layout == LEVEL:
            return self.level(node, where)
        if layout == STACK:
            assert kind is not None
            members, fields = kind.unwrap(node)  # type: ignore[misc]
            meta = _empty_level(
                LAZY_CLS,
                {"stack_dim": fields["stack_dim"], "stack_dim_name": fields.get("stack_dim_name"), "is_locked": False},
            )
            for i, member in enumerate(members):
                meta[str(i)] = self.node(member, (*where, str(i)))
            return meta
        raise NotSupportedError(
            f"consolidate: {describe_where(where)} is a {type(node).__name__}, which has no schema."
        )

    def level(self, td: Any, where: tuple[str, ...]) -> dict[str, Any]:
        device = td.device
        meta = _empty_level(
            TD_CLS,
            {
                "device": None if device is None else str(device),
                "names": td.names,
                "batch_size": list(td.batch_size),
                "is_locked": False,
            },
        )
        batch = list(td.batch_size)
        for key, value in td._tensordict.items():
            self.entry(meta, key, value, (*where, key), batch)
        return meta

    def entry(
        self, meta: dict[str, Any], key: str, value: Any, where: tuple[str, ...], batch: list[int] | None = None
    ) -> None:
        if isinstance(value, torch.Tensor):
            if not value.is_nested:
                meta["leaves"][key] = self.leaf(value)
            elif value.layout is torch.jagged:
                njt: Any = value
                for prefix, part in zip(NJT_PREFIXES, (njt.values(), njt.lengths(), njt.offsets()), strict=True):
                    if part is not None:
                        meta["leaves"][prefix + key] = self.leaf(part)
                meta["leaves"][NJT_PREFIXES[2] + key].append(int(njt._ragged_idx))
            else:
                raise NotSupportedError(
                    f"consolidate: {describe_where(where)} is a strided nested tensor, which has no consolidated "
                    "layout; build it with layout=torch.jagged."
                )
            return
        kind = kind_of(value)
        layout = None if kind is None else kind.layout
        if layout == VALUE:
            device = value.device
            shape = list(value.batch_size) or (batch or [])  # the reference records the level's batch size
            meta["non_tensors"][key] = [value.data, shape, None if device is None else str(device)]
            return
        if key in SCHEMA_FIELDS:
            raise InvalidArgumentError(
                f"consolidate: the nested entry {describe_where(where)} is named like a field of the consolidated "
                f"schema ({', '.join(SCHEMA_FIELDS)}); rename it (rename_key_) before consolidating."
            )
        if layout == VALUE_STACK:
            meta[key] = _value_stack(value)
        elif layout in (LEVEL, STACK):
            meta[key] = self.node(value, where)
        elif layout == WRAPPED and kind is not None and kind.unwrap is not None:
            inner, _ = kind.unwrap(value)
            meta[key] = self.level(inner, where)
            meta[key]["cls"] = kind.type_tag
        else:
            raise NotSupportedError(
                f"consolidate: {describe_where(where)} is a {type(value).__name__}, which cannot be consolidated; "
                "store it as a tensor or a non-tensor value."
            )

    def leaf(self, tensor: torch.Tensor) -> list[Any]:
        nbytes = tensor.numel() * tensor.element_size()
        pad = -nbytes % _ALIGN
        start = self.offset
        self.offset += nbytes + pad
        self.tensors.append((tensor, start, nbytes))
        return [str(tensor.dtype), list(tensor.shape), start, self.offset, pad]

    def copy(self, storage: torch.Tensor, threads: int, non_blocking: bool, early: bool) -> list[Future[Any]]:
        """Copy every tensor into its bytes of ``storage`` (padding zeroed); futures when ``early``."""
        pieces: list[tuple[int, list[torch.Tensor]]] = []  # (start, flat pieces), one per chunk
        target = max(1, -(-self.offset // max(threads, 1)))
        chunk: list[torch.Tensor] = []
        chunk_start = pos = 0
        for tensor, start, nbytes in self.tensors:
            if start - chunk_start >= target and chunk:
                pieces.append((chunk_start, chunk))
                chunk, chunk_start = [], start
            if nbytes:
                chunk.append(_flat_bytes(tensor, storage.device, non_blocking))
            pos = start + nbytes
            end = start + nbytes + (-nbytes % _ALIGN)
            if end > pos:
                chunk.append(torch.zeros(end - pos, dtype=torch.uint8, device=storage.device))
        if chunk:
            pieces.append((chunk_start, chunk))

        def run(start: int, items: list[torch.Tensor]) -> None:
            stop = start + sum(t.numel() for t in items)
            torch.cat(items, out=storage[start:stop])

        if threads <= 1 or (len(pieces) <= 1 and not early):
            for start, items in pieces:
                run(start, items)
            if non_blocking and storage.device.type != "cpu":
                torch.accelerator.synchronize()
            return []
        pool = ThreadPoolExecutor(threads)
        try:
            futures = [pool.submit(run, start, items) for start, items in pieces]
        finally:
            pool.shutdown(wait=False)
        if early:
            return futures
        for f in futures:
            f.result()
        return []


def _flat_bytes(tensor: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    """The tensor's bytes as a 1-D ``uint8`` tensor on ``device`` (a copy only where needed)."""
    flat = tensor if tensor.dim() == 1 and not tensor.requires_grad else tensor.detach().reshape(-1)
    if type(flat) is not torch.Tensor:  # a MemoryMappedTensor or another subclass: plain bytes
        flat = torch.Tensor.as_subclass(flat, torch.Tensor)
    if flat.stride(0) != 1 or flat.is_conj() or flat.is_neg():
        flat = flat.resolve_conj().resolve_neg().clone()
    if flat.device != device:
        flat = flat.to(device, non_blocking=non_blocking)
    return flat.view(torch.uint8)


def _empty_level(cls: str, cls_metadata: dict[str, Any]) -> dict[str, Any]:
    return {"cls": cls, "non_tensors": {}, "leaves": {}, "cls_metadata": cls_metadata}


def _value_stack(value: NonTensorStack) -> dict[str, Any]:
    meta = _empty_level(NT_STACK_CLS, {"stack_dim": 0, "stack_dim_name": None, "is_locked": False})
    for i, item in enumerate(value.unbind(0)):
        if isinstance(item, NonTensorStack):
            meta[str(i)] = _value_stack(item)
        else:
            meta["non_tensors"][str(i)] = [item.data, [], None]
    return meta


# -- the result: the same tree, with views -------------------------------------------------------
def _mirror(node: Any, meta: dict[str, Any], storage: Viewer, device: torch.device | None, inplace: bool) -> Any:
    """``node`` with its tensors replaced by views of ``storage``: a new tree, or ``node`` itself."""
    kind = kind_of(node)
    if kind is not None and kind.layout == STACK and kind.unwrap is not None and kind.wrap is not None:
        members, fields = kind.unwrap(node)
        new = [_mirror(m, meta[str(i)], storage, device, inplace) for i, m in enumerate(members)]
        return node if inplace else kind.wrap(new, fields)
    views = level_views(meta, storage)
    entries = node._tensordict
    leaves: dict[str, Any] = entries if inplace else {}
    for key, value in entries.items():
        if key in views:
            leaves[key] = views[key]
        elif isinstance(value, NonTensorData):
            leaves[key] = value if inplace else value.clone()
        else:
            sub = kind_of(value)
            if sub is not None and sub.layout == WRAPPED and sub.unwrap is not None and sub.wrap is not None:
                inner, fields = sub.unwrap(value)
                built = _mirror(inner, meta[key], storage, device, inplace)
                leaves[key] = value if inplace else sub.wrap(built, fields)
            else:
                leaves[key] = _mirror(value, meta[key], storage, device, inplace)
    if inplace:
        return node
    return type(node)._from_leaves(leaves, node.batch_size, device, node._names)


def consolidated_parts(td: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """``(buffer, schema)`` of a tensordict: its consolidated storage and what rebuilds it.

    A tensordict that is not consolidated is consolidated first (into a new one).  Send the
    buffer as one tensor (``torch.distributed.send``/``broadcast``) and the schema as an object
    (``broadcast_object_list``); :func:`rebuild_consolidated` (``TensorDict.from_consolidated_parts``)
    puts them together again.  The schema is JSON-compatible when every non-tensor value is.

    Args:
        td: a tensordict, lazy stack or tensorclass instance.

    Returns:
        The 1-D ``uint8`` buffer and the schema dict (do not modify it).

    >>> import torch
    >>> from tdshare import TensorDict, consolidated_parts
    >>> buffer, schema = consolidated_parts(TensorDict(a=torch.zeros(3), batch_size=[3]))
    >>> buffer.dtype, buffer.numel(), schema["leaves"]["a"]
    (torch.uint8, 16, ['torch.float32', [3], 0, 16, 4])
    """
    inner = td
    kind = kind_of(td)
    if kind is not None and kind.layout == WRAPPED and kind.unwrap is not None:
        inner = kind.unwrap(td)[0]
    if not isinstance(inner, ConsolidateOps):
        raise InvalidArgumentError(f"consolidated_parts expects a tensordict, got {type(td).__name__}.")
    if not inner.is_consolidated():
        inner = inner.consolidate()
    state = inner._consolidated
    assert state is not None
    return state["storage"], state["metadata"]


def consolidated_message(td: Any) -> torch.Tensor | None:
    """The :data:`HEAD_ROOM` bytes before the storage of ``td`` and the storage, as one flat
    ``uint8`` tensor, where ``td`` (a tensorclass: its tensordict) is consolidated in memory by
    :meth:`ConsolidateOps.consolidate` (else None: a file, a rebuilt or an unpickled one).

    >>> import torch
    >>> from tdshare import TensorDict
    >>> c = TensorDict(a=torch.ones(2), batch_size=[2]).consolidate()
    >>> message = consolidated_message(c)
    >>> message.numel() == HEAD_ROOM + 8 and message[HEAD_ROOM:].data_ptr() == c["a"].data_ptr()
    True
    """
    inner = td
    kind = kind_of(td)
    if kind is not None and kind.layout == WRAPPED and kind.unwrap is not None:
        inner = kind.unwrap(td)[0]
    if not isinstance(inner, ConsolidateOps) or not inner.is_consolidated():
        return None
    state = inner._consolidated
    assert state is not None
    framed = state.get("framed")
    return framed if isinstance(framed, torch.Tensor) else None


# -- files ---------------------------------------------------------------------------------------
def _footer(schema: dict[str, Any], path: str) -> bytes:
    try:
        text = json.dumps(schema).encode()
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(
            f"consolidate(filename={path!r}): a non-tensor value cannot be written as JSON ({e}); consolidate "
            "without a filename (pickling keeps any value), or store the value as a string or number."
        ) from e
    return text + len(text).to_bytes(8, "little", signed=True)


def _new_file(path: str, size: int, footer: bytes) -> torch.Tensor:
    """A new file of ``size + len(footer)`` bytes at ``path``, mapped shared (it replaces the path)."""
    tmp = f"{path}.tdshare-{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.truncate(size + len(footer))
    try:
        mapped = torch.from_file(tmp, shared=True, size=size + len(footer), dtype=torch.uint8)
        os.replace(tmp, path)  # a process that mapped the old file keeps its bytes
    except BaseException:
        os.unlink(tmp)
        raise
    return mapped


def _replace_file(path: str, data: bytes) -> None:
    tmp = f"{path}.tdshare-{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
