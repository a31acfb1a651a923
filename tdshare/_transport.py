"""The wire under :mod:`tdshare.distributed`: headers, flat buffers per dtype, and peer errors.

Every message travels as bytes (a ``uint8`` view of its buffer), so any dtype the schema knows
goes over gloo and NCCL alike.  A dtype group's buffer is, on the sending side, a view of the
leaves themselves when they are one contiguous run of memory (an anonymous memory-mapped tree
lays them out so), else one packed copy; on the receiving side, likewise, the leaves' own memory
or one staging buffer copied into them.  Ranks are ranks *in the group*.

>>> h = Header(5, 6, 7)
>>> Header.from_tensor(h.tensor()) == h
True
"""

from __future__ import annotations

import ctypes
import struct
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ._errors import FormatError, TdshareError
from ._schema import Schema
from ._wire_span import fused_copy

__all__ = [
    "HEADER_BYTES",
    "INLINE_BYTES",
    "DistributedError",
    "Header",
    "PeerError",
    "Transport",
    "peer_error",
    "peer_errors",
    "staged_views",
    "GRAIN",
    "contiguous_run",
    "copier",
    "copy_bytes",
    "data_layout",
    "group_views",
    "inline",
    "raw",
    "read_header",
    "require_group",
    "write_header",
]

_MAGIC = 0x7464736861726531  # "tdshare1"


class DistributedError(TdshareError, RuntimeError):
    """Base class of the errors of :mod:`tdshare.distributed` (also: no process group yet)."""


def require_group() -> None:
    """Raise :class:`DistributedError` unless ``torch.distributed`` is initialized."""
    if not dist.is_initialized():
        raise DistributedError("torch.distributed is not initialized: call torch.distributed.init_process_group first.")


class PeerError(DistributedError):
    """A transfer failed because of a peer: it timed out, died or closed its connection.

    Attributes:
        peer: the peer's description (``"rank 1"``).
    """

    def __init__(self, message: str, peer: str = "") -> None:
        super().__init__(message)
        self.peer = peer

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.peer))


def peer_error(exc: RuntimeError, what: str, limit: float | None = None) -> PeerError:
    """The :class:`PeerError` naming ``what`` for the backend's error ``exc``."""
    late = f" within {limit} s" if limit is not None else ""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return PeerError(
        f"{what} did not complete{late}: {first}. "
        "The peer may have died, be stuck, or be waiting on another call; check it, or raise timeout=.",
        what,
    )


@contextmanager
def peer_errors(what: str, limit: float | None = None) -> Iterator[None]:
    """Turn the backend's ``RuntimeError`` inside the block into a :class:`PeerError` naming ``what``.

    Posting a message fails as well as waiting for one: gloo raises at ``irecv`` itself once
    the peer's connection is closed (a dead peer), before any work handle exists.
    """
    try:
        yield
    except TdshareError:
        raise
    except RuntimeError as exc:
        raise peer_error(exc, what, limit) from exc


HEADER_BYTES = 64  # a header: 8 int64; the data after it keeps every offset's alignment (mod 64)
INLINE_BYTES = 1 << 20  # a data message up to this size travels inside its header's message


def inline(schema: Schema) -> bool:
    """Whether ``schema``'s data message rides in its header's message once the peer knows the
    schema: up to :data:`INLINE_BYTES` (beyond, a copy costs more than a message).  A tree
    consolidated in memory is sent from the room before its storage and, point to point, received
    into its own (no copy on either side)."""
    return data_layout(schema)[0] <= INLINE_BYTES


