"""The node-kind registry: walkers dispatch through it, and a kind registered next to its class
is saved, loaded, archived and mapped anonymously with no change to the I/O modules.

``Pair`` stands for a tensorclass: a class around a collection, saved in the reference's
wrapped layout (its folder's ``meta.json`` holds ``_type`` and its fields, the collection sits in
``_tensordict/``, the parent's entry is ``{"type": <class name>}``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import tdshare
from tdshare import MemoryMappedTensor, TensorDict
from tdshare._format import LEVEL, VALUE, WRAPPED, layout_of
from tdshare._nodes import NodeKind, kind_for_tag, kind_of, register, unregister
from tdshare._nontensor import NONTENSOR
from tdshare._tensordict_base import TENSORDICT, is_collection

TAG = "<class 'test_nodes.Pair'>"


class Pair:
    """A collection and a label, as a tensorclass holds its tensordict and a non-tensor field."""

    def __init__(self, td: TensorDict, label: str) -> None:
        self.td = td
        self.label = label


@pytest.fixture
def pair_kind() -> Iterator[NodeKind]:
    kind = register(
        NodeKind(
            "Pair",
            WRAPPED,
            "Pair",
            Pair,
            type_tag=TAG,
            unwrap=lambda p: (p.td, {"label": p.label}),
            wrap=lambda td, fields: Pair(td, fields["label"]),
        )
    )
    yield kind
    unregister(kind)


def _tree() -> TensorDict:
    td = TensorDict({"y": torch.arange(3.0)}, batch_size=[3])
    td["p"] = Pair(TensorDict({"x": torch.arange(6).reshape(3, 2)}, batch_size=[3]), "left")
    assert td._tensordict["p"].label == "left"  # kept as itself, not wrapped in NonTensorData
    return td


def test_a_registered_wrapper_is_set_as_itself_and_batch_checked(pair_kind: NodeKind) -> None:
    td = TensorDict({}, batch_size=[3])
    with pytest.raises(tdshare.BatchSizeError, match="'p'"):
        td["p"] = Pair(TensorDict({"x": torch.zeros(2)}, batch_size=[2]), "short")
    unregister(pair_kind)
    td["q"] = Pair(TensorDict({}, batch_size=[3]), "plain")
    assert isinstance(td._tensordict["q"], tdshare.NonTensorData)  # unregistered: a plain value


def test_builtin_kinds() -> None:
    td = TensorDict({"n": {"a": torch.zeros(2)}, "s": "text"}, batch_size=[2])
    assert kind_of(td) is TENSORDICT and kind_of(td._tensordict["n"]) is TENSORDICT
    assert kind_of(td._tensordict["s"]) is NONTENSOR
    assert kind_of(td["n", "a"]) is None and kind_of(torch.zeros(1)) is None
    assert is_collection(td) and not is_collection(td._tensordict["s"]) and not is_collection(3)
    assert kind_for_tag(TENSORDICT.type_tag) is TENSORDICT and kind_for_tag("<class 'x.Unknown'>") is None
    assert kind_for_tag({"not": "hashable"}) is None


def test_subclasses_resolve_to_the_most_derived_registration() -> None:
    class Special(TensorDict):
        pass

    assert kind_of(Special({}, batch_size=[])) is TENSORDICT
    special = register(NodeKind("Special", LEVEL, "Special", Special))
    try:
        assert kind_of(Special({}, batch_size=[])) is special
        assert kind_of(TensorDict({}, batch_size=[])) is TENSORDICT
    finally:
        unregister(special)
    assert kind_of(Special({}, batch_size=[])) is TENSORDICT


def test_layouts_of_metadata() -> None:
    assert layout_of({"shape": [2], "_type": "<class 'tensordict._td.TensorDict'>"}) == LEVEL
    assert layout_of({"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": 1}) == VALUE
    assert layout_of({"_is_non_tensor": True}) == VALUE
    assert layout_of({"_type": TAG}) == WRAPPED
    assert layout_of({"_type": ["odd"], "shape": [1]}) == LEVEL


def test_wrapped_kind_in_a_folder(tmp_path: Path, pair_kind: NodeKind) -> None:
    td = _tree()
    td.memmap_(tmp_path)
    assert json.loads((tmp_path / "meta.json").read_text())["p"] == {"type": "Pair"}
    assert json.loads((tmp_path / "p" / "meta.json").read_text()) == {"_type": TAG, "label": "left"}
    inner = json.loads((tmp_path / "p" / "_tensordict" / "meta.json").read_text())
    assert inner["x"]["shape"] == [3, 2] and inner["shape"] == [3]
    assert (tmp_path / "p" / "_tensordict" / "x.memmap").read_bytes() == torch.arange(6).numpy().tobytes()
    pair = td._tensordict["p"]
    assert isinstance(pair, Pair) and isinstance(pair.td["x"], MemoryMappedTensor)  # installed in place
    assert pair.td.is_memmap() and pair.td.saved_path == str(tmp_path / "p" / "_tensordict")

    loaded = TensorDict.load_memmap(tmp_path)
    back = loaded._tensordict["p"]
    assert isinstance(back, Pair) and back.label == "left"
    assert back.td["x"].tolist() == [[0, 1], [2, 3], [4, 5]]
    back.td["x"][0, 0] = 7  # the loaded leaf maps the same file
    assert pair.td["x"][0, 0].item() == 7


def test_wrapped_kind_memmap_copy_leaves_the_source(tmp_path: Path, pair_kind: NodeKind) -> None:
    td = _tree()
    out = td.memmap(tmp_path)
    assert isinstance(out, TensorDict)
    new, old = out._tensordict["p"], td._tensordict["p"]
    assert isinstance(new, Pair) and new is not old and new.td is not old.td and new.label == "left"
    assert isinstance(new.td["x"], MemoryMappedTensor) and type(old.td["x"]) is torch.Tensor
    assert torch.equal(new.td["x"], old.td["x"])


@pytest.mark.parametrize("atomic", [False, True])
def test_wrapped_kind_resaved_atomically(tmp_path: Path, pair_kind: NodeKind, atomic: bool) -> None:
    td = _tree()
    td.memmap_(tmp_path)
    td2 = _tree()
    td2._tensordict["p"].label = "right"
    td2.memmap(tmp_path, atomic=atomic)
    back = TensorDict.load_memmap(tmp_path)._tensordict["p"]
    assert back.label == "right" and back.td["x"].tolist() == [[0, 1], [2, 3], [4, 5]]


def test_wrapped_kind_in_an_archive(tmp_path: Path, pair_kind: NodeKind) -> None:
    path = tmp_path / "t.tdz"
    out = _tree().memmap(path)
    assert isinstance(out, TensorDict)
    for td in (out, tdshare.load(path)):
        pair = td._tensordict["p"]
        assert isinstance(pair, Pair) and pair.label == "left"
        assert pair.td["x"].tolist() == [[0, 1], [2, 3], [4, 5]] and td["y"].tolist() == [0.0, 1.0, 2.0]


def test_wrapped_kind_in_anonymous_memory(pair_kind: NodeKind) -> None:
    td = _tree().memmap_()
    pair: Any = td._tensordict["p"]
    leaf = pair.td["x"]
    assert isinstance(leaf, MemoryMappedTensor) and leaf._segment is not None and leaf._filename is None
    assert leaf.tolist() == [[0, 1], [2, 3], [4, 5]]


def test_unregistered_wrapper_loads_as_its_collection(tmp_path: Path, pair_kind: NodeKind) -> None:
    _tree().memmap_(tmp_path)
    unregister(pair_kind)
    with pytest.warns(UserWarning, match="tensorclass"):
        loaded = TensorDict.load_memmap(tmp_path)
    inner = loaded._tensordict["p"]
    assert isinstance(inner, TensorDict) and inner["x"].tolist() == [[0, 1], [2, 3], [4, 5]]


def test_a_kind_that_cannot_be_saved_is_refused_by_key(tmp_path: Path) -> None:
    class Odd:
        pass

    kind = register(NodeKind("Odd", WRAPPED, "Odd", Odd))  # no unwrap: nothing to save
    try:
        td = TensorDict({}, batch_size=[])
        td._tensordict["o"] = Odd()
        with pytest.raises(tdshare.NotSupportedError, match=r"'o'.*Odd"):
            td.memmap_(tmp_path)
        assert list(tmp_path.iterdir()) == []
    finally:
        unregister(kind)
