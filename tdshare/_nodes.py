"""The container kinds of a tensor tree: one registry that every walker dispatches through.

A value inside a tensordict is either a tensor leaf or a *node*: a nested collection or a
non-tensor value.  Each node kind is registered once, here, with

- its **layout** on disk (:data:`tdshare._format.LEVEL`, ``VALUE``, ``STACK``, ``WRAPPED``...),
  which tells the writer what to write and the loader (:func:`tdshare._format.layout_of`) what
  it finds;
- its **entry type**, the marker its parent's ``meta.json`` holds (``{"type": "TensorDict"}``);
- its in-memory class.

The walkers (the model's ``set``, the save planner, the installer, the loader, the refresher,
the entries code, the command line) ask :func:`kind_of` what a value is and branch on
``kind.layout``, so that a new container kind (a tensorclass, a lazy stack) is one
:func:`register` call next to its class, plus the code for its layout where the layout is new.
The built-in kinds are registered beside their classes: ``TENSORDICT`` in
:mod:`tdshare._tensordict_base`, ``NONTENSOR`` in :mod:`tdshare._nontensor`.

>>> import torch
>>> from tdshare import TensorDict, NonTensorData
>>> kind_of(TensorDict({}, batch_size=[])).layout, kind_of(NonTensorData("x")).entry_type
('level', 'NonTensorData')
>>> kind_of(torch.zeros(2)) is None
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["NodeKind", "register", "unregister", "kind_of", "kind_for_tag"]


@dataclass(frozen=True, slots=True)
class NodeKind:
    """One container kind: its name, its layout on disk and the marker its parent writes.

    Attributes:
        name: a readable name for messages (``"TensorDict"``).
        layout: what its folder holds (a layout of :mod:`tdshare._format`).
        entry_type: the ``type`` of its entry in the parent level's ``meta.json``.
        cls: the in-memory class (subclasses are the same kind unless registered themselves).
        type_tag: the ``_type`` marker its own ``meta.json`` holds (read back by :func:`kind_for_tag`).
        unwrap: for a :data:`~tdshare._format.WRAPPED` kind, ``value -> (collection, fields)``: the
            collection saved in ``_tensordict/`` and the JSON fields written beside ``_type``.
        wrap: the inverse, ``(collection, fields) -> value``, used by the loader.
    """

    name: str
    layout: str
    entry_type: str
    cls: type
    type_tag: str | None = None
    unwrap: Callable[[Any], tuple[Any, dict[str, Any]]] | None = None
    wrap: Callable[[Any, dict[str, Any]], Any] | None = None

    @property
    def entry(self) -> dict[str, str]:
        """The parent's ``meta.json`` entry for a node of this kind (a new dict each call)."""
        return {"type": self.entry_type}


# type -> kind (None: a tensor leaf), filled lazily along each type's MRO; reads need no lock
_BY_TYPE: dict[type, NodeKind | None] = {}
_BY_TAG: dict[str, NodeKind] = {}
_KINDS: list[NodeKind] = []
_LOCK = threading.Lock()


def register(kind: NodeKind) -> NodeKind:
    """Make ``kind.cls`` (and its subclasses) a node of ``kind``; return ``kind``."""
    with _LOCK:
        _KINDS[:] = [k for k in _KINDS if k.cls is not kind.cls] + [kind]  # registering again replaces
        if kind.type_tag is not None:
            _BY_TAG[kind.type_tag] = kind
        _BY_TYPE.clear()  # subclasses resolved before may now resolve to the new kind
    return kind


def unregister(kind: NodeKind) -> None:
    """Forget ``kind`` (a class that is being discarded, or a test's)."""
    with _LOCK:
        _KINDS[:] = [k for k in _KINDS if k is not kind]
        if kind.type_tag is not None and _BY_TAG.get(kind.type_tag) is kind:
            del _BY_TAG[kind.type_tag]
        _BY_TYPE.clear()


def kind_for_tag(tag: object) -> NodeKind | None:
    """The registered kind whose ``meta.json`` carries the ``_type`` marker ``tag``, if any.

    Only classes already imported (and registered) are found: reading metadata never imports."""
    return _BY_TAG.get(tag) if type(tag) is str else None


def _resolve(tp: type) -> NodeKind | None:
    best: NodeKind | None = None
    for kind in _KINDS:
        if issubclass(tp, kind.cls) and (best is None or issubclass(kind.cls, best.cls)):
            best = kind  # the most derived registered class wins
    _BY_TYPE[tp] = best
    return best


def kind_of(value: Any) -> NodeKind | None:
    """The node kind of ``value``, or None for a tensor leaf (one dict lookup once a type is known)."""
    tp = type(value)
    try:
        return _BY_TYPE[tp]
    except KeyError:
        return _resolve(tp)
