"""Reliability suites (issue 18): crash consistency under SIGKILL, and hostile input (hypothesis).

Quick settings run in CI (about 200 kills and 300 hostile cases); ``TDSHARE_LONG_TESTS=1`` runs
ten times as many of each.  Every kill and case is counted in ``COUNTS`` and printed at the end
of the module (``-s`` shows it).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tdshare
from tdshare import SharedRegistry, TdshareError, TensorDict
from tdshare.__main__ import _collect as gc  # what `python -m tdshare gc PATH` runs

pytestmark = pytest.mark.reliability

LONG = os.environ.get("TDSHARE_LONG_TESTS") == "1"
SCALE = 10 if LONG else 1
COUNTS: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    print(f"\nreliability suites: {dict(COUNTS)}")


# -- crash consistency -----------------------------------------------------------------------------
def _state(i: int, same_shape: bool = False) -> TensorDict:
    """State ``i`` of a tree: the odd and even states differ in values, shapes and keys."""
    n = 3 if same_shape or i % 2 == 0 else 5
    fields: dict[str, Any] = {"a": torch.full((n,), float(i)), "n": {"b": torch.full((n, 2), float(i))}}
    fields["s"] = f"value {i}"
    if not same_shape and i % 2:
        fields["extra"] = torch.arange(n) + i
    return TensorDict(fields, batch_size=[n])


def _write(kind: str, path: str, i: int) -> None:
    if kind == "atomic":
        _state(i).memmap_(path, atomic=True, existsok=True)
    elif kind == "folder":
        _state(i, same_shape=True).save(path)
    elif kind == "tdz":
        _state(i).save(path)
    elif kind == "nontensor":
        td = TensorDict.load_memmap(path)
        td.unlock_()
        td["s"] = f"value {i}"
        td.memmap_(path, existsok=True)
    elif kind == "make_memmap":
        td = TensorDict.load_memmap(path).memmap_()  # back into its folder, its files reused
        td.make_memmap(f"k{i}", [3], dtype=torch.float32).fill_(float(i))
    else:
        raise AssertionError(kind)


def _child(kind: str, path: str, start: int, conn: Any) -> None:
    i = start
    while True:
        i += 1
        _write(kind, path, i)
        conn.send(i)  # the call for state i returned


def _check(kind: str, path: str, done: int) -> int:
    """The prefix holds state ``done`` (returned before the kill) or ``done + 1`` (in flight);
    returns which."""
    if kind == "make_memmap":
        td = TensorDict.load_memmap(path)
        keys = {k for k in td.keys() if k.startswith("k")}
        assert {f"k{j}" for j in range(1, done + 1)} <= keys <= {f"k{j}" for j in range(1, done + 2)}
        for k in keys:
            assert td[k].tolist() in ([float(k[1:])] * 3, [0.0] * 3)  # the fill may not have run
        return done + 1 if f"k{done + 1}" in keys else done
    loaded = TensorDict.load_memmap(path)
    if kind == "folder":  # non-atomic: each leaf is old or new (README: what non-atomic does not promise)
        for key in (("a",), ("n", "b")):
            assert loaded[key].unique().tolist() in ([float(done)], [float(done + 1)])
        assert loaded["s"] in (f"value {done}", f"value {done + 1}")
        return done
    if kind == "nontensor":
        assert loaded["s"] in (f"value {done}", f"value {done + 1}")
        assert loaded["a"].tolist() == [0.0] * 3
        return done
    matches = [j for j in (done, done + 1) if _same(loaded, _state(j))]
    assert matches, f"state after the kill equals neither {done} nor {done + 1}"
    return matches[-1]


def _same(got: TensorDict, want: TensorDict) -> bool:
    """Equal by value: batch size, every key, every leaf."""
    keys = sorted(map(str, want.keys(True, True)))
    if got.batch_size != want.batch_size or sorted(map(str, got.keys(True, True))) != keys:
        return False
    for key in want.keys(True, True):
        a, b = got.get(key), want.get(key)
        if isinstance(b, torch.Tensor):
            if not torch.equal(a.as_subclass(torch.Tensor), b):
                return False
        elif got[key] != want[key]:
            return False
    return True


def _debris(kind: str, path: str) -> list[str]:
    parent = os.path.dirname(path)
    found = [n for n in os.listdir(parent) if n.startswith(".tdtmp-") or n.endswith(".tmp")]
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            found += [os.path.join(root, n) for n in files if n.endswith(".tmp")]
            if "meta.json" in files:
                meta = json.loads(Path(root, "meta.json").read_text())
                journal = tdshare._journal.read_journal(root)  # entries added since the last compaction
                if journal is not None:
                    meta.update(tdshare._journal.parse_entries(journal.raw, root))
                named = {k + suffix for k in meta for suffix in (".memmap", ".shape.memmap")}
                named |= {tdshare._keys.encode_key(k) + ".memmap" for k in meta}
                found += [os.path.join(root, n) for n in files if n.endswith(".memmap") and n not in named]
    return found


def _kill_loop(kind: str, tmp_path: Path, kills: int, method: str = "fork") -> None:
    ctx = mp.get_context(method)
    path = str(tmp_path / (f"t-{uuid.uuid4().hex[:8]}" + (".tdz" if kind == "tdz" else "")))
    if kind in ("nontensor", "make_memmap"):
        TensorDict(a=torch.zeros(3), s="value 0", batch_size=[3]).save(path)
    else:
        _write(kind, path, 0)
    rng = random.Random(kills)
    done, restored = 0, 0
    for _ in range(kills):
        receiver, sender = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(kind, path, done, sender), daemon=True)
        proc.start()
        sender.close()
        for _ in range(rng.randint(1, 3)):
            assert receiver.poll(60), "the writer made no progress"
            done = receiver.recv()  # EOFError: the writer failed (its traceback is on stderr)
        for _ in range(rng.randrange(30_000)):  # a random point inside the next call
            pass
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        while receiver.poll():  # calls that returned before the signal landed
            try:
                done = receiver.recv()
            except EOFError:
                break
        receiver.close()
        COUNTS[f"kills {kind} ({method})"] += 1
        if not os.path.exists(path):  # killed between the two renames of an atomic swap
            gc([os.path.dirname(path)])  # what the next write does first, too
            restored += 1
        done = _check(kind, path, done)
        with SharedRegistry.for_path(path).lock() if os.path.isdir(path) else _NoLock():
            pass  # the lock is free: the kernel released the dead writer's flock
        done += 1
        _write(kind, path, done)  # the next write removes the dead writer's debris
        if kind == "make_memmap":
            gc([path])  # a make_memmap killed between file and metadata: gc or a save
        assert _debris(kind, path) == []
    COUNTS[f"restored {kind}"] += restored


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.timeout(300 * SCALE)
@pytest.mark.parametrize("kind", ["atomic", "folder", "tdz", "nontensor", "make_memmap"])
def test_sigkill_leaves_old_or_new_state(tmp_path: Path, kind: str) -> None:
    """40 kills per kind, 200 in all (the CI floor of issue 18)."""
    _kill_loop(kind, tmp_path, 40 * SCALE)
    assert COUNTS[f"kills {kind} (fork)"] == 40 * SCALE


@pytest.mark.timeout(300 * SCALE)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_sigkill_under_other_start_methods(tmp_path: Path, method: str) -> None:
    _kill_loop("atomic", tmp_path, 2 * SCALE, method)


# -- hostile input ---------------------------------------------------------------------------------
_ORIGINAL = TensorDict(
    a=torch.arange(6.0).reshape(3, 2),
    n={"b": torch.arange(3), "s": "text"},
    l=tdshare.LazyStackedTensorDict(*[TensorDict(x=torch.full((2,), float(i))) for i in range(3)]),
    batch_size=[3],
)
_VALUES = [None, True, 0, -1, 2**70, 1.5, "x", "torch.float32", "torch.bogus", [], [1], [-1], [3, 2], ["a"], {}]
_VALUES += [{"type": 1}, {"dtype": "torch.int64"}, [[1]], "<class 'tensordict.tensorclass.NonTensorData'>"]
_VALUES += ["<class 'tensordict._lazy.LazyStackedTensorDict'>", "<class 'tensordict.tensorclass.NonTensorStack'>"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "src"
    _ORIGINAL.save(path)
    return path


def _metas(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("meta.json"))


def _leaves(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*.memmap"))


def _mutate(obj: Any, choices: list[int]) -> Any:
    """Walk into ``obj`` along ``choices``; replace, rename or delete what is found there."""
    if not choices or not isinstance(obj, (dict, list)) or not obj:
        return obj
    c, rest = choices[0], choices[1:]
    if isinstance(obj, list):
        obj[c % len(obj)] = json.loads(json.dumps(_VALUES[c % len(_VALUES)]))
        return obj
    key = sorted(obj)[c % len(obj)]
    op = (c // 7) % 4
    if op == 0:
        obj[key] = json.loads(json.dumps(_VALUES[c % len(_VALUES)]))
    elif op == 1:
        obj[key[::-1] + "_"] = obj.pop(key)  # a flipped key name
    elif op == 2:
        obj.pop(key)
    else:
        _mutate(obj[key], rest)
    return obj


def _load_checked(path: Path, case: str) -> None:
    """Load must raise a TdshareError naming a file or key, or return data equal to the original
    wherever key, shape and dtype are the original's."""
    try:
        got = TensorDict.load_memmap(path, allow_pickle=False)
    except TdshareError as err:
        assert str(path) in str(err) or "'" in str(err), f"{case}: the message names neither file nor key: {err}"
        COUNTS["hostile refused"] += 1
        return
    COUNTS["hostile loaded"] += 1
    for key in got.keys(include_nested=True, leaves_only=True):
        try:
            want = _ORIGINAL.get(key)
        except KeyError:
            continue
        value = got.get(key)
        if isinstance(want, torch.Tensor) and isinstance(value, torch.Tensor):
            if want.shape == value.shape and want.dtype == value.dtype:
                assert torch.equal(want, value.as_subclass(torch.Tensor)), f"{case}: wrong data under {key}"


