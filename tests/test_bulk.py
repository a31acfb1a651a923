"""The cyclic collector pause around bulk saves and loads (tdshare._bulk)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
import torch

from tdshare import MissingMetadataError, TensorDict
from tdshare._bulk import paused_gc


@pytest.fixture(autouse=True)
def _gc_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_restored_after() -> None:
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # nested
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_after_an_error() -> None:
    with pytest.raises(ZeroDivisionError), paused_gc():
        1 / 0  # noqa: B018
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_user_stays_off() -> None:
    gc.disable()
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_threads_turn_it_on_only_when_the_last_one_leaves() -> None:
    inside, release = threading.Event(), threading.Event()
    states: list[bool] = []

    def other() -> None:
        with paused_gc():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with paused_gc():
        pass
    states.append(gc.isenabled())  # the other thread is still inside: still off
    release.set()
    t.join(10)
    assert states == [False]
    assert gc.isenabled()


def test_save_and_load_leave_the_collector_on(tmp_path) -> None:
    td = TensorDict({"a": torch.arange(3), "b": {"c": torch.ones(2)}}, batch_size=[])
    td.memmap_(tmp_path / "td")
    assert gc.isenabled()
    loaded = TensorDict.load_memmap(tmp_path / "td")
    assert gc.isenabled()
    assert loaded["b", "c"].tolist() == [1.0, 1.0]
    with pytest.raises(MissingMetadataError):
        TensorDict.load_memmap(tmp_path / "missing")
    assert gc.isenabled()
