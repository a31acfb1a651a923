"""The exception hierarchy (tdshare/_errors.py): bases as documented, and errors that pickle."""

from __future__ import annotations

import builtins
import inspect
import multiprocessing as mp
import pickle
import re
from pathlib import Path

import pytest

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
        (tdshare.AtomicTargetError, NotADirectoryError),
        (tdshare.NotSupportedError, NotImplementedError),
        (tdshare.MissingMetadataError, FileNotFoundError),
        (tdshare.MissingKeyError, KeyError),
        (tdshare.KeyTypeError, TypeError),
        (tdshare.ArgumentTypeError, TypeError),
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
