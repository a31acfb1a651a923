"""``tdshare.tensorclass``: the in-memory model, the memmap family, processes and compatibility.

The classes are defined at module level so that pickles (and spawned processes) find them by
name.  The reference's twins (``RefInner``, ``RefSample``) carry the same module and qualified
name as tdshare's ``Inner``/``Sample``, so ``str(cls)``, the ``_type`` marker written to disk, is
the same in both libraries and each loads the other's folders as its own class.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch

import tdshare
from tdshare import MemoryMappedTensor, TensorDict, tensorclass

tensordict = pytest.importorskip("tensordict")

WAIT = 60  # seconds any single hand-off between processes may take (a spawn child imports torch first)
METHODS = [m for m in ("spawn", "fork", "forkserver") if m in mp.get_all_start_methods()]


@tensorclass
class Inner:
    """A nested tensorclass."""

    y: torch.Tensor


@tensorclass
class Sample:
    """Tensor, non-tensor and nested fields, with defaults."""

    x: torch.Tensor
    label: str
    inner: Any = None
    count: int = 3
    extra: Any = None


@tensorclass
class Other:
    x: torch.Tensor


def _twin(name: str, annotations: dict[str, Any], defaults: dict[str, Any]) -> Any:
    """The reference's tensorclass with the module and qualified name of tdshare's ``name``."""
    namespace = {"__annotations__": annotations, "__module__": __name__, "__qualname__": name, **defaults}
    return tensordict.tensorclass(type(name, (), namespace))


RefInner = _twin("Inner", {"y": torch.Tensor}, {})
RefSample = _twin(
    "Sample",
    {"x": torch.Tensor, "label": str, "inner": Any, "count": int, "extra": Any},
    {"inner": None, "count": 3, "extra": None},
)
assert str(RefSample) == str(Sample) == f"<class '{__name__}.Sample'>"


def _sample(n: int = 3) -> Sample:
    return Sample(
        x=torch.arange(n * 2, dtype=torch.float32).reshape(n, 2),
        label="train",
        inner=Inner(y=torch.arange(n), batch_size=[n]),
        count=7,
        batch_size=[n],
    )


def _check_sample(s: Any, n: int = 3) -> None:
    assert type(s).__name__ == "Sample" and list(s.batch_size) == [n]
    assert s.x.tolist() == torch.arange(n * 2, dtype=torch.float32).reshape(n, 2).tolist()
    assert s.label == "train" and s.count == 7 and s.extra is None
    assert type(s.inner).__name__ == "Inner" and s.inner.y.tolist() == list(range(n))


# -- the in-memory model ----------------------------------------------------------------------
def test_construction_fields_and_defaults() -> None:
    s = Sample(torch.zeros(2, 1), "a", batch_size=[2])
    assert s.label == "a" and s.count == 3 and s.inner is None and s.extra is None
    assert "count" not in vars(Sample)  # no class attribute hides the instance's value
    assert isinstance(s._tensordict, TensorDict) and set(s._tensordict.keys()) == {"x", "label", "count"}
    s.extra = {"k": [1, 2]}
    s.count = 5
    assert s.extra == {"k": [1, 2]} and s.count == 5 and type(s.count) is int
    s.extra = None
    assert s.extra is None and "extra" not in s._tensordict.keys()
    assert s.get("label") == "a" and s.get("nope", 1) == 1 and s["label"] == "a"
    assert s.batch_size == torch.Size([2]) and s.shape == s.batch_size and len(s) == 2 and s.ndim == 1
    assert tdshare.is_tensorclass(s) and tdshare.is_tensorclass(Sample) and not tdshare.is_tensorclass(TensorDict)
    s.batch_size = [2]
    s.names = ["batch"]
    assert s.names == ["batch"]


def test_nested_get_and_set() -> None:
    s = _sample()
    assert s.get(("inner", "y")).tolist() == [0, 1, 2]
    s.set(("inner", "y"), torch.ones(3, dtype=torch.int64))
    assert s.inner.y.tolist() == [1, 1, 1]
    with pytest.raises(tdshare.BatchSizeError, match="'inner'"):
        s.inner = Inner(y=torch.zeros(4), batch_size=[4])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: Sample(x=torch.zeros(2), label="a", bogus=1, batch_size=[2]), tdshare.FieldError, "'bogus'"),
        (lambda: Sample(x=torch.zeros(2), batch_size=[2]), tdshare.ArgumentTypeError, "'label'"),
        (lambda: Sample(1, 2, 3, 4, 5, 6, batch_size=[]), tdshare.ArgumentTypeError, "at most 5"),
        (lambda: Sample(x=torch.zeros(3), label="a", batch_size=[2]), tdshare.BatchSizeError, "'x'"),
        (lambda: setattr(_sample(), "colour", 1), tdshare.FieldError, "'colour'"),
        (lambda: _sample().set("colour", 1), tdshare.FieldError, "'colour'"),
        (lambda: _sample()["colour"], tdshare.MissingKeyError, "'colour'"),
        (lambda: bool(_sample() == _sample()), tdshare.NotSupportedError, "all()"),
        (
            lambda: torch.stack([_sample(), Other(x=torch.zeros(3), batch_size=[3])]),
            tdshare.InvalidArgumentError,
            "Other",
        ),
    ],
)
def test_bad_input_names_the_problem(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
    assert issubclass(error, tdshare.TdshareError)


def test_setting_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="its fields are"):
        _sample().colour = 1


@pytest.mark.parametrize("name", ["batch_size", "shape", "to", "_tensordict", "device"])
def test_reserved_field_names_are_refused_when_decorating(name: str) -> None:
    cls = type("Bad", (), {"__annotations__": {name: torch.Tensor}})
    with pytest.raises(tdshare.InvalidArgumentError, match=f"Attribute name {name} can't.*rename"):
        tensorclass(cls)


def test_decorating_a_non_class_is_refused() -> None:
    with pytest.raises(tdshare.ArgumentTypeError, match="decorates a class"):
        tensorclass(3)  # type: ignore[arg-type]


def test_indexing_and_assignment_by_index() -> None:
    s = _sample()
    part = s[1:]
    assert type(part) is Sample and list(part.batch_size) == [2] and part.label == "train"
    assert part.x.tolist() == [[2.0, 3.0], [4.0, 5.0]] and part.inner.y.tolist() == [1, 2]
    one = s[0]
    assert one.batch_size == torch.Size([]) and one.inner.y.item() == 0
    s[1] = Sample(x=torch.tensor([9.0, 9.0]), label="train", inner=Inner(y=torch.tensor(5)), count=7)
    assert s.x[1].tolist() == [9.0, 9.0] and s.inner.y.tolist() == [0, 5, 2]
    s[torch.tensor([True, False, True])] = 0
    assert s.x[0].tolist() == [0.0, 0.0] and s.inner.y.tolist() == [0, 5, 0]
    assert [item.inner.y.item() for item in s] == [0, 5, 0]


@pytest.mark.parametrize(
    ("op", "dim", "shape"), [(torch.stack, 0, [2, 3]), (torch.stack, 1, [3, 2]), (torch.cat, 0, [6])]
)
def test_stack_and_cat(op: Any, dim: int, shape: list[int]) -> None:
    a, b = _sample(), _sample()
    b.x.add_(100)
    out = op([a, b], dim)
    assert type(out) is Sample and list(out.batch_size) == shape and out.label == "train" and out.count == 7
    assert type(out.inner) is Inner and list(out.inner.batch_size) == shape
    assert torch.equal(out.x, op([a.x, b.x], dim)) and torch.equal(out.inner.y, op([a.inner.y, b.inner.y], dim))
    assert [u.x.tolist() for u in torch.unbind(out, dim)] == [u.x.tolist() for u in out.unbind(dim)]


def test_clone_to_apply_and_equality() -> None:
    s = _sample()
    c = s.clone()
    c.x.zero_()
    c.inner.y.zero_()
    assert s.x.sum() > 0 and s.inner.y.sum() > 0  # a deep copy
    assert type(c) is Sample and type(c.inner) is Inner and c.label == "train"
    d = s.to(torch.float64)
    assert d.x.dtype == torch.float64 and d.inner.y.dtype == torch.float64 and d.label == "train"
    assert s.to() is s and s.to("cpu").device == torch.device("cpu")
    plus = s.apply(lambda t: t + 1)
    assert plus.x[0, 0].item() == 1.0 and plus.inner.y.tolist() == [1, 2, 3]
    eq = s == s.clone()
    assert type(eq) is Sample and eq.all() and eq.x.dtype == torch.bool
    assert not (s != s.clone()).any()
    changed = s.clone()
    changed.inner.y[0] = 99
    assert not (s == changed).all()  # the nested field counts


def test_repr_names_every_field() -> None:
    n = 3
    twin = RefSample(
        x=torch.arange(n * 2, dtype=torch.float32).reshape(n, 2),
        label="train",
        inner=RefInner(y=torch.arange(n), batch_size=[n]),
        count=7,
        batch_size=[n],
    )
    text = repr(_sample())
    assert text == repr(twin)  # the reference's compact form, field for field
    assert "inner: Inner{y: i64[]}" in text and "extra: None" in text


def test_to_and_from_tensordict() -> None:
    s = _sample()
    td = s.to_tensordict()
    assert type(td) is TensorDict and type(td._tensordict["inner"]) is TensorDict and td["label"] == "train"
    td["x"].zero_()
    assert s.x.sum() > 0  # a copy
    back = Sample.from_tensordict(TensorDict(x=torch.ones(2), label="b", batch_size=[2]))
    assert type(back) is Sample and back.label == "b" and back.count is None
    with pytest.raises(tdshare.FieldError, match="'zzz'"):
        Sample.from_tensordict(TensorDict(x=torch.ones(2), zzz=torch.ones(2), batch_size=[2]))


def test_locking() -> None:
    s = _sample().lock_()
    assert s.is_locked and s.inner.is_locked
    with pytest.raises(tdshare.LockedError):
        s.x = torch.zeros(3, 2)
    with pytest.raises(tdshare.LockedError):
        s.label = "other"
    s.set_("x", torch.ones(3, 2))
    s.set_("label", "other")
    assert s.x.sum() == 6 and s.label == "other"
    s.unlock_()
    s.label = "free"
    assert s.label == "free" and not s.is_locked


@pytest.mark.parametrize("memmapped", [False, True])
def test_pickle_round_trip(memmapped: bool, tmp_path: Path) -> None:
    s = _sample()
    if memmapped:
        s.memmap_(tmp_path)
    back = pickle.loads(pickle.dumps(s))
    _check_sample(back)
    assert back.is_memmap() == memmapped and back.is_locked == memmapped
    if memmapped:
        back.x[0, 0] = 42.0  # the same file
        assert s.x[0, 0].item() == 42.0


def test_pickle_of_a_memmapped_instance_is_a_small_handle(tmp_path: Path) -> None:
    s = Sample(x=torch.zeros(1000, 1000), label="big", batch_size=[1000]).memmap_(tmp_path)
    assert len(pickle.dumps(s)) < 2000


def test_a_tensordict_holding_a_tensorclass(tmp_path: Path) -> None:
    td = TensorDict({"s": _sample(), "z": torch.zeros(3)}, batch_size=[3])
    assert type(td._tensordict["s"]) is Sample
    assert type(td.clone()._tensordict["s"]) is Sample and type(td[0:2]._tensordict["s"].inner) is Inner
    assert td.to(torch.float64)._tensordict["s"].x.dtype == torch.float64
    td.lock_()
    assert td._tensordict["s"].is_locked and td._tensordict["s"].inner.is_locked
    td.unlock_()
    td.share_memory_()
    assert td._tensordict["s"].x.is_shared() and td._tensordict["s"].inner.y.is_shared()
    td2 = TensorDict({"s": _sample()}, batch_size=[3]).memmap(tmp_path)
    assert isinstance(td2._tensordict["s"].x, MemoryMappedTensor)
    assert json.loads((tmp_path / "meta.json").read_text())["s"] == {"type": "Sample"}
    loaded = TensorDict.load_memmap(tmp_path)
    _check_sample(loaded._tensordict["s"])


def test_share_memory() -> None:
    s = _sample().share_memory_()
    assert s.is_shared() and s.x.is_shared() and s.inner.y.is_shared() and s.is_locked
    with pytest.raises(tdshare.MemmapError, match="shared memory"):
        s.memmap_()


# -- the memmap family ------------------------------------------------------------------------
def _target(kind: str, tmp_path: Path) -> Path | None:
    return {"folder": tmp_path / "tc", "archive": tmp_path / "tc.tdz", "anonymous": None}[kind]


@pytest.mark.parametrize("kind", ["folder", "archive", "anonymous"])
def test_memmap_copy_and_load(kind: str, tmp_path: Path) -> None:
    s = _sample()
    prefix = _target(kind, tmp_path)
    out = s.memmap(prefix)
    _check_sample(out)
    assert type(s.x) is torch.Tensor and not s.is_memmap()  # the source is unchanged
    assert isinstance(out.x, MemoryMappedTensor) and isinstance(out.inner.y, MemoryMappedTensor)
    assert out.is_memmap() == (kind != "archive") and out.is_locked == (kind != "archive")
    if prefix is None:
        assert out.x._filename is None and out.x._segment is not None
        return
    for loader in (Sample.load_memmap, TensorDict.load_memmap, tdshare.load):
        _check_sample(loader(prefix))


@pytest.mark.parametrize("kind", ["folder", "anonymous"])
def test_memmap_in_place(kind: str, tmp_path: Path) -> None:
    s = _sample()
    inner = s.inner
    assert s.memmap_(_target(kind, tmp_path)) is s
    assert s.is_memmap() and s.is_locked and isinstance(s.x, MemoryMappedTensor)
    assert s.inner is inner and isinstance(inner.y, MemoryMappedTensor)  # nested instances kept
    _check_sample(s)
    with pytest.raises(tdshare.LockedError):
        s.x = torch.zeros(3, 2)
    if kind == "folder":
        s.x[0, 0] = -1.0
        assert Sample.load_memmap(tmp_path / "tc").x[0, 0].item() == -1.0


def test_folder_layout_is_the_reference_layout(tmp_path: Path) -> None:
    _sample().memmap(tmp_path)
    tag = f"<class '{__name__}.Sample'>"
    assert json.loads((tmp_path / "meta.json").read_text()) == {"_type": tag}
    inner_meta = json.loads((tmp_path / "_tensordict" / "meta.json").read_text())
    assert inner_meta["x"]["shape"] == [3, 2] and inner_meta["shape"] == [3]
    assert inner_meta["label"] == {"type": "NonTensorData"} and inner_meta["inner"] == {"type": "Inner"}
    assert "extra" not in inner_meta  # a None field has no entry
    label = json.loads((tmp_path / "_tensordict" / "label" / "meta.json").read_text())
    assert label["data"] == "train" and label["_is_non_tensor"] is True
    nested = json.loads((tmp_path / "_tensordict" / "inner" / "meta.json").read_text())
    assert nested == {"_type": f"<class '{__name__}.Inner'>"}


@pytest.mark.parametrize(
    "value", ["text", 5, 2.5, True, [1, "a", None], {"k": {"n": [1.5]}}, ("t", 1), {1, 2}, b"bytes"]
)
@pytest.mark.parametrize("kind", ["folder", "archive", "anonymous"])
def test_non_tensor_fields_round_trip(value: Any, kind: str, tmp_path: Path) -> None:
    s = Loose(x=torch.zeros(2), extra=value, batch_size=[2])
    prefix = _target(kind, tmp_path)
    out = s.memmap(prefix)
    expected = list(value) if isinstance(value, tuple) else value  # JSON has no tuples, as in the reference
    assert out.extra == (expected if kind == "archive" else value) and type(out) is Loose
    if prefix is not None:
        assert Loose.load_memmap(prefix, allow_pickle=True).extra == expected


@tensorclass(nocast=True)
class Loose:
    """Keeps numbers and lists as Python values (nocast)."""

    x: torch.Tensor
    extra: Any = None


@pytest.mark.parametrize("atomic", [False, True])
def test_resave_over_a_saved_tensordict(atomic: bool, tmp_path: Path) -> None:
    TensorDict({"old": torch.ones(2), "s": "stale"}, batch_size=[2]).memmap(tmp_path)
    out = Sample(x=torch.zeros(2), label="new", batch_size=[2]).memmap(tmp_path, atomic=atomic)
    assert out.label == "new" and out.x._filename == str(tmp_path / "_tensordict" / "x.memmap")
    back = Sample.load_memmap(tmp_path)
    assert type(back) is Sample and back.label == "new"
    assert (tmp_path / "old.memmap").exists() != atomic  # atomic replaces the folder whole
    assert not [p for p in tmp_path.parent.iterdir() if p.name.startswith(".tdtmp-")]


def test_atomic_in_place_maps_the_final_folder(tmp_path: Path) -> None:
    s = _sample().memmap_(tmp_path, atomic=True)
    assert s.x._filename == str(tmp_path / "_tensordict" / "x.memmap")
    assert s.inner.y._filename == str(tmp_path / "_tensordict" / "inner" / "_tensordict" / "y.memmap")
    s.x[0, 0] = 5.0
    assert Sample.load_memmap(tmp_path).x[0, 0].item() == 5.0
    again = _sample()
    again.label = "second"
    again.memmap_(tmp_path, atomic=True, copy_existing=True)
    assert Sample.load_memmap(tmp_path).label == "second"


@pytest.mark.parametrize("kind", ["folder", "archive"])
def test_a_value_that_cannot_be_saved_writes_nothing(kind: str, tmp_path: Path) -> None:
    s = Sample(x=torch.zeros(2), label="l", extra=lambda: 0, batch_size=[2])  # a lambda does not pickle
    with pytest.raises(Exception, match="extra"):
        s.memmap(_target(kind, tmp_path))
    assert list(tmp_path.iterdir()) == []
    assert not s.is_memmap() and type(s.x) is torch.Tensor


def test_existsok_false_refuses_an_existing_file(tmp_path: Path) -> None:
    _sample().memmap(tmp_path)
    with pytest.raises(tdshare.MemmapError, match="existsok=False"):
        _sample().memmap(tmp_path, existsok=False)


def test_return_early_gives_a_future(tmp_path: Path) -> None:
    future = _sample().memmap(tmp_path, num_threads=2, return_early=True)
    assert isinstance(future, tdshare.TensorDictFuture)
    _check_sample(future.result())
    assert json.loads((tmp_path / "meta.json").read_text())["_type"].endswith(".Sample'>")


def test_load_memmap_of_another_saved_class(tmp_path: Path) -> None:
    Other(x=torch.zeros(2), batch_size=[2]).memmap(tmp_path / "other")
    TensorDict(x=torch.zeros(2), batch_size=[2]).memmap(tmp_path / "plain")
    assert type(Sample.load_memmap(tmp_path / "other")) is Other  # the saved class, as the reference
    assert type(Sample.load_memmap(tmp_path / "plain")) is TensorDict


def _write_wrapper(folder: Path, tag: str) -> None:
    TensorDict(x=torch.arange(2.0), label="l", batch_size=[2]).memmap(folder / "_tensordict")
    (folder / "meta.json").write_text(json.dumps({"_type": tag}))


def test_unknown_class_is_an_error_naming_it_and_the_fix(tmp_path: Path) -> None:
    _write_wrapper(tmp_path, "<class 'nowhere.Ghost'>")
    with pytest.raises(tdshare.UnsupportedFormatError, match=r"nowhere\.Ghost.*Import the module"):
        Sample.load_memmap(tmp_path)
    with pytest.warns(UserWarning, match="tensorclass"):
        loaded = TensorDict.load_memmap(tmp_path)  # the fields, as a TensorDict
    assert type(loaded) is TensorDict and loaded["x"].tolist() == [0.0, 1.0]


def test_same_named_class_from_another_module_loads_as_cls(tmp_path: Path) -> None:
    _write_wrapper(tmp_path, "<class '__main__.Sample'>")  # e.g. saved from a script
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = Sample.load_memmap(tmp_path)
    assert type(loaded) is Sample and loaded.label == "l" and loaded.x.tolist() == [0.0, 1.0]


@pytest.mark.parametrize("kind", ["folder", "archive"])
def test_load_memmap_into_an_instance(kind: str, tmp_path: Path) -> None:
    prefix = _target(kind, tmp_path)
    assert prefix is not None
    _sample().memmap(prefix)
    target = Sample(x=torch.zeros(3, 2), label="x", inner=Inner(y=torch.zeros(3), batch_size=[3]), batch_size=[3])
    keep = target._tensordict
    assert target.load_memmap_(prefix) is target and target._tensordict is keep
    _check_sample(target)
    with pytest.raises(tdshare.InvalidArgumentError, match="in place"):
        Other(x=torch.zeros(3), batch_size=[3]).load_memmap_(prefix)


def test_load_memmap_into_a_memmapped_instance_stays_memmapped(tmp_path: Path) -> None:
    a = _sample().memmap_(tmp_path / "a")
    _sample().memmap(tmp_path / "b")
    a.load_memmap_(tmp_path / "b")
    assert a.is_memmap() and a.is_locked and a.x._filename == str(tmp_path / "b" / "_tensordict" / "x.memmap")


@pytest.mark.parametrize("kind", ["folder", "anonymous"])
def test_make_memmap_family_and_refresh(kind: str, tmp_path: Path) -> None:
    prefix = _target(kind, tmp_path)
    s = Sample(x=torch.zeros(2), label="l", batch_size=[2]).memmap_(prefix)
    reader = pickle.loads(pickle.dumps(s))
    extra = s.make_memmap("extra", [2, 3], dtype=torch.int16)
    assert isinstance(extra, MemoryMappedTensor) and s.extra is extra and s.is_locked
    s.extra[:] = 4
    assert reader.extra is None
    reader.memmap_refresh_()
    assert reader.extra.tolist() == [[4, 4, 4], [4, 4, 4]]
    assert s.make_memmap_from_tensor("inner", torch.ones(2)).tolist() == [1.0, 1.0]
    storage = torch.full((2,), 7.0).untyped_storage()
    s.unlock_().set("extra", None)
    s.memmap_(prefix)
    with pytest.warns(FutureWarning, match="no file") if kind == "folder" else nullcontext():
        assert s.make_memmap_from_storage("extra", storage, [2], dtype=torch.float32).tolist() == [7.0, 7.0]
    with pytest.raises(tdshare.FieldError, match="'nope'"):
        s.make_memmap("nope", [2])


def test_share_non_tensor_between_copies(tmp_path: Path) -> None:
    s = Sample(x=torch.zeros(2), label="start", batch_size=[2]).memmap_(tmp_path, share_non_tensor=True)
    other = pickle.loads(pickle.dumps(s))
    s.set_("label", "changed")
    assert other.label == "changed"
    assert Sample.load_memmap(tmp_path).label == "changed"  # persisted in the folder too


# -- processes --------------------------------------------------------------------------------
def _worker(arg: Any, commands: Any, replies: Any) -> None:
    try:
        replies.put(("arg", [type(arg).__name__, arg.label, arg.x.tolist(), type(arg.inner).__name__]))
        arg.x[0, 0] = 42.0
        arg.inner.y[0] = -7
        replies.put(("written", None))
        received = commands.get(timeout=WAIT)
        replies.put(("queued", [type(received).__name__, received.x[0, 0].item(), received.is_memmap()]))
    except BaseException:
        replies.put(("error", traceback.format_exc()))


def _get(replies: Any, expected: str, proc: Any) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            tag, payload = replies.get(timeout=0.5)
            break
        except queue.Empty:
            if not proc.is_alive():
                pytest.fail(f"the worker exited with code {proc.exitcode} before replying {expected!r}")
            if time.monotonic() > deadline:
                raise
    if tag == "error":
        pytest.fail(f"the worker failed:\n{payload}")
    assert tag == expected
    return payload


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["folder", "anonymous"])
@pytest.mark.parametrize("method", METHODS)
def test_share_with_a_process(method: str, kind: str, tmp_path: Path) -> None:
    ctx = mp.get_context(method)
    s = _sample().memmap_(_target(kind, tmp_path))
    before = s.x.tolist()
    commands, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_worker, args=(s, commands, replies))
    proc.start()
    ok = False
    try:
        assert _get(replies, "arg", proc) == ["Sample", "train", before, "Inner"]
        _get(replies, "written", proc)
        assert s.x[0, 0].item() == 42.0 and s.inner.y[0].item() == -7  # the child wrote into shared memory
        commands.put(s)
        assert _get(replies, "queued", proc) == ["Sample", 42.0, True]
        ok = True
    finally:
        if not ok and proc.is_alive():
            proc.kill()
        proc.join(timeout=WAIT)
    assert proc.exitcode == 0


# -- compatibility with the reference -----------------------------------------------------------
def _ref_sample(n: int = 3) -> Any:
    return RefSample(
        x=torch.arange(n * 2, dtype=torch.float32).reshape(n, 2),
        label="train",
        inner=RefInner(y=torch.arange(n), batch_size=[n]),
        count=7,
        batch_size=[n],
    )


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["top", "nested"])
def test_same_files_as_the_reference(where: str, tmp_path: Path) -> None:
    ours, theirs = _sample(), _ref_sample()
    if where == "nested":
        ours = TensorDict({"s": ours}, batch_size=[3])
        theirs = tensordict.TensorDict({"s": theirs}, batch_size=[3])
    ours.memmap(tmp_path / "tdshare")
    theirs.memmap(tmp_path / "ref")
    assert _files(tmp_path / "tdshare") == _files(tmp_path / "ref")


@pytest.mark.parametrize("suffix", ["", ".tdz"])
def test_reference_loads_what_tdshare_saved(suffix: str, tmp_path: Path) -> None:
    prefix = tmp_path / f"saved{suffix}"
    _sample().memmap(prefix)
    for loaded in (tensordict.TensorDict.load_memmap(prefix), RefSample.load_memmap(prefix)):
        assert type(loaded) is RefSample and type(loaded.inner) is RefInner
        assert loaded.label == "train" and loaded.count == 7 and loaded.extra is None
        assert loaded.x.tolist() == _sample().x.tolist() and loaded.inner.y.tolist() == [0, 1, 2]
    nested = tmp_path / f"nested{suffix}"
    TensorDict({"s": _sample(), "z": torch.ones(3)}, batch_size=[3]).memmap(nested)
    back = tensordict.TensorDict.load_memmap(nested)
    assert type(back["s"]) is RefSample and back["s"].inner.y.tolist() == [0, 1, 2]


@pytest.mark.parametrize("suffix", ["", ".tdz"])
def test_tdshare_loads_what_the_reference_saved(suffix: str, tmp_path: Path) -> None:
    prefix = tmp_path / f"saved{suffix}"
    _ref_sample().memmap(prefix)
    for loaded in (TensorDict.load_memmap(prefix), Sample.load_memmap(prefix), tdshare.load(prefix)):
        _check_sample(loaded)
        assert type(loaded) is Sample
    nested = tmp_path / f"nested{suffix}"
    tensordict.TensorDict({"s": _ref_sample()}, batch_size=[3]).memmap(nested)
    _check_sample(TensorDict.load_memmap(nested)._tensordict["s"])


def test_reference_edits_are_seen_by_tdshare(tmp_path: Path) -> None:
    ours = _sample().memmap_(tmp_path)
    theirs = RefSample.load_memmap(tmp_path)
    theirs.x[0, 0] = 123.0
    assert ours.x[0, 0].item() == 123.0
    assert os.path.isfile(tmp_path / "_tensordict" / "x.memmap")


@pytest.mark.parametrize(("op", "batch"), [(torch.stack, [2, 3]), (torch.cat, [6])])
def test_stacking_tensordicts_that_hold_a_tensorclass(op: Any, batch: list[int]) -> None:
    td = TensorDict(s=_sample(), y=torch.ones(3), batch_size=[3])
    out = op([td, td.clone()], 0)
    assert out.batch_size == torch.Size(batch) and type(out._tensordict["s"]) is Sample
    assert out["s"].batch_size == torch.Size(batch) and out["y"].shape == torch.Size(batch)
