"""Benchmarks: tdshare against tensordict 0.15.3 and against the machine's raw limits, in one run.

Run ``python -m benchmarks`` (``--quick`` for a short run, ``--only NAME`` for some workloads,
``--json FILE`` to keep the numbers).  See ``benchmarks/README.md``.

This package imports neither library at import time: spawned workers re-import it.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """The command line; see ``python -m benchmarks --help``."""
    from .runner import main as _main

    return _main(argv)
