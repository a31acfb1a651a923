"""Nested keys and the robust-key file-name encoding (tdshare/_keys.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tdshare import KeyTypeError
from tdshare._keys import UNSAFE_CHARS, decode_key, encode_key, is_safe_legacy_name, unravel_key

# The exact mapping of reference-notes.md §1.7 (what tensordict 0.15.3 writes).
EXAMPLES = [
    ("a/b", "a%2Fb"),
    ("50%", "50%25"),
    ("%41", "%2541"),
    ("t\tx", "t%09x"),
    ("x*?<>|", "x%2A%3F%3C%3E%7C"),
    ("é/é", "é%2Fé"),
    ("", "%"),
    (".", "%2E"),
    ("..", "%2E%2E"),
    ("...", "..."),
    ("a b", "a%20b"),
    ('a:b"c\\d', "a%3Ab%22c%5Cd"),
    ("nul\0", "nul%00"),
    ("del\x7f", "del%7F"),
    ("#&.x", "#&.x"),
    ("plain_key-1", "plain_key-1"),
]

# Keys that stress the encoder: every unsafe character, percent signs, dots and unicode.
_ALPHABET = st.sampled_from(sorted(UNSAFE_CHARS) + list("aZ09._-#&%.é€😀\u0080\u00a0"))
keys = st.one_of(st.text(_ALPHABET, max_size=12), st.text(max_size=12), st.sampled_from(["", ".", "..", "...", "%"]))


@pytest.mark.parametrize(("key", "encoded"), EXAMPLES)
def test_encode_exact(key: str, encoded: str) -> None:
    assert encode_key(key) == encoded


@pytest.mark.parametrize(("key", "encoded"), EXAMPLES)
def test_decode_exact(key: str, encoded: str) -> None:
    assert decode_key(encoded) == key


def test_unsafe_chars_are_the_documented_set() -> None:
    expected = set('/<>:"|?*\\ \0%') | {chr(i) for i in range(32)} | {chr(127)}
    assert set(UNSAFE_CHARS) == expected
    for c in expected:
        assert encode_key(c) == f"%{ord(c):02X}"


@settings(max_examples=300, deadline=None)
@given(keys)
def test_roundtrip(key: str) -> None:
    assert decode_key(encode_key(key)) == key


@settings(max_examples=300, deadline=None)
@given(keys)
def test_encoded_name_is_one_safe_component(key: str) -> None:
    name = encode_key(key)
    assert name not in ("", ".", "..")
    assert not set(name) & (UNSAFE_CHARS - {"%"})
    assert "/" not in name and "\\" not in name and "\0" not in name


@settings(max_examples=300, deadline=None)
@given(keys, keys)
def test_injective(a: str, b: str) -> None:
    if a != b:
        assert encode_key(a) != encode_key(b)


def test_reference_encoder_agrees() -> None:
    """The encoder matches tensordict 0.15.3's own for many keys (the test may import it; tdshare never does)."""
    ref = pytest.importorskip("tensordict._utils_key_json")
    import random

    rng = random.Random(0)
    pool = sorted(UNSAFE_CHARS) + list("abcXYZ019._-#&%é€😀\u00a0\u2028")
    generated = ["".join(rng.choice(pool) for _ in range(rng.randrange(0, 10))) for _ in range(5000)]
    for key in [k for k, _ in EXAMPLES] + generated + [chr(i) for i in range(0, 300)]:
        assert encode_key(key) == ref._encode_key_for_filesystem(key), repr(key)


@settings(max_examples=200, deadline=None)
@given(keys)
def test_reference_encoder_agrees_property(key: str) -> None:
    ref = pytest.importorskip("tensordict._utils_key_json")
    assert encode_key(key) == ref._encode_key_for_filesystem(key)


# -- unravel_key -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("a", ("a",)),
        ("", ("",)),
        (("a",), ("a",)),
        (("a", "b"), ("a", "b")),
        (("a", ("b", "c")), ("a", "b", "c")),
        ((("a",), (("b",),), "c"), ("a", "b", "c")),
    ],
)
def test_unravel_key(key: object, expected: tuple[str, ...]) -> None:
    assert unravel_key(key) == expected


@pytest.mark.parametrize("bad", [1, None, b"a", ["a"], (), ("a", 1), ("a", ()), ("a", ["b"])])
def test_unravel_key_refuses(bad: object) -> None:
    with pytest.raises(KeyTypeError) as info:
        unravel_key(bad)
    assert isinstance(info.value, TypeError)


# -- is_safe_legacy_name -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "leaf", "directory"),
    [
        ("a", True, True),
        ("a b%", True, True),  # raw in the legacy layout, still one file name
        ("...", True, True),
        ("", True, False),  # a leaf "" is the file ".memmap", inside the folder
        (".", True, False),
        ("..", True, False),
        ("a/b", False, False),
        ("a\\b", False, False),
        ("C:x", False, False),  # drive-relative on Windows
        ("1:x", True, True),  # not a drive letter
        ("nul\0", False, False),
    ],
)
def test_is_safe_legacy_name(key: str, leaf: bool, directory: bool) -> None:
    assert is_safe_legacy_name(key) is leaf
    assert is_safe_legacy_name(key, directory=True) is directory


@settings(max_examples=300, deadline=None)
@given(keys, st.booleans())
def test_is_safe_legacy_name_matches_reference(key: str, directory: bool) -> None:
    """Where the reader falls back to a raw (legacy) name, it does so exactly where the reference does."""
    ref = pytest.importorskip("tensordict._utils_key_json")
    if "\0" in key:  # no file can be named so: tdshare refuses it, the reference would fail in open()
        assert not is_safe_legacy_name(key, directory=directory)
        return
    assert is_safe_legacy_name(key, directory=directory) == ref._is_safe_legacy_key(key, is_collection=directory)


def test_legacy_layout_of_the_reference_loads(tmp_path: Path) -> None:
    """Leaves the reference saves under raw names (robust_key=False) are found by a robust reader."""
    tensordict = pytest.importorskip("tensordict")
    import torch

    import tdshare

    keys = ["", "1:x", "a b", "50%", "..."]
    ref = tensordict.TensorDict({k: torch.full((2,), float(i)) for i, k in enumerate(keys)}, [2])
    ref.memmap(tmp_path / "legacy", robust_key=False)
    assert (tmp_path / "legacy" / ".memmap").exists() and (tmp_path / "legacy" / "1:x.memmap").exists()
    back = tdshare.TensorDict.load(tmp_path / "legacy")
    for i, k in enumerate(keys):
        assert back[k].tolist() == [float(i)] * 2, k
    out = tdshare.TensorDict({k: torch.full((2,), float(i)) for i, k in enumerate(keys)}, [2])
    out.memmap(tmp_path / "ours", robust_key=False)
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == sorted(
        p.name for p in (tmp_path / "legacy").iterdir()
    )