@dataclass(frozen=True)
class Header:
    """What opens every transfer: the schema's two hashes, the length of the schema text sent
    after it (0: the peer has it already) and whether the data follows inside this same message
    (``inline``: at byte :data:`HEADER_BYTES`)."""

    digest: int
    layout_digest: int
    schema_len: int
    inline: bool = False

    def pack(self) -> bytes:
        """The header as :data:`HEADER_BYTES` bytes (8 little-endian int64)."""
        return _HEAD.pack(_MAGIC, self.digest, self.layout_digest, self.schema_len, int(self.inline), 0, 0, 0)

    def tensor(self) -> torch.Tensor:
        """The header as a :data:`HEADER_BYTES`-byte ``uint8`` tensor."""
        return torch.frombuffer(bytearray(self.pack()), dtype=torch.uint8)

    def write(self, message: torch.Tensor) -> torch.Tensor:
        """Write the header into the first :data:`HEADER_BYTES` of ``message`` (bytes); return it."""
        return write_header(message, self.pack())

    @classmethod
    def from_tensor(cls, raw: torch.Tensor) -> Header:
        """Read a header from the first :data:`HEADER_BYTES` of ``raw`` (bytes, at least that many).

        Raises:
            FormatError: not a tdshare header (another sender on the same tag).
        """
        magic, digest, layout, length, flags, *_ = _HEAD.unpack(read_header(raw))
        if magic != _MAGIC:
            raise FormatError(
                "The message is not a tdshare transfer header: another send on the same peer and tag was received "
                "here; use a distinct tag for tdshare transfers."
            )
        return cls(digest, layout, length, bool(flags))


def write_header(message: torch.Tensor, packed: bytes) -> torch.Tensor:
    """Write the :data:`HEADER_BYTES` bytes ``packed`` (see :meth:`Header.pack`) at the start of
    ``message`` (bytes); return it."""
    if message.device.type == "cpu" and message.is_contiguous():
        ctypes.memmove(message.data_ptr(), packed, HEADER_BYTES)  # no tensor op: a few µs less
    else:
        message[:HEADER_BYTES].copy_(torch.frombuffer(bytearray(packed), dtype=torch.uint8))
    return message


def read_header(raw: torch.Tensor) -> bytes:
    """The first :data:`HEADER_BYTES` of ``raw`` (bytes, at least that many) as ``bytes``."""
    if raw.device.type == "cpu" and raw.is_contiguous():
        return ctypes.string_at(raw.data_ptr(), HEADER_BYTES)
    return raw[:HEADER_BYTES].cpu().numpy().tobytes()


_HEAD = struct.Struct("<8q")
_CPU = torch.device("cpu")
_OPENINGS: dict[tuple[Header, torch.device], torch.Tensor] = {}
_GROUPS: dict[int, tuple[weakref.ref[Any], int, int, bool]] = {}  # id(group): (group, rank, world, nccl)


