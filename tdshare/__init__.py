"""tdshare: share one nested dictionary of tensors between processes through memory-mapped files
and shared memory, in the on-disk format of tensordict 0.15.3."""

from . import _pytree  # noqa: F401  (registers the tensordict classes as pytree nodes)
from ._archive import is_memmap_archive, pack_memmap, refresh_archive_checksums, unpack_memmap
from ._compaction import compact_metadata
from ._consolidate import consolidated_parts
from ._coordination import SharedRegistry
from ._errors import (
    ArgumentTypeError,
    AtomicTargetError,
    BatchSizeError,
    ContainsKeyTypeError,
    CorruptDataError,
    DeviceError,
    DimensionError,
    FieldError,
    FileExistsRuntimeError,
    FormatError,
    FrozenFieldError,
    InvalidArgumentError,
    KeyTypeError,
    LegacyKeyError,
    LockedError,
    MemmapError,
    MissingKeyError,
    MissingMetadataError,
    NotAFolderError,
    NotMemmapError,
    NotSupportedError,
    PickleRefusedError,
    ReservedFieldError,
    ResourceLimitError,
    StateDictKeysError,
    TdshareError,
    UnsupportedFormatError,
)
from ._functional import (
    cat,
    dense_stack_tds,
    is_tensor_collection,
    lazy_stack,
    make_tensordict,
    maybe_dense_stack,
    merge_tensordicts,
    pad,
    pad_sequence,
    stack,
)
from ._future import TensorDictFuture
from ._lazy import LazyStackedTensorDict
from ._mapping_limits import max_mapped_leaves, set_max_mapped_leaves
from ._memmap import MemoryMappedTensor
from ._metadata import MetaData
from ._nontensor import NonTensorData, NonTensorStack
from ._nontensor_ops import LinkedList
from ._params import TensorDictParams
from ._progress import TerminalProgress
from ._settings import (
    capture_non_tensor_stack,
    lazy_legacy,
    list_to_stack,
    set_capture_non_tensor_stack,
    set_lazy_legacy,
    set_list_to_stack,
)
from ._td_utils import assert_allclose_td, assert_close, convert_ellipsis_to_idx, is_non_tensor
from ._tensorclass import TensorClass, is_tensorclass, tensorclass
from ._tensordict import (
    TensorDict,
    TensorDictBase,
    from_consolidated,
    from_consolidated_parts,
    load,
    load_memmap,
    memmap,
    open_memmap,
    save,
)
from ._typed import TypedTensorDict
from ._unbatched import UnbatchedTensor

__version__ = "0.1.0"

__all__ = [
    "ArgumentTypeError",
    "AtomicTargetError",
    "BatchSizeError",
    "DeviceError",
    "CorruptDataError",
    "DimensionError",
    "FieldError",
    "FileExistsRuntimeError",
    "FormatError",
    "FrozenFieldError",
    "InvalidArgumentError",
    "KeyTypeError",
    "ContainsKeyTypeError",
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

# Public names say they are tdshare's, wherever they are defined: tracebacks show
# ``tdshare.MemmapError``, ``repr(TensorDict)`` and new pickles name ``tdshare.TensorDict``.
for _name in __all__:
    if getattr(globals()[_name], "__module__", "").startswith("tdshare."):
        globals()[_name].__module__ = "tdshare"
del _name

# The reference's stacking function under its private name, for code written against
# ``tensordict._torch_func._stack`` (it follows set_lazy_legacy like torch.stack).
_stack = stack
