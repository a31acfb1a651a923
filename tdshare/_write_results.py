"""What a folder write gives back and cleans up, for trees of any size (issue 22).

- :func:`replaced_files`: the leaf files a write replaces (this process's unread leaves of those
  files are mapped first, to keep their bytes);
- :func:`leaf_file` / :func:`set_leaf_file`: the file of a written leaf, mapped or pending;
- :func:`remove_written`: after a failed first write, remove what it wrote, so that no folder is
  left with leaf files but no ``meta.json``.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from ._format import META_FILE
from ._lazy_leaves import is_pending
from ._plan import PlannedLevel

__all__ = ["leaf_file", "remove_written", "replaced_files", "set_leaf_file"]


def replaced_files(root: PlannedLevel) -> set[str]:
    """The final paths of the leaf files the write replaces or creates."""
    out = {path for lvl in root.walk() for _, path, _ in lvl.plain}
    out.update(leaf.path for lvl in root.walk() for leaf in lvl.leaves if leaf.reuse is None and leaf.path)
    return out


def remove_written(root: PlannedLevel, made: list[str]) -> None:
    """After a failed first write into a folder: remove the files it wrote in folders that were
    empty and the folders it made, so that no folder is left with leaf files but no ``meta.json``."""
    for level in root.walk():  # children first
        if not level.empty or level.path is None:
            continue
        paths = [p for _, p, _ in level.plain]
        paths += [leaf.path for leaf in level.leaves if leaf.reuse is None and leaf.path is not None]
        paths.append(level.path + os.sep + META_FILE)
        for p in paths:
            try:
                os.unlink(p)
            except OSError:
                pass
        for folder in [nt.path for nt in level.nontensors] + [w.path for w in level.wrapped]:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    for folder in reversed(made):  # children first
        try:
            os.rmdir(folder)
        except OSError:
            pass


def leaf_file(out: Any) -> str | None:
    """The file of a written leaf: a mapped tensor's ``_filename``, a pending leaf's ``path``."""
    return out.path if is_pending(out) else out._filename


def set_leaf_file(out: Any, name: str | None) -> None:
    """Rename the file of a written leaf (after its staged file moved to ``name``; None: unchanged)."""
    if name is None:
        return
    if is_pending(out):
        out.path = name
        out.where = name[: name.rfind(os.sep) + 1] + META_FILE
    else:
        out._filename = name
