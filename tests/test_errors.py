"""The exception hierarchy (tdshare/_errors.py): bases as documented, and errors that pickle."""

from __future__ import annotations

import builtins
import inspect
import multiprocessing as mp
import pickle
import re
from pathlib import Path

import pytest
import torch

import tdshare
from tdshare import _errors

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()

ERROR_CLASSES = sorted(
    (obj for obj in vars(_errors).values() if inspect.isclass(obj) and issubclass(obj, BaseException)),
    key=lambda c: c.__name__,
)
ERROR_NAMES = [c.__name__ for c in ERROR_CLASSES]


def _documented_bases() -> dict[str, type[BaseException]]:
    """error name -> builtin, from the rows of the README's Errors table."""
    section = README.split("## Errors", 1)[1].split("\n## ", 1)[0]
    out: dict[str, type[BaseException]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`(\w+)`", cells[0])
        bases = re.findall(r"`(\w+)`", cells[1])
        if len(bases) == 1:
            bases = bases * len(names)
        if len(names) == 2 and len(bases) == 2 and " / " in cells[0]:
            pairs = zip(names, bases, strict=True)
        else:  # "`MemmapError` (`FileExistsRuntimeError`, `NotMemmapError`)" share one builtin
            pairs = zip(names, [bases[0]] * len(names), strict=True)
        for name, base in pairs:
            out[name] = getattr(builtins, base)
    return out


DOCUMENTED = _documented_bases()


def test_every_error_is_exported_and_documented() -> None:
    assert set(_errors.__all__) == set(ERROR_NAMES)
    for name in ERROR_NAMES:
        assert getattr(tdshare, name) is getattr(_errors, name)
        assert name in tdshare.__all__
        if name != "TdshareError":
            assert name in DOCUMENTED, f"{name} is missing from the README's Errors table"
    assert set(DOCUMENTED) <= set(ERROR_NAMES)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=ERROR_NAMES)
def test_bases(cls: type[BaseException]) -> None:
    assert issubclass(cls, tdshare.TdshareError)
    assert issubclass(cls, Exception)
    if cls is not tdshare.TdshareError:
        assert issubclass(cls, DOCUMENTED[cls.__name__])
    assert cls.__doc__, f"{cls.__name__} needs a docstring"


@pytest.mark.parametrize(
    ("cls", "base"),
    [
        (tdshare.LockedError, RuntimeError),
        (tdshare.BatchSizeError, RuntimeError),
        (tdshare.MemmapError, RuntimeError),
        (tdshare.FileExistsRuntimeError, tdshare.MemmapError),
        (tdshare.NotMemmapError, tdshare.MemmapError),
        (tdshare.PickleRefusedError, RuntimeError),
        (tdshare.UnsupportedFormatError, RuntimeError),
        (tdshare.FormatError, ValueError),
        (tdshare.CorruptDataError, tdshare.FormatError),
        (tdshare.InvalidArgumentError, ValueError),
        (tdshare.LegacyKeyError, ValueError),
        (tdshare.LegacyKeyError, RuntimeError),
        (tdshare.AtomicTargetError, NotADirectoryError),
        (tdshare.NotSupportedError, NotImplementedError),
        (tdshare.MissingMetadataError, FileNotFoundError),
        (tdshare.MissingKeyError, KeyError),
        (tdshare.KeyTypeError, TypeError),
        (tdshare.ArgumentTypeError, TypeError),
        (tdshare.DimensionError, IndexError),
        (tdshare.ResourceLimitError, OSError),
    ],
)
def test_explicit_bases(cls: type[BaseException], base: type[BaseException]) -> None:
    """The same table written out, so that a README edit cannot silently change a base."""
    assert issubclass(cls, base) and issubclass(cls, tdshare.TdshareError)


def _message(cls: type[BaseException]) -> str:
    return f"{cls.__name__}: the file '/tmp/x/a b.memmap' holds 3 bytes but 12 are expected"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=ERROR_NAMES)
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_roundtrip(cls: type[BaseException], protocol: int) -> None:
    err = cls(_message(cls))
    back = pickle.loads(pickle.dumps(err, protocol=protocol))
    assert type(back) is cls
    assert back.args == err.args
    assert str(back) == str(err) == _message(cls)


def test_missing_key_error_reads_as_a_sentence() -> None:
    # KeyError would print the repr ('...'); MissingKeyError prints the message as written.
    assert str(tdshare.MissingKeyError("key 'a' is not in the tensordict")) == "key 'a' is not in the tensordict"
    assert str(tdshare.MissingKeyError()) == ""