_FAST = settings(max_examples=100 * SCALE, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@_FAST
@given(st.integers(0, 20), st.lists(st.integers(0, 400), min_size=1, max_size=4), st.integers(1, 3))
def test_mutated_meta_json(saved: Path, which: int, choices: list[int], times: int) -> None:
    COUNTS["hostile cases"] += 1
    path = saved.parent / f"m-{uuid.uuid4().hex[:8]}"
    shutil.copytree(saved, path)
    try:
        meta_path = path / _metas(path)[which % len(_metas(path))]
        meta = json.loads(meta_path.read_text())
        for t in range(times):
            meta = _mutate(meta, choices[t:] or choices)
        meta_path.write_text(json.dumps(meta))
        _load_checked(path, f"{meta_path}: {json.dumps(meta)[:200]}")
    finally:
        shutil.rmtree(path)


@_FAST
@given(st.integers(0, 20), st.integers(-64, 64).filter(bool))
def test_truncated_or_extended_leaf_files(saved: Path, which: int, delta: int) -> None:
    COUNTS["hostile cases"] += 1
    path = saved.parent / f"l-{uuid.uuid4().hex[:8]}"
    shutil.copytree(saved, path)
    try:
        leaf = path / _leaves(path)[which % len(_leaves(path))]
        size = leaf.stat().st_size
        with open(leaf, "r+b") as f:
            if delta < 0:
                f.truncate(max(0, size + delta))
            else:
                f.seek(size)
                f.write(b"\xa5" * delta)
        if delta < 0:
            with pytest.raises(tdshare.CorruptDataError, match=r"truncated|missing|holds"):
                TensorDict.load_memmap(path)
            COUNTS["hostile refused"] += 1
        else:  # the format allows a longer file (the reference leaves them): the extra bytes are ignored
            assert (TensorDict.load_memmap(path) == _ORIGINAL).all()
            COUNTS["hostile loaded"] += 1
    finally:
        shutil.rmtree(path)


@_FAST
@given(st.integers(0, 40), st.sampled_from(["file", "dir"]))
def test_symlinks_out_of_the_prefix(saved: Path, which: int, target_kind: str) -> None:
    """A leaf file or a nested folder replaced by a link to outside the prefix is never followed out."""
    COUNTS["hostile cases"] += 1
    base = saved.parent / f"s-{uuid.uuid4().hex[:8]}"
    path = base / "td"
    shutil.copytree(saved, path)
    outside = base / "outside"
    outside.mkdir()
    try:
        items = _leaves(path) + [p.parent for p in _metas(path) if p.parent != Path(".")]
        victim = path / items[which % len(items)]
        if victim.is_dir():
            shutil.copytree(victim, outside / "copy")
            shutil.rmtree(victim)
            os.symlink(outside / "copy" if target_kind == "dir" else outside / "copy" / "meta.json", victim)
        else:
            shutil.copy(victim, outside / "copy.memmap")
            os.unlink(victim)
            os.symlink(outside / "copy.memmap", victim)
        with pytest.raises(TdshareError) as info:
            TensorDict.load_memmap(path)
        assert victim.name in str(info.value) or str(path) in str(info.value)
        COUNTS["hostile refused"] += 1
    finally:
        shutil.rmtree(base)


_KEY_CHARS = st.characters(codec="utf-8", exclude_categories=["Cs"])


@_FAST
@given(st.text(_KEY_CHARS, min_size=1, max_size=12))
def test_keys_with_special_characters(tmp_path_factory: pytest.TempPathFactory, key: str) -> None:
    """Any key round-trips exactly, or is refused at save time naming the key; nothing lands outside."""
    COUNTS["hostile cases"] += 1
    base = tmp_path_factory.mktemp("keys")
    path = base / "td"
    td = TensorDict({key: torch.arange(3.0), "n": {key: torch.ones(3)}}, batch_size=[3])
    try:
        td.save(path)
    except TdshareError as err:
        assert repr(key) in str(err) or key in str(err), f"refusal does not name the key {key!r}: {err}"
        COUNTS["hostile refused"] += 1
        assert sorted(os.listdir(base)) in ([], ["td"])
        return
    assert sorted(os.listdir(base)) == ["td"]  # nothing written beside or outside the prefix
    loaded = TensorDict.load_memmap(path)
    assert sorted(loaded.keys()) == sorted([key, "n"]) and loaded[key].tolist() == [0.0, 1.0, 2.0]
    assert loaded["n", key].tolist() == [1.0] * 3
    COUNTS["hostile loaded"] += 1
    shutil.rmtree(base)
