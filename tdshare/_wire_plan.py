"""Per-tree transfer plans: the schema, leaves and buffers of a tree, kept while the tree is unchanged.

Describing a 1,000-leaf tree, packing its leaves and laying out the receiving buffers costs far
more Python than the transfer itself, so :func:`plan_for` keeps, per tree object (weakly), a
:class:`Plan`: the schema (consolidated trees: of their one storage), the leaves in schema order,
the sender's packed buffers and the flat views packed from, and the receiver's messages and copy
lists per sender layout.  Each call checks the plan is still the tree's at C speed: every level's
entry dict (the same dict, its batch size, and CPython's version tag of the dict, which every
write into it moves, whatever the code path: one integer per level; where the interpreter keeps
no such tag, its keys and values by identity), every non-tensor value by its JSON text, every
leaf's address and version counter, and, where that counter moved (an in-place operation, which
an in-place shape or stride change is too), its shape, strides and dtype; any difference builds a
new plan.  The leaves of a consolidated tree are views of its storage and share its version
counter: while the storage's address and counter are unchanged, nothing else is read.

>>> import torch
>>> from tdshare import TensorDict
>>> td = TensorDict(a=torch.zeros(3), b=torch.ones(2, dtype=torch.int64), batch_size=[])
>>> plan_for(td, False) is plan_for(td, False)
True
"""

from __future__ import annotations

import ctypes
import json
import sys
import weakref
from collections.abc import Callable
from operator import attrgetter, is_
from typing import Any

import torch

from ._consolidate import HEAD_ROOM, ConsolidateOps, consolidated_message, consolidated_parts
from ._format import LEVEL, STACK, VALUE, VALUE_STACK, WRAPPED
from ._nodes import kind_of
from ._schema import Schema, describe
from ._transport import (
    GRAIN,
    HEADER_BYTES,
    Header,
    Transport,
    contiguous_run,
    copier,
    copy_bytes,
    data_layout,
    group_views,
    inline,
    staged_views,
)
from ._wire_span import FusedCopy, fused_copy

__all__ = ["Plan", "kept_plan", "plan_for"]

_shape = attrgetter("shape")
_dtype = attrgetter("dtype")
_ptr = torch.Tensor.data_ptr
_stride = torch.Tensor.stride
_version = attrgetter("_version")

Check = tuple[Callable[..., bool], tuple[Any, ...]]


def _dict_tag_offset() -> int | None:
    """The byte offset of CPython's dict version tag (PEP 509) in a dict object, where this
    interpreter keeps one that every write into a dict moves (any key set, replaced, deleted or
    renamed, by any code path, through any reference to the dict); None where it does not (tried
    on a probe dict: each kind of write must move it, a read must not)."""
    if sys.implementation.name != "cpython" or sys.version_info >= (3, 12):
        return None  # 3.12 deprecated the tag (and 3.14 dropped it): the per-entry check then
    offset = 3 * ctypes.sizeof(ctypes.c_ssize_t)  # after the refcount, the type and ma_used
    probe: dict[str, Any] = {"a": 1, "b": 2}
    tag = ctypes.c_uint64.from_address(id(probe) + offset)
    writes: list[Callable[[dict[str, Any]], Any]] = [
        lambda d: d.__setitem__("c", 3),
        lambda d: d.__setitem__("a", object()),
        lambda d: d.__delitem__("c"),
        lambda d: d.pop("b"),
        lambda d: d.update(b=4),
        lambda d: d.setdefault("e", 5),
        lambda d: d.popitem(),
        lambda d: d.__ior__({"f": 6}),
        lambda d: d.clear(),
    ]
    for write in writes:
        before = tag.value
        write(probe)
        if tag.value == before:
            return None
    before = tag.value
    _ = probe.get("f"), len(probe), list(probe)
    return offset if tag.value == before else None


_TAG_OFFSET = _dict_tag_offset()


def _dict_tag(entries: dict[str, Any]) -> ctypes.c_uint64 | None:
    """A reader of ``entries``' version tag (valid while ``entries`` lives), or None."""
    return None if _TAG_OFFSET is None else ctypes.c_uint64.from_address(id(entries) + _TAG_OFFSET)


