"""The architecture is pinned: every module sits in one layer and imports point down only.

Layers, bottom to top (the README's architecture section shows the same map):

- ``base``: keys, the on-disk format, errors, small pure helpers;
- ``storage``: files, segments, mapped tensors, leaf handles, the coordination files, the
  read halves of the stores;
- ``model``: the in-memory tensor collections and their node kinds;
- ``io``: planning and writing saves (the write halves), loading, entries, refresh;
- ``api``: the public classes and the command line.

A module may import modules of its own layer or of a lower one, never of a higher one, and
never another module's private (underscore) names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tdshare

PACKAGE = Path(tdshare.__file__).resolve().parent

LAYERS: dict[str, list[str]] = {
    "base": [
        "_errors",
        "_keys",
        "_format",
        "_indexing",
        "_bulk",
        "_crc",
        "_progress",
        "_options",
        "_settings",
        "_shape_args",
    ],
    "storage": [
        "_mapping_limits",
        "_files",
        "_fd_pass",
        "_segments",
        "_futex",
        "_flock",
        "_memmap_factories",
        "_memmap_args",
        "_memmap_views",
        "_memmap",
        "_leaf_files",
        "_leaf_handle",
        "_lazy_leaves",
        "_journal",
        "_control_files",
        "_coordination",
        "_runtime",
        "_atomic",
        "_debris",
        "_tdz",
        "_tdz_write",
        "_store",
        "_archive_store",
        "_nontensor_files",
    ],
    "model": [
        "_nontensor",
        "_nontensor_io",
        "_nontensor_ops",
        "_new_ops",
        "_shared_nontensor",
        "_unbatched",
        "_metadata",
        "_reductions",
        "_handoff",
        "_combine",
        "_surface_ops",
        "_dict_ops",
        "_names_ops",
        "_locking",
        "_tensordict_base",
        "_private_compat",
        "_generic_ops",
        "_sub_views",
        "_pytree_convert",
        "_ragged",
        "_entry_queries",
        "_rename_keys",
        "_setters",
        "_nodes",
        "_future",
        "_compact_repr",
        "_key_ops",
        "_write_back",
        "_tensor_props",
        "_updates",
        "_conversions",
        "_from_any",
        "_apply",
        "_nn",
        "_pad",
        "_tree_walk",
        "_arithmetic",
        "_pointwise",
        "_reduce_ops",
        "_consolidated_read",
        "_consolidate",
        "_dataloader",
        "_legacy_views",
        "_shape_moves",
        "_shape_masks",
        "_shape_ops",
        "_shape_torch",
        "_shape_stack",
    ],
    "io": [
        "_level_schema",
        "_plan",
        "_write_results",
        "_write_install",
        "_write",
        "_write_anon",
        "_archive",
        "_stack_load",
        "_stack_write",
        "_read",
        "_adder",
        "_compaction",
        "_entries",
        "_refresh",
        "_save",
    ],
    "api": [
        "_map",
        "_open_memmap",
        "_live_entries",
        "_memmap_family",
        "_tensordict",
        "_typed",
        "_params",
        "_lazy_ops",
        "_lazy_index",
        "_lazy_memmap",
        "_lazy",
        "_tensorclass_io",
        "_tensorclass_stack",
        "_tensorclass_build",
        "_tensorclass_options",
        "_tensorclass_state",
        "_tensorclass_ops",
        "_tensorclass",
        "_td",
        "_functional",
        "_pytree",
        "_td_utils",
        "_schema",
        "_wire_span",
        "_transport",
        "_wire_plan",
        "_wire_streams",
        "_sync",
        "distributed",
        "__init__",
        "__main__",
    ],
}
RANK = {module: rank for rank, modules in enumerate(LAYERS.values()) for module in modules}
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py"))


def _imports(module: str, package: Path = PACKAGE) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) for every import of a tdshare module in ``module``."""
    tree = ast.parse((package / f"{module}.py").read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                out.append((node.lineno, node.module, [a.name for a in node.names]))
            elif node.level == 1:  # from . import _x
                out.extend((node.lineno, a.name, []) for a in node.names)
            elif node.level == 0 and node.module and node.module.startswith("tdshare."):
                out.append((node.lineno, node.module.split(".")[1], [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name.split(".")[1], []) for a in node.names if a.name.startswith("tdshare."))
    return out


def test_every_module_has_a_layer() -> None:
    assert sorted(RANK) == MODULES, "place each new module in LAYERS (and in the README's architecture map)"


def test_the_readme_maps_every_module_in_its_layer() -> None:
    readme = (PACKAGE.parent / "README.md").read_text()
    rows = {"base": "| base |", "storage": "| storage |", "model": "| model |", "io": "| I/O |", "api": "| API |"}
    for layer, start in rows.items():
        row = next(line for line in readme.splitlines() if line.startswith(start))
        missing = [m for m in LAYERS[layer] if m not in ("__init__", "__main__") and f"`{m}`" not in row]
        assert not missing, f"the README's architecture map lacks {missing} in its {layer!r} row"


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_down(module: str) -> None:
    for line, target, _ in _imports(module):
        assert target in RANK, f"{module}.py:{line} imports {target}, which is not a tdshare module with a layer"
        assert RANK[target] <= RANK[module], (
            f"{module}.py:{line} imports {target}: {module} is in layer {list(LAYERS)[RANK[module]]!r}, "
            f"{target} in the higher layer {list(LAYERS)[RANK[target]]!r}"
        )


@pytest.mark.parametrize("module", MODULES)
def test_no_private_names_imported(module: str) -> None:
    for line, target, names in _imports(module):
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{module}.py:{line} imports the private names {private} of {target}: make them public"


def test_the_walker_sees_every_spelling(tmp_path: Path) -> None:
    """Relative, lazy (inside a function) and absolute imports are all found, with their names."""
    (tmp_path / "_probe.py").write_text(
        "from ._format import META_FILE\n"
        "from . import _write\n"
        "import tdshare._read\n"
        "def f():\n"
        "    from tdshare._plan import _private, plan_tree\n"
    )
    found = sorted((target, tuple(names)) for _, target, names in _imports("_probe", tmp_path))
    assert found == [("_format", ("META_FILE",)), ("_plan", ("_private", "plan_tree")), ("_read", ()), ("_write", ())]
