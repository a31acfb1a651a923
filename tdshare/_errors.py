"""One exception hierarchy for tdshare.

Every error tdshare raises on purpose derives from :class:`TdshareError` *and* from the builtin
that the reference documents for that situation, so ``except RuntimeError`` (or ``ValueError``,
``NotADirectoryError``, ...) written against tensordict keeps working.  Each class takes a single
message argument, so instances pickle and cross process boundaries unchanged.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "TdshareError",
    "ContainsKeyTypeError",
    "LockedError",
    "BatchSizeError",
    "DeviceError",
    "MemmapError",
    "FileExistsRuntimeError",
    "NotMemmapError",
    "PickleRefusedError",
    "FormatError",
    "CorruptDataError",
    "UnsupportedFormatError",
    "InvalidArgumentError",
    "LegacyKeyError",
    "NotAFolderError",
    "AtomicTargetError",
    "NotSupportedError",
    "KeyTypeError",
    "MissingKeyError",
    "StateDictKeysError",
    "MissingMetadataError",
    "ArgumentTypeError",
    "FieldError",
    "ReservedFieldError",
    "FrozenFieldError",
    "DimensionError",
    "ResourceLimitError",
]


class TdshareError(Exception):
    """Base class of every error tdshare raises deliberately.

    Catch it to handle any of them; each subclass is also the builtin the reference raises.

    >>> from tdshare import TensorDict, TdshareError
    >>> try:
    ...     TensorDict(a=torch.zeros(2), batch_size=[2])["b"]
    ... except TdshareError as err:
    ...     print(type(err).__name__, isinstance(err, KeyError))
    MissingKeyError True
    """


class LockedError(TdshareError, RuntimeError):
    """A structural change (add, remove or replace an entry) on a locked TensorDict.

    >>> from tdshare import TensorDict
    >>> td = TensorDict(a=torch.zeros(2), batch_size=[2]).lock_()
    >>> try:
    ...     td["b"] = torch.ones(2)
    ... except RuntimeError as err:  # LockedError is a RuntimeError
    ...     print(type(err).__name__)
    LockedError
    """


class BatchSizeError(TdshareError, RuntimeError):
    """A value whose leading dimensions disagree with the TensorDict's batch size.

    >>> from tdshare import TensorDict
    >>> td = TensorDict(a=torch.zeros(3), batch_size=[3])
    >>> try:
    ...     td["b"] = torch.zeros(4)
    ... except RuntimeError as err:  # BatchSizeError is a RuntimeError
    ...     print(type(err).__name__)
    BatchSizeError
    """


class DeviceError(TdshareError, RuntimeError):
    """A device change asked of a tensordict in place (``td.device = ...``): use ``td.to(device)``.

    >>> from tdshare import TensorDict
    >>> try:
    ...     TensorDict(a=torch.zeros(2)).device = "cpu"
    ... except RuntimeError as err:  # DeviceError is a RuntimeError
    ...     print(type(err).__name__)
    DeviceError
    """


class MemmapError(TdshareError, RuntimeError):
    """A memory-mapping request that cannot be honoured as asked (see the message for the fix).

    >>> import os, tempfile
    >>> from tdshare import TensorDict
    >>> with tempfile.TemporaryDirectory() as path:
    ...     td = TensorDict(a=torch.zeros(2), batch_size=[2]).memmap_(os.path.join(path, "one"))
    ...     try:
    ...         td.memmap(os.path.join(path, "two"))  # a.memmap is elsewhere: copy_existing=True copies it
    ...     except RuntimeError as err:  # MemmapError is a RuntimeError
    ...         print(type(err).__name__)
    MemmapError
    """


class FileExistsRuntimeError(MemmapError):
    """A file exists where ``existsok=False`` forbids overwriting it.

    >>> import tempfile
    >>> from tdshare import TensorDict
    >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
    >>> with tempfile.TemporaryDirectory() as path:
    ...     try:
    ...         td.memmap(path).memmap(path, atomic=True, existsok=False)
    ...     except RuntimeError as err:  # a MemmapError, so a RuntimeError
    ...         print(type(err).__name__)
    FileExistsRuntimeError
    """


class NotMemmapError(MemmapError):
    """An operation that needs a memory-mapped TensorDict got one that is not.

    >>> from tdshare import TensorDict
    >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])  # not memory-mapped
    >>> try:
    ...     td.make_memmap("b", [2])
    ... except RuntimeError as err:  # NotMemmapError is a MemmapError, so a RuntimeError
    ...     print(type(err).__name__)
    NotMemmapError
    """


class PickleRefusedError(TdshareError, RuntimeError):
    """Loading would unpickle data while ``allow_pickle=False``.

    >>> import tempfile
    >>> from tdshare import TensorDict
    >>> td = TensorDict(a=torch.zeros(2), batch_size=[2]).set_non_tensor("tags", {"x", "y"})
    >>> with tempfile.TemporaryDirectory() as path:
    ...     try:
    ...         TensorDict.load_memmap(td.save(path).saved_path, allow_pickle=False)
    ...     except RuntimeError as err:  # PickleRefusedError is a RuntimeError
    ...         print(type(err).__name__)
    PickleRefusedError
    """


class FormatError(TdshareError, ValueError):
    """Saved data that tdshare cannot read: malformed, truncated or inconsistent.

    >>> import os, tempfile
    >>> from tdshare import TensorDict
    >>> with tempfile.TemporaryDirectory() as path:
    ...     with open(os.path.join(path, "meta.json"), "w") as f:
    ...         _ = f.write("{")  # not JSON
    ...     try:
    ...         TensorDict.load_memmap(path)
    ...     except ValueError as err:  # FormatError is a ValueError
    ...         print(type(err).__name__)
    CorruptDataError
    """


class CorruptDataError(FormatError):
    """A leaf file or metadata file whose content disagrees with the committed metadata.

    >>> import os, tempfile
    >>> from tdshare import TensorDict
    >>> with tempfile.TemporaryDirectory() as path:
    ...     _ = TensorDict(a=torch.zeros(2), batch_size=[2]).save(path)
    ...     os.truncate(os.path.join(path, "a.memmap"), 1)  # 8 bytes expected
    ...     try:
    ...         TensorDict.load_memmap(path)["a"]
    ...     except ValueError as err:  # a FormatError, so a ValueError
    ...         print(type(err).__name__)
    CorruptDataError
    """


class UnsupportedFormatError(TdshareError, RuntimeError):
    """Saved data in a format version, dtype or class this version does not read.

    >>> import json, os, tempfile
    >>> from tdshare import TensorDict
    >>> with tempfile.TemporaryDirectory() as path:
    ...     _ = TensorDict(a=torch.zeros(2), batch_size=[2]).save(path)
    ...     meta = os.path.join(path, "meta.json")
    ...     json.dump({**json.load(open(meta)), "_format_version": 99}, open(meta, "w"))
    ...     try:
    ...         TensorDict.load_memmap(path)
    ...     except RuntimeError as err:  # UnsupportedFormatError is a RuntimeError
    ...         print(type(err).__name__)
    UnsupportedFormatError
    """


class InvalidArgumentError(TdshareError, ValueError):
    """An argument with a value outside what the function accepts.

    >>> from tdshare import TensorDict
    >>> try:
    ...     TensorDict(a=torch.zeros(2), batch_size=[2]).memmap(num_threads=-1)
    ... except ValueError as err:  # InvalidArgumentError is a ValueError
    ...     print(type(err).__name__)
    InvalidArgumentError
    """


class LegacyKeyError(InvalidArgumentError, MemmapError):
    """A key that cannot be one file or folder name with ``robust_key=False`` (a ``/``, ``\\`` or
    NUL in it, a drive prefix ``C:``; for a nested tensordict also ``""``, ``"."`` and ``".."``),
    refused before anything is written.  Also a ``RuntimeError``: the reference writes such a
    key as a path and fails with one (or, for ``"../x"``, writes outside the prefix).

    >>> import tempfile
    >>> from tdshare import TensorDict
    >>> with tempfile.TemporaryDirectory() as path:
    ...     try:
    ...         TensorDict({"a/b": torch.zeros(2)}).memmap(path, robust_key=False)
    ...     except RuntimeError as err:  # also a ValueError
    ...         print(type(err).__name__)
    LegacyKeyError
    """


class NotAFolderError(TdshareError, NotADirectoryError, FileExistsError):
    """A prefix that exists and is not a folder, where a folder is written.

    >>> import tempfile
    >>> from tdshare import TensorDict
    >>> with tempfile.NamedTemporaryFile() as file:
    ...     try:
    ...         TensorDict(a=torch.zeros(2), batch_size=[2]).memmap(file.name)
    ...     except NotADirectoryError as err:  # also a FileExistsError
    ...         print(type(err).__name__, isinstance(err, FileExistsError))
    NotAFolderError True
    """


class AtomicTargetError(NotAFolderError):
    """``atomic=True`` was asked to replace something that is not a directory.

    ``memmap``/``save`` check the prefix first, so a file there raises its base class
    :class:`NotAFolderError`; both are ``NotADirectoryError``.

    >>> from tdshare import AtomicTargetError, NotAFolderError
    >>> issubclass(AtomicTargetError, NotAFolderError), issubclass(AtomicTargetError, NotADirectoryError)
    (True, True)
    """


class NotSupportedError(TdshareError, NotImplementedError):
    """A combination of options or a tensor kind that tdshare does not support.

    >>> import tempfile
    >>> from tdshare import TensorDict
    >>> td = TensorDict(a=torch.zeros(2), batch_size=[2])
    >>> with tempfile.TemporaryDirectory() as path:
    ...     try:
    ...         td.memmap(path, num_threads=2, return_early=True, atomic=True)
    ...     except NotImplementedError as err:  # NotSupportedError is a NotImplementedError
    ...         print(type(err).__name__)
    NotSupportedError
    """


class KeyTypeError(TdshareError, TypeError, KeyError):
    """A key that is neither a string nor a non-empty tuple of strings: a ``TypeError``, and the
    ``KeyError`` the reference raises there (``get``, ``set``, ``pop`` of ``3`` or ``()``).

    >>> from tdshare import TensorDict
    >>> try:
    ...     TensorDict(a=torch.zeros(2), batch_size=[2]).get(3)
    ... except KeyError as err:  # KeyTypeError is a KeyError and a TypeError
    ...     print(type(err).__name__, isinstance(err, TypeError))
    KeyTypeError True
    """

    __str__ = Exception.__str__  # the message as written (a KeyError would quote it)


class ContainsKeyTypeError(KeyTypeError, RuntimeError):
    """``key in td`` with a key that is not a string or tuple of strings (a ``TypeError``, and the
    ``RuntimeError`` the reference raises there).

    >>> from tdshare import TensorDict
    >>> try:
    ...     1 in TensorDict(a=torch.zeros(2), batch_size=[2])
    ... except RuntimeError as err:  # and a TypeError
    ...     print(type(err).__name__, isinstance(err, TypeError))
    ContainsKeyTypeError True
    """


class MissingKeyError(TdshareError, KeyError):
    """A key that is not in the TensorDict.

    >>> from tdshare import TensorDict
    >>> try:
    ...     TensorDict(a=torch.zeros(2), batch_size=[2])["b"]
    ... except KeyError as err:  # MissingKeyError is a KeyError
    ...     print(type(err).__name__)
    MissingKeyError
    """

    def __str__(self) -> str:  # KeyError quotes its argument; a sentence reads better unquoted
        return str(self.args[0]) if self.args else ""


class StateDictKeysError(MissingKeyError, RuntimeError):
    """``load_state_dict(strict=True)`` with a state dict whose keys are not the tensordict's.  Also a
    ``RuntimeError``, as ``torch.nn.Module.load_state_dict`` and the reference raise there.

    >>> from tdshare import TensorDict
    >>> td = TensorDict(a=torch.zeros(2), b=torch.zeros(2), batch_size=[2])
    >>> try:
    ...     td.load_state_dict({"a": torch.ones(2)}, strict=True)
    ... except RuntimeError as err:  # also a KeyError
    ...     print(type(err).__name__, "missing keys ['b']" in str(err))
    StateDictKeysError True
    """


class MissingMetadataError(TdshareError, FileNotFoundError):
    """No saved tensordict (no ``meta.json``) where one was expected.

    >>> import tempfile
    >>> from tdshare import TensorDict
    >>> with tempfile.TemporaryDirectory() as path:  # an empty folder
    ...     try:
    ...         TensorDict.load_memmap(path)
    ...     except FileNotFoundError as err:  # MissingMetadataError is a FileNotFoundError
    ...         print(type(err).__name__)
    MissingMetadataError
    """


class ArgumentTypeError(TdshareError, TypeError):
    """An argument of the wrong type.

    >>> from tdshare import TensorDict
    >>> try:
    ...     TensorDict(a=torch.zeros(2), batch_size=[2]).memmap(num_threads="2")
    ... except TypeError as err:  # ArgumentTypeError is a TypeError
    ...     print(type(err).__name__)
    ArgumentTypeError
    """


class FieldError(TdshareError, AttributeError):
    """A name that is not a field of the tensorclass (set as an attribute or passed to the constructor).

    >>> from tdshare import tensorclass
    >>> @tensorclass
    ... class Point:
    ...     x: torch.Tensor
    >>> try:
    ...     Point(x=torch.zeros(2), y=torch.ones(2), batch_size=[2])
    ... except AttributeError as err:  # FieldError is an AttributeError
    ...     print(type(err).__name__)
    FieldError
    """


class ReservedFieldError(InvalidArgumentError, FieldError):
    """A tensorclass field named like a member of the class or a key of the saved format.

    >>> from tdshare import tensorclass
    >>> try:
    ...     @tensorclass
    ...     class Bad:
    ...         batch_size: torch.Tensor
    ... except ValueError as err:  # an InvalidArgumentError, and a FieldError (AttributeError)
    ...     print(type(err).__name__, isinstance(err, AttributeError))
    ReservedFieldError True
    """


class FrozenFieldError(FieldError, dataclasses.FrozenInstanceError):
    """An assignment to a field of a frozen tensorclass (``@tensorclass(frozen=True)``).

    >>> import dataclasses
    >>> from tdshare import tensorclass
    >>> @tensorclass(frozen=True)
    ... class Point:
    ...     x: torch.Tensor
    >>> try:
    ...     Point(x=torch.zeros(2), batch_size=[2]).x = torch.ones(2)
    ... except dataclasses.FrozenInstanceError as err:  # and a FieldError (AttributeError)
    ...     print(type(err).__name__)
    FrozenFieldError
    """


class DimensionError(TdshareError, IndexError):
    """A dimension outside the batch dimensions (the reference raises ``IndexError`` there).

    >>> from tdshare import TensorDict
    >>> try:
    ...     TensorDict(a=torch.zeros(3), batch_size=[3]).squeeze(5)
    ... except IndexError as err:  # DimensionError is an IndexError
    ...     print(type(err).__name__)
    DimensionError
    """


class ResourceLimitError(TdshareError, OSError):
    """A kernel limit reached: ``vm.max_map_count`` (memory mappings) or ``RLIMIT_NOFILE`` (open files).

    The message names the limit, its current value, how many were needed, and the fix.  It
    arises when a process maps more leaves than the kernel allows, so this example builds one:

    >>> from tdshare import ResourceLimitError
    >>> err = ResourceLimitError("vm.max_map_count=65530 is reached: raise it with sysctl")
    >>> isinstance(err, OSError), str(err)
    (True, 'vm.max_map_count=65530 is reached: raise it with sysctl')
    """
