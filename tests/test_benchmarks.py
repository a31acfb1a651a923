"""Smoke test of benchmarks/: tiny workloads run and give sensible rows (nothing is timed here)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _import(name: str) -> ModuleType:
    if str(ROOT) not in sys.path:  # plain `pytest` does not put the repository root on the path
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(name)


@pytest.mark.timeout(60)
def test_tiny_workloads_give_sensible_rows(tmp_path: Path) -> None:
    common = _import("benchmarks._common")
    workloads = _import("benchmarks.workloads")
    report = _import("benchmarks.report")

    backends, _ = common.load_backends()
    names = [b.name for b in backends]
    assert "tdshare" in names
    scratch = common.Scratch(str(tmp_path))
    cfg = common.config_for("tiny", scratch.root, None)
    rows = workloads.small_leaves(cfg, backends, scratch) + workloads.big_leaves(cfg, backends, scratch)
    scratch.close()

    assert {r.name for r in rows} >= {
        "memmap_ 20 leaves (2 sub-tds) -> fresh folder",
        "memmap_ 20 leaves (2 sub-tds) -> anonymous memory (prefix=None)",
        "load_memmap 20 leaves",
    }
    for row in rows:
        assert row.kind == "time"
        for name in names:
            cell = row.cells[name]
            assert cell.error is None, (row.name, name, cell.error)
            assert cell.value is not None and 0 < cell.value < 30
        if row.limit_name is not None:
            assert row.cells["limit"].value is not None and row.cells["limit"].value > 0
        if "tensordict" in names:
            ratio = row.ratio("tdshare", "tensordict")
            assert ratio is not None and ratio > 0
    assert not list(tmp_path.iterdir())  # every temporary folder is gone

    table = report.render(rows)
    assert table.splitlines()[0].startswith("| workload | tdshare | tensordict |")
    assert "load_memmap 20 leaves" in table
    assert all(r.to_json()["cells"]["tdshare"]["median"] > 0 for r in rows)


@pytest.mark.timeout(60)
def test_family_rows_come_with_a_tensordict_measured_in_the_same_rounds(tmp_path: Path) -> None:
    common = _import("benchmarks._common")
    workloads = _import("benchmarks.workloads")

    backends, _ = common.load_backends()
    scratch = common.Scratch(str(tmp_path))
    cfg = common.config_for("tiny", scratch.root, None)
    rows = workloads.family(cfg, backends, scratch)
    scratch.close()
    names = [r.name for r in rows]
    assert len(rows) == 8 and sum("(same rounds)" in n for n in names) == 4
    for row, companion in zip(rows[::2], rows[1::2], strict=True):
        assert "(same rounds)" in companion.name and "TensorDict" in companion.name
        assert companion.cells["limit"] is row.cells["limit"]  # one limit, measured once in those rounds
        for b in backends:
            mine, plain = row.cells[b.name], companion.cells[b.name]
            assert mine.error is None and plain.error is None, (row.name, b.name, mine.error, plain.error)
            assert len(mine.values) == len(plain.values) > 0 and mine.values != plain.values
    assert not list(tmp_path.iterdir())


def test_settle_measures_file_creation_and_keeps_its_probes(tmp_path: Path) -> None:
    common = _import("benchmarks._common")
    scratch = common.Scratch(str(tmp_path))
    per_file, waited = common.settle(scratch, normal_us=1e9, calm=1)  # any cost is normal: one probe
    probes = [p for p in Path(scratch.root).iterdir() if p.name.startswith("settle")]
    assert 0 < per_file < 1e6 and 0 <= waited < 30
    assert len(probes) == 1  # 50 folders of 20 files, the shape of the "fresh folder" rows
    assert sorted(len(list(d.iterdir())) for d in probes[0].iterdir()) == [20] * 50
    per_file, waited = common.settle(scratch, normal_us=0.0, limit_s=0.0)  # never calm: gives up at once
    assert per_file > 0 and len([p for p in Path(scratch.root).iterdir() if p.name.startswith("settle")]) == 2
    scratch.close()
    assert not list(tmp_path.iterdir())


def test_missing_features_print_unsupported() -> None:
    common = _import("benchmarks._common")
    assert common.describe_error(common.UnsupportedError("no tdz")) == "unsupported"
    assert common.describe_error(NotImplementedError()) == "unsupported"
    assert common.describe_error(TypeError("f() got an unexpected keyword argument 'compression'")) == "unsupported"
    assert common.describe_error(OSError(24, "Too many open files")) == "OSError EMFILE"

    def broken() -> float:
        raise common.UnsupportedError("missing")

    res = common.run_interleaved({"a": lambda: 1.0, "b": broken}, reps=2, warmup=1)
    assert res[""]["a"].values == [1.0, 1.0] and res[""]["a"].value == 1.0
    assert res[""]["b"].error == "unsupported" and res[""]["b"].value is None


def test_ratio_is_the_median_of_the_rounds_ratios() -> None:
    common = _import("benchmarks._common")
    cells = {"tdshare": common.Cell(values=[1.0, 3.0, 3.0]), "tensordict": common.Cell(values=[4.0, 9.0, 12.0])}
    # rounds: 4, 3 and 4 times faster; the medians alone (3 and 9) would say 3
    assert common.Row("g", "t", "time", cells).ratio("tdshare", "tensordict") == 4.0
    rates = {"tdshare": common.Cell(values=[8.0, 6.0, 10.0]), "tensordict": common.Cell(values=[2.0, 3.0, 2.0])}
    assert common.Row("g", "r", "rate", rates).ratio("tdshare", "tensordict") == 4.0  # rounds: 4, 2, 5
    sizes = {"tdshare": common.Cell(values=[1.0, 3.0, 3.0]), "tensordict": common.Cell(values=[4.0, 9.0, 12.0])}
    assert common.Row("g", "s", "bytes", sizes).ratio("tdshare", "tensordict") == 3.0  # not rounds: the medians
    uneven = {"tdshare": common.Cell(values=[1.0, 3.0]), "tensordict": common.Cell(values=[4.0, 9.0, 12.0])}
    assert common.Row("g", "t", "time", uneven).ratio("tdshare", "tensordict") == 9.0 / 2.0


def test_rows_note_slow_file_creation() -> None:
    common = _import("benchmarks._common")
    workloads = _import("benchmarks.workloads")
    report = _import("benchmarks.report")
    assert workloads._slow_creation_note(common.Cell(values=[0.010]), 1000) is None  # 10 µs a file: quiet
    note = workloads._slow_creation_note(common.Cell(values=[0.130]), 1000)
    assert note is not None and "130 µs" in note
    assert workloads._slow_creation_note(common.Cell(error="unsupported"), 1000) is None
    row = common.Row("g", "memmap_ x", "time", {"tdshare": common.Cell(values=[1.0])}, note=note)
    assert report.render([row]).endswith(f"Notes:\n- memmap_ x: {note}")


def test_run_interleaved_runs_before_ahead_of_every_case() -> None:
    common = _import("benchmarks._common")
    calls: list[str] = []
    res = common.run_interleaved(
        {"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0},
        reps=2,
        warmup=1,
        before=lambda: calls.append("sync"),
    )
    # three rounds, every case once in each, preceded by the hook; the first round in order
    assert calls[::2] == ["sync"] * 6 and calls[1:3:2] == ["a"] and calls[3:4] == ["b"]
    rounds = [calls[i + 1 : i + 4 : 2] for i in range(0, 12, 4)]
    assert all(sorted(r) == ["a", "b"] for r in rounds)
    assert res[""]["b"].values == [2.0, 2.0]


def test_run_interleaved_orders_are_shuffled_alike_in_every_process() -> None:
    common = _import("benchmarks._common")
    names = [f"c{i}" for i in range(6)]

    def orders() -> list[list[str]]:
        calls: list[str] = []
        common.run_interleaved({n: (lambda n=n: calls.append(n) or 1.0) for n in names}, reps=9, warmup=1)
        return [calls[i : i + 6] for i in range(0, len(calls), 6)]

    first, again = orders(), orders()
    assert first == again  # seeded by the round: two processes (ranks) run the same order
    assert first[0] == names and all(sorted(r) == names for r in first)
    assert len({tuple(r) for r in first}) > 5  # not one rotation: predecessors change


def test_only_selects_groups() -> None:
    runner = _import("benchmarks.runner")
    assert runner.select_groups(["small", "ref"]) == ["small", "refresh"]
    assert runner.select_groups(None)[0] == "limits"
    # a part of a group only by its exact name, never in the default run or by a prefix
    assert "handoff-live" not in runner.select_groups(None)
    assert runner.select_groups(["handoff-live"]) == ["handoff-live"]
    assert runner.select_groups(["hand"]) == ["handoff"]
    with pytest.raises(SystemExit):
        runner.select_groups(["nope"])
