"""``python -m benchmarks``: see :mod:`benchmarks.runner`."""

from __future__ import annotations

if __name__ == "__main__":  # spawned workers import this module as __mp_main__: do nothing then
    from benchmarks import main

    raise SystemExit(main())
