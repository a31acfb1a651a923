"""Progress of long work: the ``progress=`` callback of the saves, of pack/unpack, and the
terminal display the command line uses."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import tdshare
from tdshare import TensorDict, TerminalProgress, pack_memmap, unpack_memmap


def _td() -> TensorDict:
    leaves = {f"k{i}": torch.full((4, 3), float(i)) for i in range(5)}
    return TensorDict({**leaves, "n": {"x": torch.zeros(4), "e": torch.zeros(4, 0)}, "s": "v"}, batch_size=[4])


class Record:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total))


@pytest.mark.parametrize(
    ("target", "kwargs"),
    [("folder", {}), ("folder", {"num_threads": 2}), ("folder", {"atomic": True}), ("archive", {}), (None, {})],
)
def test_saves_report_every_leaf_file(tmp_path: Path, target: str | None, kwargs: dict) -> None:
    rec = Record()
    prefix = None if target is None else tmp_path / ("t.tdz" if target == "archive" else "td")
    out = _td().memmap(prefix, progress=rec, **kwargs)
    assert (out == _td()).all()
    total = 6 if target == "archive" else 7  # an archive has no file for the zero-element leaf
    assert rec.calls and rec.calls[-1] == (total, total)
    dones = [d for d, _ in rec.calls]
    assert dones == sorted(dones) and all(t == total for _, t in rec.calls)


def test_pack_and_unpack_report_every_entry(tmp_path: Path) -> None:
    _td().save(tmp_path / "td")
    packed, extracted = Record(), Record()
    pack_memmap(tmp_path / "td", tmp_path / "t.tdz", progress=packed)
    unpack_memmap(tmp_path / "t.tdz", tmp_path / "back", progress=extracted)
    files = sum(1 for p in (tmp_path / "td").rglob("*") if p.is_file())
    assert packed.calls[-1] == (files, files) and extracted.calls[-1] == (files, files)
    assert len(packed.calls) == files


def test_a_bad_progress_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="progress"):
        _td().memmap(tmp_path / "td", progress="yes")  # type: ignore[call-overload]
    assert not (tmp_path / "td").exists()


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_progress_draws_on_a_terminal_only() -> None:
    tty = FakeTerminal()
    bar = TerminalProgress("writing", stream=tty)
    for i in range(1, 4):
        bar(i, 3)
    bar.close()
    text = tty.getvalue()
    assert text.startswith("\rwriting: 1/3") and text.endswith("\rwriting: 3/3\n")
    piped = io.StringIO()
    quiet = TerminalProgress("writing", stream=piped)
    quiet(3, 3)
    quiet.close()
    assert piped.getvalue() == ""
    assert tdshare.TerminalProgress is TerminalProgress
