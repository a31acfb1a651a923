"""Progress of long work: a callback type, a counting wrapper, and a one-line terminal display.

A *progress callback* is any ``callable(done, total)``: ``memmap_``/``memmap``/``save`` call it
with the number of leaf files written so far (``progress=``), ``pack_memmap``/``unpack_memmap``
with the number of archive entries.  :class:`TerminalProgress` is the callback the command line
uses: it redraws ``label: done/total`` on one line of a terminal and stays silent when its
stream is not a terminal (a pipe, a file, CI).

>>> from tdshare._progress import counted
>>> seen = []
>>> list(counted(["a", "b"], 2, lambda done, total: seen.append((done, total))))
['a', 'b']
>>> seen
[(1, 2), (2, 2)]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TypeVar

from ._errors import ArgumentTypeError

__all__ = ["ProgressCallback", "TerminalProgress", "check_progress", "counted"]

X = TypeVar("X")
ProgressCallback = Callable[[int, int], object]


def check_progress(progress: object) -> ProgressCallback | None:
    """``progress`` if it is None or callable.

    Raises:
        ArgumentTypeError: anything else.
    """
    if progress is None or callable(progress):
        return progress
    raise ArgumentTypeError(
        f"progress must be a callable taking (done, total) or None, got {type(progress).__name__} {progress!r}."
    )


def counted(
    items: Iterable[X], total: int, progress: ProgressCallback | None, counts: Callable[[X], bool] | None = None
) -> Iterator[X]:
    """Yield ``items``, calling ``progress(done, total)`` after each one that ``counts`` (default: all)."""
    if progress is None:
        yield from items
        return
    done = 0
    for item in items:
        yield item
        if counts is None or counts(item):
            done += 1
            progress(done, total)


class TerminalProgress:
    """A progress callback that draws ``label: done/total`` on one terminal line.

    Silent unless ``stream`` (default: ``sys.stderr``) is a terminal; redraws at most every
    0.1 s, and always for the last step.  :meth:`close` ends the line.

    Args:
        label: the text before the counts.
        stream: where to draw (None: ``sys.stderr``).

    >>> import io
    >>> from tdshare import TerminalProgress
    >>> class Terminal(io.StringIO):
    ...     def isatty(self):
    ...         return True
    >>> bar = TerminalProgress("save", Terminal())
    >>> bar(3, 3); bar.close(); bar.stream.getvalue()
    '\\rsave: 3/3\\n'
    """

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        self.stream.write(f"\r{self.label}: {done:,}/{total:,}")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the progress line (nothing when nothing was drawn).

        >>> import io
        >>> from tdshare import TerminalProgress
        >>> bar = TerminalProgress("save", io.StringIO())  # not a terminal: silent
        >>> bar(1, 2); bar.close(); bar.enabled, bar.stream.getvalue()
        (False, '')
        """
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
