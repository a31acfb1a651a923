"""Key and conversion operations of every tensor collection: flattening and splitting keys,
conversions to and from dicts, lists and named tuples, ``apply`` and its variants, updates
and the compact ``repr``.  A mixin of :class:`tdshare._tensordict_base.TensorDictBase`,
so a TensorDict, a lazy stack and (through its forwarding) a tensorclass all get them.

A lazy stack has no single level of entries: it answers :meth:`KeyOps._lazy_members` with its
members, and each operation that builds a new collection runs member by member and stacks the
results again through :meth:`KeyOps._restack`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch

from ._compact_repr import compact_repr
from ._errors import InvalidArgumentError, KeyTypeError, MissingKeyError, NotSupportedError
from ._keys import NestedKey, unravel_key
from ._nodes import kind_of
from ._nontensor import NonTensorData

__all__ = [
    "WriteBack",
    "KeyOps",
    "KeysView",
    "NO_DEFAULT",
    "inner_collection",
    "is_node",
    "leaves",
    "place",
    "tensor_entries",
]

T = TypeVar("T", bound="KeyOps")


class _NoDefault:
    """The marker of an argument that was not given (its repr reads well in signatures)."""

    def __repr__(self) -> str:
        return "<no default>"


NO_DEFAULT: Any = _NoDefault()


def is_node(value: Any) -> bool:
    """Whether ``value`` is a collection that key operations walk into (a tensordict or lazy stack)."""
    return isinstance(value, KeyOps)


class KeysView(list):
    """The list ``keys()`` returns; ``in`` checks the key's type as the reference's view does (a key
    that is not a string or a tuple of strings is a ``KeyTypeError``, a ``TypeError``).

    >>> from tdshare import TensorDict
    >>> keys = TensorDict(a={"b": torch.zeros(())}).keys(include_nested=True)
    >>> ("a", "b") in keys, ("a",) in keys, keys == ["a", ("a", "b")]
    (True, True, True)
    """

    def __init__(self, keys: Sequence[Any], nested: bool) -> None:
        super().__init__(keys)
        self._nested = nested

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return list.__contains__(self, key)
        if not isinstance(key, tuple):
            raise KeyTypeError(f"TensorDict keys are always strings (or tuples of strings), got {key!r}.")
        if not all(isinstance(k, str) for k in key):
            try:
                key = unravel_key(key)  # a nested tuple: ("a", ("b",)) is ("a", "b")
            except KeyTypeError:
                raise KeyTypeError(f"TensorDict keys are always strings (or tuples of strings), got {key!r}.") from None
        if len(key) == 1:
            return list.__contains__(self, key[0])
        return self._nested and list.__contains__(self, key)  # a flat view holds no nested key


class KeyOps:
    """Key, conversion and apply operations; the host class provides the storage and accessors."""

    # -- hooks --------------------------------------------------------------------------------
    def _lazy_members(self) -> Sequence[Any] | None:
        """The members a lazy stack runs key operations on, one by one; None for a single level."""
        return None

    def _restack(self, members: Sequence[Any], stack_dim: int | None = None, keep_name: bool = True) -> Any:
        """A lazy stack like this one over ``members``, along ``stack_dim`` (None: this one's); only
        lazy stacks have members. ``keep_name=False`` drops the stack dim's name."""
        raise NotSupportedError(f"{type(self).__name__} has no members to stack again.")

    def _per_member(self, name: str, *args: Any, **kwargs: Any) -> Any:
        members = self._lazy_members()
        assert members is not None
        return self._restack([getattr(m, name)(*args, **kwargs) for m in members])

    # -- keys -----------------------------------------------------------------------------------
    def keys(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable[[type], bool] | None = None,
        *,
        sort: bool = False,
    ) -> list:
        """The keys, in insertion order; nested keys are tuples when ``include_nested``.

        Args:
            include_nested: also list the keys inside nested tensordicts, as tuples.
            leaves_only: leave out the keys of nested tensordicts themselves.
            is_leaf: called with a value's type; True makes a nested tensordict count as a leaf.
            sort: sort the keys (nested keys by their parts joined with ``"."``).

        >>> from tdshare import TensorDict
        >>> TensorDict(b=torch.zeros(()), a={"c": torch.zeros(())}).keys(True, True, sort=True)
        [('a', 'c'), 'b']
        """
        td: Any = self
        if is_leaf is None:
            keys = list(td._iter_keys(include_nested, leaves_only))
        else:
            keys = list(td._iter_keys_is_leaf(include_nested, leaves_only, is_leaf, ()))
        if sort:
            keys.sort(key=lambda k: ".".join(k) if isinstance(k, tuple) else k)
        return KeysView(keys, include_nested)

    def _iter_keys_is_leaf(
        self, include_nested: bool, leaves_only: bool, is_leaf: Callable[[type], bool], prefix: tuple[str, ...]
    ) -> Iterator[Any]:
        td: Any = self
        for key in td.keys():
            full = (*prefix, key)
            value = td._get_leaf((key,))
            node = is_node(value) and not is_leaf(type(value))
            if not (node and leaves_only):
                yield full if prefix else key
            if node and include_nested:
                yield from value._iter_keys_is_leaf(True, leaves_only, is_leaf, full)

    def select(self: T, *keys: NestedKey, inplace: bool = False, strict: bool = True, as_tensordict: bool = False) -> T:
        """A tensordict with only the entries ``keys`` (the leaves are shared, not copied).

        Args:
            *keys: keys or nested keys (a nested tensordict's key keeps all of it).
            inplace: remove every other entry from this tensordict and return it.
            strict: a missing key raises (``False``: it is skipped).
            as_tensordict: accepted for compatibility (the result is a tensordict of this class).

        Raises:
            MissingKeyError: a key that is missing, with ``strict``.
            LockedError: ``inplace`` on a locked tensordict that would lose entries.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(()), b=torch.ones(())).select("a", "z", strict=False).keys()
        ['a']
        """
        td: Any = self
        out = td.empty()
        for key in keys:
            parts = unravel_key(key)
            leaf = td._get_leaf(parts) if strict else td._get_leaf(parts, None)
            if leaf is not None:
                place(out, parts, leaf)
        if not inplace:
            return out
        if set(td._tensordict) - set(out._tensordict):
            td._check_unlocked(str(keys))
        td._tensordict = out._tensordict
        return self

    def exclude(self: T, *keys: NestedKey, inplace: bool = False) -> T:
        """A tensordict without the entries ``keys`` (missing keys are ignored; leaves shared).

        Args:
            *keys: keys or nested keys.
            inplace: remove them from this tensordict and return it.

        Raises:
            LockedError: ``inplace`` on a locked tensordict.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(()), n={"b": torch.ones(())}).exclude(("n", "b")).keys(True)
        ['a', 'n']
        """
        td: Any = self
        out = td if inplace else td._map(lambda t: t)  # a new structure over the same leaves
        for key in keys:
            out.pop(key, None)
        return out

    def rename_key_(self: T, old_key: NestedKey, new_key: NestedKey, safe: bool = False) -> T:
        """Move the entry ``old_key`` to ``new_key``; return self.

        Args:
            old_key: the entry to move.
            new_key: its new key.
            safe: refuse to replace an existing entry at ``new_key``.

        Raises:
            MissingKeyError: ``old_key`` is missing, or ``safe`` and ``new_key`` exists (a ``KeyError``).
            LockedError: the tensordict is locked.

        >>> from tdshare import TensorDict
        >>> TensorDict(a=torch.zeros(())).rename_key_("a", "b").keys()
        ['b']
        """
        td: Any = self
        old, new = old_key, new_key
        value = td._get_leaf(unravel_key(old))
        td._check_unlocked(str(old))
        if safe and unravel_key(new) != unravel_key(old) and td._get_leaf(unravel_key(new), None) is not None:
            raise MissingKeyError(
                f"rename_key_: key {new!r} already present in TensorDict, and safe=True does not overwrite it: "
                "pick another name, or pass safe=False to replace it."
            )
        if unravel_key(old) == unravel_key(new):
            return self
        td.pop(old)  # first: the new key may sit inside the old one's level
        td._set(unravel_key(new), value)
        return self

    @property
    def sorted_keys(self) -> list[str]:
        """The top-level keys in alphabetical order.

        >>> from tdshare import TensorDict
        >>> TensorDict(b=torch.zeros(()), a=torch.zeros(())).sorted_keys
        ['a', 'b']
        """
        td: Any = self
        return sorted(td.keys())

    def is_empty(self) -> bool:
        """Whether the collection holds no leaf (nested tensordicts without leaves do not count).

        >>> from tdshare import TensorDict
        >>> TensorDict(n={}).is_empty(), TensorDict(a=torch.zeros(())).is_empty()
        (True, False)
        """
        td: Any = self
        return not any(True for _ in td.keys(True, True))

    @property
    def depth(self) -> int:
        """How many levels of nested tensordicts the deepest key goes down (0 for a flat one).

        >>> from tdshare import TensorDict
        >>> TensorDict(a={"b": {"c": torch.zeros(())}}).depth
        2
        """
        td: Any = self
        return max((len(k) - 1 if isinstance(k, tuple) else 0 for k in td.keys(True)), default=0)

    def setdefault(self, key: NestedKey, default: Any, inplace: bool = False) -> Any:
        """The value at ``key``; when it is missing, ``default`` is set there first and returned.

        Args:
            key: a key or nested key.
            default: the value to set when ``key`` is missing.
            inplace: passed to ``set`` (write into an existing entry).

        >>> from tdshare import TensorDict
        >>> td = TensorDict()
        >>> td.setdefault("a", torch.ones(2)).tolist(), "a" in td
        ([1.0, 1.0], True)
        """
        td: Any = self
        if key not in td:
            td.set(key, default, inplace=inplace)
        return td.get_non_tensor(key)

    def flatten_keys(self: T, separator: str = ".", inplace: bool = False, is_leaf: Any = None) -> T:
        """A collection whose nested entries are joined into keys ``"a.b"`` (``separator`` between parts).

        Nested tensordicts without leaves disappear.

        Args:
            separator: the string put between the parts of a nested key.
            inplace: change this collection (its nested tensordicts are removed) and return it.
            is_leaf: ignored beyond the default (nested collections are flattened).

        Raises:
            MissingKeyError: two entries would get the same flat key (a ``KeyError``).

        >>> from tdshare import TensorDict
        >>> TensorDict(a={"b": torch.zeros(2)}, batch_size=[2]).flatten_keys().keys()
        ['a.b']
        """
        _check_separator(separator)
        if self._lazy_members() is not None:
            if inplace:
                raise NotSupportedError(
                    "flatten_keys(inplace=True) is not supported on a lazy stack; use inplace=False."
                )
            return self._per_member("flatten_keys", separator)
        td: Any = self
        flat: dict[str, Any] = {}
        for key, leaf in leaves(td):
            name = separator.join(key) if isinstance(key, tuple) else key
            if name in flat:
                raise MissingKeyError(
                    f"Flattening keys in tensordict causes keys {name!r} to collide: two entries flatten to the "
                    f"same key with separator {separator!r}; pick another separator or rename one of them."
                )
            flat[name] = leaf
        if not inplace:
            out = td.empty()
            out._tensordict.update(flat)
            out._last_op[:] = [WriteBack(out, td, lambda o: o.unflatten_keys(separator))]  # `with` writes back
            return out
        for key in list(td._tensordict):
            if is_node(td._tensordict[key]) or key not in flat:
                td._check_unlocked(key)
        td._tensordict.clear()
        td._tensordict.update(flat)
        return self

    def unflatten_keys(self: T, separator: str = ".", inplace: bool = False) -> T:
        """A collection where every key ``"a.b"`` becomes the nested key ``("a", "b")``.

        Args:
            separator: the string between the parts of a flat key.
            inplace: change this collection and return it.

        Raises:
            MissingKeyError: an unflattened key would replace an existing entry (a ``KeyError``).

        >>> from tdshare import TensorDict
        >>> TensorDict({"a.b": torch.zeros(2)}, batch_size=[2]).unflatten_keys().keys(True)
        ['a', ('a', 'b')]
        """
        _check_separator(separator)
        if self._lazy_members() is not None:
            if inplace:
                raise NotSupportedError(
                    "unflatten_keys(inplace=True) is not supported on a lazy stack; use inplace=False."
                )
            return self._per_member("unflatten_keys", separator)
        td: Any = self
        out = td.empty()
        for key, leaf in td._tensordict.items():
            if is_node(leaf):
                leaf = leaf.unflatten_keys(separator)
            parts = tuple(key.split(separator)) if separator in key else (key,)
            existing = out._get_leaf(parts, None)
            clash = existing is not None and not (is_node(existing) and is_node(leaf))
            if existing is not None and not clash:  # two nested levels merge: no entry may be replaced
                clash = any(_occupied(existing, unravel_key(k)) for k in leaf.keys(True, True))
            for i in range(1, len(parts)):
                prefix_value = out._get_leaf(parts[:i], None)
                clash = clash or (prefix_value is not None and not is_node(prefix_value))
            if clash:
                raise MissingKeyError(
                    f"Unflattening key(s) in tensordict will override an existing for unflattened key {parts!r} "
                    f"(from {key!r}); rename one of the entries first."
                )
            if existing is not None:
                existing.update(leaf)
            else:
                place(out, parts, leaf)
        if not inplace:
            out._last_op[:] = [WriteBack(out, td, lambda o: o.flatten_keys(separator))]  # `with` writes back
            return out
        if td.is_locked:
            td._check_unlocked(next(iter(td._tensordict), ""))
        td._tensordict.clear()
        td._tensordict.update(out._tensordict)
        return self

    def split_keys(
        self,
        *key_sets: Sequence[NestedKey],
        inplace: bool = False,
        default: Any = NO_DEFAULT,
        strict: bool = True,
        reproduce_struct: bool = False,
    ) -> tuple[Any, ...]:
        """One collection per key set with those entries, then one with everything left.

        Args:
            *key_sets: sequences of keys.
            inplace: remove the chosen entries from this collection, which is returned last.
            default: the value for a key that is missing (else missing keys raise or are skipped).
            strict: a missing key without ``default`` raises; ``False`` skips it.
            reproduce_struct: ignored (the nested structure is always kept).

        Raises:
            MissingKeyError: a missing key with ``strict`` and no ``default``.

        >>> from tdshare import TensorDict
        >>> a, rest = TensorDict(a=torch.zeros(()), b=torch.ones(())).split_keys(["a"])
        >>> a.keys(), rest.keys()
        (['a'], ['b'])
        """
        td: Any = self
        rest = td if inplace else td.copy()
        outs = []
        for keys in key_sets:
            out = td.empty()
            for key in keys:
                if key in rest:
                    _put_value(out, unravel_key(key), rest._get_leaf(unravel_key(key)))
                    rest.pop(key)
                    _drop_emptied(rest, unravel_key(key))
                elif default is not NO_DEFAULT:
                    out.set(key, default)
                elif strict:
                    raise MissingKeyError(
                        f"split_keys: key {key!r} is not in the tensordict; pass strict=False or a default."
                    )
            outs.append(out)
        return (*outs, rest)

    def __repr__(self) -> str:
        return compact_repr(self)


# -- helpers -------------------------------------------------------------------------------------
def _occupied(td: Any, parts: tuple[str, ...]) -> bool:
    """Whether setting ``parts`` in ``td`` would replace something (the entry, or a leaf on the way)."""
    node = td
    for part in parts:
        if not is_node(node):
            return True  # a leaf where a level is needed
        node = node._get_leaf((part,), None)
        if node is None:
            return False
    return True


def _check_separator(separator: Any) -> None:
    if not isinstance(separator, str) or not separator:
        raise InvalidArgumentError(f"separator must be a non-empty string, got {separator!r}.")


def inner_collection(value: Any) -> Any:
    """The collection a node is (a tensordict, a lazy stack) or wraps (a tensorclass), else None."""
    if is_node(value):
        return value
    kind = kind_of(value)
    if kind is not None and kind.unwrap is not None and not isinstance(value, (torch.Tensor, NonTensorData)):
        return value  # a tensorclass forwards the key operations to its tensordict
    return None


def collection_of(value: Any) -> Any:
    """The collection whose keys sit below ``value``: a tensordict or lazy stack itself, a
    tensorclass's tensordict; None for a leaf."""
    if is_node(value):
        return value
    if inner_collection(value) is None:
        return None
    kind = kind_of(value)
    assert kind is not None and kind.unwrap is not None  # inner_collection checked it
    return kind.unwrap(value)[0]


def leaves(td: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[Any, Any]]:
    """(key, stored leaf) for every leaf, walking into nested collections (tensorclasses included)."""
    for key in td.keys():
        value = td._get_leaf((key,))
        full = (*prefix, key)
        kind = kind_of(value)
        if is_node(value):
            yield from leaves(value, full)
        elif kind is not None and kind.unwrap is not None and not isinstance(value, (torch.Tensor, NonTensorData)):
            yield from leaves(kind.unwrap(value)[0], full)
        else:
            yield (full if prefix else key), value


def tensor_entries(td: Any) -> dict[Any, torch.Tensor]:
    """Every tensor entry of a collection by its (nested) key, as ``td.get`` gives it (a lazy stack's
    stacked), non-tensor values left out.

    >>> from tdshare import TensorDict
    >>> list(tensor_entries(TensorDict(a=torch.zeros(2), n={"b": torch.ones(2)}, s="x", batch_size=[2])))
    ['a', ('n', 'b')]
    """
    return {k: v for k in td.keys(True, True) if isinstance(v := td.get(k), torch.Tensor)}


def place(td: Any, parts: tuple[str, ...], value: Any) -> None:
    """Put ``value`` at ``parts`` without checks, making nested levels like ``td`` on the way."""
    node = td
    for part in parts[:-1]:
        nxt = node._tensordict.get(part)
        if not is_node(nxt):
            nxt = type(node)._from_leaves({}, node._batch_size, node._device, node._names)
            node._tensordict[part] = nxt
        node = nxt
    node._tensordict[parts[-1]] = value


def _put_value(td: Any, parts: tuple[str, ...], value: Any) -> None:
    if td._lazy_members() is None:
        place(td, parts, value)
    else:
        td._set(parts, value)


def _drop_emptied(td: Any, parts: tuple[str, ...]) -> None:
    """Remove the levels above ``parts`` that its removal left without entries (as the reference does)."""
    for depth in range(len(parts) - 1, 0, -1):
        level = td._get_leaf(parts[:depth], None)
        if not is_node(level) or level.keys():
            return
        td.pop(parts[:depth])


# Like the reference's, a tensordict is a Mapping: ``nn.Module.load_state_dict(td)`` and ``dict(td)`` work.
Mapping.register(KeyOps)


class WriteBack:
    """The ``with`` action of a result ``out`` of an operation on ``source``: at ``enter()`` the
    leaves of ``out`` are noted; when the block closes (``__call__``) the ones added or replaced
    since go back through ``back`` (``out``'s form to ``source``'s) into ``source``.

    ``out`` holds this action, so it is held by a weak reference (no cycle keeps a view, and the
    mappings under it, alive)."""

    __slots__ = ("back", "out", "seen", "source")

    def __init__(self, out: Any, source: Any, back: Callable[[Any], Any]) -> None:
        self.out, self.source, self.back = weakref.ref(out), source, back
        self.seen: dict[tuple[str, ...], Any] | None = None  # the leaves themselves: ids could be reused

    def enter(self) -> None:
        out = self.out()
        self.seen = {} if out is None else {unravel_key(k): v for k, v in leaves(out)}

    def __call__(self) -> None:
        out, seen = self.out(), self.seen or {}
        if out is None:
            return
        changed = [k for k, v in leaves(out) if seen.get(unravel_key(k)) is not v]
        if not changed:
            return
        backed = self.back(out.select(*changed))  # the changed entries under the source's keys
        if backed is None:  # no way back (a dtype view)
            return
        for key, value in leaves(backed):
            self.source.set(key, value, inplace=self.source.is_locked)
