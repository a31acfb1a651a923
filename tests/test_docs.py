"""The README's python snippets and the examples run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_has_snippets() -> None:
    assert len(SNIPPETS) >= 4


@pytest.mark.timeout(300)
@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index: int, tmp_path: Path) -> None:
    """Each snippet runs as a newcomer runs it: in a fresh interpreter (a snippet that forks must not
    inherit the threads and locks of a test process that ran other tests first)."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", SNIPPETS[index]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280
    )
    assert out.returncode == 0, f"README.md snippet {index} failed:\n{out.stdout}\n{out.stderr}"


def test_readme_commands_pin_torch() -> None:
    head = (ROOT / "README.md").read_text().split("---")[0]
    commands = re.findall(r"```bash\n(.*?)```", head, flags=re.S)
    assert len(commands) == 2
    assert all("torch==2.13.0" in c for c in commands)
    assert "examples/quickstart.py" in commands[0] and "pytest -n auto" in commands[1]


@pytest.mark.timeout(300)
def test_quickstart_example_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "worker 2: obs row sum=38" in out.stdout
    assert "rewards written by the workers: [10.0, 20.0, 30.0]" in out.stdout
    assert "anonymous shared counter: [1, 2, 3]" in out.stdout
    assert "shared status: worker 0 was here" in out.stdout
    assert "entry added by worker 0, after refresh: [1.5, 1.5, 1.5]" in out.stdout
    assert "archive: ['bonus', 'info', 'obs', 'reward', 'status'] 4.5" in out.stdout


MODULES = sorted(p.stem for p in (ROOT / "tdshare").glob("*.py") if p.stem != "__main__")


def _public_objects() -> set[int]:
    """The ids of tdshare's public names and of the public methods and properties of its public classes."""
    import inspect

    import tdshare

    ids: set[int] = set()
    for name in tdshare.__all__:
        obj = getattr(tdshare, name)
        ids.add(id(obj))
        if inspect.isclass(obj):
            for attr in dir(obj):
                if not attr.startswith("_"):
                    static = inspect.getattr_static(obj, attr)
                    ids.update((id(static), id(getattr(static, "__func__", static))))
    return ids


def _finder(module: Any) -> Any:
    """A doctest finder that assigns every docstring to the module that defines it.

    ``tdshare/__init__.py`` renames the public classes' ``__module__`` to ``"tdshare"``, so the
    stock finder skips their methods everywhere (in ``tdshare`` their functions' globals differ, in
    the defining module the class looks foreign).  Here a function belongs where its globals are,
    and a class where it is defined (its ``class`` statement is in the module's source).

    The example of a public name runs with ``torch`` alone, as a user types it (it imports every
    tdshare name it uses); one of an internal helper also sees its module's names.
    """
    import doctest
    import inspect

    import torch

    source = Path(module.__file__).read_text()
    public = _public_objects()

    class Finder(doctest.DocTestFinder):
        def _from_module(self, mod: Any, obj: Any) -> bool:
            if inspect.isfunction(obj):
                return obj.__globals__ is mod.__dict__
            if inspect.isclass(obj):
                if obj.__module__ == mod.__name__:
                    return True
                return mod.__dict__.get(obj.__name__) is obj and f"\nclass {obj.__name__}" in source
            return bool(super()._from_module(mod, obj))

        def _get_test(self, obj: Any, name: str, mod: Any, globs: dict, source_lines: Any) -> Any:
            if id(obj) in public or id(getattr(obj, "__func__", obj)) in public:
                globs = {"torch": torch, "__name__": mod.__name__}
            return super()._get_test(obj, name, mod, globs, source_lines)  # type: ignore[misc]

    return Finder(exclude_empty=True)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``>>>`` example in tdshare's docstrings runs and prints what it says; a public name's
    example has ``torch`` imported, as a user's session has it, and imports every tdshare name it uses."""
    import doctest
    import importlib
    import tempfile

    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mod = importlib.import_module(f"tdshare.{module}" if module != "__init__" else "tdshare")
    finder = _finder(mod)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in finder.find(mod, mod.__name__, extraglobs={"torch": torch}):
        if test.examples and test.name.startswith(mod.__name__):
            runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