def test_errors_caught_by_builtin() -> None:
    with pytest.raises(RuntimeError):
        raise tdshare.LockedError("locked")
    with pytest.raises(ValueError):
        raise tdshare.CorruptDataError("truncated")
    with pytest.raises(OSError):
        raise tdshare.MissingMetadataError("no meta.json")
    with pytest.raises(OSError):
        raise tdshare.AtomicTargetError("a file")


def _raise_in_child(name: str, message: str, queue: mp.Queue) -> None:
    try:
        raise getattr(tdshare, name)(message)
    except Exception as err:
        queue.put(err)


@pytest.mark.timeout(60)
def test_errors_cross_a_spawned_process() -> None:
    """Every error, raised in a spawn child, reaches the parent through a Queue unchanged."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    # One child raises them all in turn (a process per class would be slow).
    proc = ctx.Process(target=_raise_all_in_child, args=(ERROR_NAMES, queue))
    proc.start()
    try:
        received = [queue.get(timeout=45) for _ in ERROR_NAMES]
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    for cls, err in zip(ERROR_CLASSES, received, strict=True):
        assert type(err) is cls
        assert str(err) == _message(cls)
        assert isinstance(err, tdshare.TdshareError)


def _raise_all_in_child(names: list[str], queue: mp.Queue) -> None:
    for name in names:
        cls = getattr(tdshare, name)
        _raise_in_child(name, _message(cls), queue)


# -- arguments are checked before anything is created, with messages that say the fix ----------
@pytest.mark.parametrize("bad", ["3", "34", b"3", True, 2.5, [2, "x"], [1.0]])
def test_batch_size_must_be_ints(bad: object) -> None:
    import torch

    with pytest.raises(ValueError, match="batch_size must be an int or a sequence of ints") as info:
        tdshare.TensorDict({}, batch_size=bad)  # type: ignore[arg-type]
    assert isinstance(info.value, tdshare.InvalidArgumentError)  # a ValueError, as the reference's for strings
    assert tdshare.TensorDict({}, batch_size=torch.tensor(3)).batch_size == (3,)


def test_batch_size_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="negative"):
        tdshare.TensorDict({}, batch_size=[2, -1])


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"num_threads": "2"}, "num_threads"), ({"num_threads": -1}, "num_threads"), ({"existsok": "no"}, "existsok")],
)
def test_save_arguments_are_checked_before_anything_is_created(tmp_path: Path, kwargs: dict, name: str) -> None:
    import torch

    td = tdshare.TensorDict(a=torch.zeros(2), batch_size=[2])
    with pytest.raises((TypeError, ValueError), match=name) as info:
        td.memmap(tmp_path / "td", **kwargs)
    assert isinstance(info.value, tdshare.TdshareError)
    assert not (tmp_path / "td").exists()


def test_memmap_onto_a_file_names_the_prefix_and_the_fix(tmp_path: Path) -> None:
    import torch

    target = tmp_path / "plain.bin"
    target.write_bytes(b"keep")
    td = tdshare.TensorDict(a=torch.zeros(2), batch_size=[2])
    for call in (td.memmap_, td.memmap, td.save):
        with pytest.raises(NotADirectoryError, match=r"'\.tdz'") as info:
            call(target)
        assert isinstance(info.value, FileExistsError) and str(target) in str(info.value)
    assert target.read_bytes() == b"keep" and not td.is_memmap()


def test_the_locked_error_says_how_to_add_an_entry() -> None:
    import torch

    td = tdshare.TensorDict(a=torch.zeros(2), batch_size=[2]).lock_()
    with pytest.raises(RuntimeError, match="set_") as info:
        td["b"] = torch.zeros(2)
    assert "unlock_()" in str(info.value) and "make_memmap" in str(info.value)


def test_loading_a_missing_folder_says_it_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        tdshare.TensorDict.load(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"meta\.json is missing"):
        tdshare.TensorDict.load(tmp_path / "empty")


# -- the precise class for each bad input (found by running every docstring example) -------------
@pytest.mark.parametrize("kind", ["tensordict", "tensorclass", "lazy"])
def test_existsok_false_on_an_existing_file_is_file_exists_runtime_error(tmp_path: Path, kind: str) -> None:
    from _kinds import build

    build(kind).memmap(tmp_path / "td")
    with pytest.raises(tdshare.FileExistsRuntimeError, match=r"already exists and existsok=False") as info:
        build(kind, 1.0).memmap(tmp_path / "td", existsok=False)
    assert isinstance(info.value, RuntimeError) and ".memmap" in str(info.value)
    assert tdshare.load_memmap(tmp_path / "td")["a"].tolist() == [0.0, 1.0, 2.0, 3.0]  # the first save is kept


def test_a_batch_dim_out_of_range_is_a_dimension_error() -> None:
    import torch

    td = tdshare.TensorDict(a=torch.zeros(3, 2), batch_size=[3, 2])
    for call in (lambda: td.unbind(2), lambda: td.unbind(-3), lambda: td.squeeze(5)):
        with pytest.raises(tdshare.DimensionError) as info:
            call()
        assert isinstance(info.value, IndexError)
    assert [t.batch_size for t in td.unbind(-1)] == [torch.Size([3])] * 2


def test_saved_path_is_none_for_anonymous_memory_and_raises_when_not_memory_mapped(tmp_path: Path) -> None:
    import torch

    td = tdshare.TensorDict(a=torch.zeros(2), batch_size=[2])
    with pytest.raises(AttributeError, match=r"no saved path"):
        td.saved_path  # noqa: B018
    assert td.memmap_().saved_path is None
    assert tdshare.TensorDict(a=torch.zeros(2), batch_size=[2]).memmap_(tmp_path).saved_path == str(tmp_path)


def test_memory_mapped_tensor_is_shared_only_when_its_memory_is(tmp_path: Path) -> None:
    import torch

    plain = tdshare.MemoryMappedTensor(torch.arange(3.0))
    assert not plain.is_shared()
    assert plain.share_memory_() is plain and plain.is_shared() and plain.tolist() == [0.0, 1.0, 2.0]
    assert tdshare.MemoryMappedTensor.zeros(2).is_shared()
    assert tdshare.MemoryMappedTensor.zeros(2, filename=tmp_path / "f.memmap")[1:].is_shared()


@pytest.mark.parametrize("bad", [3, 2.5, b"\xff".decode("latin-1").encode()])
def test_a_prefix_that_is_not_a_path_is_an_argument_type_error(tmp_path: Path, bad: object) -> None:
    import torch

    td = tdshare.TensorDict(a=torch.zeros(2), batch_size=[2])
    calls = [
        lambda: tdshare.TensorDict.load_memmap(bad),
        lambda: td.load_memmap_(bad),
        lambda: tdshare.unpack_memmap(bad, tmp_path / "out"),
        lambda: tdshare.refresh_archive_checksums(bad),
    ]
    for call in calls:
        with pytest.raises(tdshare.ArgumentTypeError, match=r"must be a path") as info:
            call()
        assert isinstance(info.value, TypeError)
    assert not (tmp_path / "out").exists()


def test_a_folder_given_as_an_archive_is_named(tmp_path: Path) -> None:
    import torch

    tdshare.TensorDict(a=torch.zeros(2), batch_size=[2]).memmap(tmp_path / "td")
    for call in (
        lambda: tdshare.refresh_archive_checksums(tmp_path / "td"),
        lambda: tdshare.unpack_memmap(tmp_path / "td", tmp_path / "out"),
    ):
        with pytest.raises(tdshare.InvalidArgumentError, match=r"is a folder, not a \.tdz archive") as info:
            call()
        assert str(tmp_path / "td") in str(info.value)


def test_make_memmap_from_tensor_of_a_list_is_an_argument_type_error(tmp_path: Path) -> None:
    import torch

    td = tdshare.TensorDict(a=torch.zeros(2), batch_size=[2]).memmap_(tmp_path)
    with pytest.raises(tdshare.ArgumentTypeError, match=r"expects a torch.Tensor, got list"):
        td.make_memmap_from_tensor("k", [1, 2])  # type: ignore[arg-type]
    assert "k" not in td.keys() and not (tmp_path / "k.memmap").exists()


@pytest.mark.parametrize("call", ["get", "set", "pop"])
def test_a_key_of_the_wrong_type_is_a_key_error_as_in_the_reference(call: str) -> None:
    import tensordict

    for lib, error in ((tdshare, tdshare.KeyTypeError), (tensordict, KeyError)):
        td = lib.TensorDict(a=torch.zeros(2))
        args: tuple = (5, torch.zeros(2)) if call == "set" else (5,)
        with pytest.raises(KeyError) as info:
            getattr(td, call)(*args)
        assert isinstance(info.value, error)
    with pytest.raises(TypeError, match="Keys must be strings"):
        tdshare.TensorDict(a=torch.zeros(2)).get(5)
