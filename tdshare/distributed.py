"""Whole tensor trees over ``torch.distributed``: schema once, then one message per dtype group.

A transfer sends a small header (the schema's hashes), the schema itself only when the peer has
not seen it (the first transfer, or after a change: keys, dtypes, shapes or a non-tensor value),
then one flat buffer per dtype (see :mod:`tdshare._schema`); an unchanged tree's header and
small buffers go as one message (see :mod:`tdshare._wire_streams`).  The receiver writes into the
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

from typing import Any

import torch
import torch.distributed as dist

from ._errors import ArgumentTypeError, BatchSizeError, InvalidArgumentError
from ._nodes import kind_of
from ._schema import Schema, build_tree, describe, leaves_of, schema_of
from ._sync import sync_tree
from ._transport import (
    HEADER_BYTES,
    DistributedError,
    Header,
    PeerError,
    Transport,
    copy_bytes,
    raw,
    read_header,
    require_group,
)
from ._wire_streams import (
    Landing,
    Outgoing,
    Receipt,
    SchemaMismatchError,
    forget_framed_receipt,
    framed_receipt,
    framed_send,
    keep_framed_receipt,
    resolve_schema,
)

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


_SCATTER_TAG = 0x7D5C  # scatter's own tag, away from the small tags users pick


def _group_key(group: Any) -> int:
    return id(group if group is not None else dist.group.WORLD)


def _check_collection(td: Any, what: str) -> None:
    if kind_of(td) is None or isinstance(td, torch.Tensor):
        raise ArgumentTypeError(f"{what} expects a tensordict, tensorclass or lazy stack, got {type(td).__name__}.")


def _check_rank(rank: Any, what: str, group: Any, timeout: float | None) -> Transport:
    """The transport of ``group`` (its rank and size known once per group), once ``rank`` is a rank of it."""
    require_group()
    if not isinstance(rank, int) or isinstance(rank, bool):
        raise ArgumentTypeError(f"{what}: the peer rank must be an int, got {type(rank).__name__}.")
    transport = Transport(group, timeout)
    world = transport.world
    if not 0 <= rank < world:
        raise InvalidArgumentError(f"{what}: rank {rank} is outside the group of {world} ranks (0..{world - 1}).")
    return transport


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
) -> tuple[Transport, list[Any]]:
    if type(dst) is int:  # the stream's last tree again, consolidated in memory: one message at once
        key = (_group_key(group), dst, tag)
        message = framed_send(td, key, allow_pickle)
        if message is not None:
            transport = Transport(group, timeout)
            return transport, transport.post_send([message], dst, tag)
    _check_collection(td, "send")
    transport = _check_rank(dst, "send", group, timeout)
    key = (_group_key(group), dst, tag)
    out = Outgoing(td, transport, allow_pickle, key, reuse, False)
    first, *rest = out.msgs
    works = transport.post_send([first, *out.notice, *rest], dst, tag)
    out.remember()
    return transport, works


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
    transport, works = _post_send(td, dst, group, tag, allow_pickle, timeout, True)
    transport.wait_all(works, f"send to rank {dst}")


def isend(
    td: Any, dst: int, *, group: Any = None, tag: int = 0, allow_pickle: bool = False, timeout: float | None = None
) -> Transfer:
    """Start sending ``td`` to ``dst`` (as :func:`send`) and return a :class:`Transfer` at once.

    ``td`` must not be changed until ``wait()`` returns (the buffers may view its leaves).

    >>> # handle = isend(td, dst=1); handle.wait()
    """
    transport, works = _post_send(td, dst, group, tag, allow_pickle, timeout, False)

    def finish(t: float | None) -> Any:
        transport.wait_all(works, f"send to rank {dst}", t)
        return td

    return Transfer(finish, works)


def _start_recv(
    td: Any,
    src: int,
    group: Any,
    tag: int,
    allow_pickle: bool,
    transport: Transport,
    arrived: torch.Tensor | None = None,
) -> tuple[Any, Any]:
    """Post the receipt of a transfer from ``src``: the first message (see :class:`Receipt`) and,
    when the last schema's data message travels on its own, that message at once (into the
    target where it fits), so an unchanged tree costs no round trip.  Returns the first
    message's work (None when ``arrived``) and ``finish(timeout)``.  ``arrived``: the first
    message came already (the quick receipt of :func:`framed_receipt`, whose header announced
    something else)."""
    key = (_group_key(group), src, tag)
    forget_framed_receipt(key)
    peer = f"rank {src}"
    what = f"recv from {peer}"
    receipt = Receipt(td, key, peer, transport, False)
    split: Landing | None = None
    if receipt.last is not None and not receipt.inline:
        receipt.check()
        split = Landing(td, receipt.plan, receipt.last, transport)
    if arrived is None:
        first = transport.post_recv([receipt.first], src, tag)
    else:  # (the same memory, unless the target's plan was made anew: then the header is copied)
        first = []
        if receipt.first.data_ptr() != arrived.data_ptr():
            copy_bytes(receipt.first[:HEADER_BYTES], arrived[:HEADER_BYTES])
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
            tree = landing.complete(allow_pickle, peer)
            if split is None:
                keep_framed_receipt(receipt, landing)
            return tree
        text = transport.recv_bytes(header.schema_len, src, tag, peer) if header.schema_len else None
        schema = resolve_schema(header, text, key, peer)
        landing = Landing(td, receipt.plan, schema, transport)
        transport.wait_all(transport.post_recv(landing.msgs, src, tag), what, t)
        return landing.complete(allow_pickle, peer)

    return (first[0] if first else None), finish


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
    if type(src) is int and td is not None:  # the stream's last tree again, into its own memory
        quick = framed_receipt(td, (_group_key(group), src, tag))
        if quick is not None:
            message, expected, room = quick
            transport = Transport(group, timeout)
            transport.wait_all(transport.post_recv([message], src, tag), f"recv from rank {src}")
            if (room if room is not None else read_header(message)) == expected:
                return td  # the same schema again, its data in the tree's storage: received
            return _start_recv(td, src, group, tag, allow_pickle, transport, message)[1](None)
    _check_target(td, "recv")
    transport = _check_rank(src, "recv", group, timeout)
    return _start_recv(td, src, group, tag, allow_pickle, transport)[1](None)


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
    transport = _check_rank(src, "irecv", group, timeout)
    work, finish = _start_recv(td, src, group, tag, allow_pickle, transport)
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
    transport = _check_rank(src, "broadcast", group, timeout)
    key = (_group_key(group), -1 - src, "broadcast")
    peer = f"rank {src} (broadcast)"
    if transport.rank == src:
        _check_collection(td, "broadcast")
        out = Outgoing(td, transport, allow_pickle, key, True, True)
        works = [transport.broadcast_one(m, src, peer) for m in out.msgs]
        transport.wait_all(works, f"broadcast from {peer}")
        out.remember()
        return td
    _check_target(td, "broadcast")
    receipt = Receipt(td, key, peer, transport, True)
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
        schema = resolve_schema(header, text, key, peer)
    landing = Landing(td, receipt.plan, schema, transport)
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
    transport = _check_rank(src, "scatter", group, timeout)
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
    transport = _check_rank(src, "sync", group, timeout)
    return sync_tree(td, src, transport, store, name, allow_pickle, broadcast)