def _same_tagged_level(node: Any, entries: dict[str, Any], tag: ctypes.c_uint64, version: int, batch: Any) -> bool:
    return node._tensordict is entries and tag.value == version and node.batch_size == batch


def _same_level(node: Any, entries: dict[str, Any], keys: list[str], values: list[Any], batch: Any) -> bool:
    return (
        node._tensordict is entries
        and len(entries) == len(values)
        and all(map(is_, entries.values(), values))
        and list(entries) == keys
        and node.batch_size == batch
    )


def _same_stack(node: Any, members: list[Any], dim: int) -> bool:
    now = node.tensordicts
    return len(now) == len(members) and all(map(is_, now, members)) and node.stack_dim == dim


def _same_wrapped(node: Any, unwrap: Any, inner: Any, fields: str) -> bool:
    now, now_fields = unwrap(node)
    return now is inner and repr(now_fields) == fields


def _same_value(node: Any, stack: bool, text: str) -> bool:
    try:
        return json.dumps(node.tolist() if stack else node.data) == text
    except (TypeError, ValueError):
        return False


def _watch(node: Any, checks: list[Check]) -> bool:
    """Append the checks that ``node`` (not the root: see :class:`Plan`) is unchanged; False where
    only a full description can tell (a value JSON cannot hold, an unknown kind)."""
    kind = kind_of(node)
    if kind is None:
        return True  # a tensor: checked with the leaves
    if kind.layout == LEVEL:
        entries = node._tensordict
        tag = _dict_tag(entries) if type(entries) is dict else None
        if tag is not None:  # one integer for the whole entry dict
            checks.append((_same_tagged_level, (node, entries, tag, tag.value, node.batch_size)))
        else:
            checks.append((_same_level, (node, entries, list(entries), list(entries.values()), node.batch_size)))
        return all(_watch(v, checks) for v in entries.values())
    if kind.layout == STACK:
        members = list(node.tensordicts)
        checks.append((_same_stack, (node, members, node.stack_dim)))
        return all(_watch(m, checks) for m in members)
    if kind.layout == WRAPPED and kind.unwrap is not None:
        inner, fields = kind.unwrap(node)
        checks.append((_same_wrapped, (node, kind.unwrap, inner, repr(fields))))
        return _watch(inner, checks)
    if kind.layout in (VALUE, VALUE_STACK):
        stack = kind.layout == VALUE_STACK
        try:
            text = json.dumps(node.tolist() if stack else node.data)
        except (TypeError, ValueError):
            return False
        checks.append((_same_value, (node, stack, text)))
        return True
    return False


def _storage_of(tree: Any) -> torch.Tensor | None:
    """The one ``uint8`` storage of a consolidated tree (a tensorclass: of its tensordict), or None."""
    kind = kind_of(tree)
    inner = kind.unwrap(tree)[0] if kind is not None and kind.layout == WRAPPED and kind.unwrap is not None else tree
    if not isinstance(inner, ConsolidateOps) or not inner.is_consolidated():
        return None
    return consolidated_parts(inner)[0]


