"""Whole tensor trees over ``torch.distributed``: schema once, then one message per dtype group.

A transfer sends a small header (the schema's hashes), the schema itself only when the peer has
not seen it (the first transfer, or after a change: keys, dtypes, shapes or a non-tensor value),
then one flat buffer per dtype (see :mod:`tdshare._schema`).  The receiver writes into the
tensordict it is given, in place (directly into the leaves' memory where a dtype's leaves are one
contiguous run, as in an anonymous memory-mapped tree; through one staging buffer otherwise), or
builds a new one from the schema.  A changed schema is always detected by its hash and never
misread: a receiving tree of another layout raises :class:`SchemaMismatchError`, which carries the
tree that arrived.  Errors of the process group (a timeout, a dead peer) raise :class:`PeerError`
naming the peer.

Works with gloo (CPU tensors) and NCCL (CUDA tensors: the buffers live on the current device).

>>> import torch, torch.distributed as dist
>>> from tdshare import TensorDict
>>> # rank 0: send(TensorDict(a=torch.ones(3), batch_size=[3]), dst=1)
>>> # rank 1: td = recv(None, src=0)   # or recv(preallocated, src=0), filled in place
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist

from ._errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError
from ._nodes import kind_of
from ._schema import Schema, build_tree, describe, leaves_of, schema_of, value_of
from ._sync import sync_tree
from ._transport import (
    HEADER_BYTES,
    DistributedError,
    Header,
    PeerError,
    Transport,
    data_layout,
    inline,
    raw,
    require_group,
)
from ._wire_plan import Plan, kept_plan, plan_for

__all__ = [
    "DistributedError",
    "PeerError",
    "Schema",
    "SchemaMismatchError",
    "Transfer",
    "all_gather",
    "broadcast",
    "irecv",
    "isend",
    "leaves_of",
    "recv",
    "scatter",
    "schema_of",
    "send",
    "sync",
]


class SchemaMismatchError(DistributedError):
    """The tree that arrived has another layout than the one it was to be written into.

    Attributes:
        received: the tree that arrived (a new tensordict of the sender's schema), so that nothing
            sent is lost; the target was left untouched.
    """

    def __init__(self, message: str, received: Any = None) -> None:
        super().__init__(message)
        self.received = received

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.received))


_SCATTER_TAG = 0x7D5C  # scatter's own tag, away from the small tags users pick

# what each side last sent / received, per (process group, peer, tag): the schema is resent on change
# what each side of a stream (process group, peer, tag) knows: the schemas last sent / received,
# most recent last; the text is sent only for a schema the peer lacks, and both sides evict alike
_Stream = tuple[int, int, Any]
_SENT: dict[_Stream, OrderedDict[int, tuple[bool, int]]] = {}  # digest: (inline, data message size)
_SEEN: dict[_Stream, OrderedDict[int, Schema]] = {}
_KNOWN = 8


def _remember(
    book: dict[tuple[int, int, Any], OrderedDict[int, Any]], key: tuple[int, int, Any], digest: int, value: Any
) -> None:
    known = book.setdefault(key, OrderedDict())
    known[digest] = value
    known.move_to_end(digest)
    while len(known) > _KNOWN:
        known.popitem(last=False)


def _last(book: dict[_Stream, OrderedDict[int, Any]], key: _Stream) -> Any:
    """The digest (sender) or schema (receiver) of the stream's last transfer, or None."""
    known = book.get(key)
    return known[next(reversed(known))] if known else None


def _group_key(group: Any) -> int:
    return id(group if group is not None else dist.group.WORLD)


def _check_collection(td: Any, what: str) -> None:
    if kind_of(td) is None or isinstance(td, torch.Tensor):
        raise ArgumentTypeError(f"{what} expects a tensordict, tensorclass or lazy stack, got {type(td).__name__}.")


def _check_rank(rank: Any, what: str, group: Any) -> None:
    require_group()
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise ArgumentTypeError(f"{what}: the peer rank must be an int, got {type(rank).__name__}.")
    world = dist.get_world_size(group)
    if not 0 <= rank < world:
        raise InvalidArgumentError(f"{what}: rank {rank} is outside the group of {world} ranks (0..{world - 1}).")


def _opening(known: OrderedDict[int, tuple[bool, int]] | None) -> tuple[int | None, int, bool]:
    """The stream's last schema digest (sender side), the size of the first message its receiver
    posts (the header, with that schema's data where it travels inline) and whether the
    receiver posted that schema's separate data message with it."""
    if not known:
        return None, HEADER_BYTES, False
    last = next(reversed(known))
    rides, size = known[last]
    return last, HEADER_BYTES + size if rides else HEADER_BYTES, not rides


class _Outgoing:
    """A tree's messages on a stream whose sender knows ``known`` (the schemas it sent, the last
    one last).  The last schema again: the header with the data after it in one message where
    it travels :func:`inline`, else the header, the data message and the big leaves.  Another
    schema: a first message of the size the receiver posted (the header, zero-padded where the
    last schema's data was to come inline), an empty notice where the receiver posted the last
    schema's data message with the header (``notice``: point to point), the schema text where
    the peer lacks it, then the data message and the big leaves.  ``reuse``: pack into the
    tree's kept buffers (the caller waits for the send to complete before it returns)."""

    def __init__(
        self,
        td: Any,
        transport: Transport,
        allow_pickle: bool,
        known: OrderedDict[int, tuple[bool, int]] | None,
        reuse: bool,
        collective: bool,
    ) -> None:
        self.td = td
        plan = plan_for(td, allow_pickle)
        schema = self.schema = plan.schema
        self.wire = (inline(schema, collective), data_layout(schema)[0])
        last, opening, split = _opening(known)
        self.notice: list[torch.Tensor] = []
        if schema.digest == last and self.wire[0]:
            first, *direct = plan.buffers(transport, reuse, HEADER_BYTES)
            self.msgs = [Header(schema.digest, schema.layout_digest, 0, True).write(first), *direct]
            return
        text = b"" if known and schema.digest in known else schema.to_json().encode()
        self.msgs = [transport.opening(Header(schema.digest, schema.layout_digest, len(text)), opening)]
        if schema.digest != last and split and not collective:
            self.notice.append(torch.empty(0, dtype=torch.uint8, device=transport.device))
        if text:
            self.msgs.append(transport.text(text))
        self.msgs.extend(b for b in plan.buffers(transport, reuse) if b.numel())

    def remember(self, key: _Stream) -> None:
        """Record the schema as the stream's last one sent."""
        _remember(_SENT, key, self.schema.digest, self.wire)


class Transfer:
    """A transfer in flight (from :func:`isend` / :func:`irecv`): ``wait()`` gives the tree.

    >>> # handle = isend(td, dst=1); ...; handle.wait(timeout=30)
    """

    def __init__(self, finish: Any, works: list[Any] | None = None) -> None:
        self._finish = finish
        self._works = works or []
        self._result: Any = None
        self._done = False

    def is_completed(self) -> bool:
        """Whether the messages posted so far have completed (``wait`` may still have work to do)."""
        return self._done or all(w.is_completed() for w in self._works)

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the transfer and return its tree (the sent one, or the received one).

        Args:
            timeout: seconds to wait at most (None: the process group's timeout).

        Raises:
            PeerError: the peer timed out or failed.
        """
        if not self._done:
            self._result = self._finish(timeout)
            self._done = True
        return self._result


def _post_send(
    td: Any, dst: int, group: Any, tag: int, allow_pickle: bool, timeout: float | None, reuse: bool
) -> tuple[_Outgoing, Transport, list[Any]]:
    _check_collection(td, "send")
    _check_rank(dst, "send", group)
    transport = Transport(group, timeout)
    key = (_group_key(group), dst, tag)
    out = _Outgoing(td, transport, allow_pickle, _SENT.get(key), reuse, False)
    first, *rest = out.msgs
    works = transport.post_send([first, *out.notice, *rest], dst, tag)
    out.remember(key)
    return out, transport, works


def send(
    td: Any, dst: int, *, group: Any = None, tag: int = 0, allow_pickle: bool = False, timeout: float | None = None
) -> None:
    """Send the tree ``td`` to rank ``dst``: a header, the schema when ``dst`` lacks it, one buffer per dtype.

    Args:
        td: a tensordict, tensorclass or lazy stack (its members go as one stream).
        dst: the receiving rank (in ``group``).
        group: the process group (None: the default one).
        tag: matches this send with the ``recv`` of the same tag.
        allow_pickle: pickle non-tensor values that JSON cannot hold.
        timeout: seconds to wait at most (None: the process group's timeout).

    Raises:
        PeerError: ``dst`` timed out or failed (the message names it).
        PickleRefusedError: a non-JSON non-tensor value without ``allow_pickle``.

    >>> # rank 0: send(td, dst=1); rank 1: recv(td_like, src=0)
    """
    _, transport, works = _post_send(td, dst, group, tag, allow_pickle, timeout, True)
    transport.wait_all(works, f"send to rank {dst}")


def isend(
    td: Any, dst: int, *, group: Any = None, tag: int = 0, allow_pickle: bool = False, timeout: float | None = None
) -> Transfer:
    """Start sending ``td`` to ``dst`` (as :func:`send`) and return a :class:`Transfer` at once.

    ``td`` must not be changed until ``wait()`` returns (the buffers may view its leaves).

    >>> # handle = isend(td, dst=1); handle.wait()
    """
    out, transport, works = _post_send(td, dst, group, tag, allow_pickle, timeout, False)

    def finish(t: float | None) -> Any:
        transport.wait_all(works, f"send to rank {dst}", t)
        return out.td

    return Transfer(finish, works)


def _resolve_schema(header: Header, text: bytes | None, cache_key: tuple[int, int, Any], peer: str) -> Schema:
    """The schema of ``header``: from its ``text``, else one this rank received before on the stream."""
    if text is not None:
        schema = Schema.from_json(text)
        if schema.digest != header.digest:
            raise SchemaMismatchError(f"The schema from {peer} does not match its own hash: a corrupt transfer.")
    else:
        known = _SEEN.get(cache_key)
        cached = known.get(header.digest) if known else None
        if cached is None:
            raise SchemaMismatchError(
                f"{peer} sent a tree without its schema, believing this rank has it, but this rank "
                f"{'received nothing' if not known else 'does not know that schema'} from it: the two sides' "
                "transfers are out of step (every send needs its recv, in order, with the same tag)."
            )
        schema = cached
    _remember(_SEEN, cache_key, header.digest, schema)
    return schema


def _target_plan(target: Any) -> Plan | None:
    """The plan of a receiving tree (None for no tree or a bare :class:`Schema`)."""
    return None if target is None or isinstance(target, Schema) else plan_for(target, True)


def _out_of_step(peer: str) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"The transfer from {peer} does not follow the last one this rank received on the stream: the two sides' "
        "transfers are out of step (every send needs its recv, in order, with the same tag)."
    )


class _Landing:
    """Where the buffers of ``schema`` go on this rank: ``target``'s memory (through its plan)
    when its layout is the schema's, else new buffers that become a new tree.  ``prefix``: the
    data message starts with a header of that many bytes."""

    def __init__(self, target: Any, plan: Plan | None, schema: Schema, transport: Transport, prefix: int = 0) -> None:
        self.target, self.plan, self.schema, self.transport, self.prefix = target, plan, schema, transport, prefix
        self.fits = plan is not None and plan.schema.layout_digest == schema.layout_digest
        if plan is not None and self.fits:
            self.msgs, self._copy = plan.receiver(schema, transport.device, prefix)
        else:
            self.msgs = transport.allocate(schema, prefix)

    def complete(self, allow_pickle: bool, peer: str) -> Any:
        """The received tree, once every message has arrived (the target, filled; or a new tree)."""
        schema, target = self.schema, self.target
        if self.fits and self.plan is not None:
            self._copy()
            if self.plan.schema.content_digest != schema.content_digest:
                _assign_values(target, schema.tree, allow_pickle)
            return target
        msgs = [self.msgs[0][self.prefix :], *self.msgs[1:]]
        tree = build_tree(schema, self.transport.unpack(schema, msgs), allow_pickle=allow_pickle)
        if self.plan is not None or (isinstance(target, Schema) and target.layout_digest != schema.layout_digest):
            raise SchemaMismatchError(
                f"The tree from {peer} has another layout (keys, dtypes or shapes) than the target: the target is "
                "untouched; the tree that arrived is this error's .received (receive with None to take any tree).",
                tree,
            )
        return tree


class _Receipt:
    """One receipt on the stream ``key``: the first message to post, and reading its header.

    The first message is the header, with room after it for the data of the stream's last
    schema where that travels inline (:func:`inline`): a staging buffer, the target's kept one,
    posted before the target is checked (:meth:`check`), so that the check runs while the
    message travels; a target found changed gets a new landing and the message copied over."""

    def __init__(self, td: Any, key: _Stream, peer: str, transport: Transport, collective: bool) -> None:
        self.td, self.key, self.peer, self.transport = td, key, peer, transport
        self.last: Schema | None = _last(_SEEN, key)
        self.inline = self.last is not None and inline(self.last, collective)
        self.plan: Plan | None = None
        self.early: _Landing | None = None
        if self.inline and self.last is not None:
            kept = None if td is None or isinstance(td, Schema) else kept_plan(td, True) or plan_for(td, True)
            self.early = _Landing(td, kept, self.last, transport, HEADER_BYTES)
            self.first = self.early.msgs[0]
        else:
            self.first = transport.header_buffer()

    def check(self) -> None:
        """Check the target's plan (see :func:`plan_for`)."""
        self.plan = _target_plan(self.td)

    def header(self) -> tuple[Header, bool]:
        """The header that arrived, and whether it announces the stream's last schema again.

        Raises:
            SchemaMismatchError: the sender is out of step with this rank.
        """
        header = Header.from_tensor(self.first)
        last = self.last
        steady = last is not None and header.digest == last.digest and not header.schema_len
        if header.inline != (steady and self.inline):
            raise _out_of_step(self.peer)
        if steady:
            _resolve_schema(header, None, self.key, self.peer)
        return header, steady

    def inline_landing(self) -> _Landing:
        """The landing of the data that came with the header: the early one, or, where the target
        changed since its plan was kept, a new one with the message copied into it."""
        early = self.early
        assert early is not None and self.last is not None
        if early.plan is self.plan:
            return early
        landing = _Landing(self.td, self.plan, self.last, self.transport, HEADER_BYTES)
        landing.msgs[0].copy_(early.msgs[0])
        return landing


def _assign_values(target: Any, node: dict[str, Any], allow_pickle: bool) -> None:
    """Write the non-tensor values of the schema ``node`` that differ into ``target`` (same layout)."""
    t = node["t"]
    if t == "level":
        for key, child in node["items"]:
            if child["t"] in ("value", "vstack"):
                value = value_of(child, allow_pickle)
                if target.get(key) != value:
                    target.set_(key, value)
            elif child["t"] != "tensor":
                _assign_values(target._tensordict[key], child, allow_pickle)
    elif t == "stack":
        for member, child in zip(target.tensordicts, node["members"], strict=True):
            _assign_values(member, child, allow_pickle)
    elif t == "wrapped":
        kind = kind_of(target)
        assert kind is not None and kind.unwrap is not None
        _assign_values(kind.unwrap(target)[0], node["inner"], allow_pickle)


def _start_recv(td: Any, src: int, group: Any, tag: int, allow_pickle: bool, timeout: float | None) -> tuple[Any, Any]:
    """Post the receipt of a transfer from ``src``: the first message (see :class:`_Receipt`) and,
    when the last schema's data message travels on its own, that message at once (into the
    target where it fits), so an unchanged tree costs no round trip.  Returns the first
    message's work and ``finish(timeout)``."""
    transport = Transport(group, timeout)
    key = (_group_key(group), src, tag)
    peer = f"rank {src}"
    what = f"recv from {peer}"
    receipt = _Receipt(td, key, peer, transport, False)
    split: _Landing | None = None
    if receipt.last is not None and not receipt.inline:
        receipt.check()
        split = _Landing(td, receipt.plan, receipt.last, transport)
    first = transport.post_recv([receipt.first], src, tag)
    split_works = transport.post_recv(split.msgs[:1], src, tag) if split is not None else []
    if split is None:
        receipt.check()  # while the message travels

    def finish(t: float | None) -> Any:
        # with the header, the last schema's data message, or the empty notice of another schema
        transport.wait_all(first + split_works, what, t)
        header, steady = receipt.header()
        if steady:
            landing = receipt.inline_landing() if split is None else split
            transport.wait_all(transport.post_recv(landing.msgs[1:], src, tag), what, t)
            return landing.complete(allow_pickle, peer)
        text = transport.recv_bytes(header.schema_len, src, tag, peer) if header.schema_len else None
        schema = _resolve_schema(header, text, key, peer)
        landing = _Landing(td, receipt.plan, schema, transport)
        transport.wait_all(transport.post_recv(landing.msgs, src, tag), what, t)
        return landing.complete(allow_pickle, peer)

    return first[0], finish


def _check_target(target: Any, what: str) -> None:
    if target is not None and not isinstance(target, Schema):
        _check_collection(target, what)


def recv(
    td: Any, src: int, *, group: Any = None, tag: int = 0, allow_pickle: bool = False, timeout: float | None = None
) -> Any:
    """Receive a tree from rank ``src`` into ``td`` (in place) and return it.

    Args:
        td: the tree to fill (its leaves are written in place, its non-tensor values updated), or
            None (or a :class:`Schema`) to build a new tree from the sender's schema.
        src: the sending rank.
        group, tag, timeout: as for :func:`send`.
        allow_pickle: load pickled non-tensor values.

    Returns:
        ``td`` filled, or the new tree.

    Raises:
        SchemaMismatchError: the sender's tree has another layout than ``td`` (``td`` is untouched;
            the error's ``received`` holds what arrived).
        PeerError: ``src`` timed out or failed.
        PickleRefusedError: a pickled value without ``allow_pickle``.

    >>> # td = recv(TensorDict(a=torch.empty(3), batch_size=[3]), src=0)
    """
    _check_target(td, "recv")
    _check_rank(src, "recv", group)
    return _start_recv(td, src, group, tag, allow_pickle, timeout)[1](None)


def irecv(
    td: Any, src: int, *, group: Any = None, tag: int = 0, allow_pickle: bool = False, timeout: float | None = None
) -> Transfer:
    """Start receiving from ``src`` (as :func:`recv`); the returned :class:`Transfer`'s ``wait()`` gives the tree.

    The header is posted at once, with the data message of the schema last received from ``src``
    (into ``td`` where it fits: do not use ``td`` until ``wait()`` returns); the rest (a new
    schema, big leaves) is received inside ``wait``.

    >>> # handle = irecv(td, src=0); ...; td = handle.wait()
    """
    _check_target(td, "irecv")
    _check_rank(src, "irecv", group)
    work, finish = _start_recv(td, src, group, tag, allow_pickle, timeout)
    return Transfer(finish, [work])


def broadcast(td: Any, src: int, *, group: Any = None, allow_pickle: bool = False, timeout: float | None = None) -> Any:
    """Broadcast the tree of rank ``src`` to every rank of ``group``; return each rank's tree.

    Args:
        td: on ``src``, the tree to send; elsewhere the tree to fill in place, or None (or a
            :class:`Schema`) to build one.
        src: the broadcasting rank.
        group, allow_pickle, timeout: as for :func:`send` / :func:`recv`.

    Raises:
        SchemaMismatchError: on a receiving rank whose ``td`` has another layout.
        PeerError: a rank timed out or failed.

    >>> # td = broadcast(td if rank == 0 else None, src=0)
    """
    _check_rank(src, "broadcast", group)
    transport = Transport(group, timeout)
    key = (_group_key(group), -1 - src, "broadcast")
    peer = f"rank {src} (broadcast)"
    if transport.rank == src:
        _check_collection(td, "broadcast")
        out = _Outgoing(td, transport, allow_pickle, _SENT.get(key), True, True)
        works = [transport.broadcast_one(m, src, peer) for m in out.msgs]
        transport.wait_all(works, f"broadcast from {peer}")
        out.remember(key)
        return td
    _check_target(td, "broadcast")
    receipt = _Receipt(td, key, peer, transport, True)
    work = transport.broadcast_one(receipt.first, src, peer)
    receipt.check()  # while the message travels
    transport.wait_all([work], f"broadcast from {peer}")
    header, steady = receipt.header()
    if steady and receipt.inline:
        landing = receipt.inline_landing()
        transport.broadcast_all(landing.msgs[1:], src, peer)
        return landing.complete(allow_pickle, peer)
    if steady and receipt.last is not None:
        schema = receipt.last
    else:
        text = transport.broadcast_bytes(header.schema_len, src, peer) if header.schema_len else None
        schema = _resolve_schema(header, text, key, peer)
    landing = _Landing(td, receipt.plan, schema, transport)
    transport.broadcast_all(landing.msgs, src, peer)
    return landing.complete(allow_pickle, peer)


def all_gather(td: Any, *, group: Any = None, allow_pickle: bool = False, timeout: float | None = None) -> Any:
    """Gather every rank's tree of one layout, stacked along a new leading dim (rank order).

    Args:
        td: this rank's tree; every rank's must have the same keys, dtypes and shapes
            (non-tensor values may differ: they become one value per rank).
        group, allow_pickle, timeout: as for :func:`send`.

    Returns:
        the stack (``torch.stack`` of the ranks' trees), on every rank.

    Raises:
        SchemaMismatchError: the layouts differ (the message names the ranks), on every rank.
        PeerError: a rank timed out or failed.

    >>> # stacked = all_gather(td); stacked.batch_size == (world_size, *td.batch_size)
    """
    _check_collection(td, "all_gather")
    transport = Transport(group, timeout)
    schema, leaves = describe(td, allow_pickle=allow_pickle)
    headers = transport.all_gather_header(Header(schema.digest, schema.layout_digest, 0), "all_gather")
    odd = [r for r, h in enumerate(headers) if h.layout_digest != schema.layout_digest]
    if odd:
        raise SchemaMismatchError(
            f"all_gather: the trees of ranks {odd} have another layout than this rank's ({transport.rank}): every "
            "rank must gather the same keys, dtypes and shapes."
        )
    if all(h.digest == schema.digest for h in headers):
        schemas = [schema] * len(headers)
    else:
        texts = transport.all_gather_object(schema.to_json(), "all_gather")
        schemas = [Schema.from_json(t) for t in texts]
    gathered = transport.all_gather_buffers(transport.pack(schema, leaves), "all_gather")
    trees = [
        build_tree(s, transport.unpack(s, flats), allow_pickle=allow_pickle)
        for s, flats in zip(schemas, gathered, strict=True)
    ]
    return torch.stack(trees, 0)


def scatter(
    td: Any, src: int, *, out: Any = None, group: Any = None, allow_pickle: bool = False, timeout: float | None = None
) -> Any:
    """Give rank ``r`` the element ``td[r]`` of the stacked tree ``td`` of rank ``src``.

    Args:
        td: on ``src``, a tree whose leading batch dim is the group's size (ignored elsewhere).
        src: the scattering rank.
        out: the tree to fill in place on this rank (None: a new one; on ``src``, ``td[src]``).
        group, allow_pickle, timeout: as for :func:`send`.

    Returns:
        this rank's element.

    Raises:
        BatchSizeError: on ``src``, a leading dim other than the group's size.
        SchemaMismatchError / PeerError: as for :func:`recv`.

    >>> # mine = scatter(stacked if rank == 0 else None, src=0)
    """
    _check_rank(src, "scatter", group)
    transport = Transport(group, timeout)
    if transport.rank != src:
        return recv(out, src, group=group, tag=_SCATTER_TAG, allow_pickle=allow_pickle, timeout=timeout)
    _check_collection(td, "scatter")
    world = transport.world
    if not td.batch_size or td.batch_size[0] != world:
        raise BatchSizeError(
            f"scatter: the tree's batch size {list(td.batch_size)} must lead with the group's size {world} "
            "(one element per rank); stack the elements first."
        )
    handles = [
        isend(td[r], r, group=group, tag=_SCATTER_TAG, allow_pickle=allow_pickle, timeout=timeout)
        for r in range(world)
        if r != src
    ]
    for handle in handles:
        handle.wait(timeout)
    mine = td[src]
    if out is None:
        return mine
    for dst_leaf, src_leaf in zip(leaves_of(out), leaves_of(mine), strict=True):
        raw(dst_leaf).copy_(raw(src_leaf))  # bit for bit (bools too)
    return out


def sync(
    td: Any,
    src: int,
    *,
    group: Any = None,
    store: Any = None,
    name: str = "default",
    allow_pickle: bool = False,
    timeout: float | None = None,
) -> Any:
    """Replicate ``src``'s structure changes (new entries, non-tensor values) into every rank's ``td``.

    Collective: every rank of ``group`` calls it with its own copy.  ``src`` publishes its schema's
    hash through the ``Store`` (one write); the others read it (one round trip) and, when it is
    what they already have, return at once, with no data moved.  Otherwise they read the schema
    from the store, add the entries they lack (``make_memmap`` on a memory-mapped tree, so they go
    into its folder), set the changed non-tensor values, and receive the new entries' data
    (broadcast from ``src``).  The first call also sends every leaf.

    Args:
        td: this rank's tensordict (a tensorclass's fields count; not a lazy stack).
        src: the rank whose tree is the reference.
        group: the process group (None: the default one).
        store: the ``torch.distributed.Store`` (None: the default group's).
        name: names this replicated tree (several may be kept in sync independently).
        allow_pickle, timeout: as for :func:`send`.

    Returns:
        ``td``.

    Raises:
        NotSupportedError: a lazy stack, or an entry removed on ``src``.
        PeerError: ``src`` timed out.

    >>> # sync(td, src=0)   # on every rank, after rank 0 called td.make_memmap("new", [4])
    """
    _check_collection(td, "sync")
    _check_rank(src, "sync", group)
    transport = Transport(group, timeout)
    return sync_tree(td, src, transport, store, name, allow_pickle, broadcast)
