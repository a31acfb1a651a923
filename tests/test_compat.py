"""On-disk compatibility with the reference, tensordict 0.15.3, in both directions.

Every test saves with one library into ``tmp_path`` and loads with the other (often with both),
then compares a library-independent description of the result (``describe``): key sets, batch
sizes, dim names, dtypes, shapes, raw element bytes (so NaN and -0.0 compare exactly) and
non-tensor values; several tests also compare the files written and meta.json byte for byte.
Where tdshare deliberately differs from the reference the test checks tdshare's behaviour and
says why in a comment.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import COMMON_DTYPES, Point

import tdshare
from tdshare import TensorDict as TdsTD

tensordict = pytest.importorskip("tensordict")
assert tensordict.__version__ == "0.15.3", tensordict.__version__
RefTD = tensordict.TensorDict


# -- helpers ----------------------------------------------------------------------------------
DTYPES = COMMON_DTYPES


@tensordict.tensorclass
class CompatPair:
    """A tensorclass saved by the reference (tdshare loads it as a TensorDict)."""

    x: torch.Tensor
    label: str


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Deterministic values of ``dtype``, with NaN, inf and -0.0 among the floats."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if dtype == torch.bool:
        return (torch.rand(n, generator=g) > 0.5).reshape(shape)
    if dtype.is_complex:
        return torch.randn(n, generator=g, dtype=dtype).reshape(shape)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g, dtype=torch.float64)
        specials = torch.tensor([math.nan, math.inf, -math.inf, -0.0], dtype=torch.float64)
        x[: min(n, 4)] = specials[: min(n, 4)]
        return x.to(dtype).reshape(shape)
    info = torch.iinfo(dtype)
    hi = min(info.max, 2**62)
    x = torch.randint(0, 1000, (n,), generator=g, dtype=torch.int64)
    out = x.to(dtype)
    if n:
        out[0] = hi  # exercises the top bits
        if dtype == torch.uint64:
            out.view(torch.int64)[0] = -1  # 2**64 - 1
    return out.reshape(shape)


def _plain(t: torch.Tensor) -> torch.Tensor:
    return torch.Tensor.as_subclass(t, torch.Tensor)


def tensor_desc(t: torch.Tensor) -> tuple[Any, ...]:
    t = _plain(t)
    if t.is_nested:
        return ("nested", str(t.dtype), [tensor_desc(c) for c in t.unbind()])
    flat = t.resolve_conj().resolve_neg().contiguous().reshape(-1)
    return ("tensor", str(t.dtype), tuple(t.shape), bytes(flat.view(torch.uint8).tolist()))


def value_desc(v: Any) -> Any:
    """A non-tensor value with NaN replaced by a marker, so that ``==`` compares it."""
    if isinstance(v, float) and math.isnan(v):
        return ("<NaN>",)
    if isinstance(v, list):
        return [value_desc(x) for x in v]
    if isinstance(v, tuple):
        return ("<tuple>", *(value_desc(x) for x in v))
    if isinstance(v, dict):
        return {k: value_desc(x) for k, x in v.items()}
    return (type(v).__name__, v)


def _names(td: Any) -> list | None:
    names = list(td.names) if td.batch_dims else []
    return None if all(n is None for n in names) else names


def describe(td: Any) -> dict:
    """A library-independent description of a tensordict of either library.

    Key order is not compared (``entries`` is a dict): the reference's loader puts tensor leaves
    before nested entries, while tdshare keeps the order of meta.json (the insertion order)."""
    entries: dict[str, Any] = {}
    for key in td.keys():
        v = td.get(key)
        is_ref_td = tensordict.is_tensor_collection(v) and not tensordict.is_non_tensor(v)
        if isinstance(v, tdshare.TensorDict) or is_ref_td:
            entries[key] = describe(v)
        elif isinstance(v, (tensordict.NonTensorStack, tdshare.NonTensorStack)):
            entries[key] = ("non-tensor", value_desc(v.tolist()))
        elif isinstance(v, tdshare.NonTensorData):  # get() gives the wrapper, as the reference's does
            entries[key] = ("non-tensor", value_desc(v.data))
        elif tensordict.is_non_tensor(v):
            entries[key] = ("non-tensor", value_desc(v.data))
        elif isinstance(v, torch.Tensor):
            entries[key] = tensor_desc(v)
        else:  # tdshare gives non-tensor values directly
            entries[key] = ("non-tensor", value_desc(v))
    return {
        "batch_size": list(td.batch_size),
        "names": _names(td),
        "entries": entries,
    }


def files(root: Path) -> list[str]:
    """Every file under ``root``, as sorted relative paths."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def meta_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("meta.json"))}


def rewrite_metas(root: Path, fn: Any) -> None:
    """Rewrite every meta.json under ``root`` as ``fn(parsed) -> bytes``."""
    for p in root.rglob("meta.json"):
        p.write_bytes(fn(json.loads(p.read_bytes())))


def tds_write(td: TdsTD, path: Path, how: str, **kwargs: Any) -> None:
    """Save ``td`` to ``path`` with one of tdshare's writers."""
    if how == "memmap":
        td.memmap(path, **kwargs)
    elif how == "memmap_":
        td.clone().memmap_(path, **kwargs)
    elif how == "atomic":
        td.memmap(path, atomic=True, **kwargs)
    elif how == "threads":
        td.memmap(path, num_threads=2, return_early=True, **kwargs).result()
    elif how == "anonymous_first":  # anonymous shared memory, then copied to files
        td.clone().memmap_(**kwargs).memmap(path, copy_existing=True, **kwargs)
    else:
        td.save(path, **kwargs)


