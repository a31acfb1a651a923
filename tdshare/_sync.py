"""Replicated refresh (:func:`tdshare.distributed.sync`): a generation check through the ``Store``.

Each call is step ``n`` of the tree ``name``.  The source rank writes one key
``tdshare/sync/<name>/<n>`` holding its schema's hash and the tensor entries added since its last
call (its schema goes to ``tdshare/schema/<name>/<hash>`` when new); the other ranks read that key
(one round trip, which also orders them after the source) and stop there when the hash is what
their own tree has.  Otherwise they read the schema, create the entries they lack, set the
non-tensor values that changed, and receive the added entries' data by broadcast.

>>> _STEPS.get("never-synced", 0)
0
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ._errors import NotSupportedError
from ._format import LEVEL, WRAPPED
from ._nodes import kind_of
from ._schema import Schema, dtype_from_name, schema_of, value_of
from ._transport import PeerError, Transport

__all__ = ["sync_tree"]

_STEPS: dict[str, int] = {}
_PUBLISHED: dict[str, tuple[int, set[tuple[str, ...]]]] = {}


def _level_of(td: Any) -> Any:
    kind = kind_of(td)
    if kind is not None and kind.layout == WRAPPED and kind.unwrap is not None:
        return kind.unwrap(td)[0]
    if kind is None or kind.layout != LEVEL:
        raise NotSupportedError(
            f"sync works on a tensordict or a tensorclass, not a {type(td).__name__}: sync each member of a lazy "
            "stack as its own tree (name=...)."
        )
    return td


def _entries(node: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """(key, node) of every tensor and non-tensor entry of nested levels."""
    out = []
    for key, child in node.get("items", ()):
        path = (*prefix, key)
        if child["t"] == "level":
            out.extend(_entries(child, path))
        elif child["t"] in ("tensor", "value", "vstack"):
            out.append((path, child))
        else:
            raise NotSupportedError(
                f"sync: the entry {path!r} is a {child['t']} node; sync handles nested tensordicts."
            )
    return out


def _store_of(store: Any) -> Any:
    if store is not None:
        return store
    # the default group's store: torch has no public accessor for it
    return dist.distributed_c10d._get_default_store()


def _get(store: Any, key: str, src: int) -> bytes:
    try:
        return bytes(store.get(key))
    except RuntimeError as exc:  # the store's timeout: the source never reached this step
        raise PeerError(
            f"sync: rank {src} did not publish {key!r} in time ({str(exc).splitlines()[0]}); is it alive and calling "
            "sync with the same name?",
            f"rank {src}",
        ) from exc


def sync_tree(
    td: Any, src: int, transport: Transport, store: Any, name: str, allow_pickle: bool, broadcast: Callable[..., Any]
) -> Any:
    """Bring ``td`` in line with rank ``src``'s tree (see the module docstring); return ``td``."""
    level = _level_of(td)
    store = _store_of(store)
    step = _STEPS.get(name, 0) + 1
    _STEPS[name] = step
    key = f"tdshare/sync/{name}/{step}"
    group = transport.group
    if transport.rank == src:
        schema = schema_of(level, allow_pickle=allow_pickle)
        tensors = {path for path, node in _entries(schema.tree) if node["t"] == "tensor"}
        last = _PUBLISHED.get(name)
        added = sorted(tensors - last[1]) if last is not None else sorted(tensors)
        if last is None or last[0] != schema.digest:
            store.set(f"tdshare/schema/{name}/{schema.digest}", schema.to_json())
        store.set(key, json.dumps({"d": schema.digest, "added": [list(k) for k in added]}))
        _PUBLISHED[name] = (schema.digest, tensors)
        if added:
            broadcast(level.select(*added), src, group=group, allow_pickle=allow_pickle, timeout=transport.timeout)
        return td
    msg = json.loads(_get(store, key, src))
    added = [tuple(k) for k in msg["added"]]
    mine = schema_of(level, allow_pickle=True)
    if msg["d"] == mine.digest and not added:
        return td
    theirs = (
        mine if msg["d"] == mine.digest else Schema.from_json(_get(store, f"tdshare/schema/{name}/{msg['d']}", src))
    )
    for path, node in _entries(theirs.tree):
        present = path in level
        if node["t"] == "tensor":
            if not present:
                shape, dtype = node["shape"], dtype_from_name(node["dtype"])
                if level.is_memmap():
                    level.make_memmap(path, shape, dtype=dtype)
                else:
                    with level.unlock_():
                        level.set(path, torch.zeros(shape, dtype=dtype))
            continue
        value = value_of(node, allow_pickle)
        if not present:
            with level.unlock_():
                level.set(path, value)
        elif level.get(path) != value:
            level.set_(path, value)
    if added:
        broadcast(level.select(*added), src, group=group, allow_pickle=allow_pickle, timeout=transport.timeout)
    return td
