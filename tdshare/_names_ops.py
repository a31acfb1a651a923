"""Naming the batch dims: ``refine_names``, ``rename``, ``rename_`` on every container kind.

:class:`NameOps` works through the ``names`` property each kind has (a plain tensordict, a lazy
stack, a tensorclass through its tensordict), which also names the shared dims of the nested
levels.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ._errors import InvalidArgumentError, NotSupportedError

__all__ = ["NameOps"]

T = TypeVar("T", bound="NameOps")


class NameOps:
    """Dim-name methods shared by every container kind (each has ``names`` and ``batch_dims``)."""

    def refine_names(self: T, *names: Any) -> T:
        """Name the unnamed batch dims and check the named ones, in place, as ``Tensor.refine_names``.

        Args:
            *names: one name (or None) per batch dim, or fewer with one ``...``, which keeps the
                names of the dims it covers.

        Returns:
            ``self``.

        Raises:
            NotSupportedError: a named dim given another name or None (a ``RuntimeError``).
            InvalidArgumentError: more than one ``...``, or a number of names that does not fit.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(batch_size=[3, 4, 5], names=["a", None, None])
        >>> td.refine_names(..., "b", "c").names
        ['a', 'b', 'c']
        """
        host: Any = self
        current = list(host.names)
        wanted = _expand_ellipsis(list(names), current, "refine_names")
        for i, (old, new) in enumerate(zip(current, wanted, strict=True)):
            if old is not None and old != new:
                raise NotSupportedError(
                    f"refine_names: cannot coerce TensorDict names {current} with {list(names)}: dim {i} is "
                    f"named {old!r} and would become {new!r}. Use rename_() to change a name."
                )
        host.names = wanted
        return self

    def rename_(self: T, *names: Any, **rename_map: Any) -> T:
        """Rename the batch dims in place and return ``self``; nested levels get the names of the
        dims they share.

        Args:
            *names: the new names, one per batch dim, or a single None to clear them all.
            **rename_map: new names by old name (``rename_(old="new")``); exclusive with ``names``.

        Raises:
            InvalidArgumentError: both or neither of ``names`` and ``rename_map`` (neither is fine
                without batch dims), a key of ``rename_map`` that is not a name, or a number of names
                that is not the number of batch dims (a ``ValueError``).

        >>> from tdshare import TensorDict
        >>> td = TensorDict(batch_size=[1, 2], names=["a", "b"])
        >>> td.rename_(b="g") is td, td.names
        (True, ['a', 'g'])
        """
        host: Any = self
        host.names = _renamed(list(host.names), names, rename_map, host.batch_dims)
        return self

    def rename(self: T, *names: Any, **rename_map: Any) -> T:
        """A shallow copy (the leaves shared) with its batch dims renamed; ``self`` keeps its names.

        Args:
            *names, **rename_map: as :meth:`rename_`.

        Raises:
            InvalidArgumentError: as :meth:`rename_`.

        >>> from tdshare import TensorDict
        >>> td = TensorDict(batch_size=[1, 2], names=["a", "b"])
        >>> td.rename("x", None).names, td.names
        (['x', None], ['a', 'b'])
        """
        host: Any = self
        new = _renamed(list(host.names), names, rename_map, host.batch_dims)
        out = host.copy()
        out.names = new
        return out


def _expand_ellipsis(names: list[Any], current: list[Any], where: str) -> list[Any]:
    count = sum(1 for n in names if n is Ellipsis)
    if count > 1:
        raise InvalidArgumentError(f"{where}: at most one '...' in the names, got {names}.")
    if count == 1:
        at = names.index(Ellipsis)
        covered = len(current) - (len(names) - 1)
        if covered < 0:
            raise InvalidArgumentError(f"{where}: {len(names) - 1} names for {len(current)} batch dims.")
        names = names[:at] + current[at : at + covered] + names[at + 1 :]
    if len(names) != len(current):
        raise InvalidArgumentError(f"{where}: {len(names)} names for {len(current)} batch dims ({names}).")
    return names


def _renamed(current: list[Any], names: tuple[Any, ...], rename_map: dict[str, Any], dims: int) -> list[Any]:
    if names and rename_map:
        raise InvalidArgumentError("rename: passed both a name map and a name list; only one is accepted.")
    if not names and not rename_map:
        if dims == 0:
            return current
        raise InvalidArgumentError("rename: pass the new names, one per batch dim, or old=new keyword arguments.")
    if rename_map:
        unknown = [k for k in rename_map if k not in current]
        if unknown:
            raise InvalidArgumentError(
                f"rename: some names to be renamed were not part of the tensordict names: {unknown} vs {current}."
            )
        return [rename_map.get(n, n) if n is not None else None for n in current]
    if len(names) == 1 and names[0] is None:
        return [None] * len(current)
    return _expand_ellipsis(list(names), current, "rename")
