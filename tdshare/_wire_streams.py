"""The streams under :mod:`tdshare.distributed`: what each side knows, and a transfer's messages.

A stream is a (process group, peer, tag) of point to point transfers, or a group's broadcasts
from one rank.  Each side remembers the stream's last 8 schemas (the sender's with the size of
their data messages), alike, so that a schema's text is sent only once and each side knows
what the other posts.  :class:`Outgoing` is a tree's messages on a stream; :class:`Receipt` is
the first message a receiver posts (the header, with the last schema's data where that travels
inline) and reads; :class:`Landing` is where a schema's buffers go (a target's memory, or new
buffers that become a new tree).

>>> import torch
>>> from tdshare import TensorDict
>>> from tdshare._schema import schema_of
>>> class Cpu: device = torch.device("cpu")
>>> td = TensorDict(a=torch.zeros(3), batch_size=[3])
>>> landing = Landing(td, plan_for(td, True), schema_of(td), Cpu(), HEADER_BYTES)
>>> landing.fits, landing.msgs[0].numel()  # the target fits: a header, then 3 float32 to copy in
(True, 76)
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import torch

from ._nodes import kind_of
from ._schema import Schema, build_tree, value_of
from ._transport import (
    HEADER_BYTES,
    DistributedError,
    Header,
    Transport,
    copy_bytes,
    inline,
    read_header,
    write_header,
)
from ._wire_plan import Plan, kept_plan, plan_for

__all__ = [
    "Landing",
    "Outgoing",
    "Receipt",
    "SchemaMismatchError",
    "framed_receipt",
    "framed_send",
    "forget_framed_receipt",
    "keep_framed_receipt",
    "resolve_schema",
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


def _opening(known: OrderedDict[int, tuple[bool, int]] | None) -> tuple[int | None, int, bool]:
    """The stream's last schema digest (sender side), the size of the first message its receiver
    posts (the header, with that schema's data where it travels inline) and whether the
    receiver posted that schema's separate data message with it."""
    if not known:
        return None, HEADER_BYTES, False
    last = next(reversed(known))
    rides, size = known[last]
    return last, HEADER_BYTES + size if rides else HEADER_BYTES, not rides


class Outgoing:
    """A tree's messages on the stream ``key``.

    The last schema again: the header with the data after it in one message where it travels
    :func:`inline`, else the header, the data message and the big leaves.  Another schema: a
    first message of the size the receiver posted (the header, zero-padded where the last
    schema's data was to come inline), an empty notice where the receiver posted the last
    schema's data message with the header (``notice``: point to point), the schema text where
    the peer lacks it, then the data message and the big leaves.  ``reuse``: pack into the
    tree's kept buffers (the caller waits for the send to complete before it returns)."""

    def __init__(
        self,
        td: Any,
        transport: Transport,
        allow_pickle: bool,
        key: _Stream,
        reuse: bool,
        collective: bool,
    ) -> None:
        self.td, self.key = td, key
        known = _SENT.get(key)
        plan = plan_for(td, allow_pickle)
        schema = self.schema = plan.schema
        self.wire = plan.wire
        self.notice: list[torch.Tensor] = []
        # the stream's last schema again, its data inline: the header the plan packed, then the data
        self.steady = known is not None and bool(known) and self.wire[0] and next(reversed(known)) == schema.digest
        _FRAMED_OUT.pop(key, None)
        if self.steady:
            first, *direct = plan.buffers(transport, reuse, HEADER_BYTES)
            self.msgs = [write_header(first, plan.steady_header), *direct]
            if not collective and not direct and first is plan.framed:
                _keep(_FRAMED_OUT, key, td, (plan, allow_pickle))
            return
        last, opening, split = _opening(known)
        text = b"" if known and schema.digest in known else schema.to_json().encode()
        if not collective and transport.device.type == "cpu":
            opening = HEADER_BYTES  # gloo takes a shorter message: the rest of what was posted stays untouched
        self.msgs = [transport.opening(Header(schema.digest, schema.layout_digest, len(text)), opening)]
        if schema.digest != last and split and not collective:
            self.notice.append(torch.empty(0, dtype=torch.uint8, device=transport.device))
        if text:
            self.msgs.append(transport.text(text))
        self.msgs.extend(b for b in plan.buffers(transport, reuse) if b.numel())

    def remember(self) -> None:
        """Record the schema as the stream's last one sent (once its messages are posted)."""
        if not self.steady:  # else it is the last one already
            _remember(_SENT, self.key, self.schema.digest, self.wire)


def resolve_schema(header: Header, text: bytes | None, cache_key: tuple[int, int, Any], peer: str) -> Schema:
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


class Landing:
    """Where the buffers of ``schema`` go on this rank: ``target``'s memory (through its plan)
    when its layout is the schema's, else new buffers that become a new tree.  ``prefix``: the
    data message starts with a header of that many bytes; ``direct``: it may land in the room
    and storage of a tree consolidated in memory (then ``direct`` stays true: the first message
    is the target's own memory)."""

    def __init__(
        self,
        target: Any,
        plan: Plan | None,
        schema: Schema,
        transport: Transport,
        prefix: int = 0,
        direct: bool = False,
    ) -> None:
        self.target, self.plan, self.schema, self.transport, self.prefix = target, plan, schema, transport, prefix
        self.fits = plan is not None and plan.schema.layout_digest == schema.layout_digest
        self.direct = False
        if plan is not None and self.fits:
            self.msgs, self._copy = plan.receiver(schema, transport.device, prefix, direct)
            framed = plan.framed
            self.direct = direct and framed is not None and self.msgs[0].data_ptr() == framed.data_ptr()
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


class Receipt:
    """One receipt on the stream ``key``: the first message to post, and reading its header.

    The first message is the header, with room after it for the data of the stream's last
    schema where that travels inline (:func:`inline`): a staging buffer, the target's kept one,
    posted before the target is checked (:meth:`check`), so that the check runs while the
    message travels; a target found changed gets a new landing and the message copied over.
    Point to point on the CPU, a target consolidated in memory (of the sender's byte layout)
    receives it into the room before its storage and its storage: checked first, then."""

    def __init__(self, td: Any, key: _Stream, peer: str, transport: Transport, collective: bool) -> None:
        self.td, self.key, self.peer, self.transport = td, key, peer, transport
        self.last: Schema | None = _last(_SEEN, key)
        self.inline = self.last is not None and inline(self.last)
        self.plan: Plan | None = None
        self.checked = False
        self.early: Landing | None = None
        if self.inline and self.last is not None:
            direct = not collective and transport.device.type == "cpu"
            kept = None if td is None or isinstance(td, Schema) else kept_plan(td, True) or plan_for(td, True)
            self.early = Landing(td, kept, self.last, transport, HEADER_BYTES, direct)
            if self.early.direct:  # the target's own memory: checked before anything lands in it
                self.check()
                if self.plan is not kept:
                    self.early = Landing(td, self.plan, self.last, transport, HEADER_BYTES, direct)
            self.first = self.early.msgs[0]
        else:
            self.first = transport.header_buffer()

    def check(self) -> None:
        """Check the target's plan (see :func:`plan_for`), once."""
        if not self.checked:
            self.plan = _target_plan(self.td)
            self.checked = True

    def header(self) -> tuple[Header, bool]:
        """The header that arrived, and whether it announces the stream's last schema again.

        Raises:
            SchemaMismatchError: the sender is out of step with this rank.
        """
        last = self.last
        if last is not None:
            expected = _steady_header(last, self.inline)
            if read_header(self.first) == expected[0]:  # the stream's last schema again
                known = _SEEN.get(self.key)
                if not known or next(reversed(known)) != last.digest:  # another receipt came between
                    resolve_schema(expected[1], None, self.key, self.peer)
                return expected[1], True
        header = Header.from_tensor(self.first)
        steady = last is not None and header.digest == last.digest and not header.schema_len
        if header.inline != (steady and self.inline):
            raise _out_of_step(self.peer)
        if steady:
            resolve_schema(header, None, self.key, self.peer)
        return header, steady

    def inline_landing(self) -> Landing:
        """The landing of the data that came with the header: the early one, or, where the target
        changed since its plan was kept, a new one with the message copied into it."""
        early = self.early
        assert early is not None and self.last is not None
        if early.plan is self.plan:
            return early
        landing = Landing(self.td, self.plan, self.last, self.transport, HEADER_BYTES)
        copy_bytes(landing.msgs[0], early.msgs[0])
        return landing


# -- steady streams of a tree consolidated in memory ----------------------------------------------
# A point-to-point stream whose last transfer sent (received) a tree consolidated in memory again,
# unchanged, as one message from (into) the room before its storage and the storage: the next
# transfer of that same tree checks it (:meth:`Plan.valid`) and posts at once.  On a warm stream
# this is a few µs either way; what it saves is the code run between two transfers, which on a
# busy machine runs with cold caches (the Outgoing and Receipt machinery measured 23 µs on the
# sender before its post and 16 µs on the receiver after its wait, between two gloo ranks).
_FRAMED_OUT: dict[_Stream, tuple[weakref.ref[Any], tuple[Plan, bool]]] = {}
_FRAMED_IN: dict[_Stream, tuple[weakref.ref[Any], tuple[Plan, Schema, bytes]]] = {}


def _keep(book: dict[_Stream, Any], key: _Stream, tree: Any, value: tuple[Any, ...]) -> None:
    """Record ``value`` for ``tree`` on the stream ``key``, dropped when the tree dies (the plan
    holds its storage: never kept alive by the record)."""

    def drop(ref: weakref.ref[Any]) -> None:
        entry = book.get(key)
        if entry is not None and entry[0] is ref:
            del book[key]

    try:
        book[key] = (weakref.ref(tree, drop), value)
    except TypeError:  # no weak references to this kind: not kept
        book.pop(key, None)


def framed_send(td: Any, key: _Stream, allow_pickle: bool) -> torch.Tensor | None:
    """The one message of ``td``'s transfer on the stream ``key`` (its header written into the
    room before its storage) where the stream's last transfer sent this tree the same way and
    it is unchanged since, else None (the caller builds an :class:`Outgoing`)."""
    entry = _FRAMED_OUT.get(key)
    if entry is None or entry[0]() is not td:
        return None
    plan, pickled = entry[1]
    if pickled != allow_pickle or not plan.valid(td):
        return None
    if plan.room is None:
        return write_header(plan.framed, plan.steady_header)  # type: ignore[arg-type]  # framed: checked when kept
    plan.room[:] = plan.steady_header
    return plan.framed


def framed_receipt(td: Any, key: _Stream) -> tuple[torch.Tensor, bytes, memoryview | None] | None:
    """Where the stream's last receipt landed ``td`` in its own room and storage (one message)
    and ``td`` is unchanged since: that message (to post), the header that announces the same
    schema again, and the message's first bytes as a ``memoryview`` (None off the CPU); else
    None (the caller builds a :class:`Receipt`).  Once the message arrived, the header it starts
    with equal to that one means the tree is received: nothing else to do; any other header
    goes through :class:`Receipt`, whose first message is that same one."""
    entry = _FRAMED_IN.get(key)
    if entry is None or entry[0]() is not td:
        return None
    plan, schema, header = entry[1]
    if _last(_SEEN, key) is not schema or not plan.valid(td):
        return None  # another schema came since, or the target changed: it is checked anew
    return plan.framed, header, plan.room  # type: ignore[return-value]  # framed: checked when kept


def keep_framed_receipt(receipt: Receipt, landing: Landing) -> None:
    """After a steady receipt completed: record it for :func:`framed_receipt` where it landed
    in the target's own room and storage as one message, else forget the stream's record."""
    key = receipt.key
    _FRAMED_IN.pop(key, None)
    plan, last = landing.plan, receipt.last
    if landing.direct and len(landing.msgs) == 1 and plan is not None and last is not None and receipt.inline:
        if plan.framed is landing.msgs[0] and plan.schema.content_digest == last.content_digest:
            _keep(_FRAMED_IN, key, receipt.td, (plan, last, _steady_header(last, True)[0]))


def forget_framed_receipt(key: _Stream) -> None:
    """A receipt on ``key`` goes the general way: the stream's record no longer holds."""
    _FRAMED_IN.pop(key, None)


_STEADY: OrderedDict[tuple[int, int, bool], tuple[bytes, Header]] = OrderedDict()


def _steady_header(schema: Schema, rides: bool) -> tuple[bytes, Header]:
    """The header announcing ``schema`` again (its data inline where ``rides``), packed and as is
    (the 64 most recent kept)."""
    key = (schema.digest, schema.layout_digest, rides)
    got = _STEADY.get(key)
    if got is None:
        header = Header(schema.digest, schema.layout_digest, 0, rides)
        got = _STEADY[key] = (header.pack(), header)
        while len(_STEADY) > 64:
            _STEADY.popitem(last=False)
    return got


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
