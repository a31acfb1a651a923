"""Helpers shared by test modules (imported as ``_helpers``: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
from collections.abc import Callable

IS_ROOT = os.geteuid() == 0
NOBODY = 65534


def as_other_user(check: Callable[[], str]) -> str:
    """Run ``check`` as the unprivileged user ``nobody`` when we are root (root may write any file).

    The check runs in a forked child (the interpreter lives under /root, which ``nobody`` cannot
    enter, so a fresh process could not start); its result or error comes back through a pipe.
    """
    if not IS_ROOT:
        return check()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            reply = "ok:" + check()
        except BaseException as err:
            reply = f"error:{type(err).__name__}: {err}"
        try:
            os.write(w, reply.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        reply = f.read().decode()
    os.waitpid(pid, 0)
    assert reply.startswith("ok:"), reply
    return reply[3:]
