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
    "MemmapError",
    "FileExistsRuntimeError",
    "NotMemmapError",
    "PickleRefusedError",
    "FormatError",
    "CorruptDataError",
    "UnsupportedFormatError",
    "InvalidArgumentError",
    "NotAFolderError",
    "AtomicTargetError",
    "NotSupportedError",
    "KeyTypeError",
    "MissingKeyError",
    "MissingMetadataError",
    "ArgumentTypeError",
    "FieldError",
    "ReservedFieldError",
    "FrozenFieldError",
    "DimensionError",
    "ResourceLimitError",
]


class TdshareError(Exception):
    """Base class of every error tdshare raises deliberately."""


class LockedError(TdshareError, RuntimeError):
    """A structural change (add, remove or replace an entry) on a locked TensorDict."""


class BatchSizeError(TdshareError, RuntimeError):
    """A value whose leading dimensions disagree with the TensorDict's batch size."""


class MemmapError(TdshareError, RuntimeError):
    """A memory-mapping request that cannot be honoured as asked (see the message for the fix)."""


class FileExistsRuntimeError(MemmapError):
    """A file exists where ``existsok=False`` forbids overwriting it."""


class NotMemmapError(MemmapError):
    """An operation that needs a memory-mapped TensorDict got one that is not."""


class PickleRefusedError(TdshareError, RuntimeError):
    """Loading would unpickle data while ``allow_pickle=False``."""


class FormatError(TdshareError, ValueError):
    """Saved data that tdshare cannot read: malformed, truncated or inconsistent."""


class CorruptDataError(FormatError):
    """A leaf file or metadata file whose content disagrees with the committed metadata."""


class UnsupportedFormatError(TdshareError, RuntimeError):
    """Saved data in a format version, dtype or class this version does not read."""


class InvalidArgumentError(TdshareError, ValueError):
    """An argument with a value outside what the function accepts."""


class NotAFolderError(TdshareError, NotADirectoryError, FileExistsError):
    """A prefix that exists and is not a folder, where a folder is written."""


class AtomicTargetError(NotAFolderError):
    """``atomic=True`` was asked to replace something that is not a directory."""


class NotSupportedError(TdshareError, NotImplementedError):
    """A combination of options or a tensor kind that tdshare does not support."""


class KeyTypeError(TdshareError, TypeError):
    """A key that is neither a string nor a non-empty tuple of strings."""


class ContainsKeyTypeError(KeyTypeError, RuntimeError):
    """``key in td`` with a key that is not a string or tuple of strings (a ``TypeError``, and the
    ``RuntimeError`` the reference raises there)."""


class MissingKeyError(TdshareError, KeyError):
    """A key that is not in the TensorDict."""

    def __str__(self) -> str:  # KeyError quotes its argument; a sentence reads better unquoted
        return str(self.args[0]) if self.args else ""


class MissingMetadataError(TdshareError, FileNotFoundError):
    """No saved tensordict (no ``meta.json``) where one was expected."""


class ArgumentTypeError(TdshareError, TypeError):
    """An argument of the wrong type."""


class FieldError(TdshareError, AttributeError):
    """A name that is not a field of the tensorclass (set as an attribute or passed to the constructor)."""


class ReservedFieldError(InvalidArgumentError, FieldError):
    """A tensorclass field named like a member of the class or a key of the saved format."""


class FrozenFieldError(FieldError, dataclasses.FrozenInstanceError):
    """An assignment to a field of a frozen tensorclass (``@tensorclass(frozen=True)``)."""


class DimensionError(TdshareError, IndexError):
    """A dimension outside the batch dimensions (the reference raises ``IndexError`` there)."""


class ResourceLimitError(TdshareError, OSError):
    """A kernel limit reached: ``vm.max_map_count`` (memory mappings) or ``RLIMIT_NOFILE`` (open files).

    The message names the limit, its current value, how many were needed, and the fix.
    """
