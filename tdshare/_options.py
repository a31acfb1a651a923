"""The options of one save: what ``memmap_``, ``memmap``, ``save``/``dumps`` take, as one value.

The public methods take the reference's keyword arguments; they build one :class:`SaveOptions`,
which checks every argument once, before anything is created, and hand it down.  The write path
(:mod:`tdshare._write`) and the archive writer (:mod:`tdshare._archive`) read the fields and never
re-validate them.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, replace
from typing import Any

from ._errors import ArgumentTypeError, InvalidArgumentError, NotSupportedError
from ._progress import ProgressCallback, check_progress

__all__ = ["ARCHIVE_UNSUPPORTED", "SaveOptions", "Unsupported", "check_path"]

#: Options a backend cannot honour: each to the error it raises and its message.
Unsupported = dict[str, tuple[type[Exception], str]]


def check_path(value: object, name: str = "prefix", none_ok: bool = False) -> str | None:
    """Check that ``value`` is a path (``str`` or ``os.PathLike``), or None where ``none_ok``; return it as a str.

    Raises:
        ArgumentTypeError: it is not (a ``TypeError``).
    """
    if not isinstance(value, (str, os.PathLike)) and not (none_ok and value is None):
        expected = "a path (str or os.PathLike)" + (" or None" if none_ok else "")
        raise ArgumentTypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}.")
    return None if value is None else str(os.fspath(value))


def _flag(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):  # numpy and plain 0/1 flags read as bools
        return bool(value)
    raise ArgumentTypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}.")


@dataclass(frozen=True, slots=True)
class SaveOptions:
    """The validated arguments of one ``memmap_``/``memmap``/``save`` call.

    Fields have the meaning and the defaults of the reference's arguments: ``copy_existing``
    copies leaves already mapped to other files, ``num_threads`` writes leaves on that many
    threads (0 or 1: in the calling thread), ``return_early`` returns a future at once,
    ``share_non_tensor`` makes non-tensor values shared, ``existsok`` allows overwriting existing
    leaf files, ``robust_key`` percent-encodes keys into file names (None means True), ``atomic``
    writes next to the folder and swaps it in, ``archive`` and ``compression`` select a ``.tdz``
    archive, ``progress`` is called as ``progress(done, total)`` with the leaf files written.

    >>> SaveOptions.of(num_threads=2).num_threads
    2
    >>> SaveOptions.of(num_threads=-1)
    Traceback (most recent call last):
    ...
    tdshare.InvalidArgumentError: num_threads must be a non-negative int, got -1.
    """

    copy_existing: bool = False
    num_threads: int = 0
    return_early: bool = False
    share_non_tensor: bool = False
    existsok: bool = True
    robust_key: bool = True
    atomic: bool = False
    archive: bool = False
    compression: str | int | None = None
    progress: ProgressCallback | None = None

    @classmethod
    def of(
        cls,
        prefix: object = None,
        *,
        copy_existing: object = False,
        num_threads: object = 0,
        return_early: object = False,
        share_non_tensor: object = False,
        existsok: object = True,
        robust_key: object = True,
        atomic: object = False,
        archive: object = None,
        compression: object = None,
        progress: object = None,
    ) -> SaveOptions:
        """Check the arguments of a save to ``prefix`` and return them as one value.

        Raises:
            ArgumentTypeError: a flag that is not a bool, ``num_threads`` that is not an int, a
                prefix that is not a path.
            InvalidArgumentError: a negative ``num_threads``, ``archive=True`` without a prefix,
                ``compression`` for a folder.
            NotSupportedError: ``return_early`` together with ``atomic``.
        """
        path = check_path(prefix, "prefix", none_ok=True)
        if isinstance(num_threads, bool) or not isinstance(num_threads, int):
            raise ArgumentTypeError(f"num_threads must be an int, got {type(num_threads).__name__} {num_threads!r}.")
        if num_threads < 0:
            raise InvalidArgumentError(f"num_threads must be a non-negative int, got {num_threads}.")
        robust = True if robust_key is None else _flag("robust_key", robust_key)
        if archive is None:
            is_archive = path is not None and pathlib.PurePath(path).suffix == ".tdz"
        else:
            is_archive = _flag("archive", archive)
        if is_archive and prefix is None:
            raise InvalidArgumentError("archive=True needs a prefix: the path of the archive file to write.")
        if not is_archive and compression is not None:
            raise InvalidArgumentError(
                f"compression={compression!r} applies to archives only: pass a prefix ending with '.tdz' or "
                "archive=True."
            )
        opts = cls(
            copy_existing=_flag("copy_existing", copy_existing),
            num_threads=num_threads,
            return_early=_flag("return_early", return_early),
            share_non_tensor=_flag("share_non_tensor", share_non_tensor),
            existsok=_flag("existsok", existsok),
            robust_key=robust,
            atomic=_flag("atomic", atomic),
            archive=is_archive,
            compression=compression,  # type: ignore[arg-type]  # parsed by the archive writer
            progress=check_progress(progress),
        )
        if opts.atomic and opts.return_early:
            raise NotSupportedError("return_early is not supported with atomic=True.")
        return opts

    def refuse(self, unsupported: Unsupported) -> None:
        """Raise for the first option set here that ``unsupported`` names (in its order).

        >>> SaveOptions.of("x.tdz", return_early=True).refuse(ARCHIVE_UNSUPPORTED)
        Traceback (most recent call last):
        ...
        tdshare.NotSupportedError: return_early=True is not supported for a .tdz archive, which is written in one go.
        """
        for option, (error, message) in unsupported.items():
            if getattr(self, option):
                raise error(message)

    def but(self, **changes: Any) -> SaveOptions:
        """A copy with ``changes`` (already valid values: the callers are tdshare's own)."""
        return replace(self, **changes)


#: What a ``.tdz`` archive cannot honour, whatever is saved into one.
ARCHIVE_UNSUPPORTED: Unsupported = {
    "return_early": (
        NotSupportedError,
        "return_early=True is not supported for a .tdz archive, which is written in one go.",
    ),
    "share_non_tensor": (
        NotSupportedError,
        "share_non_tensor=True is not supported for a .tdz archive, a read-only snapshot.",
    ),
}