def build(lib: str, spec: dict, batch: list[int], names: list | None = None) -> Any:
    """The same tensordict in either library from ``spec``: tensors, nested ``(spec, batch)``
    pairs and ``("nt", value)`` non-tensor entries."""
    cls = TdsTD if lib == "tds" else RefTD
    td = cls({}, batch_size=batch)
    for key, v in spec.items():
        if isinstance(v, tuple) and v[0] == "nt":
            if lib == "tds":
                td.set(key, tdshare.NonTensorData(v[1]))
            else:
                td.set_non_tensor(key, v[1])
        elif isinstance(v, tuple):
            td.set(key, build(lib, v[0], v[1]))
        else:
            td.set(key, v)  # as is: non-contiguous, conj and neg-bit views stay so
    if names is not None:
        td.names = names
    return td


# -- every dtype --------------------------------------------------------------------------
def _dtype_spec(batch: list[int]) -> dict:
    return {str(dt).split(".")[1]: sample(dt, (*batch, 2), seed=i) for i, dt in enumerate(DTYPES)}


@pytest.mark.parametrize("how", ["memmap", "memmap_", "save", "atomic", "threads", "anonymous_first"])
def test_dtypes_tdshare_to_reference(tmp_path: Path, how: str) -> None:
    src = build("tds", _dtype_spec([3]), [3])
    tds_write(src, tmp_path, how)
    loaded = RefTD.load_memmap(tmp_path)
    assert describe(loaded) == describe(src)
    assert describe(TdsTD.load(tmp_path)) == describe(src)


def test_dtypes_reference_to_tdshare(tmp_path: Path) -> None:
    src = build("ref", _dtype_spec([3]), [3])
    src.memmap(tmp_path)
    loaded = TdsTD.load(tmp_path)
    assert describe(loaded) == describe(src) == describe(RefTD.load_memmap(tmp_path))
    assert all(isinstance(v, tdshare.MemoryMappedTensor) for v in loaded.values())


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 in this torch")
def test_float8_leaves(tmp_path: Path) -> None:
    # The reference saves float8 leaves but cannot load them (its dtype table lacks them: KeyError);
    # tdshare reads every dtype its torch knows, from either writer.
    x = torch.arange(6.0).reshape(3, 2).to(torch.float8_e4m3fn)
    RefTD(x=x, batch_size=[3]).memmap(tmp_path / "ref")
    TdsTD(x=x, batch_size=[3]).memmap(tmp_path / "tds")
    assert meta_files(tmp_path / "ref") == meta_files(tmp_path / "tds")
    for folder in ("ref", "tds"):
        assert tensor_desc(TdsTD.load(tmp_path / folder)["x"]) == tensor_desc(x)
        with pytest.raises(KeyError, match="float8"):
            RefTD.load_memmap(tmp_path / folder)


# -- nesting, batch sizes, names ----------------------------------------------------------
def _nested_spec(batch: list[int]) -> dict:
    deep = {"leaf": sample(torch.float32, (*batch, 2, 3)), "i": sample(torch.int64, (*batch, 2)), "s": ("nt", "deep")}
    mid = {"x": sample(torch.float64, (*batch, 4)), "deep": (deep, [*batch, 2]), "flag": sample(torch.bool, (*batch,))}
    return {
        "obs": sample(torch.float32, (*batch, 5), seed=1),
        "mid": (mid, list(batch)),
        "action": sample(torch.int32, tuple(batch), seed=2),
        "label": ("nt", "top"),
        "empty": ({}, list(batch)),  # a nested level with no entries: a folder with only meta.json
    }


BATCHES = [
    ([], None),
    ([3], None),
    ([3], ["time"]),
    ([3], [None]),  # all-None names: no "_names" field, as the reference
    ([2, 3], None),
    ([2, 3], ["env", "time"]),
    ([2, 3], ["env", None]),
    ([2, 3], [None, "time"]),
]


@pytest.mark.parametrize(("batch", "names"), BATCHES)
def test_nested_tdshare_to_reference(tmp_path: Path, batch: list[int], names: list | None) -> None:
    src = build("tds", _nested_spec(batch), batch, names)
    src.memmap(tmp_path)
    loaded = RefTD.load_memmap(tmp_path)
    assert describe(loaded) == describe(src) == describe(build("ref", _nested_spec(batch), batch, names))
    assert describe(TdsTD.load(tmp_path)) == describe(loaded)
    assert loaded["mid", "deep"].batch_size == torch.Size([*batch, 2])
    # the reference writes each level's names; nested levels extend them with None
    if names is not None:
        assert loaded["mid", "deep"].names == [*names, None]


@pytest.mark.parametrize(("batch", "names"), BATCHES)
def test_nested_reference_to_tdshare(tmp_path: Path, batch: list[int], names: list | None) -> None:
    src = build("ref", _nested_spec(batch), batch, names)
    src.memmap(tmp_path)
    loaded = TdsTD.load(tmp_path)
    assert describe(loaded) == describe(src) == describe(RefTD.load_memmap(tmp_path))
    assert isinstance(loaded["mid", "deep"], TdsTD)
    if names is not None:
        assert loaded["mid", "deep"].names == [*names, None]


def test_names_reach_every_level() -> None:
    # names set on the root rename every nested level, as in the reference
    for lib in ("ref", "tds"):
        td = build(lib, _nested_spec([3]), [3], ["time"])
        assert td["mid", "deep"].names == ["time", None], lib


