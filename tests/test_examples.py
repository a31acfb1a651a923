"""The examples run as scripts (each starts its own spawned processes) and print what they claim."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(name: str, tmp_path: Path) -> str:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    # the examples clean up their folders, and tdshare writes nothing beside them
    left = [p.name for p in tmpdir.rglob("*")]
    assert left == [], left
    return proc.stdout


@pytest.mark.timeout(180)
def test_actor_learner(tmp_path: Path) -> None:
    out = _run("actor_learner.py", tmp_path)
    assert "actors finished: [0, 1]" in out
    match = re.search(r"sampled batch: torch\.Size\(\[32\]\) mean obs ([0-9.]+)", out)
    assert match is not None, out
    assert 1.0 <= float(match.group(1)) <= 2.0  # rows hold 1.0 (actor 0) or 2.0 (actor 1)
    assert "status: learning | keys: ['obs', 'priority', 'reward', 'status']" in out


@pytest.mark.timeout(180)
def test_dataloader_workers(tmp_path: Path) -> None:
    out = _run("dataloader_workers.py", tmp_path)
    match = re.search(r"pickled handle: (\d+) bytes for 400000 bytes of data", out)
    assert match is not None, out
    assert int(match.group(1)) < 2048  # a handle, not the data
    total = sum(range(10_000 * 8))
    assert f"2 workers read all 10000 rows; sum of obs = {total}" in out


@pytest.mark.timeout(180)
def test_map_chunks(tmp_path: Path) -> None:
    out = _run("map_chunks.py", tmp_path)
    assert "map: 100000 rows, max obs 1.0" in out
    assert "out filled by the workers: True" in out
    assert "map_iter: stopped after 3 batches of 10000; workers left: 0" in out
