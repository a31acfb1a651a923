"""The public API is pinned: a name added or removed here is a deliberate change."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import tdshare

PACKAGE = Path(tdshare.__file__).resolve().parent

PUBLIC = [
    "ArgumentTypeError",
    "AtomicTargetError",
    "BatchSizeError",
    "ContainsKeyTypeError",
    "CorruptDataError",
    "DeviceError",
    "DimensionError",
    "FieldError",
    "FileExistsRuntimeError",
    "FormatError",
    "FrozenFieldError",
    "InvalidArgumentError",
    "KeyTypeError",
    "LazyStackedTensorDict",
    "LegacyKeyError",
    "LinkedList",
    "LockedError",
    "MemmapError",
    "MemoryMappedTensor",
    "MetaData",
    "MissingKeyError",
    "MissingMetadataError",
    "NonTensorData",
    "NonTensorStack",
    "NotAFolderError",
    "NotMemmapError",
    "NotSupportedError",
    "PickleRefusedError",
    "ReservedFieldError",
    "ResourceLimitError",
    "SharedRegistry",
    "StateDictKeysError",
    "TdshareError",
    "TensorClass",
    "TensorDict",
    "TensorDictBase",
    "TensorDictFuture",
    "TensorDictParams",
    "TerminalProgress",
    "TypedTensorDict",
    "UnbatchedTensor",
    "UnsupportedFormatError",
    "__version__",
    "assert_allclose_td",
    "assert_close",
    "capture_non_tensor_stack",
    "cat",
    "compact_metadata",
    "consolidated_parts",
    "convert_ellipsis_to_idx",
    "dense_stack_tds",
    "from_consolidated",
    "from_consolidated_parts",
    "is_memmap_archive",
    "is_non_tensor",
    "is_tensor_collection",
    "is_tensorclass",
    "lazy_legacy",
    "lazy_stack",
    "list_to_stack",
    "load",
    "load_memmap",
    "make_tensordict",
    "max_mapped_leaves",
    "maybe_dense_stack",
    "memmap",
    "merge_tensordicts",
    "open_memmap",
    "pack_memmap",
    "pad",
    "pad_sequence",
    "refresh_archive_checksums",
    "save",
    "set_capture_non_tensor_stack",
    "set_lazy_legacy",
    "set_list_to_stack",
    "set_max_mapped_leaves",
    "stack",
    "tensorclass",
    "unpack_memmap",
]


def test_all_is_pinned() -> None:
    assert PUBLIC == sorted(PUBLIC)
    assert sorted(tdshare.__all__) == PUBLIC
    assert len(set(tdshare.__all__)) == len(tdshare.__all__)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_name_is_importable(name: str) -> None:
    obj = getattr(tdshare, name)
    assert obj is not None
    namespace: dict[str, object] = {}
    exec(f"from tdshare import {name}", namespace)
    assert namespace[name] is obj
    if not name.startswith("_"):
        assert getattr(obj, "__module__", "tdshare").startswith("tdshare"), f"{name} comes from outside tdshare"


DISTRIBUTED = [
    "DistributedError",
    "PeerError",
    "Schema",
    "SchemaMismatchError",
    "Transfer",
    "all_gather",
    "broadcast",
    "irecv",
    "isend",
    "leaves_of",
    "recv",
    "scatter",
    "schema_of",
    "send",
    "sync",
]


def test_distributed_submodule_is_pinned() -> None:
    import tdshare.distributed as tdd

    assert sorted(tdd.__all__) == DISTRIBUTED
    for name in DISTRIBUTED:
        obj = getattr(tdd, name)
        assert obj.__module__.startswith("tdshare"), name
        assert (obj.__doc__ or "").strip(), f"tdshare.distributed.{name} needs a docstring"


def test_star_import_gives_all() -> None:
    namespace: dict[str, object] = {}
    exec("from tdshare import *", namespace)
    assert set(PUBLIC) <= set(namespace)


def test_version() -> None:
    assert isinstance(tdshare.__version__, str) and tdshare.__version__.count(".") >= 2


def test_top_level_functions_are_callable() -> None:
    for name in ("load", "load_memmap", "memmap", "save", "pack_memmap", "unpack_memmap", "refresh_archive_checksums"):
        assert callable(getattr(tdshare, name)), name


def _imported_modules(path: Path) -> set[str]:
    """Every module named by an import statement anywhere in ``path`` (including inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.add(node.args[0].value)
    return out


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_sources_found() -> None:
    assert PACKAGE / "__init__.py" in SOURCES and len(SOURCES) >= 10


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(PACKAGE)) for p in SOURCES])
def test_never_imports_tensordict(path: Path) -> None:
    mods = _imported_modules(path)
    bad = sorted(m for m in mods if m == "tensordict" or m.startswith("tensordict."))
    assert not bad, f"{path.name} imports {bad}"
    # and no indirect spelling either
    text = path.read_text()
    for needle in ("import tensordict", "from tensordict", 'import_module("tensordict', "import_module('tensordict"):
        assert needle not in text, f"{path.name} contains {needle!r}"