@pytest.mark.parametrize("lib", ["tds", "ref"])
def test_nested_set_into_named_tensordict(tmp_path: Path, lib: str) -> None:
    # naming the root first, then inserting a 3-level subtree: every level on disk extends the
    # root's names (the reference's loader refuses a nested level whose names do not)
    cls = TdsTD if lib == "tds" else RefTD
    root = cls({"a": torch.zeros(3)}, batch_size=[3], names=["t"])
    deep = cls({"x": torch.ones(3, 2, 4)}, batch_size=[3, 2, 4])
    root["mid"] = cls({"deep": deep, "y": torch.ones(3, 2)}, batch_size=[3, 2])
    root.memmap(tmp_path / lib)
    deep_meta = json.loads((tmp_path / lib / "mid/deep/meta.json").read_bytes())
    assert deep_meta["_names"] == ["t", None, None]
    loaded = RefTD.load_memmap(tmp_path / lib)
    assert loaded["mid", "deep"].names == ["t", None, None]
    assert TdsTD.load(tmp_path / lib)["mid", "deep"].names == ["t", None, None]


@pytest.mark.parametrize(("batch", "names"), BATCHES)
def test_meta_json_bytes_equal(tmp_path: Path, batch: list[int], names: list | None) -> None:
    """tdshare writes byte-identical meta.json files and the same file names as the reference."""
    build("tds", _nested_spec(batch), batch, names).memmap(tmp_path / "tds")
    build("ref", _nested_spec(batch), batch, names).memmap(tmp_path / "ref")
    assert files(tmp_path / "tds") == files(tmp_path / "ref")
    assert meta_files(tmp_path / "tds") == meta_files(tmp_path / "ref")


def test_meta_json_bytes_equal_simple(tmp_path: Path) -> None:
    spec = {
        "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.tensor([True, False, True]),
        "n": ({"c": torch.arange(3), "d": torch.ones(3, 2, dtype=torch.float16)}, [3]),
        "s": ("nt", "hello"),
        "nan": ("nt", [math.nan, math.inf, -math.inf]),
        "ünï ✓": torch.zeros(3),
        "pickled": ("nt", {1, 2}),
        "empty": torch.zeros(3, 0),
    }
    build("tds", spec, [3], ["batch"]).memmap(tmp_path / "tds")
    build("ref", spec, [3], ["batch"]).memmap(tmp_path / "ref")
    assert files(tmp_path / "tds") == files(tmp_path / "ref")
    tds_meta, ref_meta = meta_files(tmp_path / "tds"), meta_files(tmp_path / "ref")
    assert tds_meta == ref_meta
    top = tds_meta["meta.json"].decode()
    assert top.startswith('{"a": {"device": "cpu", "shape": [3, 4], "dtype": "torch.float32", "is_nested": false}')
    assert r'"\u00fcn\u00ef \u2713"' in top  # ensure_ascii, like the reference
    assert tds_meta["nan/meta.json"].decode().count("NaN") == 1  # bare NaN literal, like the reference
    # the pickle holds the same object (pickle bytes may differ between pickler versions)
    import pickle

    assert pickle.loads((tmp_path / "tds/pickled/other.pickle").read_bytes()) == {"data": {1, 2}}