class Plan:
    """The schema, leaves and buffers of one tree (see the module docstring).

    Args:
        tree: the tensor collection.
        allow_pickle: as for ``describe``.
    """

    def __init__(self, tree: Any, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle
        self.storage = _storage_of(tree)
        self.schema: Schema
        self.schema, self.leaves = describe(tree, allow_pickle=allow_pickle, storage=self.storage)
        if self.schema.storage is None:
            self.storage = None  # a leaf outside the storage: sent as a plain tree
        # whether the data rides in the header's message, its size, and that header (the same
        # schema again), worked out once
        self.wire = (inline(self.schema), data_layout(self.schema)[0])
        self.steady_header = Header(self.schema.digest, self.schema.layout_digest, 0, True).pack()
        # an in-memory consolidated tree: the header's room before its storage (one message, no copy)
        self.framed = consolidated_message(tree) if self.storage is not None else None
        if self.framed is not None and (
            HEAD_ROOM != HEADER_BYTES
            or self.storage is None
            or self.framed.numel() != HEADER_BYTES + self.storage.numel()
            or self.framed[HEADER_BYTES:].data_ptr() != self.storage.data_ptr()
        ):
            self.framed = None
        # the header's room as bytes in Python's own buffer protocol: written and compared without a
        # ctypes call or a tensor op, each some µs when a busy machine runs it with cold caches
        self.room = _room(self.framed) if self.framed is not None and self.framed.device.type == "cpu" else None
        with torch._C.DisableTorchFunctionSubclass():
            self.shapes = list(map(_shape, self.leaves))
            self.strides = list(map(_stride, self.leaves))
            self.dtypes = list(map(_dtype, self.leaves))
            self.ptrs = list(map(_ptr, self.leaves))
            self.versions = list(map(_version, self.leaves))
        # a consolidated tree (is_consolidated(): its leaves are the views consolidate made of its
        # storage, so they share the storage's version counter): one counter and address for all
        self.storage_ptr = 0
        self.storage_version: int | None = None
        if self.storage is not None and all(v == self.storage._version for v in self.versions):
            self.storage_ptr, self.storage_version = self.storage.data_ptr(), self.storage._version
        # the root is checked through the tree handed to valid(), never kept alive by the plan
        checks: list[Check] = []
        self.reusable = _watch(tree, checks)
        self.root: Check | None = None
        if checks:  # the root's check without the root itself
            fn, args = checks.pop(0)
            self.root = (fn, args[1:])
        self.checks = checks
        self._send: dict[tuple[torch.device, int], _SendLayout | None] = {}
        self._recv: dict[tuple[int, int, bool], tuple[list[torch.Tensor], Callable[[], None] | None, bool]] = {}

    def valid(self, tree: Any) -> bool:
        """Whether ``tree`` is still what this plan was made of (nothing added, replaced, reshaped,
        re-typed or moved; non-tensor values unchanged)."""
        if not self.reusable:
            return False
        if self.root is not None:
            fn, args = self.root
            if not fn(tree, *args):
                return False
        for fn, args in self.checks:
            if not fn(*args):
                return False
        if type(self.storage) is torch.Tensor and self._storage_unchanged():
            return True  # (a plain tensor's methods: no need to turn subclass dispatch off first)
        with torch._C.DisableTorchFunctionSubclass():  # a tensor subclass's methods at C speed too
            return self._leaves_unchanged()

    def _storage_unchanged(self) -> bool:
        """A consolidated tree's one address and version counter are the plan's: its leaves are
        views sharing that counter, so nothing was written or moved in place."""
        storage = self.storage
        return (
            self.storage_version is not None
            and storage is not None
            and storage._version == self.storage_version
            and storage.data_ptr() == self.storage_ptr
        )

    def _leaves_unchanged(self) -> bool:
        if self._storage_unchanged():
            return True
        storage = self.storage
        leaves = self.leaves
        if list(map(_ptr, leaves)) != self.ptrs:
            return False
        versions = list(map(_version, leaves))
        if versions != self.versions:  # an in-place operation since (an in-place reshape is one too)
            if (
                list(map(_shape, leaves)) != self.shapes
                or list(map(_stride, leaves)) != self.strides
                or not all(map(is_, map(_dtype, leaves), self.dtypes))
            ):
                return False
            self.versions = versions
        if self.storage_version is not None and storage is not None:
            self.storage_ptr, self.storage_version = storage.data_ptr(), storage._version
        return True

    # -- sending ------------------------------------------------------------------------------
    def buffers(self, transport: Transport, reuse: bool, prefix: int = 0) -> list[torch.Tensor]:
        """The messages to send: the data message (the consolidated storage itself; the one
        group's leaves where they are its one run; else every group packed, by one indexed
        gather each where its leaves qualify, see :func:`fused_copy`), then each big leaf's own
        memory.  ``prefix``: the data message
        starts with that many bytes of room for a header (then a packed buffer, the storage or
        the run copied in once, except an in-memory consolidated tree's: its storage with the
        room :func:`consolidate` left before it).  ``reuse``: pack into the plan's buffer (the caller
        waits for the send before the next one), else into a new one."""
        if self.storage is not None and self.storage.device == transport.device:
            if not prefix:
                return [self.storage]
            if prefix == HEADER_BYTES and self.framed is not None:
                return [self.framed]  # the header goes into the room before the storage
        key = (transport.device, prefix)
        if key not in self._send:
            self._send[key] = self._send_layout(transport, prefix)
        layout = self._send[key]
        if layout is None:
            return transport.pack(self.schema, self.leaves, prefix)
        ops, data, views, direct = layout
        if ops is None:
            return [data, *direct]  # the leaves' own memory
        if not reuse:
            data = torch.empty_like(data)
            views = _views(ops, group_views(self.schema, data[prefix:]))
        with torch.no_grad():
            for (_, _, _, part), view in zip(ops, views, strict=True):
                if isinstance(part, torch.Tensor):
                    copy_bytes(view, part)  # a run, the storage or a big leaf, bit for bit
                elif isinstance(part, FusedCopy):
                    part(words=view)  # the group's leaves, gathered in one indexed kernel
                else:
                    torch.cat(part, out=view)
        return [data, *direct]

    def _send_layout(self, transport: Transport, prefix: int) -> _SendLayout | None:
        """``(ops, data, their views of data, direct leaves)``: each op ``(group, start, numel,
        part)`` packs ``part`` into its group at element ``start``: a group's run, the
        consolidated storage or a big leaf (copied); a :class:`FusedCopy` of the group's leaves
        (one indexed kernel, where they qualify); else lists of flat leaves, concatenated, under
        :data:`GRAIN` elements, so that ``cat`` runs its serial kernel (ops None: the data
        message is the one group's run); None where a leaf is not a contiguous tensor on the
        transport's device."""
        device = transport.device
        schema = self.schema
        size = data_layout(schema)[0]
        ops: list[_Op] = []
        if schema.storage is not None:
            if self.storage is None or self.storage.device != device:
                return None
            data = torch.empty(prefix + size, dtype=torch.uint8, device=device)
            ops = [(0, 0, size, self.storage)]
            return ops, data, _views(ops, group_views(schema, data[prefix:])), []
        if any(t.device != device or not t.is_contiguous() for t in self.leaves):
            return None
        members: list[list[torch.Tensor]] = [[] for _ in schema.groups]
        for (g, _, _), leaf in zip(schema.slots, self.leaves, strict=True):
            if g >= 0:
                members[g].append(leaf.detach())
        direct = [self.leaves[i].detach().view(-1) for i, _ in schema.direct]
        runs = [contiguous_run(m, g.dtype, device) for g, m in zip(schema.groups, members, strict=True)]
        if len(runs) == 1 and runs[0] is not None and not prefix:
            data = runs[0].view(torch.uint8)
            return None, data, group_views(schema, data), direct
        data = torch.empty(prefix + size, dtype=torch.uint8, device=device)
        groups = group_views(schema, data[prefix:])
        for g, (run, m) in enumerate(zip(runs, members, strict=True)):
            if run is not None:
                ops.append((g, 0, run.numel(), run))
                continue
            gathered = _gathered(m, groups[g])
            ops.extend([(g, 0, groups[g].numel(), gathered)] if gathered is not None else _chunked(g, m))
        return ops, data, _views(ops, groups), direct

    # -- receiving ----------------------------------------------------------------------------
    def receiver(
        self, sent: Schema, device: torch.device, prefix: int = 0, direct: bool = False
    ) -> tuple[list[torch.Tensor], Callable[[], None]]:
        """The messages to receive ``sent``'s buffers into (this tree's memory where it can be:
        see ``staged_views``; ``prefix``: room for a header before the data; ``direct``: an
        in-memory consolidated tree of the same byte layout receives header and storage into its
        own room and storage) and the function that copies what was staged into the leaves, kept
        for the sender's layout."""
        key = (sent.wire_digest, prefix, direct)
        if key not in self._recv:
            own = self.storage if self.schema.wire_digest == sent.wire_digest else None
            framed = self.framed if direct and own is not None else None
            msgs, dst, src, leafwise = staged_views(sent, self.leaves, device, own, prefix, framed)
            copy, moves = copier(dst, src) if dst else (None, False)
            self._recv[key] = (msgs, copy, leafwise and moves)
        msgs, copy, leafwise = self._recv[key]

        def finish() -> None:
            if copy is not None:
                copy()
                if leafwise:
                    self._wrote()

        return msgs, finish

    def _wrote(self) -> None:
        """Take the version counters the receipt's own copy just moved as the plan's (nothing
        else ran since :meth:`valid`), so that the next check stays the quick one."""
        storage = self.storage
        if self.storage_version is not None and storage is not None:
            self.storage_version = storage._version
        else:
            with torch._C.DisableTorchFunctionSubclass():
                self.versions = list(map(_version, self.leaves))


def _room(framed: torch.Tensor) -> memoryview:
    """The :data:`HEADER_BYTES` bytes at the start of the CPU tensor ``framed`` (kept alive by
    its owner), as a writable ``memoryview``."""
    return memoryview((ctypes.c_char * HEADER_BYTES).from_address(framed.data_ptr())).cast("B")


_Op = tuple[int, int, int, Any]  # (group, element start, numel, a tensor to copy or a list to concatenate)
_SendLayout = tuple[list[_Op] | None, torch.Tensor, list[torch.Tensor], list[torch.Tensor]]


def _views(ops: list[_Op], groups: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each op's slice of its group's view (a :class:`FusedCopy`'s as the words it writes: made
    once for the plan's buffer, not at each send)."""
    views = [groups[g][start : start + n] for g, start, n, _ in ops]
    return [part.words(v) if isinstance(part, FusedCopy) else v for v, (_, _, _, part) in zip(views, ops, strict=True)]


def _gathered(members: list[torch.Tensor], group: torch.Tensor) -> FusedCopy | None:
    """The copy packing ``members`` back to back into ``group`` (their flat dtype view) with one
    indexed kernel, where they qualify (see :func:`fused_copy`)."""
    dst, at = [], 0
    for leaf in members:
        dst.append(group[at : at + leaf.numel()])
        at += leaf.numel()
    return fused_copy(dst, members)


def _chunked(g: int, members: list[torch.Tensor]) -> list[_Op]:
    """The ops packing group ``g``'s ``members`` (back to back, in order): lists of flat leaves
    under :data:`GRAIN` elements each, and each leaf of at least that many alone."""
    ops: list[_Op] = []
    batch: list[torch.Tensor] = []
    start = n = 0
    for leaf in members:
        k = leaf.numel()
        if not k:
            continue
        if batch and (k >= GRAIN or n + k >= GRAIN):
            ops.append((g, start, n, batch))
            start, batch, n = start + n, [], 0
        if k >= GRAIN:
            ops.append((g, start, k, leaf.view(-1)))
            start += k
        else:
            batch.append(leaf.view(-1))
            n += k
    if batch:
        ops.append((g, start, n, batch))
    return ops


_PLANS: dict[tuple[int, bool], Plan] = {}
_PLANS_SIZE = 64


_REFS: dict[tuple[int, bool], weakref.ref[Any]] = {}


def _forget(key: tuple[int, bool], plan: Plan) -> Callable[[Any], None]:
    """A weakref callback dropping ``plan`` when its tree dies (unless a newer plan took the key)."""

    def drop(_: Any) -> None:
        if _PLANS.get(key) is plan:
            del _PLANS[key]
            _REFS.pop(key, None)

    return drop


def kept_plan(tree: Any, allow_pickle: bool) -> Plan | None:
    """The plan kept for ``tree``, if any, without checking it is still valid (a receiver posts
    into its staging buffer while the check runs)."""
    key = (id(tree), allow_pickle)
    plan = _PLANS.get(key)
    ref = _REFS.get(key)
    return plan if plan is not None and ref is not None and ref() is tree else None


def plan_for(tree: Any, allow_pickle: bool) -> Plan:
    """The plan of ``tree``: the kept one while :meth:`Plan.valid`, else a new one (kept while the
    tree lives, for the 64 most recent trees).

    Raises:
        as ``describe``.
    """
    key = (id(tree), allow_pickle)
    plan = _PLANS.get(key)
    ref = _REFS.get(key)
    if plan is not None and ref is not None and ref() is tree and plan.valid(tree):
        return plan
    plan = Plan(tree, allow_pickle)
    if not plan.reusable:
        return plan
    try:
        ref = weakref.ref(tree, _forget(key, plan))
    except TypeError:  # no weak references to this kind: not kept
        return plan
    if key not in _PLANS and len(_PLANS) >= _PLANS_SIZE:
        old = next(iter(_PLANS))
        del _PLANS[old]
        _REFS.pop(old, None)
    _PLANS[key] = plan
    _REFS[key] = ref
    return plan