def test_importing_tdshare_does_not_load_tensordict() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import tdshare\n"
        "for m in pkgutil.iter_modules(tdshare.__path__):\n"
        "    if m.name != '__main__':\n"
        "        importlib.import_module('tdshare.' + m.name)\n"
        "assert not any(n == 'tensordict' or n.startswith('tensordict.') for n in sys.modules), "
        "sorted(n for n in sys.modules if n.startswith('tensordict'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_modules_import_cleanly() -> None:
    for path in SOURCES:
        if path.name == "__main__.py":
            continue
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        importlib.import_module(".".join(rel.parts).removesuffix(".__init__"))


def test_no_import_cycles_inside_the_package() -> None:
    """Imports point one way: no module of tdshare imports (even lazily) one that imports it back."""

    base = Path(tdshare.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in base.glob("*.py"):
        tree = ast.parse(path.read_text())
        graph[path.stem] = {
            node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
        }
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for dep in graph.get(module, ()):
            assert state.get(dep) != 1, f"import cycle: {' -> '.join([*trail, module, dep])}"
            if dep not in state:
                visit(dep, [*trail, module])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [])
    assert len(graph) > 10


def test_init_only_reexports() -> None:

    tree = ast.parse((Path(tdshare.__file__).parent / "__init__.py").read_text())
    defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defined == []


# The module paths that pickles made by tdshare 0.1.0 name (found with pickletools in that layout).
RELEASED_PICKLE_PATHS = [
    ("tdshare._td", "TensorDict"),
    ("tdshare._tensordict", "_rebuild"),
    ("tdshare._nontensor", "NonTensorData"),
    ("tdshare._errors", "MemmapError"),
    ("tdshare._memmap", "_rebuild_file_view"),
    ("tdshare._memmap", "_rebuild_segment_view"),
    ("tdshare._memmap", "_rebuild_archive_view"),
    ("tdshare._memmap", "_rebuild_empty"),
    ("tdshare._segments", "_rebuild_segment"),
    ("tdshare._shared_nontensor", "_rebuild"),
]


@pytest.mark.parametrize(("module", "name"), RELEASED_PICKLE_PATHS)
def test_released_pickle_paths_resolve(module: str, name: str) -> None:
    import io
    import pickle

    assert callable(pickle.Unpickler(io.BytesIO(b"")).find_class(module, name))


def test_a_pickle_of_the_released_layout_loads() -> None:
    """A protocol-0 pickle (plain-text names) rewritten to the 0.1.0 paths loads to an equal tree."""
    import pickle

    import torch

    td = tdshare.TensorDict({"a": torch.arange(3), "n": {"b": torch.ones(3, 2)}, "s": "x"}, batch_size=[3])
    data = pickle.dumps(td, protocol=0)
    for new, old in [
        (b"ctdshare._tensordict_base\nrebuild_tensordict\n", b"ctdshare._tensordict\n_rebuild\n"),
        (b"ctdshare\nTensorDict\n", b"ctdshare._td\nTensorDict\n"),
        (b"ctdshare\nNonTensorData\n", b"ctdshare._nontensor\nNonTensorData\n"),
    ]:
        assert new in data
        data = data.replace(new, old)
    back = pickle.loads(data)
    assert type(back) is tdshare.TensorDict
    assert back["a"].tolist() == [0, 1, 2] and back["n", "b"].shape == (3, 2) and back["s"] == "x"


def test_public_names_say_tdshare() -> None:
    assert tdshare.TensorDict.__module__ == "tdshare"
    assert repr(tdshare.MemmapError) == "<class 'tdshare.MemmapError'>"
    assert tdshare.load.__module__ == "tdshare"


def _public_callables() -> list[tuple[str, object]]:
    """Every public name, and every public method and property tdshare defines on a public class."""
    import inspect

    out: list[tuple[str, object]] = []
    for name in PUBLIC:
        obj = getattr(tdshare, name)
        if name.startswith("__"):
            continue
        out.append((name, obj))
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for attr in dir(obj):
            if attr.startswith("_"):
                continue
            static = inspect.getattr_static(obj, attr)
            target = static.fget if isinstance(static, property) else getattr(static, "__func__", static)
            if callable(target) and (getattr(target, "__module__", "") or "").startswith("tdshare"):
                out.append((f"{name}.{attr}", target))
    return out


def test_every_public_callable_has_a_docstring() -> None:
    import inspect

    missing = [name for name, obj in _public_callables() if not (inspect.getdoc(obj) or "").strip()]
    assert missing == [], f"public names without a docstring: {missing}"


def test_every_public_callable_has_an_example() -> None:
    import inspect

    missing = sorted({name for name, obj in _public_callables() if ">>>" not in (inspect.getdoc(obj) or "")})
    assert missing == [], f"public names whose docstring has no >>> example: {missing}"