# -- zero-size and non-contiguous leaves --------------------------------------------------
def _odd_leaves() -> dict:
    c = torch.randn(3, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    return {
        "empty": torch.zeros(3, 0),
        "empty_i": torch.zeros(3, 0, 5, dtype=torch.int16),
        "transposed": torch.arange(12.0).reshape(4, 3).t(),
        "strided": torch.arange(60).reshape(3, 20)[:, ::3],
        "expanded": torch.arange(4.0).expand(3, 4),
        "expanded_bf16": torch.tensor([1.5], dtype=torch.bfloat16).expand(3, 7),
        "column": torch.arange(30, dtype=torch.int8).reshape(3, 10)[:, 4],
        "conj": c.conj(),
        "neg": c.conj().imag,
        "nested": ({"zero": torch.zeros(3, 0, dtype=torch.bool), "view": torch.arange(9.0).reshape(3, 3)[:, 1:]}, [3]),
    }


def test_odd_leaves_tdshare_to_reference(tmp_path: Path) -> None:
    src = build("tds", _odd_leaves(), [3])
    assert not src["transposed"].is_contiguous() and src["conj"].is_conj() and src["neg"].is_neg()
    src.memmap(tmp_path)
    loaded = RefTD.load_memmap(tmp_path)
    assert describe(loaded) == describe(src)
    assert not (tmp_path / "empty.memmap").exists()  # zero-size leaves have no file (as in the reference)
    assert (tmp_path / "expanded.memmap").stat().st_size == 3 * 4 * 4  # expanded leaves are materialized
    assert loaded["empty_i"].shape == (3, 0, 5) and loaded["empty_i"].dtype == torch.int16


def test_odd_leaves_reference_to_tdshare(tmp_path: Path) -> None:
    src = build("ref", _odd_leaves(), [3])
    src.memmap(tmp_path / "ref")
    loaded = TdsTD.load(tmp_path / "ref")
    assert describe(loaded) == describe(src)
    assert loaded["nested", "zero"].shape == (3, 0) and loaded["nested", "zero"].dtype == torch.bool
    build("tds", _odd_leaves(), [3]).memmap(tmp_path / "tds")
    assert files(tmp_path / "tds") == files(tmp_path / "ref")
    assert meta_files(tmp_path / "tds") == meta_files(tmp_path / "ref")


def test_zero_batch(tmp_path: Path) -> None:
    spec = {"a": torch.zeros(0, 3), "n": ({"b": torch.zeros(0, dtype=torch.int64)}, [0])}
    build("tds", spec, [0]).memmap(tmp_path / "tds")
    build("ref", spec, [0]).memmap(tmp_path / "ref")
    assert meta_files(tmp_path / "tds") == meta_files(tmp_path / "ref")
    expected = describe(build("ref", spec, [0]))
    assert describe(RefTD.load_memmap(tmp_path / "tds")) == expected
    assert describe(TdsTD.load(tmp_path / "ref")) == expected


# -- non-tensor values --------------------------------------------------------------------
JSON_VALUES = {
    "str": "hello",
    "unicode": "héllo ✓ \U0001f600",
    "empty_str": "",
    "int": 3,
    "big_int": 2**70,
    "neg_int": -7,
    "float": 1.5,
    "nan": math.nan,
    "inf": math.inf,
    "none": None,
    "true": True,
    "list": [1, "a", None, [2.5, False]],
    "tuple": (1, 2),  # stored as a JSON list by both: loads as [1, 2]
    "dict": {"a": {"b": [1, 2]}, "c": None, "d": "x"},
}
PICKLED_VALUES = {
    "set": {1, 2, 3},
    "bytes": b"\x00\x01\xff",
    "int_keys": {1: "a", 2: "b"},
    "object": Point(4),
    "tuple_of_set": ({1}, "x"),
}


def _as_loaded(v: Any) -> Any:
    """What a non-tensor value looks like after a JSON round trip (tuples become lists)."""
    if isinstance(v, tuple):
        return [_as_loaded(x) for x in v]
    if isinstance(v, list):
        return [_as_loaded(x) for x in v]
    if isinstance(v, dict):
        return {k: _as_loaded(x) for k, x in v.items()}
    return v


def _nontensor_spec(values: dict) -> dict:
    return {k: ("nt", v) for k, v in values.items()} | {"t": torch.arange(3)}


@pytest.mark.parametrize("batch", [[], [3]])
def test_json_nontensor_tdshare_to_reference(tmp_path: Path, batch: list[int]) -> None:
    spec = _nontensor_spec(JSON_VALUES) if batch else {k: ("nt", v) for k, v in JSON_VALUES.items()}
    build("tds", spec, batch).memmap(tmp_path)
    assert not list(tmp_path.rglob("other.pickle"))  # every value is inline JSON
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pickle, so no pickle warning
        loaded = RefTD.load_memmap(tmp_path, allow_pickle=False)
    for key, value in JSON_VALUES.items():
        assert value_desc(loaded[key]) == value_desc(_as_loaded(value)), key
    assert describe(loaded) == describe(TdsTD.load(tmp_path, allow_pickle=False))


@pytest.mark.parametrize("batch", [[], [3]])
def test_json_nontensor_reference_to_tdshare(tmp_path: Path, batch: list[int]) -> None:
    spec = _nontensor_spec(JSON_VALUES) if batch else {k: ("nt", v) for k, v in JSON_VALUES.items()}
    build("ref", spec, batch).memmap(tmp_path)
    loaded = TdsTD.load(tmp_path, allow_pickle=False)
    for key, value in JSON_VALUES.items():
        assert value_desc(loaded[key]) == value_desc(_as_loaded(value)), key
    assert describe(loaded) == describe(RefTD.load_memmap(tmp_path))


def test_pickled_nontensor_tdshare_to_reference(tmp_path: Path) -> None:
    build("tds", _nontensor_spec(PICKLED_VALUES), [3]).memmap(tmp_path)
    assert sorted(p.parent.name for p in tmp_path.rglob("other.pickle")) == sorted(PICKLED_VALUES)
    loaded = RefTD.load_memmap(tmp_path, allow_pickle=True)
    for key, value in PICKLED_VALUES.items():
        assert loaded[key] == value, key
    with pytest.raises(RuntimeError, match="pickle"):
        RefTD.load_memmap(tmp_path, allow_pickle=False)


def test_pickled_nontensor_reference_to_tdshare(tmp_path: Path) -> None:
    build("ref", _nontensor_spec(PICKLED_VALUES), [3]).memmap(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = TdsTD.load(tmp_path, allow_pickle=True)
    for key, value in PICKLED_VALUES.items():
        assert loaded[key] == value, key
    with pytest.raises(tdshare.PickleRefusedError):
        TdsTD.load(tmp_path, allow_pickle=False)
    with pytest.warns(FutureWarning, match="pickle"):
        TdsTD.load(tmp_path)


def test_nontensor_mixed_chain(tmp_path: Path) -> None:
    """tdshare -> reference -> tdshare -> reference keeps every value."""
    values = JSON_VALUES | PICKLED_VALUES
    build("tds", _nontensor_spec(values), [3], ["b"]).memmap(tmp_path / "1")
    RefTD.load_memmap(tmp_path / "1", allow_pickle=True).memmap(tmp_path / "2", copy_existing=True)
    TdsTD.load(tmp_path / "2", allow_pickle=True).memmap(tmp_path / "3", copy_existing=True)
    final = RefTD.load_memmap(tmp_path / "3", allow_pickle=True)
    as_loaded = {k: _as_loaded(v) for k, v in JSON_VALUES.items()} | PICKLED_VALUES  # pickles keep tuples
    expected = describe(build("ref", _nontensor_spec(as_loaded), [3], ["b"]))
    assert describe(final) == expected
    first, last = meta_files(tmp_path / "1"), meta_files(tmp_path / "3")
    # the reference's load put the tensor "t" first, so the top meta.json differs in key order only
    assert json.loads(first.pop("meta.json")) == json.loads(last.pop("meta.json"))
    assert first == last


# -- keys and file names ------------------------------------------------------------------
ROBUST_KEYS = ["a/b", "50%", "%41", "sp ace", "ünï", 'x*?<>|:"\\', "t\tx", "", ".", "..", "...", "a.b", "#&"]
LEGACY_KEYS = ["sp ace", "50%", "ünï", "a.b", "...", "x*?", "#&"]  # safe as raw file names


def _keys_spec(keys: list[str]) -> dict:
    spec: dict[str, Any] = {k: sample(torch.float32, (2, 2), seed=i) for i, k in enumerate(keys)}
    spec["nested " + keys[0]] = ({k: sample(torch.int64, (2,), seed=i) for i, k in enumerate(keys)}, [2])
    spec["nt " + keys[1]] = ("nt", "value")
    return spec


@pytest.mark.parametrize("robust_key", [True, False])
def test_keys_tdshare_to_reference(tmp_path: Path, robust_key: bool) -> None:
    keys = ROBUST_KEYS if robust_key else LEGACY_KEYS
    src = build("tds", _keys_spec(keys), [2])
    src.memmap(tmp_path / "tds", robust_key=robust_key)
    build("ref", _keys_spec(keys), [2]).memmap(tmp_path / "ref", robust_key=robust_key)
    assert files(tmp_path / "tds") == files(tmp_path / "ref")
    assert meta_files(tmp_path / "tds") == meta_files(tmp_path / "ref")
    loaded = RefTD.load_memmap(tmp_path / "tds", robust_key=robust_key)
    assert describe(loaded) == describe(src)


@pytest.mark.parametrize("robust_key", [True, False])
def test_keys_reference_to_tdshare(tmp_path: Path, robust_key: bool) -> None:
    keys = ROBUST_KEYS if robust_key else LEGACY_KEYS
    src = build("ref", _keys_spec(keys), [2])
    src.memmap(tmp_path, robust_key=robust_key)
    loaded = TdsTD.load(tmp_path, robust_key=robust_key)
    assert describe(loaded) == describe(src)
    sub = ("nested " + keys[0],)
    assert describe(TdsTD.load(tmp_path, robust_key=robust_key, subpath=sub)) == describe(src[sub])


def test_reference_legacy_folder_loads_with_default_robust_key(tmp_path: Path) -> None:
    src = build("ref", _keys_spec(LEGACY_KEYS), [2])
    src.memmap(tmp_path, robust_key=False)
    assert (tmp_path / "sp ace.memmap").exists() and (tmp_path / "50%.memmap").exists()
    assert describe(TdsTD.load(tmp_path)) == describe(src)  # robust_key=True falls back to raw names
    assert describe(RefTD.load_memmap(tmp_path)) == describe(src)


@pytest.mark.parametrize("key", ["a/b", "../outside"])
def test_tdshare_refuses_unsafe_legacy_keys(tmp_path: Path, key: str) -> None:
    # Deliberate difference: with robust_key=False the reference writes the key as a path: "a/b"
    # fails with a RuntimeError, "../outside" writes outside.memmap next to the prefix. tdshare
    # refuses the key before writing anything, with an error that is a RuntimeError as the
    # reference's is, and a ValueError (a bad argument).
    ref_prefix, prefix = tmp_path / "ref" / "saved", tmp_path / "tds" / "saved"
    if key == "a/b":
        with pytest.raises(RuntimeError, match="No such file"):
            RefTD({key: torch.zeros(2)}, batch_size=[2]).memmap(ref_prefix, robust_key=False)
    else:
        RefTD({key: torch.zeros(2)}, batch_size=[2]).memmap(ref_prefix, robust_key=False)
        assert (tmp_path / "ref" / "outside.memmap").exists()
    with pytest.raises(tdshare.LegacyKeyError, match="robust_key") as info:
        TdsTD({key: torch.zeros(2)}, batch_size=[2]).memmap(prefix, robust_key=False)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)
    assert repr(key) in str(info.value)
    assert not (tmp_path / "tds").exists()  # not even the prefix's parent made


# -- keys named like meta.json fields -----------------------------------------------------
@pytest.mark.parametrize("key", ["shape", "device", "_type"])
def test_field_named_leaves(tmp_path: Path, key: str) -> None:
    # Deliberate difference: the reference saves such a leaf and silently loses it on reload;
    # tdshare refuses it at save time.
    RefTD({key: torch.ones(2), "a": torch.zeros(2)}, batch_size=[2]).memmap(tmp_path / "ref")
    assert key not in RefTD.load_memmap(tmp_path / "ref").keys()
    with pytest.raises(tdshare.InvalidArgumentError, match=key):
        TdsTD({key: torch.ones(2)}, batch_size=[2]).memmap(tmp_path / "tds")


def test_reference_leaves_named_like_version_fields_load(tmp_path: Path) -> None:
    # The reference keeps leaves named _class/_names/_format_version (its fields are setdefault-ed,
    # so the user entry wins); tdshare must load them, not drop them.  (tdshare refuses to write them.)
    leaves = {"_class": torch.zeros(2), "_names": torch.ones(2), "_format_version": torch.full((2,), 2.0)}
    src = RefTD({**leaves, "a": torch.ones(2)}, batch_size=[2])
    src.memmap(tmp_path)
    assert describe(TdsTD.load(tmp_path)) == describe(src) == describe(RefTD.load_memmap(tmp_path))


# -- older and other reference forms ------------------------------------------------------
def _mixed_ref(batch: list[int] | None = None) -> Any:
    batch = [3] if batch is None else batch
    return build("ref", _nested_spec(batch) | {"pk": ("nt", {1, 2}), "nan": ("nt", math.nan)}, batch, None)


def test_version0_reference_folder(tmp_path: Path) -> None:
    src = _mixed_ref()
    src.memmap(tmp_path)

    def strip(meta: dict) -> bytes:
        meta.pop("_format_version", None)
        meta.pop("_class", None)
        return json.dumps(meta).encode()

    rewrite_metas(tmp_path, strip)
    assert b"_format_version" not in (tmp_path / "meta.json").read_bytes()
    assert describe(TdsTD.load(tmp_path, allow_pickle=True)) == describe(src)
    assert describe(RefTD.load_memmap(tmp_path, allow_pickle=True)) == describe(src)


def test_compact_json_reference_folder(tmp_path: Path) -> None:
    src = _mixed_ref([2, 3])
    src.names = ["env", "time"]
    src.memmap(tmp_path)
    rewrite_metas(tmp_path, lambda m: json.dumps(m, separators=(",", ":"), ensure_ascii=False).encode())
    assert b", " not in (tmp_path / "meta.json").read_bytes()
    assert describe(TdsTD.load(tmp_path, allow_pickle=True)) == describe(src)
    assert describe(RefTD.load_memmap(tmp_path, allow_pickle=True)) == describe(src)


def test_format_version_too_new(tmp_path: Path) -> None:
    RefTD(a=torch.zeros(2), batch_size=[2]).memmap(tmp_path)
    rewrite_metas(tmp_path, lambda m: json.dumps(m | {"_format_version": 2}).encode())
    with pytest.raises(RuntimeError, match="version 2"):
        RefTD.load_memmap(tmp_path)
    with pytest.raises(tdshare.UnsupportedFormatError, match="version 2"):
        TdsTD.load(tmp_path)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_strided_nested_tensor_from_reference(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    nt1 = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0)], layout=torch.strided)
    nt2 = torch.nested.nested_tensor(
        [torch.randn(2, 3, generator=g), torch.randn(4, 3, generator=g), torch.randn(1, 3, generator=g)],
        layout=torch.strided,
    ).to(torch.float64)
    src = RefTD({"nt": nt1, "sub": RefTD(nt=nt2, batch_size=[3])}, batch_size=[])
    src.memmap(tmp_path)
    assert (tmp_path / "nt.shape.memmap").read_bytes() == torch.tensor([[3], [5]]).numpy().tobytes()
    loaded = TdsTD.load(tmp_path)
    assert loaded["nt"].is_nested and loaded["sub", "nt"].is_nested
    assert describe(loaded) == describe(src) == describe(RefTD.load_memmap(tmp_path))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_tdshare_writes_the_references_nested_tensors_back(tmp_path: Path) -> None:
    # a nested tensor the reference saved loads in tdshare, is saved again by it, and the
    # reference reads that back (the packed elements and the size table, as it writes them)
    nt = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(5.0)], layout=torch.strided)
    RefTD({"nt": nt}, batch_size=[]).memmap(tmp_path / "ref")
    td = TdsTD.load(tmp_path / "ref")
    td.memmap(tmp_path / "tds", copy_existing=True)
    for name in ("nt.memmap", "nt.shape.memmap"):
        assert (tmp_path / "tds" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    back = RefTD.load_memmap(tmp_path / "tds")
    assert [t.tolist() for t in torch.Tensor.unbind(back["nt"], 0)] == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, 4.0]]