def contiguous_run(leaves: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """One flat tensor over ``leaves`` when they lie back to back in one storage, else None.

    The leaves must follow one another without gaps from the first one's address on, and end
    inside the first one's storage (virtual addresses of distinct allocations never overlap, so
    that storage then holds them all)."""
    parts = [t for t in leaves if t.numel()]
    if not parts:
        return None
    first = parts[0]
    size = first.element_size()
    end = first.data_ptr()
    for t in parts:
        if t.data_ptr() != end or t.dtype != dtype or t.device != device or not t.is_contiguous():
            return None
        end += t.numel() * size
    storage = first.untyped_storage()
    if end > storage.data_ptr() + storage.nbytes():
        return None
    flat = torch.empty(0, dtype=dtype, device=device)
    flat.set_(storage, first.storage_offset(), ((end - first.data_ptr()) // size,), (1,))
    return flat


def _grouped(schema: Schema, leaves: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The packed leaves of each dtype group (the direct ones left out)."""
    groups: list[list[torch.Tensor]] = [[] for _ in schema.groups]
    for (g, _, _), leaf in zip(schema.slots, leaves, strict=True):
        if g >= 0:
            groups[g].append(leaf)
    return groups


def _own_memory(leaf: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """A flat view of ``leaf`` to send from or receive into, where it is contiguous on ``device``."""
    return leaf.view(-1) if leaf.is_contiguous() and leaf.device == device else None


def data_layout(schema: Schema) -> tuple[int, list[int]]:
    """The size in bytes of ``schema``'s data message and each dtype group's byte offset in it
    (8-aligned, in group order); a consolidated schema's data message is its storage."""
    if schema.storage is not None:
        return schema.storage, [0]
    offsets = []
    end = 0
    for group in schema.groups:
        end = (end + 7) // 8 * 8
        offsets.append(end)
        end += group.numel * group.dtype.itemsize
    return end, offsets


def group_views(schema: Schema, data: torch.Tensor) -> list[torch.Tensor]:
    """Each dtype group of ``schema`` as a typed flat view of the data message ``data`` (bytes);
    a consolidated schema: the storage itself."""
    if schema.storage is not None:
        return [data]
    _, offsets = data_layout(schema)
    return [
        data[at : at + g.numel * g.dtype.itemsize].view(g.dtype) for g, at in zip(schema.groups, offsets, strict=True)
    ]


def staged_views(
    schema: Schema,
    leaves: list[torch.Tensor],
    device: torch.device,
    storage: torch.Tensor | None = None,
    prefix: int = 0,
    framed: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], bool]:
    """The messages to receive ``leaves`` (of ``schema``'s layout) into, and the tensors that need
    a copy after receipt with the message views to copy from (``torch._foreach_copy_(dst, src)``).

    The messages are the data message (bytes: every dtype group, see :func:`data_layout`), then
    one per direct (big) leaf.  The data message is the leaves' own memory where the one group's
    leaves are one run of memory (an anonymous memory-mapped tree), or ``storage`` for a
    consolidated schema (pass the target's own storage only when its byte layout is the
    schema's); else a staging buffer, copied from per group where a group's leaves are one run
    (or into ``storage``), else per leaf.  ``prefix``: the data message starts with that many
    bytes of header (a staging buffer then, except ``framed``: the ``prefix`` bytes of room before
    ``storage`` and ``storage``, one tensor, which the message then is).  A big leaf is received
    into its own memory where it is contiguous.

    Returns:
        ``(messages, dst, src, leafwise)``; ``leafwise``: the copy writes through the leaves
        themselves (bumping their version counters), not only through views of their runs.
    """
    size, _ = data_layout(schema)
    runs: list[torch.Tensor | None]
    if schema.storage is not None:
        fits = storage is not None and storage.numel() == size and storage.device == device
        runs = [storage if fits else None]
    else:
        runs = [
            contiguous_run(members, group.dtype, device)
            for group, members in zip(schema.groups, _grouped(schema, leaves), strict=True)
        ]
    only = runs[0] if len(runs) == 1 else None
    if only is not None and not prefix:
        message = data = _bytes(only)
    elif (
        only is not None
        and framed is not None
        and framed.numel() == prefix + size
        and framed.device == device
        and framed[prefix:].data_ptr() == only.data_ptr()
    ):
        message, data = framed, framed[prefix:]  # the header lands in the room before the storage
    else:
        message = torch.empty(prefix + size, dtype=torch.uint8, device=device)
        data = message[prefix:]
    msgs = [data]
    for i, _ in schema.direct:
        leaf = leaves[i]
        own = _own_memory(leaf, device)
        msgs.append(own if own is not None else torch.empty(leaf.numel(), dtype=leaf.dtype, device=device))
    dst: list[torch.Tensor] = []
    src: list[torch.Tensor] = []
    for run, view in zip(runs, group_views(schema, data), strict=True):
        if run is not None and run.data_ptr() != view.data_ptr() and run.numel():
            dst.append(raw(run))
            src.append(raw(view))
    leafwise = schema.storage is not None and bool(dst)  # the storage: its views share its counter
    for (g, _, _), leaf, view in zip(schema.slots, leaves, Transport.unpack(schema, msgs), strict=True):
        if g >= 0 and runs[g] is not None:
            continue  # copied with its group
        in_place = leaf.numel() == 0 or (
            view.data_ptr() == leaf.data_ptr() and view.device == leaf.device and leaf.is_contiguous()
        )
        if not in_place:
            dst.append(raw(leaf))
            src.append(raw(view))
            leafwise = True
    msgs[0] = message
    return msgs, dst, src, leafwise


GRAIN = 32768  # torch's intra-op grain: a smaller ``cat`` runs its serial kernel, whatever the threads


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``dst`` bit for bit (the same number of bytes): one ``memmove`` on the
    CPU, where torch would spread a big copy over its intra-op threads (on a busy machine their
    hand-offs cost more than the copy), else ``copy_``."""
    if dst.device.type == "cpu" and src.device.type == "cpu" and dst.is_contiguous() and src.is_contiguous():
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size())
    else:
        raw(dst).copy_(raw(src))


def copier(dst: list[torch.Tensor], src: list[torch.Tensor]) -> tuple[Callable[[], None], bool]:
    """The function copying each ``src`` into its ``dst`` (bit for bit), and whether it moves the
    version counters of the ``dst``: each of at least :data:`GRAIN` elements with
    :func:`copy_bytes`, the small ones on the CPU with one :class:`FusedCopy` (one indexed kernel,
    where they qualify), else in one ``torch._foreach_copy_`` (which moves the counters)."""
    big = [(d, s) for d, s in zip(dst, src, strict=True) if d.numel() >= GRAIN]
    small_dst = [d for d in dst if d.numel() < GRAIN]
    small_src = [s for d, s in zip(dst, src, strict=True) if d.numel() < GRAIN]
    fused = fused_copy(small_dst, small_src) if small_dst else None
    if fused is not None:
        small_dst, small_src = [], []
    moves = bool(small_dst) or any(d.device.type != "cpu" for d, _ in big)

    def copy() -> None:
        with torch.no_grad():
            for d, s in big:
                copy_bytes(d, s)
            if fused is not None:
                fused()
            if small_dst:
                torch._foreach_copy_(small_dst, small_src)  # one fused call (torch has no public name)

    return copy, moves


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype is not torch.uint8 else t


def raw(t: torch.Tensor) -> torch.Tensor:
    """``t`` to copy bit for bit: a bool tensor as its bytes (``copy_`` turns any non-zero byte
    of a bool into 1), any other as is."""
    return t.view(torch.uint8) if t.dtype is torch.bool else t


class Transport:
    """The process group, its device and timeout, and the messages of one transfer.

    Messages go through the process group's own ``send``/``recv``/``broadcast`` (what
    ``torch.distributed.isend`` and the others call after their checks, made once here).

    Args:
        group: the process group (None: the default one).
        timeout: seconds each wait may take (None: the group's own timeout).

    Raises:
        DistributedError: no process group, or this rank is not in ``group``.
    """

    def __init__(self, group: Any, timeout: float | None) -> None:
        if not dist.is_initialized():
            raise DistributedError(
                "torch.distributed is not initialized: call torch.distributed.init_process_group first."
            )
        pg: Any = group if group is not None else dist.group.WORLD
        known = _GROUPS.get(id(pg))
        if known is None or known[0]() is not pg:
            rank = dist.get_rank(group)
            if rank < 0:
                raise DistributedError(
                    "This rank is not in the process group it was given: call tdshare.distributed only on its ranks."
                )
            nccl = "nccl" in str(dist.get_backend(group)).lower()
            known = (weakref.ref(pg), rank, dist.get_world_size(group), nccl)
            _GROUPS[id(pg)] = known
        self.group = group
        self.pg = pg
        self.timeout = timeout
        _, self.rank, self.world, nccl = known
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else _CPU

    # -- waiting ----------------------------------------------------------------------------
    def wait_all(self, works: list[Any], what: str, timeout: float | None = None) -> None:
        """Wait for ``works``; a failure or timeout is a :class:`PeerError` naming ``what`` (the peer)."""
        limit = self.timeout if timeout is None else timeout
        try:
            if limit is None:
                for work in works:
                    work.wait()
            else:
                span = timedelta(seconds=limit)
                for work in works:
                    work.wait(span)
        except TdshareError:
            raise
        except RuntimeError as exc:
            raise peer_error(exc, what, limit) from exc

    # -- buffers ----------------------------------------------------------------------------
    def pack(self, schema: Schema, leaves: list[torch.Tensor], prefix: int = 0) -> list[torch.Tensor]:
        """The messages of ``leaves`` (new buffers): the data message (``prefix`` bytes of room
        for a header, then every dtype group at its offset, see :func:`data_layout`; a
        consolidated schema's storage), then each direct (big) leaf, from its own memory where it
        is contiguous on this transport's device."""
        size, _ = data_layout(schema)
        message = torch.zeros(prefix + size, dtype=torch.uint8, device=self.device)
        msgs = [message[prefix:]]
        for i, _ in schema.direct:
            leaf = leaves[i].detach()
            own = _own_memory(leaf, self.device)
            msgs.append(own if own is not None else leaf.contiguous().to(self.device).view(-1))
        packed = [
            (raw(view), raw(leaf.detach()))
            for (g, _, _), view, leaf in zip(schema.slots, self.unpack(schema, msgs), leaves, strict=True)
            if g >= 0 and leaf.numel()
        ]
        if packed:
            with torch.no_grad():
                torch._foreach_copy_([v for v, _ in packed], [t for _, t in packed])
        msgs[0] = message
        return msgs

    def allocate(self, schema: Schema, prefix: int = 0) -> list[torch.Tensor]:
        """Empty messages for ``schema``: its data message (after ``prefix`` bytes of header),
        then its direct leaves."""
        msgs = [torch.empty(prefix + data_layout(schema)[0], dtype=torch.uint8, device=self.device)]
        for i, dtype in schema.direct:
            msgs.append(torch.empty(schema.slots[i][2], dtype=dtype, device=self.device).view(-1))
        return msgs

    @staticmethod
    def unpack(schema: Schema, msgs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The leaves of ``schema`` as views of its messages (the data message, then the direct leaves)."""
        groups = group_views(schema, _bytes(msgs[0]))
        out = []
        direct = 1
        for (g, offset, shape), dtype in zip(schema.slots, schema.dtypes, strict=True):
            if g < 0:
                out.append(msgs[direct].view(shape))
                direct += 1
                continue
            n = 1
            for d in shape:
                n *= d
            if schema.storage is not None:  # a byte offset into the one storage
                out.append(groups[0][offset : offset + n * dtype.itemsize].view(dtype).view(shape))
            else:
                out.append(groups[g][offset : offset + n].view(shape))
        return out

    # -- point to point ---------------------------------------------------------------------
    def post_send(self, msgs: list[torch.Tensor], dst: int, tag: int) -> list[Any]:
        """Post ``msgs`` (in order; as bytes) to ``dst``; return the works."""
        send = self.pg.send
        try:
            return [send([_bytes(m)], dst, tag) for m in msgs]
        except RuntimeError as exc:
            raise peer_error(exc, f"send to rank {dst}") from exc

    def opening(self, header: Header, size: int) -> torch.Tensor:
        """A first message of ``size`` bytes (what the peer posted for it) holding only ``header``
        (a header alone: kept for the next transfer of the same schema, never written again)."""
        if size != HEADER_BYTES:
            return header.write(torch.zeros(size, dtype=torch.uint8, device=self.device))
        key = (header, self.device)
        message = _OPENINGS.pop(key, None)
        if message is None:
            message = header.write(torch.zeros(size, dtype=torch.uint8, device=self.device))
        _OPENINGS[key] = message  # most recent last
        while len(_OPENINGS) > 64:
            del _OPENINGS[next(iter(_OPENINGS))]
        return message

    def text(self, text: bytes) -> torch.Tensor:
        """A schema text as a message."""
        return torch.frombuffer(bytearray(text), dtype=torch.uint8).to(self.device)

    def header_buffer(self) -> torch.Tensor:
        """An empty buffer for a header alone."""
        return torch.empty(HEADER_BYTES, dtype=torch.uint8, device=self.device)

    def recv_bytes(self, n: int, src: int, tag: int, peer: str) -> bytes:
        """Receive ``n`` bytes (a schema's text) from ``src``."""
        buf = torch.empty(n, dtype=torch.uint8, device=self.device)
        self.wait_all(self.post_recv([buf], src, tag), f"recv from {peer}")
        return bytes(buf.cpu().numpy().tobytes())

    def post_recv(self, flats: list[torch.Tensor], src: int, tag: int) -> list[Any]:
        """Post the receipt of ``flats`` (in order; the empty ones left out) from ``src``."""
        recv = self.pg.recv
        try:
            return [recv([_bytes(f)], src, tag) for f in flats if f.numel()]
        except RuntimeError as exc:
            raise peer_error(exc, f"recv from rank {src}") from exc

    # -- collectives ------------------------------------------------------------------------
    def _broadcast(self, t: torch.Tensor, src: int, peer: str) -> None:
        self.wait_all([self.broadcast_one(t, src, peer)], f"broadcast from {peer}")

    def broadcast_one(self, message: torch.Tensor, src: int, peer: str) -> Any:
        """Start broadcasting ``message`` from ``src`` (elsewhere: into it); return the work."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        opts.asyncOp = True
        try:
            return self.pg.broadcast([_bytes(message)], opts)
        except RuntimeError as exc:
            raise peer_error(exc, f"broadcast from {peer}") from exc

    def broadcast_bytes(self, data: bytes | int, src: int, peer: str) -> bytes:
        """Broadcast bytes from ``src`` (elsewhere pass their length); return them on every rank."""
        if isinstance(data, bytes):
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            buf = torch.empty(data, dtype=torch.uint8, device=self.device)
        self._broadcast(buf, src, peer)
        return data if isinstance(data, bytes) else bytes(buf.cpu().numpy().tobytes())

    def broadcast_all(self, flats: list[torch.Tensor], src: int, peer: str) -> None:
        """Broadcast every non-empty buffer from ``src``."""
        works = [self.broadcast_one(f, src, peer) for f in flats if f.numel()]
        self.wait_all(works, f"broadcast from {peer}")

    def all_gather_header(self, header: Header, what: str) -> list[Header]:
        """Every rank's header, in rank order."""
        mine = header.tensor().to(self.device)
        outs = [torch.empty_like(mine) for _ in range(self.world)]
        with peer_errors(f"{what} (a rank of the group)"):
            work = dist.all_gather(outs, mine, group=self.group, async_op=True)
        self.wait_all([work], f"{what} (a rank of the group)")
        return [Header.from_tensor(o) for o in outs]

    def all_gather_object(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj`` (small: schemas), in rank order."""
        outs: list[Any] = [None] * self.world
        with peer_errors(f"{what} (a rank of the group)"):
            dist.all_gather_object(outs, obj, group=self.group)
        return outs

    def all_gather_buffers(self, flats: list[torch.Tensor], what: str) -> list[list[torch.Tensor]]:
        """Every rank's buffers: ``result[rank][group]``."""
        per_rank: list[list[torch.Tensor]] = [[] for _ in range(self.world)]
        works = []
        for flat in flats:
            outs = [torch.empty_like(flat) for _ in range(self.world)]
            if flat.numel():
                with peer_errors(f"{what} (a rank of the group)"):
                    works.append(
                        dist.all_gather([_bytes(o) for o in outs], _bytes(flat), group=self.group, async_op=True)
                    )
            for r, o in enumerate(outs):
                per_rank[r].append(o)
        self.wait_all(works, f"{what} (a rank of the group)")
        return per_rank
