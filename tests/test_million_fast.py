"""The column-wise fast paths of loading and writing wide levels (more than ``STAT_AT_LOAD`` leaves):
the same values, handles and errors, at the same moment, as the per-leaf loop they stand in for."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tensordict
import torch

import tdshare
from tdshare import TensorDict
from tdshare._lazy_leaves import PendingLeaf, raw_items
from tdshare._store import STAT_AT_LOAD

N = STAT_AT_LOAD + 10


def _wide(kinds: str = "plain") -> dict[str, torch.Tensor]:
    """A level of N leaves; ``kinds`` adds leaves that the fast path hands to the loop."""
    out: dict[str, torch.Tensor] = {}
    for j in range(N):
        if j % 3 == 0:
            out[f"x{j}"] = torch.full((4,), float(j))
        elif j % 3 == 1:
            out[f"x{j}"] = torch.arange(6, dtype=torch.int64).reshape(2, 3) + j
        else:
            out[f"x{j}"] = torch.tensor(j % 2 == 0)  # a scalar bool
    if kinds == "mixed":
        out["empty"] = torch.zeros(0, 3)
        out["not an identifier"] = torch.full((2,), -1.5)
    return out


@pytest.mark.parametrize("kinds", ["plain", "mixed"])
def test_a_wide_level_loads_the_values_and_order_tensordict_loads(tmp_path: Path, kinds: str) -> None:
    data = _wide(kinds)
    TensorDict({"g": data}, []).memmap_(tmp_path / "t")
    ours = TensorDict.load_memmap(tmp_path / "t")
    ref = tensordict.TensorDict.load_memmap(tmp_path / "t")
    assert list(ours["g"].keys()) == list(ref["g"].keys()) == list(data)
    pending = [k for k, v in raw_items(ours["g"]._tensordict) if type(v) is PendingLeaf]
    assert len(pending) >= N  # every plain leaf stays unmapped until read
    for key, value in data.items():
        assert ours["g", key].dtype == ref["g", key].dtype == value.dtype
        assert torch.equal(ours["g", key], ref["g", key]) and torch.equal(ours["g", key], value)


def _check_handles(td: TensorDict, folder: Path, keys: tuple[str, ...]) -> dict:
    """The pending handles of ``keys`` in ``td``'s top level name their file, inode and meta.json."""
    handles = dict(raw_items(td._tensordict))
    for key in keys:
        h = handles[key]
        assert type(h) is PendingLeaf
        assert h.path == str(folder / f"{key}.memmap")
        assert h.ino == os.stat(h.path).st_ino
        assert h.where == str(folder / "meta.json")
    return handles


def test_the_handles_of_a_wide_level_know_their_file_and_inode(tmp_path: Path) -> None:
    TensorDict(_wide(), []).memmap_(tmp_path / "t")
    loaded = TensorDict.load_memmap(tmp_path / "t")
    handles = _check_handles(loaded, tmp_path / "t", ("x0", "x1", f"x{N - 1}"))
    for key in ("x0", "x1", f"x{N - 1}"):
        h = handles[key]
        assert h.mode is None and h.segment is None and h.offset == 0
    assert handles["x0"].shape is handles["x3"].shape  # one shape tuple per shape, shared


def test_the_handles_a_wide_write_returns_know_their_file_and_inode(tmp_path: Path) -> None:
    td = TensorDict(_wide(), [])
    td.memmap_(tmp_path / "t")
    _check_handles(td, tmp_path / "t", ("x0", "x2", f"x{N - 1}"))
    for key, value in _wide().items():
        assert torch.equal(td[key], value)
    ref = tensordict.TensorDict.load_memmap(tmp_path / "t")
    assert all(torch.equal(ref[k], v) for k, v in _wide().items())


def test_a_wide_write_of_mixed_shapes_and_dtypes_writes_every_byte(tmp_path: Path) -> None:
    data = {f"a{j}": torch.full((3,), float(j)) for j in range(N)}
    data.update({f"b{j}": torch.full((3,), float(-j), dtype=torch.float64) for j in range(N)})
    data.update({f"c{j}": torch.full((2,), j, dtype=torch.int32) for j in range(5)})  # joins with no b
    TensorDict(data, []).memmap_(tmp_path / "t")
    for key, value in data.items():
        raw = (tmp_path / "t" / f"{key}.memmap").read_bytes()
        assert raw == value.numpy().tobytes(), key


@pytest.mark.parametrize("when", ["before load", "after load"])
def test_a_missing_leaf_file_is_named_at_the_same_moment(tmp_path: Path, when: str) -> None:
    TensorDict(_wide(), []).memmap_(tmp_path / "t")
    victim = tmp_path / "t" / "x4.memmap"
    if when == "before load":
        victim.unlink()
        with pytest.raises(tdshare.CorruptDataError, match=r"x4"):
            TensorDict.load_memmap(tmp_path / "t")
        return
    loaded = TensorDict.load_memmap(tmp_path / "t")
    victim.unlink()
    with pytest.raises(tdshare.CorruptDataError, match=r"x4\.memmap' \(listed in .*meta\.json\) is missing"):
        loaded["x4"]
    assert torch.equal(loaded["x3"], torch.full((4,), 3.0))