@pytest.mark.parametrize("pickled", [False, True])
def test_nontensor_stack_from_reference(tmp_path: Path, pickled: bool) -> None:
    # a NonTensorStack loads as tdshare's NonTensorStack; reading it gives the reference's tolist()
    if pickled:
        members = [RefTD(s={1}, x=torch.zeros(1)), RefTD(s={2}, x=torch.ones(1))]
        for m, v in zip(members, [{1}, {2}], strict=True):
            m.set_non_tensor("s", v)
    else:
        members = [RefTD(s="a", x=torch.zeros(1)), RefTD(s="b", x=torch.ones(1))]
    src = torch.stack(members)
    src.memmap(tmp_path)
    meta = json.loads((tmp_path / "s/meta.json").read_bytes())
    assert meta["_class"] == "tensordict:NonTensorStack"
    assert (meta["data"] == "pickle.pkl") == pickled
    loaded = TdsTD.load(tmp_path, allow_pickle=True)
    assert loaded["s"] == ([{1}, {2}] if pickled else ["a", "b"])
    assert describe(loaded) == describe(src) == describe(RefTD.load_memmap(tmp_path, allow_pickle=True))
    if pickled:
        with pytest.raises(tdshare.PickleRefusedError):
            TdsTD.load(tmp_path, allow_pickle=False)


