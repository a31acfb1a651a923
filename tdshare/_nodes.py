"""The container kinds of a tensor tree: one registry that every walker dispatches through.

A value inside a tensordict is either a tensor leaf or a *node*: a nested collection or a
non-tensor value.  Each node kind is registered once, here, with

- its **layout** on disk (:data:`tdshare._format.LEVEL`, ``VALUE``, ``STACK``, ``WRAPPED``...),
  which tells the writer what to write and the loader (:func:`tdshare._format.layout_of`) what
  it finds;
- its **entry type**, the marker its parent's ``meta.json`` holds (``{"type": "TensorDict"}``);
- its in-memory class.

The walkers (the save planner, the installer, the loader, the refresher, the entries code, the
command line) ask :func:`kind_of` what a value is and branch on ``kind.layout``, so that a new
container kind (a tensorclass, a lazy stack) is one :func:`register` call next to its class, plus
the code for its layout where the layout is new.

>>> import torch
>>> from tdshare import TensorDict, NonTensorData
>>> kind_of(TensorDict({}, batch_size=[])).layout, kind_of(NonTensorData("x")).entry_type
('level', 'NonTensorData')
>>> kind_of(torch.zeros(2)) is None
True
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, TypeGuard

from ._format import LEVEL, VALUE
from ._nontensor import NonTensorData
from ._tensordict_base import TensorDictBase

__all__ = ["NodeKind", "register", "kind_of", "is_collection", "TENSORDICT", "NONTENSOR"]


@dataclass(frozen=True, slots=True)
class NodeKind:
    """One container kind: its name, its layout on disk and the marker its parent writes.

    Attributes:
        name: a readable name for messages (``"TensorDict"``).
        layout: what its folder holds (a layout of :mod:`tdshare._format`).
        entry_type: the ``type`` of its entry in the parent level's ``meta.json``.
        cls: the in-memory class (subclasses are the same kind unless registered themselves).
    """

    name: str
    layout: str
    entry_type: str
    cls: type

    @property
    def entry(self) -> dict[str, str]:
        """The parent's ``meta.json`` entry for a node of this kind (a new dict each call)."""
        return {"type": self.entry_type}


# type -> kind (None: a tensor leaf), filled lazily along each type's MRO; reads need no lock
_BY_TYPE: dict[type, NodeKind | None] = {}
_KINDS: list[NodeKind] = []
_LOCK = threading.Lock()


def register(kind: NodeKind) -> NodeKind:
    """Make ``kind.cls`` (and its subclasses) a node of ``kind``; return ``kind``."""
    with _LOCK:
        _KINDS.append(kind)
        _BY_TYPE.clear()  # subclasses resolved before may now resolve to the new kind
    return kind


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


def is_collection(value: Any) -> TypeGuard[TensorDictBase]:
    """Whether ``value`` is a node whose folder holds entries of its own (a :data:`LEVEL`)."""
    kind = kind_of(value)
    return kind is not None and kind.layout == LEVEL


TENSORDICT = register(NodeKind("TensorDict", LEVEL, "TensorDict", TensorDictBase))
NONTENSOR = register(NodeKind("NonTensorData", VALUE, "NonTensorData", NonTensorData))
