"""The command line: ``tdshare`` and ``python -m tdshare``, their help, exit codes and messages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tdshare
from tdshare.__main__ import main


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tdshare", *args], capture_output=True, text=True, timeout=120, env=env
    )


def _saved(tmp_path: Path, name: str = "folder", pickled: bool = False) -> Path:
    td = tdshare.TensorDict(a=torch.arange(3.0), batch_size=[3])
    if pickled:
        td["obj"] = {1, 2}
    td.save(tmp_path / name)
    return tmp_path / name


def test_version_and_console_script() -> None:
    out = _run("--version")
    assert out.returncode == 0 and out.stdout.strip().startswith("tdshare ")
    script = Path(sys.executable).with_name("tdshare")
    if not script.exists():  # pragma: no cover - an environment without the console script
        script = Path(shutil.which("tdshare") or "tdshare")
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == _run("--version").stdout.strip()


@pytest.mark.parametrize("command", ["pack", "unpack", "info", "verify", "status"])
def test_every_positional_argument_has_help(command: str) -> None:
    out = _run(command, "--help")
    assert out.returncode == 0
    section = out.stdout.split("positional arguments:", 1)[1].split("options:", 1)[0]
    names = [line for line in section.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert names and all(len(line.split(None, 1)) == 2 for line in names), section  # a name, then its help


def test_gc_says_when_there_is_nothing_to_clean(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    out = _run("gc", env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime)))
    assert out.returncode == 0 and out.stdout.strip() == "nothing to clean"


def test_pack_refuses_an_existing_archive_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _saved(tmp_path)
    archive = tmp_path / "a.tdz"
    archive.write_bytes(b"not mine to overwrite")
    assert main(["pack", str(folder), str(archive)]) == 1
    assert "--force" in capsys.readouterr().err and archive.read_bytes() == b"not mine to overwrite"
    assert main(["pack", str(folder), str(archive), "--force"]) == 0
    assert tdshare.load(archive)["a"].tolist() == [0.0, 1.0, 2.0]


def test_unpack_refuses_a_folder_with_files_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "a.tdz"
    assert main(["pack", str(_saved(tmp_path)), str(archive)]) == 0
    target = tmp_path / "out"
    target.mkdir()
    (target / "stale.txt").write_text("old")
    assert main(["unpack", str(archive), str(target)]) == 1
    assert "--force" in capsys.readouterr().err and (target / "stale.txt").exists()
    assert main(["unpack", str(archive), str(target), "--force"]) == 0
    assert sorted(p.name for p in target.iterdir()) == ["a.memmap", "meta.json"]  # replaced whole
    assert tdshare.load(target)["a"].tolist() == [0.0, 1.0, 2.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tdz", "folder", "out"]  # no staging left
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["unpack", str(archive), str(empty)]) == 0  # an empty folder is not refused


def test_verify_speaks_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _saved(tmp_path, pickled=True)
    assert main(["verify", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "--allow-pickle" in err and "allow_pickle=True" not in err
    assert main(["verify", str(folder), "--allow-pickle"]) == 0