def test_nontensor_stack_2d_and_top_level(tmp_path: Path) -> None:
    stack = tensordict.NonTensorStack(
        tensordict.NonTensorStack("a", "b", "c"), tensordict.NonTensorStack("d", "e", "f")
    )
    assert stack.batch_size == (2, 3)
    src = RefTD(batch_size=[2, 3])
    src["s"] = stack
    src.memmap(tmp_path / "in_td")
    assert TdsTD.load(tmp_path / "in_td")["s"] == [["a", "b", "c"], ["d", "e", "f"]]
    assert describe(TdsTD.load(tmp_path / "in_td")) == describe(src)
    # a NonTensorStack saved on its own loads as a NonTensorStack
    tensordict.NonTensorStack("x", "y").memmap(tmp_path / "alone")
    alone = TdsTD.load(tmp_path / "alone")
    assert isinstance(alone, tdshare.NonTensorStack) and alone.data == ["x", "y"] and alone.batch_size == (2,)


def test_nontensor_stack_as_member_folders(tmp_path: Path) -> None:
    """Older writers saved a NonTensorStack without "data", one NonTensorData folder per member;
    the reference (and tdshare) then read the members."""
    torch.stack([RefTD(s="a", x=torch.zeros(1)), RefTD(s="b", x=torch.ones(1))]).memmap(tmp_path)
    meta = json.loads((tmp_path / "s/meta.json").read_bytes())
    del meta["data"]
    (tmp_path / "s/meta.json").write_text(json.dumps(meta))
    for i, v in enumerate(["a", "b"]):
        (tmp_path / f"s/{i}").mkdir()
        member = {"_type": "<class 'tensordict.tensorclass.NonTensorData'>", "data": v, "_metadata": None}
        (tmp_path / f"s/{i}/meta.json").write_text(json.dumps(member | {"_is_non_tensor": True}))
    assert RefTD.load_memmap(tmp_path)["s"] == ["a", "b"]
    assert TdsTD.load(tmp_path)["s"] == ["a", "b"]
    for i in range(2):  # no data and no members: an error, not a silent None
        (tmp_path / f"s/{i}/meta.json").unlink()
        (tmp_path / f"s/{i}").rmdir()
    with pytest.raises(tdshare.CorruptDataError, match="no members"):
        TdsTD.load(tmp_path)


