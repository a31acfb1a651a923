"""``rename_keys``: several keys renamed at once into a new tree that shares every leaf.

Every source is read before a destination is written, so swaps and chains work; a nested
tensordict that the renaming empties is removed.  A mixin of
:class:`tdshare._tensordict_base.TensorDictBase`; a lazy stack renames in each member and removes a
nested tensordict only where the renaming empties it in all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from ._errors import InvalidArgumentError, KeyTypeError, MissingKeyError
from ._key_ops import inner_collection
from ._keys import NestedKey, unravel_key

__all__ = ["RenameOps", "rename_pairs"]

T = TypeVar("T", bound="RenameOps")
Pairs = list[tuple[tuple[str, ...], tuple[str, ...]]]


class RenameOps:
    """:meth:`rename_keys` for every container kind."""

    def rename_keys(self: T, mapping: Mapping[NestedKey, NestedKey], *, strict: bool = True) -> T:
        """A tensordict with the keys of ``mapping`` renamed to its values; ``self`` is not changed.

        The result is a new tree of nested tensordicts over the same leaves (tensors and non-tensor
        data), with the batch size, device and names of ``self``, and unlocked.  Every source is
        read before any destination is written, so ``{"a": "b", "b": "a"}`` swaps and
        ``{"a": "b", "b": "c"}`` chains.  Both sides may be nested keys: an entry can move to another
        nested tensordict, and a nested tensordict can be renamed whole.  A nested tensordict that
        the renaming leaves empty is removed; other empty ones are kept.

        Args:
            mapping: each entry's old key to its new key.
            strict: a source missing from the tensordict raises (``False``: it is skipped).

        Returns:
            A new tensordict of the same kind (a lazy stack renames in each member).

        Raises:
            MissingKeyError: ``strict`` and a source is missing, or a key is empty (a ``KeyError``).
            InvalidArgumentError: two sources with one destination, a source inside another source
                or a destination inside another destination, a destination already present and not
                renamed away, or one that runs through a leaf (a ``ValueError``).

        >>> import torch
        >>> from tdshare import TensorDict
        >>> td = TensorDict(a=torch.zeros(()), b=torch.ones(()))
        >>> out = td.rename_keys({"a": "b", "b": "a"})
        >>> out["a"].item(), td["a"].item()
        (1.0, 0.0)
        >>> td = TensorDict(raw=TensorDict(p=torch.zeros(3), u=torch.ones(3)))
        >>> sorted(td.rename_keys({("raw", "p"): "pressure", ("raw", "u"): "velocity"}).keys(True))
        ['pressure', 'velocity']
        """
        td: Any = self
        pairs = rename_pairs(td, mapping, strict)
        stack = td._stack_parts()
        members, dim = ([td], None) if stack is None else stack
        outs = [_renamed(m, pairs) for m in members]
        candidates = {src[:cut] for src, _ in pairs for cut in range(1, len(src))}
        for key in sorted(candidates, key=len, reverse=True):  # the deepest first: a parent may empty in turn
            nodes = [out._get_leaf(key, None) for out in outs]
            if all(node is not None and not node.keys() for node in nodes):
                for out in outs:
                    out.pop(key)
        if stack is None:
            return outs[0]
        return td._new_stack(outs, dim, td._stack_dim_name)


def rename_pairs(td: Any, mapping: Mapping[NestedKey, NestedKey], strict: bool) -> Pairs:
    """The ``(source, destination)`` pairs of ``mapping`` as key tuples, checked against ``td``.

    Raises:
        MissingKeyError, InvalidArgumentError: as :meth:`RenameOps.rename_keys` documents.
    """
    pairs: Pairs = []
    for src, dst in mapping.items():
        pairs.append((_key(src), _key(dst)))
    _no_overlap([d for _, d in pairs], "destination")
    _no_overlap([s for s, _ in pairs], "source")
    present = []
    for src, dst in pairs:
        if td._get_leaf(src, None) is None:
            if strict:
                raise MissingKeyError(
                    f"rename_keys: the source {src if len(src) > 1 else src[0]!r} is not in the tensordict (keys "
                    f"{sorted(map(str, td.keys()))}); pass strict=False to skip missing sources."
                )
            continue
        present.append((src, dst))
    sources = {s for s, _ in present}
    for _, dst in present:
        if dst not in sources and td._get_leaf(dst, None) is not None:
            raise InvalidArgumentError(
                f"rename_keys: the destination {dst} is already present and is not renamed away; rename or exclude "
                "it first."
            )
        for cut in range(1, len(dst)):
            prefix = dst[:cut]
            if prefix in sources:
                break  # renamed away: the destination's parent is made fresh
            value = td._get_leaf(prefix, None)
            if value is None:
                break
            if inner_collection(value) is None:
                raise InvalidArgumentError(
                    f"rename_keys: the destination {dst} runs through the entry {prefix}, which is not a tensordict."
                )
    return present


def _key(key: Any) -> tuple[str, ...]:
    try:
        return unravel_key(key)
    except KeyTypeError as exc:
        if key == ():
            raise MissingKeyError(f"rename_keys: {exc}") from None
        raise


def _no_overlap(keys: list[tuple[str, ...]], what: str) -> None:
    seen: set[tuple[str, ...]] = set()
    for key in keys:
        if key in seen:
            if what == "destination":
                raise InvalidArgumentError(f"rename_keys: the key {key} is a destination more than once.")
            raise InvalidArgumentError(f"rename_keys: the key {key} is a source more than once.")
        seen.add(key)
    for key in keys:
        for cut in range(1, len(key)):
            if key[:cut] in seen:
                raise InvalidArgumentError(
                    f"rename_keys: the {what}s {key[:cut]} and {key} lie inside one another, so the result would "
                    "depend on the order of the mapping."
                )


def _renamed(td: Any, pairs: Pairs) -> Any:
    """The renamed copy of the single-level tree ``td`` (emptied nested tensordicts still in it)."""
    out = td._map(lambda t: t)  # a new tree over the same leaves
    if out._is_locked:
        out.unlock_()
    values = [(dst, out._get_leaf(src)) for src, dst in pairs]
    for src, _ in pairs:
        out.pop(src)
    for dst, value in values:
        out.set(dst, value)
    return out