def test_a_short_leaf_file_is_named_at_its_first_read(tmp_path: Path) -> None:
    TensorDict(_wide(), []).memmap_(tmp_path / "t")
    os.truncate(tmp_path / "t" / "x6.memmap", 4)
    loaded = TensorDict.load_memmap(tmp_path / "t")  # the listing has no size: checked at first read
    with pytest.raises(tdshare.CorruptDataError, match=r"x6\.memmap' holds 4 bytes but .*expects 16"):
        loaded["x6"]
    assert torch.equal(loaded["x9"], torch.full((4,), 9.0))


def test_a_symbolic_link_in_a_wide_level_is_judged_at_load(tmp_path: Path) -> None:
    TensorDict(_wide(), []).memmap_(tmp_path / "t")
    level = tmp_path / "t"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(torch.full((4,), -3.0).numpy().tobytes())
    (level / "x0.memmap").unlink()
    (level / "x0.memmap").symlink_to(outside)
    with pytest.raises(tdshare.CorruptDataError, match=r"x0\.memmap' is a symbolic link that leads outside"):
        TensorDict.load_memmap(level)
    inside = level / "copy.bin"
    inside.write_bytes(torch.full((4,), 7.0).numpy().tobytes())
    (level / "x0.memmap").unlink()
    (level / "x0.memmap").symlink_to(inside)  # inside the folder: allowed, the loop takes it
    loaded = TensorDict.load_memmap(level)
    assert torch.equal(loaded["x0"], torch.full((4,), 7.0))
    assert torch.equal(loaded["x3"], torch.full((4,), 3.0))


def test_a_folder_in_place_of_a_leaf_file_is_refused_at_load(tmp_path: Path) -> None:
    TensorDict(_wide(), []).memmap_(tmp_path / "t")
    (tmp_path / "t" / "x1.memmap").unlink()
    (tmp_path / "t" / "x1.memmap").mkdir()
    with pytest.raises(tdshare.CorruptDataError, match=r"x1\.memmap' is not a regular file"):
        TensorDict.load_memmap(tmp_path / "t")


def test_a_wide_level_with_children_keeps_the_metadata_order(tmp_path: Path) -> None:
    data: dict = {f"x{j}": torch.full((2,), float(j)) for j in range(N)}
    data["sub"] = {"y": torch.ones(2)}
    data["z"] = torch.zeros(2)
    TensorDict(data, [2]).memmap_(tmp_path / "t")
    ours = TensorDict.load_memmap(tmp_path / "t")
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert list(ours.keys()) == [k for k in meta if k in data] == list(data)
    assert torch.equal(ours["sub", "y"], torch.ones(2)) and torch.equal(ours["z"], torch.zeros(2))


def test_a_wide_level_in_an_archive_keeps_the_metadata_order(tmp_path: Path) -> None:
    data = _wide("mixed")
    TensorDict(data, []).save(tmp_path / "t.tdz")
    loaded = TensorDict.load_memmap(tmp_path / "t.tdz")
    assert list(loaded.keys()) == list(data)
    assert all(torch.equal(loaded[k], v) for k, v in data.items())


@pytest.mark.timeout(120)
def test_equal_wide_levels_share_one_parse_and_refresh_on_their_own(tmp_path: Path) -> None:
    # 1,000 leaves a level: each meta.json is over 64 KiB, and the three are equal byte for byte
    groups, leaves = 3, 1000
    TensorDict(
        {f"g{i}": {f"x{j}": torch.full((4,), float(1000 * i + j)) for j in range(leaves)} for i in range(groups)}
    ).memmap_(tmp_path / "t")
    raw = [(tmp_path / "t" / f"g{i}" / "meta.json").read_bytes() for i in range(groups)]
    assert len(raw[0]) > 1 << 16 and raw[0] == raw[1] == raw[2]
    loaded = TensorDict.load_memmap(tmp_path / "t")
    assert loaded["g0"]._meta_seen is loaded["g2"]._meta_seen  # one parse, one dict, for all three
    for i in range(groups):
        h = dict(raw_items(loaded[f"g{i}"]._tensordict))["x7"]
        assert type(h) is PendingLeaf and h.path == str(tmp_path / "t" / f"g{i}" / "x7.memmap")
        assert h.ino == os.stat(h.path).st_ino
        assert loaded[f"g{i}", "x999"].tolist() == [1000.0 * i + 999] * 4
    writer = TensorDict.load_memmap(tmp_path / "t").memmap_(tmp_path / "t")
    writer.make_memmap(("g1", "added"), [2]).fill_(5.0)
    loaded.memmap_(tmp_path / "t")
    loaded.memmap_refresh_()  # only g1 changed: the shared metadata of g0 and g2 is theirs unchanged
    assert loaded["g1", "added"].tolist() == [5.0, 5.0]
    assert "added" not in loaded["g0"].keys() and "added" not in loaded["g2"].keys()
    assert loaded["g2", "x3"].tolist() == [2003.0] * 4
    assert json.loads((tmp_path / "t" / "g0" / "meta.json").read_bytes()) == json.loads(raw[0])