def test_tensorclass_folder_from_reference(tmp_path: Path) -> None:
    tc = CompatPair(x=sample(torch.float32, (2, 5)), label="lbl", batch_size=[2])
    RefTD(tc=tc, y=torch.arange(2), batch_size=[2]).memmap(tmp_path / "nested")
    tc.memmap(tmp_path / "alone")
    assert "CompatPair" in (tmp_path / "alone/meta.json").read_text()
    # tdshare has no tensorclasses: it loads the fields as a TensorDict and warns naming the class
    with pytest.warns(UserWarning, match="CompatPair"):
        alone = TdsTD.load(tmp_path / "alone")
    assert isinstance(alone, TdsTD)
    assert alone.batch_size == (2,) and alone["label"] == "lbl"
    assert describe(alone)["entries"]["x"] == tensor_desc(tc.x)
    with pytest.warns(UserWarning, match="CompatPair"):
        nested = TdsTD.load(tmp_path / "nested")
    assert describe(nested["tc"]) == describe(alone)
    assert nested["y"].tolist() == [0, 1]


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_lazy_stack_from_reference(tmp_path: Path, dim: int) -> None:
    members = [
        RefTD({"a": sample(torch.float32, (3, 4), seed=i), "n": {"b": sample(torch.int16, (3,), seed=i)}}, [3])
        for i in range(2)
    ]
    for m in members:
        m.set_non_tensor("s", "same")
    lazy = tensordict.LazyStackedTensorDict.lazy_stack(members, dim=dim)
    lazy.memmap(tmp_path / "alone")
    RefTD(ls=lazy, z=torch.zeros(lazy.batch_size), batch_size=lazy.batch_size).memmap(tmp_path / "nested")
    assert json.loads((tmp_path / "alone/meta.json").read_bytes())["_class"] == "tensordict:LazyStackedTensorDict"
    # The reference stacks equal non-tensor values into a NonTensorStack; tdshare's stack keeps
    # one NonTensorData, so "s" is compared apart.
    expected = describe(lazy.to_tensordict().exclude("s"))
    alone = TdsTD.load(tmp_path / "alone")
    assert isinstance(alone, tdshare.LazyStackedTensorDict) and alone.stack_dim == lazy.stack_dim
    assert alone["s"] == "same"
    assert describe(alone.to_tensordict().exclude("s")) == expected
    nested = TdsTD.load(tmp_path / "nested")
    assert isinstance(nested["ls"], tdshare.LazyStackedTensorDict)
    assert describe(nested["ls"].to_tensordict().exclude("s")) == expected
    assert nested["ls", "s"] == "same" and nested["z"].shape == lazy.batch_size


def test_lazy_stack_with_differing_nontensor_values(tmp_path: Path) -> None:
    # the members' values differ: reading the entry gives a NonTensorStack, as in the reference
    members = [RefTD(a=torch.zeros(3), batch_size=[3]), RefTD(a=torch.ones(3), batch_size=[3])]
    members[0].set_non_tensor("s", "x")
    members[1].set_non_tensor("s", "y")
    tensordict.LazyStackedTensorDict.lazy_stack(members, 0).memmap(tmp_path)
    loaded = TdsTD.load(tmp_path)
    assert loaded["s"] == [["x"] * 3, ["y"] * 3] == RefTD.load_memmap(tmp_path)["s"]
    assert [m["s"] for m in loaded.tensordicts] == ["x", "y"]


@pytest.mark.parametrize("second", [{"a": torch.ones(3, 4)}, {"b": torch.ones(3, 2)}])
def test_heterogeneous_lazy_stack_loads_as_one(tmp_path: Path, second: dict) -> None:
    # members with different shapes or keys load as a lazy stack of those members, nothing dropped
    members = [RefTD(a=torch.zeros(3, 2), batch_size=[3]), RefTD(second, batch_size=[3])]
    tensordict.LazyStackedTensorDict.lazy_stack(members, 0).memmap(tmp_path)
    loaded = TdsTD.load(tmp_path)
    assert isinstance(loaded, tdshare.LazyStackedTensorDict) and loaded.batch_size == (2, 3)
    for mine, ref in zip(loaded.tensordicts, members, strict=True):
        assert describe(mine) == describe(ref)
    with pytest.raises((tdshare.NotSupportedError, tdshare.MissingKeyError)):
        loaded.to_tensordict()


# -- deliberate strictness on damaged reference folders -----------------------------------
def test_missing_leaf_file(tmp_path: Path) -> None:
    RefTD(a=torch.ones(3), b=torch.zeros(3), batch_size=[3]).memmap(tmp_path)
    (tmp_path / "a.memmap").unlink()
    # Deliberate difference: the reference silently drops the key, tdshare raises naming the file.
    assert list(RefTD.load_memmap(tmp_path).keys()) == ["b"]
    with pytest.raises(tdshare.CorruptDataError, match=r"a\.memmap"):
        TdsTD.load(tmp_path)


