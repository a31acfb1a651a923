"""Nested keys and the file-name encoding of keys (pure functions: no torch, no I/O).

A *nested key* is a string or a non-empty tuple of strings (tuples may nest, as in the
reference: ``("a", ("b", "c"))`` is ``("a", "b", "c")``).

The *robust-key* encoding maps one key component to one file-name component so that every file
stays inside its directory and the mapping is injective (tensordict 0.15.3 uses exactly this):

* ``""`` becomes ``"%"``, ``"."`` becomes ``"%2E"``, ``".."`` becomes ``"%2E%2E"``;
* otherwise each character of ``/ < > : " | ? * \\``, space, ``%``, the C0 controls and DEL is
  replaced by ``%XX`` (two upper-case hex digits); every other character, unicode included, is
  kept as is.

Since ``%`` itself is always encoded, :func:`decode_key` inverts :func:`encode_key` exactly.
"""

from __future__ import annotations

import re

from ._errors import KeyTypeError

__all__ = [
    "NestedKey",
    "unravel_key",
    "encode_key",
    "decode_key",
    "is_safe_legacy_name",
    "UNSAFE_CHARS",
]

NestedKey = str | tuple  # a str, or a (possibly nested) non-empty tuple of str

UNSAFE_CHARS: frozenset[str] = frozenset('/<>:"|?*\\ \0%') | frozenset([chr(i) for i in range(32)] + [chr(127)])
_TRANSLATION = {ord(c): f"%{ord(c):02X}" for c in UNSAFE_CHARS}
_SPECIAL = {"": "%", ".": "%2E", "..": "%2E%2E"}
_SPECIAL_INV = {v: k for k, v in _SPECIAL.items()}
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


def unravel_key(key: object) -> tuple[str, ...]:
    """Return ``key`` as a flat tuple of strings, or raise :class:`KeyTypeError`."""
    if isinstance(key, str):
        return (key,)
    if isinstance(key, tuple):
        if not key:
            raise KeyTypeError("An empty tuple is not a valid key: use a string or a non-empty tuple of strings.")
        out: list[str] = []
        for part in key:
            out.extend(unravel_key(part))
        return tuple(out)
    raise KeyTypeError(f"Keys must be strings or tuples of strings, got {type(key).__name__} {key!r}.")


def encode_key(key: str) -> str:
    """Encode one key component as a file-name component (robust-key encoding)."""
    if key.isidentifier():  # letters, digits and "_" only: nothing to encode (the common case)
        return key
    special = _SPECIAL.get(key)
    if special is not None:
        return special
    return key.translate(_TRANSLATION)


def decode_key(name: str) -> str:
    """Invert :func:`encode_key`."""
    special = _SPECIAL_INV.get(name)
    if special is not None:
        return special
    return _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), name)


def is_safe_legacy_name(key: str, *, directory: bool = False) -> bool:
    """Whether ``key`` may be used unencoded as a file name (the legacy, ``robust_key=False`` layout).

    A safe legacy name has no path separator, NUL or drive prefix (``C:...``), and for a directory
    is not ``""``, ``.`` or ``..``.  Leaf names get the ``.memmap`` suffix, so ``""``, ``.`` and
    ``..`` stay inside the folder there (``"".memmap`` is ``.memmap``, as the reference writes it).
    """
    if "/" in key or "\\" in key or "\0" in key:
        return False
    if len(key) >= 2 and key[0].isalpha() and key[1] == ":":
        return False
    if directory and key in ("", ".", ".."):
        return False
    return True