def test_short_leaf_file(tmp_path: Path) -> None:
    RefTD(a=torch.ones(100), batch_size=[100]).memmap(tmp_path)
    os.truncate(tmp_path / "a.memmap", 10)
    # Deliberate difference: the reference zero-fills (and grows the file); tdshare raises.
    with pytest.raises(tdshare.CorruptDataError, match="truncated"):
        TdsTD.load(tmp_path)
    assert RefTD.load_memmap(tmp_path)["a"][50] == 0


def test_missing_nested_folder(tmp_path: Path) -> None:
    RefTD(a=torch.ones(3), n={"b": torch.ones(3)}, batch_size=[3]).memmap(tmp_path)
    (tmp_path / "n/b.memmap").unlink()
    (tmp_path / "n/meta.json").unlink()
    (tmp_path / "n").rmdir()
    # Deliberate difference: the reference skips the missing nested folder; tdshare raises.
    assert list(RefTD.load_memmap(tmp_path).keys()) == ["a"]
    with pytest.raises(tdshare.CorruptDataError, match="'n'"):
        TdsTD.load(tmp_path)


def test_longer_leaf_file_is_fine(tmp_path: Path) -> None:
    # The reference never truncates an existing larger file: readers go by meta.json's shape.
    RefTD(a=torch.arange(10.0), batch_size=[10]).memmap(tmp_path)
    RefTD(a=torch.ones(2), batch_size=[2]).memmap(tmp_path)
    assert (tmp_path / "a.memmap").stat().st_size == 40
    assert TdsTD.load(tmp_path)["a"].tolist() == [1.0, 1.0]


# -- overwriting and shared in-place writes across libraries ------------------------------
def test_tdshare_rewrites_reference_folder_in_place(tmp_path: Path) -> None:
    src = _mixed_ref()
    src.memmap(tmp_path)
    before = meta_files(tmp_path)
    loaded = TdsTD.load(tmp_path, allow_pickle=True)
    loaded.memmap_()  # no prefix: back into the folder it came from, reusing the mapped files
    assert loaded.is_memmap() and loaded.saved_path == str(tmp_path)
    assert meta_files(tmp_path) == before  # same metadata, byte for byte
    assert describe(RefTD.load_memmap(tmp_path, allow_pickle=True)) == describe(src)


def test_indexed_tdshare_view_to_reference(tmp_path: Path) -> None:
    RefTD(a=torch.arange(24.0).reshape(4, 6), n={"b": torch.arange(4)}, batch_size=[4]).memmap(tmp_path / "ref")
    view = TdsTD.load(tmp_path / "ref")[1:4:2]
    view.memmap(tmp_path / "tds", copy_existing=True)
    loaded = RefTD.load_memmap(tmp_path / "tds")
    assert loaded.batch_size == (2,) and loaded["n", "b"].tolist() == [1, 3]
    assert describe(loaded) == describe(RefTD.load_memmap(tmp_path / "ref")[1:4:2])


def test_overwrite_each_others_folders(tmp_path: Path) -> None:
    RefTD(a=torch.arange(10.0), b=torch.ones(10), batch_size=[10]).memmap(tmp_path)
    TdsTD(c=torch.full((2,), 7.0), a=torch.zeros(2), batch_size=[2]).memmap(tmp_path)
    ref = RefTD.load_memmap(tmp_path)
    assert list(ref.keys()) == ["c", "a"] and ref["a"].tolist() == [0.0, 0.0]
    ref.memmap(tmp_path / "again", copy_existing=True)
    RefTD(c=torch.ones(1), batch_size=[1]).memmap(tmp_path)
    assert describe(TdsTD.load(tmp_path)) == describe(RefTD(c=torch.ones(1), batch_size=[1]))
    assert TdsTD.load(tmp_path / "again")["c"].tolist() == [7.0, 7.0]


def test_in_place_writes_are_seen_by_the_other(tmp_path: Path) -> None:
    TdsTD(a=torch.zeros(4), n={"b": torch.zeros(4, 2)}, batch_size=[4]).memmap(tmp_path)
    ref = RefTD.load_memmap(tmp_path)
    ref["a"][1] = 5.0  # writes through to the mapped file
    ref["n", "b"][2] = 3.0
    tds = TdsTD.load(tmp_path)
    assert tds["a"].tolist() == [0.0, 5.0, 0.0, 0.0] and tds["n", "b"][2].tolist() == [3.0, 3.0]
    tds["a"][3] = 9.0
    assert ref["a"].tolist() == [0.0, 5.0, 0.0, 9.0]  # same pages
    ref2 = RefTD.load_memmap(tmp_path)
    assert ref2["a"][3] == 9.0


def test_nontensor_in_place_write_persists_for_reference(tmp_path: Path) -> None:
    td = TdsTD(a=torch.zeros(2), s="before", batch_size=[2]).memmap(tmp_path)
    td.set_("s", "after")
    assert RefTD.load_memmap(tmp_path)["s"] == "after"
    td.set_("s", {1, 2})  # now pickled
    assert RefTD.load_memmap(tmp_path, allow_pickle=True)["s"] == {1, 2}
    td.set_("s", "json again")  # the stale pickle goes away
    assert RefTD.load_memmap(tmp_path, allow_pickle=False)["s"] == "json again"


def test_load_subpath_and_out_on_reference_folder(tmp_path: Path) -> None:
    src = _mixed_ref()
    src.memmap(tmp_path)
    sub = TdsTD.load(tmp_path, subpath=("mid", "deep"))
    assert describe(sub) == describe(RefTD.load_memmap(tmp_path, subpath=("mid", "deep")))
    out = TdsTD.load(tmp_path, allow_pickle=True)
    mid = out["mid"]
    out.load_memmap_(tmp_path, allow_pickle=True)
    assert out["mid"] is mid
    assert describe(out) == describe(src)
